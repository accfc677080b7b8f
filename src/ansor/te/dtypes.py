"""The element types of tensor expressions: their names, sizes, kinds, how two operands of
different types meet, and what a conversion (`te.cast`) does to a value.

One table serves the expression builders, the numpy evaluator, the code printers and the
importers, so "what a float16 is" is decided once. bfloat16 is numpy's through `ml_dtypes`
(importing this module registers the name, so `np.dtype("bfloat16")` works everywhere).

Conversions, the semantics every executor follows:
- float to float rounds to nearest, ties to even (bfloat16 from float64 goes through float32,
  as ml_dtypes converts); NaN stays NaN.
- integer to integer wraps modulo 2**bits (two's complement), as numpy and C do.
- float to integer truncates toward zero and *saturates*: values beyond the type's range give
  its smallest or largest value, NaN gives 0. (C leaves this undefined and numpy's result
  depends on the machine; ansor defines it so the reference and every kernel agree.)
- anything to bool is `!= 0`; bool to a number is 0 or 1.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np

#: float32 and float64 first: the types most programs use, and the order error messages list
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
SIGNED_DTYPES = ("int32", "int64", "int8", "int16")
UNSIGNED_DTYPES = ("uint8", "uint16", "uint32", "uint64")
INT_DTYPES = SIGNED_DTYPES + UNSIGNED_DTYPES
#: the integers of indices and loop arithmetic: the simplifier reasons about these as
#: unbounded integers (they never wrap in a program ansor accepts); narrower or unsigned
#: integers are data, whose arithmetic wraps, and stay opaque to it
INDEX_DTYPES = ("int32", "int64")
#: float16 and bfloat16: stored in 16 bits, computed in float32 and rounded after every
#: operation (as numpy and ml_dtypes compute them)
HALF_DTYPES = ("float16", "bfloat16")
DTYPES = FLOAT_DTYPES + INT_DTYPES + ("bool",)
DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2,
               "int8": 1, "int16": 2, "int32": 4, "int64": 8,
               "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1}
_BITS = {name: 8 * size for name, size in DTYPE_BYTES.items()}


def numpy_dtype(dtype: str) -> np.dtype:
    """numpy's dtype of an element type (bfloat16 is `ml_dtypes.bfloat16`)."""
    return np.dtype(dtype)


def bits(dtype: str) -> int:
    """The width of an element in bits."""
    return _BITS[dtype]


def is_signed(dtype: str) -> bool:
    """Whether `dtype` is a signed integer type."""
    return dtype in SIGNED_DTYPES


def is_unsigned(dtype: str) -> bool:
    """Whether `dtype` is an unsigned integer type."""
    return dtype in UNSIGNED_DTYPES


def int_range(dtype: str) -> tuple[int, int]:
    """The smallest and largest value of an integer type."""
    n = _BITS[dtype]
    return (0, 2**n - 1) if dtype in UNSIGNED_DTYPES else (-(2 ** (n - 1)), 2 ** (n - 1) - 1)


def promote(a: str, b: str) -> str | None:
    """The dtype two operands of `a` and `b` meet in, or None where they do not meet without
    an explicit cast. Only integers of one signedness widen (to the wider, as int32 and int64
    always did); floats of different widths, signed with unsigned, and numbers with bool do
    not mix silently."""
    if a == b:
        return a
    if (a in SIGNED_DTYPES and b in SIGNED_DTYPES) or (a in UNSIGNED_DTYPES and b in UNSIGNED_DTYPES):
        return a if _BITS[a] >= _BITS[b] else b
    return None


def wrap_int(value: int, dtype: str) -> int:
    """`value` reduced modulo 2**bits into the range of the integer type (two's complement)."""
    lo, hi = int_range(dtype)
    span = hi - lo + 1
    return (int(value) - lo) % span + lo


def convert_scalar(value: int | float | bool, dtype: str) -> int | float | bool:
    """A Python value converted to `dtype` as `te.cast` converts (see the module docstring):
    the Python int, float or bool that the converted value equals."""
    if dtype == "bool":
        return bool(value)
    if dtype in INT_DTYPES:
        if isinstance(value, float):
            return int(cast_array(np.asarray(value, np.float64), dtype))
        return wrap_int(int(value), dtype)
    if dtype in HALF_DTYPES:
        return float(np.asarray(float(value), np.float32).astype(dtype)) if dtype == "bfloat16" \
            else float(np.float16(float(value)))
    if dtype == "float32":
        return float(np.float32(value))
    return float(value)


def cast_array(array: np.ndarray, dtype: str) -> np.ndarray:
    """`array` converted to `dtype` as `te.cast` converts (see the module docstring)."""
    array = np.asarray(array)
    target = numpy_dtype(dtype)
    if array.dtype == target:
        return array
    source = str(array.dtype)
    if dtype in INT_DTYPES and source in FLOAT_DTYPES:
        lo, hi = int_range(dtype)
        with np.errstate(invalid="ignore"):
            x = np.trunc(array.astype(np.float64))
            below, above = x <= lo, x >= hi  # float(hi) may round up to 2**bits: compare, then set
            keep = ~(below | above | np.isnan(x))
            out = np.where(keep, x, 0.0).astype(target)
        out[below] = lo
        out[above] = hi
        return out
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is the defined result
        if dtype == "bfloat16" and source == "float64":
            return array.astype(np.float32).astype(target)
        return array.astype(target)
