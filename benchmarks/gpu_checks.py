"""GPU programs checked without a GPU, over the whole suite: for each workload of
`benchmarks/suite.py` and each of its GPU sketches, `--per-sketch` randomly annotated programs

  1. printed as CUDA for `Target.cuda(arch)` and compiled by nvcc (`-cubin -Xptxas -v`) as the
     tuner builds them (a program that spilled is printed again with shorter unrolled nests):
     build errors and register spills counted, and how many programs needed that second print;
  2. printed as OpenCL and run on PoCL at the suite's shape, checked against numpy in the
     isolated worker (the tuner's own runner): wrong answers and errors counted; with
     `--cuda-run` (on a machine with an NVIDIA GPU and CuPy) the CUDA builds run there too;
  3. a few per sketch, at a small shape of the same workload, run under Oclgrind: any report
     (data race, barrier divergence, out-of-bounds access) counted.

    python benchmarks/gpu_checks.py --per-sketch 32
    python benchmarks/gpu_checks.py --only softmax norm2 --per-sketch 8 --no-pocl
    python benchmarks/gpu_checks.py --per-sketch 8 --cuda-run --no-pocl --oclgrind 0 --jobs 16   # on a GPU

A program the GPU verifier refuses (over the target's limits) is counted apart: the search
never measures those. Exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import ansor
from ansor.backend import build_programs, generate_source
from ansor.lower.gpu import GPUScheduleError
from ansor.measure import MeasureErrorNo, TimingPolicy
from ansor.measure.check import task_rtol
from ansor.search.annotate_gpu import annotate_gpu
from ansor.search.sketch_policy import SketchPolicy
from ansor.workloads import make_task

from common import SUITE

CHECK_ONLY = TimingPolicy(warmup=0, repeat=1, min_repeat_ms=0.0, max_seconds=0.0)  # one timed call


def small_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The same workload at a size Oclgrind simulates in seconds."""
    if name in ("conv2d", "conv2d_bias_relu", "conv2d_transpose"):
        n, c, h, w, o, kh, kw = shape
        return (1, min(c, 4), min(h, 8 if kh < 7 else 12), min(w, 8 if kw < 7 else 12), min(o, 8), kh, kw)
    if name == "depthwise_conv2d":
        return (1, 4, 8, 8, shape[4], shape[5])
    if name == "batch_matmul":
        return (2, 16, 16, 16)
    return tuple(min(d, 48) for d in shape)


def programs(task: ansor.Task, per_sketch: int, seed: int) -> list[tuple[int, ansor.State]]:
    policy = SketchPolicy(task, seed=seed)
    rng = random.Random(seed)
    out = []
    for k, sketch in enumerate(policy.sketches):
        made, tries = 0, 0
        while made < per_sketch and tries < per_sketch * 20:
            tries += 1
            p = annotate_gpu(sketch.steps, task.dag, rng, policy.params, policy.hardware)
            if p is not None:
                out.append((k, p))
                made += 1
    return out


def accepted(programs_: list, target: ansor.Target) -> tuple[list[ansor.State], list[tuple[str, str]], int]:
    """The programs the target's verifier accepts, their (source, entry) as first printed, and
    how many it refused."""
    states, sources, refused = [], [], 0
    for _, p in programs_:
        try:
            sources.append(generate_source(p, target))
            states.append(p)
        except GPUScheduleError:
            refused += 1
    return states, sources, refused


def sources_for(programs_: list, target: ansor.Target) -> tuple[list[tuple[str, str]], int]:
    """(source, entry) of each program the target's verifier accepts, and how many it refused."""
    _, sources, refused = accepted(programs_, target)
    return sources, refused


def oclgrind_ready() -> bool:
    from ansor.measure.oclgrind import oclgrind_available
    return oclgrind_available()


