"""The attention template's program: the whole of attention as one loop nest, with the softmax
computed online over tiles of keys, written from the template stage's knobs.

`te.attention` declares what attention computes; this module writes how, as ordinary loop IR
(so the C printer, the lowering passes and the cost model's features see a program like any
other). One parallel loop runs over batch x heads x query tiles of QT queries (a serial one
for an attention of few multiply-adds, `MIN_PARALLEL_MACS`). The queries of
a tile are the vector lanes of everything but the weighted sum: the tile's queries are copied
once, transposed and pre-scaled, to `q_t [D, QT]`, and for each tile of KT keys

    s_t[KT, QT]  = K tile @ q_t                        (keys x queries: scores, transposed)
    (masked: -inf)                                     only on tiles a mask reaches
    new_max[q]   = max(row_max[q], max over keys of s_t[:, q])
    s_t          = exp(s_t - new_max);  corr = exp(row_max - new_max)
    row_sum      = row_sum * corr + sum over keys of s_t
    o[QT, Dv]    = s_t^T @ V tile;  acc = acc * corr + o
    out          = acc / row_sum

so the row statistics, the exponentials and the masks are vector operations across queries,
and the two products are accumulator nests in the shape the CPU's register-tile pass
(`lower.register_tile`) keeps in vector registers: the scores as blocks of RK keys x QT
queries over the head dimension (a key element broadcast, a `q_t` row loaded), the weighted
sum as blocks of RQ queries x W value columns over the tile's keys (a probability broadcast, a
value row loaded). The full score matrix is never stored. Key tiles that a causal mask or the
padding lengths hide entirely are skipped; the last, shorter key tile and the last blocks of a
tile are written with their own extents, so no key or query outside the tensors is read.

A tile of fewer than FEW_QUERIES queries (decoding: one) fills too few lanes for that; its
scores are dot products instead, each query row against RK key rows at once as vectors of
partial sums along the head dimension (contiguous loads of both, in registers), added up by a
tree, and its exponentials run with the keys as lanes.

The knobs, all search parameters (`search.template`): the query tile QT as RQ-query blocks,
the key tile KT as RK-key blocks, and the value columns W of a weighted-sum block.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ansor.lower import ir
from ansor.schedule.errors import ScheduleError
from ansor.schedule.state import Split, State
from ansor.te import expr as E
from ansor.te.attention import AttentionParts, attention_parts, is_template
from ansor.te.tensor import ComputeOp


@dataclass(frozen=True)
class AttentionKnobs:
    """The tunable choices of one attention program (each clipped to its axis when lowered)."""

    query_tile: int   # QT: queries per parallel task, the lanes of the scores and statistics
    key_tile: int     # KT: keys whose scores are held at once
    key_rows: int     # RK: keys per register block of the scores product
    query_rows: int   # RQ: queries per register block of the weighted sum
    value_chunk: int  # W: value columns per register block of the weighted sum


#: The program of a template stage without steps (the default schedule): register blocks of
#: 8 keys x 48 queries for the scores and 6 queries x 64 value columns for the weighted sum,
#: 24 accumulators each, which fit 32 AVX-512 registers with their operands (with fewer
#: registers the blocks run as loops); a chunk that does not divide the value columns
#: falls back to all of them.
DEFAULT_KNOBS = AttentionKnobs(query_tile=48, key_tile=48, key_rows=8, query_rows=6, value_chunk=64)


#: Query tiles shorter than this fill too few vector lanes for the queries-as-lanes scores: their
#: scores are dot products along the head dimension instead (decoding: one query).
FEW_QUERIES = 8

#: Multiply-adds (scores and weighted sum, every key) below which the tasks run on the calling
#: thread: such an attention (decoding: one query row) takes microseconds on one core, less than
#: waking another thread costs on an idle machine, and far less than the scheduler slice that a
#: parallel loop waits for its threads on a busy one. At 2^19 and above two threads win (a
#: decoder block's 32-token bucket of 4 heads, BENCHMARKS.md); a decoding step stays serial.
MIN_PARALLEL_MACS = 1 << 19

#: The longest query and key tiles written: their buffers live on the stack of each thread,
#: so a mutated knob beyond the annotation's menus is clipped rather than overflowing it.
MAX_TILE = 256


def template_stage(state: State) -> int | None:
    """The index of the attention template stage of the program, or None."""
    for sid, stage in enumerate(state.stages):
        if is_template(stage.op):
            return sid
    return None


def knobs_of(state: State, sid: int) -> AttentionKnobs:
    """The knobs as the template's sketch holds them: its split of the query axis i into
    (blocks, RQ) with QT their product, of the key axis j into (blocks, RK) with KT their
    product, and of the value columns e into (W,)."""
    stage = state.stages[sid]
    factors: dict[str, tuple[int, ...]] = {}
    for rel in stage.relations:
        if isinstance(rel, Split) and all(f is not None for f in rel.factors):
            factors[rel.parent] = tuple(int(f) for f in rel.factors)
    d = DEFAULT_KNOBS
    qt, rq = _tile(factors.get("i"), d.query_tile, d.query_rows)
    kt, rk = _tile(factors.get("j"), d.key_tile, d.key_rows)
    w = factors["e"][-1] if "e" in factors else d.value_chunk
    return AttentionKnobs(qt, kt, rk, rq, w)


def _tile(factors: tuple[int, ...] | None, tile: int, rows: int) -> tuple[int, int]:
    """(tile, rows per block) from a split's factors (outer to inner), or the defaults."""
    if not factors:
        return tile, rows
    return math.prod(factors), factors[-1]


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


