"""Property test: random legal schedules compute what the declaration says.

For each operator, hypothesis draws a random sequence of schedule primitives (split with
divisible and non-divisible lengths, reorder, fuse, parallel/vectorize/unroll annotations,
auto-unroll pragmas, compute_inline, compute_at, compute_root, cache_write + compute_at,
cache_read + compute_at, rfactor, transform_layout). Each step is tried on a copy of the state; a step the library
rejects with ScheduleError (at the step, or when the state is lowered) is skipped, so what remains
is a legal program. The program is compiled, run, and compared with numpy; its steps, serialized
to JSON text and replayed, must give the same key and the same C source.
"""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import ansor
from ansor.backend import generate_source
from ansor.lower.lower import lower
from ansor.schedule import steps_from_json
from ansor.schedule.steps import SplitStep
from helpers import OPERATORS, run_and_check

# 11 operators x 20 = 220 programs in CI; ANSOR_PROPERTY_EXAMPLES=500 for a deeper run and
# ANSOR_PROPERTY_RANDOM=1 to draw new programs instead of the reproducible CI set.
EXAMPLES_PER_OPERATOR = int(os.environ.get("ANSOR_PROPERTY_EXAMPLES", "20"))
DERANDOMIZE = os.environ.get("ANSOR_PROPERTY_RANDOM", "") in ("", "0")
MAX_STEPS = 10
UNROLL_STEPS = (0, 4, 16, 64, 512)

# ---------------------------------------------------------------------------------------------
# choosing stages and iterators


def loop_stages(s: ansor.State) -> list[int]:
    """Stages that have loops (not placeholders, not inlined)."""
    return [i for i, stage in enumerate(s.stages)
            if not stage.is_placeholder and stage.attach != "inline"]


class NotApplicable(Exception):
    """The drawn action has nothing to act on in this state (e.g. no reduction to rfactor)."""


def pick(data, options, label: str):
    options = list(options)
    if not options:
        raise NotApplicable(label)
    return data.draw(st.sampled_from(options), label=label)


def draw_stage(data, s: ansor.State, candidates=None) -> int:
    return pick(data, loop_stages(s) if candidates is None else candidates, "stage")


def draw_iter(data, s: ansor.State, sid: int) -> int:
    return data.draw(st.integers(0, len(s.stages[sid].iters) - 1), label="iterator")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def draw_lengths(data, extent: int, n: int) -> list[int]:
    """n split lengths: divisors of the extent, or any small lengths (often not dividing it)."""
    divisible = data.draw(st.booleans(), label="divisible")
    lengths = []
    rest = extent
    for _ in range(n):
        if divisible:
            length = data.draw(st.sampled_from([d for d in divisors(rest) if d <= 8]), label="length")
            rest //= length
        else:
            length = data.draw(st.integers(1, 7), label="length")
        lengths.append(length)
    return lengths


# ---------------------------------------------------------------------------------------------
# actions: each mutates `s` or raises ScheduleError


def do_split(data, s):
    sid = draw_stage(data, s)
    idx = draw_iter(data, s, sid)
    it = s.stages[sid].iters[idx]
    lengths = draw_lengths(data, it.extent, data.draw(st.integers(1, 2), label="n_lengths"))
    event("split: " + ("divisible" if it.extent % math.prod(lengths) == 0 else "non-divisible"))
    s.split(sid, idx, lengths, inner_to_outer=data.draw(st.booleans(), label="inner_to_outer"))


def do_reorder(data, s):
    sid = draw_stage(data, s)
    order = data.draw(st.permutations(range(len(s.stages[sid].iters))), label="order")
    s.reorder(sid, order)


def do_fuse(data, s):
    sid = draw_stage(data, s)
    n = len(s.stages[sid].iters)
    start = data.draw(st.integers(0, n - 1), label="fuse start")
    count = data.draw(st.integers(2, 3), label="fuse count")
    s.fuse(sid, list(range(start, min(n, start + count))))


def do_parallel(data, s):
    sid = draw_stage(data, s)
    s.annotate(sid, 0, "parallel")


def do_vectorize(data, s):
    sid = draw_stage(data, s)
    s.annotate(sid, len(s.stages[sid].iters) - 1, "vectorize")


def do_unroll(data, s):
    sid = draw_stage(data, s)
    s.annotate(sid, draw_iter(data, s, sid), "unroll")


def do_auto_unroll(data, s):
    sid = draw_stage(data, s)
    n = data.draw(st.sampled_from(UNROLL_STEPS), label="auto_unroll_max_step")
    s.pragma(sid, 0, f"auto_unroll_max_step${n}")


def do_inline(data, s):
    s.compute_inline(draw_stage(data, s))


def do_compute_root(data, s):
    s.compute_root(draw_stage(data, s))


def do_compute_at(data, s):
    sid = draw_stage(data, s)
    targets = [c for c in s.consumers(sid) if c in loop_stages(s)] or loop_stages(s)
    tid = draw_stage(data, s, targets)
    s.compute_at(sid, tid, draw_iter(data, s, tid))


