"""Transform steps: frozen values that replay onto a State and serialize to compact JSON.

Each step names its stage by index into the stage list at the moment it applies (cache_read,
cache_write and rfactor insert stages and shift later indices, exactly as on replay). The JSON
form is `[tag, fields...]`, after the tags of the reference Ansor log format.

Steps are data: they know the State only as the object whose primitive they call (the State
records them), so this module sits below state.py and imports it for type checking alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, ClassVar

from ansor.schedule.errors import ScheduleError

if TYPE_CHECKING:
    from ansor.schedule.state import State


@dataclass(frozen=True)
class Step(ABC):
    TAG: ClassVar[str] = ""
    stage_id: int

    @abstractmethod
    def apply(self, state: State):
        """Apply this step to the state (through the State primitive that records it)."""

    def to_json(self) -> list:
        out: list = [self.TAG]
        for f in fields(self):
            v = getattr(self, f.name)
            out.append(list(v) if isinstance(v, tuple) else v)
        return out


@dataclass(frozen=True)
class SplitStep(Step):
    TAG: ClassVar[str] = "SP"
    iter_id: int
    extent: int | None
    lengths: tuple[int | None, ...]
    inner_to_outer: bool = True

    def apply(self, state: State):
        return state.split(self.stage_id, self.iter_id, self.lengths, self.inner_to_outer)


@dataclass(frozen=True)
class FollowSplitStep(Step):
    TAG: ClassVar[str] = "FSP"
    iter_id: int
    src_step_id: int
    n_split: int

    def apply(self, state: State):
        return state.follow_split(self.stage_id, self.iter_id, self.src_step_id, self.n_split)


@dataclass(frozen=True)
class FollowFusedSplitStep(Step):
    TAG: ClassVar[str] = "FFSP"
    iter_id: int
    src_step_ids: tuple[int, ...]
    level: int
    factor_or_nparts: bool = True

    def apply(self, state: State):
        return state.follow_fused_split(self.stage_id, self.iter_id, self.src_step_ids, self.level,
                                        self.factor_or_nparts)


@dataclass(frozen=True)
class FuseStep(Step):
    TAG: ClassVar[str] = "FU"
    iter_ids: tuple[int, ...]

    def apply(self, state: State):
        return state.fuse(self.stage_id, self.iter_ids)


@dataclass(frozen=True)
class ReorderStep(Step):
    TAG: ClassVar[str] = "RE"
    order: tuple[int, ...]

    def apply(self, state: State):
        return state.reorder(self.stage_id, self.order)


@dataclass(frozen=True)
class AnnotateStep(Step):
    TAG: ClassVar[str] = "AN"
    iter_id: int
    annotation: str

    def apply(self, state: State):
        return state.annotate(self.stage_id, self.iter_id, self.annotation)


@dataclass(frozen=True)
class PragmaStep(Step):
    TAG: ClassVar[str] = "PR"
    iter_id: int
    pragma: str

    def apply(self, state: State):
        return state.pragma(self.stage_id, self.iter_id, self.pragma)


@dataclass(frozen=True)
class ComputeAtStep(Step):
    TAG: ClassVar[str] = "CA"
    target_stage_id: int
    target_iter_id: int

    def apply(self, state: State):
        return state.compute_at(self.stage_id, self.target_stage_id, self.target_iter_id)


@dataclass(frozen=True)
class ComputeInlineStep(Step):
    TAG: ClassVar[str] = "CI"

    def apply(self, state: State):
        return state.compute_inline(self.stage_id)


@dataclass(frozen=True)
class ComputeRootStep(Step):
    TAG: ClassVar[str] = "CR"

    def apply(self, state: State):
        return state.compute_root(self.stage_id)


@dataclass(frozen=True)
class CacheReadStep(Step):
    TAG: ClassVar[str] = "CHR"
    scope: str
    reader_stage_ids: tuple[int, ...]

    def apply(self, state: State):
        return state.cache_read(self.stage_id, self.scope, self.reader_stage_ids)


@dataclass(frozen=True)
class CacheWriteStep(Step):
    TAG: ClassVar[str] = "CHW"
    scope: str

    def apply(self, state: State):
        return state.cache_write(self.stage_id, self.scope)


@dataclass(frozen=True)
class RfactorStep(Step):
    TAG: ClassVar[str] = "RF"
    iter_id: int
    factor_axis: int

    def apply(self, state: State):
        return state.rfactor(self.stage_id, self.iter_id, self.factor_axis)


@dataclass(frozen=True)
class LayoutStep(Step):
    TAG: ClassVar[str] = "LA"
    dim: int
    src_step_id: int
    level: int

    def apply(self, state: State):
        return state.transform_layout(self.stage_id, self.dim, self.src_step_id, self.level)


@dataclass(frozen=True)
class InterleaveStep(Step):
    TAG: ClassVar[str] = "LI"
    dim: int
    group: int

    def apply(self, state: State):
        return state.interleave_layout(self.stage_id, self.dim, self.group)


STEP_KINDS: dict[str, type[Step]] = {
    cls.TAG: cls for cls in (SplitStep, FollowSplitStep, FollowFusedSplitStep, FuseStep, ReorderStep,
                             AnnotateStep, PragmaStep, ComputeAtStep, ComputeInlineStep,
                             ComputeRootStep, CacheReadStep, CacheWriteStep, RfactorStep, LayoutStep,
                             InterleaveStep)
}


def step_from_json(data: list) -> Step:
    """Inverse of `Step.to_json`; raises ScheduleError on malformed input."""
    if not isinstance(data, (list, tuple)) or not data or data[0] not in STEP_KINDS:
        raise ScheduleError(f"not a schedule step: {data!r}")
    cls = STEP_KINDS[data[0]]
    fs = fields(cls)
    args = list(data[1:])
    if len(args) != len(fs):
        raise ScheduleError(f"step {data[0]} takes {len(fs)} fields, got {len(args)}: {data!r}")
    values = []
    for f, v in zip(fs, args):
        checked = _check_field(str(f.type), v)
        if checked is _BAD:
            raise ScheduleError(f"step {data[0]}: field {f.name!r} should be {f.type}, got {v!r}")
        values.append(checked)
    return cls(*values)


_BAD = object()


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_field(kind: str, v):
    """The value converted to the field's type, or _BAD (records come from files: trust nothing)."""
    if kind == "int":
        return v if _is_int(v) else _BAD
    if kind == "int | None":
        return v if v is None or _is_int(v) else _BAD
    if kind == "str":
        return v if isinstance(v, str) else _BAD
    if kind == "bool":
        return bool(v) if isinstance(v, bool) or v in (0, 1) else _BAD
    if kind.startswith("tuple["):
        if not isinstance(v, (list, tuple)):
            return _BAD
        allow_none = "None" in kind
        ok = all(_is_int(x) or (allow_none and x is None) for x in v)
        return tuple(v) if ok else _BAD
    return v


def steps_from_json(data: list) -> list[Step]:
    return [step_from_json(d) for d in data]
