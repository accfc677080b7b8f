"""Tuning across targets: trials to a good program from scratch and from another target's records.

For each workload, on this machine as it is (target B):
  1. B from scratch (`--trials`, default 300): the reference best;
  2. for each source target A (this machine restricted: AVX2 only, one core): A from scratch
     (`--source-trials`), then B on a copy of A's records with `transfer_from=A`
     (`--transfer-trials`);
and the trials each B job needed to reach 95% of (1)'s best, with the ratio to (1)'s own count
(the transfer issue's bar: at most 0.5x). No job uses the package's pretrained model unless
`--pretrained` (then every job does), so by default what is compared is transfer alone. One
plot per workload (`--plots DIR`) with every B curve. The count of trials to 95% moves a lot
with the scratch job's luck (19 trials in one run, 67 in another): run several seeds.

    python benchmarks/transfer.py --plots benchmarks/results --json transfer.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ansor
from ansor.report import plot_curves
from ansor.workloads import make_task

from common import trials_to_reach

WORKLOADS = {
    "matmul 512": ("matmul", (512, 512, 512), {}),
    "conv2d 64x56x56 3x3": ("conv2d", (1, 64, 56, 56, 64, 3, 3), {"padding": 1}),
    "LayerNorm+GELU 4096x768": ("layer_norm_gelu", (4096, 768), {}),
}
SOURCES = {"AVX2": {"isa": "avx2"}, "1 core": {"num_cores": 1}}


def run_workload(label: str, args, tmp: str) -> dict:
    name, shape, opts = WORKLOADS[label]
    job = {"seed": args.seed, "progress": False, "pretrained": args.pretrained}
    slug = "".join(c if c.isalnum() else "_" for c in label)
    scratch = ansor.tune(make_task(name, shape, **opts), trials=args.trials,
                         database=os.path.join(tmp, f"{slug}_scratch.db"), **job)
    goal = 0.95 * scratch.best_gflops
    n_scratch = trials_to_reach(scratch.curve, goal)
    row = {"workload": label, "scratch_best_gflops": scratch.best_gflops, "scratch_trials_to_95": n_scratch,
           "sources": {}}
    print(f"{label}: from scratch {scratch.best_gflops:.1f} GFLOP/s after {args.trials} trials; "
          f"95% of it after {n_scratch}", flush=True)
    curves = {"from scratch": scratch.curve}
    for source_label in args.sources:
        source = ansor.Target.host(**SOURCES[source_label])
        a_db = os.path.join(tmp, f"{slug}_{source.key}.db")
        a = ansor.tune(make_task(name, shape, target=source, **opts), trials=args.source_trials,
                       database=a_db, **job)
        b_db = os.path.join(tmp, f"{slug}_{source.key}_transfer.db")
        shutil.copy(a_db, b_db)
        b = ansor.tune(make_task(name, shape, **opts), trials=args.transfer_trials, database=b_db,
                       transfer_from=source, **job)
        n = trials_to_reach(b.curve, goal)
        ratio = n / n_scratch if n and n_scratch else None
        row["sources"][source_label] = {"target": source.key, "source_best_gflops": a.best_gflops,
                                        "transfer_best_gflops": b.best_gflops, "trials_to_95": n,
                                        "ratio": ratio, "first_gflops": b.curve[0][1] if b.curve else None,
                                        "curve": b.curve}
        print(f"  from {source_label} ({source.key}: {a.best_gflops:.1f} GFLOP/s there): first program "
              f"{b.curve[0][1]:.1f} GFLOP/s, best {b.best_gflops:.1f}; 95% after "
              f"{n if n is not None else f'more than {args.transfer_trials}'} trials"
              + (f" ({ratio:.2f}x of from scratch)" if ratio is not None else ""), flush=True)
        curves[f"from {source_label} records ({source.key})"] = b.curve
    row["scratch_curve"] = scratch.curve
    if args.plots:
        path = Path(args.plots) / f"transfer_{slug.lower()}.png"
        plot_curves(curves, str(path), f"{label} on {ansor.Target.host().key}")
        print(f"  curves: {path}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--sources", nargs="*", choices=list(SOURCES), default=list(SOURCES))
    parser.add_argument("--trials", type=int, default=300, help="B from scratch (default 300)")
    parser.add_argument("--source-trials", type=int, default=150, help="each source target A (default 150)")
    parser.add_argument("--transfer-trials", type=int, default=100, help="B from A's records (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pretrained", action="store_true", help="every job starts from the shipped model")
    parser.add_argument("--plots", default=None, help="folder for one PNG per workload")
    parser.add_argument("--json", default=None, help="write the rows (with curves) here")
    args = parser.parse_args()
    if ansor.Target.host().isa != "avx512" or ansor.Target.host().num_cores < 2:
        sys.exit("this benchmark restricts an AVX-512 machine with two or more cores; this one is "
                 f"{ansor.Target.host().key}")
    rows = []
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for label in args.only:
            rows.append(run_workload(label, args, tmp))
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
