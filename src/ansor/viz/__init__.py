"""Why a kernel is fast (or not): its tiles against the caches, and its place on the roofline.

`visualize(kernel | record | (task, state))` reads the program's loop IR as it runs on its
target (`viz.nest`): the tile levels of its heaviest statement, the bytes each tile touches,
which caches they fit in and how many bytes move between the levels. Against this machine's
measured FMA peak and memory bandwidth (`viz.machine`, measured once and cached) it places the
kernel on the roofline: the bound that applies (compute or memory) and the share of it the
measured program reaches. The result prints as text and draws as a picture (`viz.draw`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ansor.records import Record, RecordStore
from ansor.kernel import Kernel
from ansor.lower import ir
from ansor.replay import ReplayError, replay, workload_dag
from ansor.schedule.state import State
from ansor.target import Target
from ansor.task import Task
from ansor.viz.machine import CacheLevel, MachinePeaks, machine_peaks, measure_peaks, target_caches
from ansor.viz.nest import LoopInfo, NestAnalysis, TileLevel, analyze_nest

__all__ = ["KernelView", "Roofline", "visualize", "MachinePeaks", "machine_peaks", "measure_peaks",
           "CacheLevel", "NestAnalysis", "TileLevel", "LoopInfo", "analyze_nest", "format_bytes"]

PICTURE_SUFFIXES = (".png", ".svg")


@dataclass(frozen=True)
class Roofline:
    """A kernel against the roofline: min(peak, intensity x bandwidth) is what its memory
    traffic allows; the measured throughput says how much of that it reaches."""

    flop: float                    # floating-point operations of one call
    bytes: float                   # estimated bytes moved from memory in one call
    peak_gflops: float | None      # this machine's FMA peak for the kernel's element type
    bandwidth_gbs: float | None    # the bandwidth of where its data lives between calls
    gflops: float | None = None    # the kernel's measured throughput
    data_in: str = "memory"        # where that is: "memory", or a cache its working set fits

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved from memory."""
        return self.flop / self.bytes if self.bytes > 0 else math.inf

    @property
    def ridge(self) -> float | None:
        """The intensity where the memory roof meets the compute roof."""
        if not self.peak_gflops or not self.bandwidth_gbs:
            return None
        return self.peak_gflops / self.bandwidth_gbs

    @property
    def bound_gflops(self) -> float | None:
        """min(peak, intensity x bandwidth): the most the machine allows at this intensity."""
        if self.peak_gflops is None or self.bandwidth_gbs is None:
            return None
        return min(self.peak_gflops, self.intensity * self.bandwidth_gbs)

    @property
    def bound(self) -> str | None:
        """Which roof applies: "compute" or "memory"."""
        if self.bound_gflops is None:
            return None
        return "compute" if self.peak_gflops <= self.intensity * self.bandwidth_gbs else "memory"

    @property
    def fraction(self) -> float | None:
        """The measured throughput over the bound that applies."""
        if self.gflops is None or not self.bound_gflops:
            return None
        return self.gflops / self.bound_gflops


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
        from ansor.viz.draw import draw

        _check_picture_path(path)
        draw(self, str(path))
        self.path = str(path)
        return self.path


def _check_picture_path(path: str) -> None:
    if not str(path).lower().endswith(PICTURE_SUFFIXES):
        raise ValueError(f"{path}: the picture is written as PNG or SVG; give a file ending in .png or .svg")


def visualize(what: Any, task: Task | None = None, path: str | None = None, *,
              database: RecordStore | None = None, peaks: MachinePeaks | None = None,
              roofline: bool = True, on_measure: Callable[[str], object] | None = None) -> KernelView:
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
        peaks: This machine's peaks; None: read from the peaks file, measured once if missing.
        roofline: False: no peaks at all (no measurement; the roofline has no roofs).
        on_measure: Called with a message before the peaks are measured (the CLI prints it).

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
    if peaks is None and roofline and not target.is_gpu:
        try:
            peaks = machine_peaks(target, on_measure=on_measure)
        except (RuntimeError, OSError) as exc:
            notes.append(f"this machine's peaks could not be measured ({exc})")
    if target.is_gpu and peaks is None:
        notes.append(f"no roofs for {target.key}: the peaks measured here are this machine's CPU")
    dtype = nest.dtype if nest is not None and nest.dtype in ("float32", "float64") else task.outputs[0].dtype
    memory_bytes = traffic.get("memory", nest.total_bytes if nest is not None else 0)
    flop = float(task.flop)
    gflops = flop / seconds / 1e9 if seconds and flop else None
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
    from ansor.measure import TimingPolicy

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
    from ansor.backend import backend_for
    from ansor.lower.lower import lower
    from ansor.schedule.errors import ScheduleError

    func = lower(state)
    try:
        return backend_for(target).run_passes(func, target)
    except ScheduleError:
        return func


def _schedule_text(state: State) -> str:
    from ansor.lower.lower import schedule_text

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


# --- text ----------------------------------------------------------------------------------

