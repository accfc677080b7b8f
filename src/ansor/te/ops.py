"""Ready operators built from placeholder/compute declarations.

Each operator returns its output tensor. Intermediate results (padding, partial reductions) are
separate compute stages with meaningful names, because a reduction must be the whole body of its
compute and because the scheduler decides separately how to place each stage. Arguments are
checked at declaration, and errors name the tensor and dimension at fault.
"""

from __future__ import annotations

import math
import operator
from typing import Callable, Sequence, Union

from ansor.te import expr as E
from ansor.te.tensor import Tensor, compute, reduce_axis

__all__ = [
    "matmul", "batch_matmul", "dense", "bias_add", "relu", "gelu", "pad",
    "conv2d", "depthwise_conv2d", "conv2d_transpose", "max_pool2d", "avg_pool2d",
    "softmax", "layer_norm", "norm2", "add", "subtract", "multiply", "divide",
]

IntPair = Union[int, Sequence[int]]


# ---------------------------------------------------------------------------------------------
# argument checking

def _check_tensor(op: str, role: str, t, ndim: int | None = None) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {role} must be a te.Tensor, got {type(t).__name__}")
    if ndim is not None and t.ndim != ndim:
        raise ValueError(f"{op}: {role} {t.name!r} must have {ndim} dimensions, but has shape "
                         f"{t.shape}")
    return t


def _check_same_dtype(op: str, *tensors: Tensor) -> str:
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        if t.dtype != dtype:
            raise TypeError(f"{op}: {t.name!r} has dtype {t.dtype} but {tensors[0].name!r} has "
                            f"{dtype}; cast one of them first")
    return dtype


def _check_float(op: str, t: Tensor) -> None:
    if not E.is_float(t.dtype):
        raise TypeError(f"{op}: {t.name!r} must have a float dtype, got {t.dtype}")


def _check_dim(op: str, t: Tensor, dim: int, expected: int, why: str) -> None:
    if t.shape[dim] != expected:
        raise ValueError(f"{op}: {t.name!r} dimension {dim} has extent {t.shape[dim]}, expected "
                         f"{expected} ({why})")


def _norm_axis(op: str, t: Tensor, axis: int) -> int:
    ax = _as_int(axis)
    if ax is None or not -t.ndim <= ax < t.ndim:
        raise ValueError(f"{op}: axis {axis!r} is out of range for {t.name!r} with "
                         f"{t.ndim} dimensions")
    return ax % t.ndim


def _as_int(value) -> int | None:
    """`value` as a Python int if it is an integer (numpy integers included, bools not)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _ints(op: str, what: str, value, n: int, minimum: int) -> tuple[int, ...]:
    """An int broadcast to `n` values, or a sequence of exactly `n` ints, each >= minimum."""
    single = _as_int(value)
    if single is not None:
        value = (single,) * n
    try:
        values = tuple(value)
    except TypeError:
        raise TypeError(f"{op}: {what} must be an int or {n} ints, got {value!r}") from None
    if len(values) != n:
        raise ValueError(f"{op}: {what} must be an int or {n} ints, got {value!r}")
    ints = tuple(_as_int(v) for v in values)
    if any(v is None or v < minimum for v in ints):
        raise ValueError(f"{op}: {what} values must be integers >= {minimum}, got {value!r}")
    return ints  # type: ignore[return-value]


def _padding4(op: str, padding) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from an int, a (vertical, horizontal) pair or a 4-tuple."""
    single = _as_int(padding)
    if single is not None:
        padding = (single, single)
    try:
        n = len(padding)
    except TypeError:
        raise TypeError(f"{op}: padding must be an int, a pair or a 4-tuple, got {padding!r}") \
            from None
    if n == 2:
        ph, pw = _ints(op, "padding", padding, 2, 0)
        return ph, pw, ph, pw
    if n == 4:
        return _ints(op, "padding", padding, 4, 0)  # type: ignore[return-value]
    raise ValueError(f"{op}: padding must be an int, a pair or a 4-tuple, got {padding!r}")


