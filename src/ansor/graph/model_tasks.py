"""A model graph as the tuner sees it: simplified, cut into fused subgraphs, each lowered to te.

`extract_tasks` is the one place both `tune` and `build` of a graph start from, so the tasks a
model is tuned with are exactly the tasks it is later built with (same workload keys, so the
records are found). Subgraphs with the same structure are one task whose weight is how often it
occurs; each occurrence keeps its own lowered form, since its weights differ. A subgraph with no
te form (an operator or dtype the lowering lacks) is a *fallback*: it runs with the numpy
reference kernels, and the reason is kept so that it can be said aloud.
"""

from __future__ import annotations

import glob
import math
from dataclasses import dataclass, field

from ansor.graph import passes
from ansor.graph.ir import Graph
from ansor.graph.kv_cache import written_cache
from ansor.graph.partition import Subgraph, partition
from ansor.graph.to_te import SubgraphTask, lower_subgraph
from ansor.measure import TimingPolicy
from ansor.target import Target
from ansor.task import Task
from ansor.te.expr import DTYPE_BYTES


#: Past twice the last-level cache, more bytes between two calls change nothing (the data comes
#: from memory either way), while every byte of copies costs each measurement time to make.
LLC_MULTIPLE = 2
#: The last-level cache assumed where the system does not say (the 32 MiB L3 of the AMD kinds).
DEFAULT_LLC_BYTES = 32 * 1024 * 1024


def last_level_cache_bytes() -> int:
    """The size of this machine's largest CPU cache (Linux sysfs), else DEFAULT_LLC_BYTES."""
    sizes = []
    for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(index).read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=DEFAULT_LLC_BYTES)


@dataclass
class ModelPiece:
    """One subgraph occurrence: its lowering (None for a fallback, with `fallback_reason`, and
    for a view). `view_of` names the input a piece merely reshapes: its output is a view of that
    input's memory, so it has no kernel and no task."""

    subgraph: Subgraph
    lowered: SubgraphTask | None
    fallback_reason: str = ""
    view_of: str | None = None
    in_place: bool = False  # a cache write: its output is `view_of`'s memory, rows written in place

    @property
    def key(self) -> str:
        return self.subgraph.key


@dataclass
class ModelTasks:
    """The simplified graph, its pieces in execution order, and the distinct tasks to tune
    (`tasks[i]` occurs `weights[i]` times; `task_index[key]` is its place). The buckets of a
    dynamic graph tuned as one (`graph.bucketed.merged_tasks`) weigh their tasks by share, so
    a weight there need not be whole."""

    graph: Graph
    pieces: list[ModelPiece]
    tasks: list[Task] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    task_index: dict[str, int] = field(default_factory=dict)

    @property
    def fallbacks(self) -> list[ModelPiece]:
        return [p for p in self.pieces if p.lowered is None and p.view_of is None]

    @property
    def data_bytes(self) -> int:
        """Bytes one call of the model's kernels reads and writes (every task's inputs and
        outputs, times its occurrences): what passes through the caches between two calls of
        one kernel, which the kernels are timed against (`measured_as_in_model`)."""
        return int(sum(w * sum(math.prod(t.shape) * DTYPE_BYTES[t.dtype] for t in (*task.inputs, *task.outputs))
                       for task, w in zip(self.tasks, self.weights)))  # weights may be fractional

    def measured_as_in_model(self) -> TimingPolicy:
        """How the model's kernels are timed: with their inputs out of the caches as far as the
        rest of the model pushes them (`TimingPolicy.cold_bytes`), so that the tuner's estimate
        of the model (the weighted sum of its kernels' times) is what the model measures."""
        return TimingPolicy(cold_bytes=min(self.data_bytes, LLC_MULTIPLE * last_level_cache_bytes()))


def extract_tasks(graph: Graph, target: Target | None = None, simplify: bool = True,
                  winograd: bool = True) -> ModelTasks:
    """Simplify `graph` (fold batch norms and constants, drop identities, channels-last
    convolutions, Winograd form where it pays unless `winograd` is False: `passes.simplify`),
    partition it and lower every subgraph; identical subgraphs share one task."""
    if not isinstance(graph, Graph):
        raise TypeError(f"expected an ansor.graph.Graph, got {type(graph).__name__}")
    g = passes.simplify(graph.copy(), winograd=winograd) if simplify else graph
    model = ModelTasks(g, [])
    for sub in partition(g):
        cache = written_cache(sub)
        if cache is not None:
            model.pieces.append(ModelPiece(sub, None, view_of=cache, in_place=True))
            continue
        source = view_source(sub)
        if source is not None:
            model.pieces.append(ModelPiece(sub, None, view_of=source))
            continue
        try:
            piece = ModelPiece(sub, lower_subgraph(sub, target))
        except NotImplementedError as err:
            piece = ModelPiece(sub, None, str(err))
        model.pieces.append(piece)
        if piece.lowered is None:
            continue
        index = model.task_index.setdefault(piece.key, len(model.tasks))
        if index == len(model.tasks):
            model.tasks.append(piece.lowered.task)
            model.weights.append(0)
        model.weights[index] += 1
    return model


def view_source(sub: Subgraph) -> str | None:
    """The input a subgraph merely reshapes (values are dense, so its output is a view of it),
    else None."""
    if (len(sub.inputs) == 1 and len(sub.outputs) == 1 and sub.nodes
            and all(n.op == "reshape" for n in sub.nodes) and not sub.constants):
        return sub.inputs[0]
    return None
