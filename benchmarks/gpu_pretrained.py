"""What the pretrained CUDA cost model saves on a workload it has not seen, on a lent GPU.

Two tuning jobs of one workload, each from a fresh database with the same seed: one with the
cost model starting empty (`pretrained=False`), one starting from the package's pretrained CUDA
model (`costmodel/pretrained/cuda.model.json`, trained on 4096^3 GEMMs only). The bar: the
pretrained job reaches 90% of the scratch job's best (in GFLOP/s) in at most half the trials the
scratch job needed. Prints both counts and their ratio; writes the row with both curves as JSON
lines to $OUT (or --out), and a plot of the curves beside it.

    python benchmarks/gpu_pretrained.py --workload conv2d_bias_relu_256x14x14_3x3 --trials 300 --time-budget 110
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import ansor
from ansor.report import plot_curves
from ansor.workloads import make_task

from common import trials_to_reach
from gpu import WORKLOADS

SHARE = 0.9  # of the scratch job's best


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="conv2d_bias_relu_256x14x14_3x3", choices=sorted(WORKLOADS))
    ap.add_argument("--trials", type=int, default=300, help="trials of each job")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds of each job at most")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for the JSON line and the plot")
    args = ap.parse_args(argv)
    if args.trials < 1:
        ap.error("--trials must be at least 1")
    name, shape = WORKLOADS[args.workload]
    target = ansor.Target.cuda(args.arch)
    tmp = tempfile.mkdtemp()
    jobs = {}
    for pretrained in (False, True):
        label = "pretrained" if pretrained else "scratch"
        jobs[label] = ansor.tune(make_task(name, shape, target=target), trials=args.trials,
                                 time_budget=args.time_budget, database=str(Path(tmp) / f"{label}.db"),
                                 seed=args.seed, pretrained=pretrained, progress=False)
        print(f"{label}: best {jobs[label].best_gflops:.1f} GFLOP/s after {jobs[label].trials} trials", flush=True)
    goal = SHARE * jobs["scratch"].best_gflops
    counts = {label: trials_to_reach(job.curve, goal) for label, job in jobs.items()}
    ratio = counts["pretrained"] / counts["scratch"] if counts["pretrained"] and counts["scratch"] else None
    row = {"workload": args.workload, "arch": args.arch, "seed": args.seed, "goal_gflops": goal,
           **{f"{label}_trials": job.trials for label, job in jobs.items()},
           **{f"{label}_best_gflops": job.best_gflops for label, job in jobs.items()},
           **{f"{label}_trials_to_90": n for label, n in counts.items()}, "ratio": ratio,
           "curves": {label: job.curve for label, job in jobs.items()}}
    print(f"90% of the scratch best ({goal:.1f} GFLOP/s): scratch after {counts['scratch']} trials, "
          f"pretrained after {counts['pretrained']}" + (f" ({ratio:.2f}x)" if ratio is not None else ""))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with open(Path(args.out) / "gpu_pretrained.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        plot_curves({label: job.curve for label, job in jobs.items()},
                    str(Path(args.out) / f"gpu_pretrained_{args.workload}.png"), f"{args.workload} on {target.key}")
    return row


if __name__ == "__main__":
    main()
