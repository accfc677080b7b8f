"""State: the stages of a program, each with its loop iterators, built by replaying steps.

A State starts as the ComputeDAG's naive loop nests; every transformation (split, fuse, reorder,
annotate, compute_at, cache_write, rfactor, ...) is a primitive here that validates, mutates the
stages and records a `Step`. A program is therefore fully defined by its step list, and two
States with equal `key()` print the same loop nest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence, Union

from ansor.dag import ComputeDAG, StageInfo, analyze_ops
from ansor.schedule.errors import ScheduleError
from ansor.schedule.printer import state_to_str
from ansor.schedule.relations import leaf_expressions
from ansor.schedule.steps import (
    AnnotateStep,
    CacheReadStep,
    CacheWriteStep,
    ComputeAtStep,
    ComputeInlineStep,
    ComputeRootStep,
    FollowFusedSplitStep,
    FollowSplitStep,
    FuseStep,
    InterleaveStep,
    LayoutStep,
    PragmaStep,
    ReorderStep,
    RfactorStep,
    SplitStep,
    Step,
)
from ansor.te import expr as E
from ansor.te.tensor import ComputeOp, PlaceholderOp, Tensor

ANNOTATIONS = ("none", "unroll", "vectorize", "parallel", "vthread", "blockIdx.x", "threadIdx.x",
               "blockIdx.y", "threadIdx.y", "blockIdx.z", "threadIdx.z")
GPU_BINDINGS = ANNOTATIONS[4:]
SCOPES = ("global", "local", "shared")


@dataclass(frozen=True)
class Iterator:
    name: str
    extent: int | None  # None while a split length is still undecided (in a sketch)
    kind: str           # "spatial" | "reduce"
    annotation: str = "none"


@dataclass(frozen=True)
class Split:
    """parent = mixed-radix combination of children; `factors` are the fixed child extents."""

    parent: str
    children: tuple[str, ...]
    factors: tuple[int | None, ...]
    inner_to_outer: bool = True

    def child_extents(self, parent_extent: int | None) -> list[int | None]:
        """Loop extents of the pieces. When the parent is smaller than the pieces' span (a stage
        computed inside its consumer covers only a region), inner pieces are clipped so outer
        ones shrink to 1 instead of looping over guarded-out iterations."""
        if parent_extent is None or None in self.factors:
            return [None] * (len(self.factors) + 1)
        if not self.inner_to_outer:
            return [*self.factors, -(-parent_extent // math.prod(self.factors))]
        extents = []
        span = 1
        for f in reversed(self.factors):
            extents.append(min(f, -(-parent_extent // span)))
            span *= f
        extents.append(-(-parent_extent // span))
        return list(reversed(extents))

    def strides(self) -> list[int]:
        """Multiplier of each piece in the parent's value (mixed radix of the declared factors)."""
        if not self.inner_to_outer:
            raise ValueError("strides of an nparts split depend on the parent extent")
        out, acc = [], 1
        for f in reversed(self.factors):
            out.append(acc)
            acc *= f
        out.append(acc)
        return list(reversed(out))


@dataclass(frozen=True)
class Fuse:
    children: tuple[str, ...]
    fused: str


StageRef = Union[int, str, Tensor]
IterRef = Union[int, str, Iterator]


