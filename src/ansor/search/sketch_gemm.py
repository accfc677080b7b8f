"""The GEMM template's sketch rule and random annotation (CUDA targets).

The rule matches a matmul-shaped output stage that a matrix instruction computes
(`te.matrix_instructions.match_gemm`: Tensor Cores for float16/bfloat16 operands summed in
float32, fused multiply-adds for float32) in a task of that stage alone, and adds one sketch
beside the usual ones: the stage's rows and columns split into [warps (or threads), rows per
warp (or thread)], the reduction into [block_k], and the template pragma whose knobs
(`lower.gemm_template.GemmKnobs`) annotation draws. The splits are ordinary steps, so the
tile-size mutation of the evolution changes block and warp tiles; a mutation the instruction
cannot compute is refused when the program is lowered, and never measured.
"""

from __future__ import annotations

import random
from dataclasses import replace

from ansor.lower.gemm_template import PRAGMA, WGMMA_K, WGMMA_MAX_ACCUMULATORS, WGMMA_TILES_N, GemmKnobs, lower_gemm
from ansor.lower.gpu import GPULimits, lower_for_gpu
from ansor.schedule.state import ScheduleError, State
from ansor.schedule.steps import PragmaStep, SplitStep
from ansor.search.params import SearchParams
from ansor.search.sketch import Cond, SketchRule
from ansor.te.matrix_instructions import GemmMatch, match_gemm

MAX_DRAWS = 64

# what annotation draws from (each filtered by what the shapes and the alignment allow)
TC_WARPS = (1, 2, 4)             # warps along rows and along columns (at most 8 a block)
TC_FRAGMENTS = (1, 2, 4)         # 16x16 accumulator fragments per warp along each axis
TC_BLOCK_K = (16, 32, 64)
FMA_THREADS = (4, 8, 16, 32)     # threads along rows and along columns (64 to 256 a block)
FMA_TILES = (1, 2, 4, 8)         # a thread's rows and columns
FMA_BLOCK_K = (4, 8, 16, 32)
STAGES = (1, 2)
MAX_STAGED_LOADS = 32            # loads of a tile a thread may hold in registers
UNROLLS = (0, 1, 2, 4)           # 0: the whole k-step loop
WGMMA_GROUPS = (1, 2)            # warpgroups along rows and along columns (4 only with small tiles)
WGMMA_TILES_M = (64, 128)
# stages weighted to 4 and a batch left in flight most of the time: on an H200 (BENCHMARKS.md)
# every pair of programs that differed in these alone was 0.05-0.18x of cuBLAS faster with them
WGMMA_STAGES = (2, 3, 4, 4, 5, 6)
WGMMA_IN_FLIGHT_SHARE = 0.8
WGMMA_GROUP_ROWS = (0, 4, 8, 16)


def cuda_arch(target) -> int:
    """The compute capability of a CUDA target ("sm_90" -> 90), 0 for any other target."""
    if getattr(target, "kind", "") != "cuda":
        return 0
    digits = "".join(ch for ch in target.isa if ch.isdigit())
    return int(digits) if digits else 0


def gemm_of(state: State, sid: int, arch: int) -> GemmMatch | None:
    """The match of stage `sid` when it is the one computed stage of its task."""
    st = state.stages[sid]
    computed = [s for s in state.stages if not s.is_placeholder]
    if st.is_placeholder or len(computed) != 1 or not state.is_output(sid) or not st.is_fresh:
        return None
    return match_gemm(st.op, arch)


def _rule_cond(ctx, state: State, sid: int) -> Cond:
    arch = cuda_arch(ctx.target)
    return Cond.APPLY if arch and gemm_of(state, sid, arch) is not None else Cond.SKIP


def _rule(ctx, state: State, sid: int):
    """The template sketch: its loop knobs undecided, the pragma's knobs drawn by annotation."""
    s = state.copy()
    st = s.stages[sid]
    (i, j), k = (a.name for a in st.op.axes), st.op.reduce_axes[0].name
    s.split(sid, i, [None, None])
    s.split(sid, j, [None, None])
    s.split(sid, k, [None])
    s.pragma(sid, 0, PRAGMA)
    match = gemm_of(state, sid, cuda_arch(ctx.target))
    return [(s, -1, f"gemm template ({match.instruction.name})")]


GEMM_TEMPLATE_RULE = SketchRule("gemm_template", _rule_cond, _rule)


def is_gemm_sketch(sketch_steps) -> bool:
    """Whether a sketch is the GEMM template's."""
    return any(isinstance(s, PragmaStep) and s.pragma.startswith(PRAGMA) for s in sketch_steps)


def _divisors(n: int, menu: tuple[int, ...]) -> list[int]:
    return [x for x in menu if n % x == 0]


