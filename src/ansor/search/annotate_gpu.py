"""Random annotation of a GPU sketch: tile sizes within the block's limits, thread binding,
cooperative fetching of shared copies, unrolling (Ansor's GPU init rules, in order).

- Tile sizes: the spatial splits of a multi-level-tiled stage ("SSSRRSRS": lengths for the
  virtual-thread, thread and two per-thread levels) are drawn together until the block has at
  most `max_threads` threads (and at least a warp, unless the whole output is small), at most
  `max_vthread` virtual threads and a per-thread tile (all virtual threads' sub-tiles) of at
  most `max_thread_tile` values (its accumulators live in registers), with the block's
  registers enough for every thread's tile. Drawing each axis alone would make most programs invalid. Other splits are drawn as on
  the CPU; the whole program is then lowered and verified (shared memory depends on all tiles).
- Thread binding: a tiled root stage's first three tile levels are fused into blockIdx.x,
  vthread and threadIdx.x; a cross-thread reduction's spatial loops are fused into blockIdx.x
  (a block per output); an untiled root stage's spatial loops are fused and split into blocks
  of a sampled thread count.
- Cooperative fetching: a shared copy's loops are fused and split by the consumer's thread
  count (a follow-fused-split, so mutating the tile sizes keeps them in step), the inner part
  bound to threadIdx.x: each thread copies its share.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from dataclasses import replace as _replace

from ansor.lower.gpu import GPULimits, lower_for_gpu
from ansor.lower.lower import lower
from ansor.schedule.state import ScheduleError, State
from ansor.schedule.steps import AnnotateStep, SplitStep
from ansor.search.annotate import annotate, annotate_unroll, register_level_splits, sample_factors
from ansor.search.core_use import idle_cores
from ansor.search.params import SearchParams
from ansor.search.sketch_gemm import annotate_gemm, cuda_arch, is_gemm_sketch
from ansor.search.template import annotate_template, template_stage_of

THREAD_COUNTS = (32, 64, 128, 256, 512, 1024)  # block sizes an untiled stage draws from
MAX_TILE_TRIES = 64
MAX_VALID_TRIES = 8   # draws of a program before annotation gives up on a sketch for now
REGISTER_OVERHEAD = 32  # registers a thread needs beside its tile (indices, addresses). A tile of
                        # n accumulators keeps about n operands live too (a row and a column of A
                        # and B per step): 2n + 32 in all; a 1024-thread block gets 64 registers
                        # each. Of the suite's 640 sampled programs, nvcc spilled 10 estimating
                        # n + 32, 5 with 2n + 32 and 7 with 3n + 32 (convolutions' wider operand
                        # windows and nvcc's own unrolling, which no such count captures)


@dataclass(frozen=True)
class GPUHardware:
    """What annotation needs of a GPU target."""

    max_threads: int = 1024
    max_vthread: int = 8
    warp_size: int = 32
    max_thread_tile: int = 64       # values a thread accumulates (in registers)
    shared_bytes: int = 48 * 1024   # per block
    registers_per_block: int = 65536  # 32-bit registers a block's threads share (NVIDIA since Kepler)
    local_bytes: int = 4096         # private arrays per thread
    arch: int = 0                   # CUDA compute capability (90 for sm_90); 0 for other targets

    @property
    def limits(self) -> GPULimits:
        return GPULimits(self.max_threads, self.shared_bytes, self.max_vthread, self.local_bytes)


def gpu_hardware(target, max_thread_tile: int = 64) -> GPUHardware:
    """The limits of a GPU target as annotation reads them (those its backend verifies)."""
    from ansor.backend import backend_for

    caps = backend_for(target).capabilities(target)
    return GPUHardware(caps.max_threads_per_block, caps.max_vthread, caps.warp_size, max_thread_tile,
                       caps.shared_memory_bytes, local_bytes=caps.local_memory_bytes, arch=cuda_arch(target))


def annotate_gpu(sketch_steps: list, dag, rng: random.Random, params: SearchParams,
                 hw: GPUHardware) -> State | None:
    """One complete GPU program from a sketch that the target can run, or None if
    `MAX_VALID_TRIES` draws all turned out illegal. Each draw is lowered and checked against
    the block's limits (shared memory depends on the tiles of every stage together: about two
    thirds of a convolution's unchecked draws overflowed it)."""
    if is_gemm_sketch(sketch_steps):  # a template's knobs (search/sketch_gemm.py)
        return annotate_gemm(sketch_steps, dag, rng, params, hw.limits, hw.arch or 90)
    names = step_stage_names(dag, tuple(sketch_steps))
    for _ in range(MAX_VALID_TRIES):
        try:
            filled = _fill_tile_sizes(sketch_steps, rng, params, hw)
            if filled is None:
                continue
            s = State.replay(dag, filled)
            bind_threads(s, rng, hw)
            fetch_cooperatively(s, names)
            annotate_unroll(s, rng, params.gpu_auto_unroll_max_step_choices)
            lower_for_gpu(lower(s), hw.limits)
        except ScheduleError:  # GPUScheduleError included: over the block's limits
            continue
        return s
    return None


