"""The attention template's program: the whole of attention as one loop nest, with the softmax
computed online over tiles of keys, written from the template stage's knobs.

`te.attention` declares what attention computes; this module writes how, as ordinary loop IR
(so the C printer, the lowering passes and the cost model's features see a program like any
other). One parallel loop runs over batch x heads x query tiles; each iteration keeps, for its
QT queries, the running maximum `m`, the running sum `l` and the accumulator `acc` [QT, Dv]
in local buffers, and walks the keys in tiles of KT:

    kT  = K tile, transposed [D, KT]                  (so the scores' inner loop is contiguous)
    s   = q_tile @ kT * scale (+ mask; masked: -inf)   [QT, KT], the only scores ever stored
    mx  = max(m, rowmax(s));  s = exp(s - mx);  corr = exp(m - mx)
    l   = l * corr + rowsum(s);  acc *= corr;  acc += s @ V tile;  m = mx
    out = acc / l

Tiles that a causal mask or the padding lengths hide entirely (above the diagonal, past the
sequence's length) are skipped. The knobs, all search parameters: the query tile QT, the key
tile KT, the vector chunk W of the value accumulation (the loop over W columns of `acc` runs
innermost and vectorized, the key loop around it, so a chunk of the accumulator stays in
registers across the keys), and the auto-unroll limit applied to the small inner nests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ansor.lower import ir
from ansor.schedule.errors import ScheduleError
from ansor.schedule.state import Split, State
from ansor.te import expr as E
from ansor.te.attention import AttentionParts, attention_parts, is_template
from ansor.te.tensor import ComputeOp


@dataclass(frozen=True)
class AttentionKnobs:
    """The tunable choices of one attention program."""

    query_tile: int
    key_tile: int
    vector: int
    unroll: int


#: The program of a template stage without steps (the default schedule): knobs that are sound
#: everywhere; a vector chunk that does not divide the value columns falls back to 1.
DEFAULT_KNOBS = AttentionKnobs(query_tile=8, key_tile=64, vector=16, unroll=0)


def template_stage(state: State) -> int | None:
    """The index of the attention template stage of the program, or None."""
    for sid, stage in enumerate(state.stages):
        if is_template(stage.op):
            return sid
    return None


def knobs_of(state: State, sid: int) -> AttentionKnobs:
    """The knobs as the template's sketch holds them: the inner lengths of its splits of the
    query axis (i), the key axis (j) and the value columns (e), and its unroll pragma."""
    stage = state.stages[sid]
    inner: dict[str, int] = {}
    for rel in stage.relations:
        if isinstance(rel, Split) and len(rel.factors) == 1 and rel.factors[0] is not None:
            inner[rel.parent] = int(rel.factors[0])
    return AttentionKnobs(inner.get("i", DEFAULT_KNOBS.query_tile), inner.get("j", DEFAULT_KNOBS.key_tile),
                          inner.get("e", DEFAULT_KNOBS.vector), stage.auto_unroll_max_step)


def lower_attention(state: State, name: str = "kernel") -> ir.PrimFunc:
    """The IR of an attention template program (see the module docstring)."""
    sid = template_stage(state)
    if sid is None:
        raise ScheduleError("not an attention template program")
    parts = attention_parts(state.stages[sid].tensor)
    knobs = knobs_of(state, sid)
    names = {id(s.tensor): s.name for s in state.stages}
    params = [ir.Buffer(names[id(t)], t.shape, t.dtype, "global", "input") for t in state.dag.inputs]
    params += [ir.Buffer(names[id(t)], t.shape, t.dtype, "global", "output") for t in state.dag.outputs]
    if len(state.dag.outputs) != 1 or state.dag.outputs[0] is not parts.output:
        raise ScheduleError("an attention template task has the attention output as its one output")
    buffers = {id(t): b for t, b in zip(state.dag.inputs + state.dag.outputs, params)}
    return ir.PrimFunc(name, params, _Writer(parts, knobs, buffers).program())


class _Reads:
    """Reads of the template's inputs as expressions over the kernel's buffers. An input that
    is a stage of its own (the reshape and permute that split heads, fused into the task by
    partitioning) is read through its body, so its copy is never made."""

    def __init__(self, buffers: dict):
        self.buffers = buffers

    def __call__(self, tensor, indices) -> E.Expr:
        indices = tuple(indices)
        if id(tensor) in self.buffers:
            return ir.BufferLoad(self.buffers[id(tensor)], indices)
        op = tensor.op
        if not isinstance(op, ComputeOp) or op.reduce_axes:
            raise ScheduleError(f"attention template: input {tensor.name!r} is neither an input nor elementwise")
        body = E.substitute(op.body, dict(zip(op.axes, indices)))
        return E.transform(body, lambda n: self(n.tensor, n.indices) if isinstance(n, E.TensorRead) else None)


class _Writer:
    """Writes the loop nest of one attention program."""

    def __init__(self, parts: AttentionParts, knobs: AttentionKnobs, buffers: dict):
        self.p, self.k = parts, knobs
        self.read = _Reads(buffers)
        self.out_buf = buffers[id(parts.output)]
        self.dtype = parts.q.dtype
        b, h, self.lq, self.d = parts.q.shape
        self.lk, self.dv = parts.k.shape[2], parts.v.shape[3]
        self.batch, self.heads = b, h
        self.qt = min(knobs.query_tile, self.lq)
        self.kt = min(knobs.key_tile, self.lk)
        self.w = knobs.vector if self.dv % knobs.vector == 0 else 1
        self.n_q = -(-self.lq // self.qt)
        self.n_k = -(-self.lk // self.kt)

    # -- helpers ------------------------------------------------------------------------------
    def c(self, value: float) -> E.Expr:
        return E.const(value, self.dtype)

    @staticmethod
    def i(value: int) -> E.Expr:
        return E.const(value, "int32")

    @staticmethod
    def loop(name: str, extent: int, body: ir.Stmt, kind: str = "serial") -> ir.Stmt:
        var = E.Var(name)
        return ir.For(var, extent, kind, body(var) if callable(body) else body)

    # -- the program ----------------------------------------------------------------------------
    def program(self) -> ir.Stmt:
        qt, kt, d, dv = self.qt, self.kt, self.d, self.dv
        m = ir.Buffer("row_max", (qt,), self.dtype, "local")
        l_ = ir.Buffer("row_sum", (qt,), self.dtype, "local")
        mx = ir.Buffer("new_max", (qt,), self.dtype, "local")
        acc = ir.Buffer("acc", (qt, dv), self.dtype, "local")
        s = ir.Buffer("scores", (qt, kt), self.dtype, "local")
        kT = ir.Buffer("keys_t", (d, kt), self.dtype, "local")
        self.m, self.l, self.mx, self.acc, self.s, self.kT = m, l_, mx, acc, s, kT
        task = E.Var("task")
        n = task // self.i(self.heads * self.n_q)
        h = (task // self.i(self.n_q)) % self.i(self.heads)
        qtile = task % self.i(self.n_q)
        q0 = qtile * self.i(qt)
        self.n, self.h, self.hk, self.q0 = n, h, h // self.i(self.p.group), q0
        init = ir.seq([
            self.loop("qi", qt, lambda qi: ir.seq([ir.Store(m, (qi,), self.c(-math.inf)),
                                                   ir.Store(l_, (qi,), self.c(0.0))])),
            self.loop("qi", qt, lambda qi: self.loop(
                "e", dv, lambda e: ir.Store(acc, (qi, e), self.c(0.0)), "vectorized")),
        ])
        tiles = self.loop("kt", self.n_k, self.key_tile)
        body = ir.seq([init, tiles, self.write_out()])
        for buf in (kT, s, acc, mx, l_, m):
            body = ir.Allocate(buf, body)
        return ir.For(task, self.batch * self.heads * self.n_q, "parallel", body)

    def key_tile(self, ktile: E.Var) -> ir.Stmt:
        k0 = ktile * self.i(self.kt)
        body = ir.seq([self.transpose_keys(k0), self.scores(k0), self.online_softmax(), self.accumulate(k0)])
        _mark_unroll(body, self.k.unroll)
        visible = []
        if self.p.causal:  # the tile's first key is not after the tile's last query
            visible.append(E.compare("<=", k0, self.q0 + self.i(self.qt - 1)))
        if self.p.lengths is not None:
            visible.append(E.compare("<", k0, E.cast(self.read(self.p.lengths, (self.n,)), "int32")))
        if not visible:
            return body
        cond = visible[0] if len(visible) == 1 else visible[0] & visible[1]
        return ir.IfThenElse(cond, body)

    def transpose_keys(self, k0: E.Expr) -> ir.Stmt:
        """kT[d, ki] = K[n, hk, k0 + ki, d], zero past the last key."""
        def row(ki):
            j = k0 + ki
            load = lambda dd: self.read(self.p.k, (self.n, self.hk, j, dd))  # noqa: E731
            copy = self.loop("dd", self.d, lambda dd: ir.Store(self.kT, (dd, ki), load(dd)))
            if self.lk % self.kt == 0:
                return copy
            zero = self.loop("dd", self.d, lambda dd: ir.Store(self.kT, (dd, ki), self.c(0.0)))
            return ir.IfThenElse(E.compare("<", j, self.i(self.lk)), copy, zero)
        return self.loop("ki", self.kt, row)

    def scores(self, k0: E.Expr) -> ir.Stmt:
        """s = q_tile @ kT, then scaled and masked. A query past the last one (a ragged last
        tile) reads row 0 and a key past the last one key 0: their scores are never used."""
        def row(qi):
            i = self.q0 + qi
            i_safe = self.clamped(i, self.lq, self.qt)
            zero = self.loop("ki", self.kt, lambda ki: ir.Store(self.s, (qi, ki), self.c(0.0)), "vectorized")

            def step(dd):
                qd = self.read(self.p.q, (self.n, self.h, i_safe, dd))
                return self.loop("ki", self.kt, lambda ki: ir.Store(
                    self.s, (qi, ki), ir.BufferLoad(self.s, (qi, ki)) + qd * ir.BufferLoad(self.kT, (dd, ki))),
                    "vectorized")
            finish = self.loop("ki", self.kt, lambda ki: ir.Store(
                self.s, (qi, ki), self.masked(qi, ki, i, k0 + ki, i_safe, self.clamped(k0 + ki, self.lk, self.kt))))
            return ir.seq([zero, self.loop("dd", self.d, step), finish])
        return self.loop("qi", self.qt, row)

    def clamped(self, x: E.Expr, extent: int, tile: int) -> E.Expr:
        """x, or 0 where it is past `extent` (only a ragged last tile gets there)."""
        if extent % tile == 0:
            return x
        return E.if_then_else(E.compare("<", x, self.i(extent)), x, self.i(0))

    def masked(self, qi: E.Expr, ki: E.Expr, i: E.Expr, j: E.Expr, i_safe: E.Expr, j_safe: E.Expr) -> E.Expr:
        value = ir.BufferLoad(self.s, (qi, ki)) * self.c(self.p.scale)
        if self.p.mask is not None:
            mshape = self.p.mask.shape
            full = (self.n, self.h, i_safe, j_safe)[4 - len(mshape):]
            value = value + self.read(self.p.mask, tuple(self.i(0) if size == 1 else x
                                                         for size, x in zip(mshape, full)))
        keep = [E.compare("<", j, self.i(self.lk))] if self.lk % self.kt else []
        if self.p.lengths is not None:
            keep.append(E.compare("<", j, E.cast(self.read(self.p.lengths, (self.n,)), "int32")))
        if self.p.causal:
            keep.append(E.compare("<=", j, i))
        if not keep:
            return value
        cond = keep[0]
        for extra in keep[1:]:
            cond = cond & extra
        return E.if_then_else(cond, value, self.c(-math.inf))

    def online_softmax(self) -> ir.Stmt:
        """Per query row: the new maximum, the tile's exponentials, the running sum and the
        accumulator rescaled by exp(old max - new max). While a row has seen only masked keys
        its maximum is -inf; exponentials are then taken against 0 so they stay 0, not NaN."""
        s, m, mx, l_, acc = self.s, self.m, self.mx, self.l, self.acc

        def row(qi):
            new_max = ir.BufferLoad(mx, (qi,))
            finite = E.if_then_else(E.compare("==", new_max, self.c(-math.inf)), self.c(0.0), new_max)
            return ir.seq([
                ir.Store(mx, (qi,), ir.BufferLoad(m, (qi,))),
                self.loop("ki", self.kt, lambda ki: ir.Store(
                    mx, (qi,), E.maximum(ir.BufferLoad(mx, (qi,)), ir.BufferLoad(s, (qi, ki))))),
                self.loop("ki", self.kt, lambda ki: ir.Store(
                    s, (qi, ki), E.exp(ir.BufferLoad(s, (qi, ki)) - finite)), "vectorized"),
                ir.Store(m, (qi,), E.exp(ir.BufferLoad(m, (qi,)) - finite)),  # m holds the correction now
                ir.Store(l_, (qi,), ir.BufferLoad(l_, (qi,)) * ir.BufferLoad(m, (qi,))),
                self.loop("ki", self.kt, lambda ki: ir.Store(
                    l_, (qi,), ir.BufferLoad(l_, (qi,)) + ir.BufferLoad(s, (qi, ki)))),
                self.loop("e", self.dv, lambda e: ir.Store(
                    acc, (qi, e), ir.BufferLoad(acc, (qi, e)) * ir.BufferLoad(m, (qi,))), "vectorized"),
                ir.Store(m, (qi,), new_max),
            ])
        return self.loop("qi", self.qt, row)

    def accumulate(self, k0: E.Expr) -> ir.Stmt:
        """acc += s @ V tile, W columns of acc at a time across the tile's keys."""
        w, last = self.w, min(self.kt, self.lk)

        def chunk(qi, ec):
            def key(ki):
                j = k0 + ki
                update = self.loop("e", w, lambda e: ir.Store(
                    self.acc, (qi, ec * self.i(w) + e),
                    ir.BufferLoad(self.acc, (qi, ec * self.i(w) + e))
                    + ir.BufferLoad(self.s, (qi, ki)) * self.read(self.p.v, (self.n, self.hk, j, ec * self.i(w) + e))),
                    "vectorized")
                if self.lk % self.kt == 0:
                    return update
                return ir.IfThenElse(E.compare("<", j, self.i(self.lk)), update)
            return self.loop("ki", last, key)
        return self.loop("qi", self.qt, lambda qi: self.loop("ec", self.dv // w, lambda ec: chunk(qi, ec)))

    def write_out(self) -> ir.Stmt:
        def row(qi):
            i = self.q0 + qi
            store = self.loop("e", self.dv, lambda e: ir.Store(
                self.out_buf, (self.n, self.h, i, e),
                ir.BufferLoad(self.acc, (qi, e)) / ir.BufferLoad(self.l, (qi,))), "vectorized")
            if self.lq % self.qt == 0:
                return store
            return ir.IfThenElse(E.compare("<", i, self.i(self.lq)), store)
        return self.loop("qi", self.qt, row)


def _mark_unroll(stmt: ir.Stmt, max_step: int) -> int:
    """Mark serial loops whose whole nest runs at most `max_step` iterations for unrolling (the
    auto-unroll pragma of ordinary stages); returns the nest's iteration count."""
    if isinstance(stmt, ir.For):
        total = stmt.extent * _mark_unroll(stmt.body, max_step)
        if total <= max_step and stmt.kind == "serial":
            stmt.unroll_hint = True
        return total
    if isinstance(stmt, ir.Seq):
        return max([_mark_unroll(s, max_step) for s in stmt.stmts] or [1])
    if isinstance(stmt, ir.IfThenElse):
        return max(_mark_unroll(stmt.then, max_step),
                   _mark_unroll(stmt.orelse, max_step) if stmt.orelse is not None else 1)
    return 1