def _out_extent(op: str, data: Tensor, dim: int, size: int, pad_total: int, window: int,
                stride: int) -> int:
    out = (size + pad_total - window) // stride + 1
    if size + pad_total < window or out < 1:
        raise ValueError(f"{op}: {data.name!r} dimension {dim} has extent {size}, padded to "
                         f"{size + pad_total}, which is smaller than the (dilated) window {window}")
    return out


def _value_const(value: float, dtype: str) -> E.Const:
    if E.is_int(dtype):
        if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
            raise ValueError(f"pad value {value!r} is not representable in {dtype}")
    return E.const(value, dtype)


# ---------------------------------------------------------------------------------------------
# linear algebra

def matmul(A: Tensor, B: Tensor, transpose_a: bool = False, transpose_b: bool = False,
           name: str = "matmul") -> Tensor:
    """C = op(A) @ op(B) for 2-D tensors, op transposing when asked."""
    _check_tensor("matmul", "A", A, 2)
    _check_tensor("matmul", "B", B, 2)
    _check_same_dtype("matmul", A, B)
    m, ka = (A.shape[1], A.shape[0]) if transpose_a else A.shape
    kb, n = (B.shape[1], B.shape[0]) if transpose_b else B.shape
    if ka != kb:
        raise ValueError(
            f"matmul: reduction extents differ: {A.name!r} dimension {0 if transpose_a else 1} "
            f"has {ka} but {B.name!r} dimension {1 if transpose_b else 0} has {kb}")
    k = reduce_axis(ka, "k")

    def body(i, j):
        a = A[k, i] if transpose_a else A[i, k]
        b = B[j, k] if transpose_b else B[k, j]
        return E.sum(a * b, axis=k)

    return compute((m, n), body, name=name, tag="matmul")


def batch_matmul(A: Tensor, B: Tensor, transpose_b: bool = False,
                 name: str = "batch_matmul") -> Tensor:
    """C[b] = A[b] @ B[b] for (batch, m, k) @ (batch, k, n), or B as (batch, n, k) when
    transposed. A batch extent of 1 broadcasts against the other."""
    _check_tensor("batch_matmul", "A", A, 3)
    _check_tensor("batch_matmul", "B", B, 3)
    _check_same_dtype("batch_matmul", A, B)
    ba, m, ka = A.shape
    bb, kb, n = (B.shape[0], B.shape[2], B.shape[1]) if transpose_b else B.shape
    if ba != bb and 1 not in (ba, bb):
        raise ValueError(f"batch_matmul: batch extents differ: {A.name!r} dimension 0 has {ba} "
                         f"but {B.name!r} dimension 0 has {bb}")
    if ka != kb:
        raise ValueError(
            f"batch_matmul: reduction extents differ: {A.name!r} dimension 2 has {ka} but "
            f"{B.name!r} dimension {2 if transpose_b else 1} has {kb}")
    k = reduce_axis(ka, "k")

    def body(b, i, j):
        a_b = b if ba > 1 else 0
        b_b = b if bb > 1 else 0
        rhs = B[b_b, j, k] if transpose_b else B[b_b, k, j]
        return E.sum(A[a_b, i, k] * rhs, axis=k)

    return compute((max(ba, bb), m, n), body, name=name, tag="batch_matmul")


def dense(X: Tensor, W: Tensor, bias: Tensor | None = None, name: str = "dense") -> Tensor:
    """Y = X @ W.T (+ bias) with X (m, k) and W (n, k), the layout of a linear layer."""
    _check_tensor("dense", "data", X, 2)
    _check_tensor("dense", "weight", W, 2)
    _check_same_dtype("dense", X, W)
    if X.shape[1] != W.shape[1]:
        raise ValueError(f"dense: reduction extents differ: {X.name!r} dimension 1 has "
                         f"{X.shape[1]} but weight {W.name!r} dimension 1 has {W.shape[1]}")
    out = matmul(X, W, transpose_b=True, name=name)
    if bias is None:
        return out
    return bias_add(out, bias, axis=1, name=f"{name}_bias")


