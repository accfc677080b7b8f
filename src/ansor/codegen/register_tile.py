"""Register tiles in C: a small accumulator kept in vector variables across its reduction.

A cache-write stage (the `matmul.local` of a tiled GEMM) lowers to a small local array updated
inside the reduction loops:

    for k ...:                        loops that do not index the accumulator
      for i in 0..I (unrolled):       loops that do
        vectorize v in 0..W:
          L[c(i) + v] = L[c(i) + v] + A[.., k] * B[k, .. v]

Written like that, gcc keeps `L` in memory (a load and a store around every FMA) and reads each
`B` vector again for every row it multiplies (memory operands: 12 loads for 8 FMAs on AVX2).
Measured on 1024^3 fp32 GEMM, 2-core AVX2: 92 GFLOP/s as loops, 127 with one variable per
accumulator vector and each `B` vector pinned to a register by an empty asm statement
(numpy/OpenBLAS 143 in the same run).

`plan_register_tile` recognizes that shape in the lowered IR and `emit_register_tile` writes it
with GCC vector types: the accumulator vectors are loaded into variables before the `k` loops
and stored back after them; the loops that index the accumulator are unrolled here, one vector
statement per (point, vector chunk); each vector operand is loaded once per `k` iteration.
Anything else (guards, non-contiguous operands, a tile larger than the registers) keeps the
plain loops.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from ansor.lower import ir
from ansor.te import expr as E
from ansor.te.arith import simplify, to_linear
from ansor.te.printer import expr_to_str

MAX_VECTOR_STATEMENTS = 512  # unrolled statements per iteration of the kept loops
MIN_USES_TO_PIN = 3  # statements reading an operand vector before it is pinned to a register

VECTOR_PRELUDE = """
/* for register tiles: GCC vector types (unaligned, may alias float) and a pin that keeps a loaded
   vector in a register instead of re-reading it as a memory operand of every FMA */
typedef float ansor_f32x4 __attribute__((vector_size(16), aligned(4), __may_alias__));
typedef float ansor_f32x8 __attribute__((vector_size(32), aligned(4), __may_alias__));
typedef float ansor_f32x16 __attribute__((vector_size(64), aligned(4), __may_alias__));
typedef int32_t ansor_i32x4 __attribute__((vector_size(16)));
typedef int32_t ansor_i32x8 __attribute__((vector_size(32)));
typedef int32_t ansor_i32x16 __attribute__((vector_size(64)));
/* two-input lane shuffle (transposed stores): gcc has __builtin_shuffle with a mask vector since
   4.7 but __builtin_shufflevector only since 12; clang has only the latter */
#if defined(__clang__)
#define ANSOR_SHUFFLE(a, b, mask_type, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define ANSOR_SHUFFLE(a, b, mask_type, ...) __builtin_shuffle(a, b, (mask_type){__VA_ARGS__})
#endif
#define ANSOR_PIN_ASM(v) __asm__("" : "+v"(v))
#define ANSOR_PIN_NONE(v) ((void)0)
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__)
#define ANSOR_PIN16 ANSOR_PIN_ASM
#else
#define ANSOR_PIN16 ANSOR_PIN_NONE
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__AVX__)
#define ANSOR_PIN32 ANSOR_PIN_ASM
#else
#define ANSOR_PIN32 ANSOR_PIN_NONE
#endif
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined(__AVX512F__)
#define ANSOR_PIN64 ANSOR_PIN_ASM
#else
#define ANSOR_PIN64 ANSOR_PIN_NONE
#endif
"""


@dataclass
class RegisterTile:
    """How to write one reduction nest into a local accumulator as a register tile."""

    buffer: ir.Buffer                 # the local accumulator
    lanes: int
    kept: list[ir.For]                # outer loops written as C loops
    vector_loop: ir.For               # the vectorized loop (unrolled here with the loops above it)
    value: E.Expr                     # what each statement adds to the accumulator
    statements: list[tuple[int, dict, int]]  # (accumulator vector, {var: Const} of the unrolled
                                             # loops, first vector lane) in program order
    slots: int                        # accumulator vectors
    pinned: frozenset                 # operand vectors (load keys) kept in registers by a pin

    @property
    def vector_type(self) -> str:
        return f"ansor_f32x{self.lanes}"

    @property
    def pin(self) -> str:
        """The prelude's pin macro for this width (a no-op where no register holds it)."""
        return f"ANSOR_PIN{4 * self.lanes}"


def index_coefficient(expr: E.Expr, var: E.Var) -> int | None:
    """The coefficient of `var` in a linear index, None if `var` also sits inside a
    non-linear part (a div or mod)."""
    lin = to_linear(expr)
    coef = 0
    for atom, c in lin.terms.values():
        if atom is var:
            coef = c
        elif any(n is var for n in E.walk(atom)):
            return None
    return coef


def _offset(load: ir.BufferLoad, ranges: dict) -> E.Expr:
    return simplify(load.buffer.flat_index(load.indices), ranges)


