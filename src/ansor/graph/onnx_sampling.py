"""ONNX GridSample: the canonical `grid_sample` where ONNX and PyTorch agree (2-d, linear or
nearest, zeros padding), else `grid_sample_nd` (numpy, ONNX's definition for any rank, cubic
interpolation and border / reflection padding)."""

from __future__ import annotations

from typing import Any

from ansor.graph import numpy_operators  # noqa: F401 (registers the operators used here)
from ansor.graph.onnx_importer import _OnnxImporter, _attr, _handles, _text

_MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic", "nearest": "nearest"}


@_handles("GridSample", attrs=("mode", "padding_mode", "align_corners"))
def _grid_sample(imp: _OnnxImporter, node: Any) -> None:
    given = _text(_attr(node, "mode", "bilinear" if imp.opset < 20 else "linear"))
    if given not in (("bilinear", "bicubic", "nearest") if imp.opset < 20 else ("linear", "cubic", "nearest")):
        imp._unsupported(node, f"mode {given!r} at opset {imp.opset} of")
    mode = _MODES[given]
    padding = _text(_attr(node, "padding_mode", "zeros"))
    if padding not in ("zeros", "border", "reflection"):
        imp._unsupported(node, f"padding_mode {padding!r} of")
    dtype = imp.dtype(node.input[0])
    if dtype not in ("float32", "float64") or imp.dtype(node.input[1]) != dtype:
        imp._unsupported(node, f"{dtype} input with a {imp.dtype(node.input[1])} grid of")
    align = bool(_attr(node, "align_corners", 0))
    x, grid = imp.value(node.input[0]), imp.value(node.input[1])
    if len(imp.shape(node.input[0])) == 4 and mode in ("linear", "nearest") and padding == "zeros":
        imp.emit(node, "grid_sample", [x, grid], mode="bilinear" if mode == "linear" else "nearest",
                 padding_mode=padding, align_corners=align)
        return
    imp.emit(node, "grid_sample_nd", [x, grid], mode=mode, padding_mode=padding, align_corners=align)
