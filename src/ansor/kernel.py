"""build(): the best recorded program of a task as a callable Kernel."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import numpy as np

from ansor.backend import BuiltProgram, backend_for, build_programs
from ansor.lower.live_rows import GLOBAL as LIVE_ROWS_GLOBAL, LiveRowsSpec, skip_padded_rows
from ansor.records import Record, RecordStore
from ansor.measure import (Builder, KernelLibrary, TimingPolicy, aligned_copy, aligned_empty,
                           time_function)
from ansor.measure.check import check_outputs, task_rtol
from ansor.measure.timing import measure_costs
from ansor.measure.errors import DeviceUnavailableError
from ansor.replay import replay_records
from ansor.schedule.state import State
from ansor.search.basic import default_schedule
from ansor.task import Task
from ansor.torch_arrays import tensor_to_numpy


def input_array(name: str, value: Any, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """`value` as the numpy array a compiled callable (a `Kernel`, a `CompiledModel`) reads for
    its input `name` of `shape` and `dtype`: the one input rule of both.

    A numpy array (or numpy scalar) or a torch tensor must already have the declared dtype: a
    float64 array given for a float32 input raises TypeError naming the input, its dtype and
    the expected one, rather than being rounded silently (the caller decides whether to cast).
    A torch tensor is read without a copy when it is on the CPU. A Python list, tuple or number
    has no dtype of its own and is converted to the declared one, unless that changes its kind
    (floats for an integer input) or its values (integers that do not fit). A wrong shape
    raises ValueError."""
    expected = np.dtype(dtype)
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.dtype != expected:
            raise TypeError(f"input {name!r}: expected dtype {expected}, got {array.dtype}")
    elif type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        got = str(value.dtype).removeprefix("torch.")
        if got != expected.name:
            raise TypeError(f"input {name!r}: expected dtype {expected}, got torch.{got}")
        array = tensor_to_numpy(value)
    elif isinstance(value, (list, tuple, int, float, bool)):
        given = np.asarray(value)
        if given.dtype.kind not in "biuf" or not np.can_cast(given.dtype, expected, casting="same_kind"):
            raise TypeError(f"input {name!r}: expected dtype {expected}, got a {type(value).__name__} "
                            f"of {given.dtype} values")
        array = given.astype(expected)
        if expected.kind in "biu" and not np.array_equal(array, given):
            raise TypeError(f"input {name!r}: the values do not fit dtype {expected}")
    else:
        raise TypeError(f"input {name!r}: expected a numpy array of dtype {expected}, "
                        f"got {type(value).__name__}")
    if tuple(array.shape) != tuple(shape):
        raise ValueError(f"input {name!r}: expected shape {tuple(shape)}, got {tuple(array.shape)}")
    return array


class Kernel:
    """A compiled program: call it on numpy arrays (inputs in the task's order).

    Made by `ansor.build`, not by hand. `kernel(*inputs)` returns the output array (a tuple
    for several outputs); `out=` may pass preallocated outputs. Every input must have the dtype
    its placeholder declares (a float64 array for a float32 input raises TypeError; Python
    lists are converted): the rule of `input_array`, the same as a compiled model's.

    Attributes:
        task: The Task it computes.
        state: The program (the schedule) it was compiled from.
        source: The generated source code (C for a CPU).
        func_name: The kernel's symbol in the compiled library.
        lib_path: The compiled shared library.
        record: The database record of the program; None when it was built from no record (a
            default schedule, or a `state` given to `build`).
    """

    def __init__(self, task: Task, state: State, source: str, func_name: str, lib_path: str,
                 record: Record | None = None):
        self.task = task
        self.state = state
        self.source = source
        self.func_name = func_name
        self.lib_path = lib_path
        self.record = record
        try:
            self._lib = backend_for(task.target).loader(lib_path, func_name)
        except DeviceUnavailableError as err:  # built and readable here, runnable elsewhere
            self._lib = _NoDevice(err)
        self._packed = self._lib.packed_buffers()
        # the library's length global, when the kernel skips padded rows (`lower.live_rows`)
        self._live_rows = self._lib.int_global(LIVE_ROWS_GLOBAL) if isinstance(self._lib, KernelLibrary) else None
        self._padded_rows = self._live_rows.value if self._live_rows is not None else 0

    @property
    def skips_padded_rows(self) -> bool:
        """Whether the kernel computes only the rows of the length `set_live_rows` gives."""
        return self._live_rows is not None

    def set_live_rows(self, length: int | None) -> None:
        """The length of the padded dimension the next calls keep (None: the whole bucket);
        rows past it are skipped and left zero. A kernel that does not skip ignores it."""
        if self._live_rows is not None:
            self._live_rows.value = self._padded_rows if length is None else int(length)

    @property
    def constant_inputs(self) -> list[str]:
        """Names of the inputs declared constant (weights): `bind` fixes them."""
        return [t.name for t in self.task.inputs if t.op.constant]

    @property
    def packs_ahead(self) -> bool:
        """Whether the program has work that depends on constant inputs alone (a weight copied
        into a tiled layout), which `bind` does once instead of in every call."""
        return bool(self._lib.packed_nbytes)

    @property
    def packed_nbytes(self) -> tuple[int, ...]:
        """Sizes of the packed buffers (weights in tiled layouts) its calls take last."""
        return tuple(self._lib.packed_nbytes)

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
        return [np.ascontiguousarray(input_array(t.name, a, tuple(t.shape), t.dtype))
                for t, a in zip(expected, inputs)]

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
        """Run on numpy inputs of the declared dtypes (`input_array`); returns the output(s)
        as numpy arrays. Inputs on 64-byte boundaries (`ansor.measure.aligned_copy`) run at
        the speed measured during tuning."""
        arrays = self._check_inputs(inputs)
        outputs = self._outputs(out)
        buffers = arrays + outputs + self._packed
        self._lib.prepack(buffers)  # the constants may differ from the last call's: pack them again
        self._lib(buffers)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def bind(self, **constants: np.ndarray) -> "BoundKernel":
        """This kernel with its constant inputs fixed (copied) and packed once; the result is
        called with the other inputs only, and runs at the speed measured during tuning."""
        return BoundKernel(self, constants)

    def prepared(self, *inputs: np.ndarray, include_prepack: bool = False) -> Callable[[], list[np.ndarray]]:
        """A call of the compiled kernel on fixed copies of `inputs`, for timing beside other
        implementations: the outputs are allocated and the constants packed once, so a call
        costs the kernel and one foreign-function call, as during tuning; it returns the output
        buffers (the same arrays every call). With `include_prepack`, every call packs the
        constants again (what `kernel(...)` does)."""
        arrays = [aligned_copy(a) for a in self._check_inputs(inputs)]
        outputs = self._outputs(None)
        buffers = arrays + outputs + self._lib.packed_buffers()
        lib = self._lib
        lib.prepack(buffers)
        pack_each_call = include_prepack and self.packs_ahead

        def call() -> list[np.ndarray]:
            if pack_each_call:
                lib.prepack(buffers)
            lib(buffers)
            return outputs

        return call

    def call_on(self, buffers: Sequence[np.ndarray]) -> Callable[[], None]:
        """A zero-argument call of the kernel on fixed buffers (inputs in the task's order, then
        outputs), for executors that plan their memory once: the constants are packed now, from
        the buffers as they are, and the pointers are computed once, so a call costs one
        foreign-function call. The call holds the buffers (the caller must not resize them)."""
        if len(buffers) != len(self.task.inputs) + len(self.task.outputs):
            raise TypeError(f"call_on: kernel {self.task.name!r} takes {len(self.task.inputs)} inputs and "
                            f"{len(self.task.outputs)} outputs, got {len(buffers)} buffers")
        for t, a in zip([*self.task.inputs, *self.task.outputs], buffers):
            if a.dtype != np.dtype(t.dtype) or tuple(a.shape) != tuple(t.shape) or not a.flags.c_contiguous:
                raise ValueError(f"call_on: buffer {t.name!r} must be a C-contiguous {t.dtype} array "
                                 f"of shape {tuple(t.shape)}, got {a.dtype} {a.shape}")
        full = list(buffers) + self._lib.packed_buffers()
        self._lib.prepack(full)
        return self._lib.fixed_call(full)

    def time(self, *inputs: np.ndarray, timing: TimingPolicy | None = None,
             include_prepack: bool = False) -> float:
        """Median seconds per call (in this process). Constant inputs are packed once, before
        the timed calls, as during tuning; `include_prepack` times packing in every call instead
        (what `kernel(...)` costs without `bind`)."""
        arrays = self._check_inputs(inputs)
        policy = timing or TimingPolicy()
        if include_prepack and self.packs_ahead:
            buffers = arrays + self._outputs(None) + self._lib.packed_buffers()
            return statistics.median(measure_costs(_PackingEachCall(self._lib), buffers, policy))
        res = time_function(self.lib_path, self.func_name, arrays, self._outputs(None), policy,
                            loader=backend_for(self.task.target).loader)
        return res.median

    def check(self, *inputs: np.ndarray, seed: int = 1) -> str | None:
        """None when the kernel's outputs match the numpy reference on `inputs` (default: the
        task's random inputs of `seed`), else what differs. The tolerance is the one every
        measured program passed: a long float32 reduction rounds more than an elementwise
        result (`measure.check.reduction_rtol`), so a kernel the tuner accepted is not judged
        wrong here."""
        arrays = list(inputs) if inputs else self.task.random_inputs(seed=seed)
        out = self(*arrays)
        outputs = list(out) if isinstance(out, tuple) else [out]
        expected = self.task.reference_outputs(arrays)
        return check_outputs(outputs, expected, rtol=task_rtol(self.task) if expected else None)

    def close(self) -> None:
        """Release the loaded library; the kernel cannot be called afterwards."""
        self._lib.close()


class BoundKernel:
    """A Kernel whose constant inputs are fixed and packed: calls take the other inputs only."""

    def __init__(self, kernel: Kernel, constants: dict[str, np.ndarray]):
        names = [t.name for t in kernel.task.inputs]
        wanted = kernel.constant_inputs
        unknown = sorted(set(constants) - set(wanted))
        if unknown:
            raise TypeError(f"bind(): {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a constant "
                            f"input of {kernel.task.name!r} (constant inputs: {', '.join(wanted) or 'none'})")
        missing = [n for n in wanted if n not in constants]
        if missing:
            raise TypeError(f"bind(): give every constant input of {kernel.task.name!r}; missing "
                            f"{', '.join(missing)}")
        self.kernel = kernel
        self.input_names = [n for n in names if n not in constants]
        placeholders = {n: aligned_empty(t.shape, t.dtype) for n, t in zip(names, kernel.task.inputs)}
        full = kernel._check_inputs([constants.get(n, placeholders[n]) for n in names])
        self._constants = {n: aligned_copy(a) for n, a in zip(names, full) if n in constants}
        self._packed = kernel._lib.packed_buffers()
        others = [placeholders[n] for n in self.input_names]  # prepack reads only the constants
        kernel._lib.prepack(self._full(others) + kernel._outputs(None) + self._packed)

    def _full(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        given = iter(inputs)
        return [self._constants[t.name] if t.name in self._constants else next(given)
                for t in self.kernel.task.inputs]

    def __call__(self, *inputs: np.ndarray, out=None):
        """Run on the inputs that are not bound, in the task's order; returns the output(s)."""
        if len(inputs) != len(self.input_names):
            raise TypeError(f"bound kernel {self.kernel.task.name!r} takes {len(self.input_names)} inputs "
                            f"({', '.join(self.input_names)}), got {len(inputs)}")
        arrays = self.kernel._check_inputs(self._full(inputs))
        outputs = self.kernel._outputs(out)
        self.kernel._lib(arrays + outputs + self._packed)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


class _PackingEachCall:
    """A KernelLibrary seen as one that packs its constants in every call (for timing that)."""

    def __init__(self, lib: KernelLibrary):
        self.lib = lib

    def __call__(self, buffers: Sequence[np.ndarray]) -> None:
        self.lib.prepack(buffers)
        self.lib(buffers)

    def timed(self, buffers: Sequence[np.ndarray], number: int) -> float:
        start = time.perf_counter()
        for _ in range(number):
            self(buffers)
        return time.perf_counter() - start


class _NoDevice:
    """The loaded program of a kernel whose device is not here (a CUDA kernel built on a
    machine without a GPU): the kernel's source and library exist; running it says why not."""

    packed_nbytes: tuple[int, ...] = ()

    def __init__(self, error: DeviceUnavailableError):
        self.error = error

    def packed_buffers(self) -> list:
        return []

    def close(self) -> None:
        pass

    def __getattr__(self, name: str):
        raise self.error

    def __call__(self, *args, **kwargs):
        raise self.error


def compile_state(task: Task, state: State, record: Record | None = None,
                  builder: Builder | None = None, live_rows: LiveRowsSpec | None = None) -> Kernel:
    """One program of a task compiled (skipping padded rows where `live_rows` says, as in
    `build_many`)."""
    program = build_programs([state], task.target, _entry_name(task), builder, [_live_rows_pass(task, live_rows)])[0]
    if not program.ok:
        raise RuntimeError(f"compiling {task.name!r} failed: {program.message}")
    return Kernel(task, state, program.source, program.entry, program.build.lib_path, record)


def _entry_name(task: Task) -> str:
    return f"{task.name}_kernel" if task.name else "kernel"


def best_program(task: Task, store: RecordStore | None) -> tuple[State, Record | None]:
    """The task's fastest record that replays here, with its program; the default schedule and
    None when the store (if any) has none."""
    if store is not None:
        found = next(iter(replay_records(store.best(task.workload_key, task.target.key, k=5), task.dag)), None)
        if found is not None:
            return found[1], found[0]
    return default_schedule(task), None


def build_many(tasks: Sequence[Task], store: RecordStore | None = None, builder: Builder | None = None,
               live_rows: Sequence[LiveRowsSpec | None] | None = None) -> list[Kernel]:
    """`build` for several tasks, compiled in parallel: each task's fastest replayable record
    in `store`, else its default schedule (`Kernel.record` is None then). `live_rows[i]`, where
    given for a CPU task, says where its output holds a padded dimension: its kernel then skips
    the rows past the length `Kernel.set_live_rows` gives (`lower.live_rows`)."""
    chosen = [best_program(task, store) for task in tasks]
    specs = list(live_rows) if live_rows is not None else [None] * len(tasks)
    finish = [_live_rows_pass(t, spec) for t, spec in zip(tasks, specs)]
    built: dict[int, BuiltProgram] = {}
    for key in dict.fromkeys(t.target.key for t in tasks):  # one parallel build per target's compiler
        picked = [i for i, t in enumerate(tasks) if t.target.key == key]
        built.update(zip(picked, build_programs([chosen[i][0] for i in picked], tasks[picked[0]].target,
                                                [_entry_name(tasks[i]) for i in picked], builder,
                                                [finish[i] for i in picked])))
    kernels = []
    for i, task in enumerate(tasks):
        program = built[i]
        if not program.ok:
            raise RuntimeError(f"compiling {task.name!r} failed: {program.message}")
        state, record = chosen[i]
        kernels.append(Kernel(task, state, program.source, program.entry, program.build.lib_path, record))
    return kernels


def _live_rows_pass(task: Task, spec: LiveRowsSpec | None) -> Callable | None:
    """The finishing pass that makes a CPU kernel skip padded rows where `spec` says (None:
    no pass; the GPU backends have none)."""
    if spec is None or task.target.kind != "cpu":
        return None
    return lambda func, caps: skip_padded_rows(func, spec)


def build(task: Task, store: RecordStore | None = None, state: State | None = None) -> Kernel:
    """The fastest recorded program of the task on its target in `store`, compiled; with no
    usable record, an untuned default schedule."""
    if state is not None:
        return compile_state(task, state)
    return build_many([task], store)[0]
