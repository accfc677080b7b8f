"""What next-task prefetches (`lower/prefetch.py`) are worth in a whole model: the model built
twice from one database, with and without the lowering pass, timed in turns beside
onnxruntime; both builds must give the same values bit for bit.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/prefetch.py --model bert_layer \
        --database DB --rounds 9

The database is used as it is (no tuning): tune it first with `benchmarks/models.py`.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert_layer", help="a model of ansor.pretrain.models (default bert_layer)")
    parser.add_argument("--database", required=True, help="records database the model is built from")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of timing in turns (default 9)")
    args = parser.parse_args()

    import torch

    import ansor
    from ansor.backend import cpu as cpu_backend
    from ansor.backend.registry import register_backend
    from ansor.baselines import paired_ratio, time_in_turns
    from ansor.pretrain.models import make_model
    from models import onnxruntime_session

    torch.manual_seed(0)
    module, inputs = make_model(args.model)
    module = module.eval()
    graph = ansor.graph.from_torch(module, inputs)
    x = [t.numpy() for t in inputs]
    with_prefetch = ansor.build(graph, database=args.database)
    original = cpu_backend.CPU
    register_backend(dataclasses.replace(
        original, passes=tuple(p for p in original.passes if p is not cpu_backend.next_task_prefetches)))
    try:
        without = ansor.build(graph, database=args.database)
    finally:
        register_backend(original)
    if not np.array_equal(with_prefetch(*x), without(*x)):
        raise AssertionError("the prefetches changed a value")
    fns = {"ansor, prefetches": lambda: with_prefetch(*x), "ansor, none": lambda: without(*x)}
    ort = onnxruntime_session(module, inputs)
    if ort is not None:
        fns["onnxruntime"] = ort
    turns = time_in_turns(fns, args.rounds, min_repeat_s=0.3, pause_s=0.5)
    base = turns["ansor, prefetches"]
    print(f"{args.model} from {args.database}: timed in turns, {args.rounds} rounds (paired: the median of each "
          f"round's ratio to the build with prefetches; above 1: that build faster)")
    for name, t in turns.items():
        print(f"  {name:20s} {t.median * 1e3:8.3f} ms  spread {t.spread:4.0%}  paired {paired_ratio(t, base):6.3f}")
    for name, built in (("prefetches", with_prefetch), ("none", without)):
        print(f"  steps, {name:10s} " + " ".join(f"{s * 1e3:.3f}" for _, _, s in built.profile(*x)) + " ms")


if __name__ == "__main__":
    main()
