"""Compare search policies at the same trial budget on one workload, baselines in the same run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/search_space.py \\
        --workload matmul --shape 1024,1024,1024 --trials 200 --policies basic sketch.random

Prints, per policy, the best GFLOP/s found (re-timed after tuning) and the tuning curve; then
numpy and PyTorch on the same inputs. `--plot FILE.png` draws the curves.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import ansor
from ansor.baselines import time_numpy, time_torch
from ansor.workloads import WORKLOADS, make_task, workload_options

from common import git_commit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="matmul")
    p.add_argument("--shape", default="1024,1024,1024")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--policies", nargs="+", default=["basic", "sketch.random"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None)
    args = p.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    w = WORKLOADS[args.workload]
    print(f"# {args.workload} {shape}, {args.trials} trials per policy; {platform.machine()} "
          f"{os.cpu_count()} cores; commit {git_commit()}; {time.strftime('%Y-%m-%d %H:%M')}")
    curves, rows = {}, []
    inputs = None
    for policy in args.policies:
        task = make_task(args.workload, shape)
        db = os.path.join(tempfile.mkdtemp(), "bench.db")
        t0 = time.time()
        res = ansor.tune(task, trials=args.trials, database=db, seed=args.seed, policy=policy)
        kernel = ansor.build(task, database=db)
        inputs = inputs or task.random_inputs(seed=1)
        assert kernel.check(*inputs) is None
        sec = kernel.time(*inputs)
        rows.append((policy, sec, task.flop, res.errors, time.time() - t0))
        curves[policy] = res.curve
        half = next((t for t, g in res.curve if g >= res.best_gflops * 0.999), None)
        print(f"{policy:14s} best {task.flop / sec / 1e9:7.1f} GFLOP/s ({sec * 1e3:.3f} ms), "
              f"{res.errors} errors, reached its best at trial {half}, tuning {time.time() - t0:.0f} s")
    flop = rows[0][2]
    if w.numpy_fn is not None:
        t = time_numpy(w.numpy_fn, inputs)
        print(f"{'numpy':14s}      {flop / t.median / 1e9:7.1f} GFLOP/s ({t.median * 1e3:.3f} ms, spread {t.spread:.0%})")
    if w.torch_fn is not None:
        t = time_torch(w.torch_fn, workload_options(args.workload, shape), inputs)
        if t is not None:
            print(f"{'torch eager':14s}      {flop / t.median / 1e9:7.1f} GFLOP/s ({t.median * 1e3:.3f} ms, "
                  f"spread {t.spread:.0%})")
    if args.plot:
        from ansor.report import plot_curves

        plot_curves(curves, args.plot, f"{args.workload} {shape}: best GFLOP/s vs trials")
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
