"""tune(): one or several tasks tuned together, every measured program committed at once.

The job is a few objects: one `TaskTuner` per task (its policy, measurer and result), one cost
model shared by the tasks of a target, a `TaskScheduler` that picks whose round runs next, and
callbacks that write records and draw progress. A rerun of the same job resumes: programs in the
database are never measured again and the model learns from them first.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from ansor.callbacks import RecordToDatabase, RoundCallback, TuningCallback
from ansor.costmodel.model import CostModel
from ansor.database import Database, open_database
from ansor.measure import TimingPolicy, check_compiler
from ansor.measurer import ProgramMeasurer
from ansor.replay import replay_records
from ansor.schedule.state import State
from ansor.search.policy import SearchPolicy
from ansor.search.retarget import retarget_vector_width
from ansor.search.scheduler import TaskScheduler, make_scheduler
from ansor.target import Target
from ansor.task import Task
from ansor.task_tuner import TaskTuner, TuneResult, spread

__all__ = ["TUNE_DEFAULTS", "POLICIES", "TuneResult", "tune", "transfer_model", "make_policy",
           "open_database", "model_path", "shared_cost_model"]

TUNE_DEFAULTS = {
    "measures_per_round": 64,  # programs compiled and measured per round (the batch)
    "timeout": 10.0,           # seconds a kernel may run before it counts as hung
    "confirm_best": 4,         # programs measured again at the end of a job (not counted as trials):
                               # the fastest of many noisy measurements is often a lucky one
    "transfer_programs": 4000, # measured programs of the database's other workloads (same target)
                               # that the cost model starts from; 0: learn from the job's tasks alone
    "pretrained": None,        # fits continue from the package's pretrained model (when it has one
                               # for the target's kind); None: yes unless ANSOR_PRETRAINED=0
}
SMALL_JOB = 32                 # trials: a job this small measures in growing rounds (_ramped_round)
FIRST_ROUND = 4                # programs in the first of them; larger jobs keep full rounds, whose
                               # one search each costs less than the extra refits gain there
                               # (both measured in BENCHMARKS.md)
MIN_TRANSFER_PROGRAMS = 64     # fewer than this: not worth starting from
TRANSFER_CANDIDATES = 8        # best programs of another target measured first (transfer_from)

POLICIES = ("sketch.xgb", "sketch.random", "basic")


def model_path(db: Database, target_key: str) -> Path | None:
    """Where the cost model of a database's target lives: beside the database file."""
    if str(db.path) == ":memory:":
        return None
    p = Path(db.path)
    return p.with_name(f"{p.stem}.{target_key}.costmodel.json")


def make_policy(policy: str | SearchPolicy, task: Task, seed: int | None,
                cost_model: CostModel | None = None) -> SearchPolicy:
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


