"""The untuned program of a window reduction: pooling over channels-last data, channels as vectors.

A max or average pool over NHWC data reduces a small window (3x3) for every output pixel and
channel. The plain program keeps the window innermost, one scalar chain per output element;
the search's sketches do not tile such a stage (it reuses nothing), so they keep that order
too, and a pooling layer ran as a scalar loop (ResNet-18's: BENCHMARKS.md).
Channels are the innermost axis of the output and of every operand read: with the window
moved outside them, each window step is one vector load and one vector max (or add) per
vector of channels, contiguous in memory.

The program: the padded input read in place (its stage inlined), the output's leading axes
fused and parallel (when the machine has several cores), the window loops next, the innermost
output axis last and vectorized.
"""

from __future__ import annotations

import math

from ansor.schedule.state import ScheduleError, State
from ansor.search.matvec import mentions
from ansor.te import expr as E
from ansor.te.attention import is_template

#: Most window steps per output element: a larger reduction is not a window (a global pool,
#: a matmul), and keeping its vector of outputs across all its steps is not this program's case.
MAX_WINDOW = 64
COMBINERS = ("max", "min", "sum")


def window_axes(state: State, sid: int) -> E.IterVar | None:
    """The innermost output axis, when stage `sid` is a window reduction this program serves:
    a max/min/sum over at most MAX_WINDOW steps whose operands all read the innermost output
    axis, plainly, as their own last index (contiguous), and whose innermost output axis is
    longer than one."""
    st = state.stages[sid]
    op = st.op
    body = getattr(op, "body", None)
    if st.is_placeholder or not isinstance(body, E.Reduce) or body.combiner not in COMBINERS:
        return None
    if body.where is not None or not op.axes or math.prod(a.extent for a in body.axes) > MAX_WINDOW:
        return None
    inner = op.axes[-1]
    if inner.extent < 2:
        return None
    reads = [n for n in E.walk(body.source) if type(n) is E.TensorRead]
    if not reads:
        return None
    for read in reads:
        if not read.indices or read.indices[-1] is not inner:
            return None
        if any(mentions(index, inner) for index in read.indices[:-1]):
            return None
    return inner


def window_program(state: State, sid: int, num_cores: int) -> State | None:
    """A copy of `state` with root stage `sid` scheduled as the window program when it is one
    (`window_axes`); else None."""
    if any(is_template(st.op) for st in state.stages):  # a template's lowering writes its whole program
        return None
    inner = window_axes(state, sid)
    if inner is None:
        return None
    s = state.copy()
    for tensor in s.stages[sid].op.input_tensors():  # the padded input: read in place, not copied
        producer = next((i for i, st in enumerate(s.stages) if st.op is tensor.op), None)
        if producer is not None and not s.stages[producer].is_placeholder and s.stages[producer].attach == "root":
            try:
                s.compute_inline(producer)
            except ScheduleError:
                pass
    try:
        names = [it.name for it in s.stages[sid].iters]
        n_spatial = len(s.stages[sid].op.axes)
        spatial, window = names[:n_spatial], names[n_spatial:]
        s.reorder(sid, spatial[:-1] + window + spatial[-1:])
        s.vectorize(sid, spatial[-1])
        outer = spatial[:-1]
        if num_cores > 1 and outer:
            fused = s.fuse(sid, outer) if len(outer) > 1 else s.stages[sid].iters[0]
            s.parallel(sid, fused.name)
    except ScheduleError:
        return None
    return s

