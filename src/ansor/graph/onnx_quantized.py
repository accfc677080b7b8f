"""ONNX's quantized operators as integer graphs: QLinearConv, QLinearMatMul, ConvInteger,
MatMulInteger, and onnxruntime's QGemm and QLinearAdd (domain com.microsoft, as
`onnxruntime.quantization` writes them).

Each layer becomes an integer anchor (`conv2d_integer` / `matmul_integer`: stored 8-bit
operands, int32 sums) followed by elementwise ops that fuse into the same task: a per-channel
int32 term (the bias minus the input zero point times the weight's sums), then the requantization
onnxruntime's MLAS performs: the int32 value converted to float32, multiplied by the float32
scale (x_scale * w_scale / y_scale, computed in float32 in that order), rounded half to even,
the output zero point added, saturated to the output type. So a layer is 8-bit in, 8-bit out.

Scales, zero points, weights and biases must be constants of the model (onnxruntime's tools
write them so); anything else is refused by name, as is a per-row input zero point.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ansor.graph import quantized_ops  # noqa: F401  (registers the integer operators)
from ansor.graph.onnx_importer import _attr, _handles, _OnnxImporter, _text

#: saturation bounds of the 8-bit output types
_RANGES = {"uint8": (0, 255), "int8": (-128, 127)}

#: the operators of onnxruntime's domain that this module imports
MICROSOFT_OPERATORS = frozenset({"QGemm", "QLinearAdd"})


def _constant(imp: _OnnxImporter, node: Any, position: int, role: str) -> np.ndarray | None:
    """Input `position` of `node` as a numpy array (None where the optional input is absent);
    a value computed at run time is refused by name."""
    if position >= len(node.input) or not node.input[position]:
        return None
    name = node.input[position]
    if name not in imp.known:
        imp._unsupported(node, f"non-constant {role} {name!r} of")
    return np.asarray(imp.known[name])


def _scalar_zero(imp: _OnnxImporter, node: Any, position: int, role: str) -> int:
    """A per-tensor zero point (0 where absent)."""
    zero = _constant(imp, node, position, role)
    if zero is None:
        return 0
    if zero.size != 1:
        imp._unsupported(node, f"{role} of shape {list(zero.shape)} (only per-tensor) of")
    return int(zero.reshape(()))


def _activation(imp: _OnnxImporter, node: Any, position: int) -> str:
    dtype = imp.dtype(node.input[position])
    if dtype not in _RANGES:
        imp._unsupported(node, f"input element type {dtype} of")
    return imp.value(node.input[position])


def _as_unsigned(imp: _OnnxImporter, x: str, x_zero: int, w: np.ndarray) -> tuple[str, int]:
    """An int8 activation read by an int8 weight as the uint8 value x + 128 with zero point
    x_zero + 128: conv(x - zx, w) = conv((x + 128) - (zx + 128), w), so the int32 sums are
    the same, the correction -128 * sum(w) lands in the per-channel term (the requantization's
    bias) with the zero point, and the product is the u8 x s8 one that VNNI's vpdpbusd
    computes. Other operand types are returned as they are (the widening loop)."""
    if imp.graph.type_of(x).dtype != "int8" or str(w.dtype) != "int8":
        return x, x_zero
    shifted = imp.__dict__.setdefault("_unsigned_views", {})  # one per activation, however many readers
    if x not in shifted:
        graph = imp.graph
        wide = graph.add_node("add", [graph.add_node("cast", [x], {"dtype": "int16"}), imp.scalar(128, "int16")])
        shifted[x] = graph.add_node("cast", [wide], {"dtype": "uint8"})
    return shifted[x], x_zero + 128


def _centered_weight(imp: _OnnxImporter, node: Any, w: np.ndarray, zero: np.ndarray | None,
                     axis: int) -> np.ndarray:
    """The weight minus its zero point (per tensor, or per output channel along `axis`): the
    stored int8/uint8 array itself where the zero point is 0, else widened to int16."""
    if str(w.dtype) not in _RANGES:
        imp._unsupported(node, f"weight element type {w.dtype} of")
    if zero is None or not zero.any():
        return w
    if zero.size != 1 and zero.shape != (w.shape[axis],):
        imp._unsupported(node, f"weight zero point of shape {list(zero.shape)} of")
    shape = [1] * w.ndim
    if zero.size != 1:
        shape[axis] = -1
    return (w.astype(np.int16) - zero.astype(np.int16).reshape(shape)).astype(np.int16)


def _channels(values: np.ndarray | None, count: int) -> np.ndarray | None:
    return None if values is None else np.broadcast_to(values.reshape(-1), (count,))


def _requantize(imp: _OnnxImporter, node: Any, acc: str, offset: np.ndarray, multiplier: np.ndarray,
                channel_axis: int, y_zero: int, out_dtype: str) -> str:
    """int32 `acc` plus the per-channel int32 `offset`, times the per-channel float32
    `multiplier`, rounded half to even, plus `y_zero`, saturated and stored as `out_dtype`."""
    graph = imp.graph
    rank = len(graph.type_of(acc).shape)
    shape = tuple(-1 if d == channel_axis % rank else 1 for d in range(rank))
    if offset.any():
        acc = graph.add_node("add", [acc, graph.add_constant(offset.astype(np.int32).reshape(shape))])
    value = graph.add_node("cast", [acc], {"dtype": "float32"})
    scale = multiplier.astype(np.float32)
    scale_name = imp.scalar(float(scale[0]), "float32") if np.all(scale == scale[0]) \
        else graph.add_constant(scale.reshape(shape))
    value = graph.add_node("round", [graph.add_node("mul", [value, scale_name])])  # half to even
    if y_zero:
        value = graph.add_node("add", [value, imp.scalar(float(y_zero), "float32")])
    lo, hi = _RANGES[out_dtype]
    value = graph.add_node("clamp", [value], {"min": float(lo), "max": float(hi)})
    return graph.add_node("cast", [value], {"dtype": out_dtype}, source=f"ONNX {node.op_type} {node.name!r}")


def _multiplier(x_scale: np.ndarray, w_scale: np.ndarray, y_scale: np.ndarray, count: int) -> np.ndarray:
    """x_scale * w_scale / y_scale per output channel, in float32 as onnxruntime computes it."""
    xs, ys = np.float32(x_scale.reshape(())), np.float32(y_scale.reshape(()))
    return (xs * _channels(w_scale.astype(np.float32), count)) / ys


def _per_tensor(imp: _OnnxImporter, node: Any, array: np.ndarray | None, role: str) -> np.ndarray:
    if array is None:
        imp._unsupported(node, f"missing {role} of")
    if array.size != 1:
        imp._unsupported(node, f"{role} of shape {list(array.shape)} (only per-tensor) of")
    return array


# ----------------------------------------------------------------------------- convolutions


def _conv_accumulator(imp: _OnnxImporter, node: Any, x: str, w: np.ndarray, x_zero: int) -> tuple[str, np.ndarray]:
    """conv2d_integer of `x` (padded with its zero point) and the centered weight `w`, and the
    per-channel term -x_zero * sum(w) that makes it conv(x - x_zero, w)."""
    if _text(_attr(node, "auto_pad", "NOTSET")) != "NOTSET":
        imp._unsupported(node, "auto_pad of")
    if w.ndim != 4:
        imp._unsupported(node, f"{w.ndim - 2}-d kernel (2-d only) of")
    kernel = _attr(node, "kernel_shape", None)
    if kernel is not None and tuple(kernel) != tuple(w.shape[2:]):
        imp._unsupported(node, f"kernel_shape {list(kernel)} unlike the weight's {list(w.shape[2:])} of")
    x, x_zero = _as_unsigned(imp, x, x_zero, w)
    pads = list(_attr(node, "pads", [0, 0, 0, 0]))
    attrs = {"stride": tuple(_attr(node, "strides", [1, 1])), "dilation": tuple(_attr(node, "dilations", [1, 1])),
             "padding": (pads[0], pads[1], pads[2], pads[3]), "groups": int(_attr(node, "group", 1)),
             "pad_value": int(x_zero)}
    acc = imp.graph.add_node("conv2d_integer", [x, imp.graph.add_constant(w)], attrs,
                             source=f"ONNX {node.op_type} {node.name!r}")
    offset = -int(x_zero) * w.astype(np.int64).sum(axis=(1, 2, 3))
    return acc, offset


_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


@_handles("QLinearConv", attrs=_CONV_ATTRS)
def _qlinear_conv(imp: _OnnxImporter, node: Any) -> None:
    x = _activation(imp, node, 0)
    x_scale = _per_tensor(imp, node, _constant(imp, node, 1, "x_scale"), "x_scale")
    x_zero = _scalar_zero(imp, node, 2, "x_zero_point")
    w = _constant(imp, node, 3, "weight")
    w_scale = _constant(imp, node, 4, "w_scale")
    w_zero = _constant(imp, node, 5, "w_zero_point")
    y_scale = _per_tensor(imp, node, _constant(imp, node, 6, "y_scale"), "y_scale")
    y_zero_array = _constant(imp, node, 7, "y_zero_point")
    y_zero = _scalar_zero(imp, node, 7, "y_zero_point")
    bias = _constant(imp, node, 8, "bias")
    out_dtype = str(y_zero_array.dtype) if y_zero_array is not None else "uint8"
    channels = w.shape[0]
    acc, offset = _conv_accumulator(imp, node, x, _centered_weight(imp, node, w, w_zero, 0), x_zero)
    if bias is not None:
        offset = offset + bias.astype(np.int64)
    imp.values[node.output[0]] = _requantize(imp, node, acc, offset, _multiplier(x_scale, w_scale, y_scale, channels),
                                             1, y_zero, out_dtype)


@_handles("ConvInteger", attrs=_CONV_ATTRS)
def _conv_integer(imp: _OnnxImporter, node: Any) -> None:
    x = _activation(imp, node, 0)
    w = _constant(imp, node, 1, "weight")
    x_zero = _scalar_zero(imp, node, 2, "x_zero_point")
    acc, offset = _conv_accumulator(imp, node, x, _centered_weight(imp, node, w, _constant(imp, node, 3, "w_zero_point"), 0),
                                    x_zero)
    if offset.any():
        acc = imp.graph.add_node("add", [acc, imp.graph.add_constant(offset.astype(np.int32).reshape(-1, 1, 1))])
    imp.values[node.output[0]] = acc


# ----------------------------------------------------------------------------- matrix products


def _matmul_accumulator(imp: _OnnxImporter, node: Any, x: str, w: np.ndarray, x_zero: int) -> tuple[str, np.ndarray]:
    """matmul_integer of `x` and the constant centered weight [K, N], and -x_zero * sum_k w."""
    if w.ndim != 2:
        imp._unsupported(node, f"weight of rank {w.ndim} (2-d only) of")
    x, x_zero = _as_unsigned(imp, x, x_zero, w)
    acc = imp.graph.add_node("matmul_integer", [x, imp.graph.add_constant(np.ascontiguousarray(w))],
                             source=f"ONNX {node.op_type} {node.name!r}")
    return acc, -int(x_zero) * w.astype(np.int64).sum(axis=0)


@_handles("QLinearMatMul")
def _qlinear_matmul(imp: _OnnxImporter, node: Any) -> None:
    x = _activation(imp, node, 0)
    x_scale = _per_tensor(imp, node, _constant(imp, node, 1, "a_scale"), "a_scale")
    x_zero = _scalar_zero(imp, node, 2, "a_zero_point")
    w = _constant(imp, node, 3, "b")
    y_zero_array = _constant(imp, node, 7, "y_zero_point")
    acc, offset = _matmul_accumulator(imp, node, x, _centered_weight(imp, node, w, _constant(imp, node, 5, "b_zero_point"), 1),
                                      x_zero)
    multiplier = _multiplier(x_scale, _constant(imp, node, 4, "b_scale"),
                             _per_tensor(imp, node, _constant(imp, node, 6, "y_scale"), "y_scale"), w.shape[1])
    imp.values[node.output[0]] = _requantize(imp, node, acc, offset, multiplier, -1,
                                             _scalar_zero(imp, node, 7, "y_zero_point"),
                                             str(y_zero_array.dtype) if y_zero_array is not None else "uint8")


@_handles("MatMulInteger")
def _matmul_integer(imp: _OnnxImporter, node: Any) -> None:
    x = _activation(imp, node, 0)
    w = _constant(imp, node, 1, "B")
    acc, offset = _matmul_accumulator(imp, node, x, _centered_weight(imp, node, w, _constant(imp, node, 3, "b_zero_point"), 1),
                                      _scalar_zero(imp, node, 2, "a_zero_point"))
    if offset.any():
        acc = imp.graph.add_node("add", [acc, imp.graph.add_constant(offset.astype(np.int32))])
    imp.values[node.output[0]] = acc


@_handles("QGemm", attrs=("alpha", "transA", "transB"))
def _qgemm(imp: _OnnxImporter, node: Any) -> None:
    """onnxruntime's Gemm of quantized operands: (A - za)(B - zb) * alpha + C (int32, in the
    scale of a_scale * b_scale), requantized to y_scale; a float output (no y_scale) is refused."""
    if _attr(node, "transA", 0):
        imp._unsupported(node, "transA=1 of")
    if float(_attr(node, "alpha", 1.0)) != 1.0:
        imp._unsupported(node, f"alpha {_attr(node, 'alpha', 1.0)} of")
    if len(imp.shape(node.input[0])) != 2:
        imp._unsupported(node, f"input of rank {len(imp.shape(node.input[0]))} of")
    x = _activation(imp, node, 0)
    x_scale = _per_tensor(imp, node, _constant(imp, node, 1, "a_scale"), "a_scale")
    x_zero = _scalar_zero(imp, node, 2, "a_zero_point")
    w = _constant(imp, node, 3, "B")
    b_zero = _constant(imp, node, 5, "b_zero_point")
    if _attr(node, "transB", 0):  # [N, K] with per-row scales: stored as W[k, j]
        w = np.ascontiguousarray(w.T)
    y_scale = _constant(imp, node, 7, "y_scale")
    if y_scale is None:
        imp._unsupported(node, "float output (no y_scale) of")
    y_zero_array = _constant(imp, node, 8, "y_zero_point")
    acc, offset = _matmul_accumulator(imp, node, x, _centered_weight(imp, node, w, b_zero, 1), x_zero)
    bias = _constant(imp, node, 6, "C")
    if bias is not None:
        if bias.dtype != np.int32 or bias.size not in (1, w.shape[1]):
            imp._unsupported(node, f"C of type {bias.dtype} and shape {list(bias.shape)} of")
        offset = offset + np.broadcast_to(bias.reshape(-1), (w.shape[1],)).astype(np.int64)
    multiplier = _multiplier(x_scale, _constant(imp, node, 4, "b_scale"), _per_tensor(imp, node, y_scale, "y_scale"),
                             w.shape[1])
    imp.values[node.output[0]] = _requantize(imp, node, acc, offset, multiplier, -1,
                                             _scalar_zero(imp, node, 8, "y_zero_point"),
                                             str(y_zero_array.dtype) if y_zero_array is not None else "uint8")


# ----------------------------------------------------------------------------- elementwise


@_handles("QLinearAdd")
def _qlinear_add(imp: _OnnxImporter, node: Any) -> None:
    """onnxruntime's MLAS form: a * (sa / sy) + b * (sb / sy) + (zy - za sa / sy - zb sb / sy)
    in float32, rounded half to even and saturated."""
    graph = imp.graph
    a, b = _activation(imp, node, 0), _activation(imp, node, 3)
    sa, sb, sy = (np.float32(_per_tensor(imp, node, _constant(imp, node, i, r), r).reshape(()))
                  for i, r in ((1, "A_scale"), (4, "B_scale"), (6, "C_scale")))
    za, zb = _scalar_zero(imp, node, 2, "A_zero_point"), _scalar_zero(imp, node, 5, "B_zero_point")
    zy_array = _constant(imp, node, 7, "C_zero_point")
    zy = _scalar_zero(imp, node, 7, "C_zero_point")
    out_dtype = str(zy_array.dtype) if zy_array is not None else imp.dtype(node.input[0])
    ra, rb = np.float32(sa / sy), np.float32(sb / sy)
    offset = np.float32(np.float32(zy) - ra * np.float32(za) - rb * np.float32(zb))
    fa = graph.add_node("mul", [graph.add_node("cast", [a], {"dtype": "float32"}), imp.scalar(float(ra), "float32")])
    fb = graph.add_node("mul", [graph.add_node("cast", [b], {"dtype": "float32"}), imp.scalar(float(rb), "float32")])
    value = graph.add_node("add", [graph.add_node("add", [fa, fb]), imp.scalar(float(offset), "float32")])
    lo, hi = _RANGES[out_dtype]
    value = graph.add_node("clamp", [graph.add_node("round", [value])], {"min": float(lo), "max": float(hi)})
    imp.values[node.output[0]] = graph.add_node("cast", [value], {"dtype": out_dtype},
                                                source=f"ONNX {node.op_type} {node.name!r}")
