"""Dot-product tiles: a register tile whose updates are dot-product instructions.

A tiled int8 (or bfloat16) matmul's accumulator nest lowers, as a float32 one does, to

    for k ...:                        reduction loops; the innermost, `d`, is the depth loop
      for i in 0..I:                  loops that index the accumulator
        vectorize v in 0..W:
          L[c(i) + v] = L[c(i) + v] + cast(A[.., k]) * cast(P[.., k/4, v, k%4])

where P is the constant operand packed into the instruction's layout (`State.interleave_layout`).
Where the target has an instruction for the operand types (`ansor.instructions`), the depth
loop's extent is a multiple of its depth, A is contiguous along the depth loop and invariant
in the vector loop, and each vector chunk of P is `lanes x depth` contiguous elements, this
pass makes the nest an `ir.RegisterTile` carrying the instruction: the accumulator vectors in
variables across the reduction, one instruction per (point, chunk) and `depth` iterations of
the depth loop. Anything else keeps its loops (the widening loop: correct everywhere).
"""

from __future__ import annotations

import itertools

from ansor.instructions import AMX_STEPS, DotProductInstruction, amx_form, find_instruction
from ansor.lower import ir
from ansor.lower.register_tile import index_coefficient, loads_in
from ansor.lower.rewrite import StmtRewriter, flat_seq
from ansor.te import expr as E
from ansor.te.arith import Simplifier, simplify, to_linear

MAX_UPDATES = 256  # instructions per iteration of the depth loop


def product_operands(added: E.Expr, acc_dtype: str) -> tuple[ir.BufferLoad, ir.BufferLoad] | None:
    """(lhs load, rhs load) of `cast(lhs) * cast(rhs)` in `acc_dtype` (the widening product of
    two narrow operands), or None."""
    if not (isinstance(added, E.BinOp) and added.op == "*" and added.dtype == acc_dtype):
        return None
    loads = []
    for side in (added.a, added.b):
        while isinstance(side, E.Cast):
            side = side.value
        if not isinstance(side, ir.BufferLoad):
            return None
        loads.append(side)
    return loads[0], loads[1]


def operand_roles(added: E.Expr, acc_dtype: str, features: tuple[str, ...],
                  vector_bytes: int) -> tuple[DotProductInstruction, ir.BufferLoad, ir.BufferLoad] | None:
    """The instruction and its (broadcast, packed) loads for an added product, in either
    order of the factors."""
    pair = product_operands(added, acc_dtype)
    if pair is None:
        return None
    for lhs, rhs in (pair, pair[::-1]):
        ins = find_instruction(features, vector_bytes, lhs.dtype, rhs.dtype, acc_dtype)
        if ins is not None:
            return ins, lhs, rhs
    return None


