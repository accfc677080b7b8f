"""Kernels of little work run on the calling thread: their parallel loops become serial loops.

A parallel loop forks and joins the OpenMP team. That costs microseconds while the other
threads spin, but in a model whose other kernels are serial (a decoding step: projections of
one row) they have gone to sleep, and waking them on a busy machine waits for a scheduler
slice: milliseconds, for a kernel that one core runs in tens of microseconds. The search
measures a kernel called back to back, with its threads awake, so it cannot see that cost;
this CPU pass removes it where the gain was small anyway: a kernel whose statements run fewer
than `MIN_PARALLEL_ITERATIONS` times in all keeps its loops but runs them on one thread.
"""

from __future__ import annotations

from ansor.lower import ir
from ansor.lower.rewrite import StmtRewriter

#: Statement executions (iterations of the innermost loops, summed over the nests) below which
#: a kernel's parallel loops run serially: a quarter million, tens of microseconds on one core
#: (a decoding step's 256 x 768 projection is 0.2 million and stays serial; its 256 x 8192 head,
#: 2 million, is shared). At 4 million a CNN's Winograd transforms and pooling ran on one core
#: (BENCHMARKS-history.md, 2026-11-27).
MIN_PARALLEL_ITERATIONS = 1 << 18


def iterations(stmt: ir.Stmt) -> int:
    """How many times the statements of `stmt` run (a branch counts as its longer arm); a
    statement this pass does not know counts as `MIN_PARALLEL_ITERATIONS` (never small)."""
    t = type(stmt)
    if t is ir.Store or t is ir.Barrier:
        return 1
    if t is ir.For:
        return stmt.extent * iterations(stmt.body)
    if t is ir.Seq:
        return sum(iterations(s) for s in stmt.stmts)
    if t is ir.Allocate:
        return iterations(stmt.body)
    if t is ir.IfThenElse:
        return max(iterations(stmt.then), iterations(stmt.orelse) if stmt.orelse is not None else 0)
    return MIN_PARALLEL_ITERATIONS


class _Serial(StmtRewriter):
    def loop(self, s: ir.For) -> ir.Stmt:
        body = self.stmt(s.body)
        if s.kind == "parallel":
            return ir.For(s.var, s.extent, "serial", body, s.unroll_hint)
        return s if body is s.body else ir.For(s.var, s.extent, s.kind, body, s.unroll_hint)


def serial_small_kernels(func: ir.PrimFunc) -> ir.PrimFunc:
    """`func` with its parallel loops serial when it does little work, else `func` itself."""
    if iterations(func.body) >= MIN_PARALLEL_ITERATIONS:
        return func
    body = _Serial().stmt(func.body)
    return func if body is func.body else ir.PrimFunc(func.name, func.params, body, func.attrs)
