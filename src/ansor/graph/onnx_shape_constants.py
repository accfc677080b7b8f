"""ONNX operators whose result depends on shapes alone: known at import, never computed.

A static graph knows every shape, so `ConstantOfShape` (of a shape computed at import) and
`EyeLike` (of a statically shaped tensor) are constants of the graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ansor.graph.onnx_importer import SUPPORTED_DTYPES, _OnnxImporter, _attr, _handles


@_handles("ConstantOfShape", attrs=("value",))
def _constant_of_shape(imp: _OnnxImporter, node: Any) -> None:
    from onnx import numpy_helper

    shape = [int(d) for d in np.asarray(imp.const(node.input[0], "shape", node)).reshape(-1)]
    value = _attr(node, "value", None)
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    if fill.size != 1 or str(fill.dtype) not in SUPPORTED_DTYPES:
        imp._unsupported(node, f"value of {fill.size} elements of type {fill.dtype} of")
    imp.known[node.output[0]] = np.full(shape, fill[0], dtype=fill.dtype)


@_handles("EyeLike", attrs=("dtype", "k"))
def _eye_like(imp: _OnnxImporter, node: Any) -> None:
    """Ones on diagonal k of a 2-d tensor's shape, in `dtype` (default: the input's)."""
    from onnx import helper

    shape = imp.shape(node.input[0])
    if len(shape) != 2:
        imp._unsupported(node, f"rank-{len(shape)} input of")
    code = _attr(node, "dtype", None)
    dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(code))) if code is not None else imp.dtype(node.input[0])
    imp._check_dtype(node, dtype)
    imp.known[node.output[0]] = np.eye(shape[0], shape[1], k=int(_attr(node, "k", 0)), dtype=dtype)
