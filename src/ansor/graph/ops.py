"""The canonical operator set of the model graph, and the shape rule of each operator.

Importers map framework operators onto this small, fixed vocabulary so that everything after
import (partitioning into tasks, the executors) handles one set of operators whatever framework
the model came from. The shape rules are the single statement of what each operator produces:
`Graph.add_node` derives its output type from them, and `Graph.validate` checks the recorded
types against them, so a wrong mapping is caught where it is made instead of as a wrong answer.

Every operator has one output. Inputs are listed positionally; optional trailing inputs (a bias)
may be left out. Attributes are plain Python values (ints, floats, strings, bools, None, tuples)
so that they print, compare and hash structurally.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ansor.te import winograd

Shape = tuple[int, ...]


@dataclass(frozen=True)
class TensorType:
    """The static type of a value: its shape and its dtype name (a numpy dtype name)."""

    shape: Shape
    dtype: str

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape) if self.shape else "scalar"
        return f"{dims} {self.dtype}"


class ShapeError(ValueError):
    """An operator was given inputs or attributes it cannot take."""


@dataclass(frozen=True)
class OpDef:
    """One canonical operator: how many inputs it takes, its attributes with their defaults,
    and its shape rule (input types and attributes to the output type)."""

    name: str
    min_inputs: int
    max_inputs: int
    attrs: dict[str, Any]
    infer: Callable[[Sequence[TensorType], dict[str, Any]], TensorType]


OPS: dict[str, OpDef] = {}

FLOAT_DTYPES = ("float16", "float32", "float64")


def _register(name: str, n_in: int | tuple[int, int], attrs: dict[str, Any] | None = None):
    lo, hi = (n_in, n_in) if isinstance(n_in, int) else n_in

    def deco(fn):
        OPS[name] = OpDef(name, lo, hi, dict(attrs or {}), fn)
        return fn

    return deco


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ShapeError(msg)


def broadcast_shapes(*shapes: Shape) -> Shape:
    """Numpy broadcasting of shapes (the rule every elementwise operator follows)."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError as e:
        raise ShapeError(f"shapes {list(shapes)} do not broadcast") from e


def _axis(axis: int, rank: int) -> int:
    _check(-rank <= axis < max(rank, 1), f"axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


# ----------------------------------------------------------------------------- elementwise

UNARY_OPS = ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "neg", "abs", "erf",
             "silu", "hardswish", "hardsigmoid", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
             "cosh", "asinh", "acosh", "atanh", "floor", "ceil", "round", "sign")
BINARY_OPS = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge")


def _same(types, attrs):
    return types[0]


for _name in UNARY_OPS:
    _register(_name, 1)(_same)
_register("gelu", 1, {"approximate": "none"})(_same)
_register("clamp", 1, {"min": None, "max": None})(_same)


@_register("cast", 1, {"dtype": "float32"})
def _cast(types, attrs):
    return TensorType(types[0].shape, str(np.dtype(attrs["dtype"])))


def _binary(types, attrs):
    a, b = types
    _check(a.dtype == b.dtype, f"operand dtypes differ: {a.dtype} vs {b.dtype} (insert a cast)")
    return TensorType(broadcast_shapes(a.shape, b.shape), a.dtype)


def _compare(types, attrs):
    return TensorType(_binary(types, attrs).shape, "bool")


LOGICAL_OPS = ("logical_and", "logical_or", "logical_xor")


def _logical(types, attrs):
    _check(all(t.dtype == "bool" for t in types), f"logical operators take bool, got {types}")
    return TensorType(broadcast_shapes(*(t.shape for t in types)), "bool")


for _name in BINARY_OPS:
    _register(_name, 2)(_binary)
for _name in LOGICAL_OPS:
    _register(_name, 2)(_logical)
_register("logical_not", 1)(_logical)
for _name in COMPARE_OPS:
    _register(_name, 2)(_compare)


@_register("where", 3)
def _where(types, attrs):
    cond, a, b = types
    _check(cond.dtype == "bool", f"where: condition must be bool, got {cond.dtype}")
    _check(a.dtype == b.dtype, f"where: branch dtypes differ: {a.dtype} vs {b.dtype}")
    return TensorType(broadcast_shapes(cond.shape, a.shape, b.shape), a.dtype)


# ----------------------------------------------------------------------------- reductions


def _reduce(types, attrs):
    x = types[0]
    axes = {_axis(a, len(x.shape)) for a in attrs["axes"]}
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return TensorType(shape, x.dtype)


