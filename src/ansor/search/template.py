"""The search space of a template stage (attention, `te.attention`): its knobs as the splits of
one sketch, and their random annotation.

A template program is written whole by its lowering (`lower.attention`) from a few choices,
so its sketch is the template stage with three undecided splits, in this order: the query
axis (i: the query tile), the value columns (e: the vector chunk of the accumulation), the
key axis (j: the key tile); annotation draws them and an auto-unroll limit. Because the
knobs are ordinary split steps and a pragma, records store and replay them, the tile-size
and unroll mutations of the evolution change them, and the cost model reads the features of
the program they lower to, as for any other stage.
"""

from __future__ import annotations

import random

from ansor.schedule.state import ScheduleError, State
from ansor.schedule.steps import SplitStep
from ansor.search.params import SearchParams
from ansor.search.sketch import Cond, SketchRule
from ansor.te.attention import is_template

#: Query tiles (rows kept in one task's running state) and key tiles (scores held at once)
#: drawn from; a tile longer than its axis is clipped to the axis.
QUERY_TILES = (1, 2, 4, 8, 16, 32, 64)
KEY_TILES = (8, 16, 32, 64, 128, 256)


def template_stage_of(dag) -> int | None:
    """The index of the DAG's template stage, or None when it has none."""
    for sid, t in enumerate(dag.tensors):
        if is_template(t.op):
            return sid
    return None


def _template_cond(ctx, state: State, sid: int) -> Cond:
    return Cond.APPLY_AND_SKIP_REST if is_template(state.stages[sid].op) else Cond.SKIP


def _template_sketch(ctx, state: State, sid: int):
    """The one sketch: the knobs' splits undecided; every other stage is the template's
    business, so derivation ends here."""
    s = state.copy()
    for axis in ("i", "e", "j"):
        s.split(sid, axis, [None])
    return [(s, -1, "attention template")]


TEMPLATE_RULE = SketchRule("template", _template_cond, _template_sketch)


def annotate_template(sketch_steps: list, dag, rng: random.Random, params: SearchParams,
                      vector_lanes: int = 0) -> State | None:
    """One complete template program: the query tile, vector chunk and key tile drawn (in the
    sketch's order of splits), then the unroll limit."""
    sid = template_stage_of(dag)
    out = dag.tensors[sid]
    lq, dv, lk = out.shape[2], out.shape[3], out.op.reduce_axes[0].extent
    chunks = [c for c in range(1, dv + 1) if dv % c == 0 and (c % max(vector_lanes, 1) == 0 or c == dv)]
    menus = [_menu(QUERY_TILES, lq), chunks or [dv], _menu(KEY_TILES, lk)]
    steps, k = [], 0
    for step in sketch_steps:
        if isinstance(step, SplitStep) and any(n is None for n in step.lengths):
            step = SplitStep(step.stage_id, step.iter_id, step.extent, (rng.choice(menus[k]),), step.inner_to_outer)
            k += 1
        steps.append(step)
    try:
        s = State.replay(dag, steps)
        s.pragma(sid, 0, f"auto_unroll_max_step${rng.choice(params.auto_unroll_max_step_choices)}")
    except ScheduleError:
        return None
    return s


def _menu(tiles: tuple[int, ...], extent: int) -> list[int]:
    """The tiles that fit `extent`, and the whole extent (one tile) when it is short."""
    return sorted({t for t in tiles if t < extent} | {extent} if extent <= max(tiles)
                  else {t for t in tiles})
