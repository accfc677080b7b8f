"""A dynamic graph compiled once for every length up to its maximum: one static model per bucket.

`bucket_tasks` turns each bucket of a `DynamicGraph` into an ordinary model (simplified, made
sound for padded calls by `graph.padding`, cut into tasks); `merged_tasks` is all of their
distinct tasks as one model for `tune_model`, each task named with the sizes it serves (the
name is stored with its records: `..._seq17to32`). `build_bucketed` compiles every bucket at
once (tasks shared by buckets are compiled once), so a call of a new length never compiles:
`BucketedModel` pads the inputs to the smallest bucket that holds them, fills the lengths
inputs the padding analysis added, runs that bucket's `CompiledModel` and cuts the outputs
back to the kept positions.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ansor.graph import passes
from ansor.graph.compiled import CompiledModel
from ansor.graph.dynamic import DynamicGraph
from ansor.graph.model_tasks import ModelTasks, extract_tasks
from ansor.graph.padding import PaddingPlan, plan_padding, valid_indices
from ansor.kernel import Kernel, build_many, input_array
from ansor.lower.live_rows import LiveRowsSpec
from ansor.records import RecordStore
from ansor.target import Target
from ansor.torch_arrays import numpy_to_tensor, tensor_to_numpy
from ansor.tuning.callbacks import TuningCallback
from ansor.tuning.quick import model_quick_seconds, quick_search_tasks, tasks_without_records


@dataclass
class Bucket:
    """One bucket: its sizes, the padding plan of its graph and its tasks."""

    sizes: dict[str, int]
    plan: PaddingPlan
    tasks: ModelTasks

    @property
    def label(self) -> str:
        return ", ".join(f"{d} = {s}" for d, s in sorted(self.sizes.items()))

    def live_rows(self) -> dict[str, tuple[str, LiveRowsSpec]]:
        """The tasks (by workload key) whose kernels can skip the padded rows of a shorter
        call: the dimension and the output axis that holds it whole in every occurrence (its
        first padded axis). A task with several outputs, with occurrences that disagree, or a
        write into a cache in place is left out (it computes the whole bucket)."""
        found: dict[str, tuple[str, LiveRowsSpec] | None] = {}
        for piece in self.tasks.pieces:
            if piece.lowered is None or piece.view_of is not None:
                continue
            key = piece.lowered.task.workload_key
            spec = None if piece.in_place else self._padded_axis(piece)
            if found.setdefault(key, spec) != spec:
                found[key] = None
        return {key: spec for key, spec in found.items() if spec is not None}

    def _padded_axis(self, piece) -> tuple[str, LiveRowsSpec] | None:
        """The dimension and `LiveRowsSpec` of the first padded axis of a piece's one output,
        where that axis holds one dimension whole (None otherwise)."""
        outputs = piece.subgraph.graph.outputs
        task_outputs = piece.lowered.task.outputs
        if len(outputs) != 1 or len(task_outputs) != 1:
            return None
        roles = self.plan.value_roles.get(outputs[0])
        shape = tuple(task_outputs[0].shape)
        if roles is None or len(roles) != len(shape):
            return None
        for axis, factors in enumerate(roles):
            if factors:
                if len(factors) != 1:
                    return None
                (factor,) = factors
                padded = self.sizes[factor.dim]
                if shape[axis] != padded * factor.inner:
                    return None
                return factor.dim, LiveRowsSpec(axis, factor.inner, padded)
        return None


def bucket_tasks(graph: DynamicGraph, target: Target | None = None, winograd: bool = True) -> list[Bucket]:
    """Every bucket of `graph` as a model whose tasks are named with the sizes they serve."""
    buckets = []
    for sizes in graph.bucket_sizes():
        static = graph.instantiate(sizes)
        simplified = passes.simplify(static.copy(), winograd=winograd)
        plan = plan_padding(simplified, graph.input_axes(static), sizes)
        buckets.append(Bucket(sizes, plan, extract_tasks(plan.graph, target, simplify=False)))
    _name_served_sizes(graph, buckets)
    return buckets


def _name_served_sizes(graph: DynamicGraph, buckets: list[Bucket]) -> None:
    """Append to each task's name the range of every dimension it serves (over the buckets
    that share it), so that its records say which sizes they serve."""
    served: dict[str, dict[str, tuple[int, int]]] = {}
    for b in buckets:
        for task in b.tasks.tasks:
            ranges = served.setdefault(task.workload_key, {})
            for dim, size in b.sizes.items():
                lo, hi = graph.dims[dim].served(size)
                old = ranges.get(dim, (lo, hi))
                ranges[dim] = (min(lo, old[0]), max(hi, old[1]))
    for b in buckets:
        for task in b.tasks.tasks:
            suffix = "_".join(f"{d}{lo}to{hi}" for d, (lo, hi) in sorted(served[task.workload_key].items()))
            task.name = f"{task.name}_{suffix}"


def merged_tasks(buckets: Sequence[Bucket]) -> ModelTasks:
    """The distinct tasks of all buckets as one model to tune, every bucket counting as much as
    any other: a task's weight is its occurrences in each bucket times that bucket's share
    (`bucket_shares`), summed over the buckets."""
    merged = ModelTasks(buckets[0].tasks.graph, [])
    for b, share in zip(buckets, bucket_shares(buckets)):
        merged.pieces.extend(b.tasks.pieces)
        for task, weight in zip(b.tasks.tasks, b.tasks.weights):
            index = merged.task_index.setdefault(task.workload_key, len(merged.tasks))
            if index == len(merged.tasks):
                merged.tasks.append(task)
                merged.weights.append(0.0)
            merged.weights[index] += weight * share
    return merged


def bucket_shares(buckets: Sequence[Bucket]) -> list[float]:
    """Per bucket, the weight of its tasks in the tuning objective: the largest bucket's work
    over its own (FLOPs), so each bucket's estimated time counts alike. With plain occurrence
    weights the objective is the sum of the buckets' latencies, which the largest buckets
    dominate: a job spent its trials on them and left the short lengths' tasks at the first
    few programs it measured, so calls of a few tokens ran untuned kernels."""
    work = [sum(w * t.flop for t, w in zip(b.tasks.tasks, b.tasks.weights)) for b in buckets]
    largest = max(work, default=0.0)
    return [largest / w if w > 0 else 1.0 for w in work]


class BucketedModel:
    """A dynamic graph's compiled buckets as one callable: inputs of any size within the
    declared ranges (numpy arrays or torch CPU tensors, in the graph's input order), outputs
    of the sizes the model gives at those sizes."""

    def __init__(self, graph: DynamicGraph, buckets: list[Bucket], models: list[CompiledModel],
                 skipping: list[list[tuple[Kernel, str]]] | None = None):
        self.graph = graph
        self.buckets = buckets
        self.models = models
        # per bucket, its kernels that skip padded rows and the dimension whose length they read
        self.skipping = skipping if skipping is not None else [[] for _ in buckets]
        self._plans: dict[tuple, tuple] = {}  # input shapes -> (bucket, sizes, `_call_plan`)
        self._by_sizes = {tuple(sorted(b.sizes.items())): k for k, b in enumerate(buckets)}

    def bucket_for(self, *inputs: Any) -> Bucket:
        """The bucket a call with these inputs runs."""
        return self.buckets[self._by_sizes[tuple(sorted(self._bucket_sizes(self._sizes(inputs)).items()))]]

    def _sizes(self, arrays: Sequence[Any]) -> dict[str, int]:
        n = len(self.buckets[0].tasks.graph.inputs) - len(self.buckets[0].plan.lengths_inputs)
        if len(arrays) != n:
            raise TypeError(f"the model takes {n} inputs, got {len(arrays)}")
        sizes: dict[str, int] = {}
        for i, axes in self.graph.dynamic_axes.items():
            shape = np.shape(arrays[i])
            for axis, dim in axes.items():
                if axis >= len(shape):
                    raise ValueError(f"input {i} has rank {len(shape)}, no axis {axis} ({dim})")
                if sizes.setdefault(dim, int(shape[axis])) != shape[axis]:
                    raise ValueError(f"input {i} axis {axis} is {shape[axis]}, another input has {dim} = "
                                     f"{sizes[dim]}")
        return sizes

    def _bucket_sizes(self, sizes: dict[str, int]) -> dict[str, int]:
        return {dim: self.graph.dims[dim].bucket(size) for dim, size in sizes.items()}

    def __call__(self, *inputs: Any):
        as_torch = any(type(x).__module__.startswith("torch") for x in inputs)
        arrays = [tensor_to_numpy(x) if type(x).__module__.startswith("torch") else np.asarray(x)
                  for x in inputs]
        shapes = tuple(a.shape for a in arrays)
        found = self._plans.get(shapes)
        if found is None:  # the same for every call of these shapes: found once
            sizes = self._sizes(arrays)
            padded_sizes = self._bucket_sizes(sizes)
            k = self._by_sizes[tuple(sorted(padded_sizes.items()))]
            plan = self._call_plan(k, sizes, padded_sizes)
            for (name, _, shape), x in zip(plan[0], arrays):  # a static extent wrong: refused by name
                input_array(name, x, shape, x.dtype.name)
            found = self._plans[shapes] = (k, sizes, plan)
        k, sizes, (kept, padding, cuts) = found
        model = self.models[k]
        for (name, view, shape), x in zip(kept, arrays):  # straight into the bucket's input buffers
            if x.dtype == view.dtype:  # the shape is the plan's: it was found by the shapes
                np.copyto(view, x)
            else:
                np.copyto(view, input_array(name, x, shape, view.dtype.name))  # refused by name
        for view, value in padding:  # the padding (zeros), and the lengths inputs
            view.fill(value)
        for kernel, dim in self.skipping[k]:
            kernel.set_live_rows(sizes[dim])
        try:
            model.run()
        finally:  # the bucket's model called on its own computes every row again
            for kernel, _ in self.skipping[k]:
                kernel.set_live_rows(None)
        results = [np.array(view, order="C") if indices is None else _cut(view, indices)
                   for view, indices in cuts]  # copies: the next call reuses the buffers
        if as_torch:
            results = [numpy_to_tensor(r) for r in results]
        return results[0] if len(results) == 1 else tuple(results)

    def _call_plan(self, k: int, sizes: dict[str, int], padded_sizes: dict[str, int]) -> tuple:
        """How a call of `sizes` runs bucket `k`: per input, its name, the view of its buffer
        that the call's array fills and that array's expected shape; the views to fill with a
        value (each dynamic axis's padding with 0, the lengths inputs with the length); per
        output, the view of its buffer that holds the kept positions where they lead every
        axis (and None), else the whole buffer and how it is cut back (`_cut_of`)."""
        bucket, model = self.buckets[k], self.models[k]
        g = bucket.plan.graph
        kept, padding = [], []
        for i, name in enumerate(model.call_inputs[:len(model.call_inputs) - len(bucket.plan.lengths_inputs)]):
            buffer, axes = model.buffer(name), self.graph.dynamic_axes.get(i, {})
            shape = tuple(sizes[axes[a]] if a in axes else n for a, n in enumerate(buffer.shape))
            kept.append((name, buffer[tuple(slice(0, n) for n in shape)], shape))
            for axis in axes:
                if shape[axis] < buffer.shape[axis]:
                    padding.append((buffer[(slice(None),) * axis + (slice(shape[axis], None),)], 0))
        for dim, name in bucket.plan.lengths_inputs.items():
            padding.append((model.buffer(name), sizes[dim]))
        cuts = []
        for o, roles in zip(g.outputs, bucket.plan.output_roles):
            buffer = model.buffer(o)
            cut = _cut_of(buffer.shape, roles, padded_sizes, sizes)
            if all(isinstance(keep, slice) for _, keep in cut):
                view = buffer
                for axis, keep in cut:
                    view = view[(slice(None),) * axis + (keep,)]
                cuts.append((view, None))
            else:
                cuts.append((buffer, cut))
        return kept, padding, cuts

    def summary(self) -> str:
        """One line per bucket: the sizes it serves and its model's summary line."""
        lines = []
        for b, m in zip(self.buckets, self.models):
            served = ", ".join(f"{d} {'..'.join(map(str, self.graph.dims[d].served(s)))}" for d, s in
                               sorted(b.sizes.items()))
            lines.append(f"bucket {b.label} (serves {served}): {m.summary().splitlines()[0]}")
        return "\n".join(lines)


def _cut_of(shape: tuple, roles: tuple, padded: dict[str, int], sizes: dict[str, int]) -> list[tuple[int, Any]]:
    """How an output of `shape` is cut back to the kept positions: per cut axis, a slice
    (the kept positions lead the axis) or their indices."""
    cut = []
    for axis, factors in enumerate(roles):
        keep = valid_indices(shape[axis], factors, padded, sizes)
        if keep is not None:
            prefix = len(keep) > 0 and keep[-1] == len(keep) - 1
            cut.append((axis, slice(0, len(keep)) if prefix else keep))
    return cut


def _cut(out: np.ndarray, cut: list[tuple[int, Any]]) -> np.ndarray:
    """The kept positions of an output, copied out of the model's buffer."""
    for axis, keep in cut:
        out = out[(slice(None),) * axis + (keep,)] if isinstance(keep, slice) else np.take(out, keep, axis=axis)
    return np.array(out, order="C")  # a copy: the next call reuses the buffer


def build_bucketed(graph: DynamicGraph, store: RecordStore | None = None, target: Target | None = None,
                   verbose: bool = True, winograd: bool = True, quick_seconds: float | None = None,
                   callbacks: Sequence[TuningCallback] = ()) -> BucketedModel:
    """Compile every bucket of `graph` with the best records of `store` (tasks without records
    first get the quick search, as in `build_model`); nothing is compiled after this."""
    buckets = bucket_tasks(graph, target, winograd=winograd)
    merged = merged_tasks(buckets)
    seconds = model_quick_seconds() if quick_seconds is None else quick_seconds
    if store is not None and not store.read_only and seconds > 0:
        missing = tasks_without_records(merged.tasks, store)
        if missing:
            quick_search_tasks(missing, store, seconds, callbacks=callbacks, timing=merged.measured_as_in_model())
    live_by_bucket = [b.live_rows() for b in buckets]
    live: dict[str, tuple[str, LiveRowsSpec] | None] = {}
    for found in live_by_bucket:
        for key, spec in found.items():
            if live.setdefault(key, spec) != spec:
                live[key] = None
    specs = [live[t.workload_key][1] if live.get(t.workload_key) else None for t in merged.tasks]
    by_workload = dict(zip((t.workload_key for t in merged.tasks), build_many(merged.tasks, store, live_rows=specs)))
    if verbose:
        untuned = sum(1 for k in by_workload.values() if k.record is None)
        print(f"ansor: {graph}: {len(buckets)} buckets, {len(by_workload)} distinct kernels"
              + (f" ({untuned} untuned)" if untuned else ""), file=sys.stderr)
    models = [CompiledModel(b.tasks, {key: by_workload[b.tasks.tasks[i].workload_key]
                                      for key, i in b.tasks.task_index.items()}, source=b.plan.graph)
              for b in buckets]
    skipping = [[(by_workload[key], dim) for key, (dim, _) in found.items()
                 if live.get(key) and by_workload[key].skips_padded_rows] for found in live_by_bucket]
    return BucketedModel(graph, buckets, models, skipping)
