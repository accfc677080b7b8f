"""Training data for the cost model: database records replayed into programs and featurized."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ansor.database import Database


@dataclass
class Dataset:
    features: list[np.ndarray] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    skipped: int = 0


def pooled_programs(records: list) -> list[tuple]:
    """(first record, cost) per distinct program, in first-measurement order: a program
    measured more than once (the tuner confirms its leaders) is one sample whose cost is the
    median of all its ok runs, so it can be in only one side of a train/test split."""
    firsts: dict[str, object] = {}
    runs: dict[str, list[float]] = {}
    for rec in records:
        if rec.state_key not in firsts:
            firsts[rec.state_key] = rec
            runs[rec.state_key] = []
        if rec.ok:
            runs[rec.state_key] += rec.costs
    return [(rec, float(np.median(runs[key])) if runs[key] else math.inf) for key, rec in firsts.items()]


def load_dataset(db: Database, target_key: str) -> Dataset:
    """One sample per program of the target whose workload the process can rebuild (named
    workloads and any DAG registered in this process)."""
    from ansor.costmodel.features import features_for_states
    from ansor.schedule.state import ScheduleError, State
    from ansor.schedule.steps import steps_from_json
    from ansor.workloads import dag_from_description

    out = Dataset()
    for wk in db.workload_keys():
        desc = db.workload(wk)
        dag = dag_from_description(desc["description"]) if desc else None
        recs = db.records(wk, target_key)
        if dag is None or dag.workload_key != wk:
            out.skipped += len(recs)
            continue
        states, costs = [], []
        for rec, cost in pooled_programs(recs):
            try:
                states.append(State.replay(dag, steps_from_json(rec.steps)))
            except ScheduleError:
                out.skipped += 1
                continue
            costs.append(cost)
        out.features += features_for_states(states)
        out.costs += costs
        out.groups += [wk] * len(costs)
    return out
