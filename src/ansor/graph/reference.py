"""A numpy executor of a model graph: every canonical operator written directly in numpy.

It is the meaning of the IR: importers are checked against the source framework through it, and
it is the fallback runtime for operators that have no tuned kernel. Clarity wins over speed here,
but the dense operators use tensordot/einsum over strided windows so that small networks run in
seconds. Values keep the dtype the graph gives them (float32 for a typical network).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ansor.graph.half_precision import COMPUTE_DTYPE, HALF_FLOAT_DTYPES, WIDENED_DTYPES, widened
from ansor.graph.ir import Graph, GraphError, Node
from ansor.graph.ops import conv_padding4
from ansor.te import winograd
from ansor.te.dtypes import cast_array

Kernel = Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]
KERNELS: dict[str, Kernel] = {}


def _kernel(*names: str):
    def deco(fn: Kernel) -> Kernel:
        for n in names:
            KERNELS[n] = fn
        return fn

    return deco


_erf = np.vectorize(math.erf, otypes=[np.float64])

_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "neg": np.negative,
    "abs": np.abs,
    "logical_not": np.logical_not,
    "erf": lambda x: _erf(x),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "hardswish": lambda x: x * np.clip(x + 3, 0, 6) / 6,
    "hardsigmoid": lambda x: np.clip(x + 3, 0, 6) / 6,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "floor": np.floor, "ceil": np.ceil, "round": np.rint, "sign": np.sign,
}
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
}


def _make_unary(fn):
    return lambda xs, a: fn(xs[0])


def _make_binary(fn):
    return lambda xs, a: fn(xs[0], xs[1])


for _n, _f in _UNARY.items():
    KERNELS[_n] = _make_unary(_f)
for _n, _f in _BINARY.items():
    KERNELS[_n] = _make_binary(_f)


@_kernel("div")
def _div(xs, a):
    x, y = xs
    if np.issubdtype(x.dtype, np.integer):  # true division is a float operation in the IR
        raise GraphError("div on integers is not defined; cast first")
    return x / y


@_kernel("gelu")
def _gelu(xs, a):
    x = xs[0]
    if a["approximate"] == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


@_kernel("clamp")
def _clamp(xs, a):
    x = xs[0]
    if a["min"] is not None:
        x = np.maximum(x, np.asarray(a["min"], dtype=x.dtype))
    if a["max"] is not None:
        x = np.minimum(x, np.asarray(a["max"], dtype=x.dtype))
    return x


@_kernel("cast")
def _cast(xs, a):  # float to integer saturates, as the compiled kernels convert
    return cast_array(xs[0], str(np.dtype(a["dtype"])))


@_kernel("where")
def _where(xs, a):
    return np.where(*xs)


@_kernel("mean", "sum", "max", "min", "prod")
def _reduce(xs, a):
    fn = {"mean": np.mean, "sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}
    return fn[a["op"]](xs[0], axis=tuple(a["axes"]), keepdims=a["keepdims"])


@_kernel("softmax")
def _softmax(xs, a):
    x = xs[0]
    e = np.exp(x - np.max(x, axis=a["axis"], keepdims=True))
    return e / np.sum(e, axis=a["axis"], keepdims=True)


@_kernel("log_softmax")
def _log_softmax(xs, a):
    x = xs[0]
    s = x - np.max(x, axis=a["axis"], keepdims=True)
    return s - np.log(np.sum(np.exp(s), axis=a["axis"], keepdims=True))


@_kernel("layer_norm")
def _layer_norm(xs, a):
    x = xs[0]
    axes = tuple(range(x.ndim - a["normalized_ndim"], x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean(np.square(x - mean), axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + a["eps"])
    if len(xs) > 1:
        y = y * xs[1]
    if len(xs) > 2:
        y = y + xs[2]
    return y


@_kernel("batch_norm")
def _batch_norm(xs, a):
    x, mean, var, w, b = xs
    shape = (1, -1) + (1,) * (x.ndim - 2)
    scale = (w / np.sqrt(var + a["eps"])).reshape(shape)
    return (x - mean.reshape(shape)) * scale + b.reshape(shape)


def _windows(x: np.ndarray, kernel, stride, dilation, out_hw) -> np.ndarray:
    """Strided windows of an already padded NCHW array: [N, C, OH, OW, KH, KW]."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    win = sliding_window_view(x, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]
    return win[:, :, :out_hw[0], :out_hw[1]]


