"""Padded rows skipped at run time: a bucket's kernel computes only the rows a call keeps.

A bucket of a dynamic model runs at a padded size P for every call of length L <= P
(`graph.bucketed`). Where a kernel's output holds the padded dimension whole on one axis (rows
r >= L * inner of it are padding), the rows past the call's length need no work.
This pass, run on the finished CPU loop IR of such a kernel, makes its loops skip them at run
time. The length is a global of the kernel's library, `ansor_live_rows`, which the bucketed
model sets before each call; it holds P otherwise, so the program runs every row when it is
measured, checked or called on its own.

- The outermost parallel loop of a nest gets a run-time trip count from a table indexed by the
  length (one past the last iteration that writes a kept row): the skipped iterations are not
  all taken from one thread's share.
- Every parallel or serial loop whose variable moves the output row skips an iteration whose
  lowest stored row is padding (a guard on the symbolic lower bound of the row index over the
  loops inside it). Vectorized and unrolled loops are left whole.
- A register tile whose rows straddle the kept length (the last tile of the kept rows) updates
  only the accumulator vectors of kept rows (`ir.RaggedRows`): at length 17, a kernel of 8-row
  tiles computes 17 rows instead of 24.
- Then the padded rows of the output are set to zero, so no buffer holds a stale value past
  the length: a later kernel may read padded rows (attention weighs masked keys by exactly
  zero, which needs them finite), and zero is what the padding of the inputs holds.

Sound by construction: an iteration is skipped only when every output row it stores is at or
past the kept length and every other buffer it writes is read only inside the same loop (a
stage computed at that loop), so no kept row and no value read later depends on it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

from ansor.lower import ir
from ansor.te import expr as E
from ansor.lower.rewrite import flat_seq
from ansor.te.arith import const_bounds, simplify, symbolic_bounds, to_linear

#: The C global of a kernel library that holds the call's length (the padded size P by default).
GLOBAL = "ansor_live_rows"
#: Loop kinds whose iterations may be skipped (the others are one vector or unrolled copies).
SKIPPABLE_KINDS = ("serial", "parallel")
E_INF = float("inf")
#: The most points of an accumulator's copy into the output enumerated to map its elements to rows.
MAX_COPY_POINTS = 4096


@dataclass(frozen=True)
class LiveRowsSpec:
    """Where a kernel's output holds the padded dimension: output `axis`, its index r holding
    the dimension's index r // `inner`, `padded` the bucket size P (the axis has extent
    P * inner, so rows r >= L * inner are padding at length L)."""

    axis: int
    inner: int
    padded: int


@dataclass
class LiveRowsPlan:
    """What the printer emits for a kernel that skips padded rows: the kept-row count `live`
    (a variable: `ansor_live_rows * inner`), the run-time trip tables of top-level parallel loops
    (by loop identity), and the output to zero past the kept rows: `slabs` blocks of rows (the
    outer axes), `row_elements` per row."""

    spec: LiveRowsSpec
    live: E.Var
    output: ir.Buffer
    row_elements: int
    slabs: int
    trip_tables: dict[int, tuple[ir.For, tuple[int, ...]]] = field(default_factory=dict)

    def trips_name(self, loop: ir.For) -> str | None:
        """The C name of a loop's trip table (None: the loop runs its full extent)."""
        for k, (held, _) in enumerate(self.trip_tables.values()):
            if held is loop:
                return f"ansor_live_trips_{k}"
        return None


def skip_padded_rows(func: ir.PrimFunc, spec: LiveRowsSpec) -> ir.PrimFunc:
    """`func` with its loops skipping the padded rows of its output (`attrs["live_rows"]`),
    or unchanged where it cannot (several outputs, an output axis that is not the bucket's,
    a program printed whole from a template)."""
    outputs = [b for b in func.params if b.role == "output"]
    if len(outputs) != 1 or any(isinstance(s, (ir.WrittenProgram, ir.GPUKernel)) for s in ir.walk_stmts(func.body)):
        return func
    out = outputs[0]
    shape = tuple(out.shape)
    if spec.axis >= len(shape) or shape[spec.axis] != spec.padded * spec.inner:
        return func
    live = E.Var("ansor_live", "int32")
    plan = LiveRowsPlan(spec, live, out, math.prod(shape[spec.axis + 1:]), math.prod(shape[:spec.axis]))
    loads = _load_counts(func.body)
    body = _Skipper(plan, loads).stmt(func.body, top=True)
    return replace(func, body=body, attrs={**func.attrs, "live_rows": plan})


