"""Evolutionary search over complete programs: mutations and crossover of step lists, scored
by a cost model; the fittest unmeasured programs are what gets measured.

A program is its step list, so every edit is "change a step, replay": the replay is the
validator, and an edit that makes an illegal program simply produces no child.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence, Union

import numpy as np

from ansor.schedule.state import ScheduleError, State
from ansor.schedule.steps import (AnnotateStep, ComputeAtStep, ComputeInlineStep, ComputeRootStep, FuseStep,
                                  PragmaStep, SplitStep, Step)
from ansor.search.annotate import (compute_location_candidates, divisors, location_is_free, multi_level_splits,
                                   padded_extent)
from ansor.search.core_use import idle_cores
from ansor.search.params import SearchParams

ScoreFn = Callable[[Sequence[State]], np.ndarray]


def _replay(dag, steps: Sequence[Step]) -> State | None:
    try:
        return State.replay(dag, steps)
    except ScheduleError:
        return None


# ---------------------------------------------------------------------------------------------
# mutations: each returns a new State or None

def mutate_tile_size(state: State, rng: random.Random, params: SearchParams) -> State | None:
    """Move a factor between two levels of one split; the product (the extent) is preserved.
    The innermost level stays within `max_innermost_split_factor`, a reduction block within
    `max_reduction_block`."""
    candidates = [i for i, s in enumerate(state.steps)
                  if isinstance(s, SplitStep) and s.extent and s.extent > 1 and s.inner_to_outer
                  and all(n is not None for n in s.lengths)]
    if not candidates:
        return None
    for _ in range(4 * len(candidates)):
        idx = rng.choice(candidates)
        step = state.steps[idx]
        values = _levels(step)
        if values is None:
            continue  # only perfect tilings are mutated
        order = list(range(len(values)))
        rng.shuffle(order)
        for k, src in enumerate(order):
            if values[src] == 1:
                continue
            dst = order[(k + 1) % len(order)]
            choices = [d for d in divisors(values[src]) if d > 1]
            if dst == len(values) - 1:
                bound = (params.max_reduction_block if idx in state.reduction_block_steps
                         else params.max_innermost_split_factor)
                choices = [d for d in choices if d * values[dst] <= bound]
            if not choices:
                continue
            d = rng.choice(choices)
            values[src] //= d
            values[dst] *= d
            steps = list(state.steps)
            steps[idx] = replace(step, lengths=tuple(values[1:]))
            return _replay(state.dag, steps)
    return None


def _levels(step: SplitStep) -> list[int] | None:
    """All levels of a split that tiles its extent or its `padded_extent` perfectly, outermost
    (the implied one) first; None otherwise. Moving factors between levels keeps the tiling
    perfect."""
    prod = 1
    for n in step.lengths:
        prod *= n
    for extent in (step.extent, padded_extent(step.extent)):
        if extent % prod == 0:
            return [extent // prod, *step.lengths]
    return None


def mutate_tile_shape(state: State, rng: random.Random, params: SearchParams) -> State | None:
    """Reshape a stage's innermost tile: move a factor from one tiled axis's innermost level to
    another's, its volume unchanged; each axis gives or takes the factor back at one of its
    outer levels (not the second innermost: a register tile keeps its 1 there), so both
    extents stay perfectly tiled.

    Why: `mutate_tile_size` edits one axis at a time, so going from a 1x64 register tile to
    4x16 passes through 4x64 (over the registers) or 1x16 (too little reuse), both slow: the
    model never breeds past them. Here it is one step. (No weight by default: the model seldom
    ranks the reshaped children high, so they are seldom measured; see BENCHMARKS.md.)"""
    max_inner = params.max_innermost_split_factor
    tiled: dict[int, list[int]] = {}  # stage -> indices of its multi-level spatial splits
    for i in multi_level_splits(state.steps):
        s = state.steps[i]
        if s.extent and s.inner_to_outer and all(n is not None for n in s.lengths):
            tiled.setdefault(s.stage_id, []).append(i)
    givers = [i for idx in tiled.values() if len(idx) >= 2 for i in idx if state.steps[i].lengths[-1] > 1]
    for _ in range(8):
        if not givers:
            return None
        a = rng.choice(givers)
        takers_of_a = [i for i in tiled[state.steps[a].stage_id] if i != a and state.steps[i].extent > 1]
        if not takers_of_a:
            givers.remove(a)
            continue
        b = rng.choice(takers_of_a)
        va, vb = _levels(state.steps[a]), _levels(state.steps[b])
        if va is None or vb is None:
            continue
        outer_levels = range(len(va) - 2)  # multi-level: at least 3 levels
        d = rng.choice([d for d in divisors(va[-1]) if d > 1])
        takers = [k for k in outer_levels if vb[k] % d == 0]
        if not takers or vb[-1] * d > max_inner:
            continue
        va[-1] //= d
        va[rng.choice(list(outer_levels))] *= d
        vb[-1] *= d
        vb[rng.choice(takers)] //= d
        steps = list(state.steps)
        steps[a] = replace(state.steps[a], lengths=tuple(va[1:]))
        steps[b] = replace(state.steps[b], lengths=tuple(vb[1:]))
        return _replay(state.dag, steps)
    return None


def mutate_auto_unroll(state: State, rng: random.Random, params: SearchParams) -> State | None:
    pragmas = [i for i, s in enumerate(state.steps)
               if isinstance(s, PragmaStep) and s.pragma.startswith("auto_unroll_max_step$")]
    if not pragmas:
        return None
    idx = rng.choice(pragmas)
    current = state.steps[idx].pragma
    options = [f"auto_unroll_max_step${v}" for v in params.auto_unroll_max_step_choices]
    options = [o for o in options if o != current]
    steps = list(state.steps)
    steps[idx] = replace(steps[idx], pragma=rng.choice(options))
    return _replay(state.dag, steps)


def mutate_compute_location(state: State, rng: random.Random, params: SearchParams) -> State | None:
    """Move a stage whose location is free: a computed-at stage to another loop of its
    consumers, or a root stage into one of them (its parallel loop, which only a root stage
    has, given up). Why the second: random annotation leaves LayerNorm's and softmax's row
    statistics at the root in most samples (each stage's placement is drawn alone, and the
    fused placement needs all of them inside the output's row loop), and a program where one
    of them moves in is one mutation away instead of a fresh draw."""
    moves: list[tuple[str, int]] = [("at", i) for i, s in enumerate(state.steps) if isinstance(s, ComputeAtStep)]
    located = [i for i, s in enumerate(state.steps) if isinstance(s, _LOCATION_STEPS)]
    before = _replay(state.dag, state.steps[:located[-1] + 1]) if located else None
    if before is not None:
        moves += [("root", sid) for sid, st in enumerate(before.stages)
                  if st.attach == "root" and not st.is_placeholder and not before.is_output(sid)]
    rng.shuffle(moves)
    for kind, x in moves:
        child = _move_computed_at(state, rng, x) if kind == "at" else _move_root_stage_in(state, rng, before, x)
        if child is not None:
            return child
    return None


_LOCATION_STEPS = (ComputeAtStep, ComputeRootStep, ComputeInlineStep)


def _move_computed_at(state: State, rng: random.Random, idx: int) -> State | None:
    before = _replay(state.dag, state.steps[:idx])
    if before is None:
        return None
    sid = state.steps[idx].stage_id
    if not location_is_free(before, sid):
        return None
    cands = [c for c in compute_location_candidates(before, sid)
             if c != (state.steps[idx].target_stage_id, state.steps[idx].target_iter_id)]
    if not cands:
        return None
    target, it = rng.choice(cands)
    steps = list(state.steps)
    steps[idx] = ComputeAtStep(sid, target, it)
    return _replay(state.dag, steps)


def _move_root_stage_in(state: State, rng: random.Random, before: State, sid: int) -> State | None:
    """Root stage `sid` computed inside a consumer loop instead: the ComputeAt goes right after
    the last location step (`before` is the state there), its parallel fuse is dropped."""
    if before.attached_to(before.stages[sid].name) or not location_is_free(before, sid):
        return None
    cands = compute_location_candidates(before, sid)
    if not cands:
        return None
    insert_at = len(before.steps)
    rest = _without_parallel_loop(state.steps[insert_at:], sid)
    if rest is None:
        return None
    target, it = rng.choice(cands)
    return _replay(state.dag, [*state.steps[:insert_at], ComputeAtStep(sid, target, it), *rest])


def _parallel_fuse_at(steps: Sequence[Step], i: int) -> bool:
    """Whether steps[i] fuses a stage's outer loops into the loop the next step parallelizes."""
    s = steps[i]
    if not (isinstance(s, FuseStep) and s.iter_ids and s.iter_ids[0] == 0 and i + 1 < len(steps)):
        return False
    nxt = steps[i + 1]
    return (isinstance(nxt, AnnotateStep) and nxt.annotation == "parallel" and nxt.stage_id == s.stage_id
            and nxt.iter_id == 0)


def _without_parallel_loop(steps: Sequence[Step], sid: int) -> list[Step] | None:
    """`steps` without stage `sid`'s parallel loop (the fuse of its outer loops and the
    annotation); its later iterator ids shifted back. None when another kind of step of the
    stage would need rewriting."""
    for i in range(len(steps)):
        if steps[i].stage_id == sid and _parallel_fuse_at(steps, i):
            fused = len(steps[i].iter_ids)
            rest = _shift_iters(steps[i + 2:], sid, fused - 1)
            return None if rest is None else [*steps[:i], *rest]
    return list(steps)


def _shift_iters(steps: Sequence[Step], sid: int, shift: int) -> list[Step] | None:
    """`steps` (those after stage `sid`'s parallel fuse) for a fuse of `shift` fewer loops
    (negative: more): the stage's iterator ids past the fused loop move by `shift`. None when
    a step of the stage is of a kind this does not renumber."""
    out = []
    for s in steps:
        if s.stage_id == sid:
            if isinstance(s, FuseStep):
                s = replace(s, iter_ids=tuple(i + shift if i > 0 else i for i in s.iter_ids))
            elif not isinstance(s, (AnnotateStep, PragmaStep, SplitStep)):
                return None
            elif s.iter_id > 0:
                s = replace(s, iter_id=s.iter_id + shift)
        out.append(s)
    return out


def mutate_parallel(state: State, rng: random.Random, params: SearchParams) -> State | None:
    """Change how many outer loops are fused into the parallel loop."""
    spots = [i for i in range(len(state.steps)) if _parallel_fuse_at(state.steps, i)]
    if not spots:
        return None
    idx = rng.choice(spots)
    fuse = state.steps[idx]
    sid = fuse.stage_id
    before = _replay(state.dag, state.steps[:idx])
    if before is None:
        return None
    st = before.stages[sid]
    max_n = 0
    for it in st.iters:
        if it.kind != "spatial" or it.annotation != "none":
            break
        max_n += 1
        if before.attached_to(st.name, it.name):
            break
    old_n = len(fuse.iter_ids)
    choices = [n for n in range(1, max_n + 1) if n != old_n]
    if not choices:
        return None
    new_n = rng.choice(choices)
    rest = _shift_iters(state.steps[idx + 1:], sid, old_n - new_n)
    if rest is None:
        return None
    return _replay(state.dag, [*state.steps[:idx], FuseStep(sid, tuple(range(new_n))), *rest])


MUTATIONS: dict[str, Callable[[State, random.Random, dict], State | None]] = {
    "tile_size": mutate_tile_size,
    "tile_shape": mutate_tile_shape,
    "auto_unroll": mutate_auto_unroll,
    "compute_location": mutate_compute_location,
    "parallel": mutate_parallel,
}


def crossover(a: State, b: State, rng: random.Random) -> State | None:
    """Node-based crossover: each tiling decision (a split of one loop, an unroll depth) comes
    from one parent or the other. Only parents of the same structure can mate; the child is
    validated by replay."""
    def decisions(st: State) -> list[int]:
        return [i for i, s in enumerate(st.steps) if isinstance(s, (SplitStep, PragmaStep))]

    da, db = decisions(a), decisions(b)
    if len(da) < 2 or da != db or len(a.steps) != len(b.steps):
        return None
    for i in da:
        sa, sb = a.steps[i], b.steps[i]
        if type(sa) is not type(sb) or sa.stage_id != sb.stage_id or getattr(sa, "extent", None) != getattr(sb, "extent", None):
            return None
    take_b = [rng.random() < 0.5 for _ in da]
    if all(take_b) or not any(take_b):
        take_b[rng.randrange(len(da))] = not take_b[0]
    steps = list(a.steps)
    for i, from_b in zip(da, take_b):
        if from_b:
            steps[i] = b.steps[i]
    if steps == list(a.steps) or steps == list(b.steps):
        return None
    return _replay(a.dag, steps)


# ---------------------------------------------------------------------------------------------
# breeding: an order names an operation and its parents; the work can run in any process

@dataclass(eq=False)
class Genome:
    """A program as evolution handles it: its steps (what the operators edit) and its key.
    Children bred in worker processes come back as Genomes; `as_state` replays the few that
    are picked."""

    dag: object
    steps: tuple
    state_key: str
    reduction_block_steps: frozenset = frozenset()  # as the program's State has them

    def key(self) -> str:
        return self.state_key


Program = Union[State, Genome]
Order = tuple  # (operation name, parent Program, other parent Program or None)
BreedFn = Callable[[list, int], list]  # (orders, seed) -> children (State, Genome or None each)

BREED_CHUNKS = 8  # orders are bred in this many chunks, each with its own seeded generator, so the
                  # children do not depend on how many processes breed them


def as_state(program: Program) -> State:
    return program if isinstance(program, State) else State.replay(program.dag, program.steps)


def breed_one(op: str, parent: Program, other: Program | None, rng: random.Random,
              params: SearchParams, cores: int = 1) -> State | None:
    """Apply one operation (a mutation rule or "crossover") to its parents. A child that
    leaves some of the target's `cores` idle (`core_use.idle_cores`: a tile-size mutation that
    shrinks the loops above a producer's attach point to one iteration makes the parallel loop
    serial) counts as an operation that did not apply."""
    child = crossover(parent, other, rng) if op == "crossover" else MUTATIONS[op](parent, rng, params)
    return None if child is not None and idle_cores(child, cores) else child


def chunk_orders(orders: list) -> list[list]:
    size = -(-len(orders) // BREED_CHUNKS) or 1
    return [orders[i:i + size] for i in range(0, len(orders), size)]


def chunk_seed(seed: int, chunk: int) -> int:
    """The seed of one chunk's generator: the same wherever the chunk is bred."""
    return seed * 1_000_003 + chunk


def breed_locally(orders: list, seed: int, params: SearchParams, cores: int = 1) -> list[State | None]:
    """Children of `orders`, in this process (the reference for the parallel breeder)."""
    out: list[State | None] = []
    for c, chunk in enumerate(chunk_orders(orders)):
        rng = random.Random(chunk_seed(seed, c))
        out.extend(breed_one(op, p, o, rng, params, cores) for op, p, o in chunk)
    return out


# ---------------------------------------------------------------------------------------------
# the search

def evolve(population: list[Program], score: ScoreFn, rng: random.Random, params: SearchParams,
           exclude: set[str], out_size: int, num_iters: int | None = None,
           stats: dict | None = None, breed: BreedFn | None = None,
           deadline: float | None = None) -> list[tuple[float, Program]]:
    """Evolve a population for a few generations; return the best (score, program) pairs whose
    keys are not in `exclude` (already measured), best first. Past `deadline` (a `time.time()`
    value) no further generation is bred: a job out of time returns what it has found.

    Parents are drawn in this process (roulette wheel on the scores); `breed` turns the drawn
    orders into children, in worker processes when given (default: here)."""
    num_iters = params.evolutionary_search_num_iters if num_iters is None else num_iters
    breed = breed or (lambda orders, seed: breed_locally(orders, seed, params))
    pop_size = max(len(population), 1)
    weights = params.mutation_weights
    names = list(weights)
    rule_cdf = np.cumsum(np.array([weights[n] for n in names], dtype=float))
    rule_cdf /= rule_cdf[-1]
    p_cross, p_mutate = params.crossover_prob, params.evolutionary_search_mutation_prob
    heap: list[tuple[float, int, Program]] = []
    in_heap: set[str] = set()
    counter = 0
    for gen in range(num_iters + 1):
        if not population:
            break
        scores = np.asarray(score(population), dtype=float)
        for sc, st in zip(scores, population):
            key = st.key()
            if key in exclude or key in in_heap or not np.isfinite(sc):
                continue
            counter += 1
            if len(heap) < out_size:
                heapq.heappush(heap, (sc, counter, st))
                in_heap.add(key)
            elif sc > heap[0][0]:
                _, _, old = heapq.heapreplace(heap, (sc, counter, st))
                in_heap.discard(old.key())
                in_heap.add(key)
        if gen == num_iters or (deadline is not None and time.time() >= deadline):
            break
        fitness = np.where(np.isfinite(scores), np.maximum(scores, 0.0), 0.0)
        if fitness.sum() <= 0:
            fitness = np.ones(len(population))
        cumulative = np.cumsum(fitness / fitness.sum())
        last = len(population) - 1

        def pick() -> Program:  # roulette wheel: chance proportional to predicted fitness
            return population[min(int(np.searchsorted(cumulative, rng.random())), last)]

        children: list[Program] = []
        for _ in range(3):  # failed operations are re-drawn, at most twice
            orders: list[Order] = []
            while len(children) + len(orders) < pop_size:
                parent = pick()
                r = rng.random()
                if r < p_cross:
                    orders.append(("crossover", parent, pick()))
                elif r < p_cross + p_mutate:
                    orders.append((names[int(np.searchsorted(rule_cdf, rng.random()))], parent, None))
                else:
                    children.append(parent)
                    if stats is not None:
                        stats["copy"] = stats.get("copy", 0) + 1
            if not orders:
                break
            for (op, _, _), child in zip(orders, breed(orders, rng.randrange(2**31))):
                if stats is not None:
                    stats[op] = stats.get(op, 0) + (child is not None)
                if child is not None:
                    children.append(child)
        population = children
    return [(sc, st) for sc, _, st in sorted(heap, key=lambda t: -t[0])]
