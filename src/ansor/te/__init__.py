"""The tensor-expression language: declare what to compute, never how."""

from ansor.te.expr import (
    Expr, Var, IterVar, Const, const, cast, if_then_else, maximum, minimum,
    exp, log, sqrt, rsqrt, tanh, erf, sigmoid, abs, pow, sum, max, min,
)
from ansor.te.tensor import Tensor, placeholder, compute, reduce_axis, PlaceholderOp, ComputeOp
from ansor.te import ops

__all__ = [
    "Expr", "Var", "IterVar", "Const", "const", "cast", "if_then_else", "maximum", "minimum",
    "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "pow", "sum", "max", "min",
    "Tensor", "placeholder", "compute", "reduce_axis", "PlaceholderOp", "ComputeOp", "ops",
]
