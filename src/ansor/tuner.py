"""tune(): the measurement loop that drives a search policy and fills the database."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ansor.database import Database, default_database_path
from ansor.measure import TimingPolicy
from ansor.measurer import ProgramMeasurer
from ansor.search.policy import SearchPolicy
from ansor.target import Target
from ansor.task import Task

TUNE_DEFAULTS = {
    "measures_per_round": 64,  # programs compiled and measured per round (the batch)
    "timeout": 10.0,           # seconds a kernel may run before it counts as hung
    "confirm_best": 4,         # programs measured again at the end of a job (not counted as trials):
                               # the fastest of many noisy measurements is often a lucky one
    "transfer_programs": 4000, # measured programs of the database's other workloads (same target)
                               # that the cost model starts from; 0: learn from this task alone
}
MIN_TRANSFER_PROGRAMS = 64     # fewer than this: not worth starting from


@dataclass
class TuneResult:
    """What one tuning job found: the best cost and the tuning curve."""

    task: Task
    best_cost: float = math.inf              # seconds (median of repeats)
    trials: int = 0                          # programs measured by this job
    errors: int = 0
    curve: list[tuple[int, float]] = field(default_factory=list)  # (trial, best GFLOP/s so far)
    best_steps: list | None = None
    seconds: float = 0.0
    search_seconds: float = 0.0    # choosing programs (sampling, evolution, features, prediction)
    measure_seconds: float = 0.0   # code generation, compilation, checking and timing
    model_seconds: float = 0.0     # retraining the cost model on each measured batch

    @property
    def best_gflops(self) -> float:
        return self.task.flop / self.best_cost / 1e9 if self.best_cost < math.inf else 0.0


def open_database(database: Database | str | None) -> tuple[Database, bool]:
    """(database, whether the caller owns it and must close it)."""
    if isinstance(database, Database):
        return database, False
    return Database(database if database is not None else default_database_path()), True


POLICIES = ("sketch.xgb", "sketch.random", "basic")


def model_path(db: Database, target_key: str) -> Path | None:
    """Where the cost model of a database's target lives: beside the database file."""
    if str(db.path) == ":memory:":
        return None
    p = Path(db.path)
    return p.with_name(f"{p.stem}.{target_key}.costmodel.json")


def make_policy(policy: str | SearchPolicy, task: Task, seed: int | None, cost_model=None) -> SearchPolicy:
    """A policy object from its name: 'sketch.xgb' is Ansor's full search (sketches, evolution,
    learned cost model); 'sketch.random' samples the sketch space at random; 'basic' is the
    first, template-like random search (kept for comparison)."""
    if isinstance(policy, SearchPolicy):
        return policy
    if policy in ("sketch.xgb", "sketch.random"):
        from ansor.search.sketch_policy import SketchPolicy

        if policy == "sketch.xgb" and cost_model is None:
            from ansor.costmodel.model import XGBModel

            cost_model = XGBModel(seed=seed if seed is not None else 43)
        return SketchPolicy(task, seed, cost_model=cost_model if policy == "sketch.xgb" else None)
    if policy == "basic":
        from ansor.search.basic import RandomSearchPolicy

        return RandomSearchPolicy(task, seed)
    raise ValueError(f"unknown search policy {policy!r}; available: {', '.join(POLICIES)}")


def tune(tasks: Task | Sequence[Task], trials: int = 200, database: Database | str | None = None,
         target: Target | None = None, timeout: float = TUNE_DEFAULTS["timeout"], seed: int | None = None,
         policy: str | SearchPolicy = "sketch.xgb", measures_per_round: int = TUNE_DEFAULTS["measures_per_round"],
         timing: TimingPolicy | None = None, progress: bool = True,
         callback: Callable[[TuneResult], None] | None = None,
         confirm_best: int = TUNE_DEFAULTS["confirm_best"],
         transfer_programs: int = TUNE_DEFAULTS["transfer_programs"]) -> TuneResult | list[TuneResult]:
    """Search for fast programs of one task, or of several (which for now split the trial
    budget evenly, in order; Ansor's gradient task scheduler is not built yet).

    Records are committed to the database after every round, so an interrupted job loses at
    most one round, and programs already in the database are never measured again by the
    search; at the end, the `confirm_best` fastest are measured once more (not counted as
    trials) and the best is decided on all their measurements.

    With the full tuner, the cost model first learns from up to `transfer_programs` measured
    programs of the database's other workloads on the same target, so that even the first
    batch is chosen by a model rather than at random.
    """
    single = isinstance(tasks, Task)
    task_list = [tasks] if single else list(tasks)
    if not task_list:
        raise ValueError("tune: give at least one task")
    if trials < 0:
        raise ValueError(f"tune: trials must be >= 0, got {trials}")
    if target is not None:
        for t in task_list:
            t.target = target
    db, owned = open_database(database)
    try:
        results = [TuneResult(t) for t in task_list]
        budgets = _split_budget(trials, len(task_list))
        for t, res, budget in zip(task_list, results, budgets):
            task_policy = policy if single or isinstance(policy, str) else "sketch.xgb"
            _tune_one(t, res, budget, db, timeout, seed, task_policy, measures_per_round,
                      timing, progress, callback, confirm_best, transfer_programs)
    finally:
        if owned:
            db.close()
    return results[0] if single else results


