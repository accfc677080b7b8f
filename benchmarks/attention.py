"""Fused attention: ansor's tuned template kernel beside PyTorch's scaled_dot_product_attention.

    python benchmarks/attention.py --lengths 128,384 --trials 100 --database attention.db
    OMP_WAIT_POLICY=passive python benchmarks/attention.py --trials 0 --cpu-time --bert-layer models.db

For each sequence length, the attention task [batch, heads, length, head dim] (BERT-base:
1 x 12 heads x 64) is tuned (`ansor.tune`; a rerun on the same database resumes, `--trials 0`
only builds), built from the database's best record, checked against PyTorch, and then both
are timed in turns (several rounds, each turn after a short pause; medians, spreads and the
paired ratio), with the template's default program beside them ("ansor default":
`lower.attention`'s DEFAULT_KNOBS, no search). GFLOP/s count the two products,
4 * batch * heads * Lq * Lk * D (half of it with `--causal`), and are set against the FMA peak
of the cores, measured at the start (`common.fma_peak`: every core running independent vector
FMAs in registers; run it quiet), or computed from an assumed clock with `--ghz`. On a machine
that other jobs load,
`--cpu-time` (with OMP_WAIT_POLICY=passive) adds a second timing in turns: CPU seconds per
call divided by the cores, what a call costs rather than how long it waited for them.
`--bert-layer DATABASE` then times the BERT-base layer built from that database's records
beside onnxruntime the same way.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from common import TURN_PAUSE_S, fma_peak, git_commit, machine_name

import ansor
from ansor import te
from ansor.baselines import measure_in_turns, paired_ratio, time_in_turns
from ansor.kernel import compile_state
from ansor.schedule.state import State
from ansor.te.attention import attention


def attention_task(batch: int, heads: int, length: int, dim: int, causal: bool) -> ansor.Task:
    q, k, v = (te.placeholder((batch, heads, length, dim), name=n) for n in "qkv")
    return ansor.Task([q, k, v, attention(q, k, v, causal=causal)], name=f"attention_{length}")


def torch_sdpa(inputs: list[np.ndarray], causal: bool):
    """(a no-argument call of PyTorch's fused attention on the inputs, its output)."""
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.from_numpy(x) for x in inputs)

    def call():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return call, call().numpy()


def cpu_seconds_in_turns(fns: dict, rounds: int, calls: int = 20) -> dict:
    """Per call, the CPU time of the process (all its threads) in turns: on a machine other jobs
    load, what a call costs the cores rather than how long it waits for them. Meaningful with
    OMP_WAIT_POLICY=passive (idle workers then sleep instead of spinning on the clock)."""
    def turn(fn):
        def seconds_per_call():
            start = time.process_time()
            for _ in range(calls):
                fn()
            return (time.process_time() - start) / calls
        return seconds_per_call
    for fn in fns.values():
        fn()
    return measure_in_turns({name: turn(fn) for name, fn in fns.items()}, rounds, TURN_PAUSE_S)