def format_bytes(n: float) -> str:
    """Bytes with a binary unit: 512 B, 12.0 KiB, 3.5 MiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def format_flop(n: float) -> str:
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("KFLOP", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} FLOP"


def _shape(shape) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


def _seconds(sec: float) -> str:
    return f"{sec * 1e6:.1f} us" if sec < 1e-3 else (f"{sec * 1e3:.3f} ms" if sec < 1 else f"{sec:.3f} s")


def _vector_text(view: KernelView, buffer: str, loop: str, extent: int) -> str:
    text = f"{buffer} along {loop} (length {extent}"
    nest = view.nest
    target = view.task.target
    if not target.is_gpu and nest is not None and nest.dtype in ("float32", "float64"):
        lanes = target.vector_unit_bytes // (4 if nest.dtype == "float32" else 8)
        if extent % lanes == 0:
            text += f" = {extent // lanes} x {lanes} {nest.dtype} lanes"
        elif extent < lanes:
            text += f", {extent} of {lanes} lanes used"
        else:
            full = extent // lanes
            text += f": {full} full vector{'s' if full != 1 else ''} of {lanes} lanes and a partial one"
    return text + ")"


def explain(view: KernelView) -> str:
    """The explanation `ansor viz` prints: the work, the tile levels, the traffic and the bound."""
    task, nest, roof = view.task, view.nest, view.roofline
    lines = [f"{task.name} {_shape(task.outputs[0].shape)} on {task.target.key}: {format_flop(roof.flop)} per call"]
    if view.seconds is not None:
        runs = len(view.record.costs) if view.record is not None else 0
        where = f"median of {runs} run{'s' if runs != 1 else ''} of its record" if runs else "timed here"
        rate = f" = {roof.gflops:.2f} GFLOP/s" if roof.gflops is not None else ""
        lines.append(f"measured: {_seconds(view.seconds)} per call ({where}){rate}")
    else:
        lines.append("measured: no (a program without a record)")
    if nest is not None:
        lines += ["", f"tile levels of the main statement (it writes {nest.main_buffer}, {nest.dtype}); tiles "
                      f"of {nest.output} {_shape(nest.shapes.get(nest.output, ()))}:"]
        rows = [("level", "loops (one iteration = one tile)", "tile", "footprint", "fits", "tiles", "bytes moved")]
        for i, level in enumerate(nest.levels):
            loops = ", ".join(lp.label for lp in level.loops) or "whole program"
            tile = _shape(level.tile) + ("" if level.tensor == nest.output else f" of {level.tensor}")
            rows.append((str(i), loops, tile, format_bytes(level.footprint_bytes), view.fits(level),
                         str(level.iterations), format_bytes(level.bytes_moved)))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        for r in rows:
            lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
        lines.append("  (footprint: unique bytes one tile touches; bytes moved: footprint x tiles)")
        lines.append("")
        if nest.vectorized:
            lines.append("vectorized: " + "; ".join(_vector_text(view, b, v, n) for b, v, n in nest.vectorized))
        else:
            lines.append("vectorized: no loop")
        if nest.parallel:
            what = "blocks" if task.target.is_gpu else f"on {view.threads} core{'s' if view.threads != 1 else ''}"
            lines.append("parallel: " + ", ".join(f"{v} ({n} iterations)" for v, n in nest.parallel) + f" {what}")
        else:
            lines.append("parallel: no loop (one core)")
    lines.append("fused (compute_at): " + ("; ".join(view.fused) or "nothing"))
    if view.inlined:
        lines.append("inlined: " + ", ".join(view.inlined))
    if view.packed:
        lines.append("packed layouts: " + "; ".join(view.packed))
    if view.caches:
        lines.append("")
        lines.append("caches: " + ", ".join(
            f"{c.name} {format_bytes(c.size)}" + (f" shared by {c.shared_by} cores" if c.shared_by > 1 else
                                                  (" per block" if task.target.is_gpu else " per core"))
            for c in view.caches))
    if view.traffic:
        names = [c.name for c in view.caches]
        parts = [f"{src} -> {dst} {format_bytes(view.traffic[dst])}"
                 for src, dst in zip([*names[1:], "memory"], names)]
        lines.append("traffic per call (estimate): " + ", ".join(parts) if parts else
                     f"traffic per call (estimate): {format_bytes(view.traffic['memory'])} from memory")
    lines += ["", f"roofline ({nest.dtype if nest is not None else task.outputs[0].dtype}):"]
    ai = roof.intensity
    lines.append(f"  arithmetic intensity  {format_flop(roof.flop)} / {format_bytes(roof.bytes)} from memory = "
                 + (f"{ai:.3g} FLOP/byte" if math.isfinite(ai) else "unbounded (no memory traffic)"))
    if roof.bound_gflops is not None:
        peaks = view.peaks
        lines.append(f"  peak                  {roof.peak_gflops:.1f} GFLOP/s (FMA, {peaks.cores} cores, {peaks.isa}; "
                     f"measured on this machine)")
        source = ("streaming triad from memory; measured" if roof.data_in == "memory" else
                  f"triad on arrays that stay in {roof.data_in}, as this kernel's working set does between "
                  f"calls; measured")
        lines.append(f"  bandwidth             {roof.bandwidth_gbs:.1f} GB/s ({source})"
                     f" -> ridge at {roof.ridge:.3g} FLOP/byte")
        if roof.bound == "memory":
            lines.append(f"  bound                 memory: {ai:.3g} x {roof.bandwidth_gbs:.1f} = "
                         f"{roof.bound_gflops:.1f} GFLOP/s (below the {roof.peak_gflops:.1f} peak)")
        else:
            lines.append(f"  bound                 compute: the {roof.peak_gflops:.1f} GFLOP/s peak (intensity "
                         f"above the ridge)")
        if roof.fraction is not None:
            lines.append(f"  this kernel           {roof.gflops:.2f} GFLOP/s = {roof.fraction:.1%} of its bound")
            if roof.fraction > 1.0:
                lines.append("  (above its bound: the peaks were measured while the machine was busy, or the "
                             "kernel's data stayed in cache between calls; `ansor.viz.machine_peaks(refresh=True)` "
                             "measures again and keeps the best)")
    else:
        lines.append("  no roofs: this machine's peaks are not known here")
    if view.notes:
        lines += [""] + [f"note: {n}" for n in view.notes]
    return "\n".join(lines)