def _loads(expr: E.Expr) -> list[ir.BufferLoad]:
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
                       ranges: dict) -> RegisterTile | None:
    """A register tile for the reduction nest `loop` into the local buffer `buf`, or None
    where the nest does not have the shape (see the module docstring) or does not fit."""
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
    if any(ld.buffer is buf for ld in _loads(added)):
        return None
    index = buf.flat_index(store.indices)
    difference = to_linear(simplify(buf.flat_index(value.a.indices) - index, ranges))
    if difference.terms or difference.const:
        return None  # reads another element than it writes
    index_vars = {id(v) for v in E.free_vars(index)}
    split = next(p for p, f in enumerate(nest) if id(f.var) in index_vars or f is vec)
    kept, inner = nest[:split], nest[split:-1]
    count = 1
    for f in inner:
        count *= f.extent
    chunks = vec.extent // lanes
    if count * chunks > MAX_VECTOR_STATEMENTS:
        return None
    scope = dict(ranges)
    for f in kept:
        scope[id(f.var)] = (0, f.extent - 1)
    scope[id(vec.var)] = (0, vec.extent - 1)
    statements: list[tuple[int, dict, int]] = []
    slots: set[int] = set()
    uses: Counter = Counter()  # statements per chunk that read each contiguous operand
    for values in itertools.product(*(range(f.extent) for f in inner)):
        binding = {f.var: E.Const(v, "int32") for f, v in zip(inner, values)}
        point_value = E.substitute(added, binding)
        loads = _loads(point_value)
        offsets = {id(ld): _offset(ld, scope) for ld in loads}
        if not _vectorizable(point_value, vec.var, offsets):
            return None
        uses.update({_load_key(ld, offsets[id(ld)]) for ld in loads if index_coefficient(offsets[id(ld)], vec.var) == 1})
        for c in range(chunks):
            at = simplify(E.substitute(index, {**binding, vec.var: E.Const(c * lanes, "int32")}), scope)
            if not isinstance(at, E.Const) or at.value % lanes:
                return None  # the accumulator element must be a fixed, aligned vector
            slots.add(at.value // lanes)
            statements.append((at.value // lanes, binding, c * lanes))
    if len(slots) + len(uses) * chunks + 1 > registers:
        return None
    # a pin pays where a vector feeds several FMAs; pinning many vectors that feed one or two
    # made gcc spill accumulators inside nested reduction loops instead
    pinned = frozenset(key for key, n in uses.items() if n >= MIN_USES_TO_PIN)
    return RegisterTile(buf, lanes, kept, vec, added, statements, buf.size // lanes, pinned)


def _load_key(load: ir.BufferLoad, offset: E.Expr) -> tuple[int, str]:
    """Identifies a contiguous operand across the vector chunks of one step."""
    return id(load.buffer), expr_to_str(offset)


def emit_register_tile(gen, tile: RegisterTile, depth: int) -> None:
    """Write `tile` through the C generator `gen` (its names, expressions and ranges)."""
    vt = tile.vector_type
    acc = gen.names(tile.buffer, tile.buffer.name)
    regs = [gen.names.fresh(f"{acc}_r{s}") for s in range(tile.slots)]
    gen.emit(f"/* register tile: {acc} in {tile.slots} {vt} variables across the reduction */", depth)
    gen.emit("{", depth)
    d = depth + 1
    gen.emit(f"{vt} " + ", ".join(f"{r} = *({vt}*)&{acc}[{s * tile.lanes}]" for s, r in enumerate(regs)) + ";", d)
    for f in tile.kept:
        var = gen.names(f.var, f.var.name)
        gen.ranges[id(f.var)] = (0, f.extent - 1)
        if f.kind == "unrolled" or f.unroll_hint:
            gen.emit(f"#pragma GCC unroll {min(f.extent, 65534)}", d)
        gen.emit(f"for (int32_t {var} = 0; {var} < {f.extent}; ++{var}) {{", d)
        d += 1
    gen.ranges[id(tile.vector_loop.var)] = (0, tile.vector_loop.extent - 1)
    loaded: dict[str, str] = {}
    for slot, binding, start in tile.statements:
        rhs = _vector_text(gen, tile, E.substitute(tile.value, binding), E.Const(start, "int32"), loaded, d)
        gen.emit(f"{regs[slot]} = {regs[slot]} + {rhs};", d)
    for _ in tile.kept:
        d -= 1
        gen.emit("}", d)
    for s, r in enumerate(regs):
        gen.emit(f"*({vt}*)&{acc}[{s * tile.lanes}] = {r};", d)
    gen.emit("}", depth)


def _vector_text(gen, tile: RegisterTile, expr: E.Expr, chunk_start: E.Const, loaded: dict[str, str],
                 depth: int) -> str:
    """C text of `expr` for one vector chunk: contiguous loads become (pinned, shared) vector
    variables, everything invariant in the vector variable stays scalar (GNU C broadcasts)."""
    vec_var, vt = tile.vector_loop.var, tile.vector_type
    if isinstance(expr, ir.BufferLoad):
        offset = _offset(expr, gen.ranges)
        if index_coefficient(offset, vec_var) == 0:
            return gen.expr(expr)
        text = f"*(const {vt}*)&{gen.expr(E.substitute(expr, {vec_var: chunk_start}))}"
        name = loaded.get(text)
        if name is None:
            name = gen.names.fresh("vec")
            loaded[text] = name
            gen.emit(f"{vt} {name} = {text};", depth)
            if _load_key(expr, offset) in tile.pinned:
                gen.emit(f"{tile.pin}({name});", depth)
        return name
    if isinstance(expr, E.BinOp) and expr.op in ("+", "-", "*") and _loads(expr):
        a = _vector_text(gen, tile, expr.a, chunk_start, loaded, depth)
        b = _vector_text(gen, tile, expr.b, chunk_start, loaded, depth)
        return f"({a} {expr.op} {b})"
    return gen.expr(expr)
