"""What the conformance runners (`onnx_conformance`, `torch_conformance`) share: how an output is
compared with the framework's, and how an error becomes a one-line reason.

A pass needs every output equal in shape and dtype, floats within the tolerance given (NaN equal
to NaN), integers and bools exactly; anything else is described in one line.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["one_line", "output_mismatch"]


def output_mismatch(got: Sequence[Any], expected: Sequence[np.ndarray], rtol: float, atol: float) -> str:
    """"" when every output matches, else what the first mismatch is."""
    if len(got) != len(expected):
        return f"{len(got)} outputs where {len(expected)} are expected"
    for i, (g, e) in enumerate(zip(got, expected)):
        g, e = np.asarray(g), np.asarray(e)
        if g.shape != e.shape:
            return f"output {i}: shape {g.shape} where {e.shape} is expected"
        if g.dtype != e.dtype:
            return f"output {i}: dtype {g.dtype} where {e.dtype} is expected"
        if e.dtype.kind in "fc":
            if not np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
                with np.errstate(invalid="ignore"):
                    err = np.nanmax(np.abs(g.astype(np.float64) - e.astype(np.float64)))
                return f"output {i}: max abs error {err:.3g}"
        elif not np.array_equal(g, e):
            return f"output {i}: {int(np.sum(g != e))} of {e.size} elements differ"
    return ""


def one_line(exc: BaseException) -> str:
    """An error's message on one line, at most 300 characters."""
    return " ".join(str(exc).split())[:300]
