"""The task scheduler's curve: a model's estimated latency against trials, one line per scheduler.

    python benchmarks/models.py --models resnet18 --trials-per-task 150 --scheduler gradient \
        --database g.db --json runs.jsonl
    python benchmarks/models.py --models resnet18 --trials-per-task 150 --scheduler round-robin \
        --database rr.db --json runs.jsonl
    python benchmarks/scheduler_curve.py runs.jsonl --out curve.png

The estimated latency is what the scheduler minimizes: the sum over distinct tasks of (how often
the task occurs) x (its best measured latency so far). It is defined once every task has a
program (after the first round of each). Printed: each scheduler's final estimate, and the trials
the gradient scheduler needed to reach round-robin's final estimate (the ratio is the claim).
"""

from __future__ import annotations

import argparse
import json
import math


def first_reaching(curve: list[tuple[int, float]], level: float) -> int | None:
    return next((trials for trials, latency in curve if latency <= level), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", help="JSON lines written by benchmarks/models.py --json (rows with a curve)")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--per-round", type=int, default=None, help="only runs with this --per-round")
    parser.add_argument("--out", default="scheduler_curve.png")
    args = parser.parse_args()
    curves = {}
    with open(args.runs) as f:
        for line in f:
            row = json.loads(line)
            if (row.get("model") == args.model and row.get("curve")
                    and (args.per_round is None or row.get("per_round") == args.per_round)):
                curves[row["scheduler"]] = [(t, l) for t, l in row["curve"] if math.isfinite(l)]
    if not curves:
        raise SystemExit(f"no tuning curve of {args.model} in {args.runs}")
    for name, curve in curves.items():
        print(f"{name:12s} final estimate {curve[-1][1] * 1e3:.2f} ms after {curve[-1][0]} trials")
    if {"gradient", "round-robin"} <= set(curves):
        trials_rr, level = curves["round-robin"][-1]
        reached = first_reaching(curves["gradient"], level)
        if reached is None:
            print(f"gradient never reached round-robin's final {level * 1e3:.2f} ms")
        else:
            print(f"gradient reached round-robin's final {level * 1e3:.2f} ms after {reached} trials: "
                  f"{reached / trials_rr:.2f}x round-robin's {trials_rr}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, curve in curves.items():
        ax.plot([t for t, _ in curve], [l * 1e3 for _, l in curve], label=name, drawstyle="steps-post")
    ax.set_xlabel("trials (programs measured, all tasks)")
    ax.set_ylabel("estimated model latency (ms)")
    ax.set_title(f"{args.model}: task schedulers")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
