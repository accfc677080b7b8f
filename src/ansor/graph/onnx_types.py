"""ONNX's type operators as graph nodes: QuantizeLinear, DequantizeLinear (per tensor, per axis,
blocked) and DynamicQuantizeLinear, written with the canonical operators (cast, sub, mul,
div, round, clamp, take) so that every piece runs compiled and is checked like any other.

Each follows the arithmetic of ONNX's reference implementation step for step: quantizing
divides in the input's type, rounds half to even, adds the zero point in int32 and saturates
to the output type; dequantizing subtracts the zero point and multiplies by the scale in
float32, then converts to the scale's type. Output types beyond te's (float8, int4, float4)
are refused by name. (Cast itself lives with the elementwise converters; CastLike is expanded
into a Cast by its ONNX function body.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ansor.graph.onnx_importer import _attr, _handles, _OnnxImporter

#: quantized types te computes in, with their ranges (ONNX's saturation bounds)
_QUANT_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}


def _onnx_dtype(code: int) -> str:
    from onnx import helper

    return str(np.dtype(helper.tensor_dtype_to_np_dtype(code)))


def _per_axis(imp: _OnnxImporter, node: Any, name: str, like: str, axis: int, block: int) -> str:
    """`name` (a scale or zero point) as an operand broadcasting against `like`: a scalar as
    it is, a 1-d one along `axis`, a blocked one repeated `block` times along `axis`."""
    value = imp.value(name)
    shape, rank = imp.shape(name), len(imp.shape(like))
    target = imp.shape(like)
    if len(shape) == 0 or (len(shape) == 1 and shape[0] == 1 and block == 0):
        return value
    if axis < 0:
        imp._unsupported(node, f"axis {_attr(node, 'axis', 1)} (outside the input's dimensions) of")
    if block == 0:
        if len(shape) != 1 or shape[0] != target[axis]:
            imp._unsupported(node, f"a {name!r} of shape {list(shape)} for axis {axis} of")
        return imp.graph.add_node("reshape", [value], {"shape": tuple(shape[0] if d == axis else 1
                                                                      for d in range(rank))})
    if len(shape) != rank or shape[axis] != -(-target[axis] // block) or \
            any(shape[d] != target[d] for d in range(rank) if d != axis):
        imp._unsupported(node, f"a {name!r} of shape {list(shape)} for blocks of {block} along axis {axis} of")
    rows = imp.graph.add_constant(np.arange(target[axis], dtype=np.int64) // block)
    return imp.graph.add_node("take", [value, rows], {"axis": axis})


def _axis_and_block(imp: _OnnxImporter, node: Any) -> tuple[int, int]:
    """The axis (-1 where it is outside the input's dimensions: fine for a per-tensor scale,
    whose axis ONNX ignores) and the block size (0: none)."""
    rank = len(imp.shape(node.input[0]))
    axis = int(_attr(node, "axis", 1))
    block = int(_attr(node, "block_size", 0))
    if block < 0:
        imp._unsupported(node, f"block_size {block} of")
    return (axis % rank if -rank <= axis < rank else -1), block


def _cast(imp: _OnnxImporter, value: str, dtype: str) -> str:
    if imp.graph.type_of(value).dtype == dtype:
        return value
    return imp.graph.add_node("cast", [value], {"dtype": dtype})


@_handles("QuantizeLinear", attrs=("axis", "saturate", "block_size", "output_dtype", "precision"))
def _quantize(imp: _OnnxImporter, node: Any) -> None:
    x = node.input[0]
    zero = node.input[2] if len(node.input) > 2 and node.input[2] else None
    out = imp.dtype(zero) if zero else (_onnx_dtype(_attr(node, "output_dtype", 0))
                                        if _attr(node, "output_dtype", 0) else "uint8")
    if out not in _QUANT_RANGES:
        imp._unsupported(node, f"output element type {out} of")
    if _attr(node, "precision", 0):
        imp._unsupported(node, "attribute 'precision' of")
    axis, block = _axis_and_block(imp, node)
    xv = imp.value(x)
    scale = _cast(imp, _per_axis(imp, node, node.input[1], x, axis, block), imp.dtype(x))
    q = imp.graph.add_node("round", [imp.graph.add_node("div", [xv, scale])])  # half to even
    q = _cast(imp, q, "int32")
    if zero:
        q = imp.graph.add_node("add", [q, _cast(imp, _per_axis(imp, node, zero, x, axis, block), "int32")])
    lo, hi = _QUANT_RANGES[out]
    q = imp.graph.add_node("clamp", [q], {"min": lo, "max": hi})
    imp.values[node.output[0]] = imp.graph.add_node("cast", [q], {"dtype": out},
                                                    source=f"ONNX {node.op_type} {node.name!r}")


@_handles("DequantizeLinear", attrs=("axis", "block_size", "output_dtype"))
def _dequantize(imp: _OnnxImporter, node: Any) -> None:
    x = node.input[0]
    zero = node.input[2] if len(node.input) > 2 and node.input[2] else None
    x_dtype = imp.dtype(x)
    if x_dtype not in (*_QUANT_RANGES, "int32"):
        imp._unsupported(node, f"input element type {x_dtype} of")
    if zero and imp.dtype(zero) != x_dtype:
        imp._unsupported(node, f"zero point of type {imp.dtype(zero)} for {x_dtype} input of")
    out = _onnx_dtype(_attr(node, "output_dtype", 0)) if _attr(node, "output_dtype", 0) \
        else imp.dtype(node.input[1])
    axis, block = _axis_and_block(imp, node)
    dx = _cast(imp, imp.value(x), "float32")
    if zero:
        dx = imp.graph.add_node("sub", [dx, _cast(imp, _per_axis(imp, node, zero, x, axis, block), "float32")])
    scale = _cast(imp, _per_axis(imp, node, node.input[1], x, axis, block), "float32")
    y = imp.graph.add_node("mul", [dx, scale])
    imp.values[node.output[0]] = _cast(imp, y, out)


@_handles("DynamicQuantizeLinear")
def _dynamic_quantize(imp: _OnnxImporter, node: Any) -> None:
    """uint8 with a scale and zero point from the input's range (which always includes 0)."""
    x = node.input[0]
    if imp.dtype(x) != "float32":
        imp._unsupported(node, f"input element type {imp.dtype(x)} of")
    rank = len(imp.shape(x))
    xv, axes = imp.value(x), tuple(range(rank))
    zero = imp.scalar(0.0, "float32")
    high = imp.graph.add_node("maximum", [imp.graph.add_node("max", [xv], {"axes": axes, "keepdims": True}), zero])
    low = imp.graph.add_node("minimum", [imp.graph.add_node("min", [xv], {"axes": axes, "keepdims": True}), zero])
    span = imp.graph.add_node("sub", [high, low])
    # an all-zero input: ONNX divides a span of 1 instead of 0
    span = imp.graph.add_node("where", [imp.graph.add_node("eq", [span, zero]), imp.scalar(1.0, "float32"), span])
    scale = imp.graph.add_node("div", [span, imp.scalar(255.0, "float32")])
    zp = imp.graph.add_node("sub", [zero, imp.graph.add_node("div", [low, scale])])
    zp = imp.graph.add_node("round", [imp.graph.add_node("clamp", [zp], {"min": 0.0, "max": 255.0})])
    q = imp.graph.add_node("add", [imp.graph.add_node("round", [imp.graph.add_node("div", [xv, scale])]), zp])
    q = imp.graph.add_node("clamp", [q], {"min": 0.0, "max": 255.0})
    scalar = {"shape": ()}
    imp.values[node.output[0]] = imp.graph.add_node("cast", [q], {"dtype": "uint8"})
    if len(node.output) > 1 and node.output[1]:
        imp.values[node.output[1]] = imp.graph.add_node("reshape", [scale], scalar)
    if len(node.output) > 2 and node.output[2]:
        imp.values[node.output[2]] = imp.graph.add_node(
            "reshape", [imp.graph.add_node("cast", [zp], {"dtype": "uint8"})], scalar)
