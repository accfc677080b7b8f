"""Tune the corpus into a database, resumably: a rerun tops up only the workloads that have
fewer than the asked number of records, so an interrupted collection of hours continues where
it stopped."""

from __future__ import annotations

from typing import Callable, Sequence

from ansor.records import RecordStore
from ansor.task import Task
from ansor.tuning.callbacks import TuningCallback
from ansor.tuning.job import tune
from ansor.tuning.options import TuneOptions


def missing(tasks: Sequence[Task], store: RecordStore, trials: int) -> list[Task]:
    """The tasks with fewer than `trials` records of their target in the store."""
    return [t for t in tasks if store.count(t.workload_key, t.target.key) < trials]


def collect(tasks: Sequence[Task], store: RecordStore, trials: int = 64, seed: int = 0,
            callbacks: Sequence[TuningCallback] = (), log: Callable[[str], None] = print) -> int:
    """Tune each task that has fewer than `trials` records for `trials` more programs; returns
    how many tasks were tuned.

    Each task is tuned on its own, from no other workload's records and without the
    pretrained model: the corpus should hold what a fresh search measures, not what a model
    that already knows would pick. Task i gets seed `seed + i` of the tasks still missing.
    `callbacks` (a progress display) see every job; `log` gets a line per task.
    """
    todo = missing(tasks, store, trials)
    log(f"{len(tasks)} workloads in the corpus, {len(todo)} with fewer than {trials} records")
    options = TuneOptions(trials=trials, transfer_programs=0, pretrained=False)
    for i, task in enumerate(todo):
        log(f"[{i + 1}/{len(todo)}] {task.name} {[tuple(t.shape) for t in task.inputs]}")
        tune(task, TuneOptions.from_keywords(options, seed=seed + i), store, callbacks)
    return len(todo)
