"""The elementary math functions (trigonometric, hyperbolic, rounding): numpy's reference
evaluation and the compiled C agree with numpy on each function's domain."""

from __future__ import annotations

import numpy as np
import pytest

from ansor import te
from ansor.kernel import build
from ansor.task import Task
from ansor.te.evaluate import evaluate
from ansor.te.expr import ELEMENTARY_FUNCS

NUMPY = {"sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
         "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh,
         "atanh": np.arctanh, "floor": np.floor, "ceil": np.ceil, "round": np.rint}


def _domain(name: str, rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    if name in ("asin", "acos", "atanh"):
        x = rng.uniform(-0.99, 0.99, n)
    elif name == "acosh":
        x = rng.uniform(1.0, 5.0, n)
    elif name in ("floor", "ceil", "round"):
        x = np.concatenate([rng.uniform(-10, 10, n - 6), [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]])  # ties go to even
    else:
        x = rng.uniform(-3, 3, n)
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ELEMENTARY_FUNCS)
def test_elementary_function_compiled_and_evaluated_match_numpy(name, dtype):
    n = 64
    x = te.placeholder((n,), dtype, name="X")
    y = te.compute((n,), lambda i: getattr(te, name)(x[i]), name="Y")
    data = _domain(name, np.random.default_rng(0), n, dtype)
    expected = NUMPY[name](data)
    rtol = 2e-6 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(evaluate([y], {x: data})[0], expected, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(build(Task([x, y]))(data), expected, rtol=rtol, atol=rtol)


def test_elementary_functions_refuse_integers():
    x = te.placeholder((4,), "int32", name="X")
    with pytest.raises(TypeError, match="float"):
        te.compute((4,), lambda i: te.sin(x[i]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_maximum_minimum_and_max_reductions_keep_nan_as_numpy_does(dtype):
    """relu, clamp and max pools of a NaN are NaN in numpy, PyTorch and ONNX; a compiled
    `a > b ? a : b` used to drop a NaN in its first operand."""
    n = 16
    x = te.placeholder((n, 4), dtype, name="X")
    relu = te.compute((n, 4), lambda i, j: te.maximum(x[i, j], te.const(0.0, dtype)), name="R")
    low = te.compute((n, 4), lambda i, j: te.minimum(x[i, j], te.const(0.0, dtype)), name="L")
    k = te.reduce_axis(4, name="k")
    top = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="T")
    data = np.random.default_rng(1).standard_normal((n, 4)).astype(dtype)
    data[::3, 1] = np.nan
    for out, want in ((relu, np.maximum(data, 0)), (low, np.minimum(data, 0)), (top, np.max(data, axis=1))):
        got = build(Task([x, out]))(data)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, equal_nan=True)
