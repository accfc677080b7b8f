"""What people look at: progress bars, tables and tuning-curve plots."""

from __future__ import annotations

import math
from typing import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import sys

console = Console(width=None if sys.stdout.isatty() else 110)


class TuneProgress:
    """A progress bar over trials showing the best GFLOP/s so far."""

    def __init__(self, task, total: int, enabled: bool = True):
        self.task = task
        self.total = total
        self.enabled = enabled and total > 0
        self._progress: Progress | None = None

    def __enter__(self) -> "TuneProgress":
        if self.enabled:
            self._progress = Progress(
                TextColumn(f"[bold]{self.task.name}[/]"), BarColumn(), MofNCompleteColumn(),
                TextColumn("best {task.fields[best]}"), TimeElapsedColumn(),
                console=Console(stderr=True), transient=False,
            )
            self._progress.__enter__()
            self._id = self._progress.add_task("tune", total=self.total, best="-")
        return self

    def update(self, res) -> None:
        if self._progress is not None:
            best = f"{res.best_gflops:.1f} GFLOP/s" if res.best_cost < math.inf else "-"
            self._progress.update(self._id, completed=min(res.trials, self.total), best=best)

    def note(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(f"[yellow]{self.task.name}: {text}[/]")

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)


def format_seconds(sec: float | None) -> str:
    if sec is None or not math.isfinite(sec):
        return "-"
    if sec < 1e-3:
        return f"{sec * 1e6:.1f} us"
    if sec < 1:
        return f"{sec * 1e3:.3f} ms"
    return f"{sec:.3f} s"


def comparison_table(title: str, flop: float, rows: Sequence[tuple[str, float | None, str]]) -> Table:
    """Rows of (implementation, seconds, note) with GFLOP/s; "ansor speedup" is each row's time
    over the first row's (above 1: ansor, the first row, is faster)."""
    table = Table(title=title)
    table.add_column("implementation")
    table.add_column("time", justify="right")
    table.add_column("GFLOP/s", justify="right")
    table.add_column("ansor speedup", justify="right")
    table.add_column("note")
    base = rows[0][1] if rows else None
    for name, sec, note in rows:
        gf = f"{flop / sec / 1e9:.1f}" if sec and math.isfinite(sec) and flop else "-"
        ratio = f"{sec / base:.2f}x" if sec and base and math.isfinite(sec) and math.isfinite(base) else "-"
        table.add_row(name, format_seconds(sec), gf, ratio if name != rows[0][0] else "-", note)
    return table


def summary_table(summary: list[dict]) -> Table:
    table = Table(title="ansor records: best per workload and target")
    for col in ("workload", "name", "target", "records", "ok", "best time", "GFLOP/s"):
        table.add_column(col, justify="right" if col in ("records", "ok", "best time", "GFLOP/s") else "left")
    for row in summary:
        desc = row.get("workload") or {}
        name = desc.get("name", "") if isinstance(desc, dict) else ""
        gf = row.get("best_gflops")
        table.add_row(row["workload_key"][:16], name, row["target_key"], str(row["n_records"]), str(row["n_ok"]),
                      format_seconds(row.get("best_cost")), "-" if gf is None else f"{gf:.1f}")
    return table


def plot_curves(curves: dict[str, Sequence[tuple[int, float]]], path: str, title: str = "tuning curve") -> str:
    """Best GFLOP/s against trials, one line per curve; saves a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in curves.items():
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, label=label, linewidth=2)
    ax.set_xlabel("trials (programs measured)")
    ax.set_ylabel("best GFLOP/s so far")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
