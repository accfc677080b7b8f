"""The loop-nest IR that schedules lower to and code generators print.

It knows GPUs from the start: loops may be bound to blockIdx/vthread/threadIdx, buffers have
scopes (global, local, shared), and barriers exist, so the CPU is one backend of it.

A backend's lowering passes may replace a nest by a node that says how it runs on that
hardware (`RegisterTile`, `TransposedStore`), so that the cost model's features and the printer
see the same program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ansor.instructions import DotProductInstruction
from ansor.te import expr as E

LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled", "vthread", "blockIdx.x", "blockIdx.y",
              "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")


@dataclass(eq=False)
class Buffer:
    """A named array; `role` is 'input' | 'output' | 'packed' (kernel parameters) | 'temp'."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: str = "global"
    role: str = "temp"

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * E.DTYPE_BYTES[self.dtype]

    def strides(self) -> tuple[int, ...]:
        out, acc = [], 1
        for n in reversed(self.shape):
            out.append(acc)
            acc *= n
        return tuple(reversed(out))

    def flat_index(self, indices) -> E.Expr:
        """The row-major element offset of `indices` (unsimplified)."""
        flat: E.Expr | None = None
        for idx, stride in zip(indices, self.strides()):
            term = idx if stride == 1 else idx * stride
            flat = term if flat is None else flat + term
        return E.Const(0, "int32") if flat is None else flat


class BufferLoad(E.Expr):
    __slots__ = ("buffer", "indices")

    def __init__(self, buffer: Buffer, indices):
        self.buffer, self.indices, self.dtype = buffer, tuple(indices), buffer.dtype

    def children(self):
        return self.indices

    def rebuild(self, children):
        return BufferLoad(self.buffer, children)

    def to_str(self, render) -> str:
        return f"{self.buffer.name}[{', '.join(render(i) for i in self.indices)}]"


class Stmt:
    pass


@dataclass(eq=False)
class For(Stmt):
    var: E.Var
    extent: int
    kind: str
    body: Stmt
    unroll_hint: bool = False  # unrolled by an auto_unroll_max_step pragma


@dataclass(eq=False)
class Seq(Stmt):
    stmts: list[Stmt]


