"""A model graph with symbolic dimensions (sequence length, batch), served by buckets.

A dynamic model is imported as a `DynamicGraph`: the symbolic dimensions, each with a declared
maximum, which input axes they are, and a way to instantiate the model as an ordinary static
`Graph` at given sizes (the importer run again on inputs of those sizes). Each dimension has a
few bucket sizes (powers of two up to the maximum, and the maximum). Every bucket is a static
graph whose tasks are tuned and recorded like any other; a call of length L runs the smallest
bucket >= L on inputs padded to it with zeros, and the outputs are cut back to L
(`graph.bucketed`). `graph.padding` proves per operator that the padding cannot reach a kept
element (attention gets the padding-lengths mask) and refuses by name where it could.

`from_torch(model, inputs, dynamic_shapes=...)` (torch.export's `Dim`s) and
`from_onnx(model, max_sizes={dim_param: maximum})` make one; `ansor.tune` and `ansor.build` take it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ansor.graph.ir import Graph

#: The smallest bucket of a dimension by default: shorter calls are padded to it (a bucket per
#: power of two below it would add tasks that cost more to tune than the padding costs to run).
SMALLEST_BUCKET = 16
#: A declared maximum past this is taken for "no maximum" (torch.export's default bound).
LARGEST_MAXIMUM = 1 << 20


@dataclass(frozen=True)
class DynamicDim:
    """A symbolic dimension: its name, the sizes a call may have, and the bucket sizes that
    serve them (ascending, the last one the maximum)."""

    name: str
    max: int
    min: int = 1
    buckets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.max:
            raise ValueError(f"dimension {self.name!r}: need 1 <= min <= max, got min {self.min}, max {self.max}")
        if self.max > LARGEST_MAXIMUM:
            raise ValueError(f"dimension {self.name!r} has no declared maximum (max {self.max}); declare one "
                             f"(torch.export.Dim(..., max=N), or max_sizes= for ONNX)")
        buckets = tuple(sorted(set(self.buckets))) or bucket_sizes(self.min, self.max)
        if buckets[-1] != self.max or buckets[0] < 1:
            raise ValueError(f"dimension {self.name!r}: buckets {buckets} must end at the maximum {self.max}")
        object.__setattr__(self, "buckets", buckets)

    def bucket(self, size: int) -> int:
        """The smallest bucket that holds `size`, or ValueError naming the maximum."""
        if not self.min <= size <= self.max:
            raise ValueError(f"{self.name} = {size} is outside the declared range {self.min}..{self.max} "
                             f"of the compiled model")
        return next(b for b in self.buckets if b >= size)

    def served(self, bucket: int) -> tuple[int, int]:
        """The sizes a bucket serves: (first, last)."""
        k = self.buckets.index(bucket)
        return (max(self.min, self.buckets[k - 1] + 1) if k else self.min, bucket)


def bucket_sizes(low: int, high: int, smallest: int = SMALLEST_BUCKET) -> tuple[int, ...]:
    """Powers of two from `smallest` (or the first one at least `low`) below `high`, then `high`."""
    first = 1
    while first < min(max(low, smallest), high):
        first *= 2
    sizes = []
    size = first
    while size < high:
        sizes.append(size)
        size *= 2
    return tuple(sizes) + (high,)


@dataclass
class DynamicGraph:
    """A model over symbolic dimensions: `dims` by name, `dynamic_axes` (the position of each
    graph input -> {axis: dimension name}) and `make(sizes)`, the static graph at `sizes`
    {dimension: size}; instantiations are cached."""

    dims: dict[str, DynamicDim]
    dynamic_axes: dict[int, dict[int, str]]
    make: Callable[[dict[str, int]], Graph]
    _graphs: dict[tuple, Graph] = field(default_factory=dict)

    def instantiate(self, sizes: dict[str, int]) -> Graph:
        """The static graph at `sizes` (every dimension named)."""
        key = tuple(sorted(sizes.items()))
        if key not in self._graphs:
            graph = self.make(dict(sizes))
            self._check_axes(graph, sizes)
            self._graphs[key] = graph
        return self._graphs[key]

    def bucket_sizes(self) -> list[dict[str, int]]:
        """Every combination of the dimensions' buckets."""
        names = sorted(self.dims)
        return [dict(zip(names, combo)) for combo in itertools.product(*(self.dims[n].buckets for n in names))]

    def input_axes(self, graph: Graph) -> dict[str, dict[int, str]]:
        """`dynamic_axes` by the input names of an instantiation."""
        return {graph.inputs[i]: axes for i, axes in self.dynamic_axes.items()}

    def _check_axes(self, graph: Graph, sizes: dict[str, int]) -> None:
        for i, axes in self.dynamic_axes.items():
            shape = graph.type_of(graph.inputs[i]).shape
            for axis, dim in axes.items():
                if shape[axis] != sizes[dim]:
                    raise ValueError(f"input {graph.inputs[i]!r} axis {axis} is {shape[axis]} in the graph made "
                                     f"for {dim} = {sizes[dim]}")

    def __str__(self) -> str:
        dims = ", ".join(f"{d.name} in {d.min}..{d.max} (buckets {', '.join(map(str, d.buckets))})"
                         for d in self.dims.values())
        return f"dynamic graph over {dims}"


# ------------------------------------------------------------------------------ PyTorch

