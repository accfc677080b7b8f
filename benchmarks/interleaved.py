"""Thread pools side by side: ansor's OpenMP kernels, numpy's OpenBLAS and PyTorch, interleaved.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/interleaved.py [DATABASE]

A compiled model whose fallback subgraphs run numpy, or a torch.compile'd model with graph
breaks, calls one runtime right after another. Each runtime's idle workers spin for a while
after their work before they sleep (libgomp: GOMP_SPINCOUNT; OpenBLAS: its thread timeout), and
on a machine with few cores the spinning workers of one runtime take the cores the next one
needs. This script times a 512^3 ansor matmul kernel, numpy's matmul and PyTorch's matmul in
blocks (one implementation many times) and interleaved (one call of each in turn), in fresh
processes under different settings, so the cost and the fix are measured, not guessed. The
kernel is the best of DATABASE (default interleaved.db; a quick search records one if none).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time
import numpy as np
import ansor
from ansor import te
use_torch = sys.argv[1] == "1"
limit_blas = sys.argv[2] == "1"
n = 512
A = te.placeholder((n, n), "float32", name="A")
B = te.placeholder((n, n), "float32", name="B")
k = te.reduce_axis((0, n), name="k")
C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
task = ansor.Task([A, B, C], name="mm512")
kernel = ansor.build(task, database=sys.argv[3])
a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
b = np.random.default_rng(1).standard_normal((n, n)).astype(np.float32)
call = kernel.prepared(a, b)
fns = {"ansor": call, "numpy": lambda: a @ b}
if use_torch:
    import torch
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    fns["torch"] = lambda: ta @ tb
if limit_blas:
    from ansor.graph.threads import single_threaded_blas
    ctx = single_threaded_blas()
    ctx.__enter__()
def block(fn, reps=20):
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps
def interleaved(reps=20):
    out = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t)
    return {name: statistics.median(v) for name, v in out.items()}
rows = {"block": {}, "interleaved": {}}
for _ in range(5):
    for name, fn in fns.items():
        rows["block"].setdefault(name, []).append(block(fn))
    for name, t in interleaved().items():
        rows["interleaved"].setdefault(name, []).append(t)
print(json.dumps({mode: {name: statistics.median(v) for name, v in r.items()} for mode, r in rows.items()}))
"""


def run(env_extra: dict, use_torch: bool, limit_blas: bool, database: str) -> dict:
    env = dict(os.environ, **env_extra)
    out = subprocess.run([sys.executable, "-c", CHILD, "1" if use_torch else "0", "1" if limit_blas else "0",
                          database], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("database", nargs="?", default="interleaved.db",
                        help="records of the 512^3 matmul (default interleaved.db)")
    database = parser.parse_args().database
    settings = [
        ("defaults", {}, False),
        ("GOMP_SPINCOUNT=10000", {"GOMP_SPINCOUNT": "10000"}, False),
        ("OMP_WAIT_POLICY=passive", {"OMP_WAIT_POLICY": "passive"}, False),
        ("OpenBLAS one thread", {}, True),
        ("OpenBLAS one thread + GOMP_SPINCOUNT=10000", {"GOMP_SPINCOUNT": "10000"}, True),
    ]
    print(f"512^3 matmul, median ms over 5 rounds of 20 calls (machine: {os.cpu_count()} cores)")
    for label, env, limit in settings:
        r = run(env, use_torch=True, limit_blas=limit, database=database)
        cells = "  ".join(f"{name} {r['block'][name] * 1e3:6.2f} -> {r['interleaved'][name] * 1e3:6.2f}"
                          for name in r["block"])
        print(f"{label:45s} block -> interleaved:  {cells}", flush=True)


if __name__ == "__main__":
    main()
