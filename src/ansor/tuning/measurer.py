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


ONE_REPEAT_FACTOR = 1.3  # a program this many times slower than the task's best is timed once
                         # (the confirmation at the end of a job re-times the leaders anyway)
SEARCH_REPEAT_MS = 25.0  # a search's repeats last this long (at most the policy's own): a model's
                         # kernels spread about as much at 25 ms as at 50, for half the time
                         # (BENCHMARKS.md); a job's confirmation of its leaders uses the full policy

#: The phases a batch goes through, as reported to `on_phase`.
PHASE_COMPILING = "compiling"
PHASE_MEASURING = "measuring"


class ProgramMeasurer:
    """Measures batches of programs of one task.

    Repeats go where they decide something: a program `one_repeat_factor` times slower than
    the best checked so far gets one timed repeat instead of the policy's (0: always all), and
    a search's repeats last at most `search_repeat_ms` (0: the policy's). `best_cost` starts at
    the caller's known best (a resumed job's database best)."""

    def __init__(self, task: Task, builder: Builder | None = None, runner: Runner | None = None,
                 timeout: float = 10.0, timing: TimingPolicy | None = None, seed: int = 0,
                 one_repeat_factor: float = ONE_REPEAT_FACTOR, best_cost: float = math.inf,
                 search_repeat_ms: float = SEARCH_REPEAT_MS):
        self.task = task
        self.one_repeat_factor = one_repeat_factor
        self.search_repeat_ms = search_repeat_ms
        self.best_cost = best_cost  # seconds; the fastest checked program of this task so far
        self.backend = backend = backend_for(task.target)
        self.builder = builder or backend.builder(task.target)
        self.runner = runner or backend.runner(timeout=timeout, timing=timing or TimingPolicy())
        self._owns_runner = runner is None
        self.seed = seed
        self._task_set = False
        self.last_batch_seconds = 0.0

    def _timing(self, full: bool = False) -> TimingPolicy | None:
        """The runner's policy for a search: shorter repeats, and programs far slower than the
        best timed only once. `full`: the runner's own (None)."""
        policy = self.runner.timing
        if full:
            return None
        changed = policy
        if 0 < self.search_repeat_ms < policy.min_repeat_ms and not policy.flush_cache:
            changed = replace(changed, min_repeat_ms=self.search_repeat_ms)
        if self.one_repeat_factor > 0 and self.best_cost < math.inf and not policy.one_repeat_above:
            changed = replace(changed, one_repeat_above=self.one_repeat_factor * self.best_cost)
        return None if changed is policy else changed

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
                deadline: float | None = None, full_timing: bool = False) -> list[MeasureResult]:
        """Measure the states in order; never raises for a bad program (it becomes an error
        record). Each result is handed to `on_result` as soon as it is known. Past `deadline`
        (a `time.time()` value) no further program is run; those left are not returned.
        `full_timing`: every program timed by the runner's whole policy (a job's confirmation
        of its leaders), not the search's shorter one."""
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
                r = self.runner.run(b.lib_path, program.entry, self._timing(full_timing))
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
