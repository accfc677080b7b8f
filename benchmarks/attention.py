"""Fused attention: ansor's tuned template kernel beside PyTorch's scaled_dot_product_attention.

    python benchmarks/attention.py --lengths 128,384 --trials 100 --database attention.db

For each sequence length, the attention task [batch, heads, length, head dim] (BERT-base:
1 x 12 heads x 64) is tuned (`ansor.tune`; a rerun on the same database resumes, `--trials 0`
only builds), built from the database's best record, checked against PyTorch, and then both
are timed in turns (several rounds, each turn after a short pause; medians, spreads and the
paired ratio). GFLOP/s count the two products, 4 * batch * heads * Lq * Lk * D (half of it
with `--causal`), and are set against the FMA peak of the cores: cores x 2 FMA units x float32
lanes x 2 flops x `--ghz` (the clock is an assumption, given on the command line; the
default is the all-core clock the project's bars assume).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import ansor
from ansor import te
from ansor.baselines import paired_ratio, time_in_turns
from ansor.te.attention import attention

from common import TURN_PAUSE_S, git_commit, machine_name


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
    parser.add_argument("--ghz", type=float, default=2.6, help="clock for the FMA peak")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("benchmarks/attention.py compares against PyTorch: pip install torch")
    target = ansor.Target.host()
    torch.set_num_threads(target.num_cores)
    lanes = target.vector_unit_bytes // 4
    peak = target.num_cores * 2 * lanes * 2 * args.ghz
    print(f"{machine_name()}, commit {git_commit()}; FMA peak {peak:.0f} GFLOP/s "
          f"({target.num_cores} cores x 2 FMA x {lanes} lanes x 2 x {args.ghz} GHz); "
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
        timings = time_in_turns({"ansor": kernel.prepared(*inputs), "torch sdpa": sdpa},
                                rounds=args.rounds, pause_s=TURN_PAUSE_S)
        flops = 4 * args.batch * args.heads * length * length * args.dim * (0.5 if args.causal else 1.0)
        ours, theirs = timings["ansor"], timings["torch sdpa"]
        print(f"L={length} {'causal ' if args.causal else ''}[{args.batch}x{args.heads}x{length}x{args.dim}] "
              f"max error {error:.1e}, knobs {kernel.record.steps if kernel.record else 'default'}")
        for name, t in timings.items():
            gflops = flops / t.median / 1e9
            print(f"  {name:11s} {t.median * 1e3:8.3f} ms  spread {t.spread:4.0%}  {gflops:6.1f} GFLOP/s "
                  f"= {gflops / peak:4.0%} of peak")
        print(f"  ratio torch/ansor {theirs.median / ours.median:.2f} (paired {paired_ratio(theirs, ours):.2f})")


if __name__ == "__main__":
    main()
