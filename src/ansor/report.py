"""What people look at: progress bars, tables and tuning-curve plots."""

from __future__ import annotations

import math
import sys
import time
from typing import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ansor.tuning.callbacks import TuningCallback
from ansor.measure.errors import MeasureErrorNo

console = Console(width=None if sys.stdout.isatty() else 110)


class TuneProgress(TuningCallback):
    """What a tuning job is doing, per program: a live line per task (phase, programs measured,
    best so far) on a terminal; one plain line per round otherwise (CI, a log file)."""

    def __init__(self, total: int = 0, enabled: bool = True, stream=None, timeout: float | None = None):
        self.total = total
        self.timeout = timeout
        self.enabled = enabled
        self._console = Console(stderr=True) if stream is None else Console(file=stream)
        self.live = self.enabled and self._console.is_terminal
        self._progress: Progress | None = None
        self._rows: dict[int, int] = {}  # id(tuner) -> progress row
        self._tuners: list = []           # every task of the job, in start order
        self._ended = 0
        self._started = time.time()

    def _row(self, tuner) -> int:
        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]{task.description}[/]"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[phase]:9s} best {task.fields[best]}"), TimeElapsedColumn(),
                console=self._console, transient=False)
            self._progress.start()
        key = id(tuner)
        if key not in self._rows:
            self._rows[key] = self._progress.add_task(tuner.task.label, total=self.total or None,
                                                      phase="", best="-")
        return self._rows[key]

    def on_start(self, tuner) -> None:
        res = tuner.result
        self._tuners.append(tuner)
        if not self.enabled:
            return
        if res.prior_records:
            self.note(tuner, f"resuming: {res.prior_records} records of this workload in the database"
                             + (f", best {best_text(res)}" if res.best_cost < math.inf else ""))
        model = getattr(tuner.policy, "cost_model", None)
        base = " and the pretrained model" if model is not None and model.pretrained else ""
        if model is not None and model.num_prior:
            self.note(tuner, f"cost model starts from {model.num_prior} measured programs of other "
                             f"workloads in the database{base}")
        elif base:
            self.note(tuner, "cost model starts from the pretrained model")
        if self.live:
            self._row(tuner)

    def on_phase(self, tuner, phase: str) -> None:
        if self.live:
            self._progress.update(self._row(tuner), phase=phase)

    def on_result(self, tuner, result) -> None:
        if self.live:
            res = tuner.result
            self._progress.update(self._row(tuner), completed=res.trials, best=best_text(res))

    def on_round_end(self, tuner, results) -> None:
        if self.enabled and not self.live:
            res = tuner.result
            errors = f", {error_summary(res.error_counts, self.timeout)}" if res.errors else ""
            self._console.print(f"{tuner.task.label}: round {tuner.job_rounds}, {res.trials} program{'s' if res.trials != 1 else ''} measured, "
                                f"best {best_text(res)}{errors} ({time.time() - self._started:.0f} s)",
                                markup=False, highlight=False, soft_wrap=True)

    def on_end(self, tuner) -> None:
        if self._progress is not None:
            self._progress.update(self._row(tuner), phase="done")
            self._rows.pop(id(tuner), None)
            if not self._rows:
                self._progress.stop()
                self._progress = None
        self._ended += 1
        if self.enabled and len(self._tuners) > 1 and self._ended == len(self._tuners):
            self._console.print(task_table(self._tuners))

    def note(self, tuner, text: str) -> None:
        self._console.print(f"[yellow]{tuner.task.label}: {text}[/]")


def task_table(tuners: Sequence) -> Table:
    """Each task of a multi-task job: its weight, best latency, trials, and share of the job's
    estimated total (the weighted sum of the tasks' latencies, what the scheduler minimizes)."""
    total = sum(t.weight * t.best_cost for t in tuners)
    table = Table(title="tasks: estimated total " + (format_seconds(total) if math.isfinite(total)
                                                     else "unknown (a task has no program yet)"))
    for col in ("task", "weight", "best latency", "GFLOP/s", "trials", "share"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for t in tuners:
        res = t.result
        share = f"{t.weight * t.best_cost / total:.0%}" if math.isfinite(total) and total > 0 else "-"
        table.add_row(t.task.label, f"{t.weight:g}", format_seconds(t.best_cost),
                      f"{res.best_gflops:.1f}" if res.best_cost < math.inf else "-", str(res.trials), share)
    return table


def best_text(res) -> str:
    """The best so far as one figure: GFLOP/s and the median time with its runs' spread."""
    if res.best_cost == math.inf:
        return "-"
    spread = f", spread {res.best_spread:.0%}" if res.best_spread else ""
    return f"{res.best_gflops:.1f} GFLOP/s ({format_seconds(res.best_cost)}{spread})"


_ERROR_WORDS = {
    MeasureErrorNo.INSTANTIATION_ERROR: ("could not be lowered", "could not be lowered"),
    MeasureErrorNo.COMPILE_HOST: ("failed to compile", "failed to compile"),
    MeasureErrorNo.COMPILE_DEVICE: ("could not be loaded", "could not be loaded"),
    MeasureErrorNo.RUNTIME_DEVICE: ("crashed", "crashed"),
    MeasureErrorNo.WRONG_ANSWER: ("computed a wrong answer", "computed wrong answers"),
    MeasureErrorNo.BUILD_TIMEOUT: ("timed out compiling", "timed out compiling"),
    MeasureErrorNo.RUN_TIMEOUT: ("timed out", "timed out"),
    MeasureErrorNo.UNKNOWN_ERROR: ("failed for an unknown reason", "failed for an unknown reason"),
}


def error_summary(counts, timeout: float | None = None) -> str:
    """'1 program timed out (10 s), 2 programs failed to compile' from error code counts."""
    parts = []
    for code, n in sorted(counts.items()):
        one, many = _ERROR_WORDS.get(code, (f"failed (error {code})", f"failed (error {code})"))
        text = f"{n} program{'s' if n != 1 else ''} {one if n == 1 else many}"
        if code == MeasureErrorNo.RUN_TIMEOUT and timeout:
            text += f" ({timeout:g} s)"
        parts.append(text)
    return ", ".join(parts)


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
    """One row per workload and target: the best program by the median of its runs (the tuner
    measures its leaders again, and one lucky run must not make a best), how far its runs
    spread ((max - min) / median) and over how many runs, and the number of records."""
    from ansor.workloads import workload_label

    table = Table(title="ansor records: best per workload and target")
    right = ("records", "ok", "best (median)", "spread (runs)", "GFLOP/s")
    for col in ("workload", "key", "target", "records", "ok", "best (median)", "spread (runs)", "GFLOP/s"):
        table.add_column(col, justify="right" if col in right else "left")
    for row in summary:
        gf = row.get("best_gflops")
        runs = row.get("best_runs") or ()
        best = row.get("best_cost")
        spread = "-"
        if runs and best:
            share = (max(runs) - min(runs)) / best
            spread = f"{share:.0%} ({len(runs)})" if share >= 0.1 else f"{share:.1%} ({len(runs)})"
        table.add_row(workload_label(row.get("workload")), row["workload_key"][:12], row["target_key"],
                      str(row["n_records"]), str(row["n_ok"]), format_seconds(best), spread,
                      "-" if gf is None else f"{gf:.1f}")
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
