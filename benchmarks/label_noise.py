"""How well can any cost model rank a corpus's programs? Measure them again and see.

A cost model is scored by how often it orders two measured programs the way their recorded
times do (pairwise accuracy beyond the 5% noise margin). The recorded times are themselves one
noisy measurement each, so even a model that knew every program's true speed would disagree
with some recorded orders. This script re-measures a sample of a corpus's programs (same
machine, same target, fresh builds) and scores the second measurement against the first, as if
it were a model:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
        python benchmarks/label_noise.py --database corpus.db --workloads 20 --programs 48

Two noisy measurements agree on a pair with probability a = p^2 + (1-p)^2 when each gets the
true order with probability p; so p = (1 + sqrt(2a - 1)) / 2 estimates how often the recorded
order is the true one, the ceiling of a perfect model's score against these records.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time

import numpy as np

from ansor.costmodel.metrics import NOISE_MARGIN, pairwise_accuracy, topk_recall
from ansor.records import pool_runs
from ansor.store import Database
from ansor.tuning.measurer import ProgramMeasurer
from ansor.replay import ReplayError, replay, workload_dag
from ansor.target import Target
from ansor.task import Task
from ansor.workloads import workload_label


def implied_label_accuracy(agreement: float) -> float:
    """How often one measurement orders a pair truly, from how often two of them agree."""
    return 0.5 * (1.0 + math.sqrt(max(0.0, 2.0 * agreement - 1.0)))


def remeasure_workload(db: Database, workload_key: str, target: Target, programs: int,
                       rng: random.Random) -> tuple[list[float], list[float]] | None:
    """(recorded throughputs, re-measured throughputs) of up to `programs` of the workload's
    correct programs, drawn at random; None when the workload cannot be rebuilt."""
    try:
        dag = workload_dag(db, workload_key)
    except ReplayError:
        return None
    task = Task(dag.inputs + dag.outputs, target=target)
    pooled = [(rec, costs) for rec, costs in pool_runs(db.records(workload_key, target.key)) if costs]
    rng.shuffle(pooled)
    states, recorded = [], []
    for rec, costs in pooled:
        try:
            states.append(replay(rec, dag))
        except ReplayError:
            continue
        recorded.append(1.0 / statistics.median(costs))
        if len(states) == programs:
            break
    if len(states) < 2:
        return None
    measurer = ProgramMeasurer(task, one_repeat_factor=0, search_repeat_ms=0)  # every program timed in full
    try:
        results = measurer.measure(states)
    finally:
        measurer.runner.close()
    old, new = [], []
    for throughput, result in zip(recorded, results):
        if result.record.ok:
            old.append(throughput)
            new.append(1.0 / result.record.median_cost)
    return old, new


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database", required=True, help="the corpus (records of this machine's target)")
    p.add_argument("--workloads", type=int, default=20, help="workloads drawn at random")
    p.add_argument("--programs", type=int, default=48, help="programs per workload, drawn at random")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    target = Target.host()
    rng = random.Random(args.seed)
    old_all: list[float] = []
    new_all: list[float] = []
    groups: list[str] = []
    per_workload: list[float] = []
    recalls: list[float] = []
    start = time.time()
    with Database.open_existing(args.database) as db:
        keys = sorted(db.workload_keys())
        rng.shuffle(keys)
        for key in keys:
            if len(per_workload) == args.workloads:
                break
            got = remeasure_workload(db, key, target, args.programs, rng)
            if got is None:
                continue
            old, new = got
            label = workload_label((db.workload(key) or {}).get("description"))
            acc = pairwise_accuracy(new, old, margin=NOISE_MARGIN)
            ratio = np.asarray(new) / np.asarray(old)
            per_workload.append(acc)
            if len(old) > 10:
                recalls.append(topk_recall(new, old, k=10))
            print(f"{label:<44} {len(old):3d} programs  agreement {acc:.3f}  "
                  f"new/recorded throughput median {np.median(ratio):.2f} "
                  f"(p10 {np.percentile(ratio, 10):.2f}, p90 {np.percentile(ratio, 90):.2f})  "
                  f"[{time.time() - start:.0f} s]", flush=True)
            old_all += old
            new_all += new
            groups += [key] * len(old)
    if not per_workload:
        raise SystemExit(f"no workload of target {target.key} in {args.database} could be re-measured")
    agreement = pairwise_accuracy(new_all, old_all, groups, margin=NOISE_MARGIN)
    recall = statistics.mean(recalls) if recalls else float("nan")
    print(f"\n{len(per_workload)} workloads, {len(old_all)} programs: pairwise agreement of two "
          f"measurements beyond {NOISE_MARGIN:.0%}: {agreement:.3f} (workload median "
          f"{statistics.median(per_workload):.3f}); top-10 recall {recall:.3f}")
    print(f"implied share of recorded pair orders that are true (a perfect model's score): "
          f"{implied_label_accuracy(agreement):.3f}")


if __name__ == "__main__":
    main()
