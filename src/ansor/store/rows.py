"""The records table's row as both SQL stores hold it: the columns a Record becomes and back,
and the filter by workload and target, written once for SQLite and PostgreSQL alike."""

from __future__ import annotations

import json
import math
from typing import Any

from ansor.records import Record, canonical_json


def record_from_row(row: tuple) -> Record:
    """Build a record from a trusted row without re-normalising it; damaged JSON columns raise
    ValueError or TypeError (the store says which workload)."""
    wk, tk, sk, steps, costs, _median_cost, error_no, error_msg, all_cost, timestamp, version, node = row
    steps_v = json.loads(steps)
    costs_v = tuple(float(c) for c in json.loads(costs))
    rec = object.__new__(Record)
    for name, value in (
        ("workload_key", wk),
        ("target_key", tk),
        ("steps", steps_v),
        ("state_key", sk),
        ("costs", costs_v),
        ("error_no", int(error_no)),
        ("error_msg", error_msg),
        ("all_cost", float(all_cost)),
        ("timestamp", float(timestamp)),
        ("version", version),
        ("node", node),
    ):
        object.__setattr__(rec, name, value)
    return rec


def row_from_record(rec: Record) -> tuple:
    """The columns of `rec`, in the table's order (a failed record's median is NULL)."""
    if not isinstance(rec, Record):
        raise TypeError(f"expected a Record, got {type(rec).__name__}")
    cost = rec.median_cost
    return (
        rec.workload_key,
        rec.target_key,
        rec.state_key,
        canonical_json(rec.steps),
        canonical_json(list(rec.costs)),
        cost if math.isfinite(cost) else None,
        rec.error_no,
        rec.error_msg,
        rec.all_cost,
        rec.timestamp,
        rec.version,
        rec.node,
    )


def where_clause(workload_key: str | None, target_key: str | None, placeholder: str) -> tuple[str, list[Any]]:
    """" WHERE ..." (or "") selecting a workload and/or target, and its parameters;
    `placeholder` is the driver's parameter mark ("?" for sqlite3, "%s" for psycopg)."""
    clauses: list[str] = []
    params: list[Any] = []
    if workload_key is not None:
        clauses.append(f"workload_key = {placeholder}")
        params.append(workload_key)
    if target_key is not None:
        clauses.append(f"target_key = {placeholder}")
        params.append(target_key)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params