def _i(value: int) -> E.Expr:
    return E.const(value, "int32")


def _loop(name: str, extent: int, body, kind: str = "serial") -> ir.Stmt:
    var = E.Var(name)
    return ir.For(var, extent, kind, body(var) if callable(body) else body)


def _blocks(rows: int, block: int, nest: Callable[[E.Expr, E.Var, int], ir.Stmt]) -> ir.Stmt:
    """`rows` rows in blocks of `block`: `nest(first row, block variable, rows in block)` under
    a loop over the full blocks, then once more for the remainder. The block loop comes first
    (and a one-iteration loop stands for it around the remainder) so that the register-tile
    pass sees the accumulator block it selects as the tile kept in registers."""
    full, rest = divmod(rows, block)
    out = []
    if full:
        out.append(_loop("blk", full, lambda b: nest(b * _i(block), b, block)))
    if rest:
        out.append(_loop("rest", 1, lambda b: nest(_i(full * block) + b * _i(rest), b, rest)))
    return ir.seq(out)


def _tree_sum(values: list[E.Expr]) -> E.Expr:
    """The sum of `values` as a balanced tree of adds."""
    while len(values) > 1:
        values = [values[n] + values[n + 1] if n + 1 < len(values) else values[n] for n in range(0, len(values), 2)]
    return values[0]


