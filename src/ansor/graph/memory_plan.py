"""Static memory planning for a compiled model: which buffer holds which value.

A model runs the same steps on the same shapes every call, so its intermediate values can live
in a few buffers allocated once: a value's buffer is free again after its last reader, and the
next value that fits takes it. Buffers are assigned greedily in execution order, best fit first
(the smallest free buffer that is large enough, else a new one). A step's outputs are placed
before its inputs are released, so no kernel reads and writes the same memory; the one
exception is a step marked `in_place` (a key/value cache write, `graph.kv_cache`), whose output
is its aliased input's memory changed, and after which no step may read the old value. Values that are
views of another (a reshape of a contiguous array) share their source's buffer, and that buffer
lives until the last reader of any of them. Graph inputs and outputs get buffers of their own:
inputs are copied in before a call and outputs copied out after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class PlannedStep:
    """What the planner needs of one step: the values it reads and writes; `alias_of` set
    when its single output is a view of its input `alias_of` (a reshape), or, with `in_place`,
    that input's memory written by the step (a cache write)."""

    reads: tuple[str, ...]
    writes: tuple[str, ...]
    alias_of: str | None = None
    in_place: bool = False


class InPlaceError(ValueError):
    """A step would read a value after an in-place step overwrote its memory."""


@dataclass
class MemoryPlan:
    """`storage[value]` is the index of its buffer in `sizes` (bytes)."""

    sizes: list[int] = field(default_factory=list)
    storage: dict[str, int] = field(default_factory=dict)
    naive_bytes: int = 0  # one buffer per value, for comparison

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)


def plan_memory(steps: Sequence[PlannedStep], nbytes: dict[str, int], inputs: Sequence[str],
                outputs: Sequence[str]) -> MemoryPlan:
    """Assign buffers to every value written by `steps` and to the graph's `inputs`; a value
    in `outputs` keeps its buffer to the end. `nbytes` gives each value's size."""
    plan = MemoryPlan()
    root: dict[str, str] = {}
    for step in steps:
        if step.alias_of is not None:
            root[step.writes[0]] = root.get(step.alias_of, step.alias_of)
    _check_in_place(steps, root)
    last_use: dict[str, int] = {}
    pinned = set(inputs) | {root.get(o, o) for o in outputs}
    for index, step in enumerate(steps):
        for name in step.reads:
            base = root.get(name, name)
            last_use[base] = max(last_use.get(base, -1), index)
    free: list[int] = []

    def allocate(name: str, dedicated: bool) -> None:
        size = nbytes[name]
        fits = [] if dedicated else [b for b in free if plan.sizes[b] >= size]
        if fits:
            buffer = min(fits, key=lambda b: plan.sizes[b])
            free.remove(buffer)
        else:
            buffer = len(plan.sizes)
            plan.sizes.append(size)
        plan.storage[name] = buffer

    for name in inputs:
        allocate(name, dedicated=True)
    for index, step in enumerate(steps):
        for name in step.writes:
            if name in root:
                plan.storage[name] = plan.storage[root[name]]
            else:
                allocate(name, dedicated=name in pinned)
        released = {root.get(n, n) for n in step.reads} | {root.get(n, n) for n in step.writes}
        for base in released:
            if base not in pinned and last_use.get(base, -1) <= index and base in plan.storage:
                free.append(plan.storage[base])
    plan.naive_bytes = sum(nbytes[n] for n in plan.storage if n not in root)
    return plan


def _check_in_place(steps: Sequence[PlannedStep], root: dict[str, str]) -> None:
    """Refuse a plan where a step reads a value (or a view of it) whose memory an earlier
    in-place step has overwritten: that read would see the new contents, not the value."""
    overwritten: dict[str, str] = {}  # value -> the in-place output that replaced it
    for index, step in enumerate(steps):
        for name in step.reads:
            if name in overwritten:
                raise InPlaceError(f"%{name} is read after %{overwritten[name]} overwrote its memory in place")
        if step.in_place and step.alias_of is not None:
            base = root.get(step.alias_of, step.alias_of)
            later = {w for s in steps[index:] for w in s.writes}  # the write's output and views of it
            for name in [base, *(v for v, r in root.items() if r == base)]:
                if name not in later:
                    overwritten.setdefault(name, step.writes[0])
