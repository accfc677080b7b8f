"""Random annotation helpers: tile-size factorizations and other sampled low-level choices."""

from __future__ import annotations

import functools
import random
from dataclasses import replace as _replace

from ansor.schedule.relations import root_axes_of, root_axis_of
from ansor.schedule.state import ScheduleError, State
from ansor.schedule.steps import InterleaveStep, SplitStep
from ansor.search.params import SearchParams
from ansor.te import expr as E


@functools.lru_cache(maxsize=None)
def divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


@functools.lru_cache(maxsize=4096)
def factorizations(extent: int, n: int, max_innermost: int) -> tuple[tuple[int, ...], ...]:
    """Every tuple of n inner split lengths (outer to inner) whose product divides extent, the
    innermost at most max_innermost: perfect tilings only, as the sampler prefers."""
    out: list[tuple[int, ...]] = []

    def go(remaining: int, prefix: tuple[int, ...]) -> None:
        if len(prefix) == n:
            out.append(prefix)
            return
        for d in divisors(remaining):
            if len(prefix) == n - 1 and d > max_innermost:
                break
            go(remaining // d, prefix + (d,))

    go(extent, ())
    go = None  # noqa: F841 - a recursive closure refers to itself: free it now, not at GC
    return tuple(out)


#: Share of the draws of an awkward extent (`padded_extent`) that tile its padded length.
PADDED_TILING_PROB = 0.75
#: An awkward extent that padding lengthens by at most this share is always tiled padded (197
#: tokens as 200): its unpadded tilings are all one-row tiles, and a cost model that has seen
#: few padded programs ranks those first, so a short search can measure nothing else.
ALWAYS_PADDED_SHARE = 1 / 16


@functools.lru_cache(maxsize=4096)
def padded_extent(extent: int) -> int:
    """The length whose perfect tilings a split of `extent` may also draw: the extent itself,
    or, for one above 16 with no divisor from 4 to 16 (a prime sequence length such as a ViT's
    197 tokens), the next multiple of 8. Such an extent's only perfect tilings are 1 and
    itself, so a matmul over it gets register tiles one row high (one broadcast operand per
    vector of the other: too little reuse); tiling 200 instead lets the rows come 4 or 8 at a
    time. The loop past the extent is guarded (lowering guards every non-divisible split)."""
    if extent <= 16 or any(4 <= d <= 16 for d in divisors(extent)):
        return extent
    return -(-extent // 8) * 8


def tiled_extent(extent: int, rng: random.Random) -> int:
    """The length one draw of a split of `extent` tiles perfectly: `padded_extent` in
    PADDED_TILING_PROB of the draws of an awkward extent and in every draw where the padding
    adds at most ALWAYS_PADDED_SHARE of it, else the extent (a draw of any other extent takes
    nothing from `rng`)."""
    padded = padded_extent(extent)
    if padded == extent:
        return extent
    if padded - extent <= ALWAYS_PADDED_SHARE * extent:
        return padded
    return padded if rng.random() < PADDED_TILING_PROB else extent


def sample_factors(extent: int, n: int, rng: random.Random, max_innermost: int = 64,
                   vector_lanes: int = 0) -> tuple[int, ...]:
    """A random perfect tiling of `extent` (or of its `padded_extent`) into n inner lengths:
    the innermost length drawn uniformly among the allowed divisors, then the outer lengths
    uniformly among the tilings of what is left. (Drawing uniformly among all tilings, as
    Ansor does, makes an innermost length of 1 the most likely: small extents have the most
    tilings. The innermost loop is the vectorized one, so that bias starves the search of
    vector-width tiles.) With `vector_lanes`, half the draws take a multiple of it where the
    extent has one."""
    if n == 0:
        return ()
    extent = tiled_extent(extent, rng)
    allowed = [d for d in divisors(extent) if d <= max_innermost]
    if vector_lanes > 1 and rng.random() < 0.5:
        allowed = [d for d in allowed if d % vector_lanes == 0] or allowed
    inner = rng.choice(allowed)
    return rng.choice(factorizations(extent // inner, n - 1, extent)) + (inner,)


# ---------------------------------------------------------------------------------------------
# random annotation of a sketch into a complete program (CPU init rules, in Ansor's order:
# fill tile sizes, change compute locations, parallel, unroll, vectorize)


def _undecided(step) -> bool:
    return isinstance(step, SplitStep) and any(n is None for n in step.lengths)


def register_level_splits(steps: list) -> set[int]:
    """Indices of the undecided splits of multi-level-tiled spatial axes (a stage's splits with
    the most levels: every tiling structure has more spatial than reduction levels)."""
    undecided = [(i, step) for i, step in enumerate(steps) if _undecided(step)]
    levels: dict[int, int] = {}
    for _, step in undecided:
        levels[step.stage_id] = max(levels.get(step.stage_id, 0), len(step.lengths))
    return {i for i, step in undecided if len(step.lengths) >= 2 and len(step.lengths) == levels[step.stage_id]}


def multi_level_splits(steps: list) -> list[int]:
    """Indices of the splits of multi-level-tiled spatial axes: every split with the most
    levels of its stage, two or more (a tiling structure has more spatial than reduction
    levels). `register_level_splits` is the same on a sketch's undecided splits."""
    deepest: dict[int, int] = {}
    for s in steps:
        if isinstance(s, SplitStep):
            deepest[s.stage_id] = max(deepest.get(s.stage_id, 0), len(s.lengths))
    return [i for i, s in enumerate(steps)
            if isinstance(s, SplitStep) and len(s.lengths) >= 2 and len(s.lengths) == deepest[s.stage_id]]


REGISTER_ACCUMULATORS = 24  # default register-tile budget in vectors (of AVX-512's 32: the rest
                            # hold the operands of one step of the reduction)


def register_tile_vectors(params: SearchParams, vector_registers: int) -> int:
    """The register tile's budget in accumulator vectors: the parameter, or three quarters of
    the target's registers when it is 0."""
    return params.register_tile_vectors or (3 * vector_registers) // 4


def fill_tile_sizes(dag, steps: list, rng: random.Random, max_innermost: int, vector_lanes: int = 0,
                    register_tile_prob: float = 0.0, register_vectors: int = REGISTER_ACCUMULATORS,
                    max_reduction_block: int = 0, blocked_register_tile_prob: float = 0.0) -> State:
    """Replay a sketch's steps with every undecided split length sampled.

    The reduction split of a tiled stage draws its inner length (the reduction block) up to
    `max_reduction_block` (0: `max_innermost`); every other split's innermost length up to
    `max_innermost`.

    With probability `register_tile_prob` the program gets a register tile: the second
    innermost level of every tiled spatial axis is 1, so the reduction loops (which the
    tiling structure puts on both sides of that level) all sit right around the innermost
    tile, and an accumulator tile computed at the level above is exactly that tile.
    Uniform sampling rarely draws length 1 on every axis at once.

    A share `blocked_register_tile_prob` of those register tiles is blocked as BLAS blocks a
    GEMM: the axes other than the vectorized one draw their second innermost level (a sweep of
    register tiles down the rows), and the reduction blocks are long (at least
    `BLOCKED_REDUCTION_MIN` where the extent allows). Each block of the reduction then passes
    all the rows of the sweep over one panel of the vectorized operand, which stays in the
    cache between them; with the register tile right under the reduction block the
    accumulators still live in registers for the whole block. A register tile draws no such
    sweep, and the search seldom pairs a long block, a sweep and a register-sized tile by chance."""
    register = register_level_splits(steps) if rng.random() < register_tile_prob else set()
    blocks = reduction_block_splits(dag, tuple(steps)) if max_reduction_block else frozenset()
    blocked = bool(register) and bool(blocks) and rng.random() < blocked_register_tile_prob
    if vector_lanes > 1:
        drawn = _register_tile(dag, steps, register, rng, max_innermost, vector_lanes, register_vectors, blocked)
    else:  # no vector unit to size the tile by: each axis drawn on its own
        drawn = {}
        for i in sorted(register):
            lengths = sample_factors(steps[i].extent, len(steps[i].lengths) - 1, rng, max_innermost, vector_lanes)
            drawn[i] = (*lengths[:-1], 1, lengths[-1])
    filled = []
    for i, step in enumerate(steps):
        if _undecided(step):
            if i in blocks and blocked:
                lengths = _long_block(step, rng, max_reduction_block)
            else:
                bound = max_reduction_block if i in blocks else max_innermost
                lengths = drawn.get(i) or sample_factors(step.extent, len(step.lengths), rng, bound, vector_lanes)
            step = _replace(step, lengths=lengths)
        filled.append(step)
    return State.replay(dag, filled)


#: The shortest reduction block a blocked register tile draws (where the extent has a divisor
#: this long): the accumulators of the sweep are loaded and stored once a block, so a short
#: block costs more in those than the panel it keeps cached saves.
BLOCKED_REDUCTION_MIN = 64


def _long_block(step: SplitStep, rng: random.Random, max_reduction_block: int) -> tuple[int, ...]:
    """A blocked register tile's reduction split: the innermost length a divisor of the
    extent from BLOCKED_REDUCTION_MIN (or the extent, if shorter) to `max_reduction_block`
    (the longest divisor within the bound where none is that long), the outer levels a random
    tiling of the rest."""
    extent = step.extent
    fits = [d for d in divisors(extent) if d <= max_reduction_block]
    inner = rng.choice([d for d in fits if d >= min(extent, BLOCKED_REDUCTION_MIN)] or fits[-1:])
    outer = rng.choice(factorizations(extent // inner, len(step.lengths) - 1, extent))
    return (*outer, inner)


def _register_tile(dag, steps: list, register: set[int], rng: random.Random, max_innermost: int,
                   vector_lanes: int, register_vectors: int, blocked: bool = False) -> dict[int, tuple[int, ...]]:
    """Split lengths of a register tile that fits `register_vectors` vectors and is made of
    full vectors. The axis whose innermost loop annotation vectorizes (output columns, or
    channels where the weights are packed) draws first, a multiple of the lanes where its
    extent has one; the other axes then draw among the lengths that still fit. (Drawing every
    axis freely and retrying would leave most of a convolution's register tiles over the
    96-float AVX2 budget, and a tile whose vectorized loop is 1 or 4 long is a tile of scalars.)
    `blocked`: the other axes also draw a sweep of tiles at the second innermost level."""
    vectorized = innermost_loop_splits(dag, tuple(steps))
    room: dict[int, int] = {}  # floats left in each stage's tile
    drawn: dict[int, tuple[int, ...]] = {}
    order = sorted(register, key=lambda i: (i not in vectorized, rng.random()))
    for i in order:
        step = steps[i]
        left = room.setdefault(step.stage_id, register_vectors * vector_lanes)
        fixed = step.lengths[-1]  # a sketch's own choice (an AMX tile's rows and columns)
        if fixed is not None and step.extent % fixed == 0:
            extent, inner = step.extent, fixed
        else:
            extent = tiled_extent(step.extent, rng)
            fits = [d for d in divisors(extent) if d <= min(left, max_innermost)] or [1]
            if i in vectorized:
                fits = [d for d in fits if d % vector_lanes == 0] or fits
            inner = rng.choice(fits)
        room[step.stage_id] = max(1, left // inner)
        drawn[i] = _tile_lengths(step, extent, inner, rng, sweep=blocked and i not in vectorized)
    return drawn


def _tile_lengths(step: SplitStep, extent: int, inner: int, rng: random.Random,
                  sweep: bool = False) -> tuple[int, ...]:
    """A register-tiled axis's lengths: the outer levels a random tiling of what `inner`
    leaves of `extent` (the split's, or its padded length), then 1 (with `sweep`, a length
    drawn with them), then `inner`."""
    n = len(step.lengths) - 2  # levels above the 1
    if sweep:
        return (*rng.choice(factorizations(extent // inner, n + 1, extent)), inner)
    outer = rng.choice(factorizations(extent // inner, n, extent)) if n > 0 else ()
    return (*outer, 1, inner)


@functools.lru_cache(maxsize=256)
def innermost_loop_splits(dag, sketch_steps: tuple) -> frozenset[int]:
    """Indices of the sketch's splits whose innermost part becomes its stage's innermost loop:
    the loop annotation vectorizes. Found by replaying the sketch once (cached per sketch)."""
    state = State(dag)
    axis_of_split: dict[int, tuple[str, str]] = {}  # by stage name: later steps may add stages
    try:
        for i, step in enumerate(sketch_steps):
            if isinstance(step, SplitStep):
                stage = state.stages[step.stage_id]
                axis_of_split[i] = (stage.name, stage.iters[step.iter_id].name)
            step.apply(state)
    except (ScheduleError, IndexError):
        return frozenset()
    innermost = {st.name: root_axis_of(st, st.iters[-1].name) for st in state.stages
                 if not st.is_placeholder and st.iters}
    return frozenset(i for i, (stage, axis) in axis_of_split.items() if innermost.get(stage) == axis)


@functools.lru_cache(maxsize=256)
def reduction_block_splits(dag, sketch_steps: tuple) -> frozenset[int]:
    """Indices of the sketch's reduction splits of multi-level tiled stages
    (`State.reduction_block_steps`), found by replaying the sketch once (cached per sketch)."""
    try:
        return State.replay(dag, list(sketch_steps)).reduction_block_steps
    except (ScheduleError, IndexError):
        return frozenset()


def _placeable(it) -> bool:
    return it.kind != "reduce" and it.annotation not in ("unroll", "vectorize")


def _loops_around(state: State, sid: int) -> list[tuple[int, int]]:
    """The placeable loops, outer to inner, that enclose every statement of a stage: those of
    the stages it is computed inside, up to its attach points (empty for a root stage)."""
    st = state.stages[sid]
    if not isinstance(st.attach, tuple):
        return []
    x = state.stage_id(st.attach[0])
    out = _loops_around(state, x)
    for i, it in enumerate(state.stages[x].iters):
        if not _placeable(it):
            break
        if it.extent != 1:
            out.append((x, i))
        if it.name == st.attach[1]:
            break
    return out


def _own_loops(state: State, c: int, producer: int) -> list[tuple[int, int]]:
    """Loops of consumer `c` to compute `producer` in: outer to inner, stopping at reduce or
    unrolled loops and after an attach point. A reduction is not offered a loop whose
    iterations all read the same part of it (LayerNorm's variance inside the column loop,
    summed again for every column): past the first such loop every placement recomputes."""
    target = state.stages[c]
    indexing: set[str] | None = None
    if state.stages[producer].op.reduce_axes:
        tensor = state.stages[producer].tensor
        indexing = {v.name for node in E.walk(state.effective_body(c))
                    if isinstance(node, E.TensorRead) and node.tensor is tensor
                    for idx in node.indices for v in E.free_vars(idx)}
    out: list[tuple[int, int]] = []
    for i, it in enumerate(target.iters):
        if not _placeable(it):
            break
        if it.extent == 1:
            continue
        if indexing is not None and not root_axes_of(target, it.name) & indexing:
            break
        out.append((c, i))
        if state.attached_to(target.name, it.name):
            break
    return out


def _reading_loops(state: State, c: int, producer: int) -> list[tuple[int, int]]:
    """Loops inside which `producer` could be computed for consumer `c`: those around `c`
    and `c`'s own."""
    return _loops_around(state, c) + _own_loops(state, c, producer)


def compute_location_candidates(state: State, sid: int) -> list[tuple[int, int]]:
    """(stage, iterator) pairs where a stage may be computed: loops of its single consumer,
    from outer to inner, stopping at reduce or unrolled loops and after an attach point.

    A stage with several consumers (the mean of a LayerNorm, read by the variance and by the
    normalization) may go into a loop that encloses all of them: once the variance is computed
    per row inside the output's row loop, the mean can be too, and the row is read from memory
    once instead of in separate passes."""
    consumers = state.consumers(sid)
    if not consumers:
        return []
    if len(consumers) > 1:
        common = set.intersection(*(set(_reading_loops(state, c, sid)) for c in consumers[1:]))
        return [loc for loc in _reading_loops(state, consumers[0], sid) if loc in common]
    return _own_loops(state, consumers[0], sid) + _loops_around(state, consumers[0])


def location_is_free(state: State, sid: int) -> bool:
    """Whether random annotation and mutation choose where this stage is computed. Tiled
    stages and cache stages stay where their sketch rule put them; a reduction's rfactor
    partial sums may move into its consumer's loops (one row's partial sums in registers),
    whether or not the sketch split or reordered them."""
    st = state.stages[sid]
    if st.origin == "rfactor":
        return True
    return st.is_fresh and st.origin == "" and not state.infos[sid].needs_multi_level_tiling


def change_compute_locations(state: State, rng: random.Random, fused_prob: float = 0.0) -> None:
    """Draw where each free stage is computed, consumers first: inlined, at the root, or in
    one of its candidate loops. With probability `fused_prob`, drawn at the first free
    reduction (or rfactor partial sum) met, that stage and every free stage after it (its
    producers: softmax's exponentials, the max) go into one of their candidate loops instead.
    Programs without a free reduction (a convolution's padding is elementwise) draw as before.

    Why the joint draw: drawn one by one, row statistics (softmax's max and sum, LayerNorm's
    mean and variance with their partial sums) seldom all land in the output's row loop, where
    a row is read from memory once, and softmax's fastest programs are those: the joint draw
    lets a search measure many of them (BENCHMARKS.md)."""
    fused: bool | None = None
    for sid in reversed(range(len(state.stages))):
        st = state.stages[sid]
        if st.is_placeholder or st.attach == "inline" or state.is_output(sid) or not location_is_free(state, sid):
            continue
        cands = compute_location_candidates(state, sid)
        reduction = bool(st.op.reduce_axes) or st.origin == "rfactor"
        if fused is None and reduction:  # drawn at the first free reduction: programs without
            fused = fused_prob > 0 and rng.random() < fused_prob  # one sample as they always did
        if fused and cands:
            target, it = cands[rng.randrange(len(cands))]
            state.compute_at(sid, target, it)
            continue
        choice = rng.randrange(len(cands) + 2)
        if choice == 0:
            if not st.op.reduce_axes and not state.attached_to(st.name):
                state.compute_inline(sid)
        elif choice == 1:
            if st.attach != "root":
                state.compute_root(sid)
        else:
            target, it = cands[choice - 2]
            state.compute_at(sid, target, it)


def annotate_parallel(state: State, rng: random.Random, max_degree: int, min_degree: int = 1) -> None:
    """Fuse outer spatial loops of each root stage and run them in parallel. How many is
    sampled: at least enough for `min_degree` parallel iterations (when the loops have that
    many), at most up to where the degree first exceeds `max_degree`."""
    for sid, st in enumerate(state.stages):
        if st.is_placeholder or st.attach != "root":
            continue
        degrees: list[int] = []
        degree = 1
        # the innermost loop stays out of the parallel loop: it is the one to vectorize
        for it in st.iters[:-1] if len(st.iters) > 1 else st.iters:
            if it.kind != "spatial" or it.annotation != "none":
                break
            degree *= it.extent
            degrees.append(degree)
            if degree > max_degree or state.attached_to(st.name, it.name):
                break
        if not degrees:
            continue
        enough = min(min_degree, degrees[-1])
        k_min = next(k for k, d in enumerate(degrees, 1) if d >= enough)
        k = rng.randint(k_min, len(degrees))
        state.fuse(sid, list(range(k)))
        state.parallel(sid, 0)


def annotate_unroll(state: State, rng: random.Random, choices) -> None:
    for sid, st in enumerate(state.stages):
        if st.is_placeholder or st.attach == "inline" or not st.op.reduce_axes or not st.iters:
            continue
        state.pragma(sid, 0, f"auto_unroll_max_step${rng.choice(choices)}")


def annotate_vectorize(state: State, rng: random.Random, max_size: int) -> None:
    for sid, st in enumerate(state.stages):
        if st.is_placeholder or st.attach == "inline" or not st.iters:
            continue
        tiled = not st.is_fresh
        n, prod = 0, 1
        while n < len(st.iters):
            it = st.iters[len(st.iters) - 1 - n]
            if state.attached_to(st.name, it.name) or it.kind != "spatial" or it.annotation != "none":
                break
            if tiled and n:
                break
            prod *= it.extent
            if prod > max_size:
                break
            n += 1
        if n == 0:
            n = _split_for_vectorize(state, sid, rng, max_size)
            if n == 0:
                continue
        if n > 1:
            n = 1 + rng.randrange(n - 1)
        last = len(st.iters) - 1
        if n > 1:
            state.fuse(sid, list(range(last - n + 1, last + 1)))
            last = len(state.stages[sid].iters) - 1
        if state.stages[sid].iters[last].extent > 1:
            state.vectorize(sid, last)


def _split_for_vectorize(state: State, sid: int, rng: random.Random, max_size: int) -> int:
    """A stage whose innermost loop is an untiled axis too long to vectorize whole (the 768 columns
    of an elementwise stage) gets it split, the inner piece a random divisor of at most
    `max_size`: without this such loops would stay scalar. Returns 1 if it split, else 0."""
    st = state.stages[sid]
    it = st.iters[-1]
    if (it.name not in {a.name for a in st.op.axes} or it.kind != "spatial" or it.annotation != "none"
            or it.extent is None
            or it.extent <= max_size or state.attached_to(st.name, it.name)):
        return 0
    choices = [d for d in divisors(it.extent) if 1 < d <= max_size]
    if not choices:
        return 0
    state.split(sid, it.name, [rng.choice(choices)])
    return 1


def annotate(sketch_steps: list, dag, rng: random.Random, params: SearchParams, num_cores: int,
             vector_lanes: int = 0, vector_registers: int = 32) -> State | None:
    """One complete program from a sketch, or None if the sample turned out illegal.
    `vector_lanes` (float32 lanes of the target's vector unit) biases innermost tiles;
    `vector_registers` bounds register tiles."""
    # a dot-product sketch's accumulator tile becomes instructions only where it fits the
    # registers (`lower/dot_product.py`); any other tile leaves the widening loop, tens of times
    # slower, so such sketches always draw a register tile, and never a blocked one: the tile
    # the instructions compute is the accumulator buffer, which a sweep would outgrow
    dot_product = any(isinstance(step, InterleaveStep) for step in sketch_steps)
    register_prob = 1.0 if dot_product else params.register_tile_prob
    blocked_prob = 0.0 if dot_product else params.blocked_register_tile_prob
    try:
        s = fill_tile_sizes(dag, sketch_steps, rng, params.max_innermost_split_factor, vector_lanes,
                            register_prob, register_tile_vectors(params, vector_registers),
                            params.max_reduction_block, blocked_prob)
        if not params.disable_change_compute_location:
            change_compute_locations(s, rng, params.fused_location_prob)
        cores = max(1, num_cores)
        annotate_parallel(s, rng, params.parallel_degree_per_core * cores, params.min_parallel_per_core * cores)
        annotate_unroll(s, rng, params.auto_unroll_max_step_choices)
        annotate_vectorize(s, rng, params.max_vectorize_size)
    except ScheduleError:
        return None
    return s
