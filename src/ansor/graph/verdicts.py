"""What the conformance runners (`onnx_conformance`, `torch_conformance`) share: how an output is
compared with the framework's, and how an error becomes a one-line reason.

A case ends as one `Verdict` (pass, refused, wrong or skipped) and `summarize` counts them per
operator. A pass needs every output equal in shape and dtype, floats within the tolerance given (NaN equal
to NaN), integers and bools exactly; anything else is described in one line.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
#: The relative tolerance of a bfloat16 output, torch.testing's default for the type (2 of its
#: rounding steps): an operator computed in float32 and rounded once (as PyTorch's CPU kernels
#: do, `graph.half_precision`) and the same operator rounded to bfloat16 after every step (ONNX's
#: numpy reference) land a step or two apart.
BFLOAT16_RTOL = 1.6e-2

__all__ = ["Verdict", "one_line", "output_mismatch", "summarize"]


@dataclass
class Verdict:
    """How one case ended."""

    case: str
    operator: str
    status: str          # "pass" | "refused" | "wrong" | "skipped"
    reason: str = ""
    fallback: bool = False  # a pass that ran (part of) its graph with the numpy kernels


def summarize(verdicts: Iterable[Verdict]) -> dict[str, Counter]:
    """Counts of each status per operator (a pass run with numpy kernels also counts as
    "fallback")."""
    table: dict[str, Counter] = defaultdict(Counter)
    for v in verdicts:
        table[v.operator][v.status] += 1
        if v.status == "pass" and v.fallback:
            table[v.operator]["fallback"] += 1
    return dict(table)


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
        tolerance = rtol
        if e.dtype == BFLOAT16:  # numpy's NaN-aware comparisons do not know bfloat16
            g, e = g.astype(np.float32), e.astype(np.float32)
            tolerance = max(rtol, BFLOAT16_RTOL)
        if e.dtype.kind in "fc":
            if not np.allclose(g, e, rtol=tolerance, atol=atol, equal_nan=True):
                with np.errstate(invalid="ignore"):
                    err = np.nanmax(np.abs(g.astype(np.float64) - e.astype(np.float64)))
                return f"output {i}: max abs error {err:.3g}"
        elif not np.array_equal(g, e):
            return f"output {i}: {int(np.sum(g != e))} of {e.size} elements differ"
    return ""


def one_line(exc: BaseException) -> str:
    """An error's message on one line, at most 300 characters."""
    return " ".join(str(exc).split())[:300]
