"""The picture of a `KernelView`: tiles to scale, footprints against the caches, the roofline,
and the loop nest, in one PNG or SVG.

Drawn on a bare matplotlib `Figure` (the Agg canvas, no pyplot), so it needs no display and
leaves the caller's matplotlib state alone. Every panel is drawn on its own: one that cannot be
drawn says why in its place and the others still appear.
"""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING, Callable

import numpy as np
from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator

from ansor.viz.explain import vector_text
from ansor.viz.nest import TileLevel
from ansor.viz.units import format_bytes, format_flop

if TYPE_CHECKING:
    from ansor.viz.view import KernelView

FIT_COLORS = {"L1": "#2ca02c", "L2": "#9acd32", "L3": "#ff9f1c", "shared": "#2ca02c", "memory": "#d62728"}
TILE_PANELS = 6
MAX_NEST_LINES = 46


def draw(view: KernelView, path: str) -> str:
    """Write the picture of `view` to `path` (the format follows the suffix)."""
    fig = Figure(figsize=(17, 11.5))
    grid = fig.add_gridspec(3, TILE_PANELS, height_ratios=[1.0, 1.05, 1.35], hspace=0.5, wspace=0.35,
                            left=0.04, right=0.985, top=0.92, bottom=0.03)
    task = view.task
    measured = f", {view.roofline.gflops:.2f} GFLOP/s measured" if view.roofline.gflops is not None else ""
    fig.suptitle(f"{task.name} {'x'.join(map(str, task.outputs[0].shape))} on {task.target.key}: "
                 f"{format_flop(view.roofline.flop)} per call{measured}", fontsize=13, fontweight="bold")

    # only the axes that get drawn on: each costs its share of the rendering
    tiles = _distinct_tiles(view) if view.nest is not None else []
    tile_axes = [fig.add_subplot(grid[0, i]) for i in range(max(1, min(TILE_PANELS, len(tiles))))]
    _guarded(lambda: _draw_tiles(view, tile_axes, tiles), _axes_message(tile_axes[0]))
    for spec, panel in ((grid[1, :3], _draw_footprints), (grid[1, 3:], _draw_roofline)):
        ax = fig.add_subplot(spec)
        _guarded(lambda ax=ax, panel=panel: panel(view, ax), _axes_message(ax))
    for spec, panel in ((grid[2, :3], _draw_nest), (grid[2, 3:], _draw_facts)):  # text: no axes
        box = spec.get_position(fig)
        _guarded(lambda box=box, panel=panel: panel(view, fig, box),
                 lambda message, box=box: fig.text(box.x0, box.y1, message, fontsize=8, va="top"))
    with rc_context({"svg.fonttype": "none"}):  # SVG text stays text: searchable, and small
        fig.savefig(path, dpi=100)
    return path


def _guarded(fn: Callable[[], None], show: Callable[[str], object]) -> None:
    """Draw one panel; a panel that fails shows the reason instead (the picture still comes)."""
    try:
        fn()
    except Exception as exc:  # a picture with one plain panel beats no picture
        show(_plain(textwrap.fill(f"could not draw this panel: {type(exc).__name__}: {exc}", 50)))


def _axes_message(ax) -> Callable[[str], None]:
    def show(message: str) -> None:
        ax.cla()
        ax.axis("off")
        ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=8, transform=ax.transAxes)

    return show


def _plain(text: str) -> str:
    """Text shown as it is ($ would start matplotlib's math mode)."""
    return text.replace("$", r"\$")


def _short(name: str, limit: int = 20) -> str:
    if len(name) <= limit or "@" not in name:
        return name
    parts = name.split("@")
    return f"{parts[0]}@\u2026@{parts[-1]}"


def _loops_label(level: TileLevel) -> str:
    if not level.loops:
        return "whole program"
    text = ", ".join(f"{_short(lp.name)} \u00d7{lp.extent}" for lp in level.loops)
    kinds = sorted({lp.kind if lp.kind != "serial" else ("unrolled" if lp.unrolled else "serial") for lp in level.loops})
    return f"{text} ({', '.join(kinds)}, {level.role})"


# --- tiles ---------------------------------------------------------------------------------

def _row_dim(tile: tuple[int, ...], frame: tuple[int, ...]) -> int | None:
    """The dimension drawn down the panel (the last one goes across): the one the tile cuts most
    finely among the others, so a channel split shows where a row split would not; None for a
    one-dimensional tile."""
    if len(tile) < 2:
        return None
    ratios = [(frame[d] / max(1, tile[d]) if d < len(frame) else 1.0, d) for d in range(len(tile) - 1)]
    best = max(ratios)  # ties: the later dimension
    return best[1] if best[0] > 1 else len(tile) - 2


