"""The GPU sketch rules (after Ansor's rule set for CUDA/OpenCL targets).

In order, per stage from the output back to the inputs:
- AddCacheRead: an input of a stage that needs multi-level tiling is copied into shared
  memory, the copy computed at the consumer's outermost reduction tile (so each block loads
  one tile of A and B per step of the reduction, and its threads read the tile many times);
- AlwaysInline: on a GPU every elementwise stage that is not an output is inlined;
- AddCacheWrite: a stage that needs multi-level tiling accumulates into a local (register)
  buffer, written back once at the end (always, unlike the CPU which explores both);
- MultiLevelTilingWithFusion: tile with "SSSRRSRS" (block, virtual thread, thread, then the
  reduction and the per-thread tile) and compute it at its elementwise consumer's thread
  level (fusion level 3);
- MultiLevelTiling: the same without a consumer to fuse into;
- SkipStage.

- CrossThreadReduction (before AddCacheWrite): a reduction longer than a warp that needs no
  tiling (softmax, layer norm, norms), or a tiled one with fewer outputs than reduced values
  (a matrix-vector product), gets its reduction loops fused and split (by a thread count
  annotation draws: 32 to 1024), the inner part bound to threadIdx.x: the threads of a block share one output's reduction and
  combine their partial results (`lower.gpu`);

Thread binding and cooperative fetching are decided in random annotation
(`search.annotate_gpu`), when the tile sizes are known.
"""

from __future__ import annotations

from ansor.schedule.state import State
from ansor.search.sketch_gemm import GEMM_TEMPLATE_RULE
from ansor.search.sketch import (
    Cond,
    SketchRule,
    _always_inline,
    _cache_write,
    _skip,
    _skip_cond,
    elementwise_matched_consumer,
    follow_tiling,
    has_reduce,
    multi_level_tile,
    needs_multi_level_tiling,
    space_and_reduce_lengths,
)

GPU_TILING_STRUCTURE = "SSSRRSRS"
GPU_FUSION_LEVEL = 3  # the consumer's thread level: each thread computes its tile into registers


def _tiled_consumers(state: State, sid: int) -> list[int]:
    """Consumers of a stage that need multi-level tiling and read it directly."""
    return [c for c in state.consumers(sid) if needs_multi_level_tiling(state, c)]


def _cache_read_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.origin == "cache_read" or st.attach == "inline" or st.scope == "shared":
        return Cond.SKIP
    return Cond.APPLY_AND_SKIP_REST if _tiled_consumers(state, sid) else Cond.SKIP


def outer_reduce_tile_end(state: State, sid: int) -> str | None:
    """The last iterator of a tiled stage's outermost reduction tile level (the first
    reduce iterator of each reduce axis, the last of them in loop order)."""
    st = state.stages[sid]
    n_reduce_axes = len(st.op.reduce_axes)
    reduce_iters = [it for it in st.iters if it.kind == "reduce"]
    if not reduce_iters:
        return None
    return reduce_iters[min(n_reduce_axes, len(reduce_iters)) - 1].name


def _cache_read(ctx, state: State, sid: int):
    s = state.copy()
    name = s.stages[sid].name
    for consumer in sorted(_tiled_consumers(state, sid), reverse=True):
        consumer_name = state.stages[consumer].name
        copy = s.cache_read(name, "shared", [consumer_name])
        at = outer_reduce_tile_end(s, s.stage_id(consumer_name))
        if at is not None:
            s.compute_at(copy, consumer_name, at)
    return [(s, s.stage_id(name))]


def _always_inline_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.is_placeholder or state.is_output(sid) or has_reduce(state, sid) or st.origin == "cache_read":
        return Cond.SKIP
    if st.attach != "root" or state.attached_to(st.name):
        return Cond.SKIP
    return Cond.APPLY_AND_SKIP_REST


def _cross_thread_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.is_placeholder or not has_reduce(state, sid) or st.origin == "cache_write" or not st.is_fresh:
        return Cond.SKIP
    space, reduced = space_and_reduce_lengths(state, sid)
    if needs_multi_level_tiling(state, sid):
        if space > ctx.target.max_threads_per_block or space >= reduced:
            return Cond.SKIP
        return Cond.APPLY  # and the tiled sketch too
    # and the sketch without it: with few values per output, a thread per output can win
    return Cond.APPLY if reduced > ctx.target.warp_size else Cond.SKIP


def _cross_thread(ctx, state: State, sid: int):
    s = state.copy()
    reduce_names = [it.name for it in s.stages[sid].iters if it.kind == "reduce"]
    fused = s.fuse(sid, reduce_names) if len(reduce_names) > 1 else s.stages[sid].iters[-1]
    _, inner = s.split(sid, fused.name, [None])  # the block's size: drawn by annotation
    s.annotate(sid, inner.name, "threadIdx.x")
    return [(s, sid - 1, "threads share the reduction")]


def _cache_write_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.is_placeholder or not needs_multi_level_tiling(state, sid) or st.origin or not has_reduce(state, sid):
        return Cond.SKIP
    if elementwise_matched_consumer(state, sid) is not None:
        return Cond.SKIP
    return Cond.APPLY_AND_SKIP_REST


def _tile_fusion_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.is_placeholder or not needs_multi_level_tiling(state, sid) or not st.is_fresh:
        return Cond.SKIP
    return Cond.APPLY_AND_SKIP_REST if elementwise_matched_consumer(state, sid) is not None else Cond.SKIP


def _tile_fusion(ctx, state: State, sid: int):
    s = state.copy()
    consumer = elementwise_matched_consumer(s, sid)
    split_ids = multi_level_tile(s, sid, GPU_TILING_STRUCTURE)
    follow_tiling(s, consumer, split_ids, GPU_FUSION_LEVEL)
    s.compute_at(sid, consumer, GPU_FUSION_LEVEL * len(split_ids) - 1)
    return [(s, sid - 1, f"fused at level {GPU_FUSION_LEVEL}")]


def _tile_cond(ctx, state: State, sid: int) -> Cond:
    st = state.stages[sid]
    if st.is_placeholder or not needs_multi_level_tiling(state, sid) or not st.is_fresh:
        return Cond.SKIP
    return Cond.APPLY_AND_SKIP_REST


def _tile(ctx, state: State, sid: int):
    s = state.copy()
    multi_level_tile(s, sid, GPU_TILING_STRUCTURE)
    return [(s, sid - 1)]


GPU_RULES: tuple[SketchRule, ...] = (
    GEMM_TEMPLATE_RULE,  # beside the other sketches: a matmul that a matrix instruction computes
    SketchRule("add_cache_read_shared", _cache_read_cond, _cache_read),
    SketchRule("always_inline", _always_inline_cond, _always_inline),
    SketchRule("cross_thread_reduction", _cross_thread_cond, _cross_thread),
    SketchRule("add_cache_write", _cache_write_cond, _cache_write),
    SketchRule("multi_level_tiling_with_fusion", _tile_fusion_cond, _tile_fusion),
    SketchRule("multi_level_tiling", _tile_cond, _tile),
    SketchRule("skip_stage", _skip_cond, _skip),
)
