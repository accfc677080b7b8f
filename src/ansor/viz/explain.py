"""The explanation `ansor viz` prints: the work, the tile levels, the traffic and the bound.

Text only, from a `KernelView`'s facts; the picture (`viz.draw`) shows the same facts and
borrows the wording of the vectorized loops from here, so the two never disagree.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ansor.viz.units import format_bytes, format_flop, format_seconds, format_shape

if TYPE_CHECKING:
    from ansor.viz.view import KernelView


def vector_text(view: KernelView, buffer: str, loop: str, extent: int) -> str:
    """A vectorized loop in words: its buffer, its length and how it fills the target's lanes."""
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
    lines = [f"{task.name} {format_shape(task.outputs[0].shape)} on {task.target.key}: {format_flop(roof.flop)} per call"]
    if view.seconds is not None:
        runs = len(view.record.costs) if view.record is not None else 0
        where = f"median of {runs} run{'s' if runs != 1 else ''} of its record" if runs else "timed here"
        rate = f" = {roof.gflops:.2f} GFLOP/s" if roof.gflops is not None else ""
        lines.append(f"measured: {format_seconds(view.seconds)} per call ({where}){rate}")
    else:
        lines.append("measured: no (a program without a record)")
    if nest is not None:
        lines += ["", f"tile levels of the main statement (it writes {nest.main_buffer}, {nest.dtype}); tiles "
                      f"of {nest.output} {format_shape(nest.shapes.get(nest.output, ()))}:"]
        rows = [("level", "loops (one iteration = one tile)", "tile", "footprint", "fits", "tiles", "bytes moved")]
        for i, level in enumerate(nest.levels):
            loops = ", ".join(lp.label for lp in level.loops) or "whole program"
            tile = format_shape(level.tile) + ("" if level.tensor == nest.output else f" of {level.tensor}")
            rows.append((str(i), loops, tile, format_bytes(level.footprint_bytes), view.fits(level),
                         str(level.iterations), format_bytes(level.bytes_moved)))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        for r in rows:
            lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
        lines.append("  (footprint: unique bytes one tile touches; bytes moved: footprint x tiles)")
        lines.append("")
        if nest.vectorized:
            lines.append("vectorized: " + "; ".join(vector_text(view, b, v, n) for b, v, n in nest.vectorized))
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
            lines.append(f"  this kernel           {roof.gflops:.2f} GFLOP/s = {roof.share_text()}")
            if roof.suspect:
                lines.append("  (`ansor viz ... --remeasure`, or `visualize(..., remeasure=True)`, measures this "
                             "machine's peaks again and replaces the saved ones)")
    else:
        lines.append("  no roofs: this machine's peaks are not known here")
    if view.notes:
        lines += [""] + [f"note: {n}" for n in view.notes]
    return "\n".join(lines)
