"""Expression nodes of the tensor-expression language.

Expressions are immutable trees. Python operators build new nodes, so `==` and `<` on expressions
return comparison *expressions*; to stop those from silently becoming Python booleans,
`Expr.__bool__` raises. Nodes hash by identity; compare structure with `structural_key`.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence, Union

import numpy as np

from ansor.te.dtypes import (DTYPE_BYTES, DTYPES, FLOAT_DTYPES, HALF_DTYPES, INDEX_DTYPES,  # noqa: F401
                             INT_DTYPES, convert_scalar, int_range, promote)

ExprLike = Union["Expr", int, float, bool]


def check_dtype(dtype: str) -> str:
    """The canonical name of a supported dtype (numpy spellings accepted); TypeError otherwise."""
    if dtype in DTYPE_BYTES:  # the common case, without numpy's dtype parsing
        return dtype
    try:
        dtype = str(np.dtype(dtype))
    except TypeError:
        raise TypeError(f"unsupported dtype {dtype!r}; ansor supports {', '.join(DTYPES)}") from None
    if dtype not in DTYPES:
        raise TypeError(f"unsupported dtype {dtype!r}; ansor supports {', '.join(DTYPES)}")
    return dtype


def is_float(dtype: str) -> bool:
    """Whether `dtype` is a floating-point type (float16, bfloat16, float32, float64)."""
    return dtype in FLOAT_DTYPES


def is_int(dtype: str) -> bool:
    """Whether `dtype` is an integer type, signed or unsigned (bool is neither float nor int)."""
    return dtype in INT_DTYPES


def is_index(dtype: str) -> bool:
    """Whether `dtype` is int32 or int64: the integers of indices, which the simplifier treats
    as unbounded (narrower and unsigned integers are data whose arithmetic wraps)."""
    return dtype in INDEX_DTYPES


_INT32_MIN, _INT32_MAX = int_range("int32")  # bounds of the int32 fast path in `binary`


def check_fits(value: int, dtype: str) -> int:
    """`value` when the integer type holds it; ValueError otherwise (a constant never wraps
    silently where a user wrote it)."""
    lo, hi = int_range(dtype)
    if not lo <= value <= hi:
        raise ValueError(f"constant {value} does not fit {dtype} [{lo}, {hi}]; use te.cast to convert")
    return value


class Expr:
    """Base class of expression nodes: every node has a dtype.

    Python operators build new nodes: `+ - * / // %` (`/` on floats; `//` and `%` on integers,
    flooring as in Python), comparisons (bool expressions), and `& | ~` for logical and, or,
    not. An expression has no Python truth value (`bool(e)` raises TypeError): use
    `if_then_else` for conditions.
    """

    __slots__ = ("dtype",)
    dtype: str

    # arithmetic ---------------------------------------------------------------------------
    def __add__(self, other: ExprLike) -> Expr:
        return binary("+", self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return binary("+", other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return binary("-", self, other)

    def __rsub__(self, other: ExprLike) -> Expr:
        return binary("-", other, self)

    def __mul__(self, other: ExprLike) -> Expr:
        return binary("*", self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return binary("*", other, self)

    def __truediv__(self, other: ExprLike) -> Expr:
        return binary("/", self, other)

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return binary("/", other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return binary("//", self, other)

    def __rfloordiv__(self, other: ExprLike) -> Expr:
        return binary("//", other, self)

    def __mod__(self, other: ExprLike) -> Expr:
        return binary("%", self, other)

    def __rmod__(self, other: ExprLike) -> Expr:
        return binary("%", other, self)

    def __neg__(self) -> Expr:
        return binary("-", Const(0, self.dtype), self)

    # comparisons and logic ----------------------------------------------------------------
    def __lt__(self, other: ExprLike) -> Expr:
        return compare("<", self, other)

    def __le__(self, other: ExprLike) -> Expr:
        return compare("<=", self, other)

    def __gt__(self, other: ExprLike) -> Expr:
        return compare(">", self, other)

    def __ge__(self, other: ExprLike) -> Expr:
        return compare(">=", self, other)

    def __eq__(self, other: ExprLike) -> Expr:  # type: ignore[override]
        return compare("==", self, other)

    def __ne__(self, other: ExprLike) -> Expr:  # type: ignore[override]
        return compare("!=", self, other)

    def __and__(self, other: ExprLike) -> Expr:
        return Logical("and", (as_bool(self), as_bool(other)))

    def __rand__(self, other: ExprLike) -> Expr:
        return Logical("and", (as_bool(other), as_bool(self)))

    def __or__(self, other: ExprLike) -> Expr:
        return Logical("or", (as_bool(self), as_bool(other)))

    def __ror__(self, other: ExprLike) -> Expr:
        return Logical("or", (as_bool(other), as_bool(self)))

    def __invert__(self) -> Expr:
        return Logical("not", (as_bool(self),))

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise TypeError(
            "an ansor expression has no Python truth value; use te.if_then_else for conditions"
        )

    def children(self) -> tuple[Expr, ...]:
        """The node's operands, in order (none for a leaf: a constant or a variable)."""
        return ()

    def __repr__(self) -> str:
        return expr_to_str(self)


