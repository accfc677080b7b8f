"""The tensor-expression language: declare what to compute, never how.

`placeholder` declares inputs, `compute` each output element as an expression of its indices,
`reduce_axis` the axes a `sum`/`max`/`min` runs over (a reduction is the whole body of its
compute). Expressions combine with Python operators and the math functions here; dtypes never
mix implicitly (a Python number takes the dtype of the expression it meets, `cast` converts).
`ops` holds ready operators (matmul, conv2d, softmax, ...) declared the same way.
"""

from ansor.te.expr import (
    Expr, Var, IterVar, Const, const, cast, if_then_else, maximum, minimum,
    exp, log, sqrt, rsqrt, tanh, erf, sigmoid, abs, pow, sum, max, min,
    sin, cos, tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh, floor, ceil, round,
)
from ansor.te.tensor import Tensor, placeholder, compute, reduce_axis, PlaceholderOp, ComputeOp
from ansor.te import ops

__all__ = [
    "Expr", "Var", "IterVar", "Const", "const", "cast", "if_then_else", "maximum", "minimum",
    "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "pow", "sum", "max", "min",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "floor",
    "ceil", "round",
    "Tensor", "placeholder", "compute", "reduce_axis", "PlaceholderOp", "ComputeOp", "ops",
]
