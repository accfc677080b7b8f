"""The search-policy interface: what the tuner asks of any search strategy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from ansor.records import Record
from ansor.schedule.state import State
from ansor.task import Task


@dataclass(frozen=True)
class MeasureResult:
    """A program and the record of its measurement: what a search learns from, whether it was
    measured just now or read back from the database."""

    state: State
    record: Record

    @property
    def ok(self) -> bool:
        return self.record.ok

    @property
    def cost(self) -> float:
        """Median seconds; math.inf for a failed measurement."""
        return self.record.median_cost


class SearchPolicy(ABC):
    """Proposes batches of complete, unmeasured programs and learns from their measurements."""

    def __init__(self, task: Task, seed: int | None = None):
        self.task = task
        self.seed = seed

    @abstractmethod
    def next_batch(self, n: int, measured_keys: set[str], deadline: float | None = None) -> list[State]:
        """Up to n complete programs whose `key()` is not in measured_keys (fewer when the
        space looks exhausted). `deadline` (a `time.time()` value, None: none) is when the
        job's time is up: a search that runs past it should cut its work short."""

    def update(self, results: Sequence[MeasureResult]) -> None:
        """Learn from measured results. Default: nothing."""

    def preload(self, records: Sequence) -> None:
        """Learn from records measured before this job (database Records). Default: nothing."""

    def close(self) -> None:
        """Release resources (worker processes). Default: nothing."""