@dataclass(eq=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[E.Expr, ...]
    value: E.Expr


@dataclass(eq=False)
class IfThenElse(Stmt):
    cond: E.Expr
    then: Stmt
    orelse: Stmt | None = None


@dataclass(eq=False)
class Allocate(Stmt):
    """The buffer lives for the duration of `body` (stack, register or shared memory)."""

    buffer: Buffer
    body: Stmt


@dataclass(eq=False)
class Barrier(Stmt):
    scope: str = "shared"


@dataclass(frozen=True)
class AmxShape:
    """A dot-product register tile run as AMX tiles: its one row loop (the first loop inside
    the kept ones) in blocks of the tile instruction's 16 rows, its vector loop in chunks of 16
    lanes; an accumulator tile per (row block, chunk), a row-operand tile per row block and a
    packed-operand tile per chunk, each instruction summing `AMX_STEPS` of the vector
    instruction's steps of the depth loop. Strides are in elements of each buffer."""

    instruction: DotProductInstruction  # tdpbusd or tdpbf16ps
    row_blocks: int                     # accumulator (and row-operand) tiles down the rows
    chunks: int                         # accumulator (and packed-operand) tiles across
    acc_row_stride: int                 # between the accumulator's rows
    lhs_row_stride: int                 # between the row operand's rows
    rhs_step_stride: int                # between the packed operand's steps of the depth


@dataclass(frozen=True, eq=False)
class RaggedRows:
    """The rows of a register tile that a kernel skipping padded rows keeps (`lower/live_rows.py`):
    `rows_left` (in the variables of the loops around the tile, its outer loops included) counts
    the output rows from the tile's first one that are kept, and `slot_rows[slot]` is the row,
    counted from that first one, that each accumulator vector ends up in. Where fewer rows are
    kept than the tile holds, only the kept rows' updates run."""

    rows_left: E.Expr
    slot_rows: tuple[int, ...]


@dataclass(eq=False)
class RegisterTile(Stmt):
    """An accumulator update nest that runs with the accumulator in vector registers.

    `nest` is the update as scheduled: loops around one `Store` of `buffer` (a small local
    accumulator) whose innermost loop is vectorized. The accumulator's `buffer.size // lanes`
    vectors are loaded into variables before the nest and stored back after it. The first
    `kept` loops stay loops; the loops inside them, the vectorized one included, are unrolled
    into `updates`, one vector statement per (accumulator vector, value added, first lane of
    the vector loop); `pinned` names the operand vectors worth pinning to a register (by
    `lower.register_tile.load_key`). With `outer` > 0 the first `outer` loops (which may
    index the accumulator) run outside the tile, and the tile is the accumulator's vectors at
    elements `base + offsets[slot]`, loaded and stored once per outer iteration.
    """

    buffer: Buffer
    nest: For
    lanes: int
    kept: int
    updates: tuple[tuple[int, E.Expr, int], ...]
    pinned: frozenset
    outer: int = 0  # leading loops (of the first `kept`) outside the load and store of the block
    base: E.Expr | None = None  # element offset of the block in `buffer` (in the outer loops' variables)
    offsets: tuple[int, ...] = ()  # element offset from `base` of each accumulator vector (slot)
    #: a dot-product instruction (`ansor.instructions`) computes each update: the last kept loop
    #: is the reduction it sums `instruction.depth` steps of at a time (`lower/dot_product.py`)
    instruction: DotProductInstruction | None = None
    #: the same sums as AMX tiles instead of vectors (`lower/dot_product.py`)
    amx: AmxShape | None = None
    #: (buffer, element offset) fetched into the caches once per iteration of the innermost
    #: kept loop: the next parallel task's panel of an operand (`lower/prefetch.py`)
    prefetches: tuple[tuple[Buffer, E.Expr], ...] = ()
    #: which accumulator vectors a call of a shorter length needs (`lower/live_rows.py`)
    ragged: RaggedRows | None = None

    def loops(self) -> list[For]:
        """The loops of `nest`, outermost first."""
        out, node = [], self.nest
        while isinstance(node, For):
            out.append(node)
            node = node.body
        return out


@dataclass(eq=False)
class TransposedStore(Stmt):
    """A tile stored across the axis it is vectorized along, transposed in registers.

    `nest` is the store as scheduled: `for a: for f (vectorized): OUT[.. + f*S + a] = value`,
    contiguous in `a`, strided in `f`. It runs as `write`: `for f: for a (vectorized):
    OUT[...] = source`, where `source` is contiguous in f; vectors of `lanes` values along f
    are transposed in groups of `group` values of a (log2(group) rounds of two-input
    shuffles), then stored as runs of contiguous a. `staging`, when the value is not such a
    load, computes it into a local buffer (alive for the whole node) first.
    """

    nest: For
    write: For
    lanes: int
    group: int
    staging: Allocate | None = None


@dataclass(eq=False)
class Unswitched(Stmt):
    """A loop nest whose bounds checks all pass wherever `cond` holds, run as `fast` (the
    same nest with those checks removed) there and as `slow` (the nest as scheduled, itself
    possibly unswitched further in) elsewhere: a padded copy runs unguarded inside the image
    and guarded only at its border. Analyses that count work see `slow`, the program as
    scheduled."""

    cond: E.Expr
    fast: Stmt
    slow: Stmt


@dataclass(eq=False)
class WrittenProgram(Stmt):
    """A kernel body that a dialect's template printer writes whole from `template` (its knobs:
    `lower.gemm_template.GemmProgram`); `nest` is the same work as plain loops, which analyses
    (the cost model's features, walks over stores) read instead."""

    template: object
    nest: Stmt


@dataclass(eq=False)
class GPUKernel(Stmt):
    """One launch of a GPU program: `grid` blocks of `block` threads (x, y, z) run `body`.

    Inside `body`, loops bound to blockIdx/threadIdx stay `For` nodes of those kinds (the
    printer reads each from the hardware index; a thread loop shorter than the block is
    guarded), `vthread` loops run serially, shared buffers are allocated at the top and
    barriers stand around their fills. `params` are the buffers it reads and writes;
    `dynamic_shared_bytes` is the shared memory the launch gives it beyond its static arrays.
    """

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: list[Buffer]
    body: Stmt
    dynamic_shared_bytes: int = 0

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(eq=False)
class PrimFunc:
    """One kernel: parameters (inputs then outputs) and a body."""

    name: str
    params: list[Buffer]
    body: Stmt
    attrs: dict = field(default_factory=dict)


def seq(stmts: list[Stmt]) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.stmts)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(flat)


