"""GPU kernels against the vendor libraries: tune each workload for a GPU target, then time the
best kernel and PyTorch's (cuBLAS/cuDNN on CUDA) in turns, on the device's own clock.

    python benchmarks/gpu.py --target cuda --arch sm_90 --trials 500          # on an NVIDIA GPU
    python benchmarks/gpu.py --only matmul_4096 --trials 1000 --time-budget 600 --compile
    python benchmarks/gpu.py --target opencl --trials 16 --only matmul_256     # PoCL: checks only

Kernel times are the device's (CUDA events / OpenCL profiling events, the kernels alone),
medians of several rounds taken in turns with the baseline. On PoCL (OpenCL on this CPU) the
numbers say nothing about a GPU: that run only shows the script works end to end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import ansor
from ansor.measure import TimingPolicy
from ansor.workloads import make_task

# label -> (workload, shape): the families, at sizes a GPU is busy with
WORKLOADS = {
    "matmul_256": ("matmul", (256, 256, 256)),
    "matmul_1024": ("matmul", (1024, 1024, 1024)),
    "matmul_4096": ("matmul", (4096, 4096, 4096)),
    "conv2d_64x56x56_3x3": ("conv2d", (1, 64, 56, 56, 64, 3, 3)),
    "conv2d_bias_relu_256x14x14_3x3": ("conv2d_bias_relu", (1, 256, 14, 14, 256, 3, 3)),
    "layer_norm_gelu_4096x768": ("layer_norm_gelu", (4096, 768)),
    "batch_matmul_12x128x128x64": ("batch_matmul", (12, 128, 128, 64)),
}


def target_of(args) -> ansor.Target:
    return ansor.Target.cuda(args.arch) if args.target == "cuda" else ansor.Target.opencl(args.device)


def torch_baselines(name: str, inputs: list[np.ndarray], compiled: bool) -> dict[str, object]:
    """The workload's PyTorch form on the CUDA device, eager and (with `compiled`) through
    torch.compile, whose kernels are Triton's; {} without torch.cuda. Matrix products run in
    full FP32 (TF32 off): the generated kernels do FP32 arithmetic too."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    from ansor.workloads import WORKLOADS as NAMED

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    w = NAMED[name]
    if w.torch_fn is None:
        return {}
    xs = [torch.from_numpy(x).cuda() for x in inputs]
    opts = {**w.options}
    fns: dict[str, object] = {"torch": lambda: w.torch_fn(opts, *xs)}
    if compiled:
        compiled_fn = torch.compile(lambda *a: w.torch_fn(opts, *a))
        fns["torch.compile"] = lambda: compiled_fn(*xs)
    for fn in fns.values():
        fn()  # warm up (and compile)
    torch.cuda.synchronize()
    return fns


def torch_device_time(fn, calls: int = 10) -> float:
    """Seconds per call of `fn` on the device's clock (CUDA events around `calls` calls)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=["cuda", "opencl"], default="cuda")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--device", default="pocl-cpu")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--time-budget", type=float, default=None, help="seconds of tuning per workload at most")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--min-repeat-ms", type=float, default=20.0,
                   help="each timed repeat of a program lasts this long at least (device clock: short is precise)")
    p.add_argument("--only", nargs="*", choices=sorted(WORKLOADS))
    p.add_argument("--compile", action="store_true", help="also time torch.compile (Triton kernels)")
    p.add_argument("--database", default=None, help="records (default: a fresh temporary file)")
    p.add_argument("--json", default=None, help="append one JSON line per workload here")
    args = p.parse_args(argv)
    target = target_of(args)
    db = args.database or str(Path(tempfile.mkdtemp()) / "gpu.db")
    print(f"target {target.key}; records: {db}", flush=True)
    for label in args.only or WORKLOADS:
        name, shape = WORKLOADS[label]
        task = make_task(name, shape, target=target)
        start = time.perf_counter()
        result = ansor.tune(task, trials=args.trials, database=db, time_budget=args.time_budget,
                            timing=TimingPolicy(min_repeat_ms=args.min_repeat_ms))
        tune_seconds = time.perf_counter() - start
        kernel = ansor.build(task, database=db)
        inputs = task.random_inputs(seed=1)
        problem = kernel.check(*inputs)
        if problem:
            print(f"{label}: the best kernel disagrees with the reference: {problem}", file=sys.stderr)
            return 1
        baselines = torch_baselines(name, inputs, args.compile)
        times: dict[str, list[float]] = {"ansor": [], **{b: [] for b in baselines}}
        for _ in range(args.rounds):  # in turns: a busy moment of the device falls on all
            times["ansor"].append(kernel.time(*inputs))
            for b, fn in baselines.items():
                times[b].append(torch_device_time(fn))
        medians = {k: statistics.median(v) for k, v in times.items()}
        line = (f"{label}: {task.flop / 1e9:.3f} GFLOP, {result.trials} trials ({result.errors} failed) in "
                f"{tune_seconds:.0f} s (search {result.search_seconds:.0f}, measure {result.measure_seconds:.0f}, "
                f"model {result.model_seconds:.0f}); ansor {medians['ansor'] * 1e3:.3f} ms "
                f"({task.flop / medians['ansor'] / 1e9:.0f} GFLOP/s)")
        for b in baselines:
            line += f"; {b} {medians[b] * 1e3:.3f} ms (ansor/{b} speed {medians[b] / medians['ansor']:.2f}x)"
        print(line, flush=True)
        if args.json:
            row = {"label": label, "target": target.key, "gflop": task.flop / 1e9, "tune_seconds": tune_seconds,
                   "trials": result.trials, "errors": dict(result.error_counts), "curve": result.curve,
                   "time_budget": args.time_budget, "ms": {k: v * 1e3 for k, v in medians.items()},
                   "ms_all": {k: [x * 1e3 for x in v] for k, v in times.items()}, "source": kernel.source}
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