def _plane(shape: tuple[int, ...], row_dim: int | None) -> tuple[int, int]:
    """(rows, columns) of a tile in the drawn plane."""
    if not shape:
        return 1, 1
    return (shape[row_dim] if row_dim is not None and row_dim < len(shape) else 1), shape[-1]


def _distinct_tiles(view: KernelView) -> list[tuple[int, TileLevel]]:
    """The levels whose tile differs from the one before (reduction levels share their tile)."""
    out: list[tuple[int, TileLevel]] = []
    for i, level in enumerate(view.nest.levels):
        if not out or (level.tile, level.tensor) != (out[-1][1].tile, out[-1][1].tensor):
            out.append((i, level))
    return out


def _draw_tiles(view: KernelView, axes: list, tiles: list[tuple[int, TileLevel]]) -> None:
    for ax in axes:
        ax.axis("off")
    if view.nest is None:
        axes[0].text(0, 0.5, _plain(textwrap.fill("no tile picture: " + "; ".join(view.notes), 60)), fontsize=9,
                     transform=axes[0].transAxes)
        return
    shapes = view.nest.shapes
    _guarded(lambda: _draw_overview(view, axes[0], tiles), _axes_message(axes[0]))
    for k, (i, level) in enumerate(tiles[1:len(axes)], start=1):
        parent = tiles[k - 1][1]
        frame = parent.tile if parent.tensor == level.tensor else shapes.get(level.tensor, level.tile)
        _guarded(lambda k=k, i=i, level=level, frame=frame: _draw_zoom(view, axes[k], i, level, frame),
                 _axes_message(axes[k]))
    if len(tiles) > len(axes):
        axes[-1].text(1.0, -0.32, f"({len(tiles) - len(axes)} smaller tiles not drawn)", fontsize=7,
                      ha="right", transform=axes[-1].transAxes)


def _setup_tile_axes(ax, rows: int, cols: int, row_dim: int | None, rank: int) -> None:
    ax.axis("on")
    if rank:
        ax.text(1.0, 1.0, f"dim {rank - 1} \u2192", fontsize=6, ha="right", va="bottom", transform=ax.transAxes,
                color="#555555")
    if row_dim is not None:
        ax.set_ylabel(f"dim {row_dim}", fontsize=6, color="#555555", labelpad=-4)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ratio = max(rows, cols) / max(1, min(rows, cols))
    ax.set_aspect("equal" if ratio <= 8 else "auto")
    ax.set_xticks([0, cols])
    ax.set_yticks([0, rows])
    ax.tick_params(labelsize=7, length=2)


def _outer_dims(tile: tuple[int, ...], frame: tuple[int, ...]) -> str:
    """The tile against its frame in the dimensions the panel does not draw."""
    if len(tile) <= 2:
        return ""
    return f"\nof {'x'.join(map(str, frame))}"


def _draw_overview(view: KernelView, ax, tiles: list[tuple[int, TileLevel]]) -> None:
    """The whole output with every level's tile nested at its corner, all to one scale."""
    whole = tiles[0][1]
    same = [lv for _, lv in tiles if lv.tensor == whole.tensor]
    row_dim = _row_dim(same[-1].tile, whole.tile)
    rows, cols = _plane(whole.tile, row_dim)
    _setup_tile_axes(ax, rows, cols, row_dim, len(whole.tile))
    cmap = _level_colors(len(tiles))
    for k, (i, level) in enumerate(tiles):
        if level.tensor != whole.tensor:
            continue
        r, c = _plane(level.tile, row_dim)
        ax.add_patch(Rectangle((0, 0), c, r, facecolor=cmap[k], edgecolor="black", linewidth=0.8, alpha=0.85))
        if k:
            ax.text(c, r, f" {i}", fontsize=7, va="top")
    ax.set_title(_plain(f"{whole.tensor} {'x'.join(map(str, whole.tile))}\nall tiles, to scale"), fontsize=9, y=1.03)
    ax.set_xlabel(_plain(f"{whole.footprint_bytes / 1024:.1f} KiB in all \u2192 {view.fits(whole)}"),
                  fontsize=8, color=FIT_COLORS.get(view.fits(whole)))


def _level_colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["Blues"]
    return [cmap(0.15 + 0.75 * k / max(1, n - 1)) for k in range(n)]


