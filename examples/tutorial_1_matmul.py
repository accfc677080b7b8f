"""Tutorial 1: a matrix multiplication, tuned, beside numpy (OpenBLAS), PyTorch and torch.compile.

1. declare C = A @ B with `ansor.te` (what to compute, no loops);
2. tune it: ansor searches programs (tilings, loop orders, parallel, vector and unroll choices),
   compiles each, checks its output against numpy and keeps every measurement in a database;
3. build the best program, check it, and time it in turns, in this process, with numpy (which
   calls OpenBLAS), PyTorch eager (which calls MKL or oneDNN) and torch.compile: every round
   times each implementation once, so a busy moment of the machine falls on all alike;
4. print the winning program's loop nest and save the tuning curve (best GFLOP/s against
   programs measured, with the other implementations' GFLOP/s as lines) as a PNG.

    python examples/tutorial_1_matmul.py                              # 512^3, 64 trials
    python examples/tutorial_1_matmul.py --shape 1024,1024,1024 --trials 300 --database mm.db
    python examples/tutorial_1_matmul.py --small --trials 2           # 64^3 (the smoke test)

A rerun with the same `--database` continues from the records already there.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import ansor
from ansor import te
from ansor.compare import Comparison, compare_calls, torch_calls
from ansor.report import console


def declare_matmul(m: int, n: int, k: int) -> ansor.Task:
    """C[i, j] = sum over r of A[i, r] * B[r, j]: inputs first, then the output."""
    A = te.placeholder((m, k), "float32", name="A")
    B = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis(k, name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return ansor.Task([A, B, C], name="matmul")


def save_curve(curve: list[tuple[int, float]], comparison: Comparison, path: str, title: str) -> str:
    """The tuning curve, with each other implementation's GFLOP/s (timed after tuning) as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if curve:
        xs, ys = zip(*curve)
        ax.plot(xs, ys, label="ansor, best so far (measured while tuning)", linewidth=2, color="#d62728")
    styles = iter(zip(["--", ":", "-.", "--", ":"], ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#7f7f7f"]))
    for entry in comparison.entries:
        gflops = comparison.gflops(entry)
        if gflops is not None:
            style, color = ("-", "#d62728") if entry is comparison.ansor else next(styles)
            ax.axhline(gflops, linestyle=style, color=color, alpha=0.8,
                       label=f"{entry.name}: {gflops:.1f} GFLOP/s (timed in turns)")
    ax.set_xlabel("trials (programs measured)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="512,512,512", help="M,N,K (default 512,512,512)")
    parser.add_argument("--small", action="store_true", help="64,64,64, for a quick check (default: off)")
    parser.add_argument("--trials", type=int, default=64, help="programs to measure (default 64)")
    parser.add_argument("--database", default=None,
                        help="records database (default: a temporary file, removed at the end)")
    parser.add_argument("--plot", default="tutorial_1_matmul.png", help="the tuning curve PNG "
                                                                        "(default tutorial_1_matmul.png)")
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds (default 7)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the search (default 0)")
    args = parser.parse_args()
    m, n, k = (64, 64, 64) if args.small else (int(x) for x in args.shape.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        db = args.database or os.path.join(tmp, "matmul.db")
        task = declare_matmul(m, n, k)
        print(f"matmul {m}x{n}x{k} ({task.flop / 1e9:.3f} GFLOP) on {task.target.key}; "
              f"{args.trials} trials; records: {db}")
        result = ansor.tune(task, trials=args.trials, database=db, seed=args.seed, progress=False)
        print(f"tuned: {result.trials} programs measured in {result.seconds:.0f} s, best "
              f"{result.best_gflops:.1f} GFLOP/s while tuning")
        kernel = ansor.build(task, database=db)

    a = np.random.default_rng(0).standard_normal((m, k)).astype("float32")
    b = np.random.default_rng(1).standard_normal((k, n)).astype("float32")
    baselines, notes = torch_calls(lambda x, y: x @ y, [a, b])
    baselines = {"numpy": lambda: a @ b, **baselines}
    notes["numpy"] = "a @ b (OpenBLAS)"
    notes["ansor"] = "the best program, built from the database"
    reference = (a.astype("float64") @ b.astype("float64")).astype("float32")
    comparison = compare_calls(f"matmul {m}x{n}x{k}", task.flop, kernel.prepared(a, b), [reference],
                               baselines, notes, rounds=args.rounds)
    console.print(comparison.table())
    for line in comparison.lines():
        print(line)
    print("\nthe winning program (its loop nest):")
    print(kernel.schedule)
    save_curve(result.curve, comparison, args.plot, f"matmul {m}x{n}x{k} on {task.target.key}")
    print(f"tuning curve saved to {args.plot}")


if __name__ == "__main__":
    main()
