"""A task's siblings: the job's other tasks of the same structure, whose best programs it tries.

A model repeats a layer at several sizes: ResNet's 3x3 convolutions at four resolutions, a
transformer's linears of several widths. What makes one of them fast (which loops are tiled,
what is computed where, which loop is parallel, the register tile, the unrolling) mostly
carries over to the others; only the tile lengths must fit the new extents. The shared cost
model already learns from every task's timings, but the search of one task starts from random
programs and its own measured ones, not from the program a sibling has found. So before a
task's round, the best program of each sibling that runs at a higher throughput than the task's
own best is replayed on the task's computation with its split lengths refitted
(`fit_program`), and measured first (`SiblingPrograms.offer`): a few programs per round, each
checked like any other.

Two tasks are siblings when their computations have the same stages, in the same order, with
the same names, kinds of operation and numbers of spatial and reduction axes
(`structure_key`); a program that does not replay on the other is simply not offered.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Sequence

from ansor.dag import ComputeDAG
from ansor.schedule.state import State
from ansor.schedule.steps import SplitStep, Step, steps_from_json
from ansor.te.tensor import ComputeOp
from ansor.tuning.scheduler import throughput

__all__ = ["SiblingPrograms", "fit_lengths", "fit_program", "structure_key"]

#: Sibling programs measured first in one round of a task, the fastest siblings' first.
PER_ROUND = 2


def structure_key(dag: ComputeDAG) -> tuple:
    """What two computations must share for one's program to be tried on the other: each
    stage's name, kind of operation and numbers of spatial and reduction axes (not extents)."""
    parts = []
    for name, op in zip(dag.names, dag.ops):
        if isinstance(op, ComputeOp):
            parts.append((name, "compute", len(op.axes), len(op.reduce_axes), op.tag))
        else:
            parts.append((name, type(op).__name__, len(getattr(op, "shape", ()))))
    return tuple(parts)


def _largest_divisor_at_most(n: int, bound: int) -> int:
    for d in range(min(n, max(bound, 1)), 0, -1):
        if n % d == 0:
            return d
    return 1


def fit_lengths(lengths: Sequence[int | None], extent: int) -> tuple[int | None, ...]:
    """A split's inner lengths (outermost first, as `SplitStep.lengths`) fitted to a loop of
    `extent`: kept when their product divides it (the tiling is already exact), else from the
    innermost outwards each becomes the largest divisor of what is left that is no longer than
    it was, so the vector and register tiles keep their size where they can and the tiling is
    exact (a ragged tile is far slower than a smaller exact one)."""
    if any(length is None for length in lengths):
        return tuple(lengths)
    product = 1
    for length in lengths:
        product *= length
    if extent % product == 0:
        return tuple(lengths)
    left, fitted = extent, []
    for length in reversed(lengths):
        d = _largest_divisor_at_most(left, length)
        fitted.append(d)
        left //= d
    return tuple(reversed(fitted))


def fit_program(steps: Sequence[Step], dag: ComputeDAG) -> State | None:
    """The program of `steps` (another task's, of the same structure) on `dag`, each split's
    lengths fitted to the loop it splits here; None when the steps do not apply."""
    state = State(dag)
    try:
        for step in steps:
            if isinstance(step, SplitStep) and step.inner_to_outer:
                extent = state.stages[step.stage_id].iters[step.iter_id].extent
                if extent is not None:
                    step = replace(step, lengths=fit_lengths(step.lengths, extent))
            step.apply(state)
    except (ValueError, TypeError, IndexError, KeyError):  # ScheduleError is a ValueError
        return None
    return state


class SiblingPrograms:
    """Offers each task of a job its faster siblings' best programs, each once.

    `tuners` are the job's task tuners (`TaskTuner`: task, result, best_cost, flop, measured_keys,
    add_candidates); tasks of different targets are never siblings."""

    def __init__(self, tuners: Sequence) -> None:
        self.tuners = list(tuners)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, tuner in enumerate(self.tuners):
            groups[(tuner.task.target.key, structure_key(tuner.task.dag))].append(i)
        self._siblings = {i: [j for j in members if j != i] for members in groups.values() for i in members}
        self._offered: set[tuple[int, str]] = set()  # (task index, key of the program offered)
        self.offered = 0  # programs handed to tasks in all

    def siblings(self, index: int) -> list[int]:
        """Indices of the tasks of the same structure as task `index`."""
        return self._siblings.get(index, [])

    def offer(self, index: int, limit: int = PER_ROUND) -> int:
        """Hand task `index` up to `limit` programs: the best of each sibling faster (in
        FLOP/s) than the task's own best, fastest first, fitted to its shapes, never one it
        has measured or was offered. Returns how many."""
        tuner = self.tuners[index]
        own = throughput(tuner)
        faster = sorted((j for j in self.siblings(index) if throughput(self.tuners[j]) > own),
                        key=lambda j: -throughput(self.tuners[j]))
        states = []
        for j in faster:
            if len(states) >= limit:
                break
            steps = self.tuners[j].result.best_steps
            if not steps:
                continue
            try:
                state = fit_program(steps_from_json(steps), tuner.task.dag)
            except (ValueError, TypeError, IndexError, KeyError):
                continue
            if state is None:
                continue
            key = state.key()
            if key in tuner.measured_keys or (index, key) in self._offered:
                continue
            self._offered.add((index, key))
            states.append(state)
        if states:
            tuner.add_candidates(states)
            self.offered += len(states)
        return len(states)

