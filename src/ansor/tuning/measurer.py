"""ProgramMeasurer: turn candidate programs into measured, checked results.

Lowering, code generation and compilation (in parallel, through the Builder) happen in the
backend's `build` (a lowering error is an instantiation error record); every kernel runs in the
Runner's isolated worker, is checked against the task's reference outputs, and only then timed.

The measurer keeps nothing: each result goes to the caller's `on_result` as soon as it exists
(the tuner's callbacks write it to the database), so an interrupted batch loses no measurement.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Callable, Sequence

from ansor.backend import backend_for
from ansor.records import Record
from ansor.measure import Builder, MeasureErrorNo, Runner, TimingPolicy
from ansor.measure.check import task_rtol
from ansor.schedule.state import State
from ansor.search.policy import MeasureResult
from ansor.task import Task


ONE_REPEAT_FACTOR = 2.0  # a program this many times slower than the task's best is timed once
                         # (the confirmation at the end of a job re-times the leaders anyway)

#: The phases a batch goes through, as reported to `on_phase`.
PHASE_COMPILING = "compiling"
PHASE_MEASURING = "measuring"


class ProgramMeasurer:
    """Measures batches of programs of one task.

    Repeats go where they decide something: a program `one_repeat_factor` times slower than
    the best checked so far gets one timed repeat instead of the policy's (0: always all).
    `best_cost` starts at the caller's known best (a resumed job's database best)."""

    def __init__(self, task: Task, builder: Builder | None = None, runner: Runner | None = None,
                 timeout: float = 10.0, timing: TimingPolicy | None = None, seed: int = 0,
                 one_repeat_factor: float = ONE_REPEAT_FACTOR, best_cost: float = math.inf):
        self.task = task
        self.one_repeat_factor = one_repeat_factor
        self.best_cost = best_cost  # seconds; the fastest checked program of this task so far
        self.backend = backend = backend_for(task.target)
        self.builder = builder or backend.builder(task.target)
        self.runner = runner or backend.runner(timeout=timeout, timing=timing or TimingPolicy())
        self._owns_runner = runner is None
        self.seed = seed
        self._task_set = False
        self.last_batch_seconds = 0.0

    def _timing(self) -> TimingPolicy | None:
        """The runner's policy, told to time programs far slower than the best only once."""
        policy = self.runner.timing
        if self.one_repeat_factor <= 0 or self.best_cost == math.inf or policy.one_repeat_above:
            return None
        return replace(policy, one_repeat_above=self.one_repeat_factor * self.best_cost)

    def _ensure_task(self) -> None:
        if not self._task_set:
            inputs = self.task.random_inputs(self.seed)
            expected = self.task.reference_outputs(inputs)
            if self.runner.rtol is None and expected:  # long reductions round more
                self.runner.rtol = task_rtol(self.task)
            self.runner.set_task(inputs, expected)
            self._task_set = True

    def measure(self, states: Sequence[State], on_result: Callable[[MeasureResult], None] | None = None,
                on_phase: Callable[[str], None] | None = None,
                deadline: float | None = None) -> list[MeasureResult]:
        """Measure the states in order; never raises for a bad program (it becomes an error
        record). Each result is handed to `on_result` as soon as it is known. Past `deadline`
        (a `time.time()` value) no further program is run; those left are not returned."""
        self._ensure_task()
        start = time.time()
        if on_phase is not None:
            on_phase(PHASE_COMPILING)
        programs = self.backend.build(states, self.task.target, "kernel", self.builder)
        if on_phase is not None:
            on_phase(PHASE_MEASURING)
        results = []
        for st, program in zip(states, programs):
            if deadline is not None and time.time() >= deadline:
                break
            t0 = time.time()
            b = program.build
            if b is None:
                rec = self._record(st, (), MeasureErrorNo.INSTANTIATION_ERROR, program.error, 0.0)
            elif not program.ok:
                rec = self._record(st, (), b.error_no, b.error_msg, b.compile_seconds)
            else:
                r = self.runner.run(b.lib_path, program.entry, self._timing())
                costs = r.costs if r.error_no == MeasureErrorNo.NO_ERROR else ()
                if costs:
                    self.best_cost = min(self.best_cost, r.median)
                rec = self._record(st, costs, r.error_no, r.error_msg,
                                   b.compile_seconds + (time.time() - t0))
            result = MeasureResult(st, rec)
            results.append(result)
            if on_result is not None:
                on_result(result)
        self.last_batch_seconds = time.time() - start
        return results

    def _record(self, state: State, costs, error_no, msg: str, all_cost: float) -> Record:
        return Record(
            workload_key=self.task.workload_key,
            target_key=self.task.target.key,
            steps=state.steps_json(),
            state_key=state.key(),
            costs=tuple(costs),
            error_no=int(error_no),
            error_msg=msg[:2000],
            all_cost=all_cost,
            timestamp=time.time(),
        )

    def close(self) -> None:
        if self._owns_runner:
            self.runner.close()