class Const(Expr):
    """A constant, its Python value already converted to its dtype (int, float or bool) as
    `cast` converts: a float16 or bfloat16 value is rounded to the type, a narrow integer
    wraps (folded arithmetic), a float given for an integer truncates."""

    __slots__ = ("value",)

    def __init__(self, value: int | float | bool, dtype: str):
        if dtype == "int32" and type(value) is int:  # the common case: loop and index arithmetic
            self.dtype, self.value = dtype, value
            return
        self.dtype = dtype = check_dtype(dtype)
        if dtype in INDEX_DTYPES:
            value = int(value)
        elif dtype in ("float32", "float64"):
            value = float(value)
        elif dtype == "bool":
            value = bool(value)
        else:
            value = convert_scalar(value, dtype)
        self.value = value


class Var(Expr):
    """A named integer variable (an axis or a loop variable)."""

    __slots__ = ("name",)

    def __init__(self, name: str, dtype: str = "int32"):
        self.name = name
        self.dtype = dtype


class IterVar(Var):
    """An axis with a domain [lo, lo + extent); kind is 'spatial' or 'reduce'."""

    __slots__ = ("lo", "extent", "kind")

    def __init__(self, name: str, extent: int, kind: str, lo: int = 0):
        super().__init__(name, "int32")
        if not isinstance(extent, (int, np.integer)) or isinstance(extent, bool) or extent <= 0:
            raise ValueError(f"axis {name!r}: extent must be a positive integer, got {extent!r}")
        self.lo = int(lo)
        self.extent = int(extent)
        self.kind = kind


class BinOp(Expr):
    """Arithmetic: + - * / // % min max. `//` and `%` floor (Python semantics)."""

    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr, dtype: str):
        self.op, self.a, self.b, self.dtype = op, a, b, dtype

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)


class Compare(Expr):
    """`a op b` for op in < <= > >= == !=: a bool expression of two operands of one dtype."""

    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr):
        self.op, self.a, self.b, self.dtype = op, a, b, "bool"

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)


class Logical(Expr):
    """and / or over bool args, or not of one (written & | ~, since Python's own keywords
    cannot be overloaded)."""

    __slots__ = ("op", "args")

    def __init__(self, op: str, args: tuple[Expr, ...]):
        self.op, self.args, self.dtype = op, tuple(args), "bool"

    def children(self) -> tuple[Expr, ...]:
        return self.args


class Call(Expr):
    """A pure math function of its arguments (exp, log, sqrt, ...)."""

    __slots__ = ("func", "args")

    def __init__(self, func: str, args: Sequence[Expr], dtype: str):
        self.func, self.args, self.dtype = func, tuple(args), dtype

    def children(self) -> tuple[Expr, ...]:
        return self.args


class Select(Expr):
    """`cond ? a : b`, evaluating only the branch taken (a guarded load is safe)."""

    __slots__ = ("cond", "a", "b")

    def __init__(self, cond: Expr, a: Expr, b: Expr):
        self.cond, self.a, self.b, self.dtype = cond, a, b, a.dtype

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.a, self.b)


class Cast(Expr):
    """`value` converted to `dtype` (made by `cast`)."""

    __slots__ = ("value",)

    def __init__(self, dtype: str, value: Expr):
        self.dtype, self.value = check_dtype(dtype), value

    def children(self) -> tuple[Expr, ...]:
        return (self.value,)