def do_cache_write(data, s):
    reductions = [i for i in loop_stages(s) if s.stages[i].op.reduce_axes]
    sid = draw_stage(data, s, reductions or None)
    cache = s.cache_write(sid, "local")
    stage = cache + 1  # the original stage now copies out of the cache
    if data.draw(st.booleans(), label="split before compute_at"):
        idx = draw_iter(data, s, stage)
        s.split(stage, idx, draw_lengths(data, s.stages[stage].iters[idx].extent, 1))
    if data.draw(st.booleans(), label="compute_at cache"):
        s.compute_at(cache, stage, draw_iter(data, s, stage))


def do_cache_read(data, s):
    readers = {i: [c for c in s.infos[i].consumers if c in loop_stages(s)]
               for i, stage in enumerate(s.stages) if stage.is_placeholder}
    readers = {i: r for i, r in readers.items() if r}
    sid = pick(data, sorted(readers), "cached stage")
    reader = pick(data, readers[sid], "reader")
    scope = data.draw(st.sampled_from(["local", "shared"]), label="scope")
    copy = s.cache_read(sid, scope, [reader])
    reader += 1  # shifted by the inserted stage
    if data.draw(st.booleans(), label="compute_at copy"):
        s.compute_at(copy, reader, draw_iter(data, s, reader))


def do_transform_layout(data, s):
    sid = draw_stage(data, s, [i for i in loop_stages(s) if not s.is_output(i)])
    splits = [n for n, step in enumerate(s.steps) if isinstance(step, SplitStep)]
    src = pick(data, splits, "split step")
    dim = data.draw(st.integers(0, len(s.stages[sid].op.shape) - 1), label="dimension")
    level = data.draw(st.integers(0, len(s.steps[src].lengths) - 1), label="level")
    s.transform_layout(sid, dim, src, level)


def do_rfactor(data, s):
    reductions = [i for i in loop_stages(s) if s.stages[i].op.reduce_axes]
    sid = draw_stage(data, s, reductions or None)
    stage = s.stages[sid]
    reduce_ids = [i for i, it in enumerate(stage.iters) if it.kind == "reduce"]
    if len(reduce_ids) > 1 and data.draw(st.booleans(), label="fuse reduce axes"):
        s.fuse(sid, reduce_ids)
    reduce_ids = [i for i, it in enumerate(s.stages[sid].iters) if it.kind == "reduce"]
    if data.draw(st.booleans(), label="split before rfactor"):
        idx = pick(data, reduce_ids, "reduce iterator")
        s.split(sid, idx, draw_lengths(data, s.stages[sid].iters[idx].extent, 1))
    reduce_ids = [i for i, it in enumerate(s.stages[sid].iters) if it.kind == "reduce"]
    idx = pick(data, reduce_ids, "rfactor iterator")
    factor_axis = data.draw(st.integers(0, len(s.stages[sid].op.axes)), label="factor_axis")
    s.rfactor(sid, idx, factor_axis)


ACTIONS = {
    "split": do_split, "reorder": do_reorder, "fuse": do_fuse, "parallel": do_parallel,
    "vectorize": do_vectorize, "unroll": do_unroll, "auto_unroll": do_auto_unroll,
    "compute_inline": do_inline, "compute_root": do_compute_root, "compute_at": do_compute_at,
    "cache_write": do_cache_write, "cache_read": do_cache_read, "rfactor": do_rfactor,
    "transform_layout": do_transform_layout,
}
# weighted: splits create the iterators other steps act on; placements are where bugs hide
ACTION_CHOICES = ["split", "split", "compute_at", "cache_write"] + list(ACTIONS)


def random_program(data, task: ansor.Task) -> ansor.State:
    s = ansor.State(task.dag)
    for _ in range(data.draw(st.integers(0, MAX_STEPS), label="n_steps")):
        kind = data.draw(st.sampled_from(ACTION_CHOICES), label="action")
        trial = s.copy()
        try:
            ACTIONS[kind](data, trial)
        except NotApplicable:
            continue
        except ansor.ScheduleError:
            event(f"rejected: {kind}")
            continue
        try:
            lower(trial)  # some illegal placements are only found by bound inference
        except ansor.ScheduleError:
            event(f"rejected by lowering: {kind}")
            continue
        event(f"accepted: {kind}")
        s = trial
    return s


@pytest.mark.parametrize("op_name", sorted(OPERATORS))
@settings(max_examples=EXAMPLES_PER_OPERATOR, deadline=None, derandomize=DERANDOMIZE, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_schedule_matches_numpy(op_name, data, builder):
    op = OPERATORS[op_name]
    task = op.task()
    s = random_program(data, task)
    event(f"steps in program: {len(s.steps)}")

    run_and_check(op, task, s, builder, seed=len(s.steps))

    text = json.dumps(s.steps_json())
    replayed = ansor.State.replay(task.dag, steps_from_json(json.loads(text)))
    assert replayed.key() == s.key()
    assert replayed.steps_json() == s.steps_json()
    assert generate_source(replayed, task.target)[0] == generate_source(s, task.target)[0]
