"""TaskTuner: the tuning of one task, one round at a time.

A round asks the search policy for a batch, measures it, hands every result to the callbacks
as it comes, and lets the policy learn from the batch. A multi-task job holds one TaskTuner per
task and a scheduler decides whose round runs next; all of them may share one cost model.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ansor.tuning.callbacks import TuningCallback
from ansor.tuning.measurer import MeasureResult, ProgramMeasurer
from ansor.schedule.state import State
from ansor.search.policy import SearchPolicy
from ansor.task import Task

#: The phase of a round before compiling and measuring (see `ansor.tuning.measurer` for the others).
PHASE_SEARCHING = "searching"


@dataclass
class TuneResult:
    """What one tuning job found for one task: the best cost and the tuning curve."""

    task: Task
    best_cost: float = math.inf              # seconds (median of repeats; the database's best at the end)
    best_spread: float = 0.0                 # (max - min) / median of the best program's runs
    trials: int = 0                          # programs measured by this job
    error_counts: Counter = field(default_factory=Counter)  # MeasureErrorNo -> programs
    curve: list[tuple[int, float]] = field(default_factory=list)  # (trial, best GFLOP/s so far)
    best_steps: list | None = None
    prior_records: int = 0                   # records of this workload in the database at the start
    seconds: float = 0.0
    search_seconds: float = 0.0    # choosing programs (sampling, evolution, features, prediction)
    measure_seconds: float = 0.0   # code generation, compilation, checking and timing
    model_seconds: float = 0.0     # retraining the cost model on each measured batch

    def then(self, later: TuneResult) -> TuneResult:
        """This result followed by `later`'s, one job's worth (a model's warm-up lap, then its
        tuning): trials, errors, times and the curve joined; the best is `later`'s (it started
        from this one's records)."""
        offset = self.trials
        best = max((g for _, g in self.curve), default=0.0)
        curve = list(self.curve) + [(t + offset, max(g, best)) for t, g in later.curve]
        return TuneResult(later.task, later.best_cost, later.best_spread, self.trials + later.trials,
                          self.error_counts + later.error_counts, curve, later.best_steps, self.prior_records,
                          self.seconds + later.seconds, self.search_seconds + later.search_seconds,
                          self.measure_seconds + later.measure_seconds, self.model_seconds + later.model_seconds)

    @property
    def errors(self) -> int:
        """Programs of this job that failed (any reason)."""
        return sum(self.error_counts.values())

    @property
    def best_gflops(self) -> float:
        return self.task.flop / self.best_cost / 1e9 if self.best_cost < math.inf else 0.0


class TaskTuner:
    """One task's policy, measurer and result; `round()` advances it by one batch."""

    def __init__(self, task: Task, policy: SearchPolicy, measurer: ProgramMeasurer,
                 callbacks: Sequence[TuningCallback] = (), weight: float = 1.0,
                 measured_keys: set[str] | None = None):
        self.task = task
        self.policy = policy
        self.measurer = measurer
        self.callbacks = list(callbacks)
        self.result = TuneResult(task)
        self._weight = float(weight)
        self.measured_keys: set[str] = set(measured_keys or ())
        self._exhausted = False
        self.job_rounds = 0      # rounds of this job
        self.earlier_rounds = 0  # rounds of earlier jobs on the same database (count_earlier_rounds)
        self._cost_history: list[float] = []
        self._candidates: list[State] = []  # measured before the policy's proposals

    # --- what a task scheduler reads (search.scheduler.TaskView) -------------------------------
    @property
    def trials(self) -> int:
        return self.result.trials

    @property
    def best_cost(self) -> float:
        return self.result.best_cost

    @property
    def weight(self) -> float:
        return self._weight

    @property
    def exhausted(self) -> bool:
        return self._exhausted

    @property
    def flop(self) -> float:
        return self.task.flop

    @property
    def rounds(self) -> int:
        """Rounds the task has had, earlier jobs' included."""
        return self.earlier_rounds + self.job_rounds

    @property
    def cost_history(self) -> Sequence[float]:
        """The best cost after each round (what the gradient scheduler's backward estimate
        reads); earlier jobs' rounds first, flat at the best cost they left."""
        return tuple(self._cost_history)

    def count_earlier_rounds(self, n: int) -> None:
        """Count `n` rounds that earlier jobs spent on this task (a database being resumed), so
        that a task tuned before needs no second warm-up round and the scheduler judges what a
        further round can gain by all the rounds it has had. No-op without a working program."""
        if n <= 0 or math.isinf(self.result.best_cost):
            return
        self.earlier_rounds = n
        self._cost_history = [self.result.best_cost] * n + self._cost_history

    # --- the loop ---------------------------------------------------------------------------
    def start(self) -> None:
        for cb in self.callbacks:
            cb.on_start(self)

    def end(self) -> None:
        for cb in self.callbacks:
            cb.on_end(self)

    def _phase(self, phase: str) -> None:
        for cb in self.callbacks:
            cb.on_phase(self, phase)

    def _on_result(self, r: MeasureResult) -> None:
        res = self.result
        res.trials += 1
        self.measured_keys.add(r.record.state_key)
        if not r.ok:
            res.error_counts[r.record.error_no] += 1
        elif r.cost < res.best_cost:
            res.best_cost = r.cost
            res.best_spread = spread(r.record.costs)
            res.best_steps = r.record.steps
        res.curve.append((res.trials, res.best_gflops))
        for cb in self.callbacks:
            cb.on_result(self, r)

    def add_candidates(self, states: Iterable[State]) -> None:
        """Programs to measure first (another target's best, for instance), in order."""
        self._candidates += list(states)

    def round(self, n: int, deadline: float | None = None) -> list[MeasureResult]:
        """Search up to n unmeasured programs, measure them (stopping at `deadline`, a
        `time.time()` value), and let the policy learn. An empty return with `exhausted` set
        means the search space has nothing new."""
        res = self.result
        self._phase(PHASE_SEARCHING)
        t0 = time.perf_counter()
        first, seen = [], set(self.measured_keys)
        while self._candidates and len(first) < n:
            state = self._candidates.pop(0)
            if state.key() not in seen:
                seen.add(state.key())
                first.append(state)
        states = first + (self.policy.next_batch(n - len(first), seen, deadline=deadline) if len(first) < n else [])
        t1 = time.perf_counter()
        res.search_seconds += t1 - t0
        if not states:
            self._exhausted = True
            return []
        batch = self.measurer.measure(states, on_result=self._on_result, on_phase=self._phase,
                                      deadline=deadline)
        t2 = time.perf_counter()
        res.measure_seconds += t2 - t1
        self.policy.update(batch)
        res.model_seconds += time.perf_counter() - t2
        self.job_rounds += 1
        self._cost_history.append(res.best_cost)
        for cb in self.callbacks:
            cb.on_round_end(self, batch)
        return batch

    def close(self) -> None:
        """Stop the measurement worker and the search's workers."""
        try:
            self.measurer.close()
        finally:
            self.policy.close()


def spread(costs: Sequence[float]) -> float:
    """(max - min) / median of a program's runs: how far one figure can be trusted."""
    if len(costs) < 2:
        return 0.0
    median = statistics.median(costs)
    return (max(costs) - min(costs)) / median if median > 0 else 0.0