class TensorRead(Expr):
    """`tensor[indices]` in a declaration; lowering turns it into a buffer load."""

    __slots__ = ("tensor", "indices")

    def __init__(self, tensor, indices: Sequence[Expr]):
        self.tensor, self.indices, self.dtype = tensor, tuple(indices), tensor.dtype

    def children(self) -> tuple[Expr, ...]:
        return self.indices


class Reduce(Expr):
    """A reduction (sum/max/min) of `source` over `axes`, skipping points where `where` is false."""

    __slots__ = ("combiner", "source", "axes", "where")

    def __init__(self, combiner: str, source: Expr, axes: Sequence[IterVar], where: Expr | None):
        self.combiner, self.source, self.axes = combiner, source, tuple(axes)
        self.where, self.dtype = where, source.dtype

    def children(self) -> tuple[Expr, ...]:
        return (self.source,) if self.where is None else (self.source, self.where)


# ---------------------------------------------------------------------------------------------
# construction helpers

def const(value: int | float | bool, dtype: str = "float32") -> Const:
    """The constant `value` as `dtype` (float32 unless given), converted by int(), float() or
    bool(). A bare Python number in an expression needs no `const`: it takes the dtype of the
    expression it meets; `const` fixes a dtype where nothing else would (a lone constant body).
    An integer outside the range of an integer dtype raises ValueError."""
    dtype = check_dtype(dtype)
    if is_int(dtype) and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        check_fits(int(value), dtype)
    return Const(value, dtype)


