"""Does the tuner's estimate of a model hold? Each task's record against the same program timed
again now, and the sum against the compiled model's measured latency.

    python benchmarks/estimate_check.py --model resnet18 --database tuned.db

The tuner estimates a model's latency as the weighted sum of its tasks' best records. Three
things can part it from the model: the record was a lucky measurement among many (the fastest of
hundreds of noisy timings is biased low), the kernel runs differently inside the model than
when it is timed alone (its inputs in other caches, its outputs written to memory the model
last touched long ago), or the model spends time between its kernels. Per task this prints the
record's median, the same program timed again the way the tuner times it (inputs cycled
through copies spanning the model's data), and timed with its outputs cycled as well; then the
three sums beside the model's measured latency and the sum of its steps timed inside it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from common import machine_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--database", required=True, help="a database holding records of every task of the model")
    parser.add_argument("--rounds", type=int, default=3, help="timings of each program, in turns (default 3)")
    args = parser.parse_args()

    import ansor
    from ansor.backend import backend_for
    from ansor.graph.model_tasks import extract_tasks
    from ansor.measure.library import KernelLibrary
    from ansor.measure.timing import measure_costs
    from ansor.memory import aligned_copy
    from ansor.pretrain.models import make_model
    from ansor.replay import replay_records
    from ansor.store import open_store

    module, inputs = make_model(args.model)
    graph = ansor.graph.from_torch(module.eval(), inputs)
    model = extract_tasks(graph)
    policy = model.measured_as_in_model()
    compiled = ansor.build(graph, database=args.database, quick_seconds=0, verbose=False)
    x = [t.numpy() for t in inputs]
    for _ in range(10):
        compiled(*x)
    calls = []
    for _ in range(50):
        start = time.perf_counter()
        compiled(*x)
        calls.append(time.perf_counter() - start)
    steps = compiled.profile(*x, rounds=30)
    print(f"{args.model} from {args.database} on {machine_name()}")
    sums = {"records": 0.0, "timed again": 0.0, "outputs cycled too": 0.0}
    with open_store(args.database)[0] as store:
        for task, weight in zip(model.tasks, model.weights):
            found = list(replay_records(store.best(task.workload_key, task.target.key)[:1], task.dag))
            if not found:
                raise SystemExit(f"{task.name}: no record in {args.database}; tune the model first")
            [(record, state)] = found
            backend = backend_for(task.target)
            [program] = backend.build([state], task.target, "kernel", backend.builder(task.target))
            task_inputs = task.random_inputs(0)
            expected = task.reference_outputs(task_inputs)
            with KernelLibrary(program.build.lib_path, program.entry) as kernel:
                outputs = [aligned_copy(np.zeros_like(e)) for e in expected]
                buffers = [aligned_copy(a) for a in task_inputs] + outputs + kernel.packed_buffers()
                kernel.prepack(buffers)
                kernel(buffers)
                again, cycled = [], []
                for _ in range(args.rounds):  # in turns
                    again += measure_costs(kernel, buffers, policy, n_inputs=len(task_inputs))
                    cycled += measure_costs(kernel, buffers, policy, n_inputs=len(task_inputs) + len(outputs))
            a, c = statistics.median(again), statistics.median(cycled)
            sums["records"] += weight * record.median_cost
            sums["timed again"] += weight * a
            sums["outputs cycled too"] += weight * c
            print(f"  {task.name[:32]:32s} x{weight:g}  record {record.median_cost * 1e3:7.3f} ms  again "
                  f"{a * 1e3:7.3f} ({a / record.median_cost:4.2f}x)  outputs cycled {c * 1e3:7.3f} "
                  f"({c / record.median_cost:4.2f}x)", flush=True)
    print("sums: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sums.items())
          + f"; the model {statistics.median(calls) * 1e3:.2f} ms (fastest {min(calls) * 1e3:.2f}), "
          f"its steps timed inside it {sum(s[2] for s in steps) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
