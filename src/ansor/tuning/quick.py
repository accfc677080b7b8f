"""Good programs without tuning: a workload with no record gets a program the cost model chose.

`ansor.build(task)` used to give a workload nobody had tuned a fixed default schedule, often
tens of times slower than a tuned one. Now it runs one short search instead: the cost model
(the package's pretrained model, continued on the database's other workloads when it has
some) ranks candidates that a small evolutionary search proposes, the few best are compiled
and measured (correctness checked, as always) beside the default schedule, recorded, and the
fastest is built. Rounds of 4, 4 and 8 programs (the model is refitted on each round's
measurements before it picks the next: `tuning.job.FIRST_ROUND`), seconds in all; the records make
the next build (and a later `tune`) start from them.
"""

from __future__ import annotations

import os
import warnings
from typing import Sequence

from ansor.records import RecordStore
from ansor.kernel import Kernel
from ansor.kernel import build as build_kernel
from ansor.measure import TimingPolicy
from ansor.measure.errors import DeviceUnavailableError
from ansor.replay import replay_records
from ansor.schedule.state import State
from ansor.search.basic import default_schedule
from ansor.search.params import SearchParams
from ansor.search.sketch_policy import SketchPolicy
from ansor.task import Task
from ansor.tuning.callbacks import TuningCallback
from ansor.tuning.job import tune
from ansor.tuning.options import TuneOptions
from ansor.tuning.task_tuner import TuneResult
from ansor.tuning.transfer import shared_cost_model

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


def has_record(task: Task, db: RecordStore) -> bool:
    """Whether the database holds a program of the task that replays."""
    return any(True for _ in replay_records(db.best(task.workload_key, task.target.key, k=5), task.dag))


def quick_search(task: Task, store: RecordStore, trials: int = QUICK_TRIALS, seed: int = 0,
                 pretrained: bool | None = None, time_budget: float | None = QUICK_SECONDS,
                 callbacks: Sequence[TuningCallback] = ()) -> None:
    """Measure and record in `store` the `trials` programs the cost model ranks best (see the
    module), fewer when `time_budget` seconds run out first (None: no limit);
    `pretrained=False` leaves the package's model out (for comparisons; None: the default of
    `tune`)."""
    model = shared_cost_model([task], store, seed, TuneOptions.transfer_programs, pretrained)
    policy = SketchPolicy(task, seed, params=QUICK_SEARCH, cost_model=model)
    # The default schedule is one of the candidates: the quick build is never slower than it.
    # One small job, so its rounds grow (4, 4, 8) like any small job of `tune`'s; against two
    # rounds of 8 the gain is within the run-to-run spread (BENCHMARKS.md).
    options = TuneOptions(trials=trials, policy=policy, measures_per_round=max(1, trials), confirm_best=0,
                          first_programs=[default_schedule(task)], time_budget=time_budget)
    tune(task, options, store, callbacks)


def build_task(task: Task, store: RecordStore | None = None, state: State | None = None,
               quick_trials: int = QUICK_TRIALS, quick_seconds: float | None = QUICK_SECONDS) -> Kernel:
    """The task's fastest program in `store`, compiled. With no record, a quick search of
    `quick_trials` measured programs first, recorded in the store (0: the untuned default
    schedule, nothing measured), which starts no new round after `quick_seconds` (None: no
    limit)."""
    if state is not None:
        return build_kernel(task, state=state)
    if quick_trials < 0:
        raise ValueError(f"quick_trials must be >= 0, got {quick_trials}")
    if store is not None and quick_trials and not has_record(task, store):
        try:
            quick_search(task, store, quick_trials, time_budget=quick_seconds)
        except DeviceUnavailableError as err:  # nothing can be measured here: build untuned
            warnings.warn(f"{task.name or 'the task'}: no quick search ({err}); building the "
                          f"untuned default schedule", stacklevel=2)
    return build_kernel(task, store)


#: Seconds a model build spends, in all, choosing programs for its tasks without records (the
#: first build of a model; `quick_seconds=` changes it, 0 builds them untuned). Each task gets
#: its default schedule and the model's picks in turn, so when time runs out every task
#: measured so far has a chosen program and the rest keep their default schedule.
MODEL_QUICK_SECONDS = 120.0
#: Programs per task in a model's quick build at most: its default schedule and the model's 3
#: best, then (time allowing) laps of 4 more chosen by the model refitted on every task's
#: timings. A large model's build runs out of seconds after one or two laps; a small one
#: keeps improving its tasks until its seconds are spent instead of stopping early with
#: programs picked on two laps of timings (BENCHMARKS.md, "A model's first build").
MODEL_QUICK_PROGRAMS = 48
#: Programs per task in one lap over the model's tasks.
MODEL_QUICK_LAP = 4
#: A smaller search per task than a single workload's quick build: a model has tens of tasks
#: and one time budget.
#: 256 x 2 sits between a search that dominates the build and one that picks poorly (both
#: measured in BENCHMARKS.md, "A model's first build").
#: After the first lap, one program in four is a random one (eps-greedy): a pretrained model can
#: rank a whole region of a task's space first (one-row register tiles of a 197-token linear,
#: BENCHMARKS.md), and its refits on those programs alone never show it anything better.
MODEL_QUICK_SEARCH = SearchParams(evolutionary_search_population=256, evolutionary_search_num_iters=2,
                                  sample_init_min_population=32, eps_greedy=0.25)


def tasks_without_records(tasks: Sequence[Task], store: RecordStore) -> list[Task]:
    """The tasks whose store holds no program that replays."""
    return [t for t in tasks if not has_record(t, store)]


def quick_search_tasks(tasks: Sequence[Task], store: RecordStore, seconds: float | None = MODEL_QUICK_SECONDS,
                       programs_per_task: int = MODEL_QUICK_PROGRAMS, seed: int = 0,
                       callbacks: Sequence[TuningCallback] = (),
                       timing: TimingPolicy | None = None,
                       cluster: str | None = None) -> list[TuneResult]:
    """Choose and record programs for several tasks at once, laps of MODEL_QUICK_LAP programs
    per task in turn (the first lap: each task's default schedule and the cost model's
    best; later laps: the model refitted on every task's timings, one model for all), until
    `programs_per_task` each or `seconds` (None: no limit). `timing`: how the kernels are
    timed (a model's tasks: as in the model, `ModelTasks.measured_as_in_model`). Returns the
    job's results."""
    if not tasks or programs_per_task <= 0 or (seconds is not None and seconds <= 0):
        return []
    # the costliest first: when time runs out, what is left untuned is what matters least
    tasks = sorted(tasks, key=lambda t: -t.flop)
    options = TuneOptions(trials=programs_per_task * len(tasks),
                          measures_per_round=min(MODEL_QUICK_LAP, programs_per_task),
                          scheduler="round-robin", confirm_best=0, time_budget=seconds, seed=seed,
                          default_first=True, search_params=MODEL_QUICK_SEARCH, timing=timing,
                          cluster=cluster)
    results = tune(list(tasks), options, store, callbacks)
    return results if isinstance(results, list) else [results]


def model_quick_seconds() -> float:
    """The default time of a model build's quick search: $ANSOR_MODEL_QUICK_SECONDS when set
    (0 turns it off, as the test suite does), else MODEL_QUICK_SECONDS."""
    text = os.environ.get("ANSOR_MODEL_QUICK_SECONDS")
    if text is None or not text.strip():
        return MODEL_QUICK_SECONDS
    try:
        return max(0.0, float(text))
    except ValueError:
        raise ValueError(f"ANSOR_MODEL_QUICK_SECONDS={text!r} is not a number of seconds") from None