@_kernel("conv2d")
def _conv2d(xs, a):
    x, w = xs[0], xs[1]
    (pt, pl, pb, pr), g = conv_padding4(a["padding"]), a["groups"]
    n, c = x.shape[:2]
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    out_hw = a["out_hw"]
    win = _windows(xp, (kh, kw), a["stride"], a["dilation"], out_hw)
    if g == 1:
        y = np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
    else:
        win = win.reshape(n, g, cg, *win.shape[2:])
        wg = w.reshape(g, o // g, cg, kh, kw)
        y = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True)
        y = y.reshape(n, o, *out_hw)
    if len(xs) == 3:
        y = y + xs[2].reshape(1, -1, 1, 1)
    return y


@_kernel("winograd_input")
def _winograd_input(xs, a):
    """B^T d B of every tile d of the padded NHWC input, as [a*a, N * tiles, C]."""
    x, bt = xs
    tile, padding = a["tile"], tuple(a["padding"])
    alpha = winograd.input_tile(tile)
    n, h, w, c = x.shape
    th, tw = winograd.output_tiles(*winograd.output_extent(h, w, padding), tile)
    top, left, bottom, right = winograd.input_padding(h, w, padding, tile)
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    tiles = sliding_window_view(xp, (alpha, alpha), axis=(1, 2))[:, ::tile, ::tile]  # n th tw c a a
    v = np.einsum("ei,nyxcij,fj->efnyxc", bt, tiles, bt, optimize=True)
    return v.reshape(alpha * alpha, n * th * tw, c)


@_kernel("winograd_output")
def _winograd_output(xs, a):
    """A^T M A of every tile of the products, gathered back to NHWC (plus the bias)."""
    m, at = xs[:2]
    tile, height, width = a["tile"], a["height"], a["width"]
    alpha = winograd.input_tile(tile)
    th, tw = winograd.output_tiles(height, width, tile)
    prod = m.reshape(alpha, alpha, -1, th, tw, m.shape[2])  # e f n y x k
    y = np.einsum("ve,efnyxk,wf->nyvxwk", at, prod, at, optimize=True)
    y = y.reshape(prod.shape[2], th * tile, tw * tile, m.shape[2])[:, :height, :width]
    return y + xs[2] if len(xs) == 3 else y


@_kernel("linear")
def _linear(xs, a):
    y = np.matmul(xs[0], xs[1].T)
    return y + xs[2] if len(xs) == 3 else y


@_kernel("matmul")
def _matmul(xs, a):
    return np.matmul(xs[0], xs[1])


@_kernel("scaled_dot_product_attention")
def _sdpa(xs, a):
    q, k, v = xs[:3]
    scale = a["scale"] if a["scale"] is not None else 1 / math.sqrt(q.shape[-1])
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * np.asarray(scale, dtype=q.dtype)
    if a["is_causal"]:
        lq, lk = s.shape[-2:]
        keep = np.tril(np.ones((lq, lk), dtype=bool))
        s = np.where(keep, s, -np.inf)
    if len(xs) == 4:
        mask = xs[3]
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    p = _softmax([s], {"axis": -1})
    return np.matmul(p, v)


@_kernel("embedding")
def _embedding(xs, a):
    w, ids = xs  # run_node checked the ids (`check_indices`)
    return w[ids]


@_kernel("cache_write")
def _cache_write(xs, a):
    cache, rows, position = xs  # run_node checked the position (`check_indices`)
    out = cache.copy()
    start = int(position[0])
    where = [slice(None)] * cache.ndim
    where[a["axis"] % cache.ndim] = slice(start, start + rows.shape[a["axis"] % cache.ndim])
    out[tuple(where)] = rows
    return out


@_kernel("index")
def _index(xs, a):
    return xs[0][tuple(xs[1:])]


def gathered_indices(node: Node, args: Sequence[Any]) -> list[tuple[int, int, bool]]:
    """Where a gather reads its table: (position of the index input, size of the axis it
    indexes, whether negative indices count from the end) for each index input of an
    `embedding` or `index` node; empty for any other operator. `args` are the node's inputs,
    or anything with their shapes."""
    if node.op == "embedding":
        return [(1, int(args[0].shape[0]), bool(node.attrs.get("negative_ids", True)))]
    if node.op == "index":
        return [(k, int(args[0].shape[k - 1]), True) for k in range(1, len(args))]
    if node.op == "take":
        return [(1, int(args[0].shape[node.attrs.get("axis", 0) % len(args[0].shape)]), True)]
    if node.op == "cache_write":  # the first written row; the rows past it must fit too
        axis = node.attrs["axis"] % len(args[0].shape)
        return [(2, int(args[0].shape[axis]) - int(args[1].shape[axis]) + 1, False)]
    return []


