"""Tutorial 4: your own operator (LayerNorm followed by GELU), declared by hand, fused and tuned.

No operator library is needed for a computation ansor has never seen: declare it with
`ansor.te` and the search finds its schedule like any other's. Here a transformer's LayerNorm
and the exact (erf) GELU after it are four stages: the mean and the variance of each row
(reductions, `te.sum` over a `te.reduce_axis`), the normalized value, and the GELU. PyTorch
eager runs them as two operators, each a pass over memory; in ansor's program the elementwise
normalization is inlined into the GELU (never stored), and the search decides how the row
statistics are computed (split with rfactor, parallel over rows, computed inside the output's
row loop or before it). The script

1. declares the four stages, tunes them (`--trials`, default 64) and builds the best program;
2. checks it against the declaration evaluated by numpy, and times it in turns, in this
   process, with PyTorch eager (`F.gelu(F.layer_norm(x))`) and torch.compile of the same (and
   a hand-written Triton kernel when a CUDA GPU is present; its times are the GPU's);
3. says where each stage runs in the winning program (inlined, computed inside which loop of
   which stage) and prints its loop nest;
4. saves the comparison as a bar chart (PNG).

    python examples/tutorial_4_custom.py                       # 2048 rows x 768, 64 trials
    python examples/tutorial_4_custom.py --rows 128 --cols 1024 --trials 200 --database ln.db
    python examples/tutorial_4_custom.py --small --trials 2    # 32 x 64 (the smoke test)
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile

import numpy as np

import ansor
from ansor import te
from ansor.compare import compare_calls, torch_calls
from ansor.report import console

EPS = 1e-5


def declare_layer_norm_gelu(rows: int, cols: int, eps: float = EPS) -> ansor.Task:
    """gelu(layer_norm(X) * gamma + beta) over the last axis, in four stages; a reduction is
    the whole body of its stage, so the 1/cols of the mean goes inside the sum."""
    X = te.placeholder((rows, cols), "float32", name="X")
    gamma = te.placeholder((cols,), "float32", name="gamma")
    beta = te.placeholder((cols,), "float32", name="beta")
    k = te.reduce_axis(cols, name="k")
    mean = te.compute((rows,), lambda i: te.sum(X[i, k] * (1.0 / cols), axis=k), name="mean")
    k2 = te.reduce_axis(cols, name="k2")

    def variance(i):
        d = X[i, k2] - mean[i]
        return te.sum(d * d * (1.0 / cols), axis=k2)

    var = te.compute((rows,), variance, name="var")
    norm = te.compute((rows, cols), lambda i, j: (X[i, j] - mean[i]) * te.rsqrt(var[i] + eps) * gamma[j] + beta[j],
                      name="norm")

    def gelu(i, j):
        x = norm[i, j]
        return 0.5 * x * (1.0 + te.erf(x * (1.0 / math.sqrt(2.0))))

    out = te.compute((rows, cols), gelu, name="gelu")
    return ansor.Task([X, gamma, beta, out], name="layer_norm_gelu")


def torch_layer_norm_gelu(x, g, b):
    """What a PyTorch program writes: two operators."""
    import torch.nn.functional as F

    return F.gelu(F.layer_norm(x, (x.shape[-1],), g, b, EPS))


def where_stages_run(state: ansor.State) -> list[str]:
    """One line per stage of the program: inlined, computed inside which loop of which stage
    (compute_at), or a loop nest of its own; read off the program, not assumed."""
    lines = []
    for s in state.stages:
        if s.is_placeholder:
            continue
        if s.attach == "inline":
            lines.append(f"{s.name}: inlined into the stages that read it (no buffer, no loop of its own)")
        elif isinstance(s.attach, tuple):
            host, loop = s.attach
            lines.append(f"{s.name}: computed inside loop {loop} of {host} (only the part that one iteration needs)")
        else:
            par = [f"{it.name} ({it.extent})" for it in s.iters if it.annotation == "parallel"]
            vec = [f"{it.name} ({it.extent})" for it in s.iters if it.annotation == "vectorize"]
            extra = "".join([f", parallel over {', '.join(par)}" if par else "",
                             f", vectorized along {', '.join(vec)}" if vec else ""])
            lines.append(f"{s.name}: a loop nest of its own{extra}")
    nests = sum(1 for s in state.stages if not s.is_placeholder and s.attach == "root")
    inlined = sum(1 for s in state.stages if s.attach == "inline")
    lines.append(f"=> {nests} loop nest{'s' if nests != 1 else ''} in all, {inlined} stage{'s' if inlined != 1 else ''} "
                 f"inlined" + (": every stage fused into one" if nests == 1 else ""))
    return lines


def triton_call(x: np.ndarray, g: np.ndarray, b: np.ndarray):
    """A hand-written Triton kernel on the CUDA GPU (one program per row), as a no-argument call
    that waits for the GPU; None with the reason when there is no CUDA GPU or no Triton."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "no CUDA GPU"
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None, "triton is not installed"

    @triton.jit
    def layer_norm_gelu_kernel(X, G, B, Y, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        xs = tl.load(X + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(xs, axis=0) / n_cols
        d = tl.where(mask, xs - mean, 0.0)
        var = tl.sum(d * d, axis=0) / n_cols
        y = d * tl.rsqrt(var + eps) * tl.load(G + cols, mask=mask, other=0.0) + tl.load(B + cols, mask=mask, other=0.0)
        y = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
        tl.store(Y + row * n_cols + cols, y, mask=mask)

    xd, gd, bd = (torch.from_numpy(a).cuda() for a in (x, g, b))
    yd = torch.empty_like(xd)
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)

    def call():
        layer_norm_gelu_kernel[(rows,)](xd, gd, bd, yd, cols, EPS, BLOCK=block)
        torch.cuda.synchronize()
        return yd

    return call, f"on the GPU ({torch.cuda.get_device_name()}), synchronized; not comparable to the CPU rows"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2048, help="rows (tokens) (default 2048)")
    parser.add_argument("--cols", type=int, default=768, help="columns (hidden size) (default 768)")
    parser.add_argument("--small", action="store_true", help="32 rows x 64, for a quick check (default: off)")
    parser.add_argument("--trials", type=int, default=64, help="programs to measure (default 64)")
    parser.add_argument("--database", default=None,
                        help="records database (default: a temporary file, removed at the end)")
    parser.add_argument("--plot", default="tutorial_4_custom.png",
                        help="the comparison's bar chart PNG (default tutorial_4_custom.png)")
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds (default 7)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the search (default 0)")
    args = parser.parse_args()
    rows, cols = (32, 64) if args.small else (args.rows, args.cols)
    task = declare_layer_norm_gelu(rows, cols)
    with tempfile.TemporaryDirectory() as tmp:
        db = args.database or os.path.join(tmp, "custom.db")
        print(f"LayerNorm+GELU {rows}x{cols}: {len(task.dag.tensors) - len(task.inputs)} stages declared "
              f"({task.flop / 1e6:.2f} MFLOP); {args.trials} trials on {task.target.key}; records: {db}")
        result = ansor.tune(task, trials=args.trials, database=db, seed=args.seed, progress=False)
        print(f"tuned: {result.trials} programs measured in {result.seconds:.0f} s, best "
              f"{result.best_gflops:.2f} GFLOP/s while tuning")
        kernel = ansor.build(task, database=db)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols)).astype("float32")
    g = (1.0 + 0.1 * rng.standard_normal(cols)).astype("float32")
    b = (0.1 * rng.standard_normal(cols)).astype("float32")
    baselines, notes = torch_calls(torch_layer_norm_gelu, [x, g, b])
    baselines["Triton (hand-written)"], notes["Triton (hand-written)"] = triton_call(x, g, b)
    notes["ansor"] = "one program for all four stages"
    comparison = compare_calls(f"LayerNorm+GELU {rows}x{cols}", task.flop, kernel.prepared(x, g, b),
                               task.reference_outputs([x, g, b]), baselines, notes, rounds=args.rounds)
    console.print(comparison.table())
    for line in comparison.lines():
        print(line)
    print("\nwhere each stage runs in the winning program:")
    for line in where_stages_run(kernel.state):
        print(f"  {line}")
    print("\nits loop nest:")
    print(kernel.schedule)
    comparison.save_chart(args.plot)
    print(f"bar chart saved to {args.plot}")


if __name__ == "__main__":
    main()
