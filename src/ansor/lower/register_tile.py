"""Register tiles: a small accumulator kept in vector variables across its reduction.

A cache-write stage (the `matmul.local` of a tiled GEMM) lowers to a small local array updated
inside the reduction loops:

    for k ...:                        loops that do not index the accumulator
      for i in 0..I (unrolled):       loops that do
        vectorize v in 0..W:
          L[c(i) + v] = L[c(i) + v] + A[.., k] * B[k, .. v]

Printed like that, gcc keeps `L` in memory (a load and a store around every FMA) and reads
each `B` vector again for every row it multiplies, as a memory operand of the FMA. On the CPU
this pass turns such a nest into an `ir.RegisterTile`: the accumulator vectors live in
variables across the `k` loops; the loops that index the accumulator are unrolled, one vector
statement per (point, vector chunk); each contiguous operand is loaded once per `k` iteration,
and one that feeds several statements is pinned to a register. Anything else (guards,
non-contiguous operands, a tile larger than the registers) keeps the plain loops.

Loops that index the accumulator may also sit between reduction loops (Ansor's SSRSRS tiling
with a middle spatial level: `for k0: for x: for k1: for i: vectorize v`). The loops down to
the last such one stay outside the tile (`outer`): each of their iterations loads the block of
the accumulator that the loops below update into registers, runs them, and stores it back. A
weight vector loaded in `k1` is then reused across `x` from the L1 cache while the tile stays
in registers, which is what keeps a convolution whose weights stream from memory busy.
"""

from __future__ import annotations

import itertools
from collections import Counter

from ansor.lower import ir
from ansor.lower.rewrite import StmtRewriter, flat_seq
from ansor.te import expr as E
from ansor.te.arith import Simplifier, simplify, to_linear
from ansor.te.printer import expr_to_str

MAX_VECTOR_STATEMENTS = 512  # unrolled statements per iteration of the kept loops
MIN_USES_TO_PIN = 3  # statements reading an operand vector before it is pinned to a register


def index_coefficient(expr: E.Expr, var: E.Var) -> int | None:
    """The coefficient of `var` in a linear index, None if `var` also sits inside a
    non-linear part (a div or mod)."""
    coef = 0
    stack = [(expr, 1)]
    while stack:  # the linear form of `arith.to_linear`, without building it (a hot path)
        node, scale = stack.pop()
        if node is var:
            coef += scale
            continue
        t = type(node)
        if t is E.BinOp and node.dtype in E.INT_DTYPES and node.op in _LINEAR_OPS:
            if node.op != "*":
                stack.append((node.a, scale))
                stack.append((node.b, scale if node.op == "+" else -scale))
            elif type(node.b) is E.Const:
                stack.append((node.a, scale * node.b.value))
            elif type(node.a) is E.Const:
                stack.append((node.b, scale * node.a.value))
            else:
                return _index_coefficient_of_form(expr, var)  # a product of sums: rare
        elif t is not E.Const and t is not E.Var and any(n is var for n in E.walk(node)):
            return None
    return coef


_LINEAR_OPS = ("+", "-", "*")


def _index_coefficient_of_form(expr: E.Expr, var: E.Var) -> int | None:
    lin = to_linear(expr)
    coef = 0
    for atom, c in lin.terms.values():
        if atom is var:
            coef = c
        elif any(n is var for n in E.walk(atom)):
            return None
    return coef


def load_offset(load: ir.BufferLoad, ranges: dict) -> E.Expr:
    """The simplified element offset a load reads."""
    return simplify(load.buffer.flat_index(load.indices), ranges)


def load_key(load: ir.BufferLoad, offset: E.Expr) -> tuple[int, str]:
    """Identifies a contiguous operand across the vector chunks of one step."""
    return id(load.buffer), expr_to_str(offset)


def loads_in(expr: E.Expr) -> list[ir.BufferLoad]:
    return [n for n in E.walk(expr) if isinstance(n, ir.BufferLoad)]


def _vectorizable(expr: E.Expr, vec_var: E.Var, offsets: dict[int, E.Expr]) -> bool:
    """Whether an added value can be written as vector arithmetic: +, -, * over loads that are
    contiguous in the vector variable or invariant in it, and anything else only where it does
    not depend on the vector variable (it stays scalar and is broadcast). `offsets`: each
    load's simplified element offset, by id."""
    if isinstance(expr, ir.BufferLoad):
        return index_coefficient(offsets[id(expr)], vec_var) in (0, 1)  # a broadcast or contiguous
    if isinstance(expr, E.BinOp) and expr.op in ("+", "-", "*"):
        return _vectorizable(expr.a, vec_var, offsets) and _vectorizable(expr.b, vec_var, offsets)
    return not any(n is vec_var for n in E.walk(expr))


