"""A first, simple search space and random search over it.

Per stage: inline strictly elementwise stages; multi-level tile ("SSRSRS") stages with data
reuse, parallelize their outer tiles, vectorize the innermost spatial tile and pick an
auto-unroll depth; elsewhere parallelize outer loops and vectorize the innermost one.
"""

from __future__ import annotations

import random

from ansor.schedule.state import ScheduleError, State
from ansor.search.annotate import divisors, sample_factors
from ansor.search.annotate_gpu import bind_threads, gpu_hardware
from ansor.search.matvec import matvec_program
from ansor.search.window_reduction import window_program
from ansor.search.policy import SearchPolicy
from ansor.task import Task

BASIC_DEFAULTS = {
    "max_innermost_split_factor": 64,
    "max_vectorize_size": 16,
    "auto_unroll_choices": (0, 16, 64, 512),
    "max_tries_per_program": 8,
}


def inline_elementwise(s: State) -> None:
    """Inline every strictly elementwise stage that is not an output into its consumers."""
    infos = s.infos
    for sid in reversed(range(len(s.stages))):
        st = s.stages[sid]
        if not st.is_placeholder and infos[sid].strictly_inlineable and not s.is_output(sid) \
                and not s.attached_to(st.name):
            s.compute_inline(sid)


def sample_basic_program(base: State, rng: random.Random, params: dict = BASIC_DEFAULTS) -> State:
    s = base.copy()
    infos = s.infos
    inline_elementwise(s)
    for sid, st in enumerate(s.stages):
        if st.is_placeholder or st.attach != "root":
            continue
        if infos[sid].needs_multi_level_tiling:
            _tile(s, sid, rng, params)
        else:
            _simple(s, sid, rng, params)
    return s


def _tile(s: State, sid: int, rng: random.Random, params: dict) -> None:
    st = s.stages[sid]
    spatial = [it for it in st.iters if it.kind == "spatial"]
    reduce_ = [it for it in st.iters if it.kind == "reduce"]
    levels_s: list[list[str]] = [[], [], [], []]
    levels_r: list[list[str]] = [[], []]
    for it in spatial:
        lengths = sample_factors(it.extent, 3, rng, params["max_innermost_split_factor"])
        pieces = s.split(sid, it.name, lengths)
        for lv, p in enumerate(pieces):
            levels_s[lv].append(p.name)
    for it in reduce_:
        lengths = sample_factors(it.extent, 1, rng, params["max_innermost_split_factor"])
        pieces = s.split(sid, it.name, lengths)
        for lv, p in enumerate(pieces):
            levels_r[lv].append(p.name)
    order = levels_s[0] + levels_s[1] + levels_r[0] + levels_s[2] + levels_r[1] + levels_s[3]
    s.reorder(sid, order)
    s.fuse(sid, levels_s[0])
    s.parallel(sid, 0)
    st = s.stages[sid]
    last = st.iters[-1]
    if last.kind == "spatial" and last.extent > 1:
        s.vectorize(sid, len(st.iters) - 1)
    s.pragma(sid, 0, f"auto_unroll_max_step${rng.choice(params['auto_unroll_choices'])}")


def _simple(s: State, sid: int, rng: random.Random, params: dict) -> None:
    st = s.stages[sid]
    spatial = [i for i, it in enumerate(st.iters) if it.kind == "spatial"]
    has_reduce = len(spatial) < len(st.iters)
    if not spatial:
        return
    if not has_reduce and st.iters[spatial[-1]].extent > 1:
        last = st.iters[spatial[-1]]
        choices = [d for d in divisors(last.extent) if d <= params["max_vectorize_size"]]
        width = rng.choice(choices)
        if width > 1:
            s.split(sid, last.name, [width])
            s.vectorize(sid, len(s.stages[sid].iters) - 1)
    n_outer = len(spatial) - (0 if has_reduce else 1)
    if n_outer >= 1:
        n_fuse = rng.randint(1, n_outer)
        s.fuse(sid, list(range(n_fuse)))
        s.parallel(sid, 0)


class RandomSearchPolicy(SearchPolicy):
    """Uniform random programs from the basic space, skipping ones already measured."""

    def __init__(self, task: Task, seed: int | None = None, params: dict | None = None):
        super().__init__(task, seed)
        self.rng = random.Random(seed)
        self.params = {**BASIC_DEFAULTS, **(params or {})}
        self.base = State(task.dag)

    def next_batch(self, n: int, measured_keys: set[str], deadline: float | None = None) -> list[State]:
        out: list[State] = []
        seen = set(measured_keys)
        misses = 0
        while len(out) < n and misses < n * self.params["max_tries_per_program"]:
            try:
                st = sample_basic_program(self.base, self.rng, self.params)
            except ScheduleError:
                misses += 1
                continue
            key = st.key()
            if key in seen:
                misses += 1
                continue
            seen.add(key)
            out.append(st)
        return out


DEFAULT_GPU_THREADS = 64  # a block of the untuned GPU program: two warps, fits every GPU


def default_schedule(task: Task) -> State:
    """The untuned program used when no record exists: inline, parallel outer loops, a
    matrix-vector product's rows as vectors, a pooling window's channels as vectors (on a GPU:
    each root stage's spatial loops fused and cut into blocks of 64 threads)."""
    s = State(task.dag)
    inline_elementwise(s)
    target = task.target
    if target.is_gpu:
        bind_threads(s, random.Random(0), gpu_hardware(target), threads=DEFAULT_GPU_THREADS)
        return s
    for name in [st.name for st in s.stages]:
        sid = next(i for i, st in enumerate(s.stages) if st.name == name)
        st = s.stages[sid]
        if st.is_placeholder or st.attach != "root":
            continue
        program = matvec_program(s, sid, target.vector_unit_bytes, target.num_cores)
        if program is None:  # a pooling window over channels-last data (`search.window_reduction`)
            program = window_program(s, sid, target.num_cores)
        if program is not None:  # rows against one vector: rows read as vectors (`search.matvec`)
            s = program
        elif st.iters and st.iters[0].kind == "spatial" and st.iters[0].extent > 1:
            s.parallel(sid, 0)
    return s
