"""Next-task prefetch: a register tile that re-reads a panel of a kernel parameter fetches, while
it works, the panel that the same thread's next parallel task will read.

A GEMM blocked for the caches (the linears of a transformer) runs each parallel task over one
panel of packed weights, and sweeps its row tiles over that panel:

    parallel p:                      one task per column panel
      for r in 0..R:                 row tiles: the panel is read R times
        register tile over k:        W[p * S + k * 48 + v]  (S: the panel's elements)

The first sweep reads the panel from memory, the other R - 1 from L2. In a model the weights
are cold (each layer's weights pass through the caches once a call), and that first sweep waits
on memory at 16 bytes a cycle for every 8x48 tile, several times what one core can pull from
DRAM (BENCHMARKS.md: a BERT layer's linears, cold against warm). Hardware prefetchers follow
the stream being read, not the next task's. So the tile issues one
software prefetch per iteration of its innermost kept loop, walking the next task's panel
(`p + 1`, the thread's next task under OpenMP's static schedule) at the pace that covers it
by the end of the current task: the panel arrives in L2 while the current one is computed.

Only a float vector tile's panel that qualifies gets one (`plan_prefetch`; the tiles of the
dot-product instructions, int8 and bf16, get none yet): its offset depends on the parallel
variable (in any form: a fused loop's `p % C` selects column panels) and is linear in the
task's own loops and dense over them (the task reads a block of S contiguous elements, which
the offset with `p + 1` and those loops at 0 starts the next one of), re-read at least twice a
task (else the stream prefetcher suffices), at least `MIN_PANEL_BYTES`, and coverable with at
most `MAX_PREFETCHES` prefetches an iteration. A prefetch never faults and changes no value;
`p + 1` is clamped to the last task, and the walk to the panel, so no address past the buffer
is formed.
"""

from __future__ import annotations

import dataclasses
import math

from ansor.lower import ir
from ansor.lower.register_tile import index_coefficient, load_offset, loads_in
from ansor.lower.rewrite import StmtRewriter
from ansor.te import expr as E
from ansor.te.arith import simplify

MIN_PANEL_BYTES = 32 * 1024  # a smaller panel stays in the caches between calls anyway
MAX_PREFETCHES = 4           # prefetches per iteration of the tile's innermost kept loop
CACHE_LINE = 64
PARAMETER_ROLES = ("input", "packed")  # buffers a kernel reads that its caller filled


def plan_prefetch(tile: ir.RegisterTile, parallel: ir.For, path: list[ir.For],
                  ranges: dict) -> tuple[tuple[ir.Buffer, E.Expr], ...]:
    """(buffer, element offset) pairs to prefetch once per innermost kept iteration of `tile`,
    which runs inside `parallel` under the loops `path` (outermost first); empty when no
    operand qualifies (see the module docstring)."""
    if tile.instruction is not None or tile.amx is not None or tile.kept <= tile.outer:
        return ()
    loops = tile.loops()
    walked = [*path, *loops[:tile.kept]]  # the loops one task iterates, outermost first
    iterations = math.prod(f.extent for f in walked)
    scope = dict(ranges)
    for f in [parallel, *path, *loops]:
        scope[id(f.var)] = (0, f.extent - 1)
    store = loops[-1].body
    out: list[tuple[ir.Buffer, E.Expr]] = []
    seen: set[int] = set()
    for load in loads_in(store.value):
        buf = load.buffer
        if buf.role not in PARAMETER_ROLES or id(buf) in seen:
            continue
        offset = load_offset(load, scope)
        if not any(v is parallel.var for v in E.free_vars(offset)):
            continue  # every task reads the same elements
        coefficients = [(f, index_coefficient(offset, f.var)) for f in [*path, *loops]]
        if any(c is None or c < 0 for _, c in coefficients):
            continue
        spanned = [(f, c) for f, c in coefficients if c]
        panel = math.prod(f.extent for f, _ in spanned)
        dense = sum(c * (f.extent - 1) for f, c in spanned) + 1 == panel
        rereads = math.prod(f.extent for f, c in coefficients if c == 0 and f in walked)
        if not dense or rereads < 2 or panel * E.DTYPE_BYTES[buf.dtype] < MIN_PANEL_BYTES:
            continue
        step = -(-panel // iterations)  # elements of the next panel per iteration
        per_line = CACHE_LINE // E.DTYPE_BYTES[buf.dtype]
        count = -(-step // per_line)
        if count > MAX_PREFETCHES:
            continue
        seen.add(id(buf))
        zero = E.Const(0, "int32")
        following = E.minimum(parallel.var + 1, E.Const(parallel.extent - 1, "int32"))
        start = E.substitute(offset, {parallel.var: following, **{f.var: zero for f in [*path, *loops]}})
        progress: E.Expr = zero
        for f in walked:
            progress = progress * f.extent + f.var
        last = E.Const(panel - 1, "int32")
        for line in range(count):  # within the next panel: past the last task's, no address is formed
            out.append((buf, simplify(start + E.minimum(progress * step + line * per_line, last), scope)))
    return tuple(out)


class _NextTaskPrefetch(StmtRewriter):
    def __init__(self) -> None:
        super().__init__()
        self.parallel: ir.For | None = None
        self.path: list[ir.For] = []

    def stmt(self, s: ir.Stmt) -> ir.Stmt:
        if type(s) is ir.RegisterTile and self.parallel is not None:
            prefetches = plan_prefetch(s, self.parallel, self.path, self.ranges)
            if prefetches:
                return dataclasses.replace(s, prefetches=prefetches)
            return s
        return super().stmt(s)

    def loop(self, s: ir.For) -> ir.Stmt:
        if self.parallel is None and s.kind == "parallel":
            self.parallel = s
            try:
                return super().loop(s)
            finally:
                self.parallel = None
        if self.parallel is None:
            return super().loop(s)
        self.path.append(s)
        try:
            return super().loop(s)
        finally:
            self.path.pop()


def prefetch_next_tasks(func: ir.PrimFunc) -> ir.PrimFunc:
    """`func` with next-task prefetches on the register tiles that qualify."""
    return _NextTaskPrefetch().apply(func)
