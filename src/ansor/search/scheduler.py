"""Task schedulers: which task of a multi-task tuning job gets the next search round.

A scheduler sees each task only through `TaskView` (its measured trials, best cost, weight and
whether its space is exhausted), so it can be swapped without touching the tuning loop. Ansor's
gradient scheduler (paper section 6), which spends rounds where they shorten the whole model's
latency most, implements the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol, Sequence


class TaskView(Protocol):
    """What a scheduler may ask of one task's tuner."""

    @property
    def trials(self) -> int: ...

    @property
    def best_cost(self) -> float: ...

    @property
    def weight(self) -> float: ...

    @property
    def exhausted(self) -> bool: ...


class TaskScheduler(ABC):
    """Picks the task whose round runs next."""

    @abstractmethod
    def next_task(self, tasks: Sequence[TaskView]) -> int | None:
        """Index of the task to tune next; None when no task can go on."""

    def on_round_end(self, index: int, tasks: Sequence[TaskView]) -> None:
        """Told after each round of task `index` (a scheduler with history records it here)."""


class RoundRobinScheduler(TaskScheduler):
    """Every task in turn, skipping those whose search space is exhausted."""

    def __init__(self) -> None:
        self._next = 0

    def next_task(self, tasks: Sequence[TaskView]) -> int | None:
        for offset in range(len(tasks)):
            index = (self._next + offset) % len(tasks)
            if not tasks[index].exhausted:
                self._next = index + 1
                return index
        return None


SCHEDULERS = {"round-robin": RoundRobinScheduler}


def make_scheduler(scheduler: str | TaskScheduler) -> TaskScheduler:
    """A scheduler object from its name (or the object itself)."""
    if isinstance(scheduler, TaskScheduler):
        return scheduler
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown task scheduler {scheduler!r}; available: {', '.join(SCHEDULERS)}")
    return SCHEDULERS[scheduler]()
