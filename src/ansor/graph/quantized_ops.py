"""Integer convolution and matmul as canonical operators: 8-bit operands, int32 accumulators.

A quantized model's layer is `requantize(conv(x - zx, w - zw) + bias)`. The operators here
compute the part that needs a reduction, on the stored integers as they are, each product
widened to int32 (te's `sum(..., dtype="int32")`), so the tuner sees the u8 x s8 -> s32 form the
dot-product instructions match (`search/sketch_dot_product.py`). What remains of a layer is
elementwise (adding a per-channel int32 term, the float32 scale multiply, rounding, the zero
point, saturation) and fuses into the same task as the anchor's epilogue.

The input's zero point is not subtracted inside the reduction: `conv2d_integer` pads with
`pad_value` (the input's zero point, ONNX's padding of a quantized tensor), so that
conv(x - zx, w) = conv2d_integer(x, w) - zx * sum(w) at every output position, and that last
term is a per-channel constant the importer folds into the bias.

`conv2d_integer` has an NCHW form (as imported) and an NHWC one (`layout="NHWC"`, HWIO
weight, made by the layout pass): there the input channels are the innermost reduction axis,
contiguous in both operands, which is the depth of an int8 dot-product instruction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ansor import te
from ansor.graph.ir import Node
from ansor.graph.ops import TensorType, _check, _register, conv_padding4
from ansor.graph.reference import _kernel, _windows
from ansor.graph.to_te import Value, _lowers, _tensor
from ansor.te import expr as E

#: element types of the operands: activations (uint8 or int8), weights (int8, uint8, or int16
#: where a weight zero point was subtracted at import)
ACTIVATION_DTYPES = ("uint8", "int8")
WEIGHT_DTYPES = ("int8", "uint8", "int16")


def _check_operands(op: str, x: TensorType, w: TensorType) -> None:
    _check(x.dtype in ACTIVATION_DTYPES, f"{op}: input of type {x.dtype} (one of {ACTIVATION_DTYPES})")
    _check(w.dtype in WEIGHT_DTYPES, f"{op}: weight of type {w.dtype} (one of {WEIGHT_DTYPES})")


@_register("conv2d_integer", 2, {"stride": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1),
                                 "groups": 1, "pad_value": 0, "layout": "NCHW"})
def _conv2d_integer_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    """NCHW input with an OIHW weight, or NHWC input with an HWIO weight (I = C / groups); the
    int32 sums over input channels and taps, in the input's layout."""
    x, w = types
    _check_operands("conv2d_integer", x, w)
    _check(len(x.shape) == 4 and len(w.shape) == 4, "conv2d_integer: needs 4-d input and weight")
    layout = attrs["layout"]
    _check(layout in ("NCHW", "NHWC"), f"conv2d_integer: layout {layout!r} (NCHW or NHWC)")
    n, c, h, wd = x.shape if layout == "NCHW" else (x.shape[0], x.shape[3], x.shape[1], x.shape[2])
    o, ci, kh, kw = w.shape if layout == "NCHW" else (w.shape[3], w.shape[2], w.shape[0], w.shape[1])
    g = attrs["groups"]
    _check(c == ci * g and o % g == 0, f"conv2d_integer: {c} channels, weight {w.shape}, groups {g}")
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    pt, pl, pb, pr = conv_padding4(attrs["padding"])
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    _check(oh > 0 and ow > 0, f"conv2d_integer: empty output for input {x.shape}")
    return TensorType((n, o, oh, ow) if layout == "NCHW" else (n, oh, ow, o), "int32")


