"""A decoder block served at any sequence length from its buckets, beside onnxruntime and PyTorch.

    python benchmarks/dynamic_lengths.py --database dynamic.db                      # quick build
    python benchmarks/dynamic_lengths.py --database dynamic.db --trials-per-task 150 --json rows.jsonl

A pre-norm decoder block (LayerNorm, causal self-attention through `scaled_dot_product_attention`
with `is_causal=True`, so no mask tensor and no padding mask; LayerNorm, MLP with GELU; random
weights, `--width` and `--heads`) is imported once with `from_torch(..., dynamic_shapes=...)`,
its sequence length a `Dim` up to `--max-length`. Its buckets (powers of two from 16, then the
maximum) are tuned together as one model with `--trials-per-task` trials per distinct task (or
for `--time-budget` seconds; neither: the quick build, each task without a record given a short
model-guided search) and built once into a `BucketedModel`. Then, at each of `--lengths` (none
of them a bucket size by default but 64), the same BucketedModel is called at that length:
checked against PyTorch eager, and timed in turns against onnxruntime running an ONNX export of
the block whose sequence axis is dynamic, and PyTorch eager (several rounds, medians, the paired
ratio per round). Each row says which bucket served the length; the compiler calls and importer
runs made while serving the lengths are counted (both must be zero: a new length compiles
nothing). `--json FILE` appends one row per length.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from common import TURN_PAUSE_S, git_commit, machine_name

#: ansor's output against PyTorch eager's, as a fraction of the output's RMS.
TOLERANCE = 1e-4
#: onnxruntime's output against PyTorch eager's: past this its export is not the same block.
ONNXRUNTIME_TOLERANCE = 1e-3

warnings.filterwarnings("ignore", category=FutureWarning)  # torch.export's pytree deprecations


def decoder_block(width: int, heads: int, seed: int = 0):
    """A pre-norm transformer decoder block (GPT-2's layout) with random weights, eval mode:
    x + attn(ln1(x)), then + mlp(ln2(x)); input and output [batch, sequence, width]."""
    import torch
    import torch.nn.functional as F

    if width % heads:
        raise ValueError(f"width {width} is not a multiple of heads {heads}")

    class DecoderBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = heads
            self.ln_1 = torch.nn.LayerNorm(width)
            self.qkv = torch.nn.Linear(width, 3 * width)
            self.proj = torch.nn.Linear(width, width)
            self.ln_2 = torch.nn.LayerNorm(width)
            self.fc = torch.nn.Linear(width, 4 * width)
            self.gelu = torch.nn.GELU()
            self.out = torch.nn.Linear(4 * width, width)

        def forward(self, x):
            b, n, c = x.shape
            q, k, v = self.qkv(self.ln_1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, n, c))
            return x + self.out(self.gelu(self.fc(self.ln_2(x))))

    torch.manual_seed(seed)
    block = DecoderBlock().eval()
    with torch.no_grad():  # LayerNorm's affine parameters away from their identity start
        for norm in (block.ln_1, block.ln_2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.1, 0.1)
    return block


@dataclass
class CompileCounter:
    """Sources handed to the C compiler (cached or not) and importer runs while it is active."""

    sources: int = 0
    imports: int = 0


@contextlib.contextmanager
def counting_compiles() -> Iterator[CompileCounter]:
    """Count every source given to a builder (`CachedBuilder.build`: kernels, the model's
    one-call sequence) and every instantiation of a dynamic graph at new sizes, by wrapping
    both for the duration."""
    from ansor.graph.dynamic import DynamicGraph
    from ansor.measure.build import CachedBuilder

    counter = CompileCounter()
    build, make = CachedBuilder.build, DynamicGraph.instantiate

    def counted_build(self, sources):
        def counted():  # a generator in, a generator out: the builder still compiles as they come
            for source in sources:
                counter.sources += source is not None
                yield source
        return build(self, counted())

    def counted_instantiate(self, sizes):
        if tuple(sorted(sizes.items())) not in self._graphs:
            counter.imports += 1
        return make(self, sizes)

    CachedBuilder.build, DynamicGraph.instantiate = counted_build, counted_instantiate
    try:
        yield counter
    finally:
        CachedBuilder.build, DynamicGraph.instantiate = build, make


def onnx_session(block, width: int, max_length: int, threads: int):
    """An onnxruntime session on the block exported with a dynamic sequence axis (None without
    onnxruntime)."""
    try:
        import onnxruntime
    except ImportError:
        return None
    import torch

    path = os.path.join(tempfile.mkdtemp(prefix="ansor-dynamic-"), "decoder_block.onnx")
    example = torch.zeros(1, min(8, max_length), width)
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer warnings
        torch.onnx.export(block, (example,), path, dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {1: "sequence"}, "y": {1: "sequence"}}, opset_version=17)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Max absolute difference as a fraction of the expected output's RMS."""
    rms = float(np.sqrt(np.mean(want.astype(np.float64) ** 2))) or 1.0
    return float(np.max(np.abs(got - want))) / rms


@dataclass
class ServedLengths:
    """What `serve_lengths` made and measured: the block, its BucketedModel, one row per length."""

    block: Any
    compiled: Any
    rows: list[dict] = field(default_factory=list)
    build_seconds: float = 0.0
    tune_seconds: float = 0.0
    compiled_at_build: int = 0


def serve_lengths(width: int = 256, heads: int = 4, max_length: int = 512, lengths: Sequence[int] = (17, 64, 200, 511),
                  database: str | None = None, trials_per_task: int = 0, time_budget: float | None = None,
                  quick_seconds: float | None = None, rounds: int = 7, min_repeat_s: float = 0.1,
                  buckets: Sequence[int] | None = None, onnxruntime: bool = True, seed: int = 0,
                  log=print) -> ServedLengths:
    """The benchmark: the block imported once over a dynamic sequence length, tuned at its
    buckets (`trials_per_task` per distinct task and/or `time_budget` seconds; neither: none),
    built once, then called at each length: checked against PyTorch eager (and onnxruntime's
    output against PyTorch's), timed in turns beside onnxruntime and PyTorch eager. Raises
    AssertionError when an output is wrong or a length compiled or imported anything."""
    import torch

    import ansor
    from ansor.baselines import paired_ratio, time_in_turns
    from ansor.graph.bucketed import bucket_tasks, merged_tasks
    from ansor.graph.model_tuning import tune_model
    from ansor.store import open_store

    if max(lengths) > max_length or min(lengths) < 1:
        raise ValueError(f"lengths {list(lengths)} must lie in 1..{max_length} (--max-length)")
    cores = ansor.Target.host().num_cores
    torch.set_num_threads(cores)
    block = decoder_block(width, heads, seed)
    seq = torch.export.Dim("seq", max=max_length)
    graph = ansor.graph.from_torch(block, (torch.zeros(1, min(8, max_length), width),),
                                   dynamic_shapes={"x": {1: seq}},
                                   buckets={"seq": tuple(buckets)} if buckets else None)
    result = ServedLengths(block, None)
    log(f"decoder block width {width}, {heads} heads, {graph}; {machine_name()}, commit {git_commit()}; "
        f"load {os.getloadavg()[0]:.1f}", flush=True)
    if trials_per_task > 0 or time_budget is not None:
        if database is None:
            raise ValueError("tuning needs a database to record into (--database)")
        merged = merged_tasks(bucket_tasks(graph))
        trials = trials_per_task * len(merged.tasks) if trials_per_task > 0 else None
        log(f"tuning {len(merged.tasks)} distinct tasks of all buckets as one model: "
            f"{f'{trials} trials' if trials else 'no trial limit'}"
            f"{f', {time_budget:g} s' if time_budget is not None else ''}", flush=True)
        start = time.perf_counter()
        with open_store(database)[0] as store:
            tune_model(merged, store, trials, time_budget=time_budget)
        result.tune_seconds = time.perf_counter() - start

    start = time.perf_counter()
    with counting_compiles() as at_build:
        compiled = ansor.build(graph, database=database, quick_seconds=quick_seconds, verbose=False)
    result.build_seconds = time.perf_counter() - start
    result.compiled, result.compiled_at_build = compiled, at_build.sources
    kernels = {id(k): k for m in compiled.models for k in m.kernels.values()}
    tuned = sum(1 for k in kernels.values() if k.record is not None)
    log(compiled.summary())
    log(f"built in {result.build_seconds:.0f} s: {len(compiled.buckets)} buckets, {len(kernels)} distinct kernels "
        f"({tuned} with records), {at_build.sources} sources compiled", flush=True)

    session = onnx_session(block, width, max_length, cores) if onnxruntime else None
    rng = np.random.default_rng(seed)
    with counting_compiles() as while_serving:
        for length in lengths:
            x = rng.standard_normal((1, length, width)).astype(np.float32)
            xt = torch.from_numpy(x)
            with torch.no_grad():
                want = block(xt).numpy()
            got = compiled(x)
            error = relative_error(got, want)
            if got.shape != want.shape or not error < TOLERANCE:
                raise AssertionError(f"length {length}: ansor's output {got.shape} differs from PyTorch's "
                                     f"{want.shape} by {error:.1e} of its RMS")
            bucket = compiled.bucket_for(x)
            served_by = compiled.models[compiled.buckets.index(bucket)].kernels.values()
            bucket_tuned = f"{sum(1 for k in served_by if k.record is not None)} of {len(served_by)}"
            fns = {"ansor": lambda x=x: compiled(x)}

            def eager(xt=xt):
                with torch.no_grad():
                    block(xt)

            fns["PyTorch eager"] = eager
            ort_error = None
            if session is not None:
                ort_error = relative_error(session.run(None, {"x": x})[0], want)
                if not ort_error < ONNXRUNTIME_TOLERANCE:
                    raise AssertionError(f"length {length}: onnxruntime's output differs from PyTorch's by "
                                         f"{ort_error:.1e} of its RMS: the export is not the same block")
                fns["onnxruntime"] = lambda x=x: session.run(None, {"x": x})
            turns = time_in_turns(fns, rounds=rounds, min_repeat_s=min_repeat_s, pause_s=TURN_PAUSE_S)
            row = {"length": length, "bucket": bucket.sizes["seq"], "bucket_kernels_tuned": bucket_tuned,
                   "width": width, "heads": heads,
                   "max_length": max_length, "error": error, "onnxruntime_error": ort_error,
                   "timings_ms": {k: t.median * 1e3 for k, t in turns.items()},
                   "spreads": {k: t.spread for k, t in turns.items()},
                   "paired_ratios": {k: paired_ratio(t, turns["ansor"]) for k, t in turns.items()},
                   "rounds": rounds, "kernels": len(kernels), "tuned": tuned,
                   "trials_per_task": trials_per_task, "time_budget": time_budget, "quick_seconds": quick_seconds,
                   "machine": machine_name(), "commit": git_commit(), "load": os.getloadavg()[0]}
            result.rows.append(row)
            lo, hi = graph.dims["seq"].served(row["bucket"])
            ort_text = "not run" if ort_error is None else f"{ort_error:.1e}"
            log(f"length {length}: served by bucket seq = {row['bucket']} (lengths {lo}..{hi}; {bucket_tuned} kernels "
                f"with records), max error "
                f"{error:.1e} of the output RMS (onnxruntime's {ort_text}); {rounds} rounds in turns (ratio = "
                f"other / ansor, above 1: ansor faster; paired: the median of each round's ratio); "
                f"load {row['load']:.1f}", flush=True)
            for name, t in turns.items():
                log(f"  {name:14s} {t.median * 1e3:9.3f} ms  spread {t.spread:4.0%}  ratio "
                    f"{t.median / turns['ansor'].median:5.2f}  paired {row['paired_ratios'][name]:5.2f}")
    after = {id(k) for m in compiled.models for k in m.kernels.values()}
    for row in result.rows:
        row["compiled_while_serving"] = while_serving.sources
        row["imported_while_serving"] = while_serving.imports
    log(f"while serving lengths {', '.join(map(str, lengths))}: {while_serving.sources} sources compiled, "
        f"{while_serving.imports} imports; distinct kernels {len(kernels)} before the calls, {len(after)} after")
    if while_serving.sources or while_serving.imports or after != set(kernels):
        raise AssertionError("serving a new length compiled or imported again")
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--lengths", default="17,64,200,511")
    parser.add_argument("--buckets", default=None, help="bucket sizes, comma-separated, the last one the maximum "
                                                        "(default: powers of two from 16, then the maximum)")
    parser.add_argument("--database", default="dynamic_lengths.db")
    parser.add_argument("--trials-per-task", type=int, default=0,
                        help="tune every bucket's distinct tasks first, this many trials per task (0: no tuning)")
    parser.add_argument("--time-budget", type=float, default=None, help="tune for at most this many seconds")
    parser.add_argument("--quick-seconds", type=float, default=None,
                        help="the quick build's search per task without records (default: ansor's; 0: untuned)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="append one row per length to this JSON-lines file")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.trials_per_task < 0 or args.max_length < 1:
        parser.error("--rounds and --max-length must be >= 1, --trials-per-task >= 0")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("benchmarks/dynamic_lengths.py compares against PyTorch: pip install torch")
    lengths = [int(n) for n in args.lengths.split(",")]
    buckets = [int(n) for n in args.buckets.split(",")] if args.buckets else None
    result = serve_lengths(args.width, args.heads, args.max_length, lengths, args.database, args.trials_per_task,
                           args.time_budget, args.quick_seconds, args.rounds, buckets=buckets)
    if args.json:
        with open(args.json, "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in result.rows)
    worst = min((r["paired_ratios"].get("onnxruntime", math.nan) for r in result.rows), default=math.nan)
    print(f"lowest paired ratio onnxruntime / ansor over the lengths: {worst:.2f}")
    return result.rows


if __name__ == "__main__":
    main()
