"""Readable text for expressions (used by repr, schedule printing and error messages)."""

from __future__ import annotations

import math

from ansor.te import expr as E

_PREC = {"or": 1, "and": 2, "cmp": 3, "+": 4, "-": 4, "*": 5, "/": 5, "//": 5, "%": 5}


def _const_str(c: E.Const) -> str:
    if c.dtype == "bool":
        return "True" if c.value else "False"
    if E.is_float(c.dtype):
        v = c.value
        if math.isinf(v):
            return "-inf" if v < 0 else "inf"
        return repr(float(v))
    return str(c.value)


def expr_to_str(expr: E.Expr, name_of=None) -> str:
    """Infix rendering; `name_of(tensor_or_buffer)` may rename tensors."""

    def nm(t) -> str:
        return name_of(t) if name_of is not None else t.name

    def go(e: E.Expr, parent: int) -> str:
        if isinstance(e, E.Const):
            return _const_str(e)
        if isinstance(e, E.Var):
            return e.name
        if isinstance(e, E.BinOp):
            if e.op in ("min", "max"):
                return f"{e.op}({go(e.a, 0)}, {go(e.b, 0)})"
            p = _PREC[e.op]
            s = f"{go(e.a, p)} {e.op} {go(e.b, p + 1)}"
            return f"({s})" if p < parent else s
        if isinstance(e, E.Compare):
            p = _PREC["cmp"]
            s = f"{go(e.a, p + 1)} {e.op} {go(e.b, p + 1)}"
            return f"({s})" if p < parent else s
        if isinstance(e, E.Logical):
            if e.op == "not":
                return f"not {go(e.args[0], 9)}"
            p = _PREC[e.op]
            s = f" {e.op} ".join(go(a, p) for a in e.args)
            return f"({s})" if p < parent else s
        if isinstance(e, E.Call):
            return f"{e.func}({', '.join(go(a, 0) for a in e.args)})"
        if isinstance(e, E.Select):
            return f"select({go(e.cond, 0)}, {go(e.a, 0)}, {go(e.b, 0)})"
        if isinstance(e, E.Cast):
            return f"{e.dtype}({go(e.value, 0)})"
        if isinstance(e, E.TensorRead):
            return f"{nm(e.tensor)}[{', '.join(go(i, 0) for i in e.indices)}]"
        if isinstance(e, E.Reduce):
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
