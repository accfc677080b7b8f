"""The tuning job: one or several tasks tuned together, every measured program committed at once.

The job is a few objects: one `TaskTuner` per task (its policy, measurer and result), one cost
model shared by the tasks of a target (`tuning.transfer`), a `TaskScheduler` that picks whose
round runs next, and callbacks that write records and whatever the caller adds (the progress
display is one, passed in by the API or the command line: the job draws nothing itself). A
rerun of the same job resumes: programs in the store are never measured again and the model
learns from them first.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

from ansor.costmodel.model import CostModel
from ansor.measure import check_compiler
from ansor.records import RecordStore
from ansor.replay import replay_records
from ansor.search.basic import default_schedule
from ansor.search.params import SearchParams
from ansor.search.policy import SearchPolicy
from ansor.store import open_store
from ansor.task import Task
from ansor.tuning.callbacks import RecordToDatabase, TuningCallback
from ansor.tuning.cluster import ClusterSession
from ansor.tuning.measurer import ProgramMeasurer
from ansor.tuning.options import POLICIES, TuneOptions
from ansor.tuning.scheduler import TaskScheduler, make_scheduler
from ansor.tuning.siblings import PER_ROUND, SiblingPrograms
from ansor.tuning.task_tuner import TaskTuner, TuneResult, spread
from ansor.tuning.transfer import model_path, shared_cost_model, source_target_keys, transferred_programs

__all__ = ["SMALL_JOB", "FIRST_ROUND", "TuneOptions", "TuneResult", "make_policy", "tune"]

SMALL_ROUND = 16               # a round this small measures one sibling program at most
SMALL_JOB = 32                 # trials: a job this small measures in growing rounds (_ramped_round)
FIRST_ROUND = 4                # programs in the first of them; larger jobs keep full rounds, whose
                               # one search each costs less than the extra refits gain there
                               # (both measured in BENCHMARKS.md)


def make_policy(policy: str | SearchPolicy, task: Task, seed: int | None,
                cost_model: CostModel | None = None, params: SearchParams | None = None) -> SearchPolicy:
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
        return SketchPolicy(task, seed, params=params, cost_model=cost_model if policy == "sketch.xgb" else None)
    if policy == "basic":
        from ansor.search.basic import RandomSearchPolicy

        return RandomSearchPolicy(task, seed)
    raise ValueError(f"unknown search policy {policy!r}; available: {', '.join(POLICIES)}")


def tune(tasks: Task | Sequence[Task], options: TuneOptions | None = None,
         database: RecordStore | str | None = None,
         callbacks: Sequence[TuningCallback] = ()) -> TuneResult | list[TuneResult]:
    """Search for fast programs of one task, or of several tasks together.

    `options.trials` programs are measured in all (across the tasks); with
    `options.time_budget` the search also stops when the time is up. Several tasks take rounds
    in the order the scheduler picks, and the tasks of one target share one cost model. Every
    measured program is committed to the store as soon as it is measured, so an interrupt
    (KeyboardInterrupt, raised on to the caller with `.results` holding the partial results)
    loses nothing measured; a rerun skips what the store holds. At the end the
    `options.confirm_best` fastest programs of each task are measured once more (not counted
    as trials) and the best is decided on all their runs.

    The model first learns from up to `options.transfer_programs` measured programs of the
    store's other workloads on the same target, and (with `options.pretrained`) its fits
    continue from the package's pretrained model, so even a fresh database's first batch is
    chosen by a model.

    Args:
        tasks: One Task, or several tuned together.
        options: How to search, measure and stop (`TuneOptions`); None for the defaults.
        database: A record store, a path, or None for the default database.
        callbacks: `TuningCallback` objects that see every phase, every measured program and
            every round (progress displays, user hooks).

    Returns:
        The `TuneResult` of the task, or for a list of tasks a list of them in the same order.

    Raises:
        ValueError: An option does not fit the tasks.
        KeyboardInterrupt: On Ctrl-C (or SIGTERM, under
            `ansor.interrupts.terminate_as_interrupt`), once everything measured is saved; its
            `.results` holds the partial TuneResults.
    """
    opts = options if options is not None else TuneOptions()
    single = isinstance(tasks, Task)
    task_list = [tasks] if single else list(tasks)
    if not task_list or not all(isinstance(t, Task) for t in task_list):
        raise ValueError("tune: give a Task or a non-empty list of Tasks")
    weights = opts.task_weights
    if weights is not None and (len(weights) != len(task_list) or any(w < 0 for w in weights)):
        raise ValueError("tune: task_weights must give one non-negative weight per task")
    if isinstance(opts.policy, SearchPolicy) and not single:
        raise ValueError("tune: a policy object serves one task; give a policy name for several tasks")
    if opts.first_programs and not single:
        raise ValueError("tune: first_programs are programs of one task; give one Task")
    if opts.target is not None:
        for t in task_list:
            t.target = opts.target
    sources = source_target_keys(opts.transfer_from, task_list)
    if opts.trials > 0 and opts.cluster is None:
        check_compiler()  # a missing compiler is one clear error, not a batch of failed builds
    start = time.time()
    deadline = start + opts.time_budget if opts.time_budget is not None else None
    db, owned = open_store(database)
    tuners: list[TaskTuner] = []
    cluster: ClusterSession | None = None
    try:
        if opts.cluster is not None and opts.trials > 0:
            # the nodes build and time; a target no node offers fails here, before any search
            cluster = ClusterSession(opts.cluster, opts.timeout, opts.timing)
            for target in {t.target.key: t.target for t in task_list}.values():
                cluster.pool(target)
        tuners = _make_tuners(task_list, db, opts, callbacks, sources, cluster)
        if opts.first_programs:
            tuners[0].add_candidates(opts.first_programs)
        siblings = SiblingPrograms(tuners) if opts.share_programs and len(tuners) > 1 else None
        _run(tuners, make_scheduler(opts.scheduler, opts.seed), opts.trials, opts.measures_per_round, deadline,
             opts.confirm_best, siblings)
        for tuner in tuners:
            if tuner.result.trials and opts.confirm_best > 0:
                _confirm_best(tuner, db, opts.confirm_best)
    except KeyboardInterrupt as exc:
        exc.results = [t.result for t in tuners]  # what was measured before the signal
        raise
    finally:
        try:
            _finish(tuners, db, start)
        finally:
            if cluster is not None:
                cluster.close()
            if owned:
                db.close()
    results = [t.result for t in tuners]
    return results[0] if single else results


def _make_tuners(tasks: Sequence[Task], db: RecordStore, opts: TuneOptions,
                 callbacks: Sequence[TuningCallback], from_targets: Sequence[str],
                 cluster: ClusterSession | None = None) -> list[TaskTuner]:
    models: dict[str, CostModel] = {}
    if opts.policy == "sketch.xgb":
        for target_key in dict.fromkeys(t.target.key for t in tasks):
            same = [t for t in tasks if t.target.key == target_key]
            models[target_key] = shared_cost_model(same, db, opts.seed, opts.transfer_programs,
                                                   opts.pretrained, from_targets)
    shared = [RecordToDatabase(db), *callbacks]
    tuners: list[TaskTuner] = []
    try:
        for i, task in enumerate(tasks):
            task_policy = make_policy(opts.policy, task, opts.seed, models.get(task.target.key), opts.search_params)
            prior = db.best(task.workload_key, task.target.key)
            best = prior[0].median_cost if prior else math.inf
            measurer = (cluster.measurer(task, best) if cluster is not None else
                        ProgramMeasurer(task, timeout=opts.timeout, timing=opts.timing, seed=0, best_cost=best))
            tuner = TaskTuner(task, task_policy, measurer, shared,
                              weight=opts.task_weights[i] if opts.task_weights is not None else 1.0,
                              measured_keys=db.measured_state_keys(task.workload_key, task.target.key))
            tuners.append(tuner)
            res = tuner.result
            res.prior_records = db.count(task.workload_key, task.target.key)
            if prior:
                res.best_cost, res.best_steps = prior[0].median_cost, prior[0].steps
                res.best_spread = spread(prior[0].costs)
            if tuner.measured_keys:
                task_policy.preload(db.records(task.workload_key, task.target.key))
            if opts.default_first and not tuner.measured_keys:
                tuner.add_candidates([default_schedule(task)])
            for key in from_targets:
                tuner.add_candidates(transferred_programs(task, db, key))
            tuner.start()
    except BaseException:
        for tuner in tuners:
            tuner.close()
        raise
    return tuners


def _run(tuners: Sequence[TaskTuner], scheduler: TaskScheduler, trials: int, per_round: int,
         deadline: float | None, confirm_best: int = 0, siblings: SiblingPrograms | None = None) -> None:
    """Rounds until `trials` programs are measured, the time is up or every space is exhausted.
    A task with records from earlier jobs counts their rounds (it needs no warm-up again). With
    a deadline, the search stops early enough for the confirmation of `confirm_best` leaders per
    task to end by it too (`confirmation_seconds`): a time budget is the job's whole time.
    `siblings` hands each task its faster same-structure tasks' best programs before its rounds
    (one in a small round, where the model's picks are few)."""
    for tuner in tuners:
        tuner.count_earlier_rounds(math.ceil(tuner.result.prior_records / per_round))
    measured = 0

    def search_deadline() -> float | None:
        return None if deadline is None else deadline - confirmation_seconds(tuners, confirm_best)

    while measured < trials and (deadline is None or time.time() < search_deadline()):
        index = scheduler.next_task(tuners)
        if index is None:
            break
        size = min(per_round, trials - measured)
        if trials <= SMALL_JOB:
            size = min(size, _ramped_round(tuners[index]))
        if siblings is not None:
            siblings.offer(index, PER_ROUND if size >= SMALL_ROUND else 1)
        batch = tuners[index].round(size, search_deadline())
        measured += len(batch)
        scheduler.on_round_end(index, tuners)


def confirmation_seconds(tuners: Sequence[TaskTuner], k: int) -> float:
    """The time the confirmation of `k` leaders per task is expected to take: each task's
    mean compile-and-measure time per program of this job so far, times k (tasks not yet
    measured count nothing: they are confirmed only if they get a round)."""
    if k <= 0:
        return 0.0
    return sum(k * t.result.measure_seconds / t.result.trials for t in tuners if t.result.trials)


def _ramped_round(tuner: TaskTuner) -> int:
    """The round size of a small job: FIRST_ROUND programs, then as many as the task has
    measured, so that the model is refitted on this workload's first timings before it picks
    the next (the first round is chosen by a model that has seen none of them)."""
    return max(FIRST_ROUND, tuner.result.prior_records + tuner.result.trials)


def _confirm_best(tuner: TaskTuner, db: RecordStore, k: int) -> None:
    """Measure the k best programs once more, back to back, so that they are compared with
    each other under the same conditions; the database pools every measurement of a program,
    and the job's best is read back from it. The tuning curve keeps what was seen during the
    search."""
    task = tuner.task
    states = [state for _, state in replay_records(db.best(task.workload_key, task.target.key, k=k), task.dag)]
    if not states:
        return
    writer = next(cb for cb in tuner.callbacks if isinstance(cb, RecordToDatabase))
    tuner.measurer.measure(states, on_result=lambda r: writer.on_result(tuner, r), full_timing=True)
    best = db.best(task.workload_key, task.target.key)
    if best:
        res = tuner.result
        res.best_cost, res.best_steps, res.best_spread = best[0].median_cost, best[0].steps, spread(best[0].costs)


def _finish(tuners: Sequence[TaskTuner], db: RecordStore, start: float) -> None:
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