def _split_budget(trials: int, n: int) -> list[int]:
    base, extra = divmod(trials, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _confirm_best(task: Task, res: TuneResult, db: Database, measurer: ProgramMeasurer, k: int) -> None:
    """Measure the k best programs once more, back to back, so that they are compared with
    each other under the same conditions; the database pools every measurement of a program,
    and the job's best is read back from it. The tuning curve keeps what was seen during the
    search."""
    from ansor.schedule.state import ScheduleError, State
    from ansor.schedule.steps import steps_from_json

    states = []
    for rec in db.best(task.workload_key, task.target.key, k=k):
        try:
            states.append(State.replay(task.dag, steps_from_json(rec.steps)))
        except ScheduleError:
            continue
    if not states:
        return
    measurer.measure(states)
    best = db.best(task.workload_key, task.target.key)
    if best:
        res.best_cost = best[0].median_cost
        res.best_steps = best[0].steps


def transfer_model(task: Task, db: Database, seed: int | None, max_programs: int):
    """An XGBModel that has learned from the database's other workloads on the task's target
    (at most `max_programs` programs, the most recent of each workload in equal shares);
    None when there are fewer than MIN_TRANSFER_PROGRAMS."""
    from ansor.costmodel.dataset import load_dataset
    from ansor.costmodel.model import XGBModel

    others = [wk for wk in db.workload_keys() if wk != task.workload_key]
    if max_programs <= 0 or not others:
        return None
    data = load_dataset(db, task.target.key, exclude_workloads={task.workload_key},
                        max_per_workload=max(1, max_programs // len(others)))
    if len(data.costs) < MIN_TRANSFER_PROGRAMS:
        return None
    model = XGBModel(seed=seed if seed is not None else 43)
    model.set_prior(data.features, data.costs, data.groups)
    return model


def _tune_one(task: Task, res: TuneResult, budget: int, db: Database, timeout: float, seed: int | None,
              policy: str | SearchPolicy, per_round: int, timing: TimingPolicy | None, progress: bool,
              callback, confirm_best: int, transfer_programs: int) -> None:
    from ansor.report import TuneProgress

    start = time.time()
    model_file = model_path(db, task.target.key)
    cost_model = None
    if policy == "sketch.xgb":
        cost_model = transfer_model(task, db, seed, transfer_programs)
    if cost_model is None and policy == "sketch.xgb" and model_file is not None and model_file.exists():
        from ansor.costmodel.model import XGBModel

        try:
            cost_model = XGBModel.load(model_file)
        except (OSError, ValueError):
            cost_model = None  # an unreadable model is retrained from the records
    pol = make_policy(policy, task, seed, cost_model)
    measured = db.measured_state_keys(task.workload_key, task.target.key)
    if measured:
        pol.preload(db.records(task.workload_key, task.target.key))
    prior = db.best(task.workload_key, task.target.key)
    if prior:
        res.best_cost = prior[0].median_cost
        res.best_steps = prior[0].steps
    measurer = ProgramMeasurer(task, db, timeout=timeout, timing=timing, seed=0)
    try:
        with TuneProgress(task, budget, enabled=progress) as bar:
            if cost_model is not None and getattr(cost_model, "num_prior", 0):
                bar.note(f"cost model starts from {cost_model.num_prior} measured programs of other "
                         f"workloads in the database")
            while res.trials < budget:
                t0 = time.perf_counter()
                states = pol.next_batch(min(per_round, budget - res.trials), measured)
                t1 = time.perf_counter()
                res.search_seconds += t1 - t0
                if not states:
                    bar.note("search space exhausted")
                    break
                batch = measurer.measure(states)
                t2 = time.perf_counter()
                res.measure_seconds += t2 - t1
                for r in batch:
                    res.trials += 1
                    measured.add(r.record.state_key)
                    if not r.ok:
                        res.errors += 1
                    elif r.cost < res.best_cost:
                        res.best_cost = r.cost
                        res.best_steps = r.record.steps
                    res.curve.append((res.trials, res.best_gflops))
                pol.update(batch)
                res.model_seconds += time.perf_counter() - t2
                bar.update(res)
                if callback is not None:
                    callback(res)
            if res.trials and confirm_best > 0:
                _confirm_best(task, res, db, measurer, confirm_best)
                bar.update(res)
    finally:
        measurer.close()
        pol.close()
        res.seconds = time.time() - start
        model = getattr(pol, "cost_model", None)
        if model is not None and model_file is not None and hasattr(model, "save"):
            model.save(model_file)
