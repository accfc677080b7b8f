"""The JSON-lines interchange of records, shared by every store.

One JSON object per line, in this order:

* ``{"workload": {"key": ..., "description": {...}, "flop": ..., "created": ...}}`` for each
  workload the records refer to,
* ``{"target": {"key": ..., "description": {...}}}`` for each target,
* one `Record.to_json` object per record, in insertion order.

Blank lines and lines starting with ``#`` are skipped, so a file can be annotated by hand. A
file is parsed whole before anything is imported, so a bad line (named by its number) imports
nothing.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ansor.records import DatabaseError, Record, canonical_json, is_number

__all__ = ["loads_object", "parse_jsonl", "target_line", "workload_line"]


def workload_line(key: str, description: str, flop: float, created: float) -> str:
    """The line of a workload whose description is stored as JSON text."""
    entry = {"key": key, "description": json.loads(description), "flop": flop, "created": created}
    return canonical_json({"workload": entry})


def target_line(key: str, description: str) -> str:
    """The line of a target whose description is stored as JSON text."""
    return canonical_json({"target": {"key": key, "description": json.loads(description)}})


def loads_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def parse_jsonl(path: str | os.PathLike[str]) -> tuple[list[tuple], list[tuple], list[Record]]:
    """Parse a whole JSONL file into workload rows, target rows and records.

    Lines are decoded one at a time so that bad bytes, bad JSON and bad
    fields are all reported with their line number.
    """
    workloads: list[tuple] = []
    targets: list[tuple] = []
    records: list[Record] = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as exc:
                    raise DatabaseError(f"not UTF-8 text: {exc}") from None
                if not line or line.startswith("#"):
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as exc:
                    raise DatabaseError(f"invalid JSON: {exc}") from None
                if isinstance(obj, dict) and len(obj) == 1 and "workload" in obj:
                    workloads.append(workload_row(obj["workload"]))
                elif isinstance(obj, dict) and len(obj) == 1 and "target" in obj:
                    targets.append(target_row(obj["target"]))
                else:
                    try:
                        records.append(Record.from_dict(obj))
                    except (TypeError, ValueError) as exc:
                        raise DatabaseError(str(exc)) from None
            except DatabaseError as exc:
                raise DatabaseError(f"{path}: line {lineno}: {exc}") from None
    return workloads, targets, records


def workload_row(entry: Any) -> tuple:
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
        raise DatabaseError("workload entry must be an object with a string 'key'")
    if not isinstance(entry.get("description"), dict):
        raise DatabaseError("workload entry must have an object 'description'")
    flop = entry.get("flop", 0.0)
    created = entry.get("created", time.time())
    if not is_number(flop) or not is_number(created):
        raise DatabaseError("workload 'flop' and 'created' must be numbers")
    return (entry["key"], canonical_json(entry["description"]), float(flop), float(created))


def target_row(entry: Any) -> tuple:
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
        raise DatabaseError("target entry must be an object with a string 'key'")
    if not isinstance(entry.get("description"), dict):
        raise DatabaseError("target entry must have an object 'description'")
    return (entry["key"], canonical_json(entry["description"]))