def _fill_tile_sizes(steps: list, rng: random.Random, params: SearchParams, hw: GPUHardware) -> list | None:
    tiled = register_level_splits(steps)  # the multi-level splits of spatial axes
    by_stage: dict[int, list[int]] = {}
    for i in sorted(tiled):
        if len(steps[i].lengths) == 4:
            by_stage.setdefault(steps[i].stage_id, []).append(i)
    drawn: dict[int, tuple[int, ...]] = {}
    for indices in by_stage.values():
        total = math.prod(steps[i].extent for i in indices)
        for _ in range(MAX_TILE_TRIES):
            lengths = {i: sample_factors(steps[i].extent, 4, rng, params.max_innermost_split_factor)
                       for i in indices}
            vthreads = math.prod(v[0] for v in lengths.values())
            threads = math.prod(v[1] for v in lengths.values())
            # injected virtual threads keep every sub-tile's accumulators live at once
            tile = math.prod(v[0] * v[2] * v[3] for v in lengths.values())
            if (vthreads <= hw.max_vthread and threads <= hw.max_threads and tile <= hw.max_thread_tile
                    and threads * (2 * tile + REGISTER_OVERHEAD) <= hw.registers_per_block
                    and (threads >= hw.warp_size or total <= 2 * hw.warp_size)):
                drawn.update(lengths)
                break
        else:
            return None
    for i in _thread_splits(steps):  # a cross-thread reduction's block: a power of two
        extent = steps[i].extent
        fits = [t for t in THREAD_COUNTS if t <= hw.max_threads and t < 2 * extent] or [hw.warp_size]
        drawn[i] = (rng.choice(fits),)
    out = []
    for i, step in enumerate(steps):
        if isinstance(step, SplitStep) and any(n is None for n in step.lengths):
            lengths = drawn.get(i) or sample_factors(step.extent, len(step.lengths), rng,
                                                     params.max_innermost_split_factor)
            step = _replace(step, lengths=lengths)
        out.append(step)
    return out


def _thread_splits(steps: list) -> list[int]:
    """Undecided splits whose inner piece the next step binds to threadIdx (the sketch's
    cross-thread reductions)."""
    return [i for i, step in enumerate(steps[:-1])
            if isinstance(step, SplitStep) and step.lengths == (None,)
            and isinstance(steps[i + 1], AnnotateStep) and steps[i + 1].stage_id == step.stage_id
            and steps[i + 1].iter_id == step.iter_id + 1 and steps[i + 1].annotation.startswith("threadIdx")]


@functools.lru_cache(maxsize=256)
def step_stage_names(dag, sketch_steps: tuple) -> tuple[str, ...]:
    """The name of the stage each step of a sketch acts on (step records hold stage ids,
    which later cache stages shift)."""
    s = State(dag)
    names = []
    for step in sketch_steps:
        names.append(s.stages[step.stage_id].name)
        step.apply(s)
    return tuple(names)


