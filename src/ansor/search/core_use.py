"""Whether a CPU program leaves cores idle that its loops could keep busy.

A root stage's parallel loop is the fuse of its outer spatial loops, up to the first loop that
another stage is computed at. A producer computed at an outer loop (the permute and reshape in
front of BERT's output projection, copied per tile of rows) therefore caps the parallel loop
there, and when the loops above it have one iteration (a tile-size mutation moved their factors
inward, or annotation drew them so) the "parallel" loop runs once: the whole matmul on one core.
Timed while other work keeps the second core busy, such a program measures as fast as a
parallel one and becomes the record: the BERT layer's output projection was recorded that way,
at half the speed of the layer's other linears on a quiet machine.

`idle_cores` names such programs so that the search never offers them for measurement: a task
with real work (`MIN_SHARED_FLOP`) whose stage holding a reduction has at least as many outer
iterations as the target has cores, yet runs fewer of them in parallel. Small tasks, where a
serial program may beat the cost of waking a thread pool, are left alone, and so are template
stages (attention), whose program shares its work out itself.
"""

from __future__ import annotations

import math

from ansor.schedule.state import State
from ansor.search.template import template_stage_of

#: Tasks below this many floating-point operations (16.8 M: tens of microseconds on one core)
#: may run serially: sharing them is not always worth the fork and join.
MIN_SHARED_FLOP = float(1 << 24)


def idle_cores(state: State, cores: int) -> bool:
    """True when a root stage that holds a reduction (its own, or one computed inside its
    loops) runs fewer parallel iterations than `cores` although its outer loops have at least
    that many, in a task of at least `MIN_SHARED_FLOP`."""
    if cores < 2 or state.dag.flop < MIN_SHARED_FLOP or template_stage_of(state.dag) is not None:
        return False
    for sid, st in enumerate(state.stages):
        if st.is_placeholder or st.attach != "root" or not _holds_reduction(state, sid):
            continue
        if parallel_iterations(state, sid) < cores <= outer_iterations(state, sid):
            return True
    return False


def parallel_iterations(state: State, sid: int) -> int:
    """Iterations of the stage's parallel loops (1 when it has none)."""
    return math.prod(it.extent or 1 for it in state.stages[sid].iters if it.annotation == "parallel")


def outer_iterations(state: State, sid: int) -> int:
    """Iterations of the stage's leading spatial loops, the innermost loop (the vector loop)
    left out: what a parallel loop could share out if nothing were computed inside them."""
    iters = state.stages[sid].iters
    total = 1
    for it in iters[:-1] if len(iters) > 1 else iters:
        if it.kind != "spatial":
            break
        total *= it.extent or 1
    return total


def _holds_reduction(state: State, sid: int) -> bool:
    st = state.stages[sid]
    if st.op.reduce_axes:
        return True
    return any(_holds_reduction(state, inner) for inner in state.attached_to(st.name))