def bert_layer(database: str, rounds: int, cpu_time: bool, cores: int) -> None:
    """The BERT-base layer (sequence 128, attention fused) built from `database`'s records,
    checked against PyTorch, timed in turns beside onnxruntime (as many intra-op threads as
    cores; with `cpu_time` its workers do not spin, as ansor's with OMP_WAIT_POLICY=passive)."""
    import tempfile

    import onnxruntime
    import torch

    from ansor.pretrain.models import make_model

    module, inputs = make_model("bert_layer")
    module = module.eval()
    compiled = ansor.build(ansor.graph.from_torch(module, inputs), database=database)
    x = [t.numpy() for t in inputs]
    with torch.no_grad():
        want = module(*inputs).numpy()
    error = float(np.max(np.abs(compiled(*x) - want)) / np.sqrt(np.mean(want.astype(np.float64) ** 2)))
    if not error < 1e-4:
        raise AssertionError(f"bert_layer: ansor's output differs from PyTorch's by {error:.1e} of its RMS")
    path = os.path.join(tempfile.mkdtemp(prefix="ansor-attention-"), "bert_layer.onnx")
    with open(os.devnull, "w") as devnull:  # the exporter reports its passes on stdout
        stdout, sys.stdout = sys.stdout, devnull
        try:
            torch.onnx.export(module, inputs, path, dynamo=True)
        finally:
            sys.stdout = stdout
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = cores
    if cpu_time:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), x)}
    fns = {"ansor": lambda: compiled(*x), "onnxruntime": lambda: session.run(None, feed)}
    tuned = sum(1 for k in compiled.kernels.values() if k.record is not None)
    print(f"bert_layer (sequence 128) from {database}: {tuned} of {len(compiled.kernels)} kernels tuned, "
          f"max error {error:.1e} of the output RMS; load {os.getloadavg()[0]:.1f}")
    measured = [("wall", time_in_turns(fns, rounds=rounds, min_repeat_s=0.3, pause_s=0.5), 1)]
    if cpu_time:
        measured.append(("cpu/cores", cpu_seconds_in_turns(fns, rounds, calls=10), cores))
    for clock, timings, share in measured:
        for name, t in timings.items():
            print(f"  {clock:9s} {name:13s} {t.median / share * 1e3:8.3f} ms  spread {t.spread:4.0%}")
        ours, theirs = timings["ansor"], timings["onnxruntime"]
        print(f"  {clock:9s} ratio onnxruntime/ansor {theirs.median / ours.median:.2f} "
              f"(paired {paired_ratio(theirs, ours):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="128,384")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--trials", type=int, default=100, help="tuning trials per length (0: build only)")
    parser.add_argument("--database", default="attention.db")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--ghz", type=float, default=None,
                        help="an assumed clock for the FMA peak (default: the peak measured here, quiet)")
    parser.add_argument("--bert-layer", metavar="DATABASE",
                        help="also the BERT-base layer built from DATABASE beside onnxruntime (tune it with "
                             "benchmarks/models.py --models bert_layer --database DATABASE)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="also time CPU seconds per call divided by the cores (a loaded machine; "
                             "set OMP_WAIT_POLICY=passive)")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("benchmarks/attention.py compares against PyTorch: pip install torch")
    target = ansor.Target.host()
    torch.set_num_threads(target.num_cores)
    lanes = target.vector_unit_bytes // 4
    if args.ghz is None:
        peak = fma_peak()
        how = f"measured: {target.num_cores} cores running vector FMAs in registers, best of 5"
    else:
        peak = target.num_cores * 2 * lanes * 2 * args.ghz
        how = f"{target.num_cores} cores x 2 FMA x {lanes} lanes x 2 x {args.ghz} GHz, an assumed clock"
    print(f"{machine_name()}, commit {git_commit()}; FMA peak {peak:.0f} GFLOP/s ({how}); "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads; load {os.getloadavg()[0]:.1f}")
    for length in (int(x) for x in args.lengths.split(",")):
        task = attention_task(args.batch, args.heads, length, args.dim, args.causal)
        if args.trials > 0:
            start = time.perf_counter()
            result = ansor.tune(task, trials=args.trials, database=args.database, progress=False)
            print(f"L={length}: tuned {result.trials} trials in {time.perf_counter() - start:.0f} s, "
                  f"best {result.best_cost * 1e3:.3f} ms as measured while tuning")
        kernel = ansor.build(task, database=args.database)
        inputs = task.random_inputs(seed=1)
        sdpa, expected = torch_sdpa(inputs, args.causal)
        error = float(np.max(np.abs(kernel(*inputs) - expected)))
        if not error < 1e-4:
            raise AssertionError(f"L={length}: ansor's attention differs from PyTorch's by {error:.2e}")
        # the template's default knobs beside the tuned ones: on a loaded machine the search's
        # timings are noisy enough to prefer a worse program
        default = compile_state(task, State(task.dag))
        fns = {"ansor": kernel.prepared(*inputs), "ansor default": default.prepared(*inputs), "torch sdpa": sdpa}
        flops = 4 * args.batch * args.heads * length * length * args.dim * (0.5 if args.causal else 1.0)
        print(f"L={length} {'causal ' if args.causal else ''}[{args.batch}x{args.heads}x{length}x{args.dim}] "
              f"max error {error:.1e}, knobs {kernel.record.steps if kernel.record else 'default'}; "
              f"load {os.getloadavg()[0]:.1f}")
        measured = [("wall", time_in_turns(fns, rounds=args.rounds, pause_s=TURN_PAUSE_S), 1)]
        if args.cpu_time:
            measured.append(("cpu/cores", cpu_seconds_in_turns(fns, args.rounds), target.num_cores))
        for clock, timings, share in measured:
            for name, t in timings.items():
                seconds = t.median / share
                gflops = flops / seconds / 1e9
                print(f"  {clock:9s} {name:13s} {seconds * 1e3:8.3f} ms  spread {t.spread:4.0%}  "
                      f"{gflops:6.1f} GFLOP/s = {gflops / peak:4.0%} of peak")
            theirs = timings["torch sdpa"]
            for ours in ("ansor", "ansor default"):
                print(f"  {clock:9s} ratio torch/{ours} {theirs.median / timings[ours].median:.2f} "
                      f"(paired {paired_ratio(theirs, timings[ours]):.2f})")
    if args.bert_layer:
        bert_layer(args.bert_layer, args.rounds, args.cpu_time, target.num_cores)


if __name__ == "__main__":
    main()