@_register("matmul_integer", 2)
def _matmul_integer_type(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    """x [..., K] times a 2-d weight [K, N] (read W[k, j], the layout VNNI packing takes)."""
    x, w = types
    _check_operands("matmul_integer", x, w)
    _check(len(x.shape) >= 1 and len(w.shape) == 2 and x.shape[-1] == w.shape[0],
           f"matmul_integer: {x.shape} x {w.shape} (a 2-d weight [K, N])")
    return TensorType(x.shape[:-1] + (w.shape[1],), "int32")


# ----------------------------------------------------------------------------- reference kernels


@_kernel("conv2d_integer")
def _conv2d_integer(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, w = xs[0].astype(np.int64), xs[1].astype(np.int64)
    if a["layout"] == "NHWC":  # the NCHW computation on transposed views
        y = _conv2d_integer([x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)], {**a, "layout": "NCHW"})
        return np.ascontiguousarray(y.transpose(0, 2, 3, 1))
    (pt, pl, pb, pr), g = conv_padding4(a["padding"]), a["groups"]
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = a["stride"], a["dilation"]
    out_hw = ((h + pt + pb - dh * (kh - 1) - 1) // sh + 1, (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=a["pad_value"])
    win = _windows(xp, (kh, kw), a["stride"], a["dilation"], out_hw)
    win = win.reshape(n, g, cg, *win.shape[2:])
    wg = w.reshape(g, o // g, cg, kh, kw)
    y = np.einsum("ngchwij,gocij->ngohw", win, wg)
    return y.reshape(n, o, *out_hw)


@_kernel("matmul_integer")
def _matmul_integer(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.matmul(xs[0].astype(np.int64), xs[1].astype(np.int64))


# ----------------------------------------------------------------------------- te forms


def _widened(value: E.Expr) -> E.Expr:
    return E.cast(value, "int32")


@_lowers("conv2d_integer")
def _lower_conv2d_integer(args: list[Value], node: Node, out: TensorType, name: str) -> te.Tensor:
    data, weight = _tensor(args[0], node, "input"), _tensor(args[1], node, "weight")
    a = node.attrs
    if a["layout"] == "NHWC":
        return _conv2d_integer_nhwc(data, weight, a, out, name)
    pt, pl, pb, pr = conv_padding4(a["padding"])
    (sh, sw), (dh, dw), groups = a["stride"], a["dilation"], a["groups"]
    o, cpg, kh, kw = weight.shape
    opg = o // groups
    if pt or pl or pb or pr:
        data = te.ops.pad(data, (0, 0, pt, pl), (0, 0, pb, pr), a["pad_value"], name=f"{name}_pad")
    rc, ry, rx = te.reduce_axis(cpg, "rc"), te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx")

    def body(nn, ff, yy, xx):
        channel = rc if groups == 1 else (ff // opg) * cpg + rc
        return E.sum(_widened(data[nn, channel, yy * sh + ry * dh, xx * sw + rx * dw])
                     * _widened(weight[ff, rc, ry, rx]), axis=[rc, ry, rx], dtype="int32")

    return te.compute(out.shape, body, name=name, tag="conv2d_nchw")


def _conv2d_integer_nhwc(data: te.Tensor, weight: te.Tensor, a: dict[str, Any], out: TensorType,
                         name: str) -> te.Tensor:
    """out[n, y, x, f] = sum over (ry, rx, rc) of data[n, y*sh + ry*dh, x*sw + rx*dw, c] *
    weight[ry, rx, rc, f]: the input channels innermost of the reduction and contiguous in
    both operands, the form a dot-product instruction's depth takes (4 channels per step)."""
    pt, pl, pb, pr = conv_padding4(a["padding"])
    (sh, sw), (dh, dw), groups = a["stride"], a["dilation"], a["groups"]
    kh, kw, cpg, o = weight.shape
    opg = o // groups
    if pt or pl or pb or pr:
        data = te.ops.pad(data, (0, pt, pl, 0), (0, pb, pr, 0), a["pad_value"], name=f"{name}_pad")
    ry, rx, rc = te.reduce_axis(kh, "ry"), te.reduce_axis(kw, "rx"), te.reduce_axis(cpg, "rc")

    def body(nn, yy, xx, ff):
        channel = rc if groups == 1 else (ff // opg) * cpg + rc
        return E.sum(_widened(data[nn, yy * sh + ry * dh, xx * sw + rx * dw, channel])
                     * _widened(weight[ry, rx, rc, ff]), axis=[ry, rx, rc], dtype="int32")

    return te.compute(out.shape, body, name=name, tag="conv2d_nhwc")


@_lowers("matmul_integer")
def _lower_matmul_integer(args: list[Value], node: Node, out: TensorType, name: str) -> te.Tensor:
    x, w = _tensor(args[0], node, "input"), _tensor(args[1], node, "weight")
    k = te.reduce_axis(w.shape[0], "k")
    return te.compute(out.shape, lambda *i: E.sum(_widened(x[i[:-1] + (k,)]) * _widened(w[k, i[-1]]),
                                                  axis=k, dtype="int32"), name=name, tag="dense")
