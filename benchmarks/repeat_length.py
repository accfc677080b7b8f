"""How long a timed repeat must last: the spread of a model's kernels at several repeat lengths.

    python benchmarks/repeat_length.py --database TUNED.db [--model resnet18] [--lengths 50,25,12]

Takes the two best programs of a few of the model's tasks from a database that tuned it, and
times each of them `--rounds` times with every repeat length in turn (as a search times them:
inputs cycled out of the caches as in the model, three repeats, the median kept). Prints, per
program and length, the median over the rounds, the coefficient of variation of the rounds'
medians and the wall time one program's timing took. A length whose spread is no larger than
the longer ones' picks programs as well, for less of the search's time.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from common import git_commit, machine_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", required=True, help="a database holding records of the model's tasks")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--tasks", default="0,5,9,14,20", help="indices into the model's tasks")
    parser.add_argument("--lengths", default="50,25,12", help="repeat lengths in ms")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()

    import ansor
    from ansor.graph.model_tasks import extract_tasks
    from ansor.pretrain.models import make_model
    from ansor.replay import replay_records
    from ansor.store import open_store
    from ansor.tuning.measurer import ProgramMeasurer

    module, inputs = make_model(args.model)
    model = extract_tasks(ansor.graph.from_torch(module.eval(), inputs))
    base = model.measured_as_in_model()
    lengths = [float(x) for x in args.lengths.split(",")]
    print(f"# {machine_name()}, commit {git_commit()}, {time.strftime('%Y-%m-%d %H:%M')}; {args.rounds} rounds; "
          f"repeat lengths {lengths} ms")
    with open_store(args.database)[0] as db:
        for index in (int(x) for x in args.tasks.split(",")):
            task = model.tasks[index]
            states = [st for _, st in replay_records(db.best(task.workload_key, task.target.key, k=2), task.dag)]
            if not states:
                print(f"{task.name}: no records")
                continue
            # the full policy each time (search_repeat_ms=0), with the length under test as its own
            measurers = {ms: ProgramMeasurer(task, timing=dataclasses.replace(base, min_repeat_ms=ms),
                                             one_repeat_factor=0, search_repeat_ms=0) for ms in lengths}
            costs = {ms: [] for ms in lengths}
            seconds = dict.fromkeys(lengths, 0.0)
            try:
                for _ in range(args.rounds):
                    for ms, measurer in measurers.items():
                        start = time.perf_counter()
                        costs[ms].append([r.cost for r in measurer.measure(states)])
                        seconds[ms] += time.perf_counter() - start
            finally:
                for measurer in measurers.values():
                    measurer.close()
            for ms in lengths:
                cells = []
                for k in range(len(states)):
                    runs = [c[k] for c in costs[ms]]
                    cells.append(f"program {k}: median {1e6 * statistics.median(runs):7.1f} us, "
                                 f"cv {statistics.pstdev(runs) / statistics.mean(runs):.3f}")
                per_program = 1e3 * seconds[ms] / args.rounds / len(states)
                print(f"{task.name:28s} {ms:4.0f} ms repeats: {' | '.join(cells)} | {per_program:4.0f} ms per program")


if __name__ == "__main__":
    main()
