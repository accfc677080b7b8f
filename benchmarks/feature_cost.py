"""What the cost model's features cost per program, task by task, on a model's tasks.

    python benchmarks/feature_cost.py --model resnet18 --programs 32
    python benchmarks/feature_cost.py --model bert_layer --dump /tmp/rows.npz
    python benchmarks/feature_cost.py --model bert_layer --check /tmp/rows.npz

For every task of the model: `--programs` random programs (`SketchPolicy.sample`, seed 0) and
as many tile-size children of them (`evolution.breed_one("tile_size", ...)`, seeded), the
programs the search scores in a round. Prints per task the median over `--repeat` passes of
the milliseconds `program_features` takes per program (the cyclic garbage collector paused, as
the search's workers run it, unless `--with-collector`), and the geometric mean and total over
the tasks. `--dump` writes every program's feature rows (with its key) to a file and
`--check` compares them bit for bit with such a file: a change that makes the features cheaper
must not change a single number (the shipped cost model was trained on them).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import statistics
import time

import numpy as np

from common import git_commit, machine_name


def model_tasks(name: str, target: str = "host") -> list:
    """The tasks of a named model (`ansor.pretrain.models`) for this machine's CPU or a GPU."""
    import ansor
    from ansor.graph.model_tasks import extract_tasks
    from ansor.pretrain.models import make_model

    module, inputs = make_model(name)
    graph = ansor.graph.from_torch(module.eval(), inputs)
    return extract_tasks(graph, target=ansor.Target.cuda() if target == "cuda" else None).tasks


def task_programs(task, count: int, seed: int = 0) -> list:
    """`count` sampled programs of the task and up to `count` tile-size children of them."""
    from ansor.search.evolution import breed_one
    from ansor.search.sketch_policy import SketchPolicy

    policy = SketchPolicy(task, seed=seed, params={"search_workers": 1})
    try:
        parents = policy.sample(count, set())
        rng = random.Random(seed)
        children = [breed_one("tile_size", p, None, rng, policy.params) for p in parents]
    finally:
        policy.close()
    return parents + [c for c in children if c is not None]


def time_features(states: list, target, repeat: int, collector: bool = False) -> float:
    """Median over `repeat` passes of the milliseconds per program, with the cyclic garbage
    collector paused as the search's workers pause it (`search.collector`) unless `collector`."""
    from ansor.costmodel.features import program_features
    from ansor.search.collector import collector_paused

    passes = []
    for _ in range(repeat):
        with contextlib.nullcontext() if collector else collector_paused():
            start = time.perf_counter()
            for state in states:
                program_features(state, target=target)
            passes.append((time.perf_counter() - start) * 1e3 / len(states))
    return statistics.median(passes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet18")
    p.add_argument("--target", choices=("host", "cuda"), default="host",
                   help="the tasks' target: this machine's CPU or a CUDA GPU (features need no GPU)")
    p.add_argument("--programs", type=int, default=32, help="sampled programs per task (plus their children)")
    p.add_argument("--repeat", type=int, default=3, help="timed passes over each task's programs")
    p.add_argument("--with-collector", action="store_true",
                   help="leave the cyclic garbage collector running while timing (the search pauses it)")
    p.add_argument("--dump", help="write every program's feature rows to this .npz file (no timing)")
    p.add_argument("--check", help="compare every program's feature rows with this .npz file (no timing)")
    args = p.parse_args()

    from ansor.costmodel.features import program_features

    tasks = model_tasks(args.model, args.target)
    if args.dump or args.check:
        rows: dict[str, np.ndarray] = {}
        for t, task in enumerate(tasks):
            for i, state in enumerate(task_programs(task, args.programs)):
                rows[f"{t}/{i}/{state.key()}"] = program_features(state, target=task.target)
        if args.dump:
            np.savez_compressed(args.dump, **rows)
            print(f"{len(rows)} programs of {len(tasks)} tasks written to {args.dump}")
            return
        with np.load(args.check) as saved:
            expected = {k: saved[k] for k in saved.files}
        differ = [k for k in expected if k not in rows or rows[k].shape != expected[k].shape
                  or not np.array_equal(rows[k], expected[k])]
        extra = [k for k in rows if k not in expected]
        print(f"{len(expected)} programs compared: {len(differ)} differ, {len(extra)} not in the file")
        for k in differ[:10]:
            print("  differs:", k)
        raise SystemExit(1 if differ or extra else 0)

    print(f"# feature cost: {args.model} ({args.target}), {len(tasks)} tasks, {args.programs} programs per task and "
          f"their tile-size children; collector {'running' if args.with_collector else 'paused'}; {machine_name()}; commit {git_commit()}; {time.strftime('%Y-%m-%d %H:%M')}")
    per_task = []
    for t, task in enumerate(tasks):
        states = task_programs(task, args.programs)
        ms = time_features(states, task.target, args.repeat, args.with_collector)
        per_task.append(ms)
        print(f"task {t:2d} {task.name[:40]:40s} {len(states):4d} programs {ms:7.3f} ms/program")
    geo = math.exp(statistics.fmean(math.log(x) for x in per_task))
    print(f"geometric mean {geo:.3f} ms/program; total {sum(per_task):.2f} ms (one program of each task)")


if __name__ == "__main__":
    main()
