"""The walk that lowering passes share: rebuild a function's statements where a pass replaces
some, keep every untouched subtree as it is (the same objects)."""

from __future__ import annotations

from ansor.lower import ir


class StmtRewriter:
    """Visits statements in program order, with the range of every loop variable met so far
    (as a code generator meets them), and rebuilds only the paths to replaced statements.
    Subclasses override `loop` or `allocate`; nodes a pass made are left alone."""

    def __init__(self) -> None:
        self.ranges: dict[int, tuple[int, int]] = {}

    def stmt(self, s: ir.Stmt) -> ir.Stmt:
        t = type(s)
        if t is ir.For:
            return self.loop(s)
        if t is ir.Seq:
            stmts = [self.stmt(x) for x in s.stmts]
            return s if all(a is b for a, b in zip(stmts, s.stmts)) else ir.Seq(stmts)
        if t is ir.IfThenElse:
            then = self.stmt(s.then)
            orelse = self.stmt(s.orelse) if s.orelse is not None else None
            return s if then is s.then and orelse is s.orelse else ir.IfThenElse(s.cond, then, orelse)
        if t is ir.Allocate:
            return self.allocate(s)
        return s

    def loop(self, s: ir.For) -> ir.Stmt:
        self.ranges[id(s.var)] = (0, s.extent - 1)
        body = self.stmt(s.body)
        return s if body is s.body else ir.For(s.var, s.extent, s.kind, body, s.unroll_hint)

    def allocate(self, s: ir.Allocate) -> ir.Stmt:
        body = self.stmt(s.body)
        return s if body is s.body else ir.Allocate(s.buffer, body)

    def apply(self, func: ir.PrimFunc) -> ir.PrimFunc:
        """`func` rewritten, and its prepack function after it (in the order they are printed)."""
        body = self.stmt(func.body)
        attrs = func.attrs
        prepack = attrs.get("prepack")
        if prepack is not None:
            packed = self.apply(prepack)
            if packed is not prepack:
                attrs = {**attrs, "prepack": packed}
        if body is func.body and attrs is func.attrs:
            return func
        return ir.PrimFunc(func.name, func.params, body, attrs)


def flat_seq(stmt: ir.Stmt) -> list[ir.Stmt]:
    """The statements of nested sequences, in order."""
    if type(stmt) is not ir.Seq:
        return [stmt]
    out: list[ir.Stmt] = []
    for x in stmt.stmts:
        out.extend(flat_seq(x))
    return out


def map_children(stmt: ir.Stmt, fn) -> ir.Stmt:
    """`stmt` with `fn` applied to each statement directly inside it (a loop's or an
    allocation's body, a sequence's items, both branches of an `if`); other nodes as they are.
    The one place a recursive pass spells out how each node is rebuilt."""
    t = type(stmt)
    if t is ir.For:
        return ir.For(stmt.var, stmt.extent, stmt.kind, fn(stmt.body), stmt.unroll_hint)
    if t is ir.Seq:
        return ir.Seq([fn(s) for s in stmt.stmts])
    if t is ir.Allocate:
        return ir.Allocate(stmt.buffer, fn(stmt.body))
    if t is ir.IfThenElse:
        return ir.IfThenElse(stmt.cond, fn(stmt.then), fn(stmt.orelse) if stmt.orelse is not None else None)
    return stmt