def as_expr(value: ExprLike, like: str | None = None) -> Expr:
    """Wrap a Python number; it takes the dtype `like` of the expression it meets."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, (bool, np.bool_)):
        return Const(bool(value), "bool")
    if isinstance(value, (int, np.integer)):
        if like is not None and like != "bool":
            if is_int(like):
                check_fits(int(value), like)
            return Const(int(value), like)
        return Const(int(value), "int32" if -(2**31) <= value < 2**31 else "int64")
    if isinstance(value, (float, np.floating)):
        if like is not None and is_int(like):
            raise TypeError(
                f"a float constant {value!r} meets an integer expression; use te.cast to convert"
            )
        return Const(float(value), like if like is not None and is_float(like) else "float32")
    raise TypeError(f"cannot use {type(value).__name__} {value!r} in a tensor expression")


def as_bool(value: ExprLike) -> Expr:
    """`value` as a condition; TypeError unless it is a bool expression or a Python bool."""
    e = as_expr(value)
    if e.dtype != "bool":
        raise TypeError(f"expected a condition (bool expression), got dtype {e.dtype}")
    return e


def _unify(a: ExprLike, b: ExprLike) -> tuple[Expr, Expr, str]:
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        a = as_expr(a)
    if not isinstance(a, Expr):
        a = as_expr(a, b.dtype)  # type: ignore[union-attr]
    if not isinstance(b, Expr):
        b = as_expr(b, a.dtype)
    if a.dtype == b.dtype:
        return a, b, a.dtype
    dtype = promote(a.dtype, b.dtype)  # integers of one signedness widen to the wider
    if dtype is not None:
        return cast(a, dtype), cast(b, dtype), dtype
    raise TypeError(
        f"operands have different dtypes ({a.dtype} and {b.dtype}); use te.cast to convert one"
    )


def binary(op: str, a: ExprLike, b: ExprLike) -> Expr:
    """`a op b` for the arithmetic operators, operands unified to one dtype; `/` is for floats,
    `//` and `%` (floor semantics, as in Python) for integers, none for bools."""
    if isinstance(a, Expr) and a.dtype == "int32" and op != "/":  # index arithmetic: what _unify gives
        if isinstance(b, Expr):
            if b.dtype == "int32":
                return BinOp(op, a, b, "int32")
        elif type(b) is int and _INT32_MIN <= b <= _INT32_MAX:
            return BinOp(op, a, Const(b, "int32"), "int32")
    a, b, dtype = _unify(a, b)
    if dtype == "bool":
        raise TypeError(f"arithmetic {op!r} on bool expressions; use & | ~ for logic")
    if op == "/" and is_int(dtype):
        raise TypeError("'/' on integer expressions is ambiguous; use '//' (floor division)")
    if op in ("//", "%") and is_float(dtype):
        raise TypeError(f"{op!r} is defined on integer expressions only")
    return BinOp(op, a, b, dtype)


def compare(op: str, a: ExprLike, b: ExprLike) -> Expr:
    """`a op b` for a comparison operator, operands unified to one dtype; the result is bool."""
    a, b, _ = _unify(a, b)
    return Compare(op, a, b)


def all_of(conds: Sequence[Expr]) -> Expr | None:
    """The conjunction of conditions, or None when there are none."""
    out = None
    for c in conds:
        out = c if out is None else Logical("and", (out, c))
    return out


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    """The elementwise larger of `a` and `b` (two values, not a reduction: see `max`).

    Both operands have one dtype (a Python number takes the other's; two integer dtypes widen
    to int64; float and int need a `cast`); bool is refused."""
    a, b, dtype = _unify(a, b)
    if dtype == "bool":
        raise TypeError("maximum of bool expressions; use | for logic")
    return BinOp("max", a, b, dtype)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    """The elementwise smaller of `a` and `b` (two values, not a reduction: see `min`); dtype
    rules as in `maximum`."""
    a, b, dtype = _unify(a, b)
    if dtype == "bool":
        raise TypeError("minimum of bool expressions; use & for logic")
    return BinOp("min", a, b, dtype)


def if_then_else(cond: ExprLike, then_value: ExprLike, else_value: ExprLike) -> Expr:
    """`then_value` where the bool `cond` holds, else `else_value`; the branch not taken is never
    evaluated, so a load guarded by its own bounds check is safe (padding).

    The two values have one dtype (a Python number takes the other's), which is the result's."""
    cond = as_bool(cond)
    a, b, _ = _unify(then_value, else_value)
    return Select(cond, a, b)


def cast(value: ExprLike, dtype: str) -> Expr:
    """`value` converted to `dtype`: the way to mix dtypes, which operators do not do
    implicitly (they only widen an integer to a wider one of the same signedness). Floats
    round to nearest even; integers wrap; float to integer truncates toward zero and
    saturates at the type's range (NaN gives 0); see `ansor.te.dtypes`. Returns `value`
    itself when it has the dtype already."""
    e = as_expr(value)
    dtype = check_dtype(dtype)
    return e if e.dtype == dtype else Cast(dtype, e)


def _float_call(func: str, *args: ExprLike) -> Expr:
    """A math call whose arguments share one dtype, float except for abs (the result's); Python
    numbers take the dtype of the expression argument (alone: float32, or int32 for an int)."""
    exprs = [as_expr(a) for a in args]
    like = next((e.dtype for e in exprs if isinstance(e, Expr) and not isinstance(e, Const)), None)
    exprs = [as_expr(a, like) if not isinstance(a, Expr) else a for a in args]
    dtype = exprs[0].dtype
    for e in exprs:
        if e.dtype != dtype:
            raise TypeError(f"{func}: arguments have different dtypes; use te.cast")
    if func != "abs" and not is_float(dtype):
        raise TypeError(f"{func} needs a float argument, got {dtype}; use te.cast")
    return Call(func, exprs, dtype)


def exp(x: ExprLike) -> Expr:
    """e**x, elementwise. Float operands only (`cast` an integer first); the result has x's dtype."""
    return _float_call("exp", x)


def log(x: ExprLike) -> Expr:
    """The natural logarithm of x (-inf at 0, nan below). Float only; x's dtype."""
    return _float_call("log", x)


def sqrt(x: ExprLike) -> Expr:
    """The square root of x (nan below 0). Float only; x's dtype."""
    return _float_call("sqrt", x)


def rsqrt(x: ExprLike) -> Expr:
    """1 / sqrt(x), as in normalization layers. Float only; x's dtype."""
    return _float_call("rsqrt", x)


def tanh(x: ExprLike) -> Expr:
    """The hyperbolic tangent of x. Float only; x's dtype."""
    return _float_call("tanh", x)


def erf(x: ExprLike) -> Expr:
    """The Gauss error function of x (exact GELU uses it). Float only; x's dtype."""
    return _float_call("erf", x)


def sigmoid(x: ExprLike) -> Expr:
    """The logistic function 1 / (1 + exp(-x)). Float only; x's dtype."""
    return _float_call("sigmoid", x)


def abs(x: ExprLike) -> Expr:  # noqa: A001 - mirrors the math name users expect
    """|x|, elementwise; the one math function that also takes integers. x's dtype."""
    return _float_call("abs", x)


def pow(x: ExprLike, y: ExprLike) -> Expr:  # noqa: A001
    """x**y, elementwise. Both float of one dtype (a Python number takes the other's), which is
    the result's."""
    return _float_call("pow", x, y)


#: One-argument float functions of libm beyond the above, each x's dtype: the trigonometric and
#: hyperbolic functions and their inverses, and rounding (`round` rounds half to even, as ONNX
#: and numpy do).
ELEMENTARY_FUNCS = ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                    "atanh", "floor", "ceil", "round")


def sin(x: ExprLike) -> Expr:
    """The sine of x (radians). Float only; x's dtype."""
    return _float_call("sin", x)


def cos(x: ExprLike) -> Expr:
    """The cosine of x (radians). Float only; x's dtype."""
    return _float_call("cos", x)


def tan(x: ExprLike) -> Expr:
    """The tangent of x (radians). Float only; x's dtype."""
    return _float_call("tan", x)


def asin(x: ExprLike) -> Expr:
    """The arcsine of x (nan outside [-1, 1]). Float only; x's dtype."""
    return _float_call("asin", x)


def acos(x: ExprLike) -> Expr:
    """The arccosine of x (nan outside [-1, 1]). Float only; x's dtype."""
    return _float_call("acos", x)


def atan(x: ExprLike) -> Expr:
    """The arctangent of x. Float only; x's dtype."""
    return _float_call("atan", x)


def sinh(x: ExprLike) -> Expr:
    """The hyperbolic sine of x. Float only; x's dtype."""
    return _float_call("sinh", x)


def cosh(x: ExprLike) -> Expr:
    """The hyperbolic cosine of x. Float only; x's dtype."""
    return _float_call("cosh", x)


def asinh(x: ExprLike) -> Expr:
    """The inverse hyperbolic sine of x. Float only; x's dtype."""
    return _float_call("asinh", x)


def acosh(x: ExprLike) -> Expr:
    """The inverse hyperbolic cosine of x (nan below 1). Float only; x's dtype."""
    return _float_call("acosh", x)


def atanh(x: ExprLike) -> Expr:
    """The inverse hyperbolic tangent of x (nan outside [-1, 1]). Float only; x's dtype."""
    return _float_call("atanh", x)


def floor(x: ExprLike) -> Expr:
    """The largest integer not above x, as x's dtype. Float only; x's dtype."""
    return _float_call("floor", x)


def ceil(x: ExprLike) -> Expr:
    """The smallest integer not below x, as x's dtype. Float only; x's dtype."""
    return _float_call("ceil", x)


def round(x: ExprLike) -> Expr:  # noqa: A001 - mirrors the math name users expect
    """x rounded to the nearest integer, halves to even (as ONNX and numpy round), as x's dtype. Float only; x's dtype."""
    return _float_call("round", x)


MATH_FUNCS = ("exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid", "abs", "pow") + ELEMENTARY_FUNCS


def _reduce(combiner: str, source: ExprLike, axis, where: ExprLike | None,
            dtype: str | None = None) -> Reduce:
    """A reduction node; checks what `sum`, `max` and `min` promise."""
    axes = list(axis) if isinstance(axis, (list, tuple)) else [axis]
    if not axes:
        raise ValueError(f"te.{combiner}: give at least one reduce axis")
    for ax in axes:
        if not isinstance(ax, IterVar) or ax.kind != "reduce":
            raise TypeError(f"te.{combiner}: axis= takes axes made by te.reduce_axis, got {ax!r}")
    source = as_expr(source)
    if source.dtype == "bool":
        raise TypeError(f"te.{combiner} of a bool expression; cast it first")
    if dtype is not None:
        source = in_dtype(source, check_dtype(dtype))
    if combiner == "sum" and source.dtype in HALF_DTYPES:
        raise TypeError(f"te.sum in {source.dtype} would round the running sum at every step; "
                        f"accumulate in float32: te.sum(..., dtype=\"float32\")")
    return Reduce(combiner, source, axes, None if where is None else as_bool(where))


def in_dtype(value: Expr, dtype: str) -> Expr:
    """`value` computed in `dtype`: its + - * (and min/max) with each operand taken to `dtype`,
    down to the first other node, which is cast. A product of int8 values becomes the product
    of their int32 casts (no wrap), bfloat16 products exact float32 products: what a widening
    multiply-accumulate instruction computes."""
    if value.dtype == dtype:
        return value
    if is_float(value.dtype) != is_float(dtype) or value.dtype == "bool":
        return cast(value, dtype)  # a float sum counted in integers (or back): convert the value
    if isinstance(value, BinOp) and value.op in ("+", "-", "*", "min", "max"):
        return BinOp(value.op, in_dtype(value.a, dtype), in_dtype(value.b, dtype), dtype)
    if isinstance(value, Const) and value.dtype != "bool":
        return Const(value.value, dtype)
    return cast(value, dtype)


def sum(source: ExprLike, axis, where: ExprLike | None = None, dtype: str | None = None) -> Reduce:  # noqa: A001
    """The sum of `source` over every point of `axis` (one `te.reduce_axis` or a list of them)
    where the bool `where` holds (all points without it); 0 when no point does.

    The result has source's dtype (an int32 sum is not widened), or `dtype` when given: the
    accumulation type, in which the source's + - * are computed (`in_dtype`), so
    `te.sum(A[i, k] * B[k, j], axis=k, dtype="int32")` of int8 tensors sums exact int32
    products, and bfloat16 products are summed in float32. A sum never accumulates in float16
    or bfloat16 (a running sum rounded to 8 or 11 bits loses the small terms): give
    `dtype="float32"`; bool is refused.
    As in TVM, a reduction is the whole body of its `te.compute`: what is applied to the result
    (a bias, an activation, a cast back to a narrow type) is a following compute."""
    return _reduce("sum", source, axis, where, dtype)


def max(source: ExprLike, axis, where: ExprLike | None = None, dtype: str | None = None) -> Reduce:  # noqa: A001
    """The largest `source` over the points of `axis` where `where` holds; -inf (the dtype's
    smallest integer) when no point does. Otherwise as `sum`; for two values see `maximum`."""
    return _reduce("max", source, axis, where, dtype)


def min(source: ExprLike, axis, where: ExprLike | None = None, dtype: str | None = None) -> Reduce:  # noqa: A001
    """The smallest `source` over the points of `axis` where `where` holds; inf (the dtype's
    largest integer) when no point does. Otherwise as `sum`; for two values see `maximum`."""
    return _reduce("min", source, axis, where, dtype)


def reduce_identity(combiner: str, dtype: str) -> Const:
    """The value a reduction starts from."""
    if combiner == "sum":
        return Const(0, dtype)
    if is_float(dtype):
        return Const(-math.inf if combiner == "max" else math.inf, dtype)
    info = np.iinfo(dtype)
    return Const(info.min if combiner == "max" else info.max, dtype)


# ---------------------------------------------------------------------------------------------
# traversal

def walk(expr: Expr) -> Iterable[Expr]:
    """All nodes of an expression, pre-order."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children()))


def rebuild(expr: Expr, children: Sequence[Expr]) -> Expr:
    """A copy of `expr` with new children (same kind of node)."""
    if isinstance(expr, BinOp):
        return BinOp(expr.op, children[0], children[1], expr.dtype)
    if isinstance(expr, Compare):
        return Compare(expr.op, children[0], children[1])
    if isinstance(expr, Logical):
        return Logical(expr.op, tuple(children))
    if isinstance(expr, Call):
        return Call(expr.func, children, expr.dtype)
    if isinstance(expr, Select):
        return Select(children[0], children[1], children[2])
    if isinstance(expr, Cast):
        return Cast(expr.dtype, children[0])
    if isinstance(expr, TensorRead):
        return TensorRead(expr.tensor, children)
    if isinstance(expr, Reduce):
        where = children[1] if len(children) > 1 else None
        return Reduce(expr.combiner, children[0], expr.axes, where)
    if hasattr(expr, "rebuild"):
        return expr.rebuild(children)  # type: ignore[attr-defined]
    return expr


def transform(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rewrite: `fn(node)` returns a replacement, or None to keep the node."""
    memo: dict[int, Expr] = {}

    def go(node: Expr) -> Expr:
        key = id(node)
        if key in memo:
            return memo[key]
        kids = node.children()
        if kids:
            new_kids = [go(c) for c in kids]
            for n, o in zip(new_kids, kids):
                if n is not o:
                    node = rebuild(node, new_kids)
                    break
        out = fn(node)
        result = node if out is None else out
        memo[key] = result
        return result

    try:
        return go(expr)
    finally:
        go = None  # noqa: F841 - a recursive closure refers to itself: free it now, not at GC


def substitute(expr: Expr, mapping: dict[Var, Expr]) -> Expr:
    """Replace variables (matched by identity) with expressions."""
    if not mapping:
        return expr
    return transform(expr, lambda n: mapping.get(n) if isinstance(n, Var) else None)


def free_vars(expr: Expr) -> list[Var]:
    """Variables an expression reads that no reduction inside it binds, in first-use order."""
    seen: dict[int, Var] = {}
    bound: set[int] = set()
    for node in walk(expr):
        if isinstance(node, Reduce):
            bound.update(id(a) for a in node.axes)
        if isinstance(node, Var):
            seen.setdefault(id(node), node)
    return [v for k, v in seen.items() if k not in bound]


def tensors_read(expr: Expr) -> list:
    """Tensors read by an expression, in first-use order, without repeats."""
    out, seen = [], set()
    for node in walk(expr):
        if isinstance(node, TensorRead) and id(node.tensor) not in seen:
            seen.add(id(node.tensor))
            out.append(node.tensor)
    return out


# ---------------------------------------------------------------------------------------------
# text: here rather than in a module of its own because every node's repr uses it

_PREC = {"or": 1, "and": 2, "cmp": 3, "+": 4, "-": 4, "*": 5, "/": 5, "//": 5, "%": 5}


def _const_str(c: Const) -> str:
    if c.dtype == "bool":
        return "True" if c.value else "False"
    if is_float(c.dtype):
        v = c.value
        if math.isinf(v):
            return "-inf" if v < 0 else "inf"
        return repr(float(v))
    return str(c.value)


def expr_to_str(expr: Expr, name_of=None) -> str:
    """Infix rendering; `name_of(tensor_or_buffer)` may rename tensors."""

    def nm(t) -> str:
        return name_of(t) if name_of is not None else t.name

    def go(e: Expr, parent: int) -> str:
        if isinstance(e, Const):
            return _const_str(e)
        if isinstance(e, Var):
            return e.name
        if isinstance(e, BinOp):
            if e.op in ("min", "max"):
                return f"{e.op}({go(e.a, 0)}, {go(e.b, 0)})"
            p = _PREC[e.op]
            s = f"{go(e.a, p)} {e.op} {go(e.b, p + 1)}"
            return f"({s})" if p < parent else s
        if isinstance(e, Compare):
            p = _PREC["cmp"]
            s = f"{go(e.a, p + 1)} {e.op} {go(e.b, p + 1)}"
            return f"({s})" if p < parent else s
        if isinstance(e, Logical):
            if e.op == "not":
                return f"not {go(e.args[0], 9)}"
            p = _PREC[e.op]
            s = f" {e.op} ".join(go(a, p) for a in e.args)
            return f"({s})" if p < parent else s
        if isinstance(e, Call):
            return f"{e.func}({', '.join(go(a, 0) for a in e.args)})"
        if isinstance(e, Select):
            return f"select({go(e.cond, 0)}, {go(e.a, 0)}, {go(e.b, 0)})"
        if isinstance(e, Cast):
            return f"{e.dtype}({go(e.value, 0)})"
        if isinstance(e, TensorRead):
            return f"{nm(e.tensor)}[{', '.join(go(i, 0) for i in e.indices)}]"
        if isinstance(e, Reduce):
            axes = ", ".join(a.name for a in e.axes)
            where = "" if e.where is None else f", where={go(e.where, 0)}"
            return f"{e.combiner}({go(e.source, 0)}, axis=[{axes}]{where})"
        if hasattr(e, "to_str"):
            return e.to_str(lambda x: go(x, 0))  # type: ignore[attr-defined]
        return f"<{type(e).__name__}>"

    try:
        return go(expr, 0)
    finally:
        go = None  # noqa: F841 - a recursive closure refers to itself: free it now, not at GC
