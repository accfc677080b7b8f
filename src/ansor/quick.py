"""Good programs without tuning: a workload with no record gets a program the cost model chose.

`ansor.build(task)` used to give a workload nobody had tuned a fixed default schedule, often
tens of times slower than a tuned one. Now it runs one short search instead: the cost model
(the package's pretrained model, continued on the database's other workloads when it has
some) ranks candidates that a small evolutionary search proposes, the few best are compiled
and measured (correctness checked, as always) beside the default schedule, recorded, and the
fastest is built. Rounds of 4, 4 and 8 programs (the model is refitted on each round's
measurements before it picks the next: `tuner.FIRST_ROUND`), seconds in all; the records make
the next build (and a later `tune`) start from them.
"""

from __future__ import annotations

import warnings

from ansor.database import Database, open_database
from ansor.kernel import Kernel
from ansor.kernel import build as build_kernel
from ansor.measure.errors import DeviceUnavailableError
from ansor.replay import replay_records
from ansor.schedule.state import State
from ansor.search.basic import default_schedule
from ansor.search.params import SearchParams
from ansor.search.sketch_policy import SketchPolicy
from ansor.task import Task
from ansor.tuner import TUNE_DEFAULTS, shared_cost_model, tune

#: Programs measured when a workload has no record (0: the plain default schedule instead).
QUICK_TRIALS = 16
#: Seconds after which a quick search starts no new round (the one under way still measures up
#: to this deadline): a slower machine measures fewer programs rather than miss the promise of
#: a kernel in about half a minute (round and build times: BENCHMARKS.md).
QUICK_SECONDS = 20.0
#: A smaller evolutionary search than tuning's (2048 x 4): the model is all that guides it here,
#: and the point is to answer in seconds. 1024 programs rather than 512 and four generations
#: rather than two: each gave better picks on held-out workloads (softmax the first, depthwise's
#: worst seed the second) for a few seconds more (BENCHMARKS.md).
QUICK_SEARCH = SearchParams(evolutionary_search_population=1024, evolutionary_search_num_iters=4,
                            sample_init_min_population=32, eps_greedy=0.0)


def has_record(task: Task, db: Database) -> bool:
    """Whether the database holds a program of the task that replays."""
    return any(True for _ in replay_records(db.best(task.workload_key, task.target.key, k=5), task.dag))


def quick_search(task: Task, database: Database | str | None = None, trials: int = QUICK_TRIALS,
                 seed: int = 0, progress: bool = False, pretrained: bool | None = None,
                 time_budget: float | None = QUICK_SECONDS) -> None:
    """Measure and record the `trials` programs the cost model ranks best (see the module),
    fewer when `time_budget` seconds run out first (None: no limit); `pretrained=False` leaves
    the package's model out (for comparisons; None: the default of `tune`)."""
    db, owned = open_database(database)
    try:
        model = shared_cost_model([task], db, seed, TUNE_DEFAULTS["transfer_programs"], pretrained)
        policy = SketchPolicy(task, seed, params=QUICK_SEARCH, cost_model=model)
        # The default schedule is one of the candidates: the quick build is never slower than it.
        # One small job, so its rounds grow (4, 4, 8) like any small job of `tune`'s; against two
        # rounds of 8 the gain is within the run-to-run spread (BENCHMARKS.md).
        tune(task, trials=trials, database=db, policy=policy, measures_per_round=trials,
             progress=progress, confirm_best=0, first_programs=[default_schedule(task)],
             time_budget=time_budget)
    finally:
        if owned:
            db.close()


def build_task(task: Task, database: Database | str | None = None, state: State | None = None,
               quick_trials: int = QUICK_TRIALS, quick_seconds: float | None = QUICK_SECONDS) -> Kernel:
    """The task's fastest recorded program, compiled. With no record, a quick search of
    `quick_trials` measured programs first (0: the untuned default schedule, nothing measured),
    which starts no new round after `quick_seconds` (None: no limit)."""
    if state is not None:
        return build_kernel(task, state=state)
    if quick_trials < 0:
        raise ValueError(f"quick_trials must be >= 0, got {quick_trials}")
    db, owned = open_database(database)
    try:
        if quick_trials and not has_record(task, db):
            try:
                quick_search(task, db, quick_trials, time_budget=quick_seconds)
            except DeviceUnavailableError as err:  # nothing can be measured here: build untuned
                warnings.warn(f"{task.name or 'the task'}: no quick search ({err}); building the "
                              f"untuned default schedule", stacklevel=2)
        return build_kernel(task, db)
    finally:
        if owned:
            db.close()