def _load_counts(stmt: ir.Stmt) -> dict[int, int]:
    """How many loads of each buffer (by identity) `stmt` holds."""
    counts: dict[int, int] = {}
    for e in _exprs(stmt):
        for node in E.walk(e):
            if isinstance(node, ir.BufferLoad):
                counts[id(node.buffer)] = counts.get(id(node.buffer), 0) + 1
    return counts


def _exprs(stmt: ir.Stmt):
    """Every expression of the statements under `stmt` (store values and indices, conditions)."""
    for s in ir.walk_stmts(stmt):
        if isinstance(s, ir.Store):
            yield s.value
            yield from s.indices
        elif isinstance(s, (ir.IfThenElse, ir.Unswitched)):
            yield s.cond


class _Skipper:
    def __init__(self, plan: LiveRowsPlan, loads: dict[int, int]):
        self.plan = plan
        self.loads = loads

    def stmt(self, s: ir.Stmt, top: bool = False) -> ir.Stmt:
        if isinstance(s, ir.Seq):
            return ir.Seq([self.stmt(x, top) for x in s.stmts])
        if isinstance(s, ir.Allocate):
            return ir.Allocate(s.buffer, self.stmt(_with_ragged_tiles(s, self.plan), top))
        if isinstance(s, ir.IfThenElse):
            return ir.IfThenElse(s.cond, self.stmt(s.then), None if s.orelse is None else self.stmt(s.orelse))
        if isinstance(s, ir.For) and s.kind in SKIPPABLE_KINDS:
            return self.loop(s, top)
        return s  # vector loops, register tiles, transposed stores, unswitched nests: whole

    def loop(self, s: ir.For, top: bool) -> ir.Stmt:
        rows = [st.indices[self.plan.spec.axis] for st in ir.walk_stmts(s.body)
                if isinstance(st, ir.Store) and st.buffer is self.plan.output]
        if not rows:
            return s  # writes no output row: nothing of it is skipped
        loop = ir.For(s.var, s.extent, s.kind, self.stmt(s.body), s.unroll_hint)
        if not self._writes_only_local(s):
            return loop
        inner = {id(x.var): (0, x.extent - 1) for x in ir.walk_stmts(s.body) if isinstance(x, ir.For)}
        lows = [symbolic_bounds(r, inner) for r in rows]
        if any(b is None for b in lows) or not any(_mentions(b[0], s.var) for b in lows):
            return loop
        lowest = lows[0][0]
        for b in lows[1:]:
            lowest = E.BinOp("min", lowest, b[0], "int32")
        guarded = ir.For(s.var, s.extent, s.kind, ir.IfThenElse(simplify(lowest) < self.plan.live, loop.body), s.unroll_hint)
        if top and s.kind == "parallel":
            table = self._trip_table(s, rows, inner)
            if table is not None:
                self.plan.trip_tables[id(guarded)] = (guarded, table)
        return guarded

    def _writes_only_local(self, s: ir.For) -> bool:
        """Whether every buffer but the output that `s` stores to is read only inside `s` and
        is no parameter: skipping an iteration then loses nothing read elsewhere."""
        inside = _load_counts(s.body)
        for st in ir.walk_stmts(s.body):
            if isinstance(st, ir.Store) and st.buffer is not self.plan.output:
                b = st.buffer
                if b.role in ("input", "output", "packed") or inside.get(id(b), 0) != self.loads.get(id(b), 0):
                    return False
        return True

    def _trip_table(self, s: ir.For, rows: list[E.Expr], inner: dict) -> tuple[int, ...] | None:
        """Per length L in 0..P, one past the last iteration of `s` whose lowest stored row is
        kept (< L * inner); None when no length lets any iteration go."""
        lowest = []
        for v in range(s.extent):
            ranges = dict(inner)
            ranges[id(s.var)] = (v, v)
            low = min(const_bounds(r, ranges)[0] for r in rows)
            if low == -E_INF:  # a row index interval arithmetic cannot bound
                return None
            lowest.append(low)
        spec = self.plan.spec
        table = tuple(1 + max((v for v, low in enumerate(lowest) if low < length * spec.inner), default=-1)
                      for length in range(spec.padded + 1))
        return table if min(table) < s.extent else None


