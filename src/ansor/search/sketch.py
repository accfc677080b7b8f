"""Sketch generation: derivation rules applied to the stages from output to input.

A rule is a condition plus an action. The condition says SKIP, APPLY (apply, and let later
rules also try this stage on the unmodified state) or APPLY_AND_SKIP_REST. Applying returns
new (state, next stage id) work items. Enumeration ends when every item has walked past the
first stage; the finished states are the sketches: high-level structures whose split lengths
are still undecided (None) until random annotation fills them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Sequence

from ansor.schedule.state import State
from ansor.te import expr as E
from ansor.target import Target


class Cond(Enum):
    SKIP = 0
    APPLY = 1
    APPLY_AND_SKIP_REST = 2


@dataclass
class Sketch:
    """A high-level program structure plus the rules that derived it."""

    state: State
    history: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list:
        return self.state.steps


@dataclass(frozen=True)
class SketchRule:
    """condition(ctx, state, stage_id) -> Cond; apply(ctx, state, stage_id) -> a list of
    (state, next stage id) or (state, next stage id, note) where the note labels the variant."""

    name: str
    condition: Callable[["SketchContext", State, int], Cond]
    apply: Callable[["SketchContext", State, int], list[tuple[State, int]]]


@dataclass
class SketchContext:
    target: Target
    tiling_structure: str = "SSRSRS"
    fusion_levels: tuple[int, ...] = (1, 2)
    pack_operands: bool = True


# ---------------------------------------------------------------------------------------------
# analysis helpers

def has_reduce(state: State, sid: int) -> bool:
    return bool(state.stages[sid].op.reduce_axes) if not state.stages[sid].is_placeholder else False


def needs_multi_level_tiling(state: State, sid: int) -> bool:
    return state.infos[sid].needs_multi_level_tiling


def is_strictly_inlineable(state: State, sid: int) -> bool:
    return state.infos[sid].strictly_inlineable


def elementwise_matched_consumer(state: State, sid: int) -> int | None:
    """The single consumer that reads this stage exactly at its own axes, if any."""
    consumers = state.consumers(sid)
    if len(consumers) != 1:
        return None
    c = consumers[0]
    producer, consumer = state.stages[sid], state.stages[c]
    if consumer.is_placeholder or tuple(consumer.op.shape) != tuple(producer.op.shape):
        return None
    if has_reduce(state, sid) and has_reduce(state, c):
        return None
    if consumer.scope == "shared":
        return None
    body = state.effective_body(c)
    reads = [n for n in E.walk(body) if isinstance(n, E.TensorRead) and n.tensor is producer.tensor]
    if not reads:
        return None
    for r in reads:
        if len(r.indices) != len(consumer.op.axes):
            return None
        if any(idx is not ax for idx, ax in zip(r.indices, consumer.op.axes)):
            return None
    return c


def space_and_reduce_lengths(state: State, sid: int) -> tuple[int, int]:
    op = state.stages[sid].op
    return math.prod(a.extent for a in op.axes), math.prod(a.extent for a in op.reduce_axes)


def needs_rfactor(ctx: SketchContext, state: State, sid: int) -> bool:
    if not has_reduce(state, sid):
        return False
    space, red = space_and_reduce_lengths(state, sid)
    cores = max(ctx.target.num_cores, 1)
    if needs_multi_level_tiling(state, sid):
        return space <= red and space <= 16 * cores
    return red > cores


# ---------------------------------------------------------------------------------------------
# actions

def multi_level_tile(state: State, sid: int, structure: str, innermost: int | None = None,
                     untiled: Sequence[str] = ()) -> list[int]:
    """Split spatial iterators into #S pieces and reduce iterators into #R pieces (lengths
    undecided), then order the pieces level by level. Within each spatial level the pieces
    follow the op's axis order, except that spatial axis number `innermost` (if given) goes
    last: the innermost loop is what gets vectorized. Iterators named in `untiled` stay whole,
    right after the last reduction level (a dot-product instruction's depth). Returns the
    spatial split step ids, in axis order."""
    st = state.stages[sid]
    n_s, n_r = structure.count("S"), structure.count("R")
    space_levels: list[list[tuple[bool, str]]] = [[] for _ in range(n_s)]
    reduce_levels: list[list[tuple[bool, str]]] = [[] for _ in range(n_r)]
    split_ids = []
    n_spatial_seen = 0
    for it in list(st.iters):
        if it.name in untiled:
            continue
        spatial = it.kind == "spatial"
        levels, n = (space_levels, n_s) if spatial else (reduce_levels, n_r)
        last = spatial and n_spatial_seen == innermost
        n_spatial_seen += spatial
        if n == 1:
            levels[0].append((last, it.name))
            continue
        if spatial:
            split_ids.append(len(state.steps))
        pieces = state.split(sid, it.name, [None] * (n - 1))
        for lv, p in enumerate(pieces):
            levels[lv].append((last, p.name))
    order: list[str] = []
    si = ri = 0
    for ch in structure:
        if ch == "S":
            order += _level_order(space_levels[si])
            si += 1
        else:
            order += _level_order(reduce_levels[ri])
            ri += 1
            if ri == n_r:
                order += list(untiled)
    state.reorder(sid, order)
    return split_ids


def _level_order(level: list[tuple[bool, str]]) -> list[str]:
    """The loops of one tile level, the one marked last moved to the end (a stable sort)."""
    return [name for _, name in sorted(level, key=lambda t: t[0])]


def follow_tiling(state: State, consumer: int, split_ids: Sequence[int], n_split: int,
                  innermost: int | None = None) -> None:
    """Tile a consumer's spatial loops like the producer's first n_split levels (spatial axis
    `innermost` last within each level, as in the producer)."""
    st = state.stages[consumer]
    spatial = [it for it in st.iters if it.kind == "spatial"]
    levels: list[list[tuple[bool, str]]] = [[] for _ in range(n_split + 1)]
    for k, (it, src) in enumerate(zip(spatial, split_ids)):
        pieces = state.follow_split(consumer, it.name, src, n_split)
        for lv, p in enumerate(pieces):
            levels[lv].append((k == innermost, p.name))
    order = [name for level in levels for name in _level_order(level)]
    rest = [it.name for it in state.stages[consumer].iters if it.name not in set(order)]
    state.reorder(consumer, order + rest)


def packable_operands(state: State, sid: int, innermost: int | None = None) -> list[tuple[int, int]]:
    """Inputs worth copying into a tiled layout for a tiled stage whose innermost loop runs
    over spatial axis number `innermost` (default: the last): inputs read with that axis as
    one index and a reduction axis as another, like B[k, j] of a matmul or W[f, c, ry, rx] of
    a convolution vectorized over f. Stored tiled along that dimension, the reduction walks
    them contiguously. Returns (stage id, dimension) pairs."""
    st = state.stages[sid]
    axes, reduce_axes = st.op.axes, st.op.reduce_axes
    if not axes or not reduce_axes:
        return []
    inner = axes[-1 if innermost is None else innermost]
    out: list[tuple[int, int]] = []
    for node in E.walk(state.effective_body(sid)):
        if not isinstance(node, E.TensorRead) or len(node.indices) < 2:
            continue
        pid = next(i for i, x in enumerate(state.stages) if x.tensor is node.tensor)
        if not state.stages[pid].is_placeholder or any(p == pid for p, _ in out):
            continue
        dims = [d for d, idx in enumerate(node.indices) if idx is inner]
        if len(dims) == 1 and any(idx is r for idx in node.indices for r in reduce_axes):
            out.append((pid, dims[0]))
    return out


def channel_axes(state: State, sid: int) -> list[int]:
    """Spatial axes other than the last that could be the vectorized one, for stages where no
    input can be packed along the last axis: axes along which some input can be (the output
    channels of an NCHW convolution, where the last axis is the image width)."""
    n = len(state.stages[sid].op.axes)
    if packable_operands(state, sid):
        return []
    return [d for d in range(n - 1) if packable_operands(state, sid, d)]


def with_packed_operands(state: State, sid: int, split_ids: Sequence[int],
                         innermost: int | None = None) -> State | None:
    """A copy of the state where the packable inputs of stage `sid` are first copied into a
    tiled layout that follows the stage's innermost spatial tile."""
    operands = packable_operands(state, sid, innermost)
    if not operands or not split_ids:
        return None
    s = state.copy()
    src = split_ids[-1 if innermost is None else innermost]  # the split of the vectorized axis
    level = len(s.steps[src].lengths) - 1
    reader = s.stages[sid].name
    for pid, dim in sorted(operands, reverse=True):
        copy = s.cache_read(pid, "global", [s.stage_id(reader)])
        s.transform_layout(copy, dim, src, level)
    return s


# ---------------------------------------------------------------------------------------------
# the rules

def _always_inline_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.is_placeholder or state.is_output(sid) or has_reduce(state, sid) or st.origin == "cache_read":
        return Cond.SKIP
    if st.attach != "root" or state.attached_to(st.name):
        return Cond.SKIP
    return Cond.APPLY_AND_SKIP_REST if is_strictly_inlineable(state, sid) else Cond.SKIP


def _always_inline(ctx, state: State, sid: int):
    s = state.copy()
    s.compute_inline(sid)
    return [(s, sid - 1)]


def _rfactor_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.is_placeholder or st.origin == "cache_write" or st.origin == "rfactor":
        return Cond.SKIP
    return Cond.APPLY if needs_rfactor(ctx, state, sid) else Cond.SKIP


def _rfactor(ctx, state: State, sid: int):
    base = state.copy()
    st = base.stages[sid]
    reduce_ids = [i for i, it in enumerate(st.iters) if it.kind == "reduce"]
    n_space = len(st.iters) - len(reduce_ids)
    fused = base.fuse(sid, reduce_ids)
    # a placeholder length: annotation re-samples it (the step is marked undecided below)
    base.split(sid, fused.name, [1])
    split_step = len(base.steps) - 1
    out = []
    for piece in (0, 1):
        s = base.copy()
        it_name = s.stages[sid].iters[n_space + piece].name
        rf = s.rfactor(sid, it_name, n_space)
        if piece == 1:
            rf_stage = s.stages[rf]
            order = list(range(len(rf_stage.iters)))
            order.remove(n_space)
            s.reorder(rf, order + [n_space])
        _mark_undecided(s, split_step)
        out.append((s, rf - 1, "outer piece" if piece == 0 else "inner piece, innermost"))
    return out


def _mark_undecided(state: State, step_id: int) -> None:
    from dataclasses import replace

    step = state.steps[step_id]
    state.steps[step_id] = replace(step, lengths=tuple(None for _ in step.lengths))


def _cache_write_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.is_placeholder or not needs_multi_level_tiling(state, sid) or st.origin:
        return Cond.SKIP
    if not has_reduce(state, sid):  # a cache for an elementwise stage only gets inlined again
        return Cond.SKIP
    if elementwise_matched_consumer(state, sid) is not None:
        return Cond.SKIP
    return Cond.APPLY


def _cache_write(ctx, state: State, sid: int):
    s = state.copy()
    s.cache_write(sid, "local")
    return [(s, sid)]


def _tile_fusion_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.is_placeholder or not needs_multi_level_tiling(state, sid) or not st.is_fresh:
        return Cond.SKIP
    if elementwise_matched_consumer(state, sid) is None:
        return Cond.SKIP
    return Cond.APPLY_AND_SKIP_REST if st.origin == "cache_write" else Cond.APPLY


def _tile_fusion(ctx, state: State, sid: int):
    out = []
    consumer = elementwise_matched_consumer(state, sid)
    for level in ctx.fusion_levels:
        if ctx.tiling_structure[level - 1] != "S":
            continue
        for inner in _vector_axis_choices(ctx, state, sid):
            s = state.copy()
            split_ids = multi_level_tile(s, sid, ctx.tiling_structure, inner)
            follow_tiling(s, consumer, split_ids, level, inner)
            n_spatial = len(split_ids)
            s.compute_at(sid, consumer, level * n_spatial - 1)
            where = f"fused at level {level}" + ("" if inner is None else f", axis {inner} innermost")
            out += _tiled_variants(ctx, s, sid, split_ids, inner, where)
    return out


def _tile_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.is_placeholder or not needs_multi_level_tiling(state, sid) or not st.is_fresh:
        return Cond.SKIP
    return Cond.APPLY_AND_SKIP_REST


def _tile(ctx, state: State, sid: int):
    out = []
    for inner in _vector_axis_choices(ctx, state, sid):
        s = state.copy()
        split_ids = multi_level_tile(s, sid, ctx.tiling_structure, inner)
        out += _tiled_variants(ctx, s, sid, split_ids, inner, "" if inner is None else f"axis {inner} innermost")
    return out


def _vector_axis_choices(ctx, state: State, sid: int) -> list[int | None]:
    """Which spatial axis goes innermost: the last (None), plus packable channel axes."""
    return [None] + (channel_axes(state, sid) if ctx.pack_operands else [])


def _tiled_variants(ctx, s: State, sid: int, split_ids: Sequence[int], inner: int | None, where: str):
    """Work items for one tiled state: itself (with the last axis innermost only: another axis
    innermost is worth it only with its input packed), and its packed-input copy if any."""
    out = [(s, sid - 1, where)] if inner is None else []
    packed = with_packed_operands(s, sid, split_ids, inner) if ctx.pack_operands else None
    if packed is not None:
        out.append((packed, sid + len(packed.stages) - len(s.stages) - 1,
                    f"{where + ', ' if where else ''}inputs packed"))
    return out


#: A reduction at most this long in a stage without data reuse (a pooling window) may run
#: outside the innermost output axis, so that axis (the channels, in NHWC) is the vector loop.
SHORT_REDUCTION = 64


def _reduce_outside_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if (st.is_placeholder or not st.is_fresh or not has_reduce(state, sid)
            or needs_multi_level_tiling(state, sid) or len(st.op.axes) < 2):
        return Cond.SKIP
    _, red = space_and_reduce_lengths(state, sid)
    return Cond.APPLY if red <= SHORT_REDUCTION and st.op.axes[-1].extent >= 4 else Cond.SKIP


def _reduce_outside(ctx, state: State, sid: int):
    """The loop order spatial..., reduce..., innermost spatial: each step of the window updates
    a vector of outputs instead of each output reducing its window alone."""
    s = state.copy()
    iters = s.stages[sid].iters
    spatial = [i for i, it in enumerate(iters) if it.kind != "reduce"]
    reduce = [i for i, it in enumerate(iters) if it.kind == "reduce"]
    s.reorder(sid, spatial[:-1] + reduce + spatial[-1:])
    return [(s, sid - 1, "reduction outside the innermost axis")]


def _skip_cond(ctx, state: State, sid: int) -> Cond:
    return Cond.APPLY


def _skip(ctx, state: State, sid: int):
    return [(state, sid - 1)]


CPU_RULES: tuple[SketchRule, ...] = (
    SketchRule("always_inline", _always_inline_cond, _always_inline),
    SketchRule("add_rfactor", _rfactor_cond, _rfactor),
    SketchRule("add_cache_write", _cache_write_cond, _cache_write),
    SketchRule("multi_level_tiling_with_fusion", _tile_fusion_cond, _tile_fusion),
    SketchRule("multi_level_tiling", _tile_cond, _tile),
    SketchRule("reduction_outside_innermost", _reduce_outside_cond, _reduce_outside),
    SketchRule("skip_stage", _skip_cond, _skip),
)


def generate_sketches(state: State, ctx: SketchContext, custom_rules: Sequence[SketchRule] = (),
                      max_sketches: int = 64, base_rules: Sequence[SketchRule] = CPU_RULES) -> list[Sketch]:
    """Every terminal sketch, deduplicated by loop-nest key. Custom rules run before the
    built-in ones (`base_rules`: the CPU's, or `sketch_gpu.GPU_RULES`), as Ansor allows."""
    rules = list(custom_rules) + list(base_rules)
    work: list[tuple[State, int, list[str]]] = [(state.copy(), len(state.stages) - 1, [])]
    done: dict[str, Sketch] = {}
    while work:
        next_work = []
        for st, sid, hist in work:
            if sid < 0:
                key = st.key() + "\n" + repr([s.to_json() for s in st.steps])
                done.setdefault(key, Sketch(st, hist))
                continue
            for rule in rules:
                cond = rule.condition(ctx, st, sid)
                if cond == Cond.SKIP:
                    continue
                name = st.stages[sid].name
                results = rule.apply(ctx, st, sid)
                for k, item in enumerate(results):
                    new_state, next_sid = item[0], item[1]
                    note = item[2] if len(item) > 2 else (f"#{k + 1}" if len(results) > 1 else "")
                    label = f"{rule.name}({name}{', ' + note if note else ''})"
                    extra = [] if rule.name == "skip_stage" else [label]
                    next_work.append((new_state, next_sid, hist + extra))
                if cond == Cond.APPLY_AND_SKIP_REST:
                    break
        work = next_work
        room = max(max_sketches * 8 - len(done), 1)
        if len(work) > room:
            # many stages with several choices each (five chained products): go on with an
            # evenly spaced share of the partial sketches, so some finish and they stay varied
            work = [work[round(i * len(work) / room)] for i in range(room)]
    return list(done.values())[:max_sketches]
