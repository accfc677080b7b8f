"""What one trial of a model's tuning costs, phase by phase, and trials per minute.

    python benchmarks/trial_cost.py --model resnet18 --time-budget 300 --json trial_cost.jsonl

Tunes the model's tasks from a fresh database (`tune_model`, the gradient scheduler, the
package's defaults) for `--time-budget` seconds or `--trials` programs and splits the wall time
into the phases every round goes through: searching (evolution with the cost model, features),
compiling (lowering, code generation, the C compiler), measuring (the checked, timed runs in the
worker), learning (refitting the cost model) and the rest (the quick lap before the scheduler's
rounds, task switching, the database). Prints trials per minute and each phase's share; the
search's and compiler's own totals come from the tuners' clocks.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict

from common import git_commit, machine_name


class PhaseClock:
    """Wall time per phase, from the `on_phase` events of every task's rounds."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._phase: str | None = None
        self._since = 0.0

    def enter(self, phase: str | None) -> None:
        now = time.perf_counter()
        if self._phase is not None:
            self.seconds[self._phase] += now - self._since
        self._phase, self._since = phase, now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--time-budget", type=float, default=300.0)
    parser.add_argument("--trials", type=int, default=100000)
    parser.add_argument("--database", help="default: a fresh file in a temporary folder")
    parser.add_argument("--json", help="append the row to this JSON-lines file")
    args = parser.parse_args()

    import ansor
    from ansor.graph.model_tasks import extract_tasks
    from ansor.graph.model_tuning import tune_model
    from ansor.pretrain.models import make_model
    from ansor.store import open_store
    from ansor.tuning.callbacks import TuningCallback

    clock = PhaseClock()

    class Phases(TuningCallback):
        def on_phase(self, tuner, phase: str) -> None:
            clock.enter(phase)

        def on_round_end(self, tuner, results) -> None:
            clock.enter("learning")  # the policy's update ran before this hook: see below

        def on_end(self, tuner) -> None:
            clock.enter(None)

    module, inputs = make_model(args.model)
    graph = ansor.graph.from_torch(module.eval(), inputs)
    model = extract_tasks(graph)
    database = args.database or os.path.join(tempfile.mkdtemp(prefix="ansor-trial-cost-"), "t.db")
    start = time.perf_counter()
    with open_store(database)[0] as store:
        results = tune_model(model, store, args.trials, time_budget=args.time_budget, callbacks=[Phases()])
    wall = time.perf_counter() - start
    trials = sum(r.trials for r in results)
    search = sum(r.search_seconds for r in results)
    learn = sum(r.model_seconds for r in results)
    measure = sum(r.measure_seconds for r in results)
    compile_and_run = {k: clock.seconds.get(k, 0.0) for k in ("compiling", "measuring")}
    rest = wall - search - learn - measure
    row = {"model": args.model, "machine": machine_name(), "commit": git_commit(), "wall_s": wall,
           "trials": trials, "trials_per_minute": 60.0 * trials / wall, "search_s": search,
           "compile_s": compile_and_run["compiling"], "measure_s": compile_and_run["measuring"],
           "learn_s": learn, "rest_s": rest, "tasks": len(model.tasks),
           "estimated_ms": 1e3 * sum(w * r.best_cost for w, r in zip(model.weights, results))}
    print(f"{args.model}: {trials} trials in {wall:.0f} s = {row['trials_per_minute']:.0f} per minute "
          f"({len(model.tasks)} tasks), machine {row['machine']}")
    for name in ("search", "compile", "measure", "learn", "rest"):
        seconds = row[f"{name}_s"]
        print(f"  {name:8s} {seconds:7.1f} s  {seconds / wall:5.1%}  {1e3 * seconds / max(trials, 1):6.0f} ms/trial")
    print(f"  estimated model latency {row['estimated_ms']:.2f} ms")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
