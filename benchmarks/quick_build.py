"""Kernels without tuning, against tuned ones: the bars of the pretrained cost model.

For each workload (the suite's shapes, which are never in the pretrained model's corpus):
  1. `ansor.build(task)` on a fresh database: the quick search (model-ranked programs, a few
     measured), with its wall time;
  2. `ansor.tune(task, trials=16)` on another fresh database;
  3. the best program of a database tuned with 300 trials (`--tuned DIR`, one database per
     workload named after its label, e.g. `matmul_512.db`; missing ones are tuned here first,
     which takes a few minutes each);
and the three kernels are timed in turns in this process (medians of several rounds).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/quick_build.py \\
        --tuned tuned300/ --only matmul_512 conv2d_64x56x56_3x3 softmax_1536x128

Also with `--no-pretrained`, the same without the package's model (the database's other
workloads, if any, are all the model knows), to show what the pretrained model adds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time

import ansor
from ansor.baselines import time_in_turns
from ansor.store import open_store
from ansor.tuning.quick import QUICK_TRIALS, quick_search
from ansor.workloads import make_task

from common import SUITE


def slug(label: str) -> str:
    """'conv2d 64x56x56 3x3' -> 'conv2d_64x56x56_3x3'."""
    return re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_")


def checked(kernel, task) -> None:
    problem = kernel.check()
    if problem:
        raise SystemExit(f"{task.name}: the kernel disagrees with numpy: {problem}")


def _count(path: str) -> int:
    """Records in a database file."""
    with open_store(path, create=False)[0] as store:
        return store.count()


def run(label: str, name: str, shape, opts: dict, args) -> dict:
    task = make_task(name, shape, **opts)
    tuned_db = os.path.join(args.tuned, f"{slug(label)}.db")
    if not os.path.exists(tuned_db) or _count(tuned_db) < args.tuned_trials:
        print(f"{label}: tuning {args.tuned_trials} trials into {tuned_db} first")
        ansor.tune(task, trials=args.tuned_trials, database=tuned_db, progress=False, seed=0,
                   transfer_programs=0, pretrained=False)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        if args.no_pretrained:
            with open_store(os.path.join(tmp, "quick.db"))[0] as store:
                quick_search(task, store, QUICK_TRIALS, pretrained=False)
                quick = ansor.build(task, database=store)
        else:
            quick = ansor.build(task, database=os.path.join(tmp, "quick.db"))
        quick_seconds = time.perf_counter() - start
        ansor.tune(task, trials=16, database=os.path.join(tmp, "t16.db"), progress=False, seed=0,
                   pretrained=not args.no_pretrained)
        t16 = ansor.build(task, database=os.path.join(tmp, "t16.db"))
        best = ansor.build(task, database=tuned_db)
        default = ansor.build(task, database=os.path.join(tmp, "none.db"), quick_trials=0)
        for k in (quick, t16, best, default):
            checked(k, task)
        inputs = task.random_inputs(seed=2)
        times = time_in_turns({"quick": quick.prepared(*inputs), "tune16": t16.prepared(*inputs),
                               "tuned300": best.prepared(*inputs), "default": default.prepared(*inputs)},
                              rounds=args.rounds)
    row = {"workload": label, "quick_build_s": quick_seconds,
           **{f"{k}_ms": v.median * 1e3 for k, v in times.items()},
           "quick_vs_300": times["tuned300"].median / times["quick"].median,
           "tune16_vs_300": times["tuned300"].median / times["tune16"].median,
           "default_vs_300": times["tuned300"].median / times["default"].median}
    print(f"{label:34s} build {quick_seconds:5.1f} s | quick {row['quick_ms']:8.3f} ms "
          f"({row['quick_vs_300']:.2f}x of 300) | 16 trials {row['tune16_ms']:8.3f} ms "
          f"({row['tune16_vs_300']:.2f}x) | 300 trials {row['tuned300_ms']:8.3f} ms | "
          f"default {row['default_ms']:8.3f} ms ({row['default_vs_300']:.2f}x)")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tuned", default="tuned300", help="directory of the 300-trial databases")
    parser.add_argument("--tuned-trials", type=int, default=300)
    parser.add_argument("--only", nargs="*", help="workloads by label slug (default: the whole suite)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-pretrained", action="store_true")
    parser.add_argument("--json", help="append the rows here (JSON lines)")
    args = parser.parse_args()
    os.makedirs(args.tuned, exist_ok=True)
    rows = []
    for label, name, shape, opts in SUITE:
        if args.only and slug(label) not in args.only:
            continue
        rows.append(run(label, name, shape, opts, args))
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps({**rows[-1], "pretrained": not args.no_pretrained}) + "\n")
    if rows:
        import statistics

        print(f"geometric mean, quick build vs 300 trials: "
              f"{statistics.geometric_mean(r['quick_vs_300'] for r in rows):.2f}x; 16 trials: "
              f"{statistics.geometric_mean(r['tune16_vs_300'] for r in rows):.2f}x")


if __name__ == "__main__":
    main()