def plan_register_tile(loop: ir.For, buf: ir.Buffer, vector_bytes: int, registers: int,
                       ranges: dict, analysis: bool = False) -> ir.RegisterTile | None:
    """The register tile for the reduction nest `loop` into the local buffer `buf`, or None
    where the nest does not have the shape (see the module docstring) or does not fit. With
    `analysis`, the tile as analyses read it: the same decision and loops, without the vector
    statements or pins (it is never printed)."""
    if buf.dtype != "float32" or vector_bytes < 16:
        return None
    lanes = vector_bytes // 4
    if buf.size % lanes:
        return None
    nest: list[ir.For] = []
    node: ir.Stmt = loop
    while isinstance(node, ir.For):
        nest.append(node)
        node = node.body
    store = node
    if not isinstance(store, ir.Store) or store.buffer is not buf or not nest:
        return None
    vec = nest[-1]
    if vec.kind != "vectorized" or vec.extent % lanes or any(f.kind in ("parallel", "vectorized") for f in nest[:-1]):
        return None
    value = store.value
    if not (isinstance(value, E.BinOp) and value.op == "+" and isinstance(value.a, ir.BufferLoad)
            and value.a.buffer is buf):
        return None
    added = value.b
    if any(ld.buffer is buf for ld in loads_in(added)):
        return None
    index = buf.flat_index(store.indices)
    index_vars = {id(v) for v in E.free_vars(index)}
    indexes = [id(f.var) in index_vars for f in nest[:-1]]
    # the whole accumulator in registers across the whole nest (loops between its rows
    # unrolled) where that fits; else the loops down to the last one that indexes the
    # accumulator above one that does not stay outside, and the tile is the block they select
    outer = max((p + 1 for p in range(len(indexes)) if indexes[p] and not all(indexes[p:])), default=0)
    for kept_outside in dict.fromkeys((0, outer)):
        tile = _plan(loop, nest, store, buf, index, indexes, kept_outside, lanes, registers, ranges, analysis)
        if tile is not None:
            return tile
    return None


def _plan(loop: ir.For, nest: list[ir.For], store: ir.Store, buf: ir.Buffer, index: E.Expr,
          indexes: list[bool], outer: int, lanes: int, registers: int, ranges: dict,
          analysis: bool = False) -> ir.RegisterTile | None:
    """`plan_register_tile` with the first `outer` loops of the nest outside the tile."""
    vec = nest[-1]
    value = store.value
    added = value.b
    split = next(p for p in range(outer, len(nest)) if p == len(nest) - 1 or indexes[p])
    kept, inner = nest[outer:split], nest[split:-1]
    count = 1
    for f in inner:
        count *= f.extent
    chunks = vec.extent // lanes
    if count * chunks > MAX_VECTOR_STATEMENTS:
        return None
    # vector variables the tile declares, live across the kept loops
    accumulators = buf.size // lanes if not outer else count * chunks
    if accumulators + 1 > registers:
        return None
    difference = to_linear(simplify(buf.flat_index(value.a.indices) - index, ranges))
    if difference.terms or difference.const:
        return None  # reads another element than it writes
    scope = dict(ranges)
    for f in nest[:split]:
        scope[id(f.var)] = (0, f.extent - 1)
    scope[id(vec.var)] = (0, vec.extent - 1)
    simplifier = Simplifier(scope)  # the points share most of their subexpressions
    # where the tile is the whole accumulator its vectors are numbered from element 0, as ever
    base = (simplifier.simplify(E.substitute(index, {f.var: E.Const(0, "int32") for f in [*inner, vec]}))
            if outer else E.Const(0, "int32"))
    base_form = to_linear(base)
    if base_form.const % lanes or any(c % lanes for _, c in base_form.terms.values()):
        return None  # the block must start on a vector boundary for every outer iteration
    updates: list[tuple[int, E.Expr, int]] = []
    slot_of: dict[int, int] = {}  # with outer loops: the block's vectors by element offset from `base`
    uses: Counter = Counter()  # statements per chunk that read each contiguous operand
    operands = _Operands(added, inner, vec.var, simplifier) if analysis else None
    for values in itertools.product(*(range(f.extent) for f in inner)):
        binding = {f.var: E.Const(v, "int32") for f, v in zip(inner, values)}
        if operands is not None:
            point_value = None
            keys = operands.at(values, binding)
            if keys is None:
                return None
            uses.update(keys)
        else:
            point_value = E.substitute(added, binding)
            loads = loads_in(point_value)
            offsets = {id(ld): simplifier.simplify(ld.buffer.flat_index(ld.indices)) for ld in loads}
            if not _vectorizable(point_value, vec.var, offsets):
                return None
            uses.update({load_key(ld, offsets[id(ld)]) for ld in loads if index_coefficient(offsets[id(ld)], vec.var) == 1})
        for c in range(chunks):
            at = to_linear(simplifier.simplify(E.substitute(index, {**binding, vec.var: E.Const(c * lanes, "int32")}))
                           - base)
            if at.terms or at.const % lanes or not (outer or 0 <= at.const < accumulators * lanes):
                return None  # the accumulator element must be a fixed, aligned vector of the block
            slot = slot_of.setdefault(at.const, len(slot_of)) if outer else at.const // lanes
            updates.append((slot, point_value, c * lanes))
        if accumulators + len(uses) * chunks + 1 > registers:
            return None  # the operands only grow: it will not fit
    # a pin pays where a vector feeds several FMAs; pinning many vectors that feed one or two
    # made gcc spill accumulators inside nested reduction loops instead
    pinned = frozenset(key for key, n in uses.items() if n >= MIN_USES_TO_PIN)
    offsets = tuple(slot_of) if outer else tuple(range(0, accumulators * lanes, lanes))
    return ir.RegisterTile(buf, loop, lanes, split, tuple(updates), pinned, outer, base, offsets)


