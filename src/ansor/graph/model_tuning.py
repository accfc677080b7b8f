"""Tuning a whole model: its distinct subgraph tasks under one task scheduler.

The model's tasks come from `extract_tasks` (the same ones `build_model` compiles), weighted by
how often each occurs, and are tuned together by `ansor.tuning.job.tune` with one cost model and the
gradient task scheduler by default, which spends trials where they lower the model's estimated
latency (the weighted sum of the tasks' best latencies) most.

`trials` is the number of programs this job measures across the model's tasks, as for a task's
`tune`. A rerun with the same database resumes: programs the store holds are never measured
again and the model learns from them; `count_existing=True` makes `trials` a budget for the
whole model instead (records its tasks hold count as spent, so `tune_model(g, s, 2000,
count_existing=True)` twice measures 2000 programs in all).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ansor.graph.ir import Graph
from ansor.graph.model_tasks import ModelTasks, extract_tasks
from ansor.records import RecordStore
from ansor.target import Target
from ansor.tuning.callbacks import TuningCallback
from ansor.tuning.job import tune
from ansor.tuning.options import TuneOptions
from ansor.tuning.quick import MODEL_QUICK_LAP, quick_search_tasks, tasks_without_records
from ansor.tuning.task_tuner import TuneResult

#: Trials a job plans its rounds for when only a time budget bounds it (`trials=None`).
PLANNED_TRIALS = 1000
#: What `trials=None` stands for: no limit but the time budget.
UNLIMITED_TRIALS = 10**9
#: fewest programs per round for a model's task: small rounds keep the scheduler responsive, but
#: below this the search's batch is too small for the cost model to rank well
MIN_MEASURES_PER_ROUND = 16


def tune_model(graph: Graph | ModelTasks, store: RecordStore, trials: int | None = 1000, target: Target | None = None,
               count_existing: bool = False, winograd: bool = True, callbacks: Sequence[TuningCallback] = (),
               notify: Callable[[str], None] | None = None, **options: Any) -> list[TuneResult]:
    """Tune the distinct tasks of `graph` with `trials` measurements in all (records already in
    the store for these tasks count against them with `count_existing`). `winograd` as in
    `build_model`. Further keyword options are `TuneOptions` (seed, time_budget, timeout,
    policy, ...; the scheduler is "gradient" unless given). `notify` receives a line when the
    job resumes. Returns one TuneResult per distinct task, in `extract_tasks` order.

    Tasks without a record start with a lap of the quick search (`quick_search_tasks`: each
    task's default schedule and the cost model's picks, MODEL_QUICK_LAP programs each, fewer
    when `trials` is smaller than that lap) before the scheduler spends the rest where it
    pays: a small budget covers the whole model, and no task is left on its default schedule
    while another gets a second round. `trials=None` with a `time_budget`: as many as the
    time allows."""
    model = graph if isinstance(graph, ModelTasks) else extract_tasks(graph, target, winograd=winograd)
    if not model.tasks:
        raise ValueError("tune_model: the model has no subgraph with a compiled form to tune")
    if trials is None:
        if options.get("time_budget") is None:
            raise ValueError("tune_model: give trials, a time_budget, or both")
        trials, count_existing, planned = None, False, PLANNED_TRIALS
    elif trials < 0:
        raise ValueError(f"tune_model: trials must be >= 0, got {trials}")
    else:
        planned = trials
    spent = spent_trials(model, store)
    if notify is not None and spent:
        notify(resume_message(model, spent, trials, count_existing))
    if not count_existing:
        spent = 0
    if trials is None:
        trials = UNLIMITED_TRIALS
    options.setdefault("scheduler", "gradient")
    options.setdefault("timing", model.measured_as_in_model())
    options.setdefault("measures_per_round", max(
        MIN_MEASURES_PER_ROUND, min(TuneOptions.measures_per_round, planned // len(model.tasks))))
    left = max(0, trials - spent)
    started = time.time()
    missing = tasks_without_records(model.tasks, store) if left else []
    warm: list[TuneResult] = []
    if missing and options.get("policy", "sketch.xgb") == "sketch.xgb":
        per_task = max(1, min(MODEL_QUICK_LAP, left // len(missing)))
        warm = quick_search_tasks(missing, store, options.get("time_budget"), per_task,
                                  seed=options.get("seed") or 0, callbacks=callbacks,
                                  cluster=options.get("cluster"),
                                  timing=options["timing"])
        left = max(0, left - sum(r.trials for r in warm))
        if options.get("time_budget") is not None:
            options["time_budget"] = max(1e-3, options["time_budget"] - (time.time() - started))
    opts = TuneOptions.from_keywords(trials=left, task_weights=model.weights, **options)
    results = tune(model.tasks, opts, store, callbacks)
    results = results if isinstance(results, list) else [results]
    first = {id(r.task): r for r in warm}
    return [first[id(r.task)].then(r) if id(r.task) in first else r for r in results]


def spent_trials(model: ModelTasks, db: RecordStore) -> int:
    """Records the database holds of the model's tasks (on their targets)."""
    return sum(db.count(t.workload_key, t.target.key) for t in model.tasks)


def resume_message(model: ModelTasks, spent: int, trials: int | None, count_existing: bool = False) -> str:
    """What a resumed job says before it starts (`trials` None: bounded by its time budget)."""
    held = f"the database holds {spent} records of this model's {len(model.tasks)} tasks (never measured again)"
    if trials is None:
        return f"{held}; this run measures as many more as its time budget allows"
    if count_existing:
        return f"{held}; {max(0, trials - spent)} of {trials} trials left"
    return f"{held}; this run measures {trials} more"


def estimated_latency(model: ModelTasks, results: list[TuneResult]) -> float:
    """The model's latency as the tuner sees it: sum of weight x best latency of its tasks
    (infinite while a task has no program)."""
    return sum(w * r.best_cost for w, r in zip(model.weights, results))