def walk_stmts(stmt: Stmt):
    """Pre-order traversal of statements."""
    yield stmt
    if isinstance(stmt, For):
        yield from walk_stmts(stmt.body)
    elif isinstance(stmt, Seq):
        for s in stmt.stmts:
            yield from walk_stmts(s)
    elif isinstance(stmt, IfThenElse):
        yield from walk_stmts(stmt.then)
        if stmt.orelse is not None:
            yield from walk_stmts(stmt.orelse)
    elif isinstance(stmt, Allocate):
        yield from walk_stmts(stmt.body)
    elif isinstance(stmt, RegisterTile):
        yield from walk_stmts(stmt.nest)
    elif isinstance(stmt, TransposedStore):
        if stmt.staging is not None:
            yield from walk_stmts(stmt.staging)
        yield from walk_stmts(stmt.write)
    elif isinstance(stmt, Unswitched):
        yield from walk_stmts(stmt.fast)
        yield from walk_stmts(stmt.slow)
    elif isinstance(stmt, GPUKernel):
        yield from walk_stmts(stmt.body)
    elif isinstance(stmt, WrittenProgram):
        yield from walk_stmts(stmt.nest)


def ir_to_str(stmt: Stmt, indent: int = 0) -> str:
    """Readable pseudo-code of a statement tree."""
    from ansor.te.printer import expr_to_str

    pad = "  " * indent
    if isinstance(stmt, For):
        kind = "" if stmt.kind == "serial" else f" {stmt.kind}"
        hint = " (unrolled)" if stmt.unroll_hint and stmt.kind == "serial" else ""
        return f"{pad}for{kind} {stmt.var.name} in range({stmt.extent}):{hint}\n" + ir_to_str(stmt.body, indent + 1)
    if isinstance(stmt, Seq):
        return "".join(ir_to_str(s, indent) for s in stmt.stmts)
    if isinstance(stmt, Store):
        idx = ", ".join(expr_to_str(i) for i in stmt.indices)
        return f"{pad}{stmt.buffer.name}[{idx}] = {expr_to_str(stmt.value)}\n"
    if isinstance(stmt, IfThenElse):
        out = f"{pad}if {expr_to_str(stmt.cond)}:\n" + ir_to_str(stmt.then, indent + 1)
        if stmt.orelse is not None:
            out += f"{pad}else:\n" + ir_to_str(stmt.orelse, indent + 1)
        return out
    if isinstance(stmt, Allocate):
        b = stmt.buffer
        return f"{pad}allocate {b.name}[{', '.join(map(str, b.shape))}] {b.dtype} ({b.scope})\n" + ir_to_str(stmt.body, indent)
    if isinstance(stmt, Barrier):
        return f"{pad}barrier({stmt.scope})\n"
    if isinstance(stmt, RegisterTile):
        return (f"{pad}register tile {stmt.buffer.name} ({stmt.buffer.size // stmt.lanes} x {stmt.lanes} lanes, "
                f"{len(stmt.updates)} updates inside loop {stmt.kept}):\n" + ir_to_str(stmt.nest, indent + 1))
    if isinstance(stmt, TransposedStore):
        staged = "" if stmt.staging is None else ir_to_str(stmt.staging, indent + 1)
        return (f"{pad}transposed store ({stmt.lanes} lanes, groups of {stmt.group}):\n" + staged
                + ir_to_str(stmt.write, indent + 1))
    if isinstance(stmt, Unswitched):
        return (f"{pad}if {expr_to_str(stmt.cond)}:  # in bounds throughout\n" + ir_to_str(stmt.fast, indent + 1)
                + f"{pad}else:\n" + ir_to_str(stmt.slow, indent + 1))
    if isinstance(stmt, WrittenProgram):
        return f"{pad}template {stmt.template}, as loops:\n" + ir_to_str(stmt.nest, indent + 1)
    if isinstance(stmt, GPUKernel):
        grid, block = "x".join(map(str, stmt.grid)), "x".join(map(str, stmt.block))
        args = ", ".join(b.name for b in stmt.params)
        return f"{pad}kernel {stmt.name}<<<{grid} blocks, {block} threads>>>({args}):\n" + ir_to_str(stmt.body, indent + 1)
    return f"{pad}<{type(stmt).__name__}>\n"
