"""Time one evolutionary search round with a trained cost model, phase by phase.

    python benchmarks/search_round.py --workload matmul --shape 512,512,512 --trials 64

First tunes the workload for `--trials` measured programs (random sketch sampling) so the model
has real data, then runs `--rounds` search rounds with the default parameters (population 2048,
4 generations, batch 64) and prints the wall time of each and its breakdown: sampling the
initial population, feature extraction of the initial population, breeding (mutation and
crossover with the children's features, in worker processes), prediction, and the rest of
evolution (parent selection, bookkeeping).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import ansor
from ansor.costmodel.model import XGBModel
from ansor.store import Database
from ansor.search.sketch_policy import SketchPolicy
from ansor.workloads import make_task

from common import git_commit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="matmul")
    p.add_argument("--shape", default="512,512,512")
    p.add_argument("--trials", type=int, default=64, help="measured programs the model learns from")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--database", default=None, help="reuse the records of an earlier run")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    task = make_task(args.workload, shape)
    print(f"# search round: {args.workload} {shape}; {os.cpu_count()} cores; commit {git_commit()}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    db_path = args.database or os.path.join(tempfile.mkdtemp(), "round.db")
    db = Database(db_path)
    target_key = task.target.key
    if not db.records(task.workload_key, target_key):
        ansor.tune(task, trials=args.trials, database=db, seed=args.seed, policy="sketch.random")
    records = db.records(task.workload_key, target_key)
    policy = SketchPolicy(task, seed=args.seed, cost_model=XGBModel(seed=args.seed))
    policy.preload(records)
    print(f"model trained on {len(records)} records; population "
          f"{policy.params.evolutionary_search_population}, "
          f"{policy.params.evolutionary_search_num_iters} generations, batch 64")
    measured = db.measured_state_keys(task.workload_key, target_key)
    totals = []
    for i in range(args.rounds):
        policy.search_round(64, measured)
        r = policy.last_round
        totals.append(r["total_s"])
        print(f"round {i}: total {r['total_s']:.2f} s = sample {r['sample_s']:.2f} + features "
              f"{r['features_s']:.2f} + breed (children and their features, in workers) {r['breed_s']:.2f} + "
              f"predict {r['predict_s']:.2f} + evolution {r['evolution_s']:.2f}; "
              f"children {', '.join(f'{k[9:]} {v}' for k, v in r.items() if k.startswith('children_'))}")
    print(f"median {statistics.median(totals):.2f} s over {len(totals)} rounds "
          f"(min {min(totals):.2f}, max {max(totals):.2f})")
    policy.close()


if __name__ == "__main__":
    main()
