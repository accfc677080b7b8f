"""`ansor.tune`, `ansor.build` and `ansor.visualize`: the front doors for a Task, a list of Tasks
or a model graph.

This layer turns what a user passes (keywords, a database path or None) into what the layers
below take: a `TuneOptions` value, an open record store, and the progress display as one of the
job's callbacks (the tuning job itself draws nothing).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

from ansor.graph.bucketed import BucketedModel, bucket_tasks, build_bucketed, merged_tasks
from ansor.graph.compiled import CompiledModel, OutputMismatchError, build_model
from ansor.graph.dynamic import DynamicGraph
from ansor.graph.model_tasks import ModelTasks
from ansor.graph.ir import Graph
from ansor.graph.model_tuning import tune_model
from ansor.kernel import Kernel
from ansor.records import RecordStore
from ansor.report import TuneProgress
from ansor.store import open_store
from ansor.task import Task
from ansor.tuning.callbacks import RoundCallback, TuningCallback
from ansor.tuning.job import tune as tune_tasks
from ansor.tuning.options import TuneOptions
from ansor.tuning.quick import build_task
from ansor.tuning.task_tuner import TuneResult

__all__ = ["build", "tune", "visualize"]


def tune(what: Any, trials: int | None = None, *, database: RecordStore | str | None = None,
         options: TuneOptions | None = None, progress: bool = True,
         callback: Callable[[TuneResult], None] | None = None, callbacks: Sequence[TuningCallback] = (),
         **keywords: Any) -> TuneResult | list[TuneResult]:
    """Tune a Task, a list of Tasks tuned together, or a model graph (its distinct fused
    subgraphs under the gradient task scheduler).

    Every measured program is committed to the database at once, so an interrupted job loses
    nothing, and running the same job again continues from the records.

    Args:
        what: A `Task`, a list of Tasks, a model graph (`ansor.graph.Graph`), or a dynamic
            graph (`graph.dynamic.DynamicGraph`: the tasks of all its buckets together).
        trials: Programs to measure in this job (for a graph: in all, the records its tasks
            already hold counted against them); default 200 for tasks, 1000 for a graph (a
            graph given a `time_budget` and no trials: as many as the time allows).
        database: A record store, a path, or None for the default database.
        options: A `TuneOptions` to start from; the keywords below replace its fields.
        progress: Whether to show a progress display (a live line per task on a terminal,
            a line per round otherwise).
        callback: Called with the task's `TuneResult` after every round.
        callbacks: `TuningCallback` objects that see every phase, program and round.
        **keywords: `TuneOptions` fields (`time_budget`, `seed`, `timeout`, `policy`,
            `scheduler`, `transfer_from`, ...); for a graph also `target`, `resume` and
            `winograd` (as in `build`).

    Returns:
        TuneResult | list[TuneResult]: For one Task, its `TuneResult`; for a list of Tasks, one
            per task in order; for a graph, one per distinct task of the model.
    """
    hooks = list(callbacks)
    if callback is not None:
        hooks.append(RoundCallback(callback))
    store, owned = open_store(database)
    try:
        if isinstance(what, DynamicGraph):  # every bucket's tasks, as one model
            what = merged_tasks(bucket_tasks(what, keywords.get("target"), keywords.get("winograd", True)))
        if isinstance(what, (Graph, ModelTasks)):
            if options is not None:
                keywords = {**_changed_fields(options), **keywords}
            given = keywords.pop("trials", None)  # from options=, where it is a field like the others
            graph_trials = trials if trials is not None else given if given is not None else (
                None if keywords.get("time_budget") is not None else 1000)  # None: as many as the time allows
            if progress:
                hooks.append(TuneProgress(timeout=keywords.get("timeout")))
            notify = (lambda line: print(f"ansor: {line}", file=sys.stderr)) if progress else None
            return tune_model(what, store, graph_trials, callbacks=hooks, notify=notify, **keywords)
        if trials is not None:
            keywords["trials"] = trials
        opts = TuneOptions.from_keywords(options, **keywords)
        if progress:
            hooks.append(TuneProgress(total=opts.trials if isinstance(what, Task) else 0, timeout=opts.timeout))
        return tune_tasks(what, opts, store, hooks)
    finally:
        if owned:
            store.close()


def build(what: Any, database: RecordStore | str | None = None, *, check: bool = False,
          **keywords: Any) -> Kernel | CompiledModel | BucketedModel:
    """A Task's best recorded program as a Kernel (with no record, the best of a quick
    model-guided search, recorded: see `ansor.tuning.quick.build_task`), or a model graph
    compiled with its tasks' best records as a CompiledModel (see `graph.compiled.build_model`).

    Args:
        what: A `Task`, a model graph (`ansor.graph.Graph`), or a dynamic one
            (`graph.dynamic.DynamicGraph`: every bucket compiled now, a `BucketedModel`).
        database: A record store, a path, or None for the default database.
        check: Run the result once on random inputs and compare it with the numpy reference
            (a graph: `CompiledModel.check`, against `graph.reference.run_graph`; a Task:
            `Kernel.check`), under the tolerance every tuned kernel passed; a mismatch raises
            `OutputMismatchError` naming the first output out of tolerance and its errors.
        **keywords: For a Task `quick_trials` (0: the untuned default schedule when there is no
            record), `quick_seconds` (the quick search's time) or `state` (compile this
            program); for a graph `target`, `verbose`, `winograd` and `quick_seconds` (the
            time, in all, for choosing programs of tasks without records; 0: untuned).

    Returns:
        A callable `Kernel` for a Task, a callable `CompiledModel` for a graph.
    """
    store, owned = open_store(database)
    try:
        if isinstance(what, DynamicGraph):
            if check:
                raise TypeError("build(check=True) of a dynamic graph: check a bucket's model "
                                "(BucketedModel.models[k].check()) instead")
            return build_bucketed(what, store, **keywords)
        if isinstance(what, Graph):
            if keywords.get("verbose", True) and "callbacks" not in keywords:
                keywords["callbacks"] = [TuneProgress()]  # shown while tasks without records get programs
            return build_model(what, store, check=check, **keywords)
        kernel = build_task(what, store, **keywords)
        if check:
            mismatch = kernel.check()
            if mismatch is not None:
                raise OutputMismatchError(f"the kernel of {what.name!r} disagrees with the numpy reference "
                                          f"on random inputs: {mismatch}")
        return kernel
    finally:
        if owned:
            store.close()


def visualize(what: Any, task: Task | None = None, path: str | None = None, *,
              database: RecordStore | str | None = None, **keywords: Any):
    """Explain a program: its tile levels against the caches and its place on the roofline
    (see `ansor.viz.visualize`). A Record given without its task is rebuilt from `database`
    (a store or a path; None: the default database, opened read-only)."""
    from ansor.records import Record
    from ansor.viz import visualize as visualize_program  # matplotlib only when asked for

    if not (isinstance(what, Record) and task is None):
        return visualize_program(what, task, path, database=database if isinstance(database, RecordStore) else None,
                                 **keywords)
    store, owned = open_store(database, create=False)
    try:
        return visualize_program(what, task, path, database=store, **keywords)
    finally:
        if owned:
            store.close()


def _changed_fields(options: TuneOptions) -> dict[str, Any]:
    """The fields of `options` that differ from the defaults (what a caller chose)."""
    default = TuneOptions()
    return {name: value for name, value in vars(options).items() if value != getattr(default, name)}
