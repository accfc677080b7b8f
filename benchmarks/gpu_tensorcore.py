"""Tensor Core GEMM and sgemm against cuBLAS: tune a float16 (and optionally bfloat16) GEMM with
float32 accumulation, and a float32 GEMM, on a CUDA GPU; check each best kernel against torch;
time it in turns with `torch.matmul` (half inputs; float32 with TF32 off) on CUDA events.

    python benchmarks/gpu_tensorcore.py                                  # 4096^3, defaults below
    python benchmarks/gpu_tensorcore.py --trials 300 --minutes 3 --dtypes float16,bfloat16,float32
    python benchmarks/gpu_tensorcore.py --dry-run --size 512             # no GPU: programs only

Prints one line per workload (the ratio is cuBLAS time / ansor time: above 1, ansor is faster)
and, when $OUT (or --out) names a folder, writes the raw figures there as JSON lines. With
--dry-run it builds the tasks, samples GEMM template programs, prints their knobs and, where
nvcc is installed, compiles each for the architecture.
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
from ansor import te


def gemm_task(size: int, dtype: str, arch: str, layout: str = "kn") -> ansor.Task:
    """C = A B at size^3, B stored [K, N] ("kn") or [N, K] ("nk"); 16-bit products summed in float32."""
    A = te.placeholder((size, size), dtype, name="A")
    B = te.placeholder((size, size), dtype, name="B")
    k = te.reduce_axis(size, name="k")
    read_b = (lambda j: B[k, j]) if layout == "kn" else (lambda j: B[j, k])
    acc = {} if dtype == "float32" else {"dtype": "float32"}
    C = te.compute((size, size), lambda i, j: te.sum(A[i, k] * read_b(j), axis=k, **acc), name="C")
    return ansor.Task([A, B, C], target=ansor.Target.cuda(arch=arch))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4096, help="M = N = K")
    ap.add_argument("--dtypes", default="float16,float32", help="comma-separated: float16, bfloat16, float32")
    ap.add_argument("--trials", type=int, default=200, help="programs measured per workload")
    ap.add_argument("--minutes", type=float, default=2.5, help="time budget of each workload's tuning")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--rounds", type=int, default=7, help="timing rounds, in turns with torch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--database", default=None, help="records (default: a temporary file)")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for JSON lines (default $OUT)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: sample and print (and nvcc-compile) programs")
    ap.add_argument("--programs", type=int, default=4, help="programs sampled per workload in --dry-run")
    args = ap.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in args.dtypes if d not in ("float16", "bfloat16", "float32")]
    if unknown:
        ap.error(f"unknown dtype(s) {', '.join(unknown)}: use float16, bfloat16, float32")
    if args.trials < 1 or args.size < 16 or args.size % 16:
        ap.error("--trials must be positive and --size a positive multiple of 16")
    return args


def _write(args, row: dict) -> None:
    print(json.dumps(row), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        with open(Path(args.out) / "gpu_tensorcore.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


def dry_run(args) -> list[dict]:
    """Template programs of each workload as the search samples them (and nvcc's verdict)."""
    from ansor.backend import generate_source
    from ansor.lower.gemm_template import gemm_template_stage, program_of
    from ansor.measure.cuda import nvcc_arch
    from ansor.search.sketch_policy import SketchPolicy

    rows = []
    for dtype in args.dtypes:
        task = gemm_task(args.size, dtype, args.arch)
        programs: dict[str, ansor.State] = {}
        policy = SketchPolicy(task, seed=args.seed)
        for _ in range(8):
            for p in policy.sample(4 * args.programs):
                if gemm_template_stage(p) is not None:
                    programs.setdefault(p.key(), p)
            if len(programs) >= args.programs:
                break
        for state in list(programs.values())[:args.programs]:
            source, _ = generate_source(state, task.target)
            row = {"dtype": dtype, "size": args.size, "program": str(program_of(state, gemm_template_stage(state))),
                   "source_lines": source.count("\n")}
            if shutil.which("nvcc"):
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / "k.cu"
                    path.write_text(source)
                    done = subprocess.run(["nvcc", "-cubin", f"-arch={nvcc_arch(args.arch)}", "-Xptxas", "-v", "-o",
                                           str(path.with_suffix(".cubin")), str(path)], capture_output=True, text=True)
                row["nvcc"] = "ok" if done.returncode == 0 else done.stderr[-400:]
            rows.append(row)
            _write(args, row)
    return rows


def program_text(kernel) -> str:
    """The built kernel's template program in words (its knobs), or what it is instead."""
    from ansor.lower.gemm_template import gemm_template_stage, program_of

    sid = gemm_template_stage(kernel.state) if kernel.state is not None else None
    return str(program_of(kernel.state, sid)) if sid is not None else "not a template program"


def _timed(fn, start, end, number: int) -> float:
    start.record()
    for _ in range(number):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / number * 1e-3


def device_launches(source: str, arch: str, device: dict):
    """A function that launches the program's kernels on `device` arrays (by buffer name),
    built by the tuner's builder (sm_90 as sm_90a) and given their dynamic shared memory."""
    import cupy

    from ansor.measure.cuda import CudaBuilder, kernel_launches, launch_all
    from ansor.measure.gpu_module import GPUModule

    (built,) = CudaBuilder(arch).build([source])
    if built.lib_path is None:
        raise RuntimeError(f"nvcc could not build the program: {built.error_msg}")
    launches = kernel_launches(cupy.RawModule(path=built.lib_path), GPUModule.parse(source), device)
    return lambda: launch_all(launches)


def run_on_gpu(args) -> list[dict]:
    import cupy
    import torch

    from ansor.measure.gpu_module import GPUModule

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    database = args.database or tempfile.mkstemp(suffix=".db")[1]
    rows = []
    for dtype in args.dtypes:
        task = gemm_task(args.size, dtype, args.arch)
        started = time.perf_counter()
        result = ansor.tune(task, trials=args.trials, database=database, seed=args.seed,
                            time_budget=args.minutes * 60)
        tuned_s = time.perf_counter() - started
        kernel = ansor.build(task, database=database)
        module = GPUModule.parse(kernel.source)
        torch_dtype = getattr(torch, dtype)
        gen = torch.Generator(device="cuda").manual_seed(args.seed)
        a = torch.randn(args.size, args.size, device="cuda", generator=gen).to(torch_dtype)
        b = torch.randn(args.size, args.size, device="cuda", generator=gen).to(torch_dtype)
        c = torch.empty(args.size, args.size, device="cuda", dtype=torch.float32)
        bits = (lambda t: t.view(torch.int16)) if dtype != "float32" else (lambda t: t)
        device = {"A": cupy.asarray(bits(a)), "B": cupy.asarray(bits(b)), "C": cupy.asarray(c)}
        temps = {buf.name: cupy.empty(buf.shape, dtype=np.float32 if buf.dtype == "float32" else np.uint16)
                 for buf in module.buffers if buf.name not in device}
        device.update(temps)
        ansor_call = device_launches(kernel.source, args.arch, device)

        ansor_call()
        torch.cuda.synchronize()
        reference = a.float() @ b.float()
        error = float((c - reference).abs().max() / reference.abs().max())
        ok = error < (1e-3 if dtype != "float32" else 1e-5)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        baseline = lambda: torch.matmul(a, b)  # noqa: E731 - cuBLAS, half out for half inputs
        ours, theirs = [], []
        for fn in (ansor_call, baseline):  # warm-up
            _timed(fn, start, end, 3)
        for _ in range(args.rounds):
            ours.append(_timed(ansor_call, start, end, 10))
            theirs.append(_timed(baseline, start, end, 10))
        t_ours, t_theirs = statistics.median(ours), statistics.median(theirs)
        flops = 2.0 * args.size ** 3
        row = {"dtype": dtype, "size": args.size, "device": torch.cuda.get_device_name(),
               "trials": result.trials, "tune_seconds": round(tuned_s, 1), "correct": ok,
               "max_rel_error": error, "ansor_ms": t_ours * 1e3, "cublas_ms": t_theirs * 1e3,
               "ansor_tflops": flops / t_ours / 1e12, "cublas_tflops": flops / t_theirs / 1e12,
               "ratio_vs_cublas": t_theirs / t_ours, "tensor_core_template": ("wgmma" if "wgmma.mma_async" in kernel.source else
                                        "wmma" if "nvcuda::wmma" in kernel.source else None),
               "program": program_text(kernel),
               "ansor_runs_ms": [x * 1e3 for x in ours], "cublas_runs_ms": [x * 1e3 for x in theirs]}
        rows.append(row)
        _write(args, row)
        print(f"{dtype} {args.size}^3: ansor {row['ansor_tflops']:.1f} TFLOP/s, cuBLAS {row['cublas_tflops']:.1f} "
              f"TFLOP/s, ratio {row['ratio_vs_cublas']:.2f}x, correct={ok} ({result.trials} trials, "
              f"{tuned_s:.0f} s)", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    return dry_run(args) if args.dry_run else run_on_gpu(args)


if __name__ == "__main__":
    main()
