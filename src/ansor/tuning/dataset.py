"""Training data for the cost model: database records replayed into programs and featurized."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Collection

import numpy as np

from ansor.records import RecordStore, pool_runs
from ansor.target import Target


@dataclass
class Dataset:
    features: list[np.ndarray] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    skipped: int = 0


def load_dataset(db: RecordStore, target_key: str, exclude_workloads: Collection[str] = (),
                 max_per_workload: int | None = None, feature_target: Target | None = None,
                 group_prefix: str = "") -> Dataset:
    """One sample per program of the target whose workload can be rebuilt (every workload
    stored with its computation, and named workloads of older databases); workloads in
    `exclude_workloads` are left out, and at most `max_per_workload` programs (the most recent)
    are kept of each. Features are those of the programs as they would run on `feature_target`
    (default: this machine), which for records of another target is the target being tuned;
    groups are the workload keys after `group_prefix` (throughputs are normalized per group,
    so records of two targets are best kept apart)."""
    from ansor.costmodel.features import features_for_states
    from ansor.replay import ReplayError, replay, workload_dag

    out = Dataset()
    for wk in db.workload_keys():
        if wk in exclude_workloads:
            continue
        recs = db.records(wk, target_key)
        if not recs:
            continue
        try:
            dag = workload_dag(db, wk)
        except ReplayError:
            out.skipped += len(recs)
            continue
        states, costs = [], []
        # one sample per program (the tuner re-measures its leaders), so that a program is in
        # only one side of a train/test split; its cost is the median of all its ok runs
        pooled = pool_runs(recs)
        if max_per_workload is not None:
            pooled = pooled[-max_per_workload:] if max_per_workload > 0 else []
        for rec, runs in pooled:
            try:
                states.append(replay(rec, dag))
            except ReplayError:
                out.skipped += 1
                continue
            costs.append(float(np.median(runs)) if runs else math.inf)
        out.features += features_for_states(states, target=feature_target)
        out.costs += costs
        out.groups += [group_prefix + wk] * len(costs)
    return out
