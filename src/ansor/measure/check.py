"""Output checking: a kernel's time counts only if its outputs match the reference.

One place decides what "close enough" means for every dtype, so the tuner, the isolated worker and
tests all reject the same kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    from ansor.task import Task

# dtype kind/size -> (rtol, atol relative to max(1, max|expected|))
_FLOAT_TOLERANCES: dict[int, tuple[float, float]] = {
    2: (1e-2, 1e-3),  # float16
    4: (1e-4, 1e-5),  # float32
    8: (1e-9, 1e-12),  # float64
}
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
#: bfloat16 keeps 8 significant bits: one rounding is 2^-9 relative, a few roundings apart
#: (a product rounded, then a sum) stay within 2^-6
_BFLOAT16_TOLERANCES = (1.6e-2, 4e-3)


def is_float_dtype(dtype: np.dtype) -> bool:
    """Whether values of `dtype` are compared within a tolerance: floats, complex, bfloat16
    (whose numpy kind is 'V', an ml_dtypes extension type)."""
    return dtype.kind in "fc" or dtype == BFLOAT16


def default_tolerances(expected: np.ndarray) -> tuple[float, float]:
    """(rtol, atol) for comparing against `expected`; atol scales with the largest finite value."""
    dtype = expected.dtype
    if not is_float_dtype(dtype):
        return 0.0, 0.0
    component_size = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    rtol, atol_unit = (_BFLOAT16_TOLERANCES if dtype == BFLOAT16
                       else _FLOAT_TOLERANCES.get(component_size, _FLOAT_TOLERANCES[8]))
    finite = np.abs(expected[np.isfinite(expected)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    return rtol, atol_unit * scale


def reduction_rtol(dtype: np.dtype | str, length: int) -> float:
    """The relative tolerance for outputs reduced over `length` values: the dtype's default,
    or 8 eps sqrt(length) when that is larger. A program that sums a million float32 values
    one after another (one GPU thread per output, say) is off by ~2e-4 relative while its
    arithmetic is right; a wrong index or a lost tile is off by far more."""
    dtype = np.dtype(dtype)
    if dtype == BFLOAT16 or dtype == np.float16:  # sums of them accumulate in float32, rounded once
        default = _BFLOAT16_TOLERANCES[0] if dtype == BFLOAT16 else _FLOAT_TOLERANCES[2][0]
        eps = float(np.finfo(np.float32).eps)
    elif dtype.kind == "f":
        default, eps = _FLOAT_TOLERANCES.get(dtype.itemsize, _FLOAT_TOLERANCES[8])[0], float(np.finfo(dtype).eps)
    else:
        return 0.0
    return max(default, 8.0 * eps * math.sqrt(max(1, length)))


def task_rtol(task: Task) -> float:
    """The relative tolerance a task's outputs are checked with wherever a program of it runs
    (the tuner's worker, `Kernel.check`, comparisons): `reduction_rtol` of its first output's
    dtype and its longest reduction."""
    return reduction_rtol(task.outputs[0].dtype, task.longest_reduction)


def unwritten_like(expected: np.ndarray) -> np.ndarray:
    """A buffer unequal to `expected` everywhere: a kernel that writes nothing fails the check."""
    if is_float_dtype(expected.dtype):
        return np.full(expected.shape, np.nan, dtype=expected.dtype)
    if expected.dtype.kind in "biu":
        return np.ascontiguousarray(~expected)
    raise TypeError(f"cannot check outputs of dtype {expected.dtype}")


def check_outputs(
    outputs: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    rtol: float | None = None,
    atol: float | None = None,
) -> str | None:
    """None when every output matches its reference, else a message naming the worst element.

    Floats pass when |out - exp| <= atol + rtol * |exp| (defaults per dtype, see
    `default_tolerances`); a NaN or inf where the reference is finite never passes; integers and
    booleans must match exactly.
    """
    if len(outputs) != len(expected):
        return f"got {len(outputs)} outputs, expected {len(expected)}"
    for index, (out, exp) in enumerate(zip(outputs, expected)):
        out, exp = np.asarray(out), np.asarray(exp)
        message = _check_one(out, exp, rtol, atol)
        if message is not None:
            return f"output {index} {message}"
    return None


CHECK_CHUNK = 1 << 16  # elements compared at a time: the temporaries stay in the CPU's caches


def _float_errors(out: np.ndarray, exp: np.ndarray, rtol: float, atol: float) -> tuple[np.ndarray, np.ndarray]:
    """|out - exp| in double precision, and where it is out of tolerance. Written as "not
    within" so that NaN errors count as bad; a non-finite reference passes only when matched."""
    with np.errstate(invalid="ignore", over="ignore"):
        wide_out = out.astype(np.complex128 if exp.dtype.kind == "c" else np.float64)
        wide_exp = exp.astype(wide_out.dtype)
        error = np.abs(wide_out - wide_exp)
        finite = np.isfinite(wide_exp)
        bad = finite & ~(error <= atol + rtol * np.abs(wide_exp))
        if not finite.all():
            same_special = (wide_out == wide_exp) | (np.isnan(wide_out) & np.isnan(wide_exp))
            bad |= ~finite & ~same_special
    return error, bad


def _any_bad_floats(out: np.ndarray, exp: np.ndarray, rtol: float, atol: float) -> bool:
    """Whether any element is out of tolerance, a chunk at a time (a whole 4096^2 output at
    once made a dozen 128 MB temporaries: seconds per checked program)."""
    flat_out, flat_exp = out.reshape(-1), exp.reshape(-1)
    for start in range(0, flat_exp.size, CHECK_CHUNK):
        end = start + CHECK_CHUNK
        if _float_errors(flat_out[start:end], flat_exp[start:end], rtol, atol)[1].any():
            return True
    return False


def _check_one(
    out: np.ndarray, exp: np.ndarray, rtol: float | None, atol: float | None
) -> str | None:
    if out.shape != exp.shape:
        return f"shape {out.shape} differs from expected {exp.shape}"
    if out.dtype != exp.dtype:
        return f"dtype {out.dtype} differs from expected {exp.dtype}"
    if is_float_dtype(exp.dtype):
        default_rtol, default_atol = default_tolerances(exp)
        rtol = default_rtol if rtol is None else rtol
        atol = default_atol if atol is None else atol
        if not _any_bad_floats(out, exp, rtol, atol):
            return None
        error, bad = _float_errors(out, exp, rtol, atol)
        tolerance = f"rtol={rtol:g}, atol={atol:g}"
    else:
        bad = out != exp
        error = np.abs(out.astype(np.float64) - exp.astype(np.float64))
        tolerance = "exact"
    n_bad = int(np.count_nonzero(bad))
    if n_bad == 0:
        return None

    bad_error = np.where(bad, error, -1.0)
    non_finite = bad & ~np.isfinite(bad_error)
    flat = int(np.argmax(non_finite)) if non_finite.any() else int(np.argmax(bad_error))
    where = tuple(int(i) for i in np.unravel_index(flat, exp.shape))
    got, want = out.flat[flat].item(), exp.flat[flat].item()
    worst = "non-finite" if non_finite.any() else f"{float(bad_error.flat[flat]):.3g}"
    return (
        f"mismatch: max abs err {worst} at index {where} (got {got!r}, expected {want!r}); "
        f"{n_bad} of {exp.size} elements differ ({tolerance})"
    )