class Stage:
    """One operation's loop nest. `tensor` is its identity (the buffer consumers read); `op` its
    current definition (cache and rfactor steps rewrite it)."""

    __slots__ = ("tensor", "op", "name", "iters", "root_iters", "relations", "attach",
                 "auto_unroll_max_step", "scope", "origin", "layout", "interleave", "gemm_template")

    def __init__(self, tensor: Tensor, op, name: str, scope: str = "global", origin: str = ""):
        self.tensor = tensor
        self.op = op
        self.name = name
        self.scope = scope
        self.origin = origin
        self.relations: list[Split | Fuse] = []
        self.attach: tuple[str, str] | str = "root"  # "root" | "inline" | (stage name, iter name)
        self.auto_unroll_max_step = 0
        self.gemm_template = ""  # the knobs of a GPU GEMM template program (lower/gemm_template.py)
        self.layout: tuple[int, int | None] | None = None  # (dimension, tile factor) of the buffer
        self.interleave: tuple[int, int] | None = None  # (dimension, group) stored innermost of all
        self.root_iters = _root_iters(op)
        self.iters = list(self.root_iters)

    def copy(self) -> "Stage":
        new = Stage.__new__(Stage)
        for slot in Stage.__slots__:
            setattr(new, slot, getattr(self, slot))
        new.iters = list(self.iters)
        new.relations = list(self.relations)
        return new

    @property
    def is_placeholder(self) -> bool:
        return isinstance(self.op, PlaceholderOp)

    @property
    def is_fresh(self) -> bool:
        return not self.relations and self.iters == self.root_iters

    def iter_index(self, ref: IterRef) -> int:
        if isinstance(ref, Iterator):
            ref = ref.name
        if isinstance(ref, str):
            for i, it in enumerate(self.iters):
                if it.name == ref:
                    return i
            raise ScheduleError(f"stage {self.name!r} has no iterator {ref!r}")
        if not 0 <= ref < len(self.iters):
            raise ScheduleError(
                f"stage {self.name!r} has {len(self.iters)} iterators; index {ref} is out of range")
        return int(ref)


def _tiles_spatially(st: Stage) -> bool:
    """Whether a stage's spatial loops are tiled on more than one level (a root spatial
    iterator split into three or more pieces)."""
    spatial = {it.name for it in st.root_iters if it.kind == "spatial"}
    return any(isinstance(r, Split) and r.parent in spatial and len(r.factors) >= 2 for r in st.relations)


def _root_iters(op) -> list[Iterator]:
    if isinstance(op, PlaceholderOp):
        return []
    its = [Iterator(a.name, a.extent, "spatial") for a in op.axes]
    return its + [Iterator(a.name, a.extent, "reduce") for a in op.reduce_axes]


_INFOS_CACHE: dict = {}  # (id(dag), steps up to the last DAG rewrite) -> (dag, stage analysis)
_INFOS_CACHE_SIZE = 4096