class _Writer:
    """Writes the loop nest of one attention program."""

    def __init__(self, parts: AttentionParts, knobs: AttentionKnobs, buffers: dict):
        self.p = parts
        self.read = _Reads(buffers)
        self.out_buf = buffers[id(parts.output)]
        self.dtype = parts.q.dtype
        self.batch, self.heads, self.lq, self.d = parts.q.shape
        self.lk, self.dv = parts.k.shape[2], parts.v.shape[3]
        self.qt = max(1, min(knobs.query_tile, self.lq, MAX_TILE))
        self.kt = max(1, min(knobs.key_tile, self.lk, MAX_TILE))
        self.rq = max(1, min(knobs.query_rows, self.qt))
        self.rk = max(1, min(knobs.key_rows, self.kt))
        self.w = knobs.value_chunk if 0 < knobs.value_chunk <= self.dv and self.dv % knobs.value_chunk == 0 \
            else self.dv
        self.n_q = -(-self.lq // self.qt)
        # few queries: each score a dot product of a query row and a key row, as `dot_lanes`
        # partial sums (a vector of the head dimension) added up afterwards
        self.dot_lanes = next((n for n in (16, 8) if self.d % n == 0), 0) if self.qt < FEW_QUERIES else 0

    def c(self, value: float) -> E.Expr:
        return E.const(value, self.dtype)

    # -- the program ----------------------------------------------------------------------------
    def program(self) -> ir.Stmt:
        qt, dt = self.qt, self.dtype
        self.q_t = (ir.Buffer("q_rows", (qt, self.d), dt, "local") if self.dot_lanes
                    else ir.Buffer("q_t", (self.d, qt), dt, "local"))
        self.m = ir.Buffer("row_max", (qt,), dt, "local")
        self.l = ir.Buffer("row_sum", (qt,), dt, "local")
        self.acc = ir.Buffer("acc", (qt, self.dv), dt, "local")
        task = E.Var("task")
        self.n = task // _i(self.heads * self.n_q)
        self.h = (task // _i(self.n_q)) % _i(self.heads)
        self.hk = self.h // _i(self.p.group)
        self.q0 = (task % _i(self.n_q)) * _i(qt)
        init = ir.seq([
            self.load_queries(),
            _loop("qi", qt, lambda qi: ir.seq([ir.Store(self.m, (qi,), self.c(-math.inf)),
                                               ir.Store(self.l, (qi,), self.c(0.0))]), "vectorized"),
            _loop("qi", qt, lambda qi: _loop(
                "e", self.dv, lambda e: ir.Store(self.acc, (qi, e), self.c(0.0)), "vectorized")),
        ])
        full, rest = divmod(self.lk, self.kt)
        tiles = []
        if full:
            tiles.append(_loop("kt", full, lambda t: self.key_tile(t * _i(self.kt), self.kt)))
        if rest:
            tiles.append(self.key_tile(_i(full * self.kt), rest))
        body = ir.seq([init, *tiles, self.write_out()])
        for buf in (self.acc, self.l, self.m, self.q_t):
            body = ir.Allocate(buf, body)
        macs = self.batch * self.heads * self.lq * self.lk * (self.d + self.dv)
        return ir.For(task, self.batch * self.heads * self.n_q, "parallel" if macs >= MIN_PARALLEL_MACS else "serial", body)

    def query_row(self, qi: E.Expr) -> E.Expr:
        """The query row of tile position `qi`; past the last query (a ragged last tile) row 0,
        whose results are never stored."""
        i = self.q0 + qi
        if self.lq % self.qt == 0:
            return i
        return E.if_then_else(E.compare("<", i, _i(self.lq)), i, _i(0))

    def load_queries(self) -> ir.Stmt:
        """q_t[d, qi] = q[n, h, q0 + qi, d] * scale (q_rows[qi, d] for dot-product scores):
        scaled once here, not per score."""
        def store(qi, dd):
            value = self.read(self.p.q, (self.n, self.h, self.query_row(qi), dd)) * self.c(self.p.scale)
            return ir.Store(self.q_t, (qi, dd) if self.dot_lanes else (dd, qi), value)
        return _loop("qi", self.qt, lambda qi: _loop("dd", self.d, lambda dd: store(qi, dd)))

    def key_tile(self, k0: E.Expr, keys: int) -> ir.Stmt:
        """One tile of `keys` keys from key k0, skipped where every key of it is masked."""
        qt, dt = self.qt, self.dtype
        s_t = ir.Buffer("scores_t", (keys, qt), dt, "local")
        new_max = ir.Buffer("new_max", (qt,), dt, "local")
        corr = ir.Buffer("correction", (qt,), dt, "local")
        o = ir.Buffer("tile_out", (qt, self.dv), dt, "local")
        self.s_t, self.new_max, self.corr, self.o = s_t, new_max, corr, o
        weighted = ir.Allocate(o, ir.seq([
            _loop("qi", qt, lambda qi: _loop("e", self.dv, lambda e: ir.Store(o, (qi, e), self.c(0.0)), "vectorized")),
            self.weighted_sum(k0, keys),
            _loop("qi", qt, lambda qi: _loop("e", self.dv, lambda e: ir.Store(
                self.acc, (qi, e),
                ir.BufferLoad(self.acc, (qi, e)) * ir.BufferLoad(corr, (qi,)) + ir.BufferLoad(o, (qi, e))),
                "vectorized")),
        ]))
        body = ir.Allocate(s_t, ir.seq([
            _loop("ki", keys, lambda ki: _loop("qi", qt, lambda qi: ir.Store(s_t, (ki, qi), self.c(0.0)),
                                               "vectorized")),
            self.scores(k0, keys),
            self.mask(k0, keys),
            ir.Allocate(new_max, ir.Allocate(corr, ir.seq([self.online_softmax(keys), weighted]))),
        ]))
        visible = []
        if self.p.causal:  # the tile's first key is not after the tile's last query
            visible.append(E.compare("<=", k0, self.q0 + _i(qt - 1)))
        if self.p.lengths is not None:
            visible.append(E.compare("<", k0, self.length()))
        cond = E.all_of(visible)
        return body if cond is None else ir.IfThenElse(cond, body)

    def length(self) -> E.Expr:
        return E.cast(self.read(self.p.lengths, (self.n,)), "int32")

    def scores(self, k0: E.Expr, keys: int) -> ir.Stmt:
        """s_t[ki, qi] += K[k0 + ki, d] * q_t[d, qi], in blocks of RK keys: for each block the
        loop over d runs inside, so its RK x QT accumulators stay in registers."""
        if self.dot_lanes:
            return self.dot_scores(k0, keys)
        def block(first, _b, rows):
            return _loop("dd", self.d, lambda dd: _loop("r", rows, lambda r: _loop("qi", self.qt, lambda qi: ir.Store(
                self.s_t, (first + r, qi),
                ir.BufferLoad(self.s_t, (first + r, qi))
                + self.read(self.p.k, (self.n, self.hk, k0 + first + r, dd)) * ir.BufferLoad(self.q_t, (dd, qi))),
                "vectorized")))
        return _blocks(keys, self.rk, block)

    def dot_scores(self, k0: E.Expr, keys: int) -> ir.Stmt:
        """For each query: partial[ki, l] += q_rows[qi, c*L + l] * K[k0 + ki, c*L + l] over the
        head dimension's chunks c of L, in blocks of RK keys (both operands contiguous, the
        block's accumulators in registers), then s_t[ki, qi] = the sum of partial[ki, :] as a
        balanced tree of adds (short dependency chains)."""
        lanes = self.dot_lanes
        partial = ir.Buffer("partial", (keys, lanes), self.dtype, "local")

        def block(qi):
            def nest(first, _b, rows):
                return _loop("c", self.d // lanes, lambda c: _loop("r", rows, lambda r: _loop("l", lanes, lambda l_: ir.Store(
                    partial, (first + r, l_),
                    ir.BufferLoad(partial, (first + r, l_))
                    + ir.BufferLoad(self.q_t, (qi, c * _i(lanes) + l_))
                    * self.read(self.p.k, (self.n, self.hk, k0 + first + r, c * _i(lanes) + l_))), "vectorized")))
            return ir.Allocate(partial, ir.seq([  # per query, so the register-tile pass sees its nests
                _loop("ki", keys, lambda ki: _loop("l", lanes, lambda l_: ir.Store(partial, (ki, l_), self.c(0.0)),
                                                   "vectorized")),
                _blocks(keys, self.rk, nest),
                _loop("ki", keys, lambda ki: ir.Store(self.s_t, (ki, qi), _tree_sum(
                    [ir.BufferLoad(partial, (ki, _i(l_))) for l_ in range(lanes)]))),
            ]))
        return _loop("qi", self.qt, block)

    def mask(self, k0: E.Expr, keys: int) -> ir.Stmt | None:
        """The additive mask added and masked keys set to -inf. The causal and padding masks
        are only applied on tiles they reach (the diagonal, the sequence's end)."""
        reaches = []
        if self.p.causal:
            reaches.append(E.compare(">", k0 + _i(keys - 1), self.q0))
        if self.p.lengths is not None:
            reaches.append(E.compare(">", k0 + _i(keys), self.length()))
        if self.p.mask is None and not reaches:
            return None

        def value(ki, qi):
            j, i = k0 + ki, self.q0 + qi
            v = ir.BufferLoad(self.s_t, (ki, qi))
            if self.p.mask is not None:
                shape = self.p.mask.shape
                full = (self.n, self.h, self.query_row(qi), j)[4 - len(shape):]
                v = v + self.read(self.p.mask, tuple(_i(0) if size == 1 else x for size, x in zip(shape, full)))
            conds = []
            if self.p.lengths is not None:
                conds.append(E.compare("<", j, self.length()))
            if self.p.causal:
                conds.append(E.compare("<=", j, i))
            cond = E.all_of(conds)
            return v if cond is None else E.if_then_else(cond, v, self.c(-math.inf))

        masked = _loop("ki", keys, lambda ki: _loop("qi", self.qt, lambda qi: ir.Store(
            self.s_t, (ki, qi), value(ki, qi)), "vectorized"))
        if self.p.mask is not None:
            return masked
        return ir.IfThenElse(reaches[0] if len(reaches) == 1 else reaches[0] | reaches[1], masked)

    def online_softmax(self, keys: int) -> ir.Stmt:
        """Per query (vector lanes): the new maximum, the correction exp(old max - new max),
        the tile's exponentials and the running sum. While a query has seen only masked keys
        its maximum is -inf; exponentials are then taken against 0 so they stay 0, not NaN."""
        s_t, m, mx, corr, l_ = self.s_t, self.m, self.new_max, self.corr, self.l
        qt = self.qt

        def finite(x):
            return E.if_then_else(E.compare("==", x, self.c(-math.inf)), self.c(0.0), x)

        def ld(buf, *idx):
            return ir.BufferLoad(buf, idx)
        return ir.seq([
            _loop("qi", qt, lambda qi: ir.Store(mx, (qi,), ld(m, qi)), "vectorized"),
            _loop("ki", keys, lambda ki: _loop("qi", qt, lambda qi: ir.Store(
                mx, (qi,), E.maximum(ld(mx, qi), ld(s_t, ki, qi))), "vectorized")),
            _loop("qi", qt, lambda qi: ir.seq([
                ir.Store(corr, (qi,), E.exp(ld(m, qi) - finite(ld(mx, qi)))),
                ir.Store(l_, (qi,), ld(l_, qi) * ld(corr, qi)),
                ir.Store(m, (qi,), ld(mx, qi)),
                ir.Store(mx, (qi,), finite(ld(mx, qi))),  # the offset the exponentials take
            ]), "vectorized"),
            # with few queries the keys are the lanes of the exponentials (contiguous for one)
            _loop("qi", qt, lambda qi: _loop("ki", keys, lambda ki: ir.Store(
                s_t, (ki, qi), E.exp(ld(s_t, ki, qi) - ld(mx, qi))), "vectorized")) if self.dot_lanes else
            _loop("ki", keys, lambda ki: _loop("qi", qt, lambda qi: ir.Store(
                s_t, (ki, qi), E.exp(ld(s_t, ki, qi) - ld(mx, qi))), "vectorized")),
            _loop("ki", keys, lambda ki: _loop("qi", qt, lambda qi: ir.Store(
                l_, (qi,), ld(l_, qi) + ld(s_t, ki, qi)), "vectorized")),
        ])

    def weighted_sum(self, k0: E.Expr, keys: int) -> ir.Stmt:
        """o[qi, e] += s_t[ki, qi] * V[k0 + ki, e], in blocks of RQ queries x W columns with the
        loop over the tile's keys inside."""
        w = self.w

        def block(first, _b, rows):
            def chunk(ec):
                return _loop("ki", keys, lambda ki: _loop("r", rows, lambda r: _loop("e", w, lambda e: ir.Store(
                    self.o, (first + r, ec * _i(w) + e),
                    ir.BufferLoad(self.o, (first + r, ec * _i(w) + e))
                    + ir.BufferLoad(self.s_t, (ki, first + r))
                    * self.read(self.p.v, (self.n, self.hk, k0 + ki, ec * _i(w) + e))), "vectorized")))
            return _loop("ec", self.dv // w, chunk)
        return _blocks(self.qt, self.rq, block)

    def write_out(self) -> ir.Stmt:
        def row(qi):
            i = self.q0 + qi
            where = (self.n, i, self.h) if self.p.heads_last else (self.n, self.h, i)
            store = _loop("e", self.dv, lambda e: ir.Store(
                self.out_buf, (*where, e),
                ir.BufferLoad(self.acc, (qi, e)) / ir.BufferLoad(self.l, (qi,))), "vectorized")
            if self.lq % self.qt == 0:
                return store
            return ir.IfThenElse(E.compare("<", i, _i(self.lq)), store)
        return _loop("qi", self.qt, row)
