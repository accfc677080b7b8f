"""Transposed stores: a tile vectorized along one axis written where another axis is contiguous.

A register tile of a convolution is vectorized along output channels, but an NCHW output is
contiguous along columns. Its write-back then lowers to

    for a in 0..A:                    coefficient 1 in the output index (contiguous)
      vectorize f in 0..F:            coefficient S > 1 (a stride of whole planes)
        OUT[base + f*S + a] = value(a, f)

which gcc writes as one scalar load and one scalar store per element. On the CPU this pass
turns such a nest into an `ir.TransposedStore`: `value` goes to a small contiguous buffer (or
is read in place when it is a plain load contiguous in f), vectors of L lanes along f are
transposed in registers by log2(A) rounds of two-input interleaves, and each f gets its A
values with one store of A floats.
"""

from __future__ import annotations

from ansor.lower import ir
from ansor.lower.rewrite import StmtRewriter
from ansor.lower.register_tile import index_coefficient
from ansor.te import expr as E
from ansor.te.arith import simplify


def plan_transposed_store(loop: ir.For, vector_bytes: int, ranges: dict) -> ir.TransposedStore | None:
    """The transposed store of `loop` when it has the shape in the module docstring, else None."""
    inner = loop.body
    if (type(inner) is not ir.For or inner.kind != "vectorized" or type(inner.body) is not ir.Store
            or loop.kind in ("parallel", "vectorized")):
        return None
    store = inner.body
    if store.buffer.dtype != "float32" or vector_bytes < 16:
        return None
    lanes = vector_bytes // 4
    if inner.extent % lanes:
        if inner.extent not in (4, 8) or inner.extent > lanes:
            return None
        lanes = inner.extent
    group = 1
    while group < lanes and loop.extent % (2 * group) == 0:
        group *= 2
    if group < 2:
        return None
    quick = _linear_coefficients(store, loop.var, inner.var)
    if quick is not None and (quick[0] != 1 or quick[1] < group):
        return None  # decided without simplifying the flat index (most loops end here)
    scope = {**ranges, id(loop.var): (0, loop.extent - 1), id(inner.var): (0, inner.extent - 1)}
    index = simplify(store.buffer.flat_index(store.indices), scope)
    stride = index_coefficient(index, inner.var)
    if index_coefficient(index, loop.var) != 1 or stride is None or stride < group:
        return None  # not contiguous in a, or the groups of different f would overlap
    loads = [n for n in E.walk(store.value) if isinstance(n, ir.BufferLoad)]
    if any(ld.buffer is store.buffer for ld in loads):
        return None
    a, f = loop.var, inner.var
    source, staging = None, None
    if isinstance(store.value, ir.BufferLoad):
        offset = simplify(store.value.buffer.flat_index(store.value.indices), scope)
        if index_coefficient(offset, f) == 1:
            source = store.value
    if source is None:  # the values are computed as before, into a contiguous buffer
        buffer = ir.Buffer(f"{store.buffer.name}_tr", (loop.extent, inner.extent), "float32", "local")
        staging = ir.Allocate(buffer, ir.For(a, loop.extent, "serial", ir.For(
            f, inner.extent, "vectorized", ir.Store(buffer, (a, f), store.value))))
        source = ir.BufferLoad(buffer, (a, f))
    write = ir.For(f, inner.extent, "serial", ir.For(a, loop.extent, "vectorized",
                                                      ir.Store(store.buffer, store.indices, source)))
    return ir.TransposedStore(loop, write, lanes, group, staging)


def _linear_coefficients(store: ir.Store, a: E.Var, f: E.Var) -> tuple[int, int] | None:
    """The coefficients of `a` and `f` in the store's flat index, read off its (simplified)
    indices where both appear only in linear terms, since simplifying the flat sum keeps those
    coefficients; None where one sits inside a non-linear part."""
    ca = cf = 0
    for index, stride in zip(store.indices, store.buffer.strides()):
        da, df = index_coefficient(index, a), index_coefficient(index, f)
        if da is None or df is None:
            return None
        ca += da * stride
        cf += df * stride
    return ca, cf


class _TransposedStores(StmtRewriter):
    """Tries every loop before entering it; register tiles are already vector code."""

    def __init__(self, vector_bytes: int):
        super().__init__()
        self.vector_bytes = vector_bytes

    def loop(self, s: ir.For) -> ir.Stmt:
        plan = plan_transposed_store(s, self.vector_bytes, self.ranges)
        return plan if plan is not None else super().loop(s)


def form_transposed_stores(func: ir.PrimFunc, vector_bytes: int) -> ir.PrimFunc:
    """`func` (and its prepack function) with every store nest that is contiguous along a
    loop outside its vectorized one made an `ir.TransposedStore` (for `vector_bytes` vectors)."""
    if vector_bytes < 16:
        return func
    return _TransposedStores(vector_bytes).apply(func)
