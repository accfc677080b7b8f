"""GPU kernels against the vendor libraries: tune each workload for a GPU target, then time the
best kernel and PyTorch's (cuBLAS/cuDNN on CUDA) in turns, on the device's own clock.

    python benchmarks/gpu.py --target cuda --arch sm_90 --trials 500          # on an NVIDIA GPU
    python benchmarks/gpu.py --target opencl --trials 16 --only matmul_256     # PoCL: checks only

Kernel times are the device's (CUDA events / OpenCL profiling events, the kernels alone),
medians of several rounds taken in turns with the baseline. On PoCL (OpenCL on this CPU) the
numbers say nothing about a GPU: that run only shows the script works end to end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

import ansor
from ansor.measure import check_outputs
from ansor.workloads import make_task

# label -> (workload, shape): the families, at sizes a GPU is busy with
WORKLOADS = {
    "matmul_256": ("matmul", (256, 256, 256)),
    "matmul_1024": ("matmul", (1024, 1024, 1024)),
    "conv2d_64x56x56_3x3": ("conv2d", (1, 64, 56, 56, 64, 3, 3)),
    "conv2d_bias_relu_256x14x14_3x3": ("conv2d_bias_relu", (1, 256, 14, 14, 256, 3, 3)),
    "layer_norm_gelu_4096x768": ("layer_norm_gelu", (4096, 768)),
    "batch_matmul_12x128x128x64": ("batch_matmul", (12, 128, 128, 64)),
}


def target_of(args) -> ansor.Target:
    return ansor.Target.cuda(args.arch) if args.target == "cuda" else ansor.Target.opencl(args.device)


def torch_device_time(name: str, inputs: list[np.ndarray], rounds: int) -> list[float] | None:
    """Seconds per call of the workload's PyTorch form on the CUDA device (events), or None
    without torch.cuda."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from ansor.workloads import WORKLOADS as NAMED

    w = NAMED[name]
    if w.torch_fn is None:
        return None
    xs = [torch.from_numpy(x).cuda() for x in inputs]
    opts = {**w.options}
    fn = (lambda: w.torch_fn(opts, *xs))
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / 1e3 / 10)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=["cuda", "opencl"], default="cuda")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--device", default="pocl-cpu")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--only", nargs="*", choices=sorted(WORKLOADS))
    p.add_argument("--database", default=None, help="records (default: a fresh temporary file)")
    args = p.parse_args(argv)
    target = target_of(args)
    db = args.database or str(Path(tempfile.mkdtemp()) / "gpu.db")
    print(f"target {target.key}; records: {db}")
    print(f"{'workload':34} {'GFLOP':>7} {'ansor ms':>9} {'torch ms':>9} {'ansor/torch':>11}")
    for label in args.only or WORKLOADS:
        name, shape = WORKLOADS[label]
        task = make_task(name, shape, target=target)
        ansor.tune(task, trials=args.trials, database=db, progress=False)
        kernel = ansor.build(task, database=db)
        inputs = task.random_inputs(seed=1)
        out = kernel(*inputs)
        problem = check_outputs([out] if not isinstance(out, tuple) else list(out), task.reference_outputs(inputs))
        if problem:
            print(f"{label}: the best kernel disagrees with the reference: {problem}", file=sys.stderr)
            return 1
        ansor_times, torch_times = [], []
        for _ in range(args.rounds):  # in turns: a busy moment of the device falls on both
            ansor_times.append(kernel.time(*inputs))
            baseline = torch_device_time(name, inputs, 1)
            if baseline:
                torch_times += baseline
        a = statistics.median(ansor_times)
        t = statistics.median(torch_times) if torch_times else float("nan")
        print(f"{label:34} {task.flop / 1e9:7.3f} {a * 1e3:9.3f} {t * 1e3:9.3f} {t / a:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