def from_torch_dynamic(module: Any, example_inputs: Sequence[Any], dynamic_shapes: Any,
                       buckets: dict[str, Sequence[int]] | None = None) -> DynamicGraph:
    """`from_torch` with symbolic dimensions: `dynamic_shapes` as torch.export takes it (per
    input, None or {axis: Dim} or a sequence of Dim-or-None; a dict by argument name or a
    sequence in order). The model is exported once with them, so a model that specializes on
    a dimension is refused by torch.export itself; each bucket is then imported statically."""
    import torch

    from ansor.graph.torch_importer import from_torch

    example_inputs = tuple(example_inputs)
    per_input = _per_input(module, example_inputs, dynamic_shapes)
    dims: dict[str, DynamicDim] = {}
    axes: dict[int, dict[int, str]] = {}
    for position, spec in enumerate(per_input):
        for axis, dim in spec.items():
            name = _dim_name(dim)
            declared = DynamicDim(name, int(dim.max), max(1, int(dim.min)), tuple((buckets or {}).get(name, ())))
            if dims.setdefault(name, declared) != declared:
                raise ValueError(f"dimension {name!r} is declared twice with different ranges")
            axes.setdefault(position, {})[axis] = name
    if not dims:
        raise ValueError("dynamic_shapes names no dimension: use from_torch without it")
    tensor_positions = [i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor)]
    torch.export.export(module.eval(), example_inputs, dynamic_shapes=dynamic_shapes)  # refuses a specialized dim
    graph_axes = {tensor_positions.index(i): a for i, a in axes.items()}

    def make(sizes: dict[str, int]) -> Graph:
        inputs = list(example_inputs)
        for i, spec in axes.items():
            shape = list(inputs[i].shape)
            for axis, name in spec.items():
                shape[axis] = sizes[name]
            inputs[i] = torch.zeros(shape, dtype=inputs[i].dtype)
        return from_torch(module, tuple(inputs))

    return DynamicGraph(dims, graph_axes, make)


def _per_input(module: Any, example_inputs: tuple, dynamic_shapes: Any) -> list[dict[int, Any]]:
    import inspect

    if isinstance(dynamic_shapes, dict):
        names = list(inspect.signature(module.forward).parameters)
        unknown = set(dynamic_shapes) - set(names)
        if unknown:
            raise ValueError(f"dynamic_shapes names {sorted(unknown)}, not arguments of forward {names}")
        specs = [dynamic_shapes.get(n) for n in names[:len(example_inputs)]]
    else:
        specs = list(dynamic_shapes)
        if len(specs) != len(example_inputs):
            raise ValueError(f"dynamic_shapes has {len(specs)} entries for {len(example_inputs)} inputs")
    out = []
    for spec in specs:
        if spec is None:
            out.append({})
        elif isinstance(spec, dict):
            out.append({int(a): d for a, d in spec.items() if d is not None})
        else:
            out.append({a: d for a, d in enumerate(spec) if d is not None})
    return out


def _dim_name(dim: Any) -> str:
    name = getattr(dim, "__name__", None)
    if name is None or not hasattr(dim, "max") or hasattr(dim, "fn"):
        raise ValueError(f"dynamic_shapes: {dim!r} is not a plain torch.export.Dim (derived dimensions and "
                         f"Dim.AUTO/STATIC are not served by buckets)")
    return str(name)


# ------------------------------------------------------------------------------ ONNX

def from_onnx_dynamic(model: Any, max_sizes: dict[str, int], inputs: dict[str, Any] | None = None,
                      buckets: dict[str, Sequence[int]] | None = None) -> DynamicGraph:
    """`from_onnx` of a model whose inputs have symbolic dimensions (`dim_param`s), each given
    a maximum in `max_sizes`; each bucket is the model with those dimensions fixed, imported."""
    import onnx

    from ansor.graph.onnx_importer import from_onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(model)
    fed = set(inputs or {}) | {t.name for t in model.graph.initializer}
    graph_inputs = [vi for vi in model.graph.input if vi.name not in fed]
    axes: dict[int, dict[int, str]] = {}
    seen: set[str] = set()
    position = 0
    for vi in graph_inputs:
        shape = vi.type.tensor_type.shape.dim
        if any(d.HasField("dim_value") and d.dim_value == 0 for d in shape):
            continue  # an input with no elements is not a graph input (see from_onnx)
        for axis, d in enumerate(shape):
            if not d.HasField("dim_value"):
                if not d.dim_param or d.dim_param not in max_sizes:
                    raise ValueError(f"input {vi.name!r} axis {axis} is symbolic ({d.dim_param or '?'}): give "
                                     f"its maximum in max_sizes")
                axes.setdefault(position, {})[axis] = d.dim_param
                seen.add(d.dim_param)
        position += 1
    unknown = set(max_sizes) - seen
    if unknown:
        raise ValueError(f"max_sizes names {sorted(unknown)}, not symbolic dimensions of the model's inputs")
    dims = {n: DynamicDim(n, int(m), 1, tuple((buckets or {}).get(n, ()))) for n, m in max_sizes.items()}

    def make(sizes: dict[str, int]) -> Graph:
        fixed = onnx.ModelProto()
        fixed.CopyFrom(model)
        for vi in fixed.graph.input:
            for d in vi.type.tensor_type.shape.dim:
                if not d.HasField("dim_value") and d.dim_param in sizes:
                    d.dim_value = sizes[d.dim_param]
        del fixed.graph.value_info[:]  # inferred again at these sizes
        return from_onnx(fixed, inputs)

    return DynamicGraph(dims, axes, make)
