"""Lower a State to the loop IR: bound inference for attached stages, buffers, guards, stores.

Stages are visited consumers-first, so when a stage is computed inside a consumer's loop
(compute_at, cache stages), the region of it that one iteration of that loop reads is known:
it becomes a small buffer allocated at the attach point and indexed relative to the region's
start. Non-divisible splits and regions that stick out of a tensor get guards.

Root stages that read only constant inputs (a weight copied into a tiled layout) go to a second
function, `<name>_prepack`, run once ahead of the calls; their buffers become parameters of both
(role "packed"), and the kernel itself only reads them (Ansor's layout rewrite).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ansor.lower import ir
from ansor.lower.attention import lower_attention, template_stage
from ansor.lower.gemm_template import gemm_template_stage, lower_gemm
from ansor.schedule.relations import leaf_expressions, root_axis_of
from ansor.schedule.printer import state_to_str
from ansor.schedule.state import ScheduleError, Stage, State
from ansor.te import expr as E
from ansor.te.arith import Simplifier, const_bounds, simplify
from ansor.te.tensor import ComputeOp

_LOOP_KIND = {"none": "serial", "parallel": "parallel", "vectorize": "vectorized", "unroll": "unrolled"}

#: Loops a buffer of each scope is shared across, so its region covers all their iterations:
#: a shared-memory tile holds what the whole block reads (every thread and virtual thread of it).
_RELAXED_BY_SCOPE = {"shared": frozenset({"threadIdx.x", "threadIdx.y", "threadIdx.z", "vthread"})}


@dataclass
class _StageLowering:
    """Per-stage facts computed during lowering."""

    stage: Stage
    loop_vars: list[E.Var] = field(default_factory=list)
    loop_extents: list[int] = field(default_factory=list)
    axis_values: dict[int, E.Expr] = field(default_factory=dict)  # id(op axis) -> absolute value
    guards: list[E.Expr] = field(default_factory=list)
    region_lo: list[E.Expr] = field(default_factory=list)  # per spatial axis
    region_ext: list[int] = field(default_factory=list)
    path: list[E.Var] = field(default_factory=list)  # loop variables enclosing the stage
    dim_order: list[int] | None = None  # storage order of a private buffer's dimensions
    buffer: ir.Buffer | None = None
    body: E.Expr | None = None  # effective body (inlined producers substituted)


def lower(state: State, name: str = "kernel", prepack: bool = True) -> ir.PrimFunc:
    """The IR of a complete program (every split length decided); when some stages depend on
    constant inputs alone, `attrs["prepack"]` holds the function that computes them (unless
    `prepack` is False: an analysis of the kernel alone, such as its features, skips it)."""
    if not state.concrete:
        undecided = [f"{s.name}.{it.name}" for s in state.stages for it in s.iters if it.extent is None]
        raise ScheduleError(f"cannot lower: split lengths undecided for {', '.join(undecided[:4])}")
    if template_stage(state) is not None:  # written whole from its knobs (lower/attention.py)
        return lower_attention(state, name)
    if gemm_template_stage(state) is not None:  # a GPU kernel written whole (lower/gemm_template.py)
        return lower_gemm(state, name)
    return _Lowerer(state, name, prepack).run()


def inferred_extents(state: State) -> dict[str, list[int]]:
    """Loop extents of every stage after bound inference (for printing the loop nest)."""
    low = _Lowerer(state, "kernel")
    low.run()
    return {L.stage.name: list(L.loop_extents) for L in low.info.values() if L.loop_extents}


def schedule_text(state: State) -> str:
    """The readable loop nest with the extents that really run, each statement's axes bound to
    the values lowering gives them (a stage computed inside another loop starts where its tile
    does)."""
    if not state.concrete:
        return state_to_str(state)
    if template_stage(state) is not None:
        return ir.ir_to_str(lower_attention(state).body)
    if gemm_template_stage(state) is not None:
        return ir.ir_to_str(lower_gemm(state).body)
    low = _Lowerer(state, "kernel")
    low.run()
    extents, values = {}, {}
    for L in low.info.values():
        if L.stage.is_placeholder:
            continue
        if L.loop_extents:
            extents[L.stage.name] = list(L.loop_extents)
        axes = [*L.stage.op.axes, *L.stage.op.reduce_axes]
        values[L.stage.name] = (L.loop_vars, {a.name: L.axis_values[id(a)] for a in axes if id(a) in L.axis_values})
    return state_to_str(state, extents=extents, axis_values=values)


class _Lowerer:
    def __init__(self, state: State, name: str, prepack: bool = True):
        self.state = state
        self.name = name
        self.prepack = prepack  # emit the prepack function's stages
        self.by_tensor = {id(s.tensor): i for i, s in enumerate(state.stages)}
        self.info: dict[int, _StageLowering] = {}
        self.ranges: dict[int, tuple[int, int]] = {}  # id(loop var) -> (0, extent - 1)
        self.annotation: dict[int, str] = {}  # id(loop var) -> its iterator's annotation
        self.simplifier = Simplifier(self.ranges)
        self.attached: dict[tuple[str, str], list[int]] = {}  # (stage, loop) -> stages computed there
        for sid, s in enumerate(state.stages):
            if isinstance(s.attach, tuple):
                self.attached.setdefault(s.attach, []).append(sid)

    # --- entry ------------------------------------------------------------------------------
    def run(self) -> ir.PrimFunc:
        st = self.state
        params = []
        for t in st.dag.inputs:
            params.append(ir.Buffer(st.stages[self.by_tensor[id(t)]].name, t.shape, t.dtype, "global", "input"))
        for t in st.dag.outputs:
            params.append(ir.Buffer(st.stages[self.by_tensor[id(t)]].name, t.shape, t.dtype, "global", "output"))
        param_of = {id(t): b for t, b in zip(st.dag.inputs + st.dag.outputs, params)}
        order = [i for i, s in enumerate(st.stages) if not s.is_placeholder and s.attach != "inline"]
        for sid, s in enumerate(st.stages):
            if s.is_placeholder:
                self.info[sid] = _StageLowering(s, buffer=param_of[id(s.tensor)])
        for sid in reversed(order):
            self._infer_stage(sid, param_of)
        prepacked = _prepack_stages(st, order)
        for sid in prepacked:
            L = self.info[sid]
            L.buffer = replace(L.buffer, scope="global", role="packed")
            params.append(L.buffer)
        temps: list[ir.Buffer] = []
        body_parts, prepack_parts = [], []
        for sid in order:
            s = st.stages[sid]
            if s.attach == "root" and (self.prepack or sid not in prepacked):
                (prepack_parts if sid in prepacked else body_parts).append(self._emit_stage(sid))
                if id(s.tensor) not in param_of and sid not in prepacked:
                    temps.append(self.info[sid].buffer)
        body = ir.seq(body_parts)
        for buf in reversed(temps):
            body = ir.Allocate(buf, body)
        func = ir.PrimFunc(self.name, params, body)
        if prepack_parts:
            func.attrs["prepack"] = ir.PrimFunc(f"{self.name}_prepack", params, ir.seq(prepack_parts))
        return func

    # --- analysis ---------------------------------------------------------------------------
    def _infer_stage(self, sid: int, param_of: dict) -> None:
        st = self.state
        s = st.stages[sid]
        op: ComputeOp = s.op
        L = _StageLowering(s)
        self.info[sid] = L
        if s.attach == "root":
            L.region_lo = [E.Const(0, "int32") for _ in op.axes]
            L.region_ext = [a.extent for a in op.axes]
        else:
            target_name, iter_name = s.attach
            tid = st.stage_id(target_name)
            T = self.info.get(tid)
            if T is None or not T.loop_vars:
                raise ScheduleError(f"stage {s.name!r} is computed at {target_name!r}, which is not a "
                                    f"looping stage")
            pos = st.stages[tid].iter_index(iter_name)
            L.path = T.path + T.loop_vars[:pos + 1]
            L.region_lo, L.region_ext = self._infer_region(sid, L.path)
        if id(s.tensor) in param_of:
            L.buffer = param_of[id(s.tensor)]
        else:
            # a stage computed inside another loop gets a private buffer unless it asked for one
            scope = "local" if s.attach != "root" and s.scope == "global" else s.scope
            shape = tuple(L.region_ext)
            if s.attach != "root":
                L.dim_order = _loop_dim_order(s)
                if L.dim_order is not None:
                    shape = tuple(shape[d] for d in L.dim_order)
            if s.layout is not None:
                if s.attach != "root":
                    raise ScheduleError(f"stage {s.name!r}: a stage stored in a tiled layout must be "
                                        f"computed at the root")
                dim, factor = s.layout
                shape = _physical_shape(shape, dim, factor, s.interleave)
            L.buffer = ir.Buffer(s.name, shape, op.dtype, scope, "temp")
        # loops
        root_ext = {a.name: e for a, e in zip(op.axes, L.region_ext)}
        root_ext.update({a.name: a.extent for a in op.reduce_axes})
        leaf_vars = {it.name: E.Var(it.name) for it in s.iters}
        values, guards, extents = leaf_expressions(s, leaf_vars, root_ext)
        L.loop_vars = [leaf_vars[it.name] for it in s.iters]
        L.loop_extents = [extents[it.name] for it in s.iters]
        for v, e, it in zip(L.loop_vars, L.loop_extents, s.iters):
            self.ranges[id(v)] = (0, e - 1)
            self.annotation[id(v)] = it.annotation
        for d, a in enumerate(op.axes):
            L.axis_values[id(a)] = self.simplifier.simplify(values[a.name] + L.region_lo[d])
            if s.attach != "root":
                lo, hi = const_bounds(L.axis_values[id(a)], self.ranges)
                if lo < 0 or hi >= a.extent:
                    guards.append((L.axis_values[id(a)] >= 0) & (L.axis_values[id(a)] < a.extent))
        for a in op.reduce_axes:
            L.axis_values[id(a)] = self.simplifier.simplify(values[a.name] + a.lo if a.lo else values[a.name])
        L.guards = [g for g in (self.simplifier.simplify(g) for g in guards)
                    if not (isinstance(g, E.Const) and g.value)]
        L.body = st.effective_body(sid)

    def _infer_region(self, sid: int, path: list[E.Var]) -> tuple[list[E.Expr], list[int]]:
        """Region of stage `sid` read by its consumers during one iteration at the attach point."""
        st = self.state
        s = st.stages[sid]
        relaxed = _RELAXED_BY_SCOPE.get(s.scope, frozenset())
        path_ids = {id(v) for v in path if self.annotation.get(id(v)) not in relaxed}
        per_dim: list[list[tuple[E.Expr, E.Expr]] | None] = [[] for _ in s.op.axes]
        inner = None  # the ranges of the loops a consumer sweeps below the attach point
        for cid in st.consumers(sid):
            C = self.info.get(cid)
            if C is None or C.body is None:
                raise ScheduleError(f"stage {s.name!r} is computed inside a loop, but its consumer "
                                    f"{st.stages[cid].name!r} is not nested in that loop")
            if not all(id(v) in {id(x) for x in C.path + C.loop_vars} for v in path):
                raise ScheduleError(f"stage {s.name!r} is computed at {s.attach[0]}.{s.attach[1]}, but "
                                    f"its consumer {st.stages[cid].name!r} reads it outside that loop")
            for read in _reads_of(C.body, s.tensor):
                for d, idx in enumerate(read.indices):
                    if per_dim[d] is None:
                        continue
                    value = self.simplifier.simplify(E.substitute(idx, self._axis_map(C)))
                    if inner is None:
                        inner = {k: r for k, r in self.ranges.items() if k not in path_ids}
                    b = self.simplifier.bounds_over(value, inner)
                    per_dim[d] = None if b is None else per_dim[d] + [b]
        los, exts = [], []
        all_ranges = self.ranges
        for d, a in enumerate(s.op.axes):
            bounds = per_dim[d]
            lo_hi = _union(bounds) if bounds else None
            if lo_hi is None:
                los.append(E.Const(0, "int32"))
                exts.append(a.extent)
                continue
            lo, hi = lo_hi
            ext_expr = self.simplifier.simplify(hi - lo + 1)
            if isinstance(ext_expr, E.Const):
                ext = ext_expr.value
            else:
                ext = const_bounds(ext_expr, all_ranges)[1]
            if ext == float("inf") or ext >= a.extent:
                los.append(E.Const(0, "int32"))
                exts.append(a.extent)
            else:
                los.append(lo)
                exts.append(max(1, int(ext)))
        return los, exts

    def _axis_map(self, L: _StageLowering) -> dict:
        op = L.stage.op
        return {a: L.axis_values[id(a)] for a in list(op.axes) + list(op.reduce_axes)}

    # --- emission ---------------------------------------------------------------------------
    def _load(self, node: E.Expr):
        if isinstance(node, E.TensorRead):
            pid = self.by_tensor[id(node.tensor)]
            P = self.info[pid]
            idx = [self.simplifier.simplify(i - lo) if not (isinstance(lo, E.Const) and lo.value == 0) else i
                   for i, lo in zip(node.indices, P.region_lo)] if P.region_lo else list(node.indices)
            if P.dim_order is not None:
                idx = [idx[d] for d in P.dim_order]
            if P.stage.layout is not None:
                idx = self._physical(idx, P.stage.layout, P.stage.interleave)
            return ir.BufferLoad(P.buffer, idx)
        return None

    def _physical(self, idx: list, layout: tuple[int, int], interleave: tuple[int, int] | None = None) -> list:
        """Logical indices -> indices into a buffer stored with one dimension tiled (and
        another interleaved in groups, the group position innermost)."""
        dim, factor = layout
        simplify_ = self.simplifier.simplify
        rest = [i for d, i in enumerate(idx) if d != dim]
        inner = [simplify_(idx[dim] % factor)]
        if interleave is not None:
            gdim, group = interleave
            at = gdim - (gdim > dim)
            rest[at], inner = simplify_(rest[at] // group), inner + [simplify_(rest[at] % group)]
        return [simplify_(idx[dim] // factor), *rest, *inner]

    def _to_ir(self, expr: E.Expr, L: _StageLowering) -> E.Expr:
        """Axes replaced by their loop expressions and tensor reads by buffer loads, in one
        bottom-up pass (a read's indices are substituted before the read is)."""
        axis_map = self._axis_map(L)

        def rewrite(node: E.Expr) -> E.Expr | None:
            return axis_map.get(node) if isinstance(node, E.Var) else self._load(node)

        return self.simplifier.simplify(E.transform(expr, rewrite))

    def _emit_stage(self, sid: int) -> ir.Stmt:
        st = self.state
        L = self.info[sid]
        s = L.stage
        op = s.op
        out_idx = [self.simplifier.simplify(L.axis_values[id(a)] - lo) for a, lo in zip(op.axes, L.region_lo)]
        if L.dim_order is not None:
            out_idx = [out_idx[d] for d in L.dim_order]
        if s.layout is not None:
            out_idx = self._physical(out_idx, s.layout, s.interleave)
        body = L.body
        if isinstance(body, E.Reduce):
            current = ir.BufferLoad(L.buffer, out_idx)
            source = self._to_ir(body.source, L)
            combined = {"sum": lambda a, b: a + b, "max": E.maximum, "min": E.minimum}[body.combiner](current, source)
            update: ir.Stmt = ir.Store(L.buffer, tuple(out_idx), combined)
            if body.where is not None:
                update = ir.IfThenElse(self._to_ir(body.where, L), update)
            init: ir.Stmt | None = ir.Store(L.buffer, tuple(out_idx), E.reduce_identity(body.combiner, op.dtype))
        else:
            update = ir.Store(L.buffer, tuple(out_idx), self._to_ir(body, L))
            init = None
        iters = s.iters
        first_reduce = next((p for p, it in enumerate(iters) if it.kind == "reduce"), None)
        # each guard goes right inside the innermost loop it depends on, not around every store
        guards_at: dict[int, list[E.Expr]] = {}
        position = {id(v): p for p, v in enumerate(L.loop_vars)}
        for g in L.guards:
            level = max((position[id(v)] for v in E.free_vars(g) if id(v) in position), default=-1)
            guards_at.setdefault(level, []).append(g)

        def guarded(p: int, stmt: ir.Stmt) -> ir.Stmt:
            cond = E.all_of(guards_at.get(p, []))
            return stmt if cond is None else ir.IfThenElse(cond, stmt)

        def loop(p: int, inner: ir.Stmt) -> ir.Stmt:
            it = iters[p]
            kind = _LOOP_KIND.get(it.annotation, it.annotation)
            if L.loop_extents[p] == 1 and kind in ("serial", "parallel", "vectorized", "unrolled", "vthread"):
                return inner  # a single iteration: its variable was simplified to 0
            return ir.For(L.loop_vars[p], L.loop_extents[p], kind, inner)

        def build(p: int) -> ir.Stmt:
            if p == len(iters):
                return update
            children = self.attached.get((s.name, iters[p].name), ())
            block = ir.seq([self._emit_stage(c) for c in children] + [guarded(p, build(p + 1))])
            for c in reversed(children):  # attached buffers live for the whole loop body
                if self.info[c].buffer.role == "temp":
                    block = ir.Allocate(self.info[c].buffer, block)
            inner = loop(p, block)
            if p == first_reduce and init is not None:
                init_nest = init
                for q in reversed(range(p + 1, len(iters))):
                    if iters[q].kind != "reduce":
                        init_nest = loop(q, guarded(q, init_nest))
                return ir.seq([init_nest, inner])
            return inner

        if not iters:  # a zero-dimensional stage
            stmt = update if init is None else ir.seq([init, update])
        else:
            stmt = build(0)
            if first_reduce is None and init is not None:
                stmt = ir.seq([init, stmt])
        build = None  # noqa: F841 - a recursive closure refers to itself: free it now, not at GC
        stmt = guarded(-1, stmt)
        if s.auto_unroll_max_step > 0:
            _mark_auto_unroll(stmt, s.auto_unroll_max_step)
        return stmt


def _prepack_stages(state: State, order: list[int]) -> set[int]:
    """Root stages (in `order`, producers first) computed from constant inputs and other such
    stages alone, with nothing attached inside them: they can run once, ahead of the calls."""
    out: set[int] = set()
    for sid in order:
        s = state.stages[sid]
        if s.attach != "root" or state.is_output(sid) or state.attached_to(s.name):
            continue
        sources = [state.stage_id(t) for t in E.tensors_read(state.effective_body(sid))]
        if sources and all(p in out or (state.stages[p].is_placeholder and state.stages[p].op.constant)
                           for p in sources):
            out.add(sid)
    return out


def _loop_dim_order(stage: Stage) -> list[int] | None:
    """Storage order for a stage's private buffer: the dimension of its innermost spatial loop
    last, so the vectorized loop walks the buffer contiguously (a convolution tile vectorized
    over output channels keeps its accumulators channel-innermost). None: declared order."""
    spatial = [it for it in stage.iters if it.kind == "spatial"]
    if not spatial:
        return None
    name = root_axis_of(stage, spatial[-1].name)
    names = [a.name for a in stage.op.axes]
    if name not in names or names.index(name) == len(names) - 1:
        return None
    d = names.index(name)
    return [i for i in range(len(names)) if i != d] + [d]


def _physical_shape(shape: tuple[int, ...], dim: int, factor: int,
                    interleave: tuple[int, int] | None = None) -> tuple[int, ...]:
    rest = [n for d, n in enumerate(shape) if d != dim]
    inner = [factor]
    if interleave is not None:
        gdim, group = interleave
        at = gdim - (gdim > dim)
        rest[at], inner = -(-rest[at] // group), inner + [group]
    return (-(-shape[dim] // factor), *rest, *inner)


def _reads_of(expr: E.Expr, tensor) -> list[E.TensorRead]:
    return [n for n in E.walk(expr) if isinstance(n, E.TensorRead) and n.tensor is tensor]


def _union(bounds: list[tuple[E.Expr, E.Expr]]) -> tuple[E.Expr, E.Expr] | None:
    """Union of intervals whose ends differ by constants; None when they do not."""
    lo, hi = bounds[0]
    for l2, h2 in bounds[1:]:
        dl, dh = simplify(l2 - lo), simplify(h2 - hi)
        if not isinstance(dl, E.Const) or not isinstance(dh, E.Const):
            return None
        if dl.value < 0:
            lo = l2
        if dh.value > 0:
            hi = h2
    return lo, hi


def _mark_auto_unroll(stmt: ir.Stmt, max_step: int) -> int:
    """Mark serial loops whose whole nest runs at most `max_step` iterations; returns the nest's
    iteration count."""
    if isinstance(stmt, ir.For):
        inner = _mark_auto_unroll(stmt.body, max_step)
        total = stmt.extent * inner
        if total <= max_step and stmt.kind == "serial":
            stmt.unroll_hint = True
        return total
    if isinstance(stmt, ir.Seq):
        return max([_mark_auto_unroll(s, max_step) for s in stmt.stmts] or [1])
    if isinstance(stmt, ir.IfThenElse):
        return _mark_auto_unroll(stmt.then, max_step)
    if isinstance(stmt, ir.Allocate):
        return _mark_auto_unroll(stmt.body, max_step)
    return 1
