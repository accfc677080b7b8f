"""Programs of one workload replayed on another of the same structure and other shapes.

A cost model that has never seen a workload ranks its random programs weakly (a depthwise
convolution's true best came 215th of 300 in the pretrained model's order: BENCHMARKS.md), but
the *structure* of a good program carries over between shapes of one operator: which stages are
inlined, cached or computed where, which loops are tiled, fused, parallel, vectorized and
unrolled. Replaying the steps of a tuned program of a conv2d 32x28x28 on a conv2d 64x56x56 keeps
all of that; only the tile sizes need to fit the new extents (transfer-tuning, as Gibson et al.
call it for TVM's auto-scheduler). `adapt_to_shapes` replays steps with each split's lengths
refitted; `borrowed_programs` gathers such programs for a task from programs of workloads whose
stages are named alike (the package's shipped programs, or a database's other workloads).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from ansor.dag import ComputeDAG
from ansor.schedule.errors import ScheduleError
from ansor.schedule.state import State
from ansor.schedule.steps import SplitStep, Step

__all__ = ["adapt_to_shapes", "fitted_lengths", "borrowed_programs"]


def fitted_lengths(lengths: Sequence[int | None], extent: int) -> tuple[int, ...]:
    """Inner split lengths (outer to inner) refitted to `extent`: from the innermost out, each
    length becomes the largest divisor of what is left of the extent that is at most the
    original, so every piece divides the loop (a ragged tile is far slower) and the innermost
    pieces, the vector and register tile, change least."""
    left, out = extent, []
    for length in reversed(lengths):
        wanted = min(length or 1, left)
        fitted = next(d for d in range(wanted, 0, -1) if left % d == 0)
        out.append(fitted)
        left //= fitted
    return tuple(reversed(out))


def adapt_to_shapes(steps: Sequence[Step], dag: ComputeDAG) -> State | None:
    """The program `steps` make on `dag`, each split's lengths refitted to the extent it splits
    there (`fitted_lengths`); None if the steps do not apply (another structure)."""
    state = State(dag)
    try:
        for step in steps:
            if isinstance(step, SplitStep) and step.inner_to_outer and all(n is not None for n in step.lengths):
                extent = state.stages[step.stage_id].iters[step.iter_id].extent
                if extent is not None:
                    step = replace(step, extent=extent, lengths=fitted_lengths(step.lengths, extent))
            step.apply(state)
    except (ScheduleError, ValueError, TypeError, IndexError, KeyError):
        return None
    return state


def borrowed_programs(dag: ComputeDAG, programs: Iterable[tuple[Sequence[str], Sequence[Step]]],
                      limit: int | None = None) -> list[State]:
    """Programs of other workloads adapted to `dag` (`adapt_to_shapes`), for those whose stage
    names equal `dag`'s: `programs` gives (stage names, steps) pairs, best first within each
    workload. Distinct programs only, in the order given, at most `limit`."""
    names = list(dag.names)
    out: list[State] = []
    seen: set[str] = set()
    for stages, steps in programs:
        if list(stages) != names:
            continue
        state = adapt_to_shapes(steps, dag)
        if state is None or state.key() in seen:
            continue
        seen.add(state.key())
        out.append(state)
        if limit is not None and len(out) >= limit:
            break
    return out