class _Operands:
    """The loads of a tile's added value at each point of its unrolled loops, for analyses:
    each load's offset is simplified once per binding of the unrolled loop variables it reads
    (a weight row that one loop does not move is not simplified again at each of its points).
    Gives what `_plan` derives from the point's substituted value, the same offsets and keys."""

    def __init__(self, added: E.Expr, inner: list[ir.For], vec_var: E.Var, simplifier: Simplifier):
        self.added, self.vec_var, self.simplifier = added, vec_var, simplifier
        self.loads = list(dict.fromkeys(loads_in(added)))  # each load object once
        positions = {id(f.var): p for p, f in enumerate(inner)}
        self.reads = [sorted({positions[id(v)] for v in E.free_vars(ld) if id(v) in positions})
                      for ld in self.loads]
        self.memo: dict[tuple, tuple[E.Expr, int | None, tuple]] = {}
        self.vectorizable: dict[tuple, bool] = {}  # by the loads' coefficients of the vector variable

    def at(self, values: tuple[int, ...], binding: dict) -> set | None:
        """The keys of the contiguous operands at one point; None where the point's value is
        not vector arithmetic."""
        offsets: dict[int, E.Expr] = {}
        coefficients = []
        keys = set()
        for n, (ld, reads) in enumerate(zip(self.loads, self.reads)):
            key = (n, *[values[p] for p in reads])
            known = self.memo.get(key)
            if known is None:
                point = E.substitute(ld, binding) if reads else ld
                offset = self.simplifier.simplify(point.buffer.flat_index(point.indices))
                known = self.memo[key] = (offset, index_coefficient(offset, self.vec_var), load_key(point, offset))
            offsets[id(ld)] = known[0]
            coefficients.append(known[1])
            if known[1] == 1:
                keys.add(known[2])
        # whether the value is vector arithmetic depends on its loads only through these
        shape = tuple(coefficients)
        ok = self.vectorizable.get(shape)
        if ok is None:
            ok = self.vectorizable[shape] = _vectorizable(self.added, self.vec_var, offsets)
        return keys if ok else None


class _RegisterTiles(StmtRewriter):
    """Finds the update nests directly inside the allocation of a local accumulator."""

    def __init__(self, vector_bytes: int, vector_registers: int, analysis: bool = False):
        super().__init__()
        self.vector_bytes = vector_bytes
        self.vector_registers = vector_registers
        self.analysis = analysis

    def allocate(self, s: ir.Allocate) -> ir.Stmt:
        if s.buffer.scope != "local":
            return super().allocate(s)
        parts = flat_seq(s.body)
        out = []
        for part in parts:
            tile = None
            if type(part) is ir.For:
                tile = plan_register_tile(part, s.buffer, self.vector_bytes, self.vector_registers, self.ranges,
                                          self.analysis)
            out.append(tile if tile is not None else self.stmt(part))
        if all(a is b for a, b in zip(out, parts)):
            return s
        return ir.Allocate(s.buffer, out[0] if len(out) == 1 else ir.Seq(out))


def form_register_tiles(func: ir.PrimFunc, vector_bytes: int, vector_registers: int) -> ir.PrimFunc:
    """`func` (and its prepack function) with every accumulator nest that fits `vector_registers`
    registers of `vector_bytes` bytes made an `ir.RegisterTile`."""
    if vector_bytes < 16:
        return func
    return _RegisterTiles(vector_bytes, vector_registers).apply(func)


def form_register_tiles_for_analysis(func: ir.PrimFunc, vector_bytes: int, vector_registers: int) -> ir.PrimFunc:
    """`form_register_tiles` as analyses (the cost model's features) read it: the same tiles,
    with the same loops kept, but without their vector statements; never printed."""
    if vector_bytes < 16:
        return func
    return _RegisterTiles(vector_bytes, vector_registers, analysis=True).apply(func)
