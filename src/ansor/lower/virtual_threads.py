"""Virtual threads injected into the statements of one thread (TVM's "inject virtual thread").

A loop bound to `vthread` splits a block's tile into V interleaved sub-tiles that one thread
computes. Run as a serial loop, each virtual thread repeats the whole reduction, with its
shared-memory fills and barriers: V times the fills, and one sub-tile's accumulators live at a
time. Injected, the loop disappears: statements that do not depend on it (the cooperative
fetches, the barriers, the reduction loops) run once, and each statement that does (an update
of the accumulators, their initialization and write-back) becomes an unrolled loop of V copies
at the innermost level, so the V sub-tiles are one register tile fed by one fill.

Moving the virtual-thread loop inward is legal when its iterations are independent: each writes
its own accumulators (the thread's private arrays allocated inside it, which get a leading
dimension of V) and its own outputs, and what does not depend on it is a fill that writes the
same values whichever virtual thread runs it. Anything else (a barrier of a cross-thread
reduction, a shared update that reads what it writes) leaves the loop serial.
"""

from __future__ import annotations

from ansor.lower import ir
from ansor.lower.rewrite import map_children
from ansor.te import expr as E


class _NotInjectable(Exception):
    """The loop's iterations are not independent in the way injection needs."""


def inject_virtual_threads(stmt: ir.Stmt) -> ir.Stmt:
    """`stmt` with every injectable vthread loop injected (innermost loops first)."""
    if type(stmt) is ir.For and stmt.kind == "vthread":
        body = inject_virtual_threads(stmt.body)
        try:
            return _Injector(stmt.var, stmt.extent).stmt(body)
        except _NotInjectable:
            return ir.For(stmt.var, stmt.extent, stmt.kind, body, stmt.unroll_hint)
    return map_children(stmt, inject_virtual_threads)


class _Injector:
    def __init__(self, var: E.Var, extent: int) -> None:
        self.var, self.extent = var, extent

    # --- what depends on the virtual thread ------------------------------------------------------
    def _expr_depends(self, e: E.Expr) -> bool:
        return any(v is self.var for v in E.free_vars(e))

    def _depends(self, s: ir.Stmt) -> bool:
        t = type(s)
        if t is ir.Store:
            return any(self._expr_depends(e) for e in (*s.indices, s.value))
        if t is ir.Barrier:
            return False
        if t is ir.IfThenElse:
            return self._expr_depends(s.cond) or any(self._depends(c) for c in (s.then, s.orelse) if c is not None)
        if t in (ir.For, ir.Allocate):
            return self._depends(s.body)
        if t is ir.Seq:
            return any(self._depends(c) for c in s.stmts)
        raise _NotInjectable(f"statement {t.__name__}")

    # --- the rewrite ---------------------------------------------------------------------------
    def _wrap(self, s: ir.Stmt) -> ir.Stmt:
        return ir.For(self.var, self.extent, "unrolled", s)

    def stmt(self, s: ir.Stmt) -> ir.Stmt:
        t = type(s)
        if t is ir.Allocate and s.buffer.scope != "shared":
            old = s.buffer
            new = ir.Buffer(old.name, (self.extent, *old.shape), old.dtype, old.scope, old.role)
            return ir.Allocate(new, self.stmt(self._redirect(s.body, old, new)))
        if not self._depends(s):
            self._check_run_once(s)
            return s
        if t is ir.Store:
            return self._wrap(s)
        if t is ir.IfThenElse:
            if self._expr_depends(s.cond):
                if any(isinstance(x, ir.Barrier) for x in ir.walk_stmts(s)):
                    raise _NotInjectable("a barrier under a condition on the virtual thread")
                return self._wrap(s)
            return ir.IfThenElse(s.cond, self.stmt(s.then), self.stmt(s.orelse) if s.orelse is not None else None)
        if t in (ir.For, ir.Seq, ir.Allocate):
            return map_children(s, self.stmt)
        raise _NotInjectable(f"statement {t.__name__}")

    def _check_run_once(self, s: ir.Stmt) -> None:
        """A statement every virtual thread ran is run once: it must write shared memory only,
        without reading what it writes (a fill), or be a barrier or a loop of such."""
        for x in ir.walk_stmts(s):
            if type(x) is ir.Store:
                if x.buffer.scope != "shared":
                    raise _NotInjectable(f"{x.buffer.name} is written by every virtual thread alike")
                if any(isinstance(n, ir.BufferLoad) and n.buffer is x.buffer for n in E.walk(x.value)):
                    raise _NotInjectable(f"{x.buffer.name} is updated by every virtual thread")

    def _redirect(self, s: ir.Stmt, old: ir.Buffer, new: ir.Buffer) -> ir.Stmt:
        """Accesses of `old` in `s` as accesses of the virtual thread's slice of `new`."""
        def expr(e: E.Expr) -> E.Expr:
            return E.transform(e, lambda n: ir.BufferLoad(new, (self.var, *n.indices))
                               if isinstance(n, ir.BufferLoad) and n.buffer is old else None)

        def go(x: ir.Stmt) -> ir.Stmt:
            t = type(x)
            if t is ir.Store:
                buffer, indices = (new, (self.var, *x.indices)) if x.buffer is old else (x.buffer, x.indices)
                return ir.Store(buffer, tuple(expr(i) for i in indices), expr(x.value))
            if t is ir.IfThenElse:
                return ir.IfThenElse(expr(x.cond), go(x.then), go(x.orelse) if x.orelse is not None else None)
            if t in (ir.For, ir.Seq, ir.Allocate, ir.Barrier):
                return map_children(x, go)
            raise _NotInjectable(f"statement {t.__name__}")

        return go(s)
