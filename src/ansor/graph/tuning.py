"""Tuning a whole model: its distinct subgraph tasks under one task scheduler.

The model's tasks come from `extract_tasks` (the same ones `build_model` compiles), weighted by
how often each occurs, and are tuned together by `ansor.tuner.tune` with one cost model and the
gradient task scheduler by default, which spends trials where they lower the model's estimated
latency (the weighted sum of the tasks' best latencies) most.

`trials` is the budget of the whole model. A rerun with the same database resumes: the records
its tasks already hold count as spent trials, so `tune_model(g, trials=2000)` twice measures
2000 programs in all, not 4000.
"""

from __future__ import annotations

import sys
from typing import Any

from ansor.database import Database, open_database
from ansor.graph.ir import Graph
from ansor.graph.model_tasks import ModelTasks, extract_tasks
from ansor.target import Target
from ansor.tuner import TUNE_DEFAULTS, TuneResult, tune

#: fewest programs per round for a model's task: small rounds keep the scheduler responsive, but
#: below this the search's batch is too small for the cost model to rank well
MIN_MEASURES_PER_ROUND = 16


def tune_model(graph: Graph | ModelTasks, trials: int = 1000, database: Database | str | None = None,
               target: Target | None = None, scheduler: str = "gradient", resume: bool = True,
               progress: bool = True, winograd: bool = True, **options: Any) -> list[TuneResult]:
    """Tune the distinct tasks of `graph` with `trials` measurements in all (records already in
    the database for these tasks count against them when `resume`). `winograd` as in
    `build_model`. Further keyword options go to `ansor.tune` (seed, time_budget, timeout,
    policy, callbacks, ...). Returns one TuneResult per distinct task, in `extract_tasks` order."""
    model = graph if isinstance(graph, ModelTasks) else extract_tasks(graph, target, winograd=winograd)
    if not model.tasks:
        raise ValueError("tune_model: the model has no subgraph with a compiled form to tune")
    if trials < 0:
        raise ValueError(f"tune_model: trials must be >= 0, got {trials}")
    db, owned = open_database(database)
    try:
        spent = spent_trials(model, db) if resume else 0
        left = max(0, trials - spent)
        if progress and spent:
            print(f"ansor: {resume_message(model, spent, trials)}", file=sys.stderr)
        per_round = options.pop("measures_per_round", None) or max(
            MIN_MEASURES_PER_ROUND, min(TUNE_DEFAULTS["measures_per_round"], trials // len(model.tasks)))
        results = tune(model.tasks, trials=left, database=db, scheduler=scheduler,
                       task_weights=model.weights, measures_per_round=per_round, progress=progress,
                       **options)
    finally:
        if owned:
            db.close()
    return results if isinstance(results, list) else [results]


def spent_trials(model: ModelTasks, db: Database) -> int:
    """Records the database holds of the model's tasks (on their targets)."""
    return sum(db.count(t.workload_key, t.target.key) for t in model.tasks)


def resume_message(model: ModelTasks, spent: int, trials: int) -> str:
    return (f"the database holds {spent} records of this model's {len(model.tasks)} tasks; "
            f"{max(0, trials - spent)} of {trials} trials left")


def estimated_latency(model: ModelTasks, results: list[TuneResult]) -> float:
    """The model's latency as the tuner sees it: sum of weight x best latency of its tasks
    (infinite while a task has no program)."""
    return sum(w * r.best_cost for w, r in zip(model.weights, results))
