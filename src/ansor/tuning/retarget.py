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
same split (the same tile, reshaped). A target with more vector registers (AVX-512's 32 zmm
against AVX2's 16 ymm) gets first the variants that also lengthen the innermost piece of another
spatial split of the same stage by the ratio of the register counts: the register tile fills the
larger file as the original filled the smaller one. Only pieces that fill whole vectors of the
first target are scaled (a vectorized loop of 1 or 2 elements was not chosen for its width), and
a variant whose tiles no longer divide the loop they split where the original's did is not made:
a ragged last vector tile is far slower than the original. Variants that do not replay are
dropped. What the variants gain is measured in BENCHMARKS.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from ansor.schedule.state import State
from ansor.schedule.steps import SplitStep

__all__ = ["retarget_vector_width", "vectorized_splits"]


@dataclass(frozen=True)
class _SplitInfo:
    stage: str          # the stage's name when the split was made
    kind: str           # "spatial" or "reduce": the split iterator's kind
    pieces: tuple[str, ...]
    itemsize: int       # bytes of the stage's elements


def _splits(state: State) -> dict[int, _SplitInfo]:
    """What each split step of `state` split, by step index (the steps replayed once)."""
    out: dict[int, _SplitInfo] = {}
    replayed = State(state.dag)
    for index, step in enumerate(state.steps):
        if not isinstance(step, SplitStep):
            step.apply(replayed)
            continue
        kind = replayed.stages[step.stage_id].iters[step.iter_id].kind
        step.apply(replayed)
        stage = replayed.stages[step.stage_id]
        pieces = stage.iters[step.iter_id: step.iter_id + len(step.lengths) + 1]
        out[index] = _SplitInfo(stage.name, kind, tuple(p.name for p in pieces),
                                np.dtype(stage.tensor.dtype).itemsize)
    return out


def vectorized_splits(state: State) -> list[tuple[int, int, int]]:
    """(step index, piece level, element bytes) of each split step whose piece became a
    vectorized loop in `state`: level 0 is the outermost piece of an inner-to-outer split (its
    length is derived, not stored), level k > 0 the piece of `lengths[k - 1]`."""
    return _vectorized(state, _splits(state))


def _vectorized(state: State, splits: dict[int, _SplitInfo]) -> list[tuple[int, int, int]]:
    origin = {(info.stage, piece): (index, level, info.itemsize)
              for index, info in splits.items() for level, piece in enumerate(info.pieces)}
    found = {origin[(stage.name, it.name)] for stage in state.stages for it in stage.iters
             if it.annotation == "vectorize" and (stage.name, it.name) in origin}
    return sorted(found)


def retarget_vector_width(state: State, from_bytes: int, to_bytes: int, register_ratio: int = 1) -> list[State]:
    """Variants of `state` whose vectorized loops are `to_bytes / from_bytes` times as long (see
    the module), most promising first; empty when the widths are equal or nothing applies.

    With `register_ratio` > 1 (the new target has that many times the vector registers: 32 zmm
    against 16 ymm), the first variants also make the innermost piece of one other spatial split
    of the same stage that many times longer, one variant per such split: the register tile then
    fills the larger register file as the original filled the smaller one."""
    ratio = Fraction(to_bytes, from_bytes)
    if ratio == 1 or from_bytes <= 0 or to_bytes <= 0:
        return []
    info = _splits(state)
    vectorized = [(i, level) for i, level, itemsize in _vectorized(state, info)
                  if level > 0 and state.steps[i].inner_to_outer and None not in state.steps[i].lengths
                  and (state.steps[i].lengths[level - 1] * itemsize) % from_bytes == 0]
    if not vectorized:
        return []
    candidates: list[list] = []
    for compensate in (None, *range(max(len(state.steps[i].lengths) for i, _ in vectorized))):
        steps = list(state.steps)
        changed = False
        for i, level in vectorized:
            new = _scaled_lengths(steps[i], level - 1, ratio, compensate)
            if new is not None:
                steps[i] = replace(steps[i], lengths=new)
                changed = True
        if changed:
            candidates.append(steps)
    if candidates and register_ratio > 1:
        candidates = _grown_register_tiles(state, info, vectorized, candidates[0], register_ratio) + candidates
    variants: list[State] = []
    seen = {state.key()}
    for steps in candidates:
        try:
            variant = State.replay(state.dag, steps)
        except (ValueError, IndexError):  # ScheduleError is a ValueError
            continue
        if variant.key() not in seen:
            seen.add(variant.key())
            variants.append(variant)
    return variants


def _grown_register_tiles(state: State, info: dict[int, _SplitInfo], vectorized: list[tuple[int, int]],
                          widened: list, register_ratio: int) -> list[list]:
    """Steps of `widened` with the innermost piece of one other spatial split of a vectorized
    stage `register_ratio` times longer, one list per split: nearest to the vectorized loop in
    the loop order first (a conv2d vectorized along x gained most from more rows y, less from
    more channels)."""
    stages = {info[i].stage for i, _ in vectorized}
    order = {(st.name, it.name): pos for st in state.stages if st.name in stages for pos, it in enumerate(st.iters)}
    targets = [order[(info[i].stage, info[i].pieces[level])] for i, level in vectorized
               if (info[i].stage, info[i].pieces[level]) in order]
    grown = []
    for j, split in info.items():
        step = widened[j]
        if (split.stage not in stages or split.kind != "spatial" or j in dict(vectorized)
                or not step.inner_to_outer or not step.lengths or None in step.lengths):
            continue
        new = _scaled_lengths(step, len(step.lengths) - 1, Fraction(register_ratio), None)
        if new is None:
            continue
        steps = list(widened)
        steps[j] = replace(step, lengths=new)
        position = order.get((split.stage, split.pieces[-1]))
        distance = min((abs(position - t) for t in targets), default=0) if position is not None else len(order)
        grown.append((distance, j, steps))
    return [steps for _, _, steps in sorted(grown, key=lambda g: g[:2])]


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