def _draw_zoom(view: KernelView, ax, index: int, level: TileLevel, frame: tuple[int, ...]) -> None:
    """One level inside its parent's tile: the parent as the frame, the grid of its tiles, the
    first of them filled."""
    row_dim = _row_dim(level.tile, frame)
    rows, cols = _plane(frame, row_dim)
    r, c = _plane(level.tile, row_dim)
    _setup_tile_axes(ax, rows, cols, row_dim, len(frame))
    fit = view.fits(level)
    color = FIT_COLORS.get(fit, "#777777")
    if r and c and rows // r <= 64 and cols // c <= 64:  # the parent's grid of tiles (one collection each)
        if c < cols:
            ax.vlines(range(c, cols, c), 0, rows, color="#999999", linewidth=0.4)
        if r < rows:
            ax.hlines(range(r, rows, r), 0, cols, color="#999999", linewidth=0.4)
    ax.add_patch(Rectangle((0, 0), c, r, facecolor=color, edgecolor="black", linewidth=1.0, alpha=0.8))
    vec = _vector_len(view, level)
    if vec:
        ax.add_patch(Rectangle((0, 0), min(vec, c), min(1, r), facecolor="none", edgecolor="#1f3fbf",
                               linewidth=1.4, hatch="///"))
    ax.set_title(_plain(textwrap.fill(f"{index}: {_loops_label(level)}", 34)), fontsize=8, y=1.03)
    ax.set_xlabel(_plain(f"tile {'x'.join(map(str, level.tile))} \u00b7 {format_bytes(level.footprint_bytes)} "
                         f"\u2192 {fit}\n{level.iterations} tiles" + _outer_dims(level.tile, frame)),
                  fontsize=8, color=color)


def _vector_len(view: KernelView, level: TileLevel) -> int:
    """Length of the vectorized loop of the main statement, when it runs along the tile's
    contiguous dimension, for marking one vector in the innermost tile."""
    nest = view.nest
    if nest is None or level is not nest.levels[-1]:
        return 0
    for buf, _, n in nest.vectorized:
        if buf == nest.main_buffer:
            return n
    return 0


# --- footprints ----------------------------------------------------------------------------

def _draw_footprints(view: KernelView, ax) -> None:
    if view.nest is None:
        ax.axis("off")
        ax.text(0.5, 0.5, "no tile levels", ha="center", transform=ax.transAxes)
        return
    levels = view.nest.levels
    sizes = [max(1, lv.footprint_bytes) for lv in levels]
    ys = np.arange(len(levels))
    colors = [FIT_COLORS.get(view.fits(lv), "#777777") for lv in levels]
    ax.barh(ys, sizes, color=colors, edgecolor="black", linewidth=0.5)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=1024.0))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    ax.set_yticks(ys)
    ax.set_yticklabels([str(i) for i in range(len(levels))], fontsize=8)
    ax.set_ylabel("level", fontsize=8)
    ax.invert_yaxis()
    top = max(sizes + [c.size for c in view.caches] + [1]) * 4
    ax.set_xlim(min(sizes) / 2, top * 30)  # room for the labels right of the bars
    for lv, y, size in zip(levels, ys, sizes):
        label = f"{format_bytes(size)} \u00d7 {lv.iterations}   {textwrap.shorten(_loops_label(lv), 60, placeholder='...')}"
        ax.text(size * 1.15, y, _plain(label), va="center", fontsize=7)
    for cache in view.caches:
        ax.axvline(cache.size, color="#444444", linestyle="--", linewidth=0.8)
        ax.text(cache.size, 0.99, f"{cache.name} {format_bytes(cache.size)} ", fontsize=7, va="top", ha="right",
                rotation=90, color="#444444", transform=ax.get_xaxis_transform())
        if cache.shared_by > 1 and view.threads > 1:
            share = cache.size / min(cache.shared_by, view.threads)
            ax.axvline(share, color="#888888", linestyle=":", linewidth=0.8)
    ax.set_xlabel("bytes one tile touches (log scale); dashed: cache sizes, dotted: a shared cache's share per core",
                  fontsize=8)
    ax.set_title("footprint per tile level against the caches (color: where it fits)", fontsize=10, y=1.01)
    ax.minorticks_off()
    ax.tick_params(axis="x", labelsize=7)


# --- roofline ------------------------------------------------------------------------------

