"""Which values of a graph a padded input reaches, and whether padding can change the result.

A bucket of a dynamic graph (`graph.dynamic`) is an ordinary static graph built at a bucket
size P; a call of length L <= P runs it on inputs padded to P. That is only sound where no
padded element reaches an element the caller keeps. This module proves it operator by operator
on the simplified graph, and says by name where it cannot:

- Every axis of every value carries the set of padded *factors* it holds: `Factor(dim, inner)`
  says that the axis index i has the sub-index (i // inner) % P of dimension `dim`, and that
  the element is padding when that sub-index is >= L. A graph input's dynamic axis is
  `Factor(dim, 1)`; a reshape that merges it with a batch axis gives a factor with inner 1 on
  the merged axis (and the batch axis's own factor, when batch is dynamic too).
- Elementwise operators, permutes, reshapes, matmuls and linears over other axes, normalizations
  and reductions over other axes, gathers of padded ids, slices and concats along other axes
  keep padding where it was: a kept element reads only kept elements.
- A contraction, reduction, slice, concat or normalization *along* a padded axis mixes padding
  into kept elements: refused (`PaddingError`, naming the operator and where it came from).
- Attention is the one operator that reduces over a padded axis (the keys) soundly, because it
  can mask: an attention whose keys are padded and that has no mask of its own gets the
  padding-lengths mask (a new graph input, `lengths_<dim>`, [batch] int32, filled with L at each
  call), which gives the padded keys a weight of exactly zero. Causal self-attention (queries
  and keys padded alike) needs none: a kept query i < L sees only keys j <= i. An additive
  mask over padded keys is refused.

Padding is filled with zeros, which keeps the padded rows of a transformer finite; masked keys
contribute weight 0 times a finite value, exactly 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ansor.graph.ir import Graph, Node
from ansor.graph.ops import BINARY_OPS, BITWISE_OPS, COMPARE_OPS, LOGICAL_OPS, REDUCE_OPS, UNARY_OPS

#: Operators that compute each output element from the operands' elements at the same
#: (broadcast) position.
ELEMENTWISE_OPS = frozenset(UNARY_OPS + BINARY_OPS + COMPARE_OPS + LOGICAL_OPS + BITWISE_OPS + (
    "where", "cast", "gelu", "clamp", "logical_not", "bitwise_not", "mod", "trunc_div", "divide_rounded"))


class PaddingError(ValueError):
    """Padding along a dynamic dimension would change a kept element: the graph cannot serve
    shorter lengths from a padded bucket. `node` is the refused node (None when not one)."""

    node: Node | None = None


@dataclass(frozen=True)
class Factor:
    """A padded dimension inside one axis: the axis index i holds the dimension's index
    (i // inner) % P."""

    dim: str
    inner: int


Roles = tuple[frozenset, ...]  # per axis, the padded factors it holds


@dataclass
class PaddingPlan:
    """A bucket graph made sound for padded calls: `graph` (with the lengths inputs added),
    the padded factors of each output's axes, and the lengths inputs by dimension."""

    graph: Graph
    output_roles: list[Roles]
    lengths_inputs: dict[str, str]
    value_roles: dict[str, Roles] = field(default_factory=dict)  # every value's, by name


def plan_padding(graph: Graph, dynamic_axes: dict[str, dict[int, str]], sizes: dict[str, int]) -> PaddingPlan:
    """Check `graph` (simplified; its inputs' `dynamic_axes` {input: {axis: dim}} padded to
    `sizes` {dim: P}) and give every attention over padded keys the lengths mask."""
    g = graph.copy()
    roles: dict[str, Roles] = {}
    for name in g.inputs:
        shape = g.type_of(name).shape
        axes = dynamic_axes.get(name, {})
        for axis, dim in axes.items():
            if shape[axis] != sizes[dim]:
                raise PaddingError(f"input {name!r} axis {axis} has extent {shape[axis]}, "
                                   f"not the bucket size {sizes[dim]} of {dim!r}")
        roles[name] = tuple(frozenset({Factor(axes[a], 1)}) if a in axes else frozenset() for a in range(len(shape)))
    planner = _Planner(g, sizes)
    for node in list(g.nodes):
        ins = [roles.get(i) or _none(g, i) for i in node.inputs]
        roles[node.output] = planner.rule(node, ins) if any(any(r) for r in ins) else _none(g, node.output)
    g.remove_dead()  # a zero mask dropped from an attention
    g.validate()
    return PaddingPlan(g, [roles.get(o) or _none(g, o) for o in g.outputs], planner.lengths, roles)


def valid_indices(extent: int, factors: frozenset, sizes: dict[str, int], lengths: dict[str, int]) -> np.ndarray | None:
    """The kept positions of an axis of `extent` holding `factors` at a call of `lengths`
    (None: all of them)."""
    if not factors:
        return None
    index = np.arange(extent)
    keep = np.ones(extent, dtype=bool)
    for f in factors:
        keep &= (index // f.inner) % sizes[f.dim] < lengths[f.dim]
    return np.nonzero(keep)[0]


# ------------------------------------------------------------------------------ the rules

def _none(g: Graph, name: str) -> Roles:
    return tuple(frozenset() for _ in g.type_of(name).shape)


def _refuse(node: Node, why: str) -> PaddingError:
    where = f" ({node.source})" if node.source else ""
    error = PaddingError(f"{node.op} %{node.output}: {why}; padding a shorter length to its bucket would change "
                         f"the result{where}")
    error.node = node
    return error


def _padded_axes(r: Roles) -> list[int]:
    return [a for a, f in enumerate(r) if f]


def _broadcast(g: Graph, node: Node, ins: list[Roles]) -> Roles:
    rank = len(g.types[node.output].shape)
    out: list[frozenset] = [frozenset()] * rank
    for name, r in zip(node.inputs, ins):
        offset = rank - len(r)
        for a, f in enumerate(r):
            if not f:
                continue
            have = out[offset + a]
            if have and have != f:
                raise _refuse(node, f"operands padded along different dimensions meet on axis {offset + a}")
            out[offset + a] = f
    return tuple(out)


class _Planner:
    """The per-operator rules over one bucket graph (`sizes`: its bucket sizes)."""

    def __init__(self, g: Graph, sizes: dict[str, int]):
        self.g, self.sizes = g, sizes
        self.lengths: dict[str, str] = {}

    def rule(self, node: Node, ins: list[Roles]) -> Roles:
        """The padded factors of `node`'s output axes, or PaddingError."""
        g = self.g
        return _rule(g, node, ins, self)


def _rule(g: Graph, node: Node, ins: list[Roles], planner: _Planner) -> Roles:
    op, a = node.op, node.attrs
    x = ins[0]
    rank = len(x)
    if op in ELEMENTWISE_OPS:
        return _broadcast(g, node, ins)
    if op == "reshape":
        return _reshape(node, g.type_of(node.inputs[0]).shape, g.types[node.output].shape, x, planner.sizes)
    if op == "permute":
        return tuple(x[i] for i in a["axes"])
    if op == "expand":
        return _broadcast(g, node, ins)
    if op in ("slice", "concat", "softmax", "log_softmax", "cumsum", "arg_reduce", "topk"):
        axis = a["axis"] % rank
        if any(r[axis] for r in ins):
            raise _refuse(node, f"it works along padded axis {axis}")
        if op == "concat":
            return _broadcast(g, node, ins)
        return x if op != "arg_reduce" else _drop_axes(x, {axis}, a["keepdims"])
    if op in REDUCE_OPS:
        axes = {ax % rank for ax in a["axes"]} if a["axes"] else set(range(rank))
        if any(x[ax] for ax in axes):
            raise _refuse(node, f"it reduces over padded axis {sorted(ax for ax in axes if x[ax])[0]}")
        return _drop_axes(x, axes, a["keepdims"])
    if op == "layer_norm":
        if any(x[rank - a["normalized_ndim"]:]):
            raise _refuse(node, "it normalizes over a padded axis")
        if any(any(r) for r in ins[1:]):
            raise _refuse(node, "its scale or shift is padded")
        return x
    if op == "linear":
        if x[-1] or any(any(r) for r in ins[1:]):
            raise _refuse(node, "it contracts a padded axis")
        return x[:-1] + (frozenset(),)
    if op == "matmul":
        ra, rb = ins
        if ra[-1] or rb[-2]:
            raise _refuse(node, "it contracts a padded axis")
        rank_out = len(g.types[node.output].shape)
        batch = _broadcast_batch(node, ra[:-2], rb[:-2], rank_out - 2)
        return batch + (ra[-2], rb[-1])
    if op == "embedding":
        table, ids = ins
        if any(table):
            raise _refuse(node, "its table is padded")
        return ids + (frozenset(),)
    if op == "take":
        axis = a["axis"] % rank
        if x[axis]:
            raise _refuse(node, f"it gathers along padded axis {axis}")
        return x[:axis] + ins[1] + x[axis + 1:]
    if op == "attention":
        return _attention(g, node, ins, planner.lengths)
    raise _refuse(node, "an operator the padding analysis does not know reads a padded value")


def _drop_axes(x: Roles, axes: set, keepdims: bool) -> Roles:
    if keepdims:
        return tuple(frozenset() if i in axes else f for i, f in enumerate(x))
    return tuple(f for i, f in enumerate(x) if i not in axes)


def _broadcast_batch(node: Node, a: Roles, b: Roles, rank: int) -> Roles:
    out: list[frozenset] = [frozenset()] * rank
    for r in (a, b):
        for i, f in enumerate(r):
            pos = rank - len(r) + i
            if f and out[pos] and out[pos] != f:
                raise _refuse(node, "operands padded along different dimensions meet")
            out[pos] = out[pos] or f
    return tuple(out)


def _reshape(node: Node, shape_in: tuple, shape_out: tuple, x: Roles, sizes: dict[str, int]) -> Roles:
    """Each padded factor keeps its flat stride (a reshape keeps the row-major order); it must
    land inside one output axis."""
    out: list[set] = [set() for _ in shape_out]
    strides_out = [math.prod(shape_out[b + 1:]) for b in range(len(shape_out))]
    for axis, factors in enumerate(x):
        stride_in = math.prod(shape_in[axis + 1:])
        for f in factors:
            span_lo = stride_in * f.inner                       # the factor's flat stride
            span_hi = span_lo * sizes[f.dim]
            for b, (t, extent) in enumerate(zip(strides_out, shape_out)):
                if extent > 1 and span_lo % t == 0 and (t * extent) % span_hi == 0 and t <= span_lo:
                    out[b].add(Factor(f.dim, span_lo // t))
                    break
            else:
                raise _refuse(node, f"it splits padded dimension {f.dim!r} across axes")
    return tuple(frozenset(s) for s in out)


def _attention(g: Graph, node: Node, ins: list[Roles], lengths: dict[str, str]) -> Roles:
    q, k, v = ins[:3]
    if q[1] or k[1] or q[3] or k[3] or v[3]:
        raise _refuse(node, "its heads or head dimension are padded")
    if k[2] != v[2]:
        raise _refuse(node, "its keys and values are padded differently")
    if k[0] and q[0] != k[0]:
        raise _refuse(node, "its queries and keys are padded differently along the batch")
    key_factors = k[2]
    if key_factors:
        if len(key_factors) != 1 or next(iter(key_factors)).inner != 1:
            raise _refuse(node, "its key axis mixes padded dimensions")
        dim = next(iter(key_factors)).dim
        if node.attrs["mask"] == "additive" and g.is_constant(node.inputs[3]) \
                and not np.any(g.constants[node.inputs[3]]):
            node.inputs = node.inputs[:3]  # a mask of zeros (a model's default "attend to all") hides nothing
            node.attrs = {**node.attrs, "mask": "none"}
        if node.attrs["mask"] == "additive":
            raise _refuse(node, f"an additive mask cannot hide the keys padded along {dim!r}")
        aligned = node.attrs["causal"] and q[2] == key_factors and \
            g.type_of(node.inputs[0]).shape[2] == g.type_of(node.inputs[1]).shape[2]
        if node.attrs["mask"] == "none" and not aligned:  # causal self-attention: kept queries see kept keys only
            batch = g.type_of(node.inputs[0]).shape[0]
            name = lengths.get(dim)
            if name is None:
                name = f"lengths_{dim}"
                g.add_input(name, (batch,), "int32")
                lengths[dim] = name
            elif g.type_of(name).shape != (batch,):
                raise _refuse(node, f"the batch of its keys differs from another attention's over {dim!r}")
            node.inputs = node.inputs[:3] + [name]
            node.attrs = {**node.attrs, "mask": "lengths"}
    if node.attrs["heads_last"]:
        return (q[0], q[2], frozenset(), frozenset())
    return (q[0], frozenset(), q[2], frozenset())
