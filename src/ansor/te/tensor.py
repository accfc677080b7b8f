"""Tensors and the operations that define them: placeholder (an input) and compute."""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import numpy as np

from ansor.te import expr as E
from ansor.te.arith import const_bounds


class Tensor:
    """The output of an operation; `tensor[i, j]` reads it inside a compute declaration.

    Made by `placeholder` and `compute` (and the operators of `te.ops`), not by hand. Indexing
    takes one integer expression per dimension; slices are refused, and a constant index out
    of range raises IndexError at once.
    """

    def __init__(self, op: "Operation"):
        self.op = op

    @property
    def name(self) -> str:
        """The name given at declaration (stage names, kernel arguments and messages use it)."""
        return self.op.name

    @property
    def shape(self) -> tuple[int, ...]:
        """The extent of each dimension."""
        return self.op.shape

    @property
    def dtype(self) -> str:
        """The element type: one of `ansor.te.dtypes.DTYPES` ("float32", "bfloat16", "int8", ...)."""
        return self.op.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    def __getitem__(self, indices) -> E.TensorRead:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != len(self.shape):
            raise IndexError(
                f"tensor {self.name!r} has {len(self.shape)} dimensions {self.shape}, "
                f"but was indexed with {len(indices)} indices"
            )
        exprs = []
        for dim, idx in enumerate(indices):
            if isinstance(idx, slice):
                raise IndexError(f"tensor {self.name!r}: slices are not supported (dimension {dim})")
            e = E.as_expr(idx)
            if not E.is_int(e.dtype):
                raise TypeError(
                    f"tensor {self.name!r}, dimension {dim}: index must be an integer "
                    f"expression, got dtype {e.dtype}"
                )
            if isinstance(e, E.Const) and not 0 <= e.value < self.shape[dim]:
                raise IndexError(
                    f"tensor {self.name!r}, dimension {dim}: constant index {e.value} is out "
                    f"of range [0, {self.shape[dim]})"
                )
            exprs.append(e)
        return E.TensorRead(self, exprs)

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, shape={self.shape}, dtype={self.dtype})"

    __hash__ = object.__hash__