def check_indices(node: Node, position: int, ids: np.ndarray, size: int, negative: bool) -> None:
    """Raise IndexError when the ids a gather reads along an axis of `size` fall outside
    [-size, size) (`negative`) or [0, size): PyTorch and onnxruntime raise there too, and a
    clamped or wrapped read would be a wrong answer that looks right. Both executors call it
    before the gather runs (the compiled kernels only keep their reads inside the table)."""
    if ids.size == 0:
        return
    low = -size if negative else 0
    if int(ids.min()) >= low and int(ids.max()) < size:
        return
    bad = ids[(ids < low) | (ids >= size)]
    what = "ids" if node.op == "embedding" else f"index {position - 1}"
    where = f" ({node.source})" if node.source else ""
    raise IndexError(f"%{node.output} = {node.op}{where}: {what} must lie in [{low}, {size}), "
                     f"got {bad.size} of {ids.size} outside it, from {int(bad.min())} to {int(bad.max())}")


def _pool_pads(x, a) -> tuple[tuple[int, int], tuple[int, int]]:
    """(before, after) padding per spatial axis that makes every output window fit."""
    pads = []
    for i in range(2):
        k, s, p = a["kernel"][i], a["stride"][i], a["padding"][i]
        d = a.get("dilation", (1, 1))[i]
        need = (a["out_hw"][i] - 1) * s + (k - 1) * d + 1
        pads.append((p, max(p, need - x.shape[2 + i] - p)))
    return tuple(pads)


@_kernel("max_pool2d")
def _max_pool2d(xs, a):
    x = xs[0]
    pads = _pool_pads(x, a)
    lowest = np.iinfo(x.dtype).min if np.issubdtype(x.dtype, np.integer) else -np.inf  # never wins
    xp = np.pad(x, ((0, 0), (0, 0)) + pads, constant_values=lowest)
    win = _windows(xp, a["kernel"], a["stride"], a["dilation"], a["out_hw"])
    return win.max(axis=(4, 5))


@_kernel("avg_pool2d")
def _avg_pool2d(xs, a):
    x = xs[0]
    pads = _pool_pads(x, a)
    no_dil = (1, 1)
    total = _windows(np.pad(x, ((0, 0), (0, 0)) + pads), a["kernel"], a["stride"], no_dil,
                     a["out_hw"]).sum(axis=(4, 5))
    if a["divisor_override"] is not None:
        return total / np.asarray(a["divisor_override"], dtype=x.dtype)
    # Count the window cells that fall inside the input (or inside its declared padding).
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    if a["count_include_pad"]:
        p = a["padding"]
        ones = np.pad(ones, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=1)
        extra = tuple((lo - pp, hi - pp) for (lo, hi), pp in zip(pads, p))
    else:
        extra = pads
    count = _windows(np.pad(ones, ((0, 0), (0, 0)) + extra), a["kernel"], a["stride"], no_dil,
                     a["out_hw"]).sum(axis=(4, 5))
    return total / count


