"""Records: one measurement of one program, the value every layer passes around.

A tuning run measures candidate programs and each measurement becomes a `Record`. A program is
kept only as its list of schedule steps (a JSON-able list of lists) plus ``state_key``, a
canonical string identifying the program, so a later run can skip measuring it again and can
replay the best one without keeping any compiled artefact. A program measured several times
has several records; `pool_runs` joins them.

This module is the floor the search, the measurer and the cost model stand on: they see
records, never storage. `RecordStore` is the interface of storage (SQLite by default,
`ansor.store`); only the tuning job and the command line open one.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["RECORD_FORMAT_VERSION", "DatabaseError", "Record", "RecordStore", "pool_runs"]

JSON_SEPARATORS = (",", ":")

#: Version tag written into every record; records with another tag are refused.
RECORD_FORMAT_VERSION = "ansor-1"

class DatabaseError(Exception):
    """A records file or JSONL line that cannot be used as it is.

    Raised instead of raw ``sqlite3`` errors so callers (and the CLI) can
    report one clear message naming the file and the problem.
    """


def canonical_json(value: Any) -> str:
    """Compact JSON: the form steps and descriptions are stored and compared in."""
    return json.dumps(value, separators=JSON_SEPARATORS)


def _canonical_steps(steps: Any) -> list:
    """Return ``steps`` as it will read back from JSON (tuples become lists).

    Normalising on construction makes a fresh record compare equal to the
    same record loaded from the database, and rejects non-JSON-able steps at
    the point they are made rather than when the batch is committed.
    """
    if not isinstance(steps, (list, tuple)):
        raise TypeError(f"steps must be a list of steps, got {type(steps).__name__}")
    try:
        return json.loads(canonical_json(steps))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"steps are not JSON-serialisable: {exc}") from None


def median(costs: tuple[float, ...]) -> float:
    """The median of run times (the middle pair averaged), without numpy."""
    ordered = sorted(costs)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


@dataclass(frozen=True)
class Record:
    """One measurement of one program on one target.

    ``steps`` is normalised to its JSON form (nested lists) and ``costs`` to
    a tuple of floats, so records built in memory and records loaded from a
    file or database compare equal. ``node`` names the machine that measured
    it where measurement is spread over several (empty: where the job ran).
    """

    workload_key: str
    target_key: str
    steps: tuple | list
    state_key: str
    costs: tuple[float, ...]
    error_no: int
    error_msg: str = ""
    all_cost: float = 0.0
    timestamp: float = 0.0
    version: str = RECORD_FORMAT_VERSION
    node: str = ""

    def __post_init__(self) -> None:
        for name in ("workload_key", "target_key", "state_key", "error_msg", "version", "node"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Record.{name} must be a str, got {type(getattr(self, name)).__name__}")
        if isinstance(self.costs, (str, bytes)):
            raise TypeError("Record.costs must be a sequence of numbers")
        if isinstance(self.error_no, bool) or not isinstance(self.error_no, int):
            raise TypeError(f"Record.error_no must be an int, got {type(self.error_no).__name__}")
        set_ = object.__setattr__
        set_(self, "steps", _canonical_steps(self.steps))
        set_(self, "costs", tuple(float(c) for c in self.costs))
        set_(self, "error_no", int(self.error_no))  # plain int even for IntEnum codes
        set_(self, "all_cost", float(self.all_cost))
        set_(self, "timestamp", float(self.timestamp))

    # Lists in ``steps`` would make the generated hash fail; these fields
    # are enough to tell records apart and agree with ``__eq__``.
    def __hash__(self) -> int:
        return hash((self.workload_key, self.target_key, self.state_key, self.timestamp, self.error_no, self.costs))

    @property
    def median_cost(self) -> float:
        """Median of ``costs`` in seconds; ``math.inf`` for errors or no costs."""
        if self.error_no != 0 or not self.costs:
            return math.inf
        return median(self.costs)

    @property
    def ok(self) -> bool:
        """True when the program ran correctly and has a finite cost."""
        return math.isfinite(self.median_cost)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of `to_json`, with a fixed key order; ``node`` only where one is named,
        so a record measured where the job ran reads as it did before the field existed."""
        out = {
            "version": self.version,
            "workload_key": self.workload_key,
            "target_key": self.target_key,
            "state_key": self.state_key,
            "steps": self.steps,
            "costs": list(self.costs),
            "error_no": self.error_no,
            "error_msg": self.error_msg,
            "all_cost": self.all_cost,
            "timestamp": self.timestamp,
        }
        if self.node:
            out["node"] = self.node
        return out

    def to_json(self) -> str:
        """One-line JSON (no newline), keys in a stable order for diffable logs."""
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, obj: Any) -> Record:
        """Build a record from a parsed JSON object; raises DatabaseError on bad fields."""
        if not isinstance(obj, dict):
            raise DatabaseError(f"record must be a JSON object, got {type(obj).__name__}")
        version = obj.get("version", RECORD_FORMAT_VERSION)
        if version != RECORD_FORMAT_VERSION:
            raise DatabaseError(
                f"unsupported record version {version!r} (this ansor reads {RECORD_FORMAT_VERSION!r})"
            )
        missing = [k for k in ("workload_key", "target_key", "state_key", "steps", "costs", "error_no") if k not in obj]
        if missing:
            raise DatabaseError(f"record is missing field(s): {', '.join(missing)}")
        for name in ("workload_key", "target_key", "state_key"):
            if not isinstance(obj[name], str):
                raise DatabaseError(f"record field {name!r} must be a string")
        if not isinstance(obj["steps"], list):
            raise DatabaseError("record field 'steps' must be a list")
        costs = obj["costs"]
        if not isinstance(costs, list) or not all(is_number(c) for c in costs):
            raise DatabaseError("record field 'costs' must be a list of numbers")
        if isinstance(obj["error_no"], bool) or not isinstance(obj["error_no"], int):
            raise DatabaseError("record field 'error_no' must be an integer")
        error_msg = obj.get("error_msg", "")
        if not isinstance(error_msg, str):
            raise DatabaseError("record field 'error_msg' must be a string")
        for name in ("all_cost", "timestamp"):
            if not is_number(obj.get(name, 0.0)):
                raise DatabaseError(f"record field {name!r} must be a number")
        if not isinstance(obj.get("node", ""), str):
            raise DatabaseError("record field 'node' must be a string")
        return cls(
            workload_key=obj["workload_key"],
            target_key=obj["target_key"],
            steps=obj["steps"],
            state_key=obj["state_key"],
            costs=tuple(costs),
            error_no=obj["error_no"],
            error_msg=error_msg,
            all_cost=obj.get("all_cost", 0.0),
            timestamp=obj.get("timestamp", 0.0),
            version=version,
            node=obj.get("node", ""),
        )

    @classmethod
    def from_json(cls, line: str) -> Record:
        """Parse one `to_json` line; raises DatabaseError naming the problem."""
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise DatabaseError(f"invalid JSON: {exc}") from None
        return cls.from_dict(obj)


