"""The sketch rule of dot-product instructions (auto-tensorization on the CPU).

A stage that sums widening products of two narrow operands (uint8 x int8 -> int32, bfloat16 x
bfloat16 -> float32), one of them a weight read as W[.., k, .., j] with j the stage's last axis
and k one of its reduction axes, the other read contiguously along k (its last index), is
matched against the target's instructions (`ansor.instructions`): a matmul (k the only
reduction) or an NHWC convolution (k the input channels, the kernel window's axes the other
reductions: data[n, y*s + ry, x*s + rx, c] x W[ry, rx, c, f]). Where one fits, the stage is
tiled as every matmul is (SSRSRS, an accumulator per tile), except that k is first split by a
few instructions' depth (`DEPTH_STEPS`) and that piece stays innermost of the reduction loops,
and the weight is copied into the instruction's layout, tiled along j by the innermost tile and
interleaved along k by the depth (packed once when it is constant). A row operand that is
computed (a convolution's padded input) is kept as a copy at the root rather than inlined, so
the instruction reads it as a plain buffer (the padded copy of an NHWC image costs one pass
over the input; inlined, its bounds checks would leave only the widening loop). Tile sizes,
compute locations, parallelism and unrolling are then annotated and evolved as for any sketch;
the CPU's lowering (`lower/dot_product.py`) turns each accumulator nest of that shape into
instructions. A sampled program whose shape does not fit (an innermost tile that is not whole
vectors) keeps the widening loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansor.instructions import AMX_STEPS, DotProductInstruction, amx_form, find_instruction
from ansor.schedule.state import ScheduleError, State
from ansor.schedule.steps import SplitStep
from ansor.search.sketch import (Cond, SketchRule, elementwise_matched_consumer, follow_tiling,
                                 multi_level_tile, needs_multi_level_tiling)
from ansor.te import expr as E


@dataclass(frozen=True)
class DotProductMatch:
    """How a stage maps onto an instruction: the packed operand (a placeholder's stage) and
    its dimensions along the output's last axis and along the reduction."""

    instruction: DotProductInstruction
    packed_stage: int
    packed_dim_j: int
    packed_dim_k: int
    reduce_index: int = 0          # which of the stage's reduction axes is k
    row_stage: int = -1            # the row operand's stage


def _read_of(expr: E.Expr) -> E.TensorRead | None:
    while isinstance(expr, E.Cast):
        expr = expr.value
    return expr if isinstance(expr, E.TensorRead) else None


def match_dot_product(state: State, sid: int, features: tuple[str, ...], vector_bytes: int) -> DotProductMatch | None:
    """The instruction that can compute stage `sid`, or None (see the module docstring)."""
    st = state.stages[sid]
    if st.is_placeholder or not st.op.reduce_axes or not st.op.axes:
        return None
    body = state.effective_body(sid)
    if not (isinstance(body, E.Reduce) and body.combiner == "sum" and body.where is None):
        return None
    source = body.source
    if not (isinstance(source, E.BinOp) and source.op == "*" and source.dtype == body.dtype):
        return None
    reads = [_read_of(source.a), _read_of(source.b)]
    if any(r is None for r in reads):
        return None
    j = st.op.axes[-1]
    for row, packed in (reads, reads[::-1]):
        pid = state.stage_id(packed.tensor)
        if not state.stages[pid].is_placeholder or not row.indices:
            continue
        k = row.indices[-1]
        if not any(k is r for r in st.op.reduce_axes):
            continue
        if any(any(v is k for v in E.free_vars(i)) for i in row.indices[:-1]) or \
                any(v is j for i in row.indices for v in E.free_vars(i)):
            continue  # the row operand: contiguous along k, the same for every j
        dims_j = [d for d, i in enumerate(packed.indices) if i is j]
        dims_k = [d for d, i in enumerate(packed.indices) if i is k]
        others = [i for d, i in enumerate(packed.indices) if d not in dims_j + dims_k]
        if len(dims_j) != 1 or len(dims_k) != 1 or \
                not all(any(i is r for r in st.op.reduce_axes) for i in others):
            continue  # the weight: one dimension each for j and k, whole reduction axes besides
        ins = find_instruction(features, vector_bytes, row.tensor.dtype, packed.tensor.dtype, body.dtype)
        if ins is None or j.extent % ins.lanes or k.extent % ins.depth:
            continue
        reduce_index = next(n for n, r in enumerate(st.op.reduce_axes) if r is k)
        return DotProductMatch(ins, pid, dims_j[0], dims_k[0], reduce_index, state.stage_id(row.tensor))
    return None


def _condition(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.is_placeholder or not st.is_fresh or not needs_multi_level_tiling(state, sid) \
            or st.origin not in ("", "cache_write"):
        return Cond.SKIP
    target = ctx.target
    if not target.dot_products or target.is_gpu:
        return Cond.SKIP
    found = match_dot_product(state, sid, target.dot_products, target.vector_unit_bytes)
    return Cond.SKIP if found is None else Cond.APPLY_AND_SKIP_REST


#: Instructions per iteration of the innermost reduction loop, the most the reduction's extent
#: allows first. With one instruction's depth there, an 8 x 32 register tile of the int8 GEMM
#: ran far slower than with four (BENCHMARKS.md, "Low precision: int8 and bf16 GEMM"), and the
#: search seldom drew the deeper split of the reduction together with such a tile.
DEPTH_STEPS = (4, 2, 1)


def _amx_variant(s: State, split_ids: list[int], ins: DotProductInstruction,
                 amx: DotProductInstruction) -> State | None:
    """The sketch with its register tile fixed to an AMX shape (`lower/dot_product.py`): the
    output's last axis 32 or 16 columns (two or one tiles of 16 lanes), the axis before it 32
    or 16 rows, every other spatial axis 1; None where the extents allow no such tile. The
    other lengths are drawn as usual (`annotate.fill_tile_sizes` keeps a fixed innermost)."""
    if len(split_ids) < 2:
        return None
    steps = list(s.steps)
    extents = [steps[i].extent for i in split_ids]
    if any(e is None for e in extents[-2:]) or extents[-1] % ins.lanes or extents[-2] % amx.rows:
        return None
    inner = [1] * (len(split_ids) - 2) + [2 * amx.rows if extents[-2] % (2 * amx.rows) == 0 else amx.rows,
                                          2 * ins.lanes if extents[-1] % (2 * ins.lanes) == 0 else ins.lanes]
    for i, length in zip(split_ids, inner):
        step = steps[i]
        steps[i] = SplitStep(step.stage_id, step.iter_id, step.extent, (*step.lengths[:-1], length),
                             step.inner_to_outer)
    try:
        return State.replay(s.dag, steps)
    except ScheduleError:
        return None


def _apply(ctx, state: State, sid: int):
    target = ctx.target
    base = state.copy()
    if elementwise_matched_consumer(base, sid) is None:
        base.cache_write(sid, "local")  # the accumulator tile lives in registers
    match = match_dot_product(base, sid, target.dot_products, target.vector_unit_bytes)
    consumer = elementwise_matched_consumer(base, sid)
    if match is None or consumer is None:
        return []
    ins = match.instruction
    row = base.stages[match.row_stage]
    if not row.is_placeholder and row.origin != "cache_read":
        # a computed row operand (padding): a copy at the root that the rules never inline
        base.cache_read(match.row_stage, "global", [base.stage_id(base.stages[sid].name)])
        sid += 1
        consumer += 1
        match = match_dot_product(base, sid, target.dot_products, target.vector_unit_bytes)
        if match is None:
            return []
    amx = amx_form(ins, target.dot_products)
    deepest = (AMX_STEPS, *DEPTH_STEPS) if amx is not None else DEPTH_STEPS  # a tile instruction's depth
    out = []
    for level in ctx.fusion_levels:
        if ctx.tiling_structure[level - 1] != "S":
            continue
        s = base.copy()
        k_name = s.stages[sid].op.reduce_axes[match.reduce_index].name
        k = next(it for it in s.stages[sid].iters if it.kind == "reduce" and it.name == k_name)
        steps = next(n for n in deepest if k.extent % (ins.depth * n) == 0)
        _, depth_piece = s.split(sid, k.name, [ins.depth * steps])
        split_ids = multi_level_tile(s, sid, ctx.tiling_structure, None, untiled=[depth_piece.name])
        follow_tiling(s, consumer, split_ids, level)
        s.compute_at(sid, consumer, level * len(split_ids) - 1)
        before = len(s.stages)
        copy = s.cache_read(match.packed_stage, "global", [s.stage_id(s.stages[sid].name)])
        src = split_ids[-1]
        s.transform_layout(copy, match.packed_dim_j, src, len(s.steps[src].lengths) - 1)
        s.interleave_layout(copy, match.packed_dim_k, ins.depth)
        out.append((s, sid + len(s.stages) - before - 1,
                    f"fused at level {level}, {ins.name} ({ins.lhs_dtype} x {ins.rhs_dtype} -> {ins.acc_dtype})"))
        tiles = _amx_variant(s, split_ids, ins, amx) if amx is not None and steps == AMX_STEPS else None
        if tiles is not None:
            out.append((tiles, sid + len(s.stages) - before - 1, f"fused at level {level}, {amx.name} tiles"))
    return out


DOT_PRODUCT_RULE = SketchRule("multi_level_tiling_with_dot_product", _condition, _apply)