# ---------------------------------------------------------------------------------------------
# elementwise

def bias_add(X: Tensor, bias: Tensor, axis: int = 1, name: str = "bias_add") -> Tensor:
    """X + bias, with the 1-D bias running along `axis` (channels in NCHW by default)."""
    _check_tensor("bias_add", "data", X)
    _check_tensor("bias_add", "bias", bias, 1)
    _check_same_dtype("bias_add", X, bias)
    ax = _norm_axis("bias_add", X, axis)
    if bias.shape[0] != X.shape[ax]:
        raise ValueError(f"bias_add: bias {bias.name!r} dimension 0 has extent {bias.shape[0]}, "
                         f"but {X.name!r} dimension {ax} has {X.shape[ax]}")
    return compute(X.shape, lambda *i: X[i] + bias[i[ax]], name=name, tag="elemwise")


def relu(X: Tensor, name: str = "relu") -> Tensor:
    """max(x, 0)."""
    _check_tensor("relu", "data", X)
    return compute(X.shape, lambda *i: E.maximum(X[i], 0), name=name, tag="elemwise")


def gelu(X: Tensor, name: str = "gelu") -> Tensor:
    """The exact (erf) GELU: 0.5 * x * (1 + erf(x / sqrt(2)))."""
    _check_tensor("gelu", "data", X)
    _check_float("gelu", X)

    def body(*i):
        x = X[i]
        return 0.5 * x * (1.0 + E.erf(x * (1.0 / math.sqrt(2.0))))

    return compute(X.shape, body, name=name, tag="elemwise")


def _broadcast_binary(opname: str, A, B, fn: Callable[[E.Expr, E.Expr], E.Expr],
                      name: str) -> Tensor:
    """fn(A, B) with numpy broadcasting (shapes aligned on the right, extent 1 broadcasts);
    either side may be a Python number."""
    if not isinstance(A, Tensor) and not isinstance(B, Tensor):
        raise TypeError(f"{opname}: at least one operand must be a te.Tensor")
    tensors = [t for t in (A, B) if isinstance(t, Tensor)]
    if len(tensors) == 2:
        _check_same_dtype(opname, A, B)
    ndim = max(t.ndim for t in tensors)
    shape = []
    for d in range(ndim):
        extents = {t.shape[d - ndim + t.ndim] for t in tensors if d - ndim + t.ndim >= 0}
        big = extents - {1}
        if len(big) > 1:
            a, b = tensors
            raise ValueError(f"{opname}: shapes {a.shape} of {a.name!r} and {b.shape} of "
                             f"{b.name!r} do not broadcast (output dimension {d})")
        shape.append(big.pop() if big else 1)

    def operand(x, idx):
        if not isinstance(x, Tensor):
            return x
        own = idx[ndim - x.ndim:]
        return x[tuple(0 if x.shape[d] == 1 and shape[d + ndim - x.ndim] != 1 else i
                       for d, i in enumerate(own))]

    return compute(tuple(shape), lambda *i: fn(operand(A, i), operand(B, i)), name=name,
                   tag="elemwise")


def add(A, B, name: str = "add") -> Tensor:
    """A + B with broadcasting."""
    return _broadcast_binary("add", A, B, lambda a, b: a + b, name)


def subtract(A, B, name: str = "subtract") -> Tensor:
    """A - B with broadcasting."""
    return _broadcast_binary("subtract", A, B, lambda a, b: a - b, name)


def multiply(A, B, name: str = "multiply") -> Tensor:
    """A * B with broadcasting."""
    return _broadcast_binary("multiply", A, B, lambda a, b: a * b, name)


def divide(A, B, name: str = "divide") -> Tensor:
    """A / B with broadcasting (float tensors)."""
    return _broadcast_binary("divide", A, B, lambda a, b: a / b, name)


# ---------------------------------------------------------------------------------------------
# padding and convolutions