def draw_knobs(match: GemmMatch, rng: random.Random) -> GemmKnobs | None:
    """Random knobs that the instruction, the shapes and the alignment allow, or None."""
    if match.instruction.kind == "wgmma":
        return _draw_wgmma_knobs(match, rng)
    size = 4 if match.a.dtype == "float32" else 2
    b_row = match.k if match.b_transposed else match.n
    for _ in range(MAX_DRAWS):
        if match.instruction.tensor_core:
            wm, wn = rng.choice(TC_WARPS), rng.choice(TC_WARPS)
            fm, fn = rng.choice(TC_FRAGMENTS), rng.choice(TC_FRAGMENTS)
            if wm * wn > 8 or fm * fn > 8:
                continue
            tm, tn = 16 * fm, 16 * fn
            ks = _divisors(match.k, TC_BLOCK_K)
            pads = (0, 8)
        else:
            wm, wn = rng.choice(FMA_THREADS), rng.choice(FMA_THREADS)
            tm, tn = rng.choice(FMA_TILES), rng.choice(FMA_TILES)
            if not 64 <= wm * wn <= 256 or tm * tn > 64:
                continue
            ks = _divisors(match.k, FMA_BLOCK_K)
            pads = (0, 4)
        if not ks or match.m % (wm * tm) or match.n % (wn * tn):
            continue
        bk = rng.choice(ks)
        b_tile = bk if match.b_transposed else wn * tn
        vectors = [v for v in (16 // size, 8 // size, 4 // size, 1)
                   if v >= 1 and match.k % v == 0 and b_row % v == 0 and bk % v == 0 and b_tile % v == 0]
        interleave = rng.choice((0, 1)) if not match.instruction.tensor_core and tm % 4 == 0 and tn % 4 == 0 else 0
        # the widest aligned load most of the time: narrower ones are rarely faster
        vector = vectors[0] if rng.random() < 0.75 else rng.choice(vectors)
        # a tile's loads wait in registers on their way to shared memory: past MAX_STAGED_LOADS
        # loads a thread, nvcc spilled them (a 32x128x64 block of 64 threads loading 1 element
        # at a time held 160)
        threads = wm * wn * (32 if match.instruction.tensor_core else 1)
        staged = -(-(wm * tm * bk) // (threads * vector)) + -(-(wn * tn * bk) // (threads * vector))
        if staged > MAX_STAGED_LOADS:
            continue
        return GemmKnobs(wm, wn, tm, tn, bk, rng.choice(STAGES), rng.choice(pads), vector,
                         rng.choice(UNROLLS), interleave)
    return None


def _draw_wgmma_knobs(match: GemmMatch, rng: random.Random) -> GemmKnobs | None:
    """Warpgroup tiles whose accumulators fit the registers; the shared-memory limit of the
    stages is checked when the program is lowered."""
    for _ in range(MAX_DRAWS):
        wm, wn = rng.choice(WGMMA_GROUPS), rng.choice(WGMMA_GROUPS)
        tm, tn = rng.choice(WGMMA_TILES_M), rng.choice(WGMMA_TILES_N)
        accumulators = tm * tn // 128
        if accumulators > WGMMA_MAX_ACCUMULATORS or wm * wn * accumulators > 2 * WGMMA_MAX_ACCUMULATORS:
            continue  # a block's 2 (or 4 smaller) warpgroups within the registers of one multiprocessor
        if match.m % (wm * tm) or match.n % (wn * tn) or match.k % WGMMA_K:
            continue
        stages = rng.choice(WGMMA_STAGES)
        in_flight = int(stages > 2 and rng.random() < WGMMA_IN_FLIGHT_SHARE)
        return GemmKnobs(wm, wn, tm, tn, WGMMA_K, stages, 0, 8, 0, 0, 1, in_flight, rng.choice(WGMMA_GROUP_ROWS))
    return None


def knob_steps(sketch_steps: list, knobs: GemmKnobs) -> list:
    """The sketch's steps with its undecided splits and its pragma filled from `knobs`."""
    lengths = [(knobs.warps_m, knobs.tile_m), (knobs.warps_n, knobs.tile_n), (knobs.block_k,)]
    out, n = [], 0
    for step in sketch_steps:
        if isinstance(step, SplitStep) and any(x is None for x in step.lengths):
            step = replace(step, lengths=lengths[n])
            n += 1
        elif isinstance(step, PragmaStep) and step.pragma.startswith(PRAGMA):
            step = replace(step, pragma=knobs.pragma_text())
        out.append(step)
    return out


def template_program(task, knobs: GemmKnobs) -> State:
    """The task's GEMM template program with chosen `knobs`: its sketch's undecided splits and
    pragma filled in (a program to check or time by hand, outside a search)."""
    from ansor.search.sketch_policy import SketchPolicy  # the policy's sketches: it imports this module

    sketch = next(s for s in SketchPolicy(task, seed=0).sketches if is_gemm_sketch(s.steps))
    return State.replay(task.dag, knob_steps(list(sketch.steps), knobs))


def annotate_gemm(sketch_steps: list, dag, rng: random.Random, params: SearchParams, limits: GPULimits,
                  arch: int = 90) -> State | None:
    """One complete template program within the target's limits, or None after MAX_DRAWS tries
    (`arch` only needs to admit the instruction: the sketch rule chose it for the target)."""
    probe = State.replay(dag, [s for s in sketch_steps if not isinstance(s, (SplitStep, PragmaStep))])
    sid = next(i for i, st in enumerate(probe.stages) if not st.is_placeholder)
    match = gemm_of(probe, sid, arch)
    if match is None:
        return None
    for _ in range(MAX_DRAWS):
        knobs = draw_knobs(match, rng)
        if knobs is None:
            return None
        try:
            s = State.replay(dag, knob_steps(sketch_steps, knobs))
            lower_for_gpu(lower_gemm(s, arch=arch), limits)
        except ScheduleError:  # GPUScheduleError included: over the block's shared memory
            continue
        return s
    return None
