"""A whole model on CUDA against PyTorch: ResNet-18 (fp32 or fp16, batch 1) built by ansor for a CUDA
GPU (`ansor.build(graph, target=Target.cuda(...))`: every subgraph a kernel, one C driver),
checked against torch eager, and timed in turns with torch eager and `torch.compile` (inductor)
on CUDA events.

    python benchmarks/gpu_model.py --trials 2000 --database resnet18_cuda.db   # tune, then time
    python benchmarks/gpu_model.py --dtype float16 --time-budget 180 --database r18_half.db
    python benchmarks/gpu_model.py --trials 0 --database resnet18_cuda.db      # time what is tuned
    python benchmarks/gpu_model.py --dry-run                                   # no GPU: build only

Prints one line per contender (median milliseconds per call; ratio = contender time / ansor
time: above 1, ansor is faster) and, when $OUT (or --out) names a folder, writes the figures as
JSON lines (gpu_model.jsonl). With --dry-run it builds the CUDA model from the database's records
(default schedules for the rest), prints its summary and, where nvcc is installed, compiles its
source for the architecture.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import ansor
from ansor.measure.cuda import nvcc_arch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet18", help="resnet18 (ansor.pretrain.models), or tiny (conv+relu+linear)")
    ap.add_argument("--trials", type=int, default=0, help="tuning trials for the whole model first (0: none)")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds of tuning first, as ansor.tune(graph, time_budget=...) (with --trials: both bound it)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16"),
                    help="the model's weights and activations (float16: sums accumulate in float32)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--rounds", type=int, default=7, help="timing rounds, in turns with torch")
    ap.add_argument("--number", type=int, default=20, help="calls per timing round")
    ap.add_argument("--database", default=None, help="records (default: a temporary file)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for JSON lines (default $OUT)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: build the CUDA model and nvcc-compile it")
    ap.add_argument("--no-inductor", action="store_true", help="time torch eager only (torch.compile takes a minute)")
    args = ap.parse_args(argv)
    if args.model not in ("resnet18", "tiny"):
        ap.error(f"unknown model {args.model!r}: use resnet18 or tiny")
    if args.trials < 0 or args.rounds < 1 or args.number < 1 or (args.time_budget is not None and args.time_budget <= 0):
        ap.error("--trials must be at least 0, --time-budget above 0, --rounds and --number at least 1")
    return args


def make_model(name: str, dtype: str = "float32"):
    """(torch module in eval mode, example input) in `dtype`, seeded."""
    import torch

    if name == "resnet18":
        from ansor.pretrain.models import make_model as reference_model

        module, inputs = reference_model("resnet18")
        x = inputs[0]
    else:
        torch.manual_seed(0)
        module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                     torch.nn.Linear(8 * 8 * 8, 10))
        x = torch.randn(1, 3, 8, 8)
    torch_dtype = getattr(torch, dtype)
    return module.eval().to(torch_dtype), x.to(torch_dtype)


def _write(args, row: dict) -> None:
    print(json.dumps(row))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with open(Path(args.out) / "gpu_model.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


def build(args, graph) -> ansor.graph.cuda_model.CudaModel:
    target = ansor.Target.cuda(arch=args.arch)
    if args.trials > 0 or args.time_budget is not None:
        start = time.perf_counter()
        ansor.tune(graph, trials=args.trials or None, time_budget=args.time_budget, database=args.database,
                   target=target)
        args.tune_seconds = round(time.perf_counter() - start, 1)
    return ansor.build(graph, database=args.database, target=target, verbose=True)


def dry_run(args) -> list[dict]:
    from ansor.graph import from_torch

    module, x = make_model(args.model, args.dtype)
    model = build(args, from_torch(module, (x,)))
    print(model.summary())
    row = {"model": args.model, "dtype": args.dtype, "arch": args.arch, "launches": len(model.launches),
           "tasks": len(model.kernels), "tuned": sum(1 for k in model.kernels.values() if k.record is not None),
           "device_bytes": sum(model.buffer_bytes), "nvcc": None}
    if shutil.which("nvcc"):
        with tempfile.TemporaryDirectory() as tmp:
            cu = Path(tmp) / "model.cu"
            cu.write_text(model.source)
            start = time.perf_counter()
            done = subprocess.run(["nvcc", f"-arch={nvcc_arch(args.arch)}", "-O3", "--shared", "-Xcompiler", "-fPIC",
                                   "-o", str(Path(tmp) / "model.so"), str(cu), "-lcudart"],
                                  capture_output=True, text=True)
            row["nvcc"] = "ok" if done.returncode == 0 else done.stderr[-500:]
            row["nvcc_seconds"] = round(time.perf_counter() - start, 1)
    _write(args, row)
    return [row]


def _timed(fn, start, end, number: int) -> float:
    """Milliseconds per call of `number` calls between two CUDA events."""
    fn()
    start.record()
    for _ in range(number):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / number


def run_on_gpu(args) -> list[dict]:
    import torch

    from ansor.graph import from_torch

    module, x = make_model(args.model, args.dtype)
    model = build(args, from_torch(module, (x,)))
    print(model.summary())
    got = model(x.numpy()).astype(np.float32)  # compiled by nvcc, loaded, input uploaded
    cuda_module, cuda_x = module.cuda(), x.cuda()
    with torch.no_grad():
        want = cuda_module(cuda_x).float().cpu().numpy()
        compiled = None if args.no_inductor else torch.compile(cuda_module)
        if compiled is not None:
            compiled(cuda_x)
    error = float(np.max(np.abs(got - want)) / max(1e-12, float(np.max(np.abs(want)))))
    tolerance = 1e-3 if args.dtype == "float32" else 2e-2  # float16: a few units of its rounding
    correct = bool(np.allclose(got, want, rtol=tolerance, atol=tolerance * float(np.max(np.abs(want)))))
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    contenders = {"ansor": model.launch, "torch_eager": lambda: cuda_module(cuda_x)}
    if compiled is not None:
        contenders["torch_compile"] = lambda: compiled(cuda_x)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    with torch.no_grad():
        for _ in range(args.rounds):          # in turns: every contender once per round
            for name, fn in contenders.items():
                times[name].append(_timed(fn, start, end, args.number))
    ms = {name: statistics.median(t) for name, t in times.items()}
    rows = []
    for name, value in ms.items():
        row = {"model": args.model, "dtype": args.dtype, "arch": args.arch, "device": torch.cuda.get_device_name(),
               "contender": name, "ms": round(value, 4), "ratio_vs_ansor": round(value / ms["ansor"], 3),
               "ansor_correct": correct, "ansor_max_rel_error": error, "trials": args.trials,
               "time_budget": args.time_budget, "tune_seconds": getattr(args, "tune_seconds", 0.0),
               "tuned_tasks": sum(1 for k in model.kernels.values() if k.record is not None),
               "tasks": len(model.kernels)}
        _write(args, row)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.database is None:
        args.database = str(Path(tempfile.mkdtemp()) / "gpu_model.db")
    return dry_run(args) if args.dry_run else run_on_gpu(args)


if __name__ == "__main__":
    main()
    sys.exit(0)