REDUCE_OPS = ("mean", "sum", "max", "min", "prod")
for _name in REDUCE_OPS:
    _register(_name, 1, {"axes": (), "keepdims": False})(_reduce)


def _normalize_axis(types, attrs):
    _axis(attrs["axis"], len(types[0].shape))
    return types[0]


_register("softmax", 1, {"axis": -1})(_normalize_axis)
_register("log_softmax", 1, {"axis": -1})(_normalize_axis)


@_register("layer_norm", (1, 3), {"normalized_ndim": 1, "eps": 1e-5})
def _layer_norm(types, attrs):
    x, k = types[0], attrs["normalized_ndim"]
    for p in types[1:]:
        _check(p.shape == x.shape[len(x.shape) - k:], f"layer_norm: parameter {p.shape} "
               f"does not match the last {k} dims of {x.shape}")
    return x


@_register("batch_norm", 5, {"eps": 1e-5})
def _batch_norm(types, attrs):
    """Inference batch norm: inputs (x, mean, var, weight, bias), statistics over axis 1."""
    x = types[0]
    _check(len(x.shape) >= 2, "batch_norm: needs a channel axis")
    for p in types[1:]:
        _check(p.shape == (x.shape[1],),
               f"batch_norm: parameter {p.shape} for {x.shape[1]} channels")
    return x


# ----------------------------------------------------------------------------- dense


def conv_padding4(padding: Sequence[int]) -> tuple[int, int, int, int]:
    """A conv2d padding attribute as (top, left, bottom, right)."""
    if len(padding) == 2:
        return (padding[0], padding[1], padding[0], padding[1])
    return tuple(padding)  # type: ignore[return-value]


@_register("conv2d", (2, 3), {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1,
                         "layout": "NCHW"})
def _conv2d(types, attrs):
    """NCHW input with OIHW weight, or NHWC input with HWIO weight (I = C / groups); padding
    (vertical, horizontal) on both sides, or (top, left, bottom, right) where a folded pad made
    it asymmetric."""
    x, w = types[0], types[1]
    _check(len(x.shape) == 4 and len(w.shape) == 4, "conv2d: needs 4-d input and weight")
    nhwc = _layout(attrs, "conv2d")
    n, c, h, wd = (x.shape[0], x.shape[3], x.shape[1], x.shape[2]) if nhwc else x.shape
    kh, kw, ci, o = w.shape if nhwc else (w.shape[2], w.shape[3], w.shape[1], w.shape[0])
    g = attrs["groups"]
    _check(c == ci * g and o % g == 0, f"conv2d: {c} channels, weight {w.shape}, groups {g}")
    if len(types) == 3:
        _check(types[2].shape == (o,), f"conv2d: bias {types[2].shape} for {o} channels")
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    _check(len(attrs["padding"]) in (2, 4), f"conv2d: padding {attrs['padding']}")
    pt, pl, pb, pr = conv_padding4(attrs["padding"])
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    _check(oh > 0 and ow > 0, f"conv2d: empty output for input {x.shape}")
    return TensorType(_in_layout(attrs, n, o, (oh, ow)), x.dtype)


@_register("winograd_input", 2, {"tile": 4, "padding": (1, 1, 1, 1)})
def _winograd_input(types, attrs):
    """The first stage of a 3x3 stride-1 NHWC convolution in Winograd form (`graph.winograd`):
    inputs (x [N, H, W, C], B^T [a, a]) with a = tile + 2, padding (top, left, bottom, right);
    the output V [a*a, N * tiles, C] holds B^T d B of every tile d of the padded input."""
    x, bt = types
    tile, alpha = attrs["tile"], winograd.input_tile(attrs["tile"])
    _check(tile in winograd.POINTS, f"winograd_input: tile {tile} (one of {sorted(winograd.POINTS)})")
    _check(len(x.shape) == 4 and bt.shape == (alpha, alpha),
           f"winograd_input: input {x.shape} (NHWC) and B^T {bt.shape} for tile {tile}")
    _check(len(attrs["padding"]) == 4, f"winograd_input: padding {attrs['padding']} (top, left, bottom, right)")
    oh, ow = winograd.output_extent(x.shape[1], x.shape[2], tuple(attrs["padding"]))
    _check(oh > 0 and ow > 0, f"winograd_input: empty output for input {x.shape}")
    th, tw = winograd.output_tiles(oh, ow, tile)
    return TensorType((alpha * alpha, x.shape[0] * th * tw, x.shape[3]), x.dtype)


