"""Callbacks of a tuning job: what happens to each measured program besides learning from it.

The tuning loop measures and updates the search; everything a person or a file sees goes
through these hooks, so writing records, drawing progress and user hooks are separate objects
that a multi-task job shares across its tasks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from ansor.records import RecordStore
from ansor.interrupts import signals_deferred

if TYPE_CHECKING:  # imported for annotations only: the tuner imports this module
    from ansor.tuning.measurer import MeasureResult
    from ansor.tuning.task_tuner import TaskTuner


class TuningCallback:
    """Hooks called by `TaskTuner`; every hook does nothing by default."""

    def on_start(self, tuner: TaskTuner) -> None:
        """Before the task's first round of this job."""

    def on_phase(self, tuner: TaskTuner, phase: str) -> None:
        """The round entered a phase: searching, compiling or measuring."""

    def on_result(self, tuner: TaskTuner, result: MeasureResult) -> None:
        """One program was measured (or failed); `tuner.result` already counts it."""

    def on_round_end(self, tuner: TaskTuner, results: Sequence[MeasureResult]) -> None:
        """A round ended and the search has learned from its results."""

    def on_end(self, tuner: TaskTuner) -> None:
        """The job is over for this task (also after an interrupt)."""


class RecordToDatabase(TuningCallback):
    """Commits every measured program's record as soon as it exists, with the signals held
    back for the commit, so an interrupt loses nothing that was measured."""

    def __init__(self, database: RecordStore) -> None:
        self.database = database
        self.committed = 0  # records written by this job

    def on_start(self, tuner: TaskTuner) -> None:
        task = tuner.task
        self.database.add_workload(task.workload_key, task.describe(), task.flop)
        self.database.add_target(task.target.key, task.target.describe())

    def on_result(self, tuner: TaskTuner, result: MeasureResult) -> None:
        with signals_deferred():
            self.database.add_records([result.record])
            self.committed += 1


class RoundCallback(TuningCallback):
    """Calls `fn(tuner.result)` after every round (the `callback=` of `ansor.tune`)."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def on_round_end(self, tuner: TaskTuner, results: Sequence[MeasureResult]) -> None:
        self.fn(tuner.result)