def pool_runs(records: Iterable[Record]) -> list[tuple[Record, tuple[float, ...]]]:
    """(first record, costs of all its ok runs) per distinct program, in first-measurement
    order; a program with no ok run gets no costs."""
    firsts: dict[str, Record] = {}
    runs: dict[str, list[float]] = {}
    for rec in records:
        if rec.state_key not in firsts:
            firsts[rec.state_key] = rec
            runs[rec.state_key] = []
        if rec.ok:
            runs[rec.state_key] += rec.costs
    return [(rec, tuple(runs[key])) for key, rec in firsts.items()]


def is_number(value: Any) -> bool:
    """A JSON number (a bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@runtime_checkable
class RecordStore(Protocol):
    """Where records live: what the tuning job, `build` and the command line need of storage.

    `ansor.store.SQLiteStore` is the default, `ansor.store.PostgresStore` a server a team
    shares; `ansor.store.open_store` opens one from a path or a URL. ``path`` names the store
    in messages: a file's Path, else a string (a URL, its password hidden; ":memory:"). Every
    write of a batch is one transaction, so a reader never sees half of it.
    """

    path: Any
    read_only: bool

    def add_workload(self, key: str, description: dict, flop: float = 0.0) -> None:
        """Register a workload (its description holds the whole computation)."""

    def add_target(self, key: str, description: dict) -> None:
        """Register a target."""

    def workload(self, key: str) -> dict[str, Any] | None:
        """A workload's entry (``description``, ``flop``, ``created``), or None."""

    def workload_keys(self) -> list[str]:
        """Every registered workload's key."""

    def target(self, key: str) -> dict[str, Any] | None:
        """A target's entry (``description``), or None."""

    def target_keys(self) -> list[str]:
        """Every target key with a description or a record."""

    def add_records(self, records: Iterable[Record]) -> int:
        """Append records in one transaction; returns how many."""

    def records(self, workload_key: str | None = None, target_key: str | None = None,
                ok_only: bool = False) -> list[Record]:
        """Records in insertion order, optionally of one workload and target."""

    def best(self, workload_key: str, target_key: str, k: int = 1) -> list[Record]:
        """The `k` fastest distinct programs, each judged on all its ok runs."""

    def measured_state_keys(self, workload_key: str, target_key: str) -> set[str]:
        """Keys of every program measured for the workload on the target."""

    def count(self, workload_key: str | None = None, target_key: str | None = None) -> int:
        """How many records (of one workload and target)."""

    def summary(self) -> list[dict[str, Any]]:
        """One row per (workload, target): counts and the best record."""

    def export_jsonl(self, path: str | os.PathLike[str], workload_key: str | None = None,
                     target_key: str | None = None) -> int:
        """Write records (and their workloads and targets) as JSON lines; returns how many."""

    def import_jsonl(self, path: str | os.PathLike[str]) -> int:
        """Read JSON lines in one transaction; returns how many records were added."""

    def close(self) -> None:
        """Release the store; later calls raise DatabaseError."""
