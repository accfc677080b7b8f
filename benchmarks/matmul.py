"""Tune a float32 matmul and print ansor's GFLOP/s beside numpy's (and PyTorch's), same run.

Run with OpenBLAS at full speed:
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/matmul.py --trials 200
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import numpy as np

import ansor
from ansor.baselines import time_numpy, time_torch, torch_available
from ansor.workloads import WORKLOADS, make_task

from common import git_commit


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shape", default="1024,1024,1024")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--policy", default="sketch.xgb")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--database", default=None, help="default: a fresh temporary database")
    p.add_argument("--curve", default=None, help="save the tuning curve as a PNG here")
    args = p.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    db = args.database or os.path.join(tempfile.mkdtemp(), "bench.db")
    task = make_task("matmul", shape)
    t0 = time.time()
    res = ansor.tune(task, trials=args.trials, database=db, seed=args.seed, policy=args.policy)
    tune_s = time.time() - t0
    kernel = ansor.build(task, database=db)
    a, b = task.random_inputs(seed=1)
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-3, atol=1e-2)
    timings = {"ansor": kernel.time(a, b)}
    np_t = time_numpy(lambda x, y: x @ y, [a, b])
    timings["numpy"] = np_t.median
    if torch_available():
        timings["torch"] = time_torch(WORKLOADS["matmul"].torch_fn, {}, [a, b]).median
    gf = {k: task.flop / v / 1e9 for k, v in timings.items()}
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; commit {git_commit()}; "
          f"date {time.strftime('%Y-%m-%d')}")
    print(f"matmul {shape} float32, policy {args.policy}, {res.trials} trials "
          f"({res.errors} errors) in {tune_s:.0f} s")
    for k in timings:
        print(f"  {k:6s} {timings[k] * 1e3:8.3f} ms  {gf[k]:7.1f} GFLOP/s")
    print(f"  ansor / numpy = {gf['ansor'] / gf['numpy']:.2f}x"
          + (f"   ansor / torch = {gf['ansor'] / gf['torch']:.2f}x" if "torch" in gf else ""))
    if args.curve:
        from ansor.report import plot_curves

        plot_curves({args.policy: res.curve}, args.curve, f"matmul {shape}")
        print(f"curve saved to {args.curve}")


if __name__ == "__main__":
    main()
