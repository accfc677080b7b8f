"""Rare ONNX operators, each mapped on its own: Det (a numpy kernel) and ReverseSequence (a
gather with positions known at import)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ansor.graph import numpy_operators  # noqa: F401 (registers the operators used here)
from ansor.graph.onnx_importer import _OnnxImporter, _attr, _handles


@_handles("Det")
def _det(imp: _OnnxImporter, node: Any) -> None:
    dtype = imp.dtype(node.input[0])
    if dtype not in ("float32", "float64"):
        imp._unsupported(node, f"{dtype} input of")
    imp.emit(node, "det", [imp.value(node.input[0])])


@_handles("ReverseSequence", attrs=("batch_axis", "time_axis"))
def _reverse_sequence(imp: _OnnxImporter, node: Any) -> None:
    """The first lengths[b] steps of each batch entry reversed, the rest kept: one
    gather_elements along the time axis with positions computed from the lengths (known at
    import)."""
    shape = imp.shape(node.input[0])
    batch_axis, time_axis = int(_attr(node, "batch_axis", 1)), int(_attr(node, "time_axis", 0))
    if len(shape) < 2 or {batch_axis, time_axis} != {0, 1}:
        imp._unsupported(node, f"batch_axis {batch_axis} / time_axis {time_axis} of")
    lengths = np.asarray(imp.const(node.input[1], "sequence_lens", node)).reshape(-1).astype(np.int64)
    steps, batch = shape[time_axis], shape[batch_axis]
    if lengths.size != batch or lengths.min() < 0 or lengths.max() > steps:
        imp._unsupported(node, f"sequence_lens {lengths.tolist()} for {batch} sequences of {steps} of")
    t = np.arange(steps).reshape(-1, 1)
    positions = np.where(t < lengths.reshape(1, -1), lengths.reshape(1, -1) - 1 - t, t)   # [T, B]
    if time_axis == 1:
        positions = positions.T
    index = np.broadcast_to(positions.reshape(positions.shape + (1,) * (len(shape) - 2)), shape)
    imp.emit(node, "gather_elements", [imp.value(node.input[0]), imp.graph.add_constant(np.ascontiguousarray(index))],
             axis=time_axis)
