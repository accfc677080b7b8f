"""Hopper wgmma GEMM programs with chosen knobs, checked and timed against cuBLAS on a GPU.

A quick look before (or instead of) a search: every program is built as the tuner builds it,
run on random inputs and compared with `a.float() @ b.float()` (TF32 off), then timed in
turns with `torch.matmul` on the same half (or bfloat16) tensors, with CUDA events.

    python benchmarks/gpu_wgmma.py                       # 4096^3, float16 and bfloat16, B as [K, N] and [N, K]
    python benchmarks/gpu_wgmma.py --size 1024 --dtypes float16 --layouts kn

Prints one line per program and writes JSON lines to $OUT (or --out) as gpu_wgmma.jsonl. A
program that computes a wrong answer is reported and not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import ansor
from ansor.backend import generate_source
from ansor.lower.gemm_template import GemmKnobs, gemm_template_stage, program_of
from ansor.schedule.state import State
from ansor.search.sketch_gemm import template_program

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_tensorcore import _timed, device_launches, gemm_task  # noqa: E402

#: (warpgroups m, n, rows, columns, stages, batches in flight, grouped rows): large tiles first
KNOBS = [
    (2, 1, 64, 256, 4, 1, 8),
    (2, 1, 64, 256, 3, 0, 8),
    (1, 2, 128, 128, 4, 1, 8),
    (2, 1, 128, 128, 4, 1, 8),
    (2, 1, 128, 128, 3, 0, 0),
    (1, 1, 64, 256, 4, 1, 8),
    (1, 1, 128, 128, 5, 1, 16),
    (2, 1, 64, 128, 6, 1, 8),
    (1, 1, 64, 64, 4, 0, 0),
]


def program(task: ansor.Task, knobs: GemmKnobs) -> State:
    state = template_program(task, knobs)
    program_of(state, gemm_template_stage(state))  # refuses knobs the sizes do not allow, by name
    return state


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--layouts", default="kn,nk", help="B stored as [K, N] (kn) and/or [N, K] (nk)")
    ap.add_argument("--programs", type=int, default=len(KNOBS), help="the first N of the chosen knobs")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args(argv)
    import cupy
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows = []
    for dtype in args.dtypes.split(","):
        for layout in args.layouts.split(","):
            task = gemm_task(args.size, dtype, "sm_90", layout)
            gen = torch.Generator(device="cuda").manual_seed(0)
            tdtype = getattr(torch, dtype)
            a = torch.randn(args.size, args.size, device="cuda", generator=gen).to(tdtype)
            b = torch.randn(args.size, args.size, device="cuda", generator=gen).to(tdtype)
            c = torch.empty(args.size, args.size, device="cuda", dtype=torch.float32)
            reference = a.float() @ (b.float() if layout == "kn" else b.float().T)
            device = {"A": cupy.asarray(a.view(torch.int16)), "B": cupy.asarray(b.view(torch.int16)),
                      "C": cupy.asarray(c)}
            baseline = (lambda: torch.matmul(a, b)) if layout == "kn" else (lambda: torch.matmul(a, b.T))
            for wm, wn, tm, tn, stages, flight, group in KNOBS[:args.programs]:
                knobs = GemmKnobs(wm, wn, tm, tn, 64, stages, 0, 8, 0, 0, 1, flight, group)
                row = {"dtype": dtype, "layout": layout, "size": args.size, "device": torch.cuda.get_device_name()}
                try:
                    state = program(task, knobs)
                    row["program"] = str(program_of(state, gemm_template_stage(state)))
                    t0 = time.perf_counter()
                    source, _ = generate_source(state, task.target)
                    call = device_launches(source, "sm_90", device)
                    row["build_s"] = round(time.perf_counter() - t0, 2)
                    c.fill_(float("nan"))
                    call()
                    torch.cuda.synchronize()
                    error = float(((c - reference).norm() / reference.norm()).item())
                    row["rel_error"] = error
                    row["correct"] = bool(error < 1e-4)
                    if row["correct"]:
                        for fn in (call, baseline):
                            _timed(fn, start, end, 3)
                        ours, theirs = [], []
                        for _ in range(args.rounds):
                            ours.append(_timed(call, start, end, 10))
                            theirs.append(_timed(baseline, start, end, 10))
                        t_ours, t_theirs = statistics.median(ours), statistics.median(theirs)
                        flops = 2.0 * args.size ** 3
                        row.update(ansor_ms=t_ours * 1e3, cublas_ms=t_theirs * 1e3,
                                   ansor_tflops=flops / t_ours / 1e12, cublas_tflops=flops / t_theirs / 1e12,
                                   ratio_vs_cublas=t_theirs / t_ours)
                except Exception as err:  # noqa: BLE001 - one program's failure is a row, not the end
                    row["error"] = f"{type(err).__name__}: {str(err)[:400]}"
                rows.append(row)
                line = (f"{dtype} {layout} {row.get('program', knobs)}: "
                        + (f"ERROR {row['error']}" if "error" in row else
                           f"rel. error {row['rel_error']:.1e}" + (
                               f", {row['ansor_tflops']:.0f} TFLOP/s against cuBLAS {row['cublas_tflops']:.0f}: "
                               f"{row['ratio_vs_cublas']:.2f}x" if row["correct"] else " WRONG")))
                print(line, flush=True)
                if args.out:
                    Path(args.out).mkdir(parents=True, exist_ok=True)
                    with open(Path(args.out) / "gpu_wgmma.jsonl", "a") as f:
                        f.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    main()