class State:
    """A program under construction: stages plus the steps that produced them."""

    def __init__(self, dag: ComputeDAG):
        self.dag = dag
        self.stages = [Stage(t, t.op, name) for t, name in zip(dag.tensors, dag.names)]
        self.steps: list[Step] = []
        self._infos: list[StageInfo] | None = None
        self._rewrite_end = 0  # steps[:_rewrite_end] made the current stage list (cache stages, rfactor)
        self._key: str | None = None
        self._bodies: dict[int, E.Expr] = {}  # stage id -> effective body, until the next step
        # indices of the split steps that block a reduction around a spatial tiling (see `split`)
        self.reduction_block_steps: frozenset[int] = frozenset()

    def copy(self) -> "State":
        new = State.__new__(State)
        new.dag = self.dag
        new.stages = [s.copy() for s in self.stages]
        new.steps = list(self.steps)
        new._infos = self._infos
        new._rewrite_end = self._rewrite_end
        new._key = self._key
        new._bodies = self._bodies
        new.reduction_block_steps = self.reduction_block_steps
        return new

    # lookup --------------------------------------------------------------------------------
    def stage_id(self, ref: StageRef) -> int:
        if isinstance(ref, Tensor):
            for i, s in enumerate(self.stages):
                if s.tensor is ref:
                    return i
            raise ScheduleError(f"tensor {ref.name!r} is not a stage of this program")
        if isinstance(ref, str):
            for i, s in enumerate(self.stages):
                if s.name == ref:
                    return i
            raise ScheduleError(f"no stage named {ref!r}")
        if not 0 <= ref < len(self.stages):
            raise ScheduleError(f"stage index {ref} is out of range (the program has {len(self.stages)})")
        return int(ref)

    def stage(self, ref: StageRef) -> Stage:
        return self.stages[self.stage_id(ref)]

    @property
    def concrete(self) -> bool:
        return all(it.extent is not None for s in self.stages for it in s.iters) and \
            all(s.layout is None or s.layout[1] is not None for s in self.stages)

    @property
    def infos(self) -> list[StageInfo]:
        """Stage analysis of the current (possibly rewritten) DAG. It depends only on the DAG and
        the steps that rewrote it, so programs of one structure share it (search replays
        thousands of them)."""
        if self._infos is None:
            key = (id(self.dag), tuple(self.steps[:self._rewrite_end]))
            hit = _INFOS_CACHE.get(key)
            if hit is not None and hit[0] is self.dag:
                self._infos = hit[1]
                return self._infos
            outputs = [i for i, s in enumerate(self.stages) if any(s.tensor is o for o in self.dag.outputs)]
            self._infos = analyze_ops([s.tensor for s in self.stages], [s.op for s in self.stages], outputs)
            if len(_INFOS_CACHE) >= _INFOS_CACHE_SIZE:
                _INFOS_CACHE.clear()
            _INFOS_CACHE[key] = (self.dag, self._infos)
        return self._infos

    def is_output(self, stage_id: int) -> bool:
        t = self.stages[stage_id].tensor
        return any(t is o for o in self.dag.outputs)

    def consumers(self, stage_id: int) -> list[int]:
        """Stages that read this one, looking through inlined stages."""
        out: list[int] = []
        for c in self.infos[stage_id].consumers:
            if self.stages[c].attach == "inline":
                out.extend(x for x in self.consumers(c) if x not in out)
            elif c not in out:
                out.append(c)
        return out

    def effective_body(self, stage_id: int) -> E.Expr:
        """The stage's body with inlined producers substituted in (what it really computes;
        kept until the next step, since lowering asks for it several times)."""
        body = self._bodies.get(stage_id)
        if body is None:
            body = self._bodies[stage_id] = self._expanded_body(stage_id)
        return body

    def _expanded_body(self, stage_id: int) -> E.Expr:
        body = self.stages[stage_id].op.body
        if not any(self.stages[p].attach == "inline" for p in self.infos[stage_id].producers):
            return body  # nothing inlined into it: the body as declared
        by_tensor = {id(s.tensor): s for s in self.stages}

        def expand(node: E.Expr):
            if isinstance(node, E.TensorRead):
                p = by_tensor.get(id(node.tensor))
                if p is not None and p.attach == "inline":
                    inner = self.effective_body(self.stages.index(p))
                    return E.substitute(inner, dict(zip(p.op.axes, node.indices)))
            return None

        return E.transform(body, expand)

    def attached_to(self, stage_name: str, iter_name: str | None = None) -> list[int]:
        return [i for i, s in enumerate(self.stages)
                if isinstance(s.attach, tuple) and s.attach[0] == stage_name
                and (iter_name is None or s.attach[1] == iter_name)]

    def _record(self, step: Step) -> None:
        self.steps.append(step)
        self._key = None
        self._bodies = {}

    def _compute_stage(self, ref: StageRef, action: str) -> tuple[int, Stage]:
        sid = self.stage_id(ref)
        st = self.stages[sid]
        if st.is_placeholder:
            raise ScheduleError(f"{action}: stage {st.name!r} is an input placeholder; it has no loops")
        if st.attach == "inline":
            raise ScheduleError(f"{action}: stage {st.name!r} is inlined; it has no loops of its own")
        return sid, st

    def _move_attachments(self, st: Stage, old: Sequence[str], new: str) -> None:
        for i in range(len(self.stages)):
            s = self.stages[i]
            if isinstance(s.attach, tuple) and s.attach[0] == st.name and s.attach[1] in old:
                s = s.copy()
                s.attach = (st.name, new)
                self.stages[i] = s

    # primitives ----------------------------------------------------------------------------
    def split(self, stage: StageRef, iterator: IterRef, lengths: Sequence[int | None],
              inner_to_outer: bool = True) -> list[Iterator]:
        """Split an iterator into len(lengths)+1 pieces; `lengths` are the inner pieces
        (outer to inner) when inner_to_outer, else the outer pieces. Non-divisible is allowed."""
        lengths = tuple(None if n is None else int(n) for n in lengths)
        sid, idx, extent, pieces = self._split(stage, iterator, lengths, inner_to_outer)
        if pieces[0].kind == "reduce" and _tiles_spatially(self.stages[sid]):
            # a reduction split of a multi-level tiled stage: its inner piece is the block of the
            # reduction the inner spatial tiles sweep between two visits of their outputs (never
            # the innermost loop), so the search bounds its length apart from innermost tiles
            self.reduction_block_steps = self.reduction_block_steps | {len(self.steps)}
        self._record(SplitStep(sid, idx, extent, lengths, inner_to_outer))
        return pieces

    def follow_split(self, stage: StageRef, iterator: IterRef, src_step_id: int, n_split: int) -> list[Iterator]:
        """Split like an earlier split step: its first n_split-1 lengths, then the product of the
        rest (so a consumer is tiled like its producer)."""
        src = self._step(src_step_id, SplitStep)
        if not 1 <= n_split <= len(src.lengths):
            raise ScheduleError(f"follow_split: n_split {n_split} out of range for step {src_step_id}")
        lengths = list(src.lengths[:n_split - 1])
        tail = src.lengths[n_split - 1:]
        lengths.append(None if any(t is None for t in tail) else math.prod(tail))
        sid, idx, _, pieces = self._split(stage, iterator, lengths, True)
        self._record(FollowSplitStep(sid, idx, src_step_id, n_split))
        return pieces

    def follow_fused_split(self, stage: StageRef, iterator: IterRef, src_step_ids: Sequence[int],
                           level: int, factor_or_nparts: bool = True) -> list[Iterator]:
        """Split by the product of lengths[level] of several earlier split steps (GPU cooperative
        fetching uses the consumer's thread count)."""
        length: int | None = 1
        for sid_ in src_step_ids:
            src = self._step(sid_, SplitStep)
            if not 0 <= level < len(src.lengths):
                raise ScheduleError(f"follow_fused_split: level {level} out of range for step {sid_}")
            n = src.lengths[level]
            length = None if length is None or n is None else length * n
        sid, idx, _, pieces = self._split(stage, iterator, [length], factor_or_nparts)
        self._record(FollowFusedSplitStep(sid, idx, tuple(src_step_ids), level, factor_or_nparts))
        return pieces

    def _step(self, step_id: int, kind: type):
        if not 0 <= step_id < len(self.steps) or not isinstance(self.steps[step_id], kind):
            raise ScheduleError(f"step {step_id} is not a {kind.__name__}")
        return self.steps[step_id]

    def _split(self, stage, iterator, lengths, inner_to_outer):
        sid, st = self._compute_stage(stage, "split")
        idx = st.iter_index(iterator)
        it = st.iters[idx]
        lengths = tuple(None if n is None else int(n) for n in lengths)
        if not lengths:
            raise ScheduleError(f"split of {st.name}.{it.name}: give at least one length")
        for n in lengths:
            if n is not None and n < 1:
                raise ScheduleError(f"split of {st.name}.{it.name}: lengths must be >= 1, got {list(lengths)}")
        if it.annotation != "none":
            raise ScheduleError(f"split of {st.name}.{it.name}: the iterator is already annotated "
                                f"{it.annotation}")
        names = tuple(f"{it.name}.{k}" for k in range(len(lengths) + 1))
        rel = Split(it.name, names, lengths, inner_to_outer)
        pieces = [Iterator(n, e, it.kind) for n, e in zip(names, rel.child_extents(it.extent))]
        st.iters[idx:idx + 1] = pieces
        st.relations.append(rel)
        self._move_attachments(st, [it.name], names[-1])
        return sid, idx, it.extent, pieces

    def fuse(self, stage: StageRef, iterators: Sequence[IterRef]) -> Iterator:
        """Fuse consecutive iterators of one kind into one."""
        sid, st = self._compute_stage(stage, "fuse")
        ids = [st.iter_index(r) for r in iterators]
        if not ids:
            raise ScheduleError(f"fuse on stage {st.name!r}: give at least one iterator")
        if ids != list(range(ids[0], ids[0] + len(ids))):
            names = ", ".join(st.iters[i].name for i in ids)
            raise ScheduleError(f"fuse on stage {st.name!r}: iterators {names} are not consecutive loops")
        its = [st.iters[i] for i in ids]
        kinds = {it.kind for it in its}
        if len(kinds) > 1:
            raise ScheduleError(f"fuse on stage {st.name!r}: cannot fuse spatial and reduce iterators "
                                f"({', '.join(it.name for it in its)})")
        for it in its:
            if it.annotation != "none":
                raise ScheduleError(f"fuse on stage {st.name!r}: iterator {it.name!r} is annotated {it.annotation}")
        for it in its[:-1]:
            if self.attached_to(st.name, it.name):
                raise ScheduleError(f"fuse on stage {st.name!r}: stages are attached at {it.name!r}; "
                                    f"only the last fused iterator may carry attached stages")
        if len(its) == 1:
            self._record(FuseStep(sid, tuple(ids)))
            return its[0]
        name = "@".join(it.name for it in its)
        extent = None if any(it.extent is None for it in its) else math.prod(it.extent for it in its)
        fused = Iterator(name, extent, its[0].kind)
        st.iters[ids[0]:ids[-1] + 1] = [fused]
        st.relations.append(Fuse(tuple(it.name for it in its), name))
        self._move_attachments(st, [its[-1].name], name)
        self._record(FuseStep(sid, tuple(ids)))
        return fused

    def reorder(self, stage: StageRef, order: Sequence[IterRef]) -> None:
        """New loop order, outer to inner, naming every iterator once."""
        sid, st = self._compute_stage(stage, "reorder")
        ids = [st.iter_index(r) for r in order]
        if sorted(ids) != list(range(len(st.iters))):
            raise ScheduleError(f"reorder on stage {st.name!r}: {ids} is not a permutation of "
                                f"its {len(st.iters)} iterators")
        st.iters = [st.iters[i] for i in ids]
        self._record(ReorderStep(sid, tuple(ids)))

    def annotate(self, stage: StageRef, iterator: IterRef, annotation: str) -> None:
        """Mark a loop parallel, vectorized, unrolled or bound to a GPU thread axis."""
        sid, st = self._compute_stage(stage, "annotate")
        idx = st.iter_index(iterator)
        it = st.iters[idx]
        if annotation not in ANNOTATIONS or annotation == "none":
            raise ScheduleError(f"annotate {st.name}.{it.name}: unknown annotation {annotation!r}; "
                                f"use one of {ANNOTATIONS[1:]}")
        if it.annotation != "none":
            raise ScheduleError(f"annotate {st.name}.{it.name}: already annotated {it.annotation}")
        # a reduction bound to threadIdx is a cross-thread reduction (the GPU lowering combines
        # the threads' partial results); any other parallel kind would race
        if it.kind == "reduce" and annotation in ("parallel", "vectorize") + GPU_BINDINGS \
                and not annotation.startswith("threadIdx"):
            verb = {"parallel": "run in parallel", "vectorize": "vectorized"}.get(annotation, f"bound to {annotation}")
            raise ScheduleError(f"annotate {st.name}.{it.name}: a reduce iterator cannot be "
                                f"{verb} (the reduction would race)")
        st.iters[idx] = replace(it, annotation=annotation)
        self._record(AnnotateStep(sid, idx, annotation))

    def parallel(self, stage: StageRef, iterator: IterRef) -> None:
        self.annotate(stage, iterator, "parallel")

    def vectorize(self, stage: StageRef, iterator: IterRef) -> None:
        self.annotate(stage, iterator, "vectorize")

    def unroll(self, stage: StageRef, iterator: IterRef) -> None:
        self.annotate(stage, iterator, "unroll")

    def pragma(self, stage: StageRef, iterator: IterRef, pragma: str) -> None:
        """`auto_unroll_max_step$N`: unroll every loop nest under this stage whose total
        iteration count is at most N; `gemm_template$KNOBS`: the stage is a GPU GEMM program
        written whole from its splits and these knobs (`lower.gemm_template`)."""
        sid, st = self._compute_stage(stage, "pragma")
        idx = st.iter_index(iterator)
        if pragma.startswith("gemm_template$"):
            st.gemm_template = pragma[len("gemm_template$"):]
            self._record(PragmaStep(sid, idx, pragma))
            return
        prefix = "auto_unroll_max_step$"
        if not pragma.startswith(prefix) or not pragma[len(prefix):].isdigit():
            raise ScheduleError(f"pragma on {st.name}.{st.iters[idx].name}: unknown pragma {pragma!r} "
                                f"(supported: 'auto_unroll_max_step$N')")
        st.auto_unroll_max_step = int(pragma[len(prefix):])
        self._record(PragmaStep(sid, idx, pragma))

    def compute_at(self, stage: StageRef, target: StageRef, iterator: IterRef) -> None:
        """Compute `stage` inside the loop `iterator` of its consumer `target`, only the region
        that one iteration needs."""
        sid, st = self._compute_stage(stage, "compute_at")
        tid, tgt = self._compute_stage(target, "compute_at")
        idx = tgt.iter_index(iterator)
        if sid == tid:
            raise ScheduleError(f"compute_at: stage {st.name!r} cannot be computed at itself")
        if self.is_output(sid):
            raise ScheduleError(f"compute_at: stage {st.name!r} is an output of the program")
        consumers = self.consumers(sid)
        if tid not in consumers and not self._inside(tid, consumers):
            raise ScheduleError(f"compute_at: stage {tgt.name!r} does not read stage {st.name!r}")
        if self._attached_under(tid, st.name):
            raise ScheduleError(f"compute_at: stage {tgt.name!r} is itself computed inside {st.name!r}")
        st.attach = (tgt.name, tgt.iters[idx].name)
        self._record(ComputeAtStep(sid, tid, idx))

    def _attached_under(self, sid: int, name: str) -> bool:
        s = self.stages[sid]
        seen = 0
        while isinstance(s.attach, tuple) and seen < len(self.stages):
            if s.attach[0] == name:
                return True
            s = self.stage(s.attach[0])
            seen += 1
        return False

    def _inside(self, sid: int, others: Sequence[int]) -> bool:
        return any(self._attached_under(o, self.stages[sid].name) for o in others)

    def compute_inline(self, stage: StageRef) -> None:
        """Substitute an elementwise stage's expression into its consumers."""
        sid, st = self._compute_stage(stage, "compute_inline")
        if st.op.reduce_axes:
            raise ScheduleError(f"compute_inline: stage {st.name!r} is a reduction")
        if self.is_output(sid):
            raise ScheduleError(f"compute_inline: stage {st.name!r} is an output of the program")
        if self.attached_to(st.name):
            raise ScheduleError(f"compute_inline: other stages are computed inside {st.name!r}")
        st.attach = "inline"
        self._record(ComputeInlineStep(sid))

    def compute_root(self, stage: StageRef) -> None:
        sid, st = self._compute_stage(stage, "compute_root")
        st.attach = "root"
        self._record(ComputeRootStep(sid))

    def cache_write(self, stage: StageRef, scope: str = "local") -> int:
        """Compute the stage into a new cache stage (inserted before it); the stage becomes a copy
        out of the cache. Returns the cache stage's index."""
        sid, st = self._compute_stage(stage, "cache_write")
        self._check_scope(scope, st)
        if not st.is_fresh or st.attach != "root" or self.attached_to(st.name):
            raise ScheduleError(f"cache_write on stage {st.name!r}: apply it before other steps on "
                                f"that stage")
        op = st.op
        cache_axes = [E.IterVar(a.name, a.extent, "spatial") for a in op.axes]
        body = E.substitute(op.body, dict(zip(op.axes, cache_axes)))
        cache_op = ComputeOp(f"{st.name}.{scope}", cache_axes, body, op.tag, op.attrs)
        cache_tensor = Tensor(cache_op)
        copy_axes = [E.IterVar(a.name, a.extent, "spatial") for a in op.axes]
        copy_op = ComputeOp(st.name, copy_axes, cache_tensor[tuple(copy_axes)], op.tag)
        self.stages[sid] = Stage(st.tensor, copy_op, st.name, st.scope, st.origin)
        self.stages.insert(sid, Stage(cache_tensor, cache_op, self._fresh_name(cache_op.name), scope,
                                      "cache_write"))
        self._infos = None
        self._record(CacheWriteStep(sid, scope))
        self._rewrite_end = len(self.steps)
        return sid

    def cache_read(self, stage: StageRef, scope: str, readers: Sequence[StageRef]) -> int:
        """Copy a tensor into a new stage read by `readers` instead (e.g. into shared memory).
        Returns the new stage's index (just after the stage)."""
        sid = self.stage_id(stage)
        st = self.stages[sid]
        if st.attach == "inline":
            raise ScheduleError(f"cache_read: stage {st.name!r} is inlined")
        self._check_scope(scope, st)
        reader_ids = sorted({self.stage_id(r) for r in readers})
        if not reader_ids:
            raise ScheduleError(f"cache_read of {st.name!r}: name at least one reader")
        for r in reader_ids:
            if r not in self.infos[sid].consumers:
                raise ScheduleError(f"cache_read of {st.name!r}: stage {self.stages[r].name!r} does not read it")
        axes = [E.IterVar(f"ax{d}", n, "spatial") for d, n in enumerate(st.tensor.shape)]
        copy_op = ComputeOp(f"{st.name}.{scope}", axes, st.tensor[tuple(axes)])
        copy_tensor = Tensor(copy_op)
        for r in reader_ids:
            reader = self.stages[r]
            body = E.transform(reader.op.body, lambda n: E.TensorRead(copy_tensor, n.indices)
                               if isinstance(n, E.TensorRead) and n.tensor is st.tensor else None)
            new_op = ComputeOp(reader.op.name, reader.op.axes, body, reader.op.tag, reader.op.attrs)
            reader.op = new_op
        self.stages.insert(sid + 1, Stage(copy_tensor, copy_op, self._fresh_name(copy_op.name), scope,
                                          "cache_read"))
        self._infos = None
        self._record(CacheReadStep(sid, scope, tuple(reader_ids)))
        self._rewrite_end = len(self.steps)
        return sid + 1

    def rfactor(self, stage: StageRef, iterator: IterRef, factor_axis: int = 0) -> int:
        """Factor a reduction: the reduce iterator becomes a spatial axis (at position
        `factor_axis`) of a new stage of partial results, which the stage then reduces.
        Returns the new stage's index; both stages restart from fresh loops."""
        sid, st = self._compute_stage(stage, "rfactor")
        idx = st.iter_index(iterator)
        it = st.iters[idx]
        op = st.op
        if it.kind != "reduce":
            raise ScheduleError(f"rfactor on {st.name}.{it.name}: not a reduce iterator")
        if any(i.extent is None for i in st.iters):
            raise ScheduleError(f"rfactor on stage {st.name!r}: split lengths are not decided yet")
        if self.attached_to(st.name) or st.attach != "root":
            raise ScheduleError(f"rfactor on stage {st.name!r}: apply it before compute_at steps")
        n_spatial = len(op.axes)
        if not 0 <= factor_axis <= n_spatial:
            raise ScheduleError(f"rfactor on {st.name}.{it.name}: factor_axis {factor_axis} is out of "
                                f"range [0, {n_spatial}]")
        reduce_leaves = [i for i in st.iters if i.kind == "reduce"]
        factor_var = E.IterVar(it.name.replace(".", "_"), it.extent, "spatial")
        spatial_leaves = {i.name: E.Var(i.name) for i in st.iters if i.kind != "reduce"}
        rf_spatial = [E.IterVar(a.name, a.extent, "spatial") for a in op.axes]
        rf_axes = list(rf_spatial)
        rf_axes.insert(factor_axis, factor_var)
        leaf_vars: dict[str, E.Expr] = {it.name: factor_var}
        rest = []
        for leaf in reduce_leaves:
            if leaf.name != it.name:
                v = E.IterVar(leaf.name.replace(".", "_") + "_r", leaf.extent, "reduce")
                leaf_vars[leaf.name] = v
                rest.append(v)
        values, guards, _ = leaf_expressions(st, {**spatial_leaves, **leaf_vars},
                                             {i.name: i.extent for i in st.root_iters})
        spatial_ids = {id(v) for v in spatial_leaves.values()}
        guards = [g for g in guards if not any(id(v) in spatial_ids for v in E.free_vars(g))]
        red = op.body
        mapping: dict = dict(zip(op.axes, rf_spatial))
        for ax in red.axes:
            mapping[ax] = values[ax.name] + ax.lo if ax.lo else values[ax.name]
        source = E.substitute(red.source, mapping)
        conds = [E.substitute(red.where, mapping)] if red.where is not None else []
        where = E.all_of(conds + guards)
        if not rest:  # the factored iterator was the whole reduction: the rf stage is elementwise
            body = source if where is None else E.Select(where, source, E.reduce_identity(red.combiner, source.dtype))
        else:
            body = E.Reduce(red.combiner, source, rest, where)
        rf_op = ComputeOp(f"{st.name}.rf", rf_axes, body, op.tag)
        rf_tensor = Tensor(rf_op)
        new_axes = [E.IterVar(a.name, a.extent, "spatial") for a in op.axes]
        k = E.IterVar(factor_var.name + "_v", it.extent, "reduce")
        read_idx = list(new_axes)
        read_idx.insert(factor_axis, k)
        final_op = ComputeOp(st.name, new_axes, E.Reduce(red.combiner, rf_tensor[tuple(read_idx)], [k], None),
                             op.tag, op.attrs)
        self.stages[sid] = Stage(st.tensor, final_op, st.name, st.scope, st.origin)
        self.stages.insert(sid, Stage(rf_tensor, rf_op, self._fresh_name(rf_op.name), "global", "rfactor"))
        self._infos = None
        self._record(RfactorStep(sid, idx, factor_axis))
        self._rewrite_end = len(self.steps)
        return sid

    def transform_layout(self, stage: StageRef, dim: int, src_step_id: int, level: int) -> None:
        """Store the stage's buffer with dimension `dim` tiled: the tile index outermost, the
        position in the tile innermost (Ansor's layout rewrite). The tile follows an earlier
        split: the product of its lengths from `level` on, so a consumer tiled by that split
        reads the buffer contiguously."""
        sid, st = self._compute_stage(stage, "transform_layout")
        if not 0 <= dim < len(st.op.shape):
            raise ScheduleError(f"transform_layout on {st.name!r}: dimension {dim} out of range")
        if self.is_output(sid):
            raise ScheduleError(f"transform_layout on {st.name!r}: an output keeps its layout")
        src = self._step(src_step_id, SplitStep)
        if not 0 <= level < len(src.lengths):
            raise ScheduleError(f"transform_layout on {st.name!r}: level {level} out of range")
        tail = src.lengths[level:]
        factor = None if any(n is None for n in tail) else math.prod(tail)
        st.layout = (dim, factor)
        self._record(LayoutStep(sid, dim, src_step_id, level))

    def interleave_layout(self, stage: StageRef, dim: int, group: int) -> None:
        """Store the stage's (tiled) buffer with dimension `dim` in groups of `group` whose
        position is the innermost index of all: `B[k, j]` tiled along j by F and interleaved
        along k by 4 is stored `[j/F][k/4][F][4]`, the operand layout of a dot-product
        instruction that sums 4 consecutive k per lane."""
        sid, st = self._compute_stage(stage, "interleave_layout")
        if st.layout is None:
            raise ScheduleError(f"interleave_layout on {st.name!r}: the stage needs a tiled layout first")
        if not 0 <= dim < len(st.op.shape) or dim == st.layout[0]:
            raise ScheduleError(f"interleave_layout on {st.name!r}: dimension {dim} is out of range or the "
                                f"tiled one")
        if group < 2:
            raise ScheduleError(f"interleave_layout on {st.name!r}: a group has at least 2 elements, got {group}")
        st.interleave = (dim, group)
        self._record(InterleaveStep(sid, dim, group))

    def _check_scope(self, scope: str, st: Stage) -> None:
        if scope not in SCOPES:
            raise ScheduleError(f"stage {st.name!r}: unknown scope {scope!r}; use one of {SCOPES}")

    def _fresh_name(self, name: str) -> str:
        used = {s.name for s in self.stages}
        cand, k = name, 1
        while cand in used:
            cand = f"{name}_{k}"
            k += 1
        return cand

    # replay and identity -------------------------------------------------------------------
    def apply_steps(self, steps: Sequence[Step]) -> "State":
        for step in steps:
            step.apply(self)
        return self

    @classmethod
    def replay(cls, dag: ComputeDAG, steps: Sequence[Step]) -> "State":
        return cls(dag).apply_steps(steps)

    def key(self) -> str:
        """Canonical text of the loop nest: equal keys mean the same program (cached; every
        primitive clears it)."""
        if self._key is None:
            self._key = state_to_str(self, canonical=True)
        return self._key

    def __str__(self) -> str:
        return state_to_str(self)

    def steps_json(self) -> list:
        return [s.to_json() for s in self.steps]
