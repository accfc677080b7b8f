"""A fused subgraph as a tensor-expression declaration: the task the tuner sees.

Each node becomes one te compute stage (an anchor through the ready operators of `te.ops` where
they fit); the search inlines the elementwise stages into their consumers or producers, so a
conv2d followed by a bias add and a ReLU is scheduled as one loop nest. The subgraph's inputs
become placeholders, its weights `constant=True` placeholders (so the search may rewrite their
layout once, ahead of the calls), and constants of one element (a scale, an epsilon) literals.

Placeholders and stages are named structurally (x0.. for inputs, w0.. for weights, t<k>_<op>
for stages), so subgraphs with equal keys give tasks with equal workload keys and share tuning
records. An op that has no te form here raises `NotImplementedError` naming it: an executor
then runs that subgraph with the reference kernels (`reference.run_node`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence, Union

import numpy as np

from ansor import te
from ansor.graph.half_precision import (
    NO_WIDENED_FORM,
    compute_type,
    rounded,
    widen_value,
    widened,
)
from ansor.graph.ir import Node
from ansor.graph.ops import TensorType, channel_dim, spatial_dims
from ansor.graph.partition import SCALAR_ELEMENTS, Subgraph, canonical_names
from ansor.target import Target
from ansor.task import Task
from ansor.te import expr as E
from ansor.te import winograd
from ansor.te.attention import attention
from ansor.te.tensor import Tensor

#: the types every lowering was written for; with another (float16, int8, ...) a lowering may
#: meet te's dtype rules (a sum never accumulates in float16), and then the reference runs it
_FULL_WIDTH = frozenset(("float32", "float64", "int32", "int64", "bool"))

Value = Union[Tensor, E.Expr]  # a tensor, or a literal standing for a one-element constant
Lowering = Callable[[list[Value], Node, TensorType, str], Tensor]
LOWERINGS: dict[str, Lowering] = {}


@dataclass
class SubgraphTask:
    """A Task with the map back to its subgraph: `input_names` are the subgraph values the
    Task's non-constant placeholders stand for, `constant_names` its weights, both in the
    Task's input order (activations first, then weights)."""

    task: Task
    subgraph: Subgraph
    input_names: list[str]
    constant_names: list[str]

    def constant_arrays(self) -> list[np.ndarray]:
        """The weights in the Task's order of constant inputs."""
        return [self.subgraph.graph.constants[c] for c in self.constant_names]

    def arguments(self, activations: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The Task's full input list: the subgraph's inputs (in `subgraph.inputs` order) and
        then its weights."""
        if len(activations) != len(self.input_names):
            raise ValueError(f"{self.task.name}: expected {len(self.input_names)} inputs, "
                             f"got {len(activations)}")
        return [np.asarray(a) for a in activations] + self.constant_arrays()

    def bindings(self) -> dict[str, np.ndarray]:
        """The weights by placeholder name, for `Kernel.bind`."""
        names = [t.name for t in self.task.inputs if t.op.constant]
        return dict(zip(names, self.constant_arrays()))


def lower_subgraph(subgraph: Subgraph, target: Target | None = None) -> SubgraphTask:
    """Declare `subgraph` in te and wrap it in a Task named after its anchor op and shape.

    Raises NotImplementedError naming the first op (or dtype) that has no te form."""
    g = subgraph.graph
    names = canonical_names(g)
    env: dict[str, Value] = {}
    placeholders: list[Tensor] = []
    for name in g.inputs:
        t = g.types[name]
        _check_type(t, f"input {name!r}")
        env[name] = te.placeholder(t.shape, t.dtype, name=names[name])
        placeholders.append(env[name])
    constant_names = []
    for name in subgraph.constants:
        arr = g.constants[name]
        t = TensorType(tuple(arr.shape), str(arr.dtype))
        _check_type(t, f"constant {name!r}", allow_scalar=arr.size <= SCALAR_ELEMENTS)
        if arr.size <= SCALAR_ELEMENTS:
            env[name] = E.const(arr.reshape(-1)[0].item(), t.dtype)
            continue
        env[name] = te.placeholder(t.shape, t.dtype, name=names[name], constant=True)
        placeholders.append(env[name])
        constant_names.append(name)
    for node in g.nodes:
        if node.op not in LOWERINGS:
            raise NotImplementedError(f"no te lowering for operator {node.op!r} "
                                      f"(%{node.output}); run it with the reference kernels")
        out_type = g.types[node.output]
        _check_type(out_type, f"%{node.output} = {node.op}")
        if out_type.dtype == "bool":  # te computes hold numbers; conditions live in expressions
            raise NotImplementedError(f"%{node.output} = {node.op}: a bool result has no te form")
        args = [env[i] for i in node.inputs]
        stage_name = f"{names[node.output]}_{node.op}"
        widen = widened(node, g)  # bfloat16 computed in float32, rounded once
        if widen and node.op in NO_WIDENED_FORM:
            raise NotImplementedError(f"%{node.output} = {node.op}: no te form on bfloat16 operands")
        try:
            if widen:
                result = LOWERINGS[node.op]([widen_value(a) for a in args], node,
                                            compute_type(out_type), stage_name)
                env[node.output] = rounded(result, out_type.dtype, stage_name)
            else:
                env[node.output] = LOWERINGS[node.op](args, node, out_type, stage_name)
        except TypeError as exc:  # te's dtype rules (a float16 sum, a mix): the reference runs it
            if all(g.types[i].dtype in _FULL_WIDTH for i in [*node.inputs, node.output]):
                raise
            raise NotImplementedError(f"%{node.output} = {node.op}: {exc}") from None
    outputs = [env[o] for o in g.outputs]
    task = Task(placeholders + outputs, target=target, name=subgraph.name)
    return SubgraphTask(task, subgraph, list(g.inputs), constant_names)


def to_task(subgraph: Subgraph, target: Target | None = None) -> Task:
    """The Task of `subgraph` (see `lower_subgraph` for its inputs' order)."""
    return lower_subgraph(subgraph, target).task


def _check_type(t: TensorType, what: str, allow_scalar: bool = False) -> None:
    if t.dtype not in E.DTYPES:
        raise NotImplementedError(f"{what}: dtype {t.dtype} has no te form")
    if not t.shape and not allow_scalar:
        raise NotImplementedError(f"{what}: rank-0 tensors have no te form")


def _lowers(*ops: str):
    def deco(fn: Lowering) -> Lowering:
        for op in ops:
            LOWERINGS[op] = fn
        return fn

    return deco


# ----------------------------------------------------------------------------- reading helpers


def _read(x: Value, idx: tuple, out_shape: tuple[int, ...]) -> E.Expr:
    """x at the output position `idx` under numpy broadcasting (literals broadcast anywhere)."""
    if not isinstance(x, Tensor):
        return x
    nd = len(out_shape)
    own = idx[nd - x.ndim:]
    return x[tuple(0 if x.shape[d] == 1 and out_shape[nd - x.ndim + d] != 1 else i
                   for d, i in enumerate(own))]


def _tensor(x: Value, node: Node, role: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise NotImplementedError(f"{node.op}: a one-element {role} has no te form here")
    return x


def _elementwise(fn: Callable[..., E.Expr]) -> Lowering:
    def lower(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
        shape = out.shape
        return te.compute(shape, lambda *i: fn(node, *(_read(a, i, shape) for a in args)),
                          name=name, tag="elemwise")

    return lower


# ----------------------------------------------------------------------------- elementwise

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_UNARY: dict[str, Callable[[Node, E.Expr], E.Expr]] = {
    "relu": lambda n, x: E.maximum(x, 0),
    "sigmoid": lambda n, x: E.sigmoid(x),
    "tanh": lambda n, x: E.tanh(x),
    "exp": lambda n, x: E.exp(x),
    "log": lambda n, x: E.log(x),
    "sqrt": lambda n, x: E.sqrt(x),
    "rsqrt": lambda n, x: E.rsqrt(x),
    "neg": lambda n, x: -x,
    "abs": lambda n, x: E.abs(x),
    "erf": lambda n, x: E.erf(x),
    "silu": lambda n, x: x * E.sigmoid(x),
    "hardswish": lambda n, x: x * E.minimum(E.maximum(x + 3.0, 0.0), 6.0) / 6.0,
    "hardsigmoid": lambda n, x: E.minimum(E.maximum(x + 3.0, 0.0), 6.0) / 6.0,
    "logical_not": lambda n, x: ~x,
    "cast": lambda n, x: E.cast(x, str(np.dtype(n.attrs["dtype"]))),
    **{f: (lambda fn: lambda n, x: fn(x))(getattr(E, f)) for f in E.ELEMENTARY_FUNCS},
    "sign": lambda n, x: E.if_then_else(x > 0, E.const(1, x.dtype),
                                        E.if_then_else(x < 0, E.const(-1, x.dtype), E.const(0, x.dtype))),
}
_BINARY: dict[str, Callable[[Node, E.Expr, E.Expr], E.Expr]] = {
    "add": lambda n, a, b: a + b,
    "sub": lambda n, a, b: a - b,
    "mul": lambda n, a, b: a * b,
    "div": lambda n, a, b: a / b,
    "pow": lambda n, a, b: E.pow(a, b),
    "maximum": lambda n, a, b: E.maximum(a, b),
    "minimum": lambda n, a, b: E.minimum(a, b),
    "eq": lambda n, a, b: E.compare("==", a, b),
    "ne": lambda n, a, b: E.compare("!=", a, b),
    "lt": lambda n, a, b: E.compare("<", a, b),
    "le": lambda n, a, b: E.compare("<=", a, b),
    "gt": lambda n, a, b: E.compare(">", a, b),
    "ge": lambda n, a, b: E.compare(">=", a, b),
    "logical_and": lambda n, a, b: a & b,
    "logical_or": lambda n, a, b: a | b,
    "logical_xor": lambda n, a, b: E.compare("!=", a, b),
}
for _op, _fn in {**_UNARY, **_BINARY}.items():
    LOWERINGS[_op] = _elementwise(_fn)


def _gelu(n: Node, x: E.Expr) -> E.Expr:
    if n.attrs["approximate"] == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))
        return 0.5 * x * (1.0 + E.tanh(inner))
    return 0.5 * x * (1.0 + E.erf(x * _SQRT_HALF))


def _clamp(n: Node, x: E.Expr) -> E.Expr:
    if n.attrs["min"] is not None:
        x = E.maximum(x, E.const(n.attrs["min"], x.dtype))
    if n.attrs["max"] is not None:
        x = E.minimum(x, E.const(n.attrs["max"], x.dtype))
    return x


LOWERINGS["gelu"] = _elementwise(_gelu)
LOWERINGS["clamp"] = _elementwise(_clamp)
LOWERINGS["where"] = _elementwise(lambda n, c, a, b: E.if_then_else(c, a, b))


@_lowers("batch_norm")
def _batch_norm(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    x, mean, var, w, b = args
    eps = node.attrs["eps"]

    def channel(t: Value, c: E.Expr) -> E.Expr:
        return t[c] if isinstance(t, Tensor) else t

    def body(*i):
        c = i[1]
        scale = channel(w, c) * E.rsqrt(channel(var, c) + eps)
        return (_read(x, i, out.shape) - channel(mean, c)) * scale + channel(b, c)

    return te.compute(out.shape, body, name=name, tag="elemwise")


# ----------------------------------------------------------------------------- dense


@_lowers("conv2d")
def _conv2d(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    data, weight = _tensor(args[0], node, "input"), _tensor(args[1], node, "weight")
    a = node.attrs
    layout, groups = a["layout"], a["groups"]
    c_axis = channel_dim(layout)
    filter_inputs = weight.shape[2 if layout == "NHWC" else 1]  # the I of HWIO or OIHW
    if groups > 1 and groups == data.shape[c_axis] and filter_inputs == 1:
        y = te.ops.depthwise_conv2d(data, weight, a["stride"], tuple(a["padding"]),
                                    a["dilation"], layout=layout, name=name)
    else:
        y = te.ops.conv2d(data, weight, a["stride"], tuple(a["padding"]), a["dilation"],
                          groups=groups, layout=layout, name=name)
    if len(args) == 3:
        bias, conv, channels = args[2], y, (out.shape[c_axis],)
        y = te.compute(out.shape, lambda *i: conv[i] + _read(bias, (i[c_axis],), channels),
                       name=f"{name}_bias", tag="elemwise")
    return y


@_lowers("winograd_input")
def _winograd_input(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    data, bt = _tensor(args[0], node, "input"), _tensor(args[1], node, "transform")
    return winograd.winograd_input(data, bt, tuple(node.attrs["padding"]), node.attrs["tile"], name=name)


@_lowers("winograd_output")
def _winograd_output(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    m, at = _tensor(args[0], node, "products"), _tensor(args[1], node, "transform")
    y = winograd.winograd_output(m, at, out.shape[:3], node.attrs["tile"], name=name)
    if len(args) == 3:
        bias, tiles, channels = args[2], y, (out.shape[3],)
        y = te.compute(out.shape, lambda *i: tiles[i] + _read(bias, (i[3],), channels),
                       name=f"{name}_bias", tag="elemwise")
    return y


@_lowers("linear")
def _linear(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    """y = x @ w.T (+ b) over any leading dims of x; w stays [out, in], the dense layout."""
    x, w = _tensor(args[0], node, "input"), _tensor(args[1], node, "weight")
    k = te.reduce_axis(x.shape[-1], "k")
    y = te.compute(out.shape, lambda *i: E.sum(x[i[:-1] + (k,)] * w[i[-1], k], axis=k),
                   name=name, tag="dense")
    if len(args) == 3:
        b = args[2]
        y_ = y
        y = te.compute(out.shape, lambda *i: y_[i] + _read(b, i, out.shape),
                       name=f"{name}_bias", tag="elemwise")
    return y


def _batch_index(t: Tensor, batch: tuple[int, ...], i: tuple) -> tuple:
    """The batch indices of `t` (all dims but its last two) at output batch position `i`,
    under numpy broadcasting."""
    nb = t.ndim - 2
    own = i[len(batch) - nb:len(batch)] if nb else ()
    return tuple(0 if t.shape[d] == 1 and batch[len(batch) - nb + d] != 1 else v
                 for d, v in enumerate(own))


@_lowers("matmul")
def _matmul(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    """Batched a @ b with numpy broadcasting of the batch dims."""
    a, b = _tensor(args[0], node, "operand"), _tensor(args[1], node, "operand")
    batch = out.shape[:-2]
    k = te.reduce_axis(a.shape[-1], "k")

    def body(*i):
        row, col = i[-2], i[-1]
        return E.sum(a[_batch_index(a, batch, i) + (row, k)]
                     * b[_batch_index(b, batch, i) + (k, col)], axis=k)

    return te.compute(out.shape, body, name=name, tag="batch_matmul")


@_lowers("scaled_dot_product_attention")
def _attention(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v in four stages (scores, the masked softmax's, the
    weighted sum); masked positions take the lowest value so they never win the max."""
    q, k, v = (_tensor(a, node, r) for a, r in zip(args[:3], ("query", "key", "value")))
    batch = out.shape[:-2]
    lq, lk = q.shape[-2], k.shape[-2]
    scores_shape = batch + (lq, lk)
    scale = node.attrs["scale"] if node.attrs["scale"] is not None else 1 / math.sqrt(q.shape[-1])
    lowest = E.reduce_identity("max", q.dtype).value
    mask = args[3] if len(args) == 4 else None
    d = te.reduce_axis(q.shape[-1], "d")

    def score(*i):
        return E.sum(q[_batch_index(q, batch, i) + (i[-2], d)]
                     * k[_batch_index(k, batch, i) + (i[-1], d)] * scale, axis=d)

    s = te.compute(scores_shape, score, name=f"{name}_scores", tag="batch_matmul")
    if mask is not None or node.attrs["is_causal"]:
        raw = s

        def masked(*i):
            value = raw[i]
            if node.attrs["is_causal"]:
                value = E.if_then_else(i[-1] <= i[-2], value, lowest)
            if mask is not None:
                m = _read(mask, i, scores_shape)
                value = E.if_then_else(m, value, lowest) if m.dtype == "bool" else value + m
            return value

        s = te.compute(scores_shape, masked, name=f"{name}_mask", tag="elemwise")
    p = te.ops.softmax(s, axis=-1, name=f"{name}_softmax")
    j = te.reduce_axis(lk, "j")
    return te.compute(out.shape, lambda *i: E.sum(
        p[i[:-1] + (j,)] * v[_batch_index(v, batch, i) + (j, i[-1])], axis=j),
        name=name, tag="batch_matmul")


def _wrap_index(v: E.Expr, n: int) -> E.Expr:
    """A gathered index as numpy takes it (negative counts from the end), clamped into [0, n).
    The clamp is a memory guard, not a meaning: ids outside the table are an error, which the
    compiled model raises before the kernel runs (it scans the ids with
    `reference.check_indices`, as the numpy executor does); the kernel itself cannot raise,
    and the clamp keeps every read of the generated code inside the table whatever the ids
    hold. Ids the check lets through are never changed by it."""
    v = E.if_then_else(v < 0, v + n, v)
    return E.minimum(E.maximum(v, 0), n - 1)


@_lowers("embedding")
def _embedding(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    """Rows of the table picked by the ids: a gather, read with data-dependent indices."""
    table, ids = _tensor(args[0], node, "table"), args[1]
    nd = len(out.shape) - 1

    def body(*i):
        row = _read(ids, i[:nd], out.shape[:nd])
        return table[_wrap_index(row, table.shape[0]), i[-1]]

    return te.compute(out.shape, body, name=name, tag="injective")


@_lowers("take")
def _take(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    """np.take along an axis: the index tensor's dims replace that axis (see `_wrap_index`)."""
    table, ids = _tensor(args[0], node, "table"), args[1]
    axis = node.attrs["axis"] % table.ndim
    k = len(out.shape) - table.ndim + 1  # the index's rank

    def body(*i):
        at = _read(ids, i[axis:axis + k], out.shape[axis:axis + k])
        return table[i[:axis] + (_wrap_index(at, table.shape[axis]),) + i[axis + k:]]

    return te.compute(out.shape, body, name=name, tag="injective")


@_lowers("index")
def _index(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    """x[i0, i1, ...]: the index tensors broadcast together and replace x's leading axes."""
    x, idx = _tensor(args[0], node, "input"), args[1:]
    nb = len(out.shape) - (x.ndim - len(idx))
    batch = out.shape[:nb]

    def body(*i):
        lead = tuple(_wrap_index(_read(t, i[:nb], batch), x.shape[d]) for d, t in enumerate(idx))
        return x[lead + i[nb:]]

    return te.compute(out.shape, body, name=name, tag="injective")


# ----------------------------------------------------------------------------- reductions


def _full_index(out_idx: tuple, axes: set[int], reduce: list, rank: int, keepdims: bool) -> tuple:
    """Input indices from output indices and the reduce axes of the reduced dims."""
    result, o, r = [], 0, 0
    for d in range(rank):
        if d in axes:
            result.append(reduce[r])
            r += 1
            if keepdims:
                o += 1
        else:
            result.append(out_idx[o])
            o += 1
    return tuple(result)


@_lowers("mean", "sum", "max", "min")
def _reduce(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    x = _tensor(args[0], node, "input")
    axes = {a % x.ndim for a in node.attrs["axes"]}
    if not axes:  # numpy reduces over no axis: the input itself
        return te.compute(out.shape, lambda *i: x[i], name=name, tag="elemwise")
    red = [te.reduce_axis(x.shape[d], f"r{d}") for d in sorted(axes)]
    keep = node.attrs["keepdims"]
    count = int(np.prod([x.shape[d] for d in axes]))

    def body(*i):
        v = x[_full_index(i, axes, red, x.ndim, keep)]
        if node.op == "max":
            return E.max(v, axis=red)
        if node.op == "min":
            return E.min(v, axis=red)
        return E.sum(v * (1.0 / count) if node.op == "mean" else v, axis=red)

    return te.compute(out.shape, body, name=name, tag=f"reduce_{node.op}")


@_lowers("softmax")
def _softmax(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    return te.ops.softmax(_tensor(args[0], node, "input"), node.attrs["axis"], name=name)


@_lowers("log_softmax")
def _log_softmax(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    x = _tensor(args[0], node, "input")
    ax = node.attrs["axis"] % x.ndim
    red_shape = x.shape[:ax] + (1,) + x.shape[ax + 1:]
    k1, k2 = te.reduce_axis(x.shape[ax], "k"), te.reduce_axis(x.shape[ax], "k")

    def at(i: tuple, k) -> tuple:
        return i[:ax] + (k,) + i[ax + 1:]

    xmax = te.compute(red_shape, lambda *i: E.max(x[at(i, k1)], axis=k1), name=f"{name}_max")
    total = te.compute(red_shape, lambda *i: E.sum(E.exp(x[at(i, k2)] - xmax[i]), axis=k2),
                       name=f"{name}_sum")
    return te.compute(x.shape, lambda *i: x[i] - xmax[at(i, 0)] - E.log(total[at(i, 0)]),
                      name=name, tag="elemwise")


@_lowers("layer_norm")
def _layer_norm(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    if node.attrs["normalized_ndim"] != 1:
        raise NotImplementedError("layer_norm over more than one axis has no te lowering")
    x = _tensor(args[0], node, "input")
    gamma = _tensor(args[1], node, "weight") if len(args) > 1 else None
    beta = _tensor(args[2], node, "bias") if len(args) > 2 else None
    return te.ops.layer_norm(x, gamma, beta, axis=-1, eps=node.attrs["eps"], name=name)


# ----------------------------------------------------------------------------- pooling


def _pool_pads(in_hw: Sequence[int], out_hw: Sequence[int], kernel, stride, padding,
               dilation) -> list[tuple]:
    """(before, after) padding per spatial axis so every output window lies inside the padded
    input (ceil mode windows may reach past the declared padding)."""
    pads = []
    for d in range(2):
        need = (out_hw[d] - 1) * stride[d] + (kernel[d] - 1) * dilation[d] + 1
        p = padding[d]
        pads.append((p, max(0, need - in_hw[d] - p)))
    return pads


class _Layout:
    """Index helpers for a pooling operator's NCHW or NHWC activations, so that one body
    written over (n, c, y, x) serves both."""

    def __init__(self, layout: str):
        self.nhwc = layout == "NHWC"
        self.spatial = spatial_dims(layout)

    def hw(self, shape: Sequence[int]) -> tuple[int, int]:
        return shape[self.spatial[0]], shape[self.spatial[1]]

    def at(self, n, c, y, x) -> tuple:
        """An index tuple in this layout from its named parts."""
        return (n, y, x, c) if self.nhwc else (n, c, y, x)

    def body(self, fn: Callable) -> Callable:
        """A te.compute body over this layout's axes calling fn(n, c, y, x)."""
        if self.nhwc:
            return lambda n, y, x, c: fn(n, c, y, x)
        return fn

    def padded(self, x: Tensor, pads: list[tuple], value: float, name: str) -> Tensor:
        if not any(p for pair in pads for p in pair):
            return x
        (t, b), (left, r) = pads
        return te.ops.pad(x, self.at(0, 0, t, left), self.at(0, 0, b, r), value, name=name)


@_lowers("max_pool2d")
def _max_pool2d(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    x = _tensor(args[0], node, "input")
    a = node.attrs
    L = _Layout(a["layout"])
    (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["stride"], a["dilation"]
    pads = _pool_pads(L.hw(x.shape), L.hw(out.shape), a["kernel"], a["stride"], a["padding"],
                      a["dilation"])
    src = L.padded(x, pads, E.reduce_identity("max", x.dtype).value, f"{name}_pad")
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    return te.compute(out.shape, L.body(lambda n, c, y, w: E.max(
        src[L.at(n, c, y * sh + ry * dh, w * sw + rx * dw)], axis=[ry, rx])), name=name,
        tag="pool_max")


@_lowers("avg_pool2d")
def _avg_pool2d(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    """Window sums divided by the divisor, or by the count of cells inside the input (with its
    declared padding when count_include_pad), computed from the output position."""
    x = _tensor(args[0], node, "input")
    a = node.attrs
    L = _Layout(a["layout"])
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["padding"]
    pads = _pool_pads(L.hw(x.shape), L.hw(out.shape), a["kernel"], a["stride"], a["padding"],
                      (1, 1))
    src = L.padded(x, pads, 0.0, f"{name}_pad")
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    total = te.compute(out.shape, L.body(lambda n, c, y, w: E.sum(
        src[L.at(n, c, y * sh + ry, w * sw + rx)], axis=[ry, rx])), name=f"{name}_sum",
        tag="pool_sum")
    h, wd = L.hw(x.shape)
    if a["divisor_override"] is not None:
        inv = 1.0 / a["divisor_override"]
        return te.compute(out.shape, lambda *i: total[i] * inv, name=name, tag="elemwise")
    lo_h, hi_h, lo_w, hi_w = (-ph, h + ph, -pw, wd + pw) if a["count_include_pad"] else \
        (0, h, 0, wd)

    def cells(pos, s, p, k, lo, hi):
        start = pos * s - p
        return E.minimum(start + k, hi) - E.maximum(start, lo)

    def body(n, c, y, w):
        count = cells(y, sh, ph, kh, lo_h, hi_h) * cells(w, sw, pw, kw, lo_w, hi_w)
        return total[L.at(n, c, y, w)] / E.cast(count, x.dtype)

    return te.compute(out.shape, L.body(body), name=name, tag="elemwise")


@_lowers("adaptive_avg_pool2d")
def _adaptive_avg_pool2d(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    x = _tensor(args[0], node, "input")
    L = _Layout(node.attrs["layout"])
    (h, w), (oh, ow) = L.hw(x.shape), L.hw(out.shape)
    if h % oh or w % ow:
        raise NotImplementedError("adaptive_avg_pool2d with uneven windows has no te lowering")
    kh, kw = h // oh, w // ow
    ry, rx = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")
    inv = 1.0 / (kh * kw)
    return te.compute(out.shape, L.body(lambda n, c, y, xx: E.sum(
        x[L.at(n, c, y * kh + ry, xx * kw + rx)] * inv, axis=[ry, rx])), name=name,
        tag="pool_avg")


# ----------------------------------------------------------------------------- layout


@_lowers("reshape")
def _reshape(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    x = _tensor(args[0], node, "input")

    def strides(shape: tuple[int, ...]) -> list[int]:
        return [int(np.prod(shape[d + 1:])) for d in range(len(shape))]

    out_strides, in_strides = strides(out.shape), strides(x.shape)

    def body(*i):
        flat = None
        for v, s, n in zip(i, out_strides, out.shape):
            if n == 1:
                continue
            term = v * s if s != 1 else v
            flat = term if flat is None else flat + term
        if flat is None:
            return x[tuple(0 for _ in x.shape)]
        idx = []
        for s, n in zip(in_strides, x.shape):
            if n == 1:
                idx.append(0)
                continue
            q = flat // s if s != 1 else flat
            idx.append(q % n if s * n < int(np.prod(out.shape)) else q)
        return x[tuple(idx)]

    return te.compute(out.shape, body, name=name, tag="injective")


@_lowers("permute")
def _permute(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    x = _tensor(args[0], node, "input")
    axes = tuple(node.attrs["axes"])

    def body(*i):
        idx = [None] * x.ndim
        for d, a in enumerate(axes):
            idx[a] = i[d]
        return x[tuple(idx)]

    return te.compute(out.shape, body, name=name, tag="injective")


@_lowers("expand")
def _expand(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    x = args[0]
    return te.compute(out.shape, lambda *i: _read(x, i, out.shape), name=name, tag="injective")


@_lowers("slice")
def _slice(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    x = _tensor(args[0], node, "input")
    a = node.attrs
    ax, start, step = a["axis"] % x.ndim, a["start"], a["step"]

    def body(*i):
        pos = i[ax] * step if step != 1 else i[ax]
        pos = pos + start if start else pos
        return x[i[:ax] + (pos,) + i[ax + 1:]]

    return te.compute(out.shape, body, name=name, tag="injective")


@_lowers("concat")
def _concat(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    xs = [_tensor(a, node, "input") for a in args]
    ax = node.attrs["axis"] % len(out.shape)
    offsets = np.cumsum([0] + [t.shape[ax] for t in xs]).tolist()

    def body(*i):
        result = None
        for t, off in reversed(list(zip(xs, offsets))):
            # the index is clamped into t, so every read stays in bounds whichever branch runs
            local = i[ax] if len(xs) == 1 else \
                E.minimum(E.maximum(i[ax] - off, 0), t.shape[ax] - 1)
            read = t[i[:ax] + (local,) + i[ax + 1:]]
            result = read if result is None else \
                E.if_then_else(i[ax] < off + t.shape[ax], read, result)
        return result

    return te.compute(out.shape, body, name=name, tag="injective")


@_lowers("pad")
def _pad(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    x = _tensor(args[0], node, "input")
    pads = node.attrs["pads"]
    return te.ops.pad(x, [p[0] for p in pads], [p[1] for p in pads], node.attrs["value"],
                      name=name)


# ----------------------------------------------------------------------------- PyTorch core ATen
# Lowerings of the operators ops.py adds for PyTorch's core ATen set. atan2, rounded division,
# the bitwise operators and masked_scatter have none: they run with the numpy kernels (integer
# division by zero must raise, not trap).


def _expm1(n: Node, x: E.Expr) -> E.Expr:
    """exp(x) - 1 to within a few ulps near 0 as well (Kahan's formula: the rounding error of
    u = exp(x) cancels in (u - 1) * x / log(u))."""
    u = E.exp(x)
    um1 = u - 1.0
    exact = E.compare("==", u, 1.0) | E.compare("==", um1, -1.0) | E.compare("==", u, math.inf)
    return E.if_then_else(E.compare("==", u, 1.0), x,
                          E.if_then_else(exact, um1, um1 * x / E.log(u)))


def _log1p(n: Node, x: E.Expr) -> E.Expr:
    """log(1 + x) to within a few ulps near 0 as well (Goldberg's formula: the rounding
    error of u = 1 + x cancels in log(u) * x / (u - 1))."""
    u = x + 1.0
    return E.if_then_else(E.compare("==", u, 1.0), x,
                          E.if_then_else(E.compare("==", u, math.inf), u, E.log(u) * x / (u - 1.0)))


LOWERINGS["expm1"] = _elementwise(_expm1)
LOWERINGS["log1p"] = _elementwise(_log1p)


@_lowers("attention")
def _fused_attention(args: list[Value], node: Node, out: TensorType, name: str) -> Tensor:
    """One attention template task (`te.attention`: the softmax online over key tiles)."""
    q, k, v = (_tensor(a, node, r) for a, r in zip(args[:3], ("query", "key", "value")))
    a = node.attrs
    extra = _tensor(args[3], node, a["mask"]) if len(args) == 4 else None
    return attention(q, k, v, mask=extra if a["mask"] == "additive" else None,
                     lengths=extra if a["mask"] == "lengths" else None, scale=a["scale"],
                     causal=a["causal"], name=name, heads_last=a["heads_last"])
