"""ONNX operators whose operands come in forms the canonical operators do not take as they are:
MatMul of 1-d operands (numpy's rule: a 1-d operand is a row or a column, its axis dropped
from the result), Pow of a base and an exponent of different element types (ONNX: the result
has the base's type), and LRN (a sum over a window of channels, from slices of the padded
squares)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ansor.graph.onnx_importer import _HANDLERS, _OnnxImporter, _attr, _handles

_BINARY = _HANDLERS["Pow"]


@_handles("MatMul")
def _matmul(imp: _OnnxImporter, node: Any) -> None:
    a, b = node.input
    sa, sb = imp.shape(a), imp.shape(b)
    if len(sa) >= 2 and len(sb) >= 2:
        imp.emit(node, "matmul", [imp.value(a), imp.value(b)])
        return
    if not sa or not sb:
        imp._unsupported(node, "scalar operand of")
    out_shape = np.matmul(np.empty(sa, np.float32), np.empty(sb, np.float32)).shape
    x, y = imp.value(a), imp.value(b)
    if len(sa) == 1:
        x = imp.graph.add_node("reshape", [x], {"shape": (1, sa[0])})
    if len(sb) == 1:
        y = imp.graph.add_node("reshape", [y], {"shape": (sb[0], 1)})
    product = imp.graph.add_node("matmul", [x, y], source=f"ONNX MatMul {node.name!r}")
    imp.emit(node, "reshape", [product], shape=tuple(out_shape))


@_handles("Pow", attrs=("broadcast", "axis"))
def _pow(imp: _OnnxImporter, node: Any) -> None:
    """A float base with an integer exponent: the exponent as the base's float type (exact
    for the exponents a float can raise to without overflow); an integer base with a float
    exponent: computed in float64 and truncated to the base's type (ONNX's reference)."""
    base, exponent = node.input
    tb, te = imp.dtype(base), imp.dtype(exponent)
    if tb == te or exponent in imp.known and base not in imp.known:
        _BINARY(imp, node)
        return
    floats = ("float32", "float64")
    if tb in floats and te in ("int32", "int64"):
        e = imp.graph.add_node("cast", [imp.value(exponent)], {"dtype": tb})
        imp.emit(node, "pow", [imp.value(base), e])
    elif tb in ("int32", "int64") and te in floats:
        wide = [imp.graph.add_node("cast", [imp.value(n)], {"dtype": "float64"}) for n in (base, exponent)]
        imp.emit(node, "cast", [imp.graph.add_node("pow", wide)], dtype=tb)
    else:
        imp._unsupported(node, f"{tb} base with a {te} exponent of")


@_handles("LRN", attrs=("alpha", "beta", "bias", "size"))
def _lrn(imp: _OnnxImporter, node: Any) -> None:
    """y = x / (bias + alpha / size * sum of x^2 over channels c - (size-1)//2 .. c + ceil((size-1)/2))^beta."""
    shape, dtype = imp.shape(node.input[0]), imp.dtype(node.input[0])
    if dtype not in ("float32", "float64") or len(shape) < 3:
        imp._unsupported(node, f"{dtype} input of rank {len(shape)} of")
    size = int(_attr(node, "size", 0))
    if size < 1:
        imp._unsupported(node, f"size {size} of")
    alpha, beta, bias = (float(_attr(node, k, d)) for k, d in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    x = imp.value(node.input[0])
    g = imp.graph
    square = g.add_node("mul", [x, x])
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    pads = tuple((before, after) if axis == 1 else (0, 0) for axis in range(len(shape)))
    padded = g.add_node("pad", [square], {"pads": pads, "value": 0.0})
    total = None
    for k in range(size):
        window = g.add_node("slice", [padded], {"axis": 1, "start": k, "end": k + shape[1], "step": 1})
        total = window if total is None else g.add_node("add", [total, window])
    scaled = g.add_node("add", [g.add_node("mul", [total, imp.scalar(alpha / size, dtype)]), imp.scalar(bias, dtype)])
    imp.emit(node, "div", [x, g.add_node("pow", [scaled, imp.scalar(beta, dtype)])])