def transfer_model(tasks: Task | Sequence[Task], db: Database, seed: int | None, max_programs: int,
                   base: Any = None, from_targets: Sequence[str] = ()):
    """An XGBModel that has learned from the database's workloads other than `tasks`' on their
    target (at most `max_programs` programs, the most recent of each workload in equal shares),
    and from every workload's records on the targets `from_targets` (keys; featurized as the
    programs would run on the tasks' target), continuing from the `base` booster if given;
    None when there are fewer than MIN_TRANSFER_PROGRAMS."""
    from ansor.costmodel.dataset import Dataset, load_dataset
    from ansor.costmodel.model import XGBModel

    task_list = [tasks] if isinstance(tasks, Task) else list(tasks)
    target = task_list[0].target
    own = {t.workload_key for t in task_list}
    others = [wk for wk in db.workload_keys() if wk not in own]
    data = Dataset()
    if max_programs > 0 and others:
        data = load_dataset(db, target.key, exclude_workloads=own,
                            max_per_workload=max(1, max_programs // len(others)), feature_target=target)
    for key in from_targets:
        part = load_dataset(db, key, feature_target=target, group_prefix=f"{key}/")
        data.features += part.features
        data.costs += part.costs
        data.groups += part.groups
    if len(data.costs) < MIN_TRANSFER_PROGRAMS:
        return None
    model = XGBModel(seed=seed if seed is not None else 43, base=base)
    model.set_prior(data.features, data.costs, data.groups)
    return model


def shared_cost_model(tasks: Sequence[Task], db: Database, seed: int | None,
                       transfer_programs: int, pretrained: bool | None = None,
                       from_targets: Sequence[str] = ()) -> CostModel:
    """The one model of a target's tasks: from the database's other workloads (continuing from
    the pretrained model), else the model saved beside the database by the last job, else the
    pretrained model, else a fresh one."""
    from ansor.costmodel.model import XGBModel
    from ansor.costmodel.pretrained import enabled_by_default, load_pretrained

    if pretrained is None:
        pretrained = enabled_by_default()
    shipped = load_pretrained(tasks[0].target, seed if seed is not None else 43) if pretrained else None
    base = shipped.base if shipped is not None else None
    model = transfer_model(tasks, db, seed, transfer_programs, base=base, from_targets=from_targets)
    if model is not None:
        return model
    saved = model_path(db, tasks[0].target.key)
    if saved is not None and saved.exists():
        try:
            restored = XGBModel.load(saved)
            restored.base = base  # its later fits continue from the pretrained trees too
            return restored
        except (OSError, ValueError):
            pass  # an unreadable model is retrained from the records
    return shipped if shipped is not None else XGBModel(seed=seed if seed is not None else 43)


def tune(tasks: Task | Sequence[Task], trials: int = 200, database: Database | str | None = None,
         target: Target | None = None, timeout: float = TUNE_DEFAULTS["timeout"], seed: int | None = None,
         policy: str | SearchPolicy = "sketch.xgb", measures_per_round: int = TUNE_DEFAULTS["measures_per_round"],
         timing: TimingPolicy | None = None, progress: bool = True,
         callback: Callable[[TuneResult], None] | None = None,
         confirm_best: int = TUNE_DEFAULTS["confirm_best"],
         transfer_programs: int = TUNE_DEFAULTS["transfer_programs"],
         time_budget: float | None = None, scheduler: str | TaskScheduler = "round-robin",
         callbacks: Sequence[TuningCallback] = (),
         task_weights: Sequence[float] | None = None,
         pretrained: bool | None = TUNE_DEFAULTS["pretrained"],
         transfer_from: Target | str | Sequence[Target | str] = (),
         first_programs: Sequence[State] = ()) -> TuneResult | list[TuneResult]:
    """Search for fast programs of one task, or of several tasks together.

    `trials` programs are measured in all (across the tasks); with `time_budget` (seconds) the
    search also stops when the time is up (the leaders' confirmation runs after it). Several
    tasks take rounds in the order the `scheduler` picks, and the tasks of one target share one
    cost model. Every measured program is committed to the database as soon as it is measured,
    so an interrupt (KeyboardInterrupt, raised on to the caller with `.results` holding the
    partial results) loses nothing measured; a rerun skips what the database holds. At the
    end the `confirm_best` fastest programs of each task are measured once more (not counted
    as trials) and the best is decided on all their runs.

    The full tuner's model first learns from up to `transfer_programs` measured programs of the
    database's other workloads on the same target, so that even the first batch is chosen by a
    model rather than at random; with `pretrained` (the default, unless the environment sets
    ANSOR_PRETRAINED=0) its fits continue from the package's pretrained model, which also ranks
    the first batch of a fresh database.
    `callback(result)` is called after every round.
    `task_weights` (one per task, default 1) say how often each task occurs in the whole model;
    the "gradient" scheduler minimises the sum of weight x latency.

    `transfer_from` names other targets (Targets or their keys: another machine whose records
    were imported, the same machine restricted to AVX2 or to one core) whose records in the
    database the job starts from: the cost model learns from all of them, and each task's
    best programs there are measured first here. `first_programs` (one task only) are measured
    before anything the search proposes.

    Args:
        tasks: One Task, or several tuned together.
        trials: Programs to measure in this job, across all tasks. Programs the database already
            holds are never measured again.
        database: A `Database`, a path, or None for the default database
            (`default_database_path`).
        target: When given, the target of every task is set to it.
        timeout: Seconds a kernel may run before it counts as hung (an error record).
        seed: Random seed of the search; None gives a different search each run.
        policy: "sketch.xgb" (evolutionary search guided by the learned cost model),
            "sketch.random" (random programs of the sketches), "basic" (a simple random search),
            or a `SearchPolicy` object (one task only).
        measures_per_round: Programs compiled and measured per round (the batch); a job of at
            most SMALL_JOB (32) trials measures in rounds of 4, 4, 8, 16 instead.
        timing: How kernels are timed (`ansor.measure.TimingPolicy`); None for the default.
        progress: Whether to show a progress display.
        callback: Called with the task's `TuneResult` after every round.
        confirm_best: How many of each task's fastest programs are measured again at the end.
        transfer_programs: At most this many measured programs of the database's other
            workloads (same target) train the cost model first; 0 for none.
        time_budget: Seconds after which the search stops; None for no limit.
        scheduler: Which task gets the next round: "round-robin", "gradient" or a
            `TaskScheduler`.
        callbacks: `ansor.callbacks.TuningCallback` objects that see every phase, every
            measured program and every round.
        task_weights: How often each task occurs in the whole model, one weight per task.
        pretrained: Whether the cost model continues from the package's pretrained model; None
            for the default (yes, unless ANSOR_PRETRAINED=0).
        transfer_from: Other targets (`Target` objects or their keys) whose records in the
            database the job starts from.
        first_programs: Programs (`State`s) of the one task, measured first.

    Returns:
        The `TuneResult` of the task, or for a list of tasks a list of them in the same order.

    Raises:
        ValueError: An argument is out of range or does not fit the others.
        KeyboardInterrupt: On Ctrl-C (or SIGTERM, under
            `ansor.interrupts.terminate_as_interrupt`), once everything measured is saved; its
            `.results` holds the partial TuneResults.
    """
    single = isinstance(tasks, Task)
    task_list = [tasks] if single else list(tasks)
    if not task_list or not all(isinstance(t, Task) for t in task_list):
        raise ValueError("tune: give a Task or a non-empty list of Tasks")
    if trials < 0:
        raise ValueError(f"tune: trials must be >= 0, got {trials}")
    if time_budget is not None and time_budget <= 0:
        raise ValueError(f"tune: time_budget must be positive seconds, got {time_budget}")
    if task_weights is not None and (len(task_weights) != len(task_list) or any(w < 0 for w in task_weights)):
        raise ValueError("tune: task_weights must give one non-negative weight per task")
    if isinstance(policy, SearchPolicy) and not single:
        raise ValueError("tune: a policy object serves one task; give a policy name for several tasks")
    if first_programs and not single:
        raise ValueError("tune: first_programs are programs of one task; give one Task")
    if target is not None:
        for t in task_list:
            t.target = target
    if trials > 0:
        check_compiler()  # a missing compiler is one clear error, not a batch of failed builds
    start = time.time()
    deadline = start + time_budget if time_budget is not None else None
    db, owned = open_database(database)
    tuners: list[TaskTuner] = []
    try:
        sources = _target_keys(transfer_from, task_list)
        tuners = _make_tuners(task_list, db, policy, seed, timeout, timing, progress, callback, callbacks,
                              transfer_programs, trials, task_weights, pretrained, sources)
        if first_programs:
            tuners[0].add_candidates(first_programs)
        _run(tuners, make_scheduler(scheduler, seed), trials, measures_per_round, deadline)
        for tuner in tuners:
            if tuner.result.trials and confirm_best > 0:
                _confirm_best(tuner, db, confirm_best)
    except KeyboardInterrupt as exc:
        exc.results = [t.result for t in tuners]  # what was measured before the signal
        raise
    finally:
        _finish(tuners, db, start)
        if owned:
            db.close()
    results = [t.result for t in tuners]
    return results[0] if single else results


def _make_tuners(tasks: Sequence[Task], db: Database, policy: str | SearchPolicy, seed: int | None,
                 timeout: float, timing: TimingPolicy | None, progress: bool, callback,
                 callbacks: Sequence[TuningCallback], transfer_programs: int, trials: int,
                 task_weights: Sequence[float] | None = None, pretrained: bool | None = None,
                 from_targets: Sequence[str] = ()) -> list[TaskTuner]:
    from ansor.report import TuneProgress

    models: dict[str, CostModel] = {}
    if policy == "sketch.xgb":
        for target_key in dict.fromkeys(t.target.key for t in tasks):
            same = [t for t in tasks if t.target.key == target_key]
            models[target_key] = shared_cost_model(same, db, seed, transfer_programs, pretrained, from_targets)
    shared = [RecordToDatabase(db), *callbacks]
    if callback is not None:
        shared.append(RoundCallback(callback))
    shared.append(TuneProgress(total=trials if len(tasks) == 1 else 0, enabled=progress, timeout=timeout))
    tuners: list[TaskTuner] = []
    try:
        for i, task in enumerate(tasks):
            task_policy = make_policy(policy, task, seed, models.get(task.target.key))
            prior = db.best(task.workload_key, task.target.key)
            measurer = ProgramMeasurer(task, timeout=timeout, timing=timing, seed=0,
                                       best_cost=prior[0].median_cost if prior else math.inf)
            tuner = TaskTuner(task, task_policy, measurer, shared,
                              weight=task_weights[i] if task_weights is not None else 1.0,
                              measured_keys=db.measured_state_keys(task.workload_key, task.target.key))
            tuners.append(tuner)
            res = tuner.result
            res.prior_records = db.count(task.workload_key, task.target.key)
            if prior:
                res.best_cost, res.best_steps = prior[0].median_cost, prior[0].steps
                res.best_spread = spread(prior[0].costs)
            if tuner.measured_keys:
                task_policy.preload(db.records(task.workload_key, task.target.key))
            for key in from_targets:
                tuner.add_candidates(transferred_programs(task, db, key))
            tuner.start()
    except BaseException:
        for tuner in tuners:
            tuner.close()
        raise
    return tuners


def transferred_programs(task: Task, db: Database, source_key: str, k: int = TRANSFER_CANDIDATES) -> list[State]:
    """The best `k` programs of another target, each preceded by its first variant for this
    target's vector width and register count when they differ (`ansor.search.retarget`):
    measured first in a job that starts from that target's records."""
    source = _described_target(db, source_key)
    here = task.target
    fitted = source is not None and source.kind == here.kind == "cpu"
    more_registers, rest = divmod(here.vector_registers, source.vector_registers) if fitted else (1, 0)
    out: list[State] = []
    for _, state in replay_records(db.best(task.workload_key, source_key, k=k), task.dag):
        if fitted:
            out += retarget_vector_width(state, source.vector_unit_bytes, here.vector_unit_bytes,
                                         more_registers if rest == 0 and more_registers > 1 else 1)[:1]
        out.append(state)
    return out


def _described_target(db: Database, target_key: str) -> Target | None:
    """A target as the database describes it (None when it is not, or not in a form this
    version reads)."""
    entry = db.target(target_key)
    try:
        target = Target(**(entry or {})["description"])
    except (KeyError, TypeError):
        return None
    return target if target.vector_unit_bytes > 0 else None


def _target_keys(targets: Target | str | Sequence[Target | str], tasks: Sequence[Task]) -> list[str]:
    """The keys of `transfer_from`'s targets, none of them a task's own."""
    items = [targets] if isinstance(targets, (Target, str)) else list(targets)
    keys = [t.key if isinstance(t, Target) else str(t) for t in items]
    own = {t.target.key for t in tasks}
    if own & set(keys):
        raise ValueError(f"tune: transfer_from names the target being tuned ({', '.join(own & set(keys))})")
    return keys


def _run(tuners: Sequence[TaskTuner], scheduler: TaskScheduler, trials: int, per_round: int,
         deadline: float | None) -> None:
    """Rounds until `trials` programs are measured, the time is up or every space is exhausted.
    A task with records from earlier jobs counts their rounds (it needs no warm-up again)."""
    for tuner in tuners:
        tuner.count_earlier_rounds(math.ceil(tuner.result.prior_records / per_round))
    measured = 0
    while measured < trials and (deadline is None or time.time() < deadline):
        index = scheduler.next_task(tuners)
        if index is None:
            break
        size = min(per_round, trials - measured)
        if trials <= SMALL_JOB:
            size = min(size, _ramped_round(tuners[index]))
        batch = tuners[index].round(size, deadline)
        measured += len(batch)
        scheduler.on_round_end(index, tuners)


def _ramped_round(tuner: TaskTuner) -> int:
    """The round size of a small job: FIRST_ROUND programs, then as many as the task has
    measured, so that the model is refitted on this workload's first timings before it picks
    the next (the first round is chosen by a model that has seen none of them)."""
    return max(FIRST_ROUND, tuner.result.prior_records + tuner.result.trials)


def _confirm_best(tuner: TaskTuner, db: Database, k: int) -> None:
    """Measure the k best programs once more, back to back, so that they are compared with
    each other under the same conditions; the database pools every measurement of a program,
    and the job's best is read back from it. The tuning curve keeps what was seen during the
    search."""
    task = tuner.task
    states = [state for _, state in replay_records(db.best(task.workload_key, task.target.key, k=k), task.dag)]
    if not states:
        return
    writer = next(cb for cb in tuner.callbacks if isinstance(cb, RecordToDatabase))
    tuner.measurer.measure(states, on_result=lambda r: writer.on_result(tuner, r))
    best = db.best(task.workload_key, task.target.key)
    if best:
        res = tuner.result
        res.best_cost, res.best_steps, res.best_spread = best[0].median_cost, best[0].steps, spread(best[0].costs)


def _finish(tuners: Sequence[TaskTuner], db: Database, start: float) -> None:
    """Close every tuner's workers, end the callbacks, keep the cost model for the next job;
    runs after an interrupt too."""
    saved: set[int] = set()
    for tuner in tuners:
        tuner.result.seconds = time.time() - start
        try:
            tuner.close()
        finally:
            tuner.end()
        model = getattr(tuner.policy, "cost_model", None)
        path = model_path(db, tuner.task.target.key)
        if isinstance(model, CostModel) and path is not None and id(model) not in saved:
            saved.add(id(model))
            model.save(path)