def plan_dot_product_tile(loop: ir.For, buf: ir.Buffer, features: tuple[str, ...], vector_bytes: int,
                          registers: int, ranges: dict, enclosed: bool = False) -> ir.RegisterTile | None:
    """The dot-product tile of the accumulator nest `loop` into `buf`, or None where the nest
    does not have the shape (module docstring) or does not fit the registers. `enclosed`: the
    nest sits inside loops of its own that index the accumulator (a tile level between the
    accumulator's allocation and the reduction, the reduction's initialization beside the nest
    in them), so the tile is the vectors at `base + offsets` in those loops' variables, loaded
    and stored around the nest each time it runs."""
    nest: list[ir.For] = []
    node: ir.Stmt = loop
    while isinstance(node, ir.For):
        nest.append(node)
        node = node.body
    store = node
    if not isinstance(store, ir.Store) or store.buffer is not buf or len(nest) < 2:
        return None
    value = store.value
    if not (isinstance(value, E.BinOp) and value.op == "+" and isinstance(value.a, ir.BufferLoad)
            and value.a.buffer is buf):
        return None
    roles = operand_roles(value.b, buf.dtype, features, vector_bytes)
    if roles is None:
        return None
    ins, lhs, rhs = roles
    lanes, depth = ins.lanes, ins.depth
    vec = nest[-1]
    if vec.extent % lanes or buf.size % lanes or any(f.kind in ("parallel", "vectorized") for f in nest[:-1]):
        return None
    index = buf.flat_index(store.indices)
    if to_linear(simplify(buf.flat_index(value.a.indices) - index, ranges)).terms:
        return None
    index_vars = {id(v) for v in E.free_vars(index)}
    indexes = [id(f.var) in index_vars for f in nest[:-1]]
    # the loops down to the last that indexes the accumulator above one that does not stay
    # outside the tile; then reduction loops (the last is the depth loop); then the tile's rows
    outer = max((p + 1 for p in range(len(indexes)) if indexes[p] and not all(indexes[p:])), default=0)
    split = next((p for p in range(outer, len(nest) - 1) if indexes[p]), len(nest) - 1)
    kept, inner = nest[outer:split], nest[split:-1]
    if not kept or not all(indexes[split:]):
        return None
    depth_loop = kept[-1]
    if depth_loop.extent % depth:
        return None
    count = 1
    for f in inner:
        count *= f.extent
    chunks = vec.extent // lanes
    if count * chunks > MAX_UPDATES:
        return None
    block = bool(outer) or enclosed  # the tile is a block of the accumulator, not all of it
    accumulators = buf.size // lanes if not block else count * chunks
    amx = amx_form(ins, features)
    if accumulators + chunks + 1 > registers and amx is None:
        return None
    scope = dict(ranges)
    for f in nest:
        scope[id(f.var)] = (0, f.extent - 1)
    group = E.Var("dq")  # the depth loop counted in instructions
    scope[id(group)] = (0, depth_loop.extent // depth - 1)
    simplifier = Simplifier(scope)
    if not _operands_fit(simplifier, lhs, rhs, depth_loop.var, vec.var, group, depth, lanes):
        return None
    base = (simplifier.simplify(E.substitute(index, {f.var: E.Const(0, "int32") for f in [*inner, vec]}))
            if block else E.Const(0, "int32"))
    base_form = to_linear(base)
    if base_form.const % lanes or any(c % lanes for _, c in base_form.terms.values()):
        return None
    updates: list[tuple[int, E.Expr, int]] = []
    slot_of: dict[int, int] = {}
    for values in itertools.product(*(range(f.extent) for f in inner)):
        binding = {f.var: E.Const(v, "int32") for f, v in zip(inner, values)}
        for c in range(chunks):
            at = to_linear(simplifier.simplify(E.substitute(index, {**binding, vec.var: E.Const(c * lanes, "int32")}))
                           - base)
            if at.terms or at.const % lanes or not (block or 0 <= at.const < accumulators * lanes):
                return None
            slot = slot_of.setdefault(at.const, len(slot_of)) if block else at.const // lanes
            updates.append((slot, E.substitute(value.b, binding), c * lanes))
    offsets = tuple(slot_of) if block else tuple(range(0, accumulators * lanes, lanes))
    shape = None if amx is None else _amx_shape(amx, ins, inner, vec, depth_loop, index, lhs, rhs, group, simplifier)
    if shape is None and accumulators + chunks + 1 > registers:
        return None
    return ir.RegisterTile(buf, loop, lanes, split, tuple(updates), frozenset(), outer, base, offsets, ins, shape)


#: Tiles of each kind a program uses, in AMX's 8 registers: accumulators 0-3, row operands 4-5,
#: packed operands 6-7 (the printer's fixed assignment, `codegen.cpu`).
AMX_ACCUMULATOR_TILES, AMX_ROW_TILES, AMX_PACKED_TILES = 4, 2, 2


def _amx_shape(amx: DotProductInstruction, ins: DotProductInstruction, inner: list[ir.For], vec: ir.For,
               depth_loop: ir.For, index: E.Expr, lhs: ir.BufferLoad, rhs: ir.BufferLoad, group: E.Var,
               simplifier: Simplifier) -> ir.AmxShape | None:
    """The tile's AMX form, or None where its shape is not one: one row loop of 16 or 32 rows,
    one or two chunks of 16 lanes, a depth loop of whole tile instructions (64 bytes of each
    row), the row operand contiguous along the depth and every operand's rows evenly spaced."""
    if len(inner) != 1 or inner[0].extent % amx.rows:
        return None
    row = inner[0]
    row_blocks, chunks = row.extent // amx.rows, vec.extent // ins.lanes
    if row_blocks > AMX_ROW_TILES or chunks > AMX_PACKED_TILES or row_blocks * chunks > AMX_ACCUMULATOR_TILES:
        return None
    if depth_loop.extent % (AMX_STEPS * ins.depth):
        return None
    acc_rows, acc_lanes = index_coefficient(index, row.var), index_coefficient(index, vec.var)
    lhs_index = simplifier.simplify(lhs.buffer.flat_index(lhs.indices))
    lhs_rows, lhs_depth = index_coefficient(lhs_index, row.var), index_coefficient(lhs_index, depth_loop.var)
    if acc_lanes != 1 or lhs_depth != 1 or not acc_rows or not lhs_rows:
        return None
    if index_coefficient(simplifier.simplify(rhs.buffer.flat_index(rhs.indices)), row.var) != 0:
        return None  # the packed operand is the same for every row
    stepped = simplifier.simplify(E.substitute(rhs.buffer.flat_index(rhs.indices),
                                               {depth_loop.var: group * ins.depth}))
    rhs_step = index_coefficient(stepped, group)
    if not rhs_step:
        return None
    return ir.AmxShape(amx, row_blocks, chunks, acc_rows, lhs_rows, rhs_step)


def _operands_fit(simplifier: Simplifier, lhs: ir.BufferLoad, rhs: ir.BufferLoad, depth_var: E.Var,
                  vec_var: E.Var, group: E.Var, depth: int, lanes: int) -> bool:
    """Whether, with the depth loop at `depth * group + t`, lhs reads `depth` consecutive
    elements (t = 0..depth-1) the same for every lane, and rhs reads lane l's at
    `l * depth + t` from one start: the instruction's operands, read as vectors."""
    def offset(load: ir.BufferLoad, t: int, lane: E.Expr) -> E.Expr:
        bound = {depth_var: group * depth + E.Const(t, "int32"), vec_var: lane}
        return simplifier.simplify(E.substitute(load.buffer.flat_index(load.indices), bound))

    for load, lane_step in ((lhs, 0), (rhs, depth)):
        start = offset(load, 0, E.Const(0, "int32"))
        if index_coefficient(start, group) is None:
            return False
        for t in range(depth):
            moved = to_linear(simplifier.simplify(offset(load, t, E.Const(0, "int32")) - start))
            if moved.terms or moved.const != t:
                return False
        for probe in (1, lanes - 1):
            moved = to_linear(simplifier.simplify(offset(load, 0, E.Const(probe, "int32")) - start))
            if moved.terms or moved.const != probe * lane_step:
                return False
    return True


class _DotProductTiles(StmtRewriter):
    """Finds accumulator nests directly inside the allocation of a local accumulator."""

    def __init__(self, features: tuple[str, ...], vector_bytes: int, vector_registers: int):
        super().__init__()
        self.features, self.vector_bytes, self.vector_registers = features, vector_bytes, vector_registers
        self.accumulator: ir.Buffer | None = None  # the local buffer whose nests are being looked at

    def loop(self, s: ir.For) -> ir.Stmt:
        """A nest inside loops of the accumulator's allocation (`plan_dot_product_tile`'s
        `enclosed`), or the loop with its body looked at."""
        if self.accumulator is not None:
            tile = plan_dot_product_tile(s, self.accumulator, self.features, self.vector_bytes,
                                         self.vector_registers, self.ranges, enclosed=True)
            if tile is not None:
                return tile
        return super().loop(s)

    def allocate(self, s: ir.Allocate) -> ir.Stmt:
        if s.buffer.scope != "local":
            return super().allocate(s)
        parts = flat_seq(s.body)
        out = []
        outside, self.accumulator = self.accumulator, s.buffer
        for part in parts:
            tile = None
            if type(part) is ir.For:
                tile = plan_dot_product_tile(part, s.buffer, self.features, self.vector_bytes,
                                             self.vector_registers, self.ranges)
            out.append(tile if tile is not None else self.stmt(part))
        self.accumulator = outside
        if all(a is b for a, b in zip(out, parts)):
            return s
        return ir.Allocate(s.buffer, out[0] if len(out) == 1 else ir.Seq(out))


def form_dot_product_tiles(func: ir.PrimFunc, features: tuple[str, ...], vector_bytes: int,
                           vector_registers: int) -> ir.PrimFunc:
    """`func` with every accumulator nest that one of the CPU's dot-product instructions
    (`features`, `Target.dot_products`) can compute made a dot-product `ir.RegisterTile`."""
    if not features or vector_bytes < 32:
        return func
    return _DotProductTiles(features, vector_bytes, vector_registers).apply(func)