@_kernel("adaptive_avg_pool2d")
def _adaptive_avg_pool2d(xs, a):
    x = xs[0]
    (h, w), (oh, ow) = x.shape[2:], a["output_size"]
    y = np.empty(x.shape[:2] + (oh, ow), dtype=x.dtype)
    for i in range(oh):
        h0, h1 = (i * h) // oh, -((-(i + 1) * h) // oh)
        for j in range(ow):
            w0, w1 = (j * w) // ow, -((-(j + 1) * w) // ow)
            y[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return y


@_kernel("reshape")
def _reshape(xs, a):
    return xs[0].reshape(a["shape"])


@_kernel("permute")
def _permute(xs, a):
    return xs[0].transpose(a["axes"])


@_kernel("expand")
def _expand(xs, a):
    return np.broadcast_to(xs[0], a["shape"])


@_kernel("concat")
def _concat(xs, a):
    return np.concatenate(xs, axis=a["axis"])


@_kernel("slice")
def _slice(xs, a):
    x = xs[0]
    index = [slice(None)] * x.ndim
    index[a["axis"]] = slice(a["start"], a["end"], a["step"])
    return x[tuple(index)]


@_kernel("pad")
def _pad(xs, a):
    return np.pad(xs[0], a["pads"], constant_values=a["value"])


def _nhwc_args_as_nchw(op: str, args: list[np.ndarray]) -> list[np.ndarray]:
    """An NHWC operator's arguments in the NCHW kernel's layouts: the activation NHWC -> NCHW,
    a conv weight HWIO -> OIHW (a bias stays)."""
    out = [args[0].transpose(0, 3, 1, 2)]
    if op == "conv2d":
        out.append(args[1].transpose(3, 2, 0, 1))
    return out + list(args[len(out):])


# ----------------------------------------------------------------------------- indexing and scans


@_kernel("take")
def _take(xs, a):
    x, index = xs
    axis = a["axis"] % x.ndim
    return np.take(x, np.where(index < 0, index + x.shape[axis], index), axis=axis)


@_kernel("trunc_div")
def _trunc_div(xs, a):
    x, y = xs
    if np.any(y == 0):
        raise GraphError("integer division by zero")
    q = np.abs(x) // np.abs(y)
    return np.where((x < 0) != (y < 0), -q, q).astype(x.dtype)


@_kernel("mod")
def _mod(xs, a):
    x, y = xs
    if np.issubdtype(x.dtype, np.integer) and np.any(y == 0):
        raise GraphError("mod: integer division by zero")
    return np.fmod(x, y) if a["fmod"] else np.mod(x, y)


@_kernel("arg_reduce")
def _arg_reduce(xs, a):
    x, axis = xs[0], a["axis"] % max(xs[0].ndim, 1)
    if a["select_last_index"]:  # the last of equal extremes: search the reversed axis
        flipped = np.flip(x, axis)
        found = (np.argmax if a["largest"] else np.argmin)(flipped, axis=axis)
        found = x.shape[axis] - 1 - found
    else:
        found = (np.argmax if a["largest"] else np.argmin)(x, axis=axis)
    return np.expand_dims(found, axis) if a["keepdims"] else found


def _checked_index(index: np.ndarray, n: int, what: str) -> np.ndarray:
    if np.any((index < -n) | (index >= n)):
        bad = index[(index < -n) | (index >= n)]
        raise IndexError(f"{what}: indices must lie in [{-n}, {n}), got {bad.min()} .. {bad.max()}")
    return np.where(index < 0, index + n, index)


@_kernel("gather_elements")
def _gather_elements(xs, a):
    x, index = xs
    axis = a["axis"] % x.ndim
    return np.take_along_axis(x, _checked_index(index, x.shape[axis], "gather_elements"), axis=axis)


_SCATTER_COMBINE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


@_kernel("scatter_elements")
def _scatter_elements(xs, a):
    x, index, updates = xs
    axis = a["axis"] % x.ndim
    index = _checked_index(index, x.shape[axis], "scatter_elements")
    out = x.copy()
    grid = list(np.indices(index.shape, sparse=False))
    grid[axis] = index
    where = tuple(grid)
    if a["reduction"] == "none":
        out[where] = updates
    else:
        _SCATTER_COMBINE[a["reduction"]].at(out, where, updates)
    return out


@_kernel("scatter_nd")
def _scatter_nd(xs, a):
    x, index, updates = xs
    k = index.shape[-1]
    out = x.copy()
    tuples = index.reshape(-1, k)
    flat_updates = updates.reshape((tuples.shape[0],) + x.shape[k:])
    for j, t in enumerate(tuples):  # in order: a later update of one place wins, as ONNX says
        place = tuple(int(_checked_index(np.asarray(v), x.shape[d], "scatter_nd")) for d, v in enumerate(t))
        if a["reduction"] == "none":
            out[place] = flat_updates[j]
        else:
            out[place] = _SCATTER_COMBINE[a["reduction"]](out[place], flat_updates[j])
    return out


@_kernel("cumsum")
def _cumsum(xs, a):
    x, axis = xs[0], a["axis"] % xs[0].ndim
    if a["reverse"]:
        x = np.flip(x, axis)
    y = np.cumsum(x, axis=axis, dtype=x.dtype)
    if a["exclusive"]:
        y = np.concatenate([np.zeros_like(np.take(y, [0], axis=axis)), np.take(y, range(x.shape[axis] - 1), axis=axis)],
                           axis=axis)
    return np.flip(y, axis) if a["reverse"] else y


@_kernel("topk")
def _topk(xs, a):
    x, axis, k = xs[0], a["axis"] % xs[0].ndim, a["k"]
    # ~x reverses every integer order (-x wraps: unsigned values, the smallest signed one)
    keys = (~x if x.dtype.kind in "iu" else -x) if a["largest"] else x
    order = np.argsort(keys, axis=axis, kind="stable")  # stable: equal values keep index order
    picked = np.take(order, range(k), axis=axis)
    return picked.astype(np.int64) if a["indices"] else np.take_along_axis(x, picked, axis=axis)


@_kernel("pad_border")
def _pad_border(xs, a):
    mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[a["mode"]]
    return np.pad(xs[0], [tuple(p) for p in a["pads"]], mode=mode)


@_kernel("resize")
def _resize(xs, a):
    from ansor.graph.resize import resize

    return resize(xs[0], a)


@_kernel("conv_nd")
def _conv_nd(xs, a):
    from ansor.graph.spatial import conv_nd

    return conv_nd(xs[0], xs[1], xs[2] if len(xs) > 2 else None, a["stride"], a["pads"], a["dilation"], a["groups"])


@_kernel("conv_transpose")
def _conv_transpose(xs, a):
    from ansor.graph.spatial import conv_transpose_nd

    return conv_transpose_nd(xs[0], xs[1], xs[2] if len(xs) > 2 else None, a["stride"], a["pads"],
                             a["dilation"], a["groups"], a["output_padding"])


@_kernel("pool_nd")
def _pool_nd(xs, a):
    from ansor.graph.spatial import pool_nd

    return pool_nd(xs[0], a["kind"], a["kernel"], a["stride"], a["pads"], a["dilation"], a["count_include_pad"], a["p"])


def run_node(graph: Graph, node: Node, args: list[np.ndarray]) -> np.ndarray:
    """Evaluate one node on numpy inputs, returning an array of the node's recorded type."""
    if node.op not in KERNELS:
        raise GraphError(f"the reference executor has no kernel for {node.op!r}")
    attrs = dict(node.attrs)
    out_type = graph.types[node.output]
    if node.op in ("mean", "sum", "max", "min", "prod"):
        attrs["op"] = node.op
    channels_last = attrs.get("layout") == "NHWC"
    if channels_last:  # the kernels are written for NCHW: transpose in and out
        args = _nhwc_args_as_nchw(node.op, args)
    if node.op in ("conv2d", "max_pool2d", "avg_pool2d", "max_pool2d_indices"):
        attrs["out_hw"] = out_type.shape[1:3] if channels_last else out_type.shape[2:]
    for position, size, negative in gathered_indices(node, args):
        check_indices(node, position, np.asarray(args[position]), size, negative)
    widen = widened(node, graph)
    if widen:  # half floats computed in float32, rounded once (graph/half_precision.py)
        args = [np.asarray(a).astype(COMPUTE_DTYPE) if str(np.asarray(a).dtype) in WIDENED_DTYPES
                else a for a in args]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        y = KERNELS[node.op](args, attrs)
    if channels_last:
        y = np.ascontiguousarray(np.asarray(y).transpose(0, 2, 3, 1))
    if widen and out_type.dtype in WIDENED_DTYPES:
        y = cast_array(np.asarray(y, dtype=COMPUTE_DTYPE), out_type.dtype)
    y = np.asarray(y, dtype=out_type.dtype)
    if y.shape != out_type.shape:
        raise GraphError(f"%{node.output} = {node.op}: kernel gave shape {y.shape}, "
                         f"graph says {out_type.shape}")
    return y


_PASS_IDS_THROUGH = frozenset({"cast", "reshape", "expand", "permute", "slice"})


def random_inputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    """Reproducible inputs of the graph's input types, for checking a compiled model against
    this executor: floats uniform in [-1, 1), bools with probability 1/2, and integers in
    [0, n) where n is the smallest axis they index (through casts, reshapes, slices), else in
    [0, 2) (a mask, a token type): ids out of their tables would only test the IndexError."""
    bound: dict[str, int] = {}
    producers = graph.producers()
    for node in graph.nodes:
        for position, size, _ in gathered_indices(node, [graph.type_of(i) for i in node.inputs]):
            value = node.inputs[position]
            while value in producers and producers[value].op in _PASS_IDS_THROUGH:
                value = producers[value].inputs[0]
            bound[value] = min(bound.get(value, size), size)
    rng = np.random.default_rng(seed)
    arrays = []
    for name in graph.inputs:
        t = graph.types[name]
        dtype = np.dtype(t.dtype)
        if dtype.kind == "f" or t.dtype in HALF_FLOAT_DTYPES:
            arrays.append(rng.uniform(-1.0, 1.0, t.shape).astype(np.float32).astype(dtype))
        elif dtype.kind in "iu":
            arrays.append(rng.integers(0, max(1, bound.get(name, 2)), t.shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.random(t.shape) < 0.5)
        else:
            raise GraphError(f"input {name!r}: no random values of dtype {dtype}")
    return arrays


def run_graph(graph: Graph, inputs: Mapping[str, Any] | list[Any]) -> list[np.ndarray]:
    """Run the graph on inputs (by name, or a list in `graph.inputs` order); return its outputs.

    Each intermediate is dropped after its last use, so peak memory stays near that of one
    layer rather than the whole network."""
    if not isinstance(inputs, Mapping):
        if len(inputs) != len(graph.inputs):
            raise GraphError(f"expected {len(graph.inputs)} inputs, got {len(inputs)}")
        inputs = dict(zip(graph.inputs, inputs))
    env: dict[str, np.ndarray] = dict(graph.constants)
    for name in graph.inputs:
        t = graph.types[name]
        x = np.asarray(inputs[name])
        if tuple(x.shape) != t.shape:
            raise GraphError(f"input {name!r}: expected shape {t.shape}, got {x.shape}")
        env[name] = x.astype(t.dtype, copy=False)
    last_use = {}
    for idx, n in enumerate(graph.nodes):
        for i in n.inputs:
            last_use[i] = idx
    keep = set(graph.outputs) | set(graph.constants) | set(graph.inputs)
    for idx, n in enumerate(graph.nodes):
        env[n.output] = run_node(graph, n, [env[i] for i in n.inputs])
        for i in dict.fromkeys(n.inputs):
            if last_use[i] == idx and i not in keep:
                del env[i]
    return [env[o] for o in graph.outputs]


# ----------------------------------------------------------------------------- PyTorch core ATen
# Kernels of the operators ops.py adds for PyTorch's core ATen set.

KERNELS["expm1"] = _make_unary(np.expm1)
KERNELS["log1p"] = _make_unary(np.log1p)
KERNELS["atan2"] = _make_binary(np.arctan2)
for _n, _f in {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
               "bitwise_xor": np.bitwise_xor}.items():
    KERNELS[_n] = _make_binary(_f)
KERNELS["bitwise_not"] = _make_unary(np.invert)


@_kernel("divide_rounded")
def _divide_rounded(xs, a):
    """Floor division is numpy's // (for floats the algorithm of CPython's float //, which
    PyTorch's div_floor_floating copies); truncating division of integers is that of the
    magnitudes with the sign put back, of floats trunc(a / b)."""
    x, y = xs
    integer = np.issubdtype(x.dtype, np.integer)
    if integer and np.any(y == 0):
        raise ZeroDivisionError("divide_rounded: integer division by zero")
    if a["mode"] == "floor":
        return np.floor_divide(x, y)
    if integer:
        q = np.abs(x) // np.abs(y)
        return np.where((x < 0) != (y < 0), -q, q)
    return np.trunc(x / y)


@_kernel("masked_scatter")
def _masked_scatter(xs, a):
    x, mask, source = xs
    mask = np.broadcast_to(mask, x.shape)
    count = int(mask.sum())
    if count > source.size:
        raise IndexError(f"masked_scatter: {count} places to fill from a source of {source.size}")
    out = x.copy()
    out[mask] = source.reshape(-1)[:count]
    return out


@_kernel("max_pool2d_indices")
def _max_pool2d_indices(xs, a):
    """PyTorch's rule: each window scans its cells inside the input in order and keeps the
    first largest (a NaN wins); a window whose cells are all -inf keeps its first cell."""
    x = xs[0]
    h, w = x.shape[2:]
    pads = _pool_pads(x, a)
    xp = np.pad(x, ((0, 0), (0, 0)) + pads, constant_values=-np.inf)
    ids = np.pad(np.arange(h * w, dtype=np.int64).reshape(1, 1, h, w), ((0, 0), (0, 0)) + pads,
                 constant_values=-1)
    win = _windows(xp, a["kernel"], a["stride"], a["dilation"], a["out_hw"])
    id_win = _windows(ids, a["kernel"], a["stride"], a["dilation"], a["out_hw"])
    flat = win.reshape(win.shape[:4] + (-1,))
    flat_ids = np.broadcast_to(id_win.reshape(id_win.shape[:4] + (-1,)), flat.shape)
    valid = flat_ids >= 0
    nan = np.isnan(flat) & valid
    key = np.where(valid, flat, -np.inf)
    best = np.argmax(key, axis=-1)
    last_nan = flat.shape[-1] - 1 - np.argmax(nan[..., ::-1], axis=-1)
    best = np.where(nan.any(axis=-1), last_nan, best)
    first_valid = np.argmax(valid, axis=-1)
    picked = np.take_along_axis(flat_ids, best[..., None], axis=-1)[..., 0]
    fallback = np.take_along_axis(flat_ids, first_valid[..., None], axis=-1)[..., 0]
    return np.where(picked >= 0, picked, fallback)


def _grid_coordinate(coord: np.ndarray, size: int, a: dict) -> np.ndarray:
    """A normalized grid coordinate as a pixel coordinate of an axis of `size`, with
    PyTorch's padding rule applied (border clips, reflection mirrors then clips), in the
    input's dtype as PyTorch computes it."""
    dtype = coord.dtype.type
    if a["align_corners"]:
        pos = (coord + dtype(1)) * dtype((size - 1) / 2)
    else:
        pos = (coord + dtype(1)) * dtype(size / 2) - dtype(0.5)
    if a["padding_mode"] == "reflection":
        low, high = (0.0, 2.0 * (size - 1)) if a["align_corners"] else (-1.0, 2.0 * size - 1)
        if low == high:
            pos = np.zeros_like(pos)
        else:
            lo, span = dtype(low / 2), dtype((high - low) / 2)
            d = np.abs(pos - lo)
            extra = np.fmod(d, span)
            flips = np.floor(d / span)
            pos = np.where(flips % 2 == 0, extra + lo, span - extra + lo)
    if a["padding_mode"] in ("border", "reflection"):
        pos = np.clip(pos, 0, size - 1)
    return pos.astype(coord.dtype)


@_kernel("grid_sample")
def _grid_sample(xs, a):
    x, grid = xs
    n, c, h, w = x.shape
    ix = _grid_coordinate(grid[..., 0], w, a)  # [N, Ho, Wo]
    iy = _grid_coordinate(grid[..., 1], h, a)
    batch = np.arange(n).reshape(n, 1, 1)

    def read(yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
        """x at integer points (zero outside), as [N, C, Ho, Wo]."""
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        v = x[batch, :, np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)]  # [N, Ho, Wo, C]
        return np.moveaxis(np.where(inside[..., None], v, 0), -1, 1)

    if a["mode"] == "nearest":
        with np.errstate(invalid="ignore"):
            return read(np.rint(iy).astype(np.int64), np.rint(ix).astype(np.int64))
    x0, y0 = np.floor(ix), np.floor(iy)
    wx, wy = ix - x0, iy - y0
    x0, y0 = x0.astype(np.int64), y0.astype(np.int64)
    out = 0
    for dy, fy in ((0, 1 - wy), (1, wy)):
        for dx, fx in ((0, 1 - wx), (1, wx)):
            out = out + read(y0 + dy, x0 + dx) * (fy * fx)[:, None]
    return out


@_kernel("attention")
def _fused_attention(xs, a):
    q, k, v = xs[:3]
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * np.asarray(a["scale"], dtype=q.dtype)
    lq, lk = s.shape[-2:]
    if a["mask"] == "additive":
        s = s + xs[3]
    if a["mask"] == "lengths":
        s = np.where(np.arange(lk) < xs[3].reshape(-1, 1, 1, 1), s, -np.inf)
    if a["causal"]:
        s = np.where(np.tril(np.ones((lq, lk), dtype=bool)), s, -np.inf)
    out = np.matmul(_softmax([s], {"axis": -1}), v)
    return out.transpose(0, 2, 1, 3) if a["heads_last"] else out


# rare operators with numpy kernels only register their shape rules and kernels on import
from ansor.graph import numpy_operators  # noqa: E402,F401
