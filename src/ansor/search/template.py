"""The search space of a template stage (attention, `te.attention`): its knobs as the splits of
one sketch, and their random annotation.

A template program is written whole by its lowering (`lower.attention`) from a few choices,
so its sketch is the template stage with three undecided splits, in this order: the query
axis i into (blocks, RQ), whose product is the query tile QT and whose inner length the
queries of a weighted-sum register block; the value columns e into (W,), the columns of that
block; the key axis j into (blocks, RK), whose product is the key tile KT and whose inner
length the keys of a scores register block. Annotation draws them so that both register
blocks fit the vector registers. Because the knobs are ordinary split steps, records store
and replay them, the tile-size mutations of the evolution change them (any lengths lower to
a correct program; blocks that do not fit the registers run as plain loops), and the cost
model reads the features of the program they lower to, as for any other stage.
"""

from __future__ import annotations

import random

from ansor.lower.attention import FEW_QUERIES
from ansor.schedule.state import ScheduleError, State
from ansor.schedule.steps import SplitStep
from ansor.search.params import SearchParams
from ansor.search.sketch import Cond, SketchRule
from ansor.te.attention import attention_parts, is_template

#: Query tiles (queries of one parallel task, the vector lanes of the scores) and key tiles
#: (scores held at once) drawn from; a tile longer than its axis is clipped to the axis.
QUERY_TILES = (16, 32, 48, 64, 96, 128)
KEY_TILES = (16, 32, 48, 64, 96, 128, 192, 256)
#: (axis, pieces) of the sketch's splits, in order.
SPLITS = (("i", 2), ("e", 1), ("j", 2))


def template_stage_of(dag) -> int | None:
    """The index of the DAG's template stage, or None when it has none."""
    for sid, t in enumerate(dag.tensors):
        if is_template(t.op):
            return sid
    return None


def _template_cond(ctx, state: State, sid: int) -> Cond:
    return Cond.APPLY_AND_SKIP_REST if is_template(state.stages[sid].op) else Cond.SKIP


def template_sketch(state: State, sid: int) -> State:
    """`state` with the template stage's knobs split, their lengths undecided."""
    s = state.copy()
    for axis, pieces in SPLITS:
        s.split(sid, axis, [None] * pieces)
    return s


def _template_sketch(ctx, state: State, sid: int):
    """The one sketch: the knobs' splits undecided; every other stage is the template's
    business, so derivation ends here."""
    return [(template_sketch(state, sid), -1, "attention template")]


TEMPLATE_RULE = SketchRule("template", _template_cond, _template_sketch)


def annotate_template(sketch_steps: list, dag, rng: random.Random, params: SearchParams,
                      vector_lanes: int = 0, vector_registers: int = 32) -> State | None:
    """One complete template program: the query tile and its register rows, the value chunk,
    the key tile and its register rows drawn (in the sketch's order of splits)."""
    sid = template_stage_of(dag)
    out = dag.tensors[sid]
    lq, dv, lk = attention_parts(out).q.shape[2], out.shape[3], out.op.reduce_axes[0].extent
    lanes = vector_lanes or (16 if vector_registers >= 32 else 8)  # float32 lanes, when not given
    qt = rng.choice(_menu(QUERY_TILES, lq))
    chunks = [c for c in range(lanes, dv + 1, lanes) if dv % c == 0] or [dv]
    w = rng.choice(chunks)
    rq = rng.choice(_rows(qt, -(-w // lanes), vector_registers))
    kt = rng.choice(_menu(KEY_TILES, lk))
    # a scores block holds RK x QT/lanes accumulators, or (few queries: dot products along the
    # head dimension) RK accumulators and RK key vectors
    rk = rng.choice(_rows(kt, 2 if qt < FEW_QUERIES else -(-qt // lanes), vector_registers))
    lengths = [(qt // rq, rq), (w,), (kt // rk, rk)]
    steps, k = [], 0
    for step in sketch_steps:
        if isinstance(step, SplitStep) and any(n is None for n in step.lengths):
            step = SplitStep(step.stage_id, step.iter_id, step.extent, lengths[k], step.inner_to_outer)
            k += 1
        steps.append(step)
    try:
        return State.replay(dag, steps)
    except ScheduleError:
        return None


def _menu(tiles: tuple[int, ...], extent: int) -> list[int]:
    """The tiles that fit `extent`, and the whole extent (one tile) when it is short."""
    return sorted({t for t in tiles if t < extent} | {extent} if extent <= max(tiles)
                  else {t for t in tiles})


def _rows(tile: int, vectors_per_row: int, registers: int) -> list[int]:
    """Rows of a register block that divide `tile` and whose accumulators, the operand vectors
    of one row and a broadcast fit `registers`; the largest few (small blocks reload their
    operands for few multiply-adds)."""
    fits = [r for r in range(1, tile + 1)
            if tile % r == 0 and (r + 1) * vectors_per_row + 1 <= registers]
    return fits[-3:] or [1]
