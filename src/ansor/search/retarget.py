"""Programs of one CPU adapted to another's vector width, for tuning that starts from records of
another target (`tune(..., transfer_from=...)`).

What makes a program fast mostly carries over between CPUs of one family: which loops are
tiled, what is computed where, which loop is parallel. What does not is the width of the
vectorized loop: a program tuned for AVX2 vectorizes 8 floats (or a multiple), and on AVX-512
the same loop fills half of each register, so replayed as it is the other machine's best
program starts far from this machine's best. `retarget_vector_width` rewrites the split that
produced each vectorized loop so that it covers as many registers as before, each as wide as the
new target's: the length of the vectorized piece is scaled by the ratio of the vector widths,
and one variant takes the factor from the loop outside the split (a larger tile, the natural
choice going to more and wider registers) while the others take it from another level of the
same split (the same tile, reshaped). Only pieces that fill whole vectors of the first target
are scaled (a vectorized loop of 1 or 2 elements was not chosen for its width), and a variant
whose tiles no longer divide the loop they split where the original's did is not made: the
ragged last tile of a 56-wide loop vectorized by 16 ran a conv2d 20x slower than by 8. Variants
that do not replay are dropped.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ansor.schedule.errors import ScheduleError
from ansor.schedule.state import State
from ansor.schedule.steps import SplitStep

__all__ = ["retarget_vector_width", "vectorized_splits"]


def vectorized_splits(state: State) -> list[tuple[int, int, int]]:
    """(step index, piece level, element bytes) of each split step whose piece became a
    vectorized loop in `state`: level 0 is the outermost piece of an inner-to-outer split (its
    length is derived, not stored), level k > 0 the piece of `lengths[k - 1]`."""
    origin: dict[tuple[str, str], tuple[int, int, int]] = {}
    replayed = State(state.dag)
    for index, step in enumerate(state.steps):
        step.apply(replayed)
        if isinstance(step, SplitStep):
            stage = replayed.stages[step.stage_id]
            pieces = stage.iters[step.iter_id: step.iter_id + len(step.lengths) + 1]
            itemsize = np.dtype(stage.tensor.dtype).itemsize
            for level, piece in enumerate(pieces):
                origin[(stage.name, piece.name)] = (index, level, itemsize)
    found = []
    for stage in state.stages:
        for it in stage.iters:
            if it.annotation == "vectorize" and (stage.name, it.name) in origin:
                found.append(origin[(stage.name, it.name)])
    return sorted(set(found))


def retarget_vector_width(state: State, from_bytes: int, to_bytes: int) -> list[State]:
    """Variants of `state` whose vectorized loops are `to_bytes / from_bytes` times as long (see
    the module), most promising first; empty when the widths are equal or nothing applies."""
    ratio = Fraction(to_bytes, from_bytes)
    if ratio == 1 or from_bytes <= 0 or to_bytes <= 0:
        return []
    splits = [(i, level) for i, level, itemsize in vectorized_splits(state)
              if level > 0 and state.steps[i].inner_to_outer and None not in state.steps[i].lengths
              and (state.steps[i].lengths[level - 1] * itemsize) % from_bytes == 0]
    if not splits:
        return []
    variants: list[State] = []
    seen = {state.key()}
    for compensate in (None, *range(max(len(state.steps[i].lengths) for i, _ in splits))):
        steps = list(state.steps)
        changed = False
        for i, level in splits:
            new = _scaled_lengths(steps[i], level - 1, ratio, compensate)
            if new is not None:
                steps[i] = SplitStep(steps[i].stage_id, steps[i].iter_id, steps[i].extent, new, True)
                changed = True
        if not changed:
            continue
        try:
            variant = State.replay(state.dag, steps)
        except (ScheduleError, ValueError, IndexError):
            continue
        if variant.key() not in seen:
            seen.add(variant.key())
            variants.append(variant)
    return variants


def _scaled_lengths(step: SplitStep, slot: int, ratio: Fraction, compensate: int | None) -> tuple[int, ...] | None:
    """The split's lengths with `lengths[slot]` scaled by `ratio`; the opposite factor goes to
    `lengths[compensate]` (None: to the derived outer piece). None when a length would not be a
    whole number, the vectorized piece would outgrow the loop it splits, or a tile that divided
    that loop would no longer divide it."""
    lengths = list(step.lengths)
    scaled = lengths[slot] * ratio
    if scaled.denominator != 1 or scaled < 1:
        return None
    lengths[slot] = int(scaled)
    if compensate is not None:
        if compensate == slot or compensate >= len(lengths):
            return None
        other = lengths[compensate] / ratio
        if other.denominator != 1 or other < 1:
            return None
        lengths[compensate] = int(other)
    if step.extent is not None:
        if lengths[slot] > step.extent:
            return None
        for level in range(len(lengths)):  # no tile made ragged that was not
            if step.extent % math.prod(step.lengths[level:]) == 0 and step.extent % math.prod(lengths[level:]):
                return None
    return tuple(lengths)
