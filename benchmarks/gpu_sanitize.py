"""CUDA programs under compute-sanitizer (needs an NVIDIA GPU): randomly annotated programs of
a few workloads at small shapes are built with nvcc, then run once each under `racecheck`
(shared-memory data races) and `synccheck` (barriers in divergent code), all programs of a tool
in one sanitized process. One program with its first `__syncthreads()` removed is run too: the
tool must report it, or the check proves nothing.

    python benchmarks/gpu_sanitize.py --per-sketch 2

Exit status 1 when a sampled program has a report or the planted race goes unseen.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import ansor
from ansor.backend import generate_source
from ansor.lower.gpu import GPUScheduleError
from ansor.search.annotate_gpu import annotate_gpu
from ansor.search.sketch_policy import SketchPolicy
from ansor.workloads import make_task

SMALL = [("matmul", (64, 64, 64), {}), ("softmax", (32, 128), {}), ("layer_norm_gelu", (16, 256), {}),
         ("conv2d", (1, 8, 10, 10, 8, 3, 3), {"padding": 1}), ("norm2", (64, 128), {})]
# memcheck-style tools end with "ERROR SUMMARY: n errors"; racecheck with "RACECHECK SUMMARY:
# n hazards displayed (e errors, w warnings)"
SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: (\d+) hazard")


def summary_counts(log: str) -> list[int]:
    """The error or hazard counts of each summary line in a compute-sanitizer log."""
    return [int(a or b) for a, b in SUMMARY.findall(log)]


def sampled_sources(per_sketch: int, seed: int) -> list[tuple[str, str]]:
    """(label, CUDA source) of up to `per_sketch` programs of each sketch of each small workload."""
    out = []
    for name, shape, opts in SMALL:
        task = make_task(name, shape, target=ansor.Target.cuda(), **opts)
        policy = SketchPolicy(task, seed=seed)
        rng = random.Random(seed)
        for k, sketch in enumerate(policy.sketches):
            made = 0
            for _ in range(per_sketch * 20):
                if made == per_sketch:
                    break
                state = annotate_gpu(sketch.steps, task.dag, rng, policy.params, policy.hardware)
                if state is None:
                    continue
                try:
                    source, _ = generate_source(state, task.target)
                except GPUScheduleError:
                    continue
                out.append((f"{name} sketch {k} #{made}", source))
                made += 1
    return out


def run_all(directory: str) -> int:
    """Run every cubin listed in directory/programs.json once on random inputs (the part that
    runs under the sanitizer)."""
    from ansor.measure.cuda import CudaKernel
    from ansor.measure.gpu_module import GPUModule

    for item in json.loads(Path(directory, "programs.json").read_text()):
        module = GPUModule.parse(Path(item["cu"]).read_text())
        kernel = CudaKernel(item["cubin"], module=module)
        rng = np.random.default_rng(0)
        arrays = [rng.standard_normal(b.shape).astype(b.np_dtype) for b in module.inputs]
        arrays += [np.zeros(b.shape, b.np_dtype) for b in module.outputs]
        kernel(*arrays)
        kernel.close()
        print(f"ran {item['label']}", flush=True)
    return 0


def sanitize(tool: str, items: list[dict], directory: str) -> str:
    Path(directory, "programs.json").write_text(json.dumps(items))
    cmd = ["compute-sanitizer", "--tool", tool, "--print-limit", "20", sys.executable, __file__, "--run", directory]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-sketch", type=int, default=2)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run:
        return run_all(args.run)
    from ansor.measure.cuda import CudaBuilder

    directory = tempfile.mkdtemp(prefix="ansor-sanitize-")
    sources = sampled_sources(args.per_sketch, args.seed)
    planted_from = next(src for label, src in sources if "__syncthreads();" in src)
    planted = planted_from.replace("__syncthreads();", "/* barrier removed */")
    sources.append(("planted: barriers removed", planted))
    built = CudaBuilder(args.arch, cache_dir=directory, allow_spills=True).build([s for _, s in sources])
    items = [{"label": label, "cubin": b.lib_path, "cu": str(Path(b.lib_path).with_suffix(".cu"))}
             for (label, _), b in zip(sources, built) if b.lib_path]
    print(f"{len(items)} of {len(sources)} programs built (the last is the planted race)", flush=True)
    failed = False
    for tool in ("racecheck", "synccheck"):
        sampled_log = sanitize(tool, items[:-1], directory)
        errors = summary_counts(sampled_log)
        ran = sampled_log.count("\nran ") + sampled_log.startswith("ran ")
        print(f"{tool}: {ran} of {len(items) - 1} sampled programs ran; error summary {errors}", flush=True)
        if not errors or any(errors) or ran != len(items) - 1:
            failed = True
            print(sampled_log[-3000:])
    planted_log = sanitize("racecheck", items[-1:], directory)
    hazards = summary_counts(planted_log)
    print(f"planted missing barrier: racecheck summary {hazards}", flush=True)
    if not any(hazards):
        failed = True
        print(planted_log[-3000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
