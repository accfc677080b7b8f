"""build(): the best recorded program of a task as a callable Kernel."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ansor.codegen import generate_source
from ansor.database import Database, Record
from ansor.measure import Builder, KernelLibrary, MeasureErrorNo, TimingPolicy, aligned_empty, time_function
from ansor.schedule.state import ScheduleError, State
from ansor.schedule.steps import steps_from_json
from ansor.task import Task


class Kernel:
    """A compiled program: call it on numpy arrays (inputs in the task's order)."""

    def __init__(self, task: Task, state: State, source: str, func_name: str, lib_path: str,
                 record: Record | None = None):
        self.task = task
        self.state = state
        self.source = source
        self.func_name = func_name
        self.lib_path = lib_path
        self.record = record
        self._lib = KernelLibrary(lib_path, func_name)

    @property
    def schedule(self) -> str:
        """The program's loop nest, readable, with the loop extents that run."""
        from ansor.lower.lower import schedule_text

        return schedule_text(self.state)

    def _check_inputs(self, inputs: Sequence) -> list[np.ndarray]:
        expected = self.task.inputs
        if len(inputs) != len(expected):
            names = ", ".join(t.name for t in expected)
            raise TypeError(f"kernel {self.task.name!r} takes {len(expected)} inputs ({names}), "
                            f"got {len(inputs)}")
        arrays = []
        for t, a in zip(expected, inputs):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"input {t.name!r}: expected a numpy array, got {type(a).__name__}")
            if a.dtype != np.dtype(t.dtype):
                raise TypeError(f"input {t.name!r}: expected dtype {t.dtype}, got {a.dtype}")
            if tuple(a.shape) != tuple(t.shape):
                raise ValueError(f"input {t.name!r}: expected shape {tuple(t.shape)}, got {tuple(a.shape)}")
            arrays.append(np.ascontiguousarray(a))
        return arrays

    def _outputs(self, out) -> list[np.ndarray]:
        outs = self.task.outputs
        if out is None:
            return [aligned_empty(t.shape, t.dtype) for t in outs]
        given = list(out) if isinstance(out, (list, tuple)) else [out]
        if len(given) != len(outs):
            raise TypeError(f"out=: kernel {self.task.name!r} has {len(outs)} outputs, got {len(given)}")
        for t, a in zip(outs, given):
            if not isinstance(a, np.ndarray) or a.dtype != np.dtype(t.dtype):
                raise TypeError(f"out= {t.name!r}: expected a numpy array of dtype {t.dtype}")
            if tuple(a.shape) != tuple(t.shape):
                raise ValueError(f"out= {t.name!r}: expected shape {tuple(t.shape)}, got {tuple(a.shape)}")
            if not a.flags.c_contiguous:
                raise ValueError(f"out= {t.name!r}: the array must be C-contiguous")
        return given

    def __call__(self, *inputs: np.ndarray, out=None):
        """Run on numpy inputs; returns the output(s). Inputs on 64-byte boundaries
        (`ansor.measure.aligned_copy`) run at the speed measured during tuning."""
        arrays = self._check_inputs(inputs)
        outputs = self._outputs(out)
        self._lib(arrays + outputs)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def time(self, *inputs: np.ndarray, timing: TimingPolicy | None = None) -> float:
        """Median seconds per call (in this process)."""
        arrays = self._check_inputs(inputs)
        res = time_function(self.lib_path, self.func_name, arrays, self._outputs(None), timing or TimingPolicy())
        return res.median

    def close(self) -> None:
        self._lib.close()


def compile_state(task: Task, state: State, record: Record | None = None,
                  builder: Builder | None = None) -> Kernel:
    source, fname = generate_source(state, task.target, _entry_name(task))
    result = (builder or Builder()).compile_one(source)
    if result.error_no != MeasureErrorNo.NO_ERROR or result.lib_path is None:
        raise RuntimeError(f"compiling {task.name!r} failed: {result.error_msg}")
    return Kernel(task, state, source, fname, result.lib_path, record)


def _entry_name(task: Task) -> str:
    return f"{task.name}_kernel" if task.name else "kernel"


def build(task: Task, database: Database | str | None = None, state: State | None = None) -> Kernel:
    """The fastest recorded program of the task on its target, compiled; with no usable record,
    an untuned default schedule."""
    from ansor.search.basic import default_schedule
    from ansor.tuner import open_database

    if state is not None:
        return compile_state(task, state)
    db, owned = open_database(database)
    try:
        for rec in db.best(task.workload_key, task.target.key, k=5):
            try:
                st = State.replay(task.dag, steps_from_json(rec.steps))
            except ScheduleError:
                continue  # a record this version cannot replay; try the next best
            return compile_state(task, st, rec)
    finally:
        if owned:
            db.close()
    return compile_state(task, default_schedule(task))