@_register("winograd_output", (2, 3), {"tile": 4, "height": 1, "width": 1})
def _winograd_output(types, attrs):
    """The last stage of a convolution in Winograd form: inputs (M [a*a, N * tiles, K] the
    products, A^T [tile, a][, bias [K]]); the output [N, height, width, K] is A^T M A of each
    tile, plus the bias."""
    m, at = types[:2]
    tile, alpha = attrs["tile"], winograd.input_tile(attrs["tile"])
    _check(tile in winograd.POINTS, f"winograd_output: tile {tile} (one of {sorted(winograd.POINTS)})")
    _check(len(m.shape) == 3 and m.shape[0] == alpha * alpha and at.shape == (tile, alpha),
           f"winograd_output: products {m.shape} and A^T {at.shape} for tile {tile}")
    th, tw = winograd.output_tiles(attrs["height"], attrs["width"], tile)
    _check(attrs["height"] > 0 and attrs["width"] > 0 and m.shape[1] % (th * tw) == 0,
           f"winograd_output: {m.shape[1]} tiles for a {attrs['height']}x{attrs['width']} output")
    if len(types) == 3:
        _check(types[2].shape == (m.shape[2],), f"winograd_output: bias {types[2].shape} for {m.shape[2]} channels")
    return TensorType((m.shape[1] // (th * tw), attrs["height"], attrs["width"], m.shape[2]), m.dtype)


def _layout(attrs, op: str) -> bool:
    """Whether the operator's activations are channels-last (NHWC) rather than NCHW."""
    _check(attrs["layout"] in ("NCHW", "NHWC"), f"{op}: layout {attrs['layout']!r} "
                                                "(NCHW or NHWC)")
    return attrs["layout"] == "NHWC"


def spatial_dims(layout: str) -> tuple[int, int]:
    """The height and width axes of a 4-d activation in `layout`."""
    return (1, 2) if layout == "NHWC" else (2, 3)


def channel_dim(layout: str) -> int:
    """The channel axis of a 4-d activation in `layout`."""
    return 3 if layout == "NHWC" else 1


def _in_layout(attrs, n: int, c: int, hw: Sequence[int]) -> Shape:
    return (n, *hw, c) if attrs["layout"] == "NHWC" else (n, c, *hw)


@_register("linear", (2, 3))
def _linear(types, attrs):
    """y = x @ w.T (+ b): weight is [out, in] as in PyTorch."""
    x, w = types[0], types[1]
    _check(len(w.shape) == 2 and x.shape[-1] == w.shape[1], f"linear: {x.shape} x {w.shape}")
    if len(types) == 3:
        _check(types[2].shape == (w.shape[0],), f"linear: bias {types[2].shape}")
    return TensorType(x.shape[:-1] + (w.shape[0],), x.dtype)


@_register("matmul", 2)
def _matmul(types, attrs):
    """Batched matrix product of rank >= 2 operands with broadcast batch dims."""
    a, b = types
    _check(len(a.shape) >= 2 and len(b.shape) >= 2, f"matmul: ranks {a.shape} {b.shape}")
    _check(a.shape[-1] == b.shape[-2], f"matmul: {a.shape} x {b.shape}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType(batch + (a.shape[-2], b.shape[-1]), a.dtype)


@_register("scaled_dot_product_attention", (3, 4), {"is_causal": False, "scale": None})
def _sdpa(types, attrs):
    """softmax(q @ k^T * scale + mask) @ v; a bool mask keeps True, a float mask is added."""
    q, k, v = types[:3]
    _check(q.shape[-1] == k.shape[-1] and k.shape[-2] == v.shape[-2],
           f"attention: q {q.shape} k {k.shape} v {v.shape}")
    scores = q.shape[:-1] + (k.shape[-2],)
    if len(types) == 4:
        broadcast_shapes(types[3].shape, scores)
    return TensorType(q.shape[:-1] + (v.shape[-1],), q.dtype)


@_register("embedding", 2, {"negative_ids": True})
def _embedding(types, attrs):
    """Rows of a [num, dim] table picked by integer ids: inputs (weight, ids). Ids must lie in
    [-num, num) when `negative_ids` (a negative id counts from the end, as in ONNX Gather and
    numpy), in [0, num) otherwise (torch.embedding); the executors raise IndexError for any
    other id rather than read some row."""
    w, ids = types
    _check(len(w.shape) == 2 and ids.dtype.startswith("int"), f"embedding: {w} with ids {ids}")
    return TensorType(ids.shape + (w.shape[1],), w.dtype)


@_register("index", (2, 1 << 8))
def _index(types, attrs):
    """Advanced indexing of the leading axes, x[i0, i1, ...] as numpy does it: integer index
    tensors broadcast together and replace as many leading axes of x. Index k must lie in
    [-n, n) for axis k of size n (a negative one counts from the end, as in torch indexing and
    ONNX GatherND); the executors raise IndexError for any other."""
    x, idx = types[0], types[1:]
    _check(len(idx) <= len(x.shape), f"index: {len(idx)} indices for rank {len(x.shape)}")
    _check(all(t.dtype.startswith("int") for t in idx), "index: indices must be integers")
    return TensorType(broadcast_shapes(*(t.shape for t in idx)) + x.shape[len(idx):], x.dtype)


# ----------------------------------------------------------------------------- pooling


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p:  # the last window must start inside the input
        out -= 1
    return out


@_register("max_pool2d", 1, {"kernel": (1, 1), "stride": (1, 1), "padding": (0, 0),
                             "dilation": (1, 1), "ceil_mode": False, "layout": "NCHW"})
def _max_pool2d(types, attrs):
    x = types[0]
    _check(len(x.shape) == 4, "max_pool2d: needs a 4-d input")
    _layout(attrs, "max_pool2d")
    spatial = spatial_dims(attrs["layout"])
    hw = tuple(_pool_out(x.shape[spatial[i]], attrs["kernel"][i], attrs["stride"][i],
                         attrs["padding"][i], attrs["dilation"][i], attrs["ceil_mode"])
               for i in range(2))
    return TensorType(_in_layout(attrs, x.shape[0], x.shape[channel_dim(attrs["layout"])], hw),
                      x.dtype)


@_register("avg_pool2d", 1, {"kernel": (1, 1), "stride": (1, 1), "padding": (0, 0),
                             "ceil_mode": False, "count_include_pad": True,
                             "divisor_override": None, "layout": "NCHW"})
def _avg_pool2d(types, attrs):
    x = types[0]
    _check(len(x.shape) == 4, "avg_pool2d: needs a 4-d input")
    _layout(attrs, "avg_pool2d")
    spatial = spatial_dims(attrs["layout"])
    hw = tuple(_pool_out(x.shape[spatial[i]], attrs["kernel"][i], attrs["stride"][i],
                         attrs["padding"][i], 1, attrs["ceil_mode"]) for i in range(2))
    return TensorType(_in_layout(attrs, x.shape[0], x.shape[channel_dim(attrs["layout"])], hw),
                      x.dtype)


@_register("adaptive_avg_pool2d", 1, {"output_size": (1, 1), "layout": "NCHW"})
def _adaptive_avg_pool2d(types, attrs):
    x = types[0]
    _check(len(x.shape) == 4, "adaptive_avg_pool2d: needs a 4-d input")
    _layout(attrs, "adaptive_avg_pool2d")
    return TensorType(_in_layout(attrs, x.shape[0], x.shape[channel_dim(attrs["layout"])],
                                 tuple(attrs["output_size"])), x.dtype)


# ----------------------------------------------------------------------------- layout


@_register("reshape", 1, {"shape": ()})
def _reshape(types, attrs):
    x, shape = types[0], tuple(attrs["shape"])
    _check(all(d >= 0 for d in shape), f"reshape: target {shape} must be explicit")
    _check(int(np.prod(shape)) == int(np.prod(x.shape)), f"reshape: {x.shape} to {shape}")
    return TensorType(shape, x.dtype)


@_register("permute", 1, {"axes": ()})
def _permute(types, attrs):
    x, axes = types[0], tuple(attrs["axes"])
    _check(sorted(axes) == list(range(len(x.shape))), f"permute: {axes} for rank {len(x.shape)}")
    return TensorType(tuple(x.shape[a] for a in axes), x.dtype)


@_register("expand", 1, {"shape": ()})
def _expand(types, attrs):
    x, shape = types[0], tuple(attrs["shape"])
    _check(broadcast_shapes(x.shape, shape) == shape, f"expand: {x.shape} to {shape}")
    return TensorType(shape, x.dtype)


@_register("concat", (1, 1 << 16), {"axis": 0})
def _concat(types, attrs):
    first = types[0]
    axis = _axis(attrs["axis"], len(first.shape))
    for t in types[1:]:
        _check(t.dtype == first.dtype and len(t.shape) == len(first.shape)
               and all(a == b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis),
               f"concat: {t} does not match {first} off axis {axis}")
    size = sum(t.shape[axis] for t in types)
    return TensorType(first.shape[:axis] + (size,) + first.shape[axis + 1:], first.dtype)


@_register("slice", 1, {"axis": 0, "start": 0, "end": 0, "step": 1})
def _slice(types, attrs):
    """x[start:end:step] along one axis; start and end are already within [0, size]."""
    x = types[0]
    axis = _axis(attrs["axis"], len(x.shape))
    start, end, step = attrs["start"], attrs["end"], attrs["step"]
    _check(0 <= start <= x.shape[axis] and 0 <= end <= x.shape[axis] and step > 0,
           f"slice: [{start}:{end}:{step}] on axis of size {x.shape[axis]}")
    n = max(0, -(-(end - start) // step))
    return TensorType(x.shape[:axis] + (n,) + x.shape[axis + 1:], x.dtype)


@_register("pad", 1, {"pads": (), "value": 0.0})
def _pad(types, attrs):
    """Constant padding: pads holds one (before, after) pair per axis, outermost first."""
    x, pads = types[0], attrs["pads"]
    _check(len(pads) == len(x.shape), f"pad: {len(pads)} pairs for rank {len(x.shape)}")
    shape = tuple(d + lo + hi for d, (lo, hi) in zip(x.shape, pads))
    _check(all(d >= 0 for d in shape), f"pad: negative size {shape}")
    return TensorType(shape, x.dtype)


# ----------------------------------------------------------------------------- indexing and scans
# Operators of the ONNX standard that models use beside the dense ones. Each has a numpy kernel
# (reference.py); those without a te lowering run as numpy fallback subgraphs.


@_register("mod", 2, {"fmod": False})
def _mod(types, attrs):
    """Remainder: with `fmod` C's (the dividend's sign), else Python's (the divisor's sign)."""
    return _binary(types, attrs)


@_register("arg_reduce", 1, {"axis": 0, "keepdims": True, "select_last_index": False, "largest": True})
def _arg_reduce(types, attrs):
    """The index (int64) of the largest (or smallest) element along `axis`."""
    x = types[0]
    axis = _axis(attrs["axis"], len(x.shape))
    shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape)) if attrs["keepdims"] else \
        tuple(d for i, d in enumerate(x.shape) if i != axis)
    return TensorType(shape, "int64")


@_register("gather_elements", 2, {"axis": 0})
def _gather_elements(types, attrs):
    """out[i...] = x[i... with index[i...] on `axis`]: the output has the index's shape."""
    x, index = types
    _axis(attrs["axis"], len(x.shape))
    _check(len(index.shape) == len(x.shape), f"gather_elements: index rank {len(index.shape)} != {len(x.shape)}")
    _check(index.dtype in ("int32", "int64"), f"gather_elements: integer index, got {index.dtype}")
    return TensorType(index.shape, x.dtype)


@_register("scatter_elements", 3, {"axis": 0, "reduction": "none"})
def _scatter_elements(types, attrs):
    """A copy of x with updates written at index along `axis` (or combined by `reduction`)."""
    x, index, updates = types
    _axis(attrs["axis"], len(x.shape))
    _check(index.shape == updates.shape, "scatter_elements: index and updates differ in shape")
    _check(updates.dtype == x.dtype, "scatter_elements: updates and data differ in dtype")
    _check(attrs["reduction"] in ("none", "add", "mul", "max", "min"), f"unknown reduction {attrs['reduction']!r}")
    return x


@_register("scatter_nd", 3, {"reduction": "none"})
def _scatter_nd(types, attrs):
    """A copy of x with updates written at the index tuples of index's last axis."""
    x, index, updates = types
    k = index.shape[-1] if index.shape else 0
    _check(1 <= k <= len(x.shape), f"scatter_nd: index tuples of {k} for rank {len(x.shape)}")
    _check(updates.shape == index.shape[:-1] + x.shape[k:], f"scatter_nd: updates shape {updates.shape}")
    _check(attrs["reduction"] in ("none", "add", "mul", "max", "min"), f"unknown reduction {attrs['reduction']!r}")
    return x


@_register("cumsum", 1, {"axis": 0, "exclusive": False, "reverse": False})
def _cumsum(types, attrs):
    _axis(attrs["axis"], len(types[0].shape))
    return types[0]


@_register("topk", 1, {"k": 1, "axis": -1, "largest": True, "indices": False})
def _topk(types, attrs):
    """The k largest (or smallest) along `axis`, sorted, ties to the lower index; with
    `indices` their positions (int64) rather than their values."""
    x = types[0]
    axis = _axis(attrs["axis"], len(x.shape))
    _check(0 <= attrs["k"] <= x.shape[axis], f"topk: k={attrs['k']} on an axis of {x.shape[axis]}")
    shape = x.shape[:axis] + (attrs["k"],) + x.shape[axis + 1:]
    return TensorType(shape, "int64" if attrs["indices"] else x.dtype)


@_register("pad_border", 1, {"pads": (), "mode": "reflect"})
def _pad_border(types, attrs):
    """Padding with values of the border: "reflect" (mirrored, border excluded), "edge"
    (the border repeated) or "wrap" (from the other side)."""
    _check(attrs["mode"] in ("reflect", "edge", "wrap"), f"pad_border: unknown mode {attrs['mode']!r}")
    return _pad(types, {"pads": attrs["pads"], "value": 0.0})


@_register("resize", 1, {"sizes": (), "mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                         "nearest_mode": "round_prefer_floor", "scales": (), "cubic_coeff_a": -0.75,
                         "exclude_outside": False, "extrapolation_value": 0.0})
def _resize(types, attrs):
    """Resampling to `sizes` as ONNX Resize defines it (modes nearest, linear, cubic)."""
    x = types[0]
    _check(len(attrs["sizes"]) == len(x.shape), f"resize: {len(attrs['sizes'])} sizes for rank {len(x.shape)}")
    _check(attrs["mode"] in ("nearest", "linear", "cubic"), f"resize: unknown mode {attrs['mode']!r}")
    return TensorType(tuple(int(d) for d in attrs["sizes"]), x.dtype)


@_register("take", 2, {"axis": 0})
def _take(types, attrs):
    """np.take: the index tensor (any rank, negative counts from the end) replaces `axis`."""
    x, index = types
    axis = _axis(attrs["axis"], len(x.shape))
    _check(index.dtype in ("int32", "int64"), f"take: integer index, got {index.dtype}")
    return TensorType(x.shape[:axis] + index.shape + x.shape[axis + 1:], x.dtype)


@_register("trunc_div", 2)
def _trunc_div(types, attrs):
    """Integer division rounding toward zero (C's and ONNX's), where `div` is float only."""
    a, b = types
    _check(a.dtype in ("int32", "int64"), f"trunc_div: integer operands, got {a.dtype}")
    return _binary(types, attrs)


# ----------------------------------------------------------------------------- any spatial rank
# (graph/spatial.py: numpy kernels; the 2-d forms above are the compiled ones)


def _spatial_attrs(x: TensorType, attrs: dict[str, Any], kernel: Sequence[int]) -> int:
    rank = len(x.shape) - 2
    _check(rank >= 1 and len(kernel) == rank, f"kernel {list(kernel)} for an input of rank {len(x.shape)}")
    for name in ("stride", "dilation", "pads"):
        _check(len(attrs[name]) == rank, f"{name} {attrs[name]} for {rank} spatial axes")
    return rank


@_register("conv_nd", (2, 3), {"stride": (), "pads": (), "dilation": (), "groups": 1})
def _conv_nd(types, attrs):
    """Convolution over any number of spatial axes: x [N, C, *S], w [O, C / groups, *K]."""
    from ansor.graph.spatial import conv_output_size

    x, w = types[0], types[1]
    _spatial_attrs(x, attrs, w.shape[2:])
    _check(x.shape[1] == w.shape[1] * attrs["groups"] and w.shape[0] % attrs["groups"] == 0,
           f"conv_nd: {x.shape[1]} channels, weight {w.shape}, groups {attrs['groups']}")
    out = tuple(conv_output_size(s, k, st, d, lo, hi) for s, k, st, d, (lo, hi)
                in zip(x.shape[2:], w.shape[2:], attrs["stride"], attrs["dilation"], attrs["pads"]))
    _check(all(o > 0 for o in out), f"conv_nd: empty output {out}")
    return TensorType((x.shape[0], w.shape[0], *out), x.dtype)


@_register("conv_transpose", (2, 3), {"stride": (), "pads": (), "dilation": (), "groups": 1, "output_padding": ()})
def _conv_transpose(types, attrs):
    """The transpose of a convolution: x [N, C, *S], w [C, O / groups, *K]."""
    from ansor.graph.spatial import conv_transpose_output_size

    x, w = types[0], types[1]
    _spatial_attrs(x, attrs, w.shape[2:])
    _check(x.shape[1] == w.shape[0] and x.shape[1] % attrs["groups"] == 0,
           f"conv_transpose: {x.shape[1]} channels, weight {w.shape}, groups {attrs['groups']}")
    out = tuple(conv_transpose_output_size(s, k, st, d, lo, hi, op) for s, k, st, d, (lo, hi), op
                in zip(x.shape[2:], w.shape[2:], attrs["stride"], attrs["dilation"], attrs["pads"],
                       attrs["output_padding"]))
    _check(all(o > 0 for o in out), f"conv_transpose: empty output {out}")
    return TensorType((x.shape[0], w.shape[1] * attrs["groups"], *out), x.dtype)


@_register("pool_nd", 1, {"kind": "max", "kernel": (), "stride": (), "pads": (), "dilation": (),
                          "count_include_pad": False, "p": 2})
def _pool_nd(types, attrs):
    """Max, average or Lp pooling over any number of spatial axes (floor mode)."""
    from ansor.graph.spatial import conv_output_size

    x = types[0]
    _spatial_attrs(x, attrs, attrs["kernel"])
    _check(attrs["kind"] in ("max", "avg", "lp"), f"pool_nd: unknown kind {attrs['kind']!r}")
    out = tuple(conv_output_size(s, k, st, d, lo, hi) for s, k, st, d, (lo, hi)
                in zip(x.shape[2:], attrs["kernel"], attrs["stride"], attrs["dilation"], attrs["pads"]))
    _check(all(o > 0 for o in out), f"pool_nd: empty output {out}")
    return TensorType((*x.shape[:2], *out), x.dtype)


def infer_type(op: str, types: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    """The output type of `op` applied to inputs of `types` (raises ShapeError if it cannot)."""
    if op not in OPS:
        raise ShapeError(f"unknown operator {op!r}")
    d = OPS[op]
    _check(d.min_inputs <= len(types) <= d.max_inputs,
           f"{op}: takes {d.min_inputs}..{d.max_inputs} inputs, got {len(types)}")
    unknown = set(attrs) - set(d.attrs)
    _check(not unknown, f"{op}: unknown attributes {sorted(unknown)}")
    return d.infer(list(types), {**d.attrs, **attrs})


# ----------------------------------------------------------------------------- PyTorch core ATen
# Operators of PyTorch's core ATen set that the canonical operators above cannot express
# exactly (the PyTorch importer composes everything else from them; `torch_conformance`
# measures the set). Elementwise ones join UNARY_OPS / BINARY_OPS, so partitioning fuses them
# and the layout pass carries them to NHWC like any other elementwise operator.

#: expm1(x) = exp(x) - 1 and log1p(x) = log(1 + x) without the cancellation near 0.
UNARY_OPS += ("expm1", "log1p")
#: atan2(y, x): the angle of (x, y) in all four quadrants.
BINARY_OPS += ("atan2",)
for _name in ("expm1", "log1p"):
    _register(_name, 1)(_same)
_register("atan2", 2)(_binary)


@_register("divide_rounded", 2, {"mode": "floor"})
def _divide_rounded(types, attrs):
    """a / b rounded toward negative infinity ("floor", Python's //) or toward zero ("trunc",
    C's integer division), in the operands' dtype, as torch.div(rounding_mode=...) does."""
    _check(attrs["mode"] in ("floor", "trunc"), f"divide_rounded: mode {attrs['mode']!r}")
    return _binary(types, attrs)


BITWISE_OPS = ("bitwise_and", "bitwise_or", "bitwise_xor")


def _bitwise(types, attrs):
    _check(all(t.dtype.startswith(("int", "uint")) for t in types),
           f"bitwise operators take integers, got {[t.dtype for t in types]}")
    return types[0] if len(types) == 1 else _binary(types, attrs)


for _name in BITWISE_OPS:
    _register(_name, 2)(_bitwise)
_register("bitwise_not", 1)(_bitwise)


@_register("masked_scatter", 3)
def _masked_scatter(types, attrs):
    """A copy of x where the True places of the mask (broadcast to x) take the first elements
    of source, in row-major order: inputs (x, mask, source)."""
    x, mask, source = types
    _check(mask.dtype == "bool", f"masked_scatter: mask must be bool, got {mask.dtype}")
    _check(source.dtype == x.dtype, f"masked_scatter: source {source.dtype} for data {x.dtype}")
    _check(broadcast_shapes(x.shape, mask.shape) == x.shape,
           f"masked_scatter: mask {mask.shape} does not broadcast to {x.shape}")
    return x


@_register("max_pool2d_indices", 1, {"kernel": (1, 1), "stride": (1, 1), "padding": (0, 0),
                                     "dilation": (1, 1), "ceil_mode": False})
def _max_pool2d_indices(types, attrs):
    """Where max_pool2d's maxima are (NCHW): int64 positions in the flattened H x W plane of
    each channel, the first of equal maxima in window order, never a padding cell."""
    out = _max_pool2d(types, {**attrs, "layout": "NCHW"})
    return TensorType(out.shape, "int64")


@_register("grid_sample", 2, {"mode": "bilinear", "padding_mode": "zeros", "align_corners": False})
def _grid_sample(types, attrs):
    """Samples of x [N, C, H, W] at the points of grid [N, Ho, Wo, 2] ((x, y) in [-1, 1]), as
    torch.nn.functional.grid_sample: mode bilinear or nearest, padding_mode zeros, border or
    reflection; the output is [N, C, Ho, Wo]."""
    x, grid = types
    _check(len(x.shape) == 4 and len(grid.shape) == 4 and grid.shape[3] == 2
           and grid.shape[0] == x.shape[0], f"grid_sample: input {x.shape} and grid {grid.shape}")
    _check(attrs["mode"] in ("bilinear", "nearest"), f"grid_sample: mode {attrs['mode']!r}")
    _check(attrs["padding_mode"] in ("zeros", "border", "reflection"),
           f"grid_sample: padding_mode {attrs['padding_mode']!r}")
    return TensorType((x.shape[0], x.shape[1], grid.shape[1], grid.shape[2]), x.dtype)


# ----------------------------------------------------------------------------- fused attention

ATTENTION_MASKS = ("none", "additive", "lengths")


@_register("attention", (3, 4), {"scale": 1.0, "causal": False, "mask": "none", "heads_last": False})
def _attention(types, attrs):
    """softmax(q @ k^T * scale + mask) @ v in one operator (`graph.attention_fusion` finds it):
    q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] with Hkv dividing H (grouped-query
    heads share K/V). The fourth input is an additive mask broadcasting to [B, H, Lq, Lk]
    (mask "additive") or the valid key lengths [B] (mask "lengths"); `causal` keeps key j
    for query i where j <= i. The output is [B, H, Lq, Dv], or [B, Lq, H, Dv] with
    `heads_last` (the heads merged by a reshape alone, `graph.rewrites.attention_heads_last`)."""
    q, k, v = types[:3]
    _check(len(q.shape) == len(k.shape) == len(v.shape) == 4, f"attention: q {q.shape} k {k.shape} v {v.shape}")
    _check(k.shape[0] == q.shape[0] and v.shape[:3] == k.shape[:3] and k.shape[3] == q.shape[3]
           and q.shape[1] % k.shape[1] == 0, f"attention: q {q.shape} k {k.shape} v {v.shape}")
    _check(attrs["mask"] in ATTENTION_MASKS, f"attention: mask {attrs['mask']!r}")
    _check((len(types) == 4) == (attrs["mask"] != "none"), f"attention: mask {attrs['mask']!r} with {len(types)} inputs")
    if attrs["mask"] == "additive":
        m = types[3]
        _check(m.dtype == q.dtype and len(m.shape) <= 4, f"attention: mask {m}")
        broadcast_shapes(m.shape, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    if attrs["mask"] == "lengths":
        _check(types[3].shape == (q.shape[0],) and types[3].dtype.startswith("int"), f"attention: lengths {types[3]}")
    if attrs["heads_last"]:
        return TensorType((q.shape[0], q.shape[2], q.shape[1], v.shape[3]), q.dtype)
    return TensorType(q.shape[:3] + (v.shape[3],), q.dtype)


# ----------------------------------------------------------------------------- key/value caches

@_register("cache_write", 3, {"axis": 2})
def _cache_write(types, attrs):
    """The cache with `rows` written at `position` along `axis` (the sequence axis of a
    [B, H, max length, D] key or value cache): inputs (cache, rows, position [1] integer).
    Its meaning is a new value; a compiled model runs it in place, its output sharing the
    cache's memory (`graph.kv_cache`), so a decode step never copies the whole cache."""
    cache, rows, position = types
    axis = _axis(attrs["axis"], len(cache.shape))
    _check(len(rows.shape) == len(cache.shape) and rows.dtype == cache.dtype
           and all(r == c for d, (r, c) in enumerate(zip(rows.shape, cache.shape)) if d != axis)
           and rows.shape[axis] <= cache.shape[axis], f"cache_write: rows {rows} into cache {cache}")
    _check(position.shape == (1,) and position.dtype.startswith("int"), f"cache_write: position {position}")
    return cache
