"""Same-run comparison of search-parameter settings of the full tuner (and, optionally, random
sampling of the same space): each variant tunes the workload with the same budget and seed into
its own fresh database, then the variants' best kernels are timed in turns.

    python benchmarks/params_ab.py --only "conv2d 64x56x56 3x3" --trials 300 --random \\
        --variant 'reference={"mutation_weights": {"tile_size": 0.9, "auto_unroll": 0.04,
                   "compute_location": 0.05, "parallel": 0.01}}' --variant default={}

A variant is NAME=JSON (search-parameter overrides, see ansor/search/params.py). Ratios are
against the first variant; `--databases DIR` keeps the records.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import ansor
from ansor.baselines import time_in_turns
from ansor.costmodel.model import XGBModel
from ansor.search.sketch_policy import SketchPolicy
from ansor.workloads import make_task

from common import SUITE, TIMING_ROUNDS, TURN_PAUSE_S, build_checked, git_commit, trials_to_reach


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, overrides = text.partition("=")
    if not name or not overrides:
        raise argparse.ArgumentTypeError(f"a variant is NAME=JSON, got {text!r}")
    return name, json.loads(overrides)


def tune_variant(task, name: str, overrides: dict | None, trials: int, seed: int, db_dir: str):
    """Tune with the full tuner under `overrides` (None: random sampling); the built kernel,
    checked against the reference, and the tuning curve."""
    db = os.path.join(db_dir, f"{task.name}-{name}-seed{seed}.db")
    if overrides is None:
        policy = "sketch.random"
    else:
        policy = SketchPolicy(task, seed, params=overrides, cost_model=XGBModel(seed=seed))
    t0 = time.time()
    res = ansor.tune(task, trials=trials, database=db, seed=seed, policy=policy)
    if not isinstance(policy, str):
        policy.close()
    kernel, inputs = build_checked(task, db, name)
    print(f"  {name}: tuned in {time.time() - t0:.0f} s, best during tuning "
          f"{max((g for _, g in res.curve), default=0.0):.1f} GFLOP/s", flush=True)
    return kernel, inputs, res.curve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", required=True, help="suite labels to run")
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--variant", type=parse_variant, action="append", required=True)
    p.add_argument("--random", action="store_true", help="also tune by random sampling of the same space")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--databases", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    variants = list(args.variant) + ([("random", None)] if args.random else [])
    print(f"# params A/B; {os.cpu_count()} cores; commit {git_commit()}; {time.strftime('%Y-%m-%d %H:%M')}; "
          f"{args.trials} trials, seed {args.seed}; variants {', '.join(n for n, _ in variants)}")
    db_dir = args.databases or tempfile.mkdtemp()
    os.makedirs(db_dir, exist_ok=True)
    rows = []
    for label, name, shape, opts in SUITE:
        if label not in args.only:
            continue
        task = make_task(name, shape, **opts)
        print(label, flush=True)
        built = {v: tune_variant(task, v, o, args.trials, args.seed, db_dir) for v, o in variants}
        timed = time_in_turns({v: k.prepared(*x) for v, (k, x, _) in built.items()},
                              rounds=TIMING_ROUNDS, pause_s=TURN_PAUSE_S)
        first = variants[0][0]
        row = {"label": label, "trials": args.trials, "flop": task.flop,
               "curves": {v: c for v, (_, _, c) in built.items()}}
        for v, _ in variants:
            median, lo, hi = timed[v].median, min(timed[v].runs), max(timed[v].runs)
            best_other = max((g for _, g in built[v][2]), default=0.0)
            reach = trials_to_reach(built[first][2], best_other) if v != first else None
            row[v] = {"median_s": median, "spread_s": [lo, hi], "first_reaches_its_best_at": reach}
            print(f"  {v:>12} {median * 1e3:9.3f} ms ({lo * 1e3:.3f}-{hi * 1e3:.3f}) "
                  f"{task.flop / median / 1e9:7.1f} GF/s; {first} over it {median / timed[first].median:.2f}x"
                  + (f"; {first} reached its best during tuning at trial {reach}" if v != first else ""),
                  flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