def _tile_levels(state: State, sid: int) -> list[list[str]] | None:
    """The first three tile levels of a multi-level-tiled stage (each: one piece per spatial
    axis), or None if the stage is not tiled that way."""
    st = state.stages[sid]
    axes = [a.name for a in st.op.axes]
    n = len(axes)
    if n == 0 or len(st.iters) < 3 * n:
        return None
    levels = []
    for k in range(3):
        names = [st.iters[k * n + a].name for a in range(n)]
        if names != [f"{axis}.{k}" for axis in axes]:
            return None
        levels.append(names)
    return levels


def bind_threads(state: State, rng: random.Random, hw: GPUHardware, threads: int | None = None) -> None:
    """Bind every root stage's loops to blocks and threads (an untiled stage's blocks of
    `threads` threads, drawn when None)."""
    for sid, st in enumerate(state.stages):
        if st.is_placeholder or st.attach != "root":
            continue
        levels = _tile_levels(state, sid)
        if levels is not None:
            for names, kind in zip(levels, ("blockIdx.x", "vthread", "threadIdx.x")):
                fused = state.fuse(sid, names)
                state.annotate(sid, fused.name, kind)
            continue
        if any(it.annotation.startswith("threadIdx") for it in st.iters):  # a cross-thread reduction
            spatial = [it.name for it in st.iters if it.kind == "spatial" and it.annotation == "none"]
            if spatial:
                fused = state.fuse(sid, spatial) if len(spatial) > 1 else state.stages[sid].iters[0]
                state.annotate(sid, fused.name, "blockIdx.x")
            continue
        spatial = []
        for it in st.iters:
            if it.kind != "spatial" or it.annotation != "none" or state.attached_to(st.name, it.name):
                break
            spatial.append(it.name)
        if not spatial:
            raise ScheduleError(f"stage {st.name!r} has no spatial loop to bind to GPU threads")
        fused = state.fuse(sid, spatial) if len(spatial) > 1 else state.stages[sid].iters[0]
        block = threads or rng.choice([t for t in THREAD_COUNTS if t <= hw.max_threads] or [hw.max_threads])
        block = min(block, hw.max_threads, fused.extent)
        outer, inner = state.split(sid, fused.name, [block])
        state.annotate(sid, outer.name, "blockIdx.x")
        state.annotate(sid, inner.name, "threadIdx.x")


def fetch_cooperatively(state: State, stage_names: tuple[str, ...]) -> None:
    """Split each attached shared copy by its consumer's thread count and bind the inner part
    to threadIdx.x."""
    for sid, st in enumerate(state.stages):
        if st.scope != "shared" or not isinstance(st.attach, tuple):
            continue
        consumer = st.attach[0]
        src = [i for i, step in enumerate(state.steps[:len(stage_names)])
               if stage_names[i] == consumer and isinstance(step, SplitStep) and len(step.lengths) == 4]
        if not src:
            raise ScheduleError(f"shared copy {st.name!r}: its consumer {consumer!r} is not tiled for threads")
        fused = state.fuse(sid, [it.name for it in st.iters]) if len(st.iters) > 1 else st.iters[0]
        _, inner = state.follow_fused_split(sid, fused.name, src, 1, True)
        state.annotate(sid, inner.name, "threadIdx.x")


def annotate_program(sketch_steps: list, dag, rng: random.Random, params: SearchParams,
                     hardware: tuple | GPUHardware) -> State | None:
    """Random annotation for the target `hardware` describes: a `GPUHardware`, or the CPU's
    (num_cores, vector_lanes, vector_registers)."""
    if isinstance(hardware, GPUHardware):
        return annotate_gpu(sketch_steps, dag, rng, params, hardware)
    if template_stage_of(dag) is not None:  # a template's knobs, not loop annotations
        return annotate_template(sketch_steps, dag, rng, params, hardware[1], hardware[2])
    state = annotate(sketch_steps, dag, rng, params, *hardware)
    return None if state is not None and idle_cores(state, hardware[0]) else state  # drawn again