def pad(X: Tensor, pad_before: Sequence[int], pad_after: Sequence[int] | None = None,
        value: float = 0.0, name: str = "pad") -> Tensor:
    """X surrounded by `value`: a compute stage whose reads are guarded by if_then_else, so it
    never reads outside X. `pad_after` defaults to `pad_before`."""
    _check_tensor("pad", "data", X)
    before = _ints("pad", "pad_before", pad_before, X.ndim, 0)
    after = before if pad_after is None else _ints("pad", "pad_after", pad_after, X.ndim, 0)
    fill = _value_const(value, X.dtype)
    shape = tuple(n + b + a for n, b, a in zip(X.shape, before, after))

    def body(*i):
        conds = []
        for d, (idx, b, a) in enumerate(zip(i, before, after)):
            if b:
                conds.append(idx >= b)
            if a:
                conds.append(idx < X.shape[d] + b)
        inner = X[tuple(idx - b if b else idx for idx, b in zip(i, before))]
        if not conds:
            return inner
        cond = conds[0]
        for c in conds[1:]:
            cond = cond & c
        return E.if_then_else(cond, inner, fill)

    return compute(shape, body, name=name, tag="pad")


#: By activation layout: the channel, height and width axes of the data, and the output-channel,
#: input-channel, kernel-height and kernel-width axes of the weight (OIHW or HWIO).
_LAYOUT_AXES = {"NCHW": ((1, 2, 3), (0, 1, 2, 3)), "NHWC": ((3, 1, 2), (3, 2, 0, 1))}


def _layout_axes(op: str, layout: str) -> tuple[tuple[int, int, int], tuple[int, int, int, int]]:
    if layout not in _LAYOUT_AXES:
        raise ValueError(f"{op}: layout must be 'NCHW' or 'NHWC', got {layout!r}")
    return _LAYOUT_AXES[layout]


def _pad_spatial(data: Tensor, layout: str, padding4: tuple[int, int, int, int],
                 name: str) -> Tensor:
    """`data` zero-padded on its height and width axes (itself when the padding is zero)."""
    pt, pl, pb, pr = padding4
    if not (pt or pl or pb or pr):
        return data
    if layout == "NCHW":
        return pad(data, (0, 0, pt, pl), (0, 0, pb, pr), 0.0, name=name)
    return pad(data, (0, pt, pl, 0), (0, pb, pr, 0), 0.0, name=name)


