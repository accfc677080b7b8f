"""`ansor.tune` and `ansor.build`: one pair of front doors for a Task, a list of Tasks or a model.

A Task (or list) goes to the tuner and the kernel builder; a model graph (`ansor.graph.Graph`)
to `graph.tuning.tune_model` and `graph.compiled.build_model`, which cut it into tasks first.
"""

from __future__ import annotations

from typing import Any

from ansor.graph.compiled import CompiledModel, build_model
from ansor.graph.ir import Graph
from ansor.graph.tuning import tune_model
from ansor.kernel import Kernel
from ansor.quick import build_task
from ansor.tuner import tune as tune_tasks


def tune(what: Any, *args: Any, **kwargs: Any):
    """Tune a Task, a list of Tasks (see `ansor.tuner.tune`) or a model graph (see
    `ansor.graph.tuning.tune_model`: the task scheduler over its fused subgraphs).

    Every measured program is committed to the database at once, so an interrupted job loses
    nothing, and running the same job again continues from the records.

    Args:
        what: A `Task`, a list of Tasks tuned together, or a model graph (`ansor.graph.Graph`).
        *args: Passed on to `ansor.tuner.tune` or `tune_model` (`trials` first).
        **kwargs: Passed on likewise: `trials`, `database`, `time_budget`, `seed`, ...

    Returns:
        TuneResult | list[TuneResult]: For one Task, its `TuneResult`; for a list of Tasks, one
            per task in order; for a graph, one per distinct task of the model.
    """
    if isinstance(what, Graph):
        return tune_model(what, *args, **kwargs)
    return tune_tasks(what, *args, **kwargs)


def build(what: Any, *args: Any, **kwargs: Any) -> Kernel | CompiledModel:
    """A Task's best recorded program as a Kernel (with no record, the best of a quick
    model-guided search: see `ansor.quick.build_task`), or a model graph compiled with its tasks'
    best records as a CompiledModel (see `graph.compiled.build_model`).

    Args:
        what: A `Task`, or a model graph (`ansor.graph.Graph`).
        *args: Passed on to `build_task` or `build_model` (`database` first).
        **kwargs: Passed on likewise: `database`, and for a Task `quick_trials` (0: the untuned
            default schedule when there is no record), `quick_seconds` (the quick search's time)
            or `state` (compile this program).

    Returns:
        A callable `Kernel` for a Task, a callable `CompiledModel` for a graph.
    """
    if isinstance(what, Graph):
        return build_model(what, *args, **kwargs)
    return build_task(what, *args, **kwargs)
