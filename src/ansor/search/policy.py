"""The search-policy interface: what the tuner asks of any search strategy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

from ansor.schedule.state import State
from ansor.task import Task


class SearchPolicy(ABC):
    """Proposes batches of complete, unmeasured programs and learns from their measurements."""

    def __init__(self, task: Task, seed: int | None = None):
        self.task = task
        self.seed = seed

    @abstractmethod
    def next_batch(self, n: int, measured_keys: set[str]) -> list[State]:
        """Up to n complete programs whose `key()` is not in measured_keys (fewer when the
        space looks exhausted)."""

    def update(self, results: Sequence) -> None:
        """Learn from measured results (MeasureResult objects). Default: nothing."""

    def preload(self, records: Sequence) -> None:
        """Learn from records measured before this job (database Records). Default: nothing."""

    def close(self) -> None:
        """Release resources (worker processes). Default: nothing."""
