"""What `visualize` finds out about one program: its nest, its caches, its traffic, its roofline.

`visualize(kernel | record | (task, state))` reads the program's loop IR as it runs on its
target (`viz.nest`), sizes its tiles against the target's caches and places it on this
machine's roofline (`viz.machine`); the `KernelView` it returns explains itself as text
(`viz.explain`) and draws itself (`viz.draw`, imported only when a picture is asked for, so
explaining a program never loads matplotlib).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from ansor.backend import backend_for
from ansor.kernel import Kernel
from ansor.lower import ir
from ansor.lower.lower import lower, schedule_text
from ansor.measure import TimingPolicy
from ansor.records import Record, RecordStore
from ansor.replay import ReplayError, replay, workload_dag
from ansor.schedule.errors import ScheduleError
from ansor.schedule.state import State
from ansor.target import Target
from ansor.task import Task
from ansor.viz.explain import explain
from ansor.viz.machine import CacheLevel, MachinePeaks, machine_peaks, target_caches
from ansor.viz.nest import NestAnalysis, TileLevel, analyze_nest
from ansor.viz.roofline import Roofline
from ansor.viz.units import format_bytes

PICTURE_SUFFIXES = (".png", ".svg")


@dataclass
class KernelView:
    """What `visualize` found out about one program; `text` explains it, `save` draws it."""

    task: Task
    state: State
    record: Record | None
    seconds: float | None                 # measured median seconds per call (None: not measured)
    nest: NestAnalysis | None             # None when the loop nest could not be analyzed
    caches: tuple[CacheLevel, ...]
    traffic: dict[str, int]               # memory level -> estimated bytes moved into it per call
    roofline: Roofline
    peaks: MachinePeaks | None
    schedule: str                         # the loop nest, readable
    fused: list[str] = field(default_factory=list)     # "X at Y.loop" (compute_at)
    inlined: list[str] = field(default_factory=list)
    packed: list[str] = field(default_factory=list)    # stages stored in a tiled layout
    notes: list[str] = field(default_factory=list)     # what could not be worked out, and why
    path: str | None = None

    @property
    def threads(self) -> int:
        """Tiles running at once in parallel loops (the target's cores; 1 per block on a GPU)."""
        return 1 if self.task.target.is_gpu else max(1, self.task.target.num_cores)

    def fits(self, level: TileLevel) -> str:
        """The innermost memory a tile of this level fits in (per core when tiles run at once)."""
        for cache in self.caches:
            share = cache.size / max(1, min(cache.shared_by, self.threads)) if level.concurrent else cache.size
            if level.footprint_bytes <= share:
                return cache.name
        return "memory"

    @property
    def text(self) -> str:
        """The explanation, as `ansor viz` prints it."""
        return explain(self)

    def __str__(self) -> str:
        return self.text

    def save(self, path: str) -> str:
        """Draw the picture (PNG or SVG, by the file's suffix) and return its path."""
        from ansor.viz.draw import draw  # matplotlib is loaded only for a picture

        _check_picture_path(path)
        draw(self, str(path))
        self.path = str(path)
        return self.path


def _check_picture_path(path: str) -> None:
    if not str(path).lower().endswith(PICTURE_SUFFIXES):
        raise ValueError(f"{path}: the picture is written as PNG or SVG; give a file ending in .png or .svg")


def visualize(what: Any, task: Task | None = None, path: str | None = None, *,
              database: RecordStore | None = None, peaks: MachinePeaks | None = None,
              roofline: bool = True, remeasure: bool = False,
              on_measure: Callable[[str], object] | None = None,
              on_warning: Callable[[str], object] | None = None) -> KernelView:
    """Explain a program: its tile levels against the caches and its place on the roofline.

    Args:
        what: A `Kernel` (from `ansor.build`), a database `Record`, a `(task, state)` pair, or a
            `State` with `task=`.
        task: The task of a Record or State; for a Record without it, the workload is rebuilt
            from `database`.
        path: Where to draw the picture (.png or .svg); None: no picture (`KernelView.save`
            draws it later).
        database: The record store where a Record's workload is looked up when no `task` is
            given (`ansor.visualize` opens one from a path).
        peaks: This machine's peaks; None: read from the peaks file, measured once if missing
            (saved peaks below what this kernel reached are measured again).
        roofline: False: no peaks at all (no measurement; the roofline has no roofs).
        remeasure: Measure this machine's peaks again and replace the saved ones.
        on_measure: Called with a message before the peaks are measured (the CLI prints it).
        on_warning: Called with one line when measured peaks are rejected as implausible
            (default: a RuntimeWarning); the view's notes say it too.

    Returns:
        A `KernelView`: `str(view)` is the explanation, `view.save(path)` draws it.
    """
    if path is not None:
        _check_picture_path(path)
    task, state, record, seconds, notes = _program_of(what, task, database)
    target = task.target
    try:
        func = _lowered(state, target)
        nest: NestAnalysis | None = analyze_nest(func)
    except Exception as exc:  # a valid program always gets a view, only a plainer one
        nest = None
        notes.append(f"the loop nest could not be analyzed ({type(exc).__name__}: {exc})")
    caches = target_caches(target)
    traffic = _traffic(nest, caches, 1 if target.is_gpu else target.num_cores)
    dtype = nest.dtype if nest is not None and nest.dtype in ("float32", "float64") else task.outputs[0].dtype
    flop = float(task.flop)
    gflops = flop / seconds / 1e9 if seconds and flop else None
    if peaks is None and roofline and not target.is_gpu:
        def warn(message: str) -> None:
            notes.append(message)
            if on_warning is not None:
                on_warning(message)
            else:
                warnings.warn(message, RuntimeWarning, stacklevel=4)

        try:
            peaks = machine_peaks(target, refresh=remeasure, replace=remeasure, on_measure=on_measure,
                                  achieved_gflops={dtype: gflops} if gflops else None, on_warning=warn)
        except (RuntimeError, OSError) as exc:
            notes.append(f"this machine's peaks could not be measured ({exc})")
    if target.is_gpu and peaks is None:
        notes.append(f"no roofs for {target.key}: the peaks measured here are this machine's CPU")
    memory_bytes = traffic.get("memory", nest.total_bytes if nest is not None else 0)
    # calls timed back to back find a working set that fits a cache still there: the roof is that
    # cache's bandwidth (measured with the same triad), not memory's
    where, bandwidth = ("memory", peaks.bandwidth_gbs) if peaks else ("memory", None)
    if peaks and nest is not None:
        where, bandwidth = peaks.bandwidth_for(nest.total_bytes)
    roof = Roofline(flop, float(memory_bytes), peaks.peak_for(dtype) if peaks and roofline else None,
                    bandwidth if peaks and roofline else None, gflops, where)
    if roof.bound == "memory" and where == "memory" and nest is not None and caches \
            and nest.total_bytes <= caches[-1].size:
        notes.append(f"the whole working set ({format_bytes(nest.total_bytes)}) fits in {caches[-1].name}: calls "
                     f"repeated back to back (as they are timed) may find it there, so a kernel may run above "
                     f"the memory roof")
    fused, inlined, packed = _stage_facts(state)
    view = KernelView(task, state, record, seconds, nest, caches, traffic, roof, peaks if roofline else None,
                      _schedule_text(state), fused, inlined, packed, notes)
    if path is not None:
        view.save(path)
    return view


def _program_of(what: Any, task: Task | None, database) -> tuple[Task, State, Record | None, float | None, list[str]]:
    """(task, state, record, measured seconds, notes) of whatever `visualize` was given."""
    notes: list[str] = []
    if isinstance(what, tuple) and len(what) == 2 and isinstance(what[0], Task) and isinstance(what[1], State):
        return what[0], what[1], None, None, notes
    if isinstance(what, State):
        if task is None:
            raise TypeError("visualize(state) needs the task: visualize((task, state)) or visualize(state, task=task)")
        return task, what, None, None, notes
    if isinstance(what, Record):
        if not what.ok:
            raise ValueError(f"the record is a failed measurement (error {what.error_no}: "
                             f"{what.error_msg[:200] or 'no message'}); give a record that ran")
        task = task if task is not None else _task_of_record(what, database)
        if task.workload_key != what.workload_key:
            raise ValueError(f"the record belongs to workload {what.workload_key}, not to the task's "
                             f"{task.workload_key}")
        if task.target.key != what.target_key:
            notes.append(f"the record was measured on {what.target_key}; it is analyzed for {task.target.key}")
        try:
            state = replay(what, task.dag)
        except ReplayError as exc:
            raise ValueError(str(exc)) from None
        return task, state, what, what.median_cost, notes
    if isinstance(what, Kernel):
        record = what.record
        if record is not None and record.ok:
            return what.task, what.state, record, record.median_cost, notes
        return what.task, what.state, record, _time_kernel(what, notes), notes
    raise TypeError(f"visualize() takes a Kernel, a Record or a (task, state) pair, got {type(what).__name__}")


def _task_of_record(record: Record, db: RecordStore | None) -> Task:
    if db is None:
        raise ValueError("visualize(record) needs the record's task or the database it came from: "
                         "visualize(record, task=task) or database=...")
    try:
        dag = workload_dag(db, record.workload_key)
    except ReplayError as exc:
        raise ValueError(f"{exc}; pass the record's task: visualize(record, task=task)") from None
    entry = db.workload(record.workload_key) or {}
    described = db.target(record.target_key)
    target = _target_of(record.target_key, described)
    name = (entry.get("description") or {}).get("name") if isinstance(entry, dict) else None
    return Task(dag.inputs + dag.outputs, target=target, name=name)


def _target_of(key: str, described: dict | None) -> Target:
    """The target a record was measured on: from its stored description, else this CPU."""
    if isinstance(described, dict):
        desc = described.get("description", described)
        try:
            return Target(**{k: v for k, v in desc.items() if k in Target.__dataclass_fields__})
        except TypeError:
            pass
    return Target.host()


def _time_kernel(kernel: Kernel, notes: list[str]) -> float | None:
    """Seconds per call of a kernel built without a record (CPU targets; a short timing)."""
    if kernel.task.target.is_gpu:
        notes.append("the kernel has no record and GPU kernels are not timed here: no measured throughput")
        return None
    try:
        return kernel.time(*kernel.task.random_inputs(), timing=TimingPolicy(repeat=3, min_repeat_ms=20.0,
                                                                              max_seconds=1.0))
    except Exception as exc:  # timing is extra information; the view stands without it
        notes.append(f"the kernel could not be timed ({exc})")
        return None


def _lowered(state: State, target: Target) -> ir.PrimFunc:
    """The IR as it runs on the target; the plain lowering where the target's passes refuse it."""
    func = lower(state)
    try:
        return backend_for(target).run_passes(func, target)
    except ScheduleError:
        return func


def _schedule_text(state: State) -> str:
    try:
        return schedule_text(state)
    except Exception:  # the declared extents still print
        return str(state)


def _traffic(nest: NestAnalysis | None, caches: tuple[CacheLevel, ...], threads: int) -> dict[str, int]:
    """Bytes moved into each cache level from the next, and from memory into the last one."""
    if nest is None:
        return {}
    out = {c.name: nest.traffic(c.size, c.shared_by, threads) for c in caches}
    out["memory"] = out[caches[-1].name] if caches else nest.total_bytes
    return out


def _stage_facts(state: State) -> tuple[list[str], list[str], list[str]]:
    fused, inlined, packed = [], [], []
    for s in state.stages:
        if s.is_placeholder:
            continue
        if s.attach == "inline":
            inlined.append(s.name)
        elif isinstance(s.attach, tuple):
            fused.append(f"{s.name} at {s.attach[0]}.{s.attach[1]}" + (f" ({s.scope})" if s.scope != "global" else ""))
        if s.layout is not None:
            dim, factor = s.layout
            packed.append(f"{s.name} (dimension {dim} tiled by {factor})")
    return fused, inlined, packed