class Operation:
    """What defines a tensor: an input (`PlaceholderOp`) or a computation (`ComputeOp`)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def input_tensors(self) -> list[Tensor]:
        """The tensors this operation reads (none for an input)."""
        return []


class PlaceholderOp(Operation):
    """An input of the computation. A `constant` input (a layer's weight) keeps its value from
    call to call, so work that depends on it alone (copying it into a tiled layout) can run once,
    ahead of the calls, instead of in every call."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str, constant: bool = False):
        self.name, self.shape, self.dtype, self.constant = name, shape, dtype, constant


class ComputeOp(Operation):
    """out[axes] = body, where body may be one reduction over reduce axes."""

    def __init__(self, name: str, axes: Sequence[E.IterVar], body: E.Expr, tag: str = "",
                 attrs: dict | None = None):
        self.name = name
        self.axes = tuple(axes)
        self.body = body
        self.tag = tag
        self.attrs = dict(attrs or {})
        self.shape = tuple(a.extent for a in self.axes)
        self.dtype = body.dtype

    @property
    def reduce_axes(self) -> tuple[E.IterVar, ...]:
        """The axes of the body's reduction; empty when the body is not a reduction."""
        return self.body.axes if isinstance(self.body, E.Reduce) else ()

    def input_tensors(self) -> list[Tensor]:
        """The tensors the body reads, in first-use order, without repeats."""
        return E.tensors_read(self.body)


def _check_shape(shape, what: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(f"{what}: shape must be a tuple of positive integers, got {shape!r}") from None
    for dim, n in enumerate(shape):
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n <= 0:
            raise ValueError(f"{what}: dimension {dim} must be a positive integer, got {n!r}")
    return tuple(int(n) for n in shape)


def placeholder(shape, dtype: str = "float32", name: str = "placeholder", constant: bool = False) -> Tensor:
    """An input tensor of the given shape and dtype; `constant=True` declares a weight whose
    layout transforms may be computed once, ahead of the kernel's calls."""
    shape = _check_shape(shape, f"placeholder {name!r}")
    return Tensor(PlaceholderOp(name, shape, E.check_dtype(dtype), bool(constant)))


def reduce_axis(dom, name: str = "k") -> E.IterVar:
    """A reduction axis over `extent` or over `(lo, hi)`."""
    if isinstance(dom, (tuple, list)):
        if len(dom) != 2:
            raise ValueError(f"reduce_axis {name!r}: give an extent or a (lo, hi) pair")
        lo, hi = int(dom[0]), int(dom[1])
        if hi <= lo:
            raise ValueError(f"reduce_axis {name!r}: empty range ({lo}, {hi})")
        return E.IterVar(name, hi - lo, "reduce", lo)
    return E.IterVar(name, dom, "reduce")


def _axis_names(fcompute: Callable, ndim: int) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        params = []
    if params and params[0].kind == inspect.Parameter.VAR_POSITIONAL:
        return [f"i{d}" for d in range(ndim)]
    params = [p for p in params if p.default is inspect.Parameter.empty
              and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if len(params) != ndim:
        raise TypeError(
            f"the compute function takes {len(params)} arguments but the shape has {ndim} "
            f"dimensions"
        )
    return [p.name for p in params]


def compute(shape, fcompute: Callable, name: str = "compute", tag: str = "",
            attrs: dict | None = None) -> Tensor:
    """Declare out[i, j, ...] = fcompute(i, j, ...) over `shape`."""
    what = f"compute {name!r}"
    shape = _check_shape(shape, what)
    names = _axis_names(fcompute, len(shape))
    axes = [E.IterVar(n, ext, "spatial") for n, ext in zip(names, shape)]
    body = E.as_expr(fcompute(*axes))
    _validate_body(what, body, axes)
    return Tensor(ComputeOp(name, axes, body, tag, attrs))


def _validate_body(what: str, body: E.Expr, axes: list[E.IterVar]) -> None:
    """Reject misdeclared computes now, with the tensor and dimension named, not at run time."""
    for node in E.walk(body):
        if isinstance(node, E.Reduce) and node is not body:
            raise ValueError(
                f"{what}: a reduction must be the whole body of its compute; apply further "
                f"operations (e.g. adding a bias) in a following compute"
            )
    if body.dtype == "bool":
        raise TypeError(f"{what}: the body is a condition (bool); cast it or use if_then_else")
    allowed = {id(a) for a in axes}
    reduce_axes = body.axes if isinstance(body, E.Reduce) else ()
    allowed.update(id(a) for a in reduce_axes)
    names = [a.name for a in axes] + [a.name for a in reduce_axes]
    if len(set(names)) != len(names):
        raise ValueError(f"{what}: axis names must be distinct, got {names}")
    for v in E.free_vars(body):
        if id(v) not in allowed:
            kind = "reduce axis" if isinstance(v, E.IterVar) and v.kind == "reduce" else "variable"
            raise ValueError(
                f"{what}: uses {kind} {v.name!r}, which is neither one of its axes nor an axis "
                f"of its reduction"
            )
    ranges = {id(a): (a.lo, a.lo + a.extent - 1) for a in list(axes) + list(reduce_axes)}
    _check_reads_in_bounds(what, body, ranges)


def _check_reads_in_bounds(what: str, expr: E.Expr, ranges: dict) -> None:
    """Every read not guarded by if_then_else must stay inside the tensor it reads."""
    if isinstance(expr, E.Select):
        _check_reads_in_bounds(what, expr.cond, ranges)
        return  # branches are guarded by the condition; they are checked at run time by design
    if isinstance(expr, E.Reduce) and expr.where is not None:
        _check_reads_in_bounds(what, expr.where, ranges)
        return
    if isinstance(expr, E.TensorRead):
        for dim, idx in enumerate(expr.indices):
            lo, hi = const_bounds(idx, ranges)
            if lo < 0 or hi >= expr.tensor.shape[dim]:
                raise IndexError(
                    f"{what}: reads tensor {expr.tensor.name!r} out of bounds in dimension {dim}: "
                    f"index {idx!r} ranges over [{lo}, {hi}] but the extent is "
                    f"{expr.tensor.shape[dim]} (guard it with te.if_then_else)"
                )
    for child in expr.children():
        _check_reads_in_bounds(what, child, ranges)