def run_checked(runner, task: ansor.Task, built: list, sources: list, counts: dict, messages: list) -> None:
    """Run each built program in the runner's isolated worker on the task's inputs, checked
    against numpy; counts correct ("ok"), wrong answers and errors."""
    inputs = task.random_inputs(seed=1)
    runner.set_task(inputs, task.reference_outputs(inputs))
    for res, (_, entry) in zip(built, sources):
        run = runner.run(res.lib_path, entry) if res.lib_path else None
        if run is not None and run.error_no == MeasureErrorNo.NO_ERROR:
            counts["ok"] += 1
        elif run is not None and run.error_no == MeasureErrorNo.WRONG_ANSWER:
            counts["wrong"] += 1
            messages.append(run.error_msg[:200])
        elif run is not None or "spill" not in res.error_msg:  # spills are counted by the build
            counts["err"] += 1
            messages.append((run.error_msg if run else res.error_msg)[:300])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-sketch", type=int, default=32)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--oclgrind", type=int, default=2, help="programs per sketch run under Oclgrind")
    ap.add_argument("--no-pocl", action="store_true")
    ap.add_argument("--no-nvcc", action="store_true")
    ap.add_argument("--cuda-run", action="store_true",
                    help="also run each program nvcc built on the CUDA GPU (CuPy), checked against numpy")
    ap.add_argument("--jobs", type=int, default=2, help="programs compiled at a time")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    failed = False
    print(f"{'workload':32} {'sketch':>6} {'progs':>5} {'refused':>7} | {'nvcc ok':>7} {'reprint':>7} "
          f"{'spill':>5} {'error':>5} | "
          f"{'run ok':>7} {'wrong':>5} {'error':>5} | {'grind ok':>8} {'report':>6} | {'s':>5}")
    for label, name, shape, opts in SUITE:
        if args.only and name not in args.only and label not in args.only:
            continue
        start = time.perf_counter()
        cuda_task = make_task(name, shape, target=ansor.Target.cuda(args.arch), **opts)
        cl_task = make_task(name, shape, target=ansor.Target.opencl(), **opts)
        small_task = make_task(name, small_shape(name, shape), target=ansor.Target.opencl(), **opts)
        drawn = programs(cl_task, args.per_sketch, args.seed)
        small = programs(small_task, args.oclgrind, args.seed)
        counts = {"nvcc_ok": 0, "spill": 0, "nvcc_err": 0, "ok": 0, "wrong": 0, "err": 0, "grind_ok": 0,
                  "report": 0, "reprinted": 0}
        messages: list[str] = []
        cu_states, cu_sources, refused = accepted(drawn, cuda_task.target)
        cu_built = []
        if not args.no_nvcc:
            from ansor.measure.cuda import CudaBuilder
            cu_programs = build_programs(cu_states, cuda_task.target,
                                         builder=CudaBuilder(args.arch, n_parallel=args.jobs))
            counts["reprinted"] = sum(1 for p, (first, _) in zip(cu_programs, cu_sources) if p.source != first)
            cu_sources = [(p.source, p.entry) for p in cu_programs]
            cu_built = [p.build for p in cu_programs]
            for res in cu_built:
                if res.error_no == MeasureErrorNo.NO_ERROR:
                    counts["nvcc_ok"] += 1
                elif "spill" in res.error_msg:
                    counts["spill"] += 1
                    messages.append(res.error_msg[:200])
                else:
                    counts["nvcc_err"] += 1
                    messages.append(res.error_msg[:300])
        if args.cuda_run:
            from ansor.measure.cuda import CudaRunner
            with CudaRunner(timeout=60, timing=CHECK_ONLY, rtol=task_rtol(cuda_task)) as runner:
                run_checked(runner, cuda_task, cu_built, cu_sources, counts, messages)
        if not args.no_pocl:
            from ansor.measure.opencl import OpenCLBuilder, OpenCLRunner
            cl_sources, _ = sources_for(drawn, cl_task.target)
            with OpenCLRunner(timeout=120, timing=CHECK_ONLY, rtol=task_rtol(cl_task)) as runner:
                built = OpenCLBuilder(n_parallel=args.jobs).build([src for src, _ in cl_sources])
                run_checked(runner, cl_task, built, cl_sources, counts, messages)
        if args.oclgrind and oclgrind_ready():
            small_inputs = small_task.random_inputs(seed=2)
            for source, _ in sources_for(small, small_task.target)[0]:
                from ansor.measure.oclgrind import race_check
                log = race_check(source, small_inputs)
                counts["grind_ok" if not log else "report"] += 1
                if log:
                    messages.append(log[:300])
        n_sketches = len({k for k, _ in drawn})
        print(f"{label:32} {n_sketches:6} {len(drawn):5} {refused:7} | {counts['nvcc_ok']:7} "
              f"{counts['reprinted']:7} {counts['spill']:5} "
              f"{counts['nvcc_err']:5} | {counts['ok']:7} {counts['wrong']:5} {counts['err']:5} | "
              f"{counts['grind_ok']:8} {counts['report']:6} | {time.perf_counter() - start:5.0f}", flush=True)
        for m in messages[:3]:
            print("    " + m.replace("\n", " "))
        failed |= bool(counts["spill"] or counts["nvcc_err"] or counts["wrong"] or counts["err"] or counts["report"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