def _with_ragged_tiles(alloc: ir.Allocate, plan: LiveRowsPlan) -> ir.Stmt:
    """The allocation's body with each register tile of its accumulator that is copied into
    the output's rows made ragged (`ir.RaggedRows`; float and dot-product tiles, AMX tiles stay
    whole): skipping the updates of padded rows changes nothing but those rows, which are set
    to zero at the end."""
    acc = alloc.buffer
    parts = flat_seq(alloc.body)
    if acc.scope != "local" or not any(isinstance(p, ir.RegisterTile) and p.buffer is acc for p in parts):
        return alloc.body
    readers = [p for p in parts if not isinstance(p, ir.RegisterTile) and _load_counts(p).get(id(acc))]
    if len(readers) != 1:
        return alloc.body
    rows = _rows_of_elements(readers[0], acc, plan)
    if rows is None:
        return alloc.body
    row0, element_rows = rows
    out = []
    for part in parts:
        if isinstance(part, ir.RegisterTile) and part.buffer is acc and part.amx is None:
            ragged = _ragged_rows(part, element_rows, simplify(plan.live - row0))
            part = part if ragged is None else replace(part, ragged=ragged)
        out.append(part)
    return out[0] if len(out) == 1 else ir.Seq(out)


def _rows_of_elements(copy: ir.Stmt, acc: ir.Buffer, plan: LiveRowsPlan) -> tuple[E.Expr, dict[int, int]] | None:
    """For the nest that copies the accumulator `acc` into the output: the output row of its
    first point (an expression in the loops around the allocation) and, per accumulator
    element, its output row counted from that one; None where the copy is not a plain nest of
    one store that reads one element of `acc` (maybe more than once: an epilogue like GELU)
    and writes one row."""
    loops = []
    node = copy
    while isinstance(node, ir.For):
        loops.append(node)
        node = node.body
    if (not isinstance(node, ir.Store) or node.buffer is not plan.output
            or math.prod(f.extent for f in loops) > MAX_COPY_POINTS):
        return None
    elements = [acc.flat_index(n.indices) for n in E.walk(node.value)
                if isinstance(n, ir.BufferLoad) and n.buffer is acc]
    if not elements:
        return None
    row = node.indices[plan.spec.axis]
    row0 = simplify(E.substitute(row, {f.var: E.Const(0, "int32") for f in loops}))
    rows: dict[int, int] = {}
    for values in itertools.product(*(range(f.extent) for f in loops)):
        binding = {f.var: E.Const(v, "int32") for f, v in zip(loops, values)}
        at = [simplify(E.substitute(element, binding)) for element in elements]
        if not all(isinstance(a, E.Const) and a.value == at[0].value for a in at):
            return None
        offset = to_linear(simplify(E.substitute(row, binding) - row0))
        if offset.terms or rows.setdefault(at[0].value, offset.const) != offset.const:
            return None
    return row0, rows


def _ragged_rows(tile: ir.RegisterTile, element_rows: dict[int, int], rows_left: E.Expr) -> ir.RaggedRows | None:
    """The tile's `ir.RaggedRows`, where each accumulator vector lies in one output row and
    the rows of the tile's block move linearly with its outer loops; None otherwise, and where
    the tile is one row that no outer loop of it moves (skipping the loops around it already
    does all there is)."""
    outer = tile.loops()[:tile.outer]
    base = tile.base if tile.base is not None else E.Const(0, "int32")

    def rows_at(values: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
        at = simplify(E.substitute(base, {f.var: E.Const(v, "int32") for f, v in zip(outer, values)}))
        if not isinstance(at, E.Const) or at.value not in element_rows:
            return None
        first = element_rows[at.value]
        slots = []
        for offset in tile.offsets:
            lanes = {element_rows.get(at.value + offset + lane) for lane in range(tile.lanes)}
            if len(lanes) != 1 or None in lanes:
                return None
            slots.append(lanes.pop() - first)
        return first, tuple(slots)

    origin = rows_at((0,) * len(outer))
    if origin is None:
        return None
    # the block's first row, linear in the outer loops: its step along each, checked at every point
    steps = []
    for n, f in enumerate(outer):
        unit = rows_at(tuple(int(m == n) for m in range(len(outer)))) if f.extent > 1 else origin
        if unit is None:
            return None
        steps.append(unit[0] - origin[0])
    if len(set(origin[1])) < 2 and not any(steps):
        return None  # one row, whose iteration is skipped whole already
    for values in itertools.product(*(range(f.extent) for f in outer)):
        at = rows_at(values)
        if at is None or at[1] != origin[1] or at[0] != origin[0] + sum(s * v for s, v in zip(steps, values)):
            return None
    shift: E.Expr = E.Const(origin[0], "int32")
    for f, step in zip(outer, steps):
        shift = shift + f.var * step
    return ir.RaggedRows(simplify(rows_left - shift), origin[1])


def _mentions(e: E.Expr, var: E.Var) -> bool:
    return any(node is var for node in E.walk(e))
