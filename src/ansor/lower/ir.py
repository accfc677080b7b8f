"""The loop-nest IR that schedules lower to and code generators print.

It knows GPUs from the start: loops may be bound to blockIdx/vthread/threadIdx, buffers have
scopes (global, local, shared), and barriers exist, so the CPU is one backend of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
    return f"{pad}<{type(stmt).__name__}>\n"