def conv2d(data: Tensor, weight: Tensor, stride: IntPair = 1, padding=0, dilation: IntPair = 1,
           groups: int = 1, layout: str = "NCHW", name: str = "conv2d") -> Tensor:
    """2-D convolution (cross-correlation, as in deep-learning frameworks).

    NCHW data (n, c, h, w) takes OIHW weight (o, c/groups, kh, kw); NHWC data (n, h, w, c)
    takes HWIO weight (kh, kw, c/groups, o). `padding` is an int, a (vertical, horizontal)
    pair or (top, left, bottom, right). Nonzero padding is a separate `pad` stage.
    """
    op = "conv2d"
    _check_tensor(op, "data", data, 4)
    _check_tensor(op, "weight", weight, 4)
    _check_same_dtype(op, data, weight)
    (c_dim, h_dim, w_dim), (o_dim, i_dim, kh_dim, kw_dim) = _layout_axes(op, layout)
    sh, sw = _ints(op, "stride", stride, 2, 1)
    dh, dw = _ints(op, "dilation", dilation, 2, 1)
    pt, pl, pb, pr = _padding4(op, padding)
    groups_int = _as_int(groups)
    if groups_int is None or groups_int < 1:
        raise ValueError(f"{op}: groups must be a positive integer, got {groups!r}")
    groups = groups_int

    batch, c, h, w = data.shape[0], data.shape[c_dim], data.shape[h_dim], data.shape[w_dim]
    co, kh, kw = weight.shape[o_dim], weight.shape[kh_dim], weight.shape[kw_dim]
    if c % groups:
        raise ValueError(f"{op}: {data.name!r} dimension {c_dim} has {c} channels, which "
                         f"groups={groups} does not divide")
    if co % groups:
        raise ValueError(f"{op}: weight {weight.name!r} dimension {o_dim} has {co} output "
                         f"channels, which groups={groups} does not divide")
    cpg, opg = c // groups, co // groups
    _check_dim(op, weight, i_dim, cpg,
               f"input channels per group: {c} channels of {data.name!r} / groups={groups}")
    oh = _out_extent(op, data, h_dim, h, pt + pb, dh * (kh - 1) + 1, sh)
    ow = _out_extent(op, data, w_dim, w, pl + pr, dw * (kw - 1) + 1, sw)

    padded = _pad_spatial(data, layout, (pt, pl, pb, pr), f"{name}_pad")

    rc = reduce_axis(cpg, "rc")
    ry = reduce_axis(kh, "ry")
    rx = reduce_axis(kw, "rx")

    def channel(ff):
        return rc if groups == 1 else (ff // opg) * cpg + rc

    if layout == "NCHW":
        def body(nn, ff, yy, xx):
            return E.sum(padded[nn, channel(ff), yy * sh + ry * dh, xx * sw + rx * dw]
                         * weight[ff, rc, ry, rx], axis=[rc, ry, rx])

        return compute((batch, co, oh, ow), body, name=name, tag="conv2d_nchw")

    def body_nhwc(nn, yy, xx, ff):
        return E.sum(padded[nn, yy * sh + ry * dh, xx * sw + rx * dw, channel(ff)]
                     * weight[ry, rx, rc, ff], axis=[rc, ry, rx])

    return compute((batch, oh, ow, co), body_nhwc, name=name, tag="conv2d_nhwc")


def depthwise_conv2d(data: Tensor, weight: Tensor, stride: IntPair = 1, padding=0,
                     dilation: IntPair = 1, layout: str = "NCHW",
                     name: str = "depthwise_conv2d") -> Tensor:
    """Depthwise convolution (conv2d with groups = channels); output channel f reads input
    channel f // multiplier.

    NCHW data takes weight (c * multiplier, 1, kh, kw); NHWC data takes weight
    (kh, kw, 1, c * multiplier), conv2d's HWIO with one input channel per filter. NHWC puts the
    channels innermost, where a vector of them loads contiguously whatever the stride: the
    layout that makes strided depthwise layers fast.
    """
    op = "depthwise_conv2d"
    _check_tensor(op, "data", data, 4)
    _check_tensor(op, "weight", weight, 4)
    _check_same_dtype(op, data, weight)
    (c_dim, h_dim, w_dim), (o_dim, one_dim, kh_dim, kw_dim) = _layout_axes(op, layout)
    sh, sw = _ints(op, "stride", stride, 2, 1)
    dh, dw = _ints(op, "dilation", dilation, 2, 1)
    pt, pl, pb, pr = _padding4(op, padding)
    batch, c, h, w = data.shape[0], data.shape[c_dim], data.shape[h_dim], data.shape[w_dim]
    co, kh, kw = weight.shape[o_dim], weight.shape[kh_dim], weight.shape[kw_dim]
    if co % c:
        raise ValueError(f"{op}: weight {weight.name!r} dimension {o_dim} has {co} channels, "
                         f"which is not a multiple of the {c} channels of {data.name!r} "
                         f"(dimension {c_dim})")
    _check_dim(op, weight, one_dim, 1, "one input channel per filter")
    mult = co // c
    oh = _out_extent(op, data, h_dim, h, pt + pb, dh * (kh - 1) + 1, sh)
    ow = _out_extent(op, data, w_dim, w, pl + pr, dw * (kw - 1) + 1, sw)
    padded = _pad_spatial(data, layout, (pt, pl, pb, pr), f"{name}_pad")
    ry = reduce_axis(kh, "ry")
    rx = reduce_axis(kw, "rx")

    if layout == "NCHW":
        def body(nn, ff, yy, xx):
            cin = ff if mult == 1 else ff // mult
            return E.sum(padded[nn, cin, yy * sh + ry * dh, xx * sw + rx * dw]
                         * weight[ff, 0, ry, rx], axis=[ry, rx])

        return compute((batch, co, oh, ow), body, name=name, tag="depthwise_conv2d_nchw")

    def body_nhwc(nn, yy, xx, ff):
        cin = ff if mult == 1 else ff // mult
        return E.sum(padded[nn, yy * sh + ry * dh, xx * sw + rx * dw, cin]
                     * weight[ry, rx, 0, ff], axis=[ry, rx])

    return compute((batch, oh, ow, co), body_nhwc, name=name, tag="depthwise_conv2d_nhwc")


def conv2d_transpose(data: Tensor, weight: Tensor, stride: IntPair = 1, padding: IntPair = 0,
                     output_padding: IntPair = 0, name: str = "conv2d_transpose") -> Tensor:
    """Transposed convolution, NCHW data (n, ci, h, w) with weight (ci, co, kh, kw) as in
    PyTorch's ConvTranspose2d; output extent (h - 1) * stride - 2 * padding + kh + output_padding.

    Computed by phases, so no multiply meets an inserted zero: output row y = stride * a + b
    only receives kernel rows ky = (b + padding) % stride + stride * t, from input row
    a + (b + padding) // stride - t. A reduction stage `{name}_phases` computes every phase
    (b, and the same for columns) as a dense convolution with ceil(kh / stride) taps, its
    output channels innermost so they vectorize; the output stage puts the rows back in order.
    At stride 2 with a 4x4 kernel this is a quarter of the multiplies of convolving the
    stride-spread input.
    """
    op = "conv2d_transpose"
    _check_tensor(op, "data", data, 4)
    _check_tensor(op, "weight", weight, 4)
    _check_same_dtype(op, data, weight)
    sh, sw = _ints(op, "stride", stride, 2, 1)
    ph, pw = _ints(op, "padding", padding, 2, 0)
    oph, opw = _ints(op, "output_padding", output_padding, 2, 0)
    if oph >= sh or opw >= sw:
        raise ValueError(f"{op}: output_padding {(oph, opw)} must be smaller than the stride "
                         f"{(sh, sw)}")
    batch, ci, h, w = data.shape
    _check_dim(op, weight, 0, ci, f"input channels of {data.name!r}")
    _, co, kh, kw = weight.shape
    oh = (h - 1) * sh - 2 * ph + kh + oph
    ow = (w - 1) * sw - 2 * pw + kw + opw
    if oh < 1 or ow < 1:
        raise ValueError(f"{op}: padding {(ph, pw)} leaves an empty output ({oh} x {ow}) for "
                         f"{data.name!r} of shape {data.shape}")
    rows, cols = -(-oh // sh), -(-ow // sw)  # phase grid: output row y = sh * a + b
    taps_h, taps_w = -(-kh // sh), -(-kw // sw)

    def input_span(n_out: int, s: int, p: int, taps: int, n_in: int) -> tuple[int, int]:
        """Padding the input needs so that every phase's reads stay inside it."""
        lowest = p // s - (taps - 1)
        highest = n_out - 1 + (s - 1 + p) // s
        return max(0, -lowest), max(0, highest - (n_in - 1))

    (lo_h, hi_h), (lo_w, hi_w) = input_span(rows, sh, ph, taps_h, h), input_span(cols, sw, pw, taps_w, w)
    src = data
    if lo_h or hi_h or lo_w or hi_w:
        src = pad(data, (0, 0, lo_h, lo_w), (0, 0, hi_h, hi_w), name=f"{name}_pad")
    rc = reduce_axis(ci, "rc")
    ry = reduce_axis(taps_h, "ry")
    rx = reduce_axis(taps_w, "rx")

    def phases(nn, a, b, c, d, ff):
        ky = (b + ph) % sh + ry * sh if sh > 1 else ry
        kx = (d + pw) % sw + rx * sw if sw > 1 else rx
        iy = a + (b + ph) // sh - ry + lo_h if sh > 1 else a + ph - ry + lo_h
        ix = c + (d + pw) // sw - rx + lo_w if sw > 1 else c + pw - rx + lo_w
        wv = weight[rc, ff, ky, kx]
        conds = ([ky < kh] if kh % sh else []) + ([kx < kw] if kw % sw else [])
        if conds:
            wv = E.if_then_else(conds[0] if len(conds) == 1 else conds[0] & conds[1], wv,
                                E.const(0, weight.dtype))
        return E.sum(src[nn, rc, iy, ix] * wv, axis=[rc, ry, rx])

    by_phase = compute((batch, rows, sh, cols, sw, co), phases, name=f"{name}_phases",
                       tag="conv2d_transpose_phases")

    def body(nn, ff, yy, xx):
        return by_phase[nn, yy // sh, yy % sh, xx // sw, xx % sw, ff]

    return compute((batch, co, oh, ow), body, name=name, tag="conv2d_transpose_nchw")


# ---------------------------------------------------------------------------------------------
# pooling

def _pool_args(op: str, data: Tensor, kernel, stride, padding):
    _check_tensor(op, "data", data, 4)
    kh, kw = _ints(op, "kernel", kernel, 2, 1)
    sh, sw = _ints(op, "stride", kernel if stride is None else stride, 2, 1)
    pt, pl, pb, pr = _padding4(op, padding)
    batch, c, h, w = data.shape
    oh = _out_extent(op, data, 2, h, pt + pb, kh, sh)
    ow = _out_extent(op, data, 3, w, pl + pr, kw, sw)
    return (kh, kw), (sh, sw), (pt, pl, pb, pr), (batch, c, oh, ow)


def max_pool2d(data: Tensor, kernel: IntPair, stride: IntPair | None = None, padding=0,
               name: str = "max_pool2d") -> Tensor:
    """NCHW max pooling; padded positions hold the lowest value so they never win. `stride`
    defaults to the kernel size."""
    (kh, kw), (sh, sw), pads, out_shape = _pool_args("max_pool2d", data, kernel, stride, padding)
    padded = data
    if any(pads):
        lowest = E.reduce_identity("max", data.dtype).value
        pt, pl, pb, pr = pads
        padded = pad(data, (0, 0, pt, pl), (0, 0, pb, pr), lowest, name=f"{name}_pad")
    ry = reduce_axis(kh, "ry")
    rx = reduce_axis(kw, "rx")
    return compute(out_shape,
                   lambda n, c, y, x: E.max(padded[n, c, y * sh + ry, x * sw + rx], axis=[ry, rx]),
                   name=name, tag="pool_max")


def avg_pool2d(data: Tensor, kernel: IntPair, stride: IntPair | None = None, padding=0,
               name: str = "avg_pool2d") -> Tensor:
    """NCHW average pooling dividing by the full window size (padding counts, as PyTorch's
    default count_include_pad=True). `stride` defaults to the kernel size."""
    _check_tensor("avg_pool2d", "data", data)
    _check_float("avg_pool2d", data)
    (kh, kw), (sh, sw), pads, out_shape = _pool_args("avg_pool2d", data, kernel, stride, padding)
    padded = data
    if any(pads):
        pt, pl, pb, pr = pads
        padded = pad(data, (0, 0, pt, pl), (0, 0, pb, pr), 0.0, name=f"{name}_pad")
    ry = reduce_axis(kh, "ry")
    rx = reduce_axis(kw, "rx")
    total = compute(out_shape,
                    lambda n, c, y, x: E.sum(padded[n, c, y * sh + ry, x * sw + rx], axis=[ry, rx]),
                    name=f"{name}_sum", tag="pool_sum")
    scale = 1.0 / (kh * kw)
    return compute(out_shape, lambda n, c, y, x: total[n, c, y, x] * scale, name=name,
                   tag="elemwise")


# ---------------------------------------------------------------------------------------------
# normalization

def _reduced(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    """The shape without `axis`, or (1,) when nothing would be left."""
    rest = shape[:axis] + shape[axis + 1:]
    return rest if rest else (1,)


def _without(idx: tuple, axis: int, ndim: int) -> tuple:
    """Indices of a reduced tensor (see `_reduced`) from indices of the full one."""
    return idx[:axis] + idx[axis + 1:] if ndim > 1 else (0,)


def _with(idx: tuple, axis: int, k, ndim: int) -> tuple:
    """Indices of the full tensor from indices of a reduced one plus the reduced position."""
    if ndim == 1:
        return (k,)
    return idx[:axis] + (k,) + idx[axis:]


def softmax(X: Tensor, axis: int = -1, name: str = "softmax") -> Tensor:
    """exp(x - max) / sum(exp(x - max)) along `axis`, in four stages: max, exp, sum, divide."""
    _check_tensor("softmax", "data", X)
    _check_float("softmax", X)
    ax = _norm_axis("softmax", X, axis)
    nd = X.ndim
    red = _reduced(X.shape, ax)
    k1 = reduce_axis(X.shape[ax], "k")
    xmax = compute(red, lambda *i: E.max(X[_with(i, ax, k1, nd)], axis=k1), name=f"{name}_max",
                   tag="softmax_max")
    ex = compute(X.shape, lambda *i: E.exp(X[i] - xmax[_without(i, ax, nd)]), name=f"{name}_exp",
                 tag="softmax_exp")
    k2 = reduce_axis(X.shape[ax], "k")
    total = compute(red, lambda *i: E.sum(ex[_with(i, ax, k2, nd)], axis=k2), name=f"{name}_sum",
                    tag="softmax_sum")
    return compute(X.shape, lambda *i: ex[i] / total[_without(i, ax, nd)], name=name,
                   tag="softmax_norm")


def layer_norm(X: Tensor, gamma: Tensor | None, beta: Tensor | None, axis: int = -1,
               eps: float = 1e-5, name: str = "layer_norm") -> Tensor:
    """(x - mean) * rsqrt(var + eps) * gamma + beta over `axis`, with the biased variance (the
    mean of squared deviations). gamma and beta have the extent of `axis`; either may be None."""
    _check_tensor("layer_norm", "data", X)
    _check_float("layer_norm", X)
    ax = _norm_axis("layer_norm", X, axis)
    for role, t in (("gamma", gamma), ("beta", beta)):
        if t is not None:
            _check_tensor("layer_norm", role, t, 1)
            _check_same_dtype("layer_norm", X, t)
            if t.shape[0] != X.shape[ax]:
                raise ValueError(f"layer_norm: {role} {t.name!r} dimension 0 has extent "
                                 f"{t.shape[0]}, but {X.name!r} dimension {ax} has {X.shape[ax]}")
    nd = X.ndim
    n = X.shape[ax]
    red = _reduced(X.shape, ax)
    inv_n = 1.0 / n
    k1 = reduce_axis(n, "k")
    mean = compute(red, lambda *i: E.sum(X[_with(i, ax, k1, nd)] * inv_n, axis=k1),
                   name=f"{name}_mean", tag="layer_norm_mean")
    k2 = reduce_axis(n, "k")

    def sq_dev(*i):
        d = X[_with(i, ax, k2, nd)] - mean[i]
        return E.sum(d * d * inv_n, axis=k2)

    var = compute(red, sq_dev, name=f"{name}_var", tag="layer_norm_var")

    def normalize(*i):
        r = _without(i, ax, nd)
        y = (X[i] - mean[r]) * E.rsqrt(var[r] + eps)
        if gamma is not None:
            y = y * gamma[i[ax]]
        if beta is not None:
            y = y + beta[i[ax]]
        return y

    return compute(X.shape, normalize, name=name, tag="layer_norm")


def norm2(X: Tensor, name: str = "norm2") -> Tensor:
    """The 2-norm of the whole tensor, shape (1,): one sum of squares over every axis, then sqrt."""
    _check_tensor("norm2", "data", X)
    _check_float("norm2", X)
    axes = [reduce_axis(n, f"k{d}") for d, n in enumerate(X.shape)]

    def sum_sq(i):
        x = X[tuple(axes)]
        return E.sum(x * x, axis=axes)

    sq = compute((1,), sum_sq, name=f"{name}_sum_sq", tag="norm2_sum")
    return compute((1,), lambda i: E.sqrt(sq[i]), name=name, tag="elemwise")