def _draw_roofline(view: KernelView, ax) -> None:
    roof = view.roofline
    ax.set_title("roofline", fontsize=10, y=1.01)
    if roof.bound_gflops is None or roof.flop <= 0:
        why = (f"this machine's peaks are not known for {view.task.target.key}" if roof.bound_gflops is None
               else "the program does no floating-point work")
        ax.axis("off")
        ax.text(0.5, 0.5, _plain(textwrap.fill(f"no roofline: {why}", 60)), ha="center", va="center",
                transform=ax.transAxes, fontsize=9)
        return
    ai = roof.intensity
    ridge = roof.ridge
    shown_ai = ai if math.isfinite(ai) else ridge * 100  # no memory traffic: far right
    lo, hi = min(shown_ai, ridge) / 10, max(shown_ai, ridge) * 10
    xs = np.geomspace(lo, hi, 256)
    ys = np.minimum(roof.peak_gflops, xs * roof.bandwidth_gbs)
    ax.loglog(xs, ys, color="black", linewidth=2)
    ax.axvline(ridge, color="#888888", linestyle=":", linewidth=0.8)
    ax.text(ridge, roof.peak_gflops * 1.15, f"ridge {ridge:.3g}", fontsize=7, ha="center")
    ax.text(lo * 1.3, lo * 1.3 * roof.bandwidth_gbs * 1.3, f"{roof.bandwidth_gbs:.1f} GB/s", fontsize=8,
            rotation=0)
    ax.text(hi / 1.3, roof.peak_gflops * 1.15, f"{roof.peak_gflops:.1f} GFLOP/s peak", fontsize=8, ha="right")
    bound = roof.bound_gflops
    ax.plot([shown_ai, shown_ai], [bound / 1e3 if bound else lo, bound], color="#1f77b4", linestyle="--",
            linewidth=0.8)
    ax.plot([shown_ai], [bound], marker="o", markerfacecolor="none", color="#1f77b4", markersize=8)
    label = f"bound: {roof.bound}, {bound:.1f} GFLOP/s"
    if roof.gflops is not None:
        ax.plot([shown_ai], [roof.gflops], marker="*", color="#d62728", markersize=14)
        share = (f"{roof.fraction:.1%} of the bound: the bound is suspect" if roof.suspect
                 else f"{roof.fraction:.1%} of the bound")
        label += f"\nkernel: {roof.gflops:.2f} GFLOP/s ({share})"
        low = min(roof.gflops, bound) / 10
    else:
        label += "\n(not measured)"
        low = bound / 100
    ax.set_ylim(max(low, 1e-6), roof.peak_gflops * 3)
    ax.text(0.98, 0.03, _plain(f"intensity {ai:.3g} FLOP/byte\n{label}"), transform=ax.transAxes, va="bottom",
            ha="right", fontsize=8, bbox={"facecolor": "white", "edgecolor": "#cccccc"})
    ax.set_xlabel("arithmetic intensity (FLOP per byte from memory)", fontsize=8)
    ax.set_ylabel("GFLOP/s", fontsize=8)
    ax.minorticks_off()
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # 0.1, 1, 10 (no math text to typeset)
    ax.xaxis.set_major_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    ax.grid(alpha=0.2)
    ax.tick_params(labelsize=7)


# --- text panels ---------------------------------------------------------------------------

def _draw_nest(view: KernelView, fig, box) -> None:
    lines = view.schedule.splitlines()
    if len(lines) > MAX_NEST_LINES:
        lines = lines[:MAX_NEST_LINES - 1] + [f"... ({len(lines) - MAX_NEST_LINES + 1} more lines)"]
    lines = [textwrap.shorten(line, 110, placeholder=" ...") if len(line) > 110 else line for line in lines]
    fig.text(box.x0, box.y1 + 0.012, "the loop nest (extents that run)", fontsize=10)
    size = 7 if len(lines) <= 34 else 6
    fig.text(box.x0, box.y1, _plain("\n".join(lines)), family="monospace", fontsize=size, va="top")


def _draw_facts(view: KernelView, fig, box) -> None:
    nest = view.nest
    facts = []
    if nest is not None:
        facts.append("vectorized: " + ("; ".join(vector_text(view, b, v, n) for b, v, n in nest.vectorized)
                                       or "no loop"))
        facts.append("parallel: " + (", ".join(f"{v} ({n})" for v, n in nest.parallel) or "no loop"))
        facts.append(f"main statement writes {nest.main_buffer}; tiles drawn in {nest.output}")
    facts.append("fused (compute_at): " + ("; ".join(view.fused) or "nothing"))
    if view.inlined:
        facts.append("inlined: " + ", ".join(view.inlined))
    if view.packed:
        facts.append("packed: " + "; ".join(view.packed))
    if view.traffic:
        facts.append("traffic per call: " + ", ".join(f"into {k} {format_bytes(v)}" for k, v in view.traffic.items()
                                                   if k != "memory")
                     + f"; from memory {format_bytes(view.traffic['memory'])}")
    facts += [f"note: {n}" for n in view.notes]
    text = "\n".join(textwrap.fill(f, 95, subsequent_indent="    ") for f in facts)
    fig.text(box.x0, box.y1 + 0.012, "what the nest does", fontsize=10)
    fig.text(box.x0, box.y1, _plain(text), fontsize=8, va="top")
