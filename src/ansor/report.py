"""What people look at: progress bars, tables and tuning-curve plots."""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from typing import Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ansor.measure.errors import MeasureErrorNo
from ansor.tuning.callbacks import TuningCallback
from ansor.workloads import task_label, workload_label

console = Console(width=None if sys.stdout.isatty() else 110)


class TuneProgress(TuningCallback):
    """What a tuning job is doing, per program: a live line per task (phase, programs measured,
    best so far) on a terminal; one plain line per round otherwise (CI, a log file).

    `total` is the job's trials: the denominator of a single task's line, or of the line of the
    whole job above the tasks' when several are tuned (each task then shows the programs it
    measured, with no denominator: the scheduler decides how many it gets). "best so far" is the
    search's figure; the best after the leaders are measured again replaces it at the end.
    On a cluster, the programs each node measured follow the count."""

    def __init__(self, total: int = 0, enabled: bool = True, stream=None, timeout: float | None = None):
        self.total = total
        self.timeout = timeout
        self.enabled = enabled
        self._console = Console(stderr=True) if stream is None else Console(file=stream)
        self.live = self.enabled and self._console.is_terminal
        self._progress: Progress | None = None
        self._rows: dict[int, int] = {}  # id(tuner) -> progress row
        self._job_row: int | None = None  # the whole job's row, when several tasks are tuned
        self._tuners: list = []           # every task of the job, in start order
        self._ended = 0
        self._started = time.time()
        self._by_node: Counter = Counter()  # programs of the job per node that measured them (a cluster)

    def _row(self, tuner) -> int:
        """The tuner's row; the rows are made at the first phase, once every task has started,
        so that the job's row comes first."""
        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]{task.description}[/]"), BarColumn(), TextColumn("{task.fields[count]}"),
                TextColumn("{task.fields[phase]:9s} {task.fields[best]}"), TimeElapsedColumn(),
                console=self._console, transient=False)
            self._progress.start()
            if len(self._tuners) > 1:
                self._job_row = self._progress.add_task(f"all {len(self._tuners)} tasks", total=self.total or None,
                                                        count=self._job_count(), phase="", best="")
            for t in self._tuners:
                self._rows[id(t)] = self._progress.add_task(
                    task_label(t.task), total=(self.total or None) if self._job_row is None else None,
                    count=self._count(t), phase="", best="")
        return self._rows[id(tuner)]

    def _measured(self) -> int:
        return sum(t.result.trials for t in self._tuners)

    def _job_count(self) -> str:
        count = f"{self._measured()}/{self.total}" if self.total else f"{self._measured()} programs"
        return count + self._nodes_text()

    def _count(self, tuner) -> str:
        n = tuner.result.trials
        if self.total and len(self._tuners) == 1:
            return f"{n}/{self.total}" + self._nodes_text()
        return f"{n} program{'s' if n != 1 else ''}" + ("" if self._job_row is not None else self._nodes_text())

    def _nodes_text(self) -> str:
        """The programs each node of a cluster measured, as ' (by node: a 12, b 9)'; '' before any."""
        if not self._by_node:
            return ""
        return " (by node: " + ", ".join(f"{node} {n}" for node, n in sorted(self._by_node.items())) + ")"

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

    def on_phase(self, tuner, phase: str) -> None:
        if self.live:
            row = self._row(tuner)  # makes the display first
            self._progress.update(row, phase=phase)

    def on_result(self, tuner, result) -> None:
        node = result.record.node if result is not None else ""  # a cluster's measuring node
        if node:
            self._by_node[node] += 1
        if self.live:
            res, row = tuner.result, self._row(tuner)
            self._progress.update(row, completed=res.trials, count=self._count(tuner),
                                  best=f"best so far {best_text(res)}")
            if self._job_row is not None:
                self._progress.update(self._job_row, completed=self._measured(), count=self._job_count())

    def on_round_end(self, tuner, results) -> None:
        if self.enabled and not self.live:
            res = tuner.result
            errors = f", {error_summary(res.error_counts, self.timeout)}" if res.errors else ""
            job = f"; job {self._job_count()}" if len(self._tuners) > 1 else self._nodes_text()
            self._console.print(f"{task_label(tuner.task)}: round {tuner.job_rounds}, {res.trials} "
                                f"program{'s' if res.trials != 1 else ''} measured, best so far "
                                f"{best_text(res)}{errors}{job} ({time.time() - self._started:.0f} s)",
                                markup=False, highlight=False, soft_wrap=True)

    def on_end(self, tuner) -> None:
        if self._progress is not None:
            # the job's best now: its leaders were measured again and their runs pooled
            self._progress.update(self._row(tuner), phase="done", best=f"best {best_text(tuner.result)}")
            self._rows.pop(id(tuner), None)
            if not self._rows:
                self._progress.stop()
                self._progress = None
        self._ended += 1
        if self.enabled and len(self._tuners) > 1 and self._ended == len(self._tuners):
            self._console.print(task_table(self._tuners))

    def note(self, tuner, text: str) -> None:
        self._console.print(f"[yellow]{task_label(tuner.task)}: {text}[/]")


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
        table.add_row(task_label(t.task), f"{t.weight:g}", format_seconds(t.best_cost),
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
    if sec < 1e-6:
        return f"{sec * 1e9:.1f} ns"
    if sec < 1e-3:
        return f"{sec * 1e6:.1f} us"
    if sec < 1:
        return f"{sec * 1e3:.3f} ms"
    return f"{sec:.3f} s"


def format_bytes(n: float) -> str:
    """Bytes in the largest binary unit that keeps a number >= 1 (KiB, MiB, ... EiB)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"


def summary_table(summary: list[dict]) -> Table:
    """One row per workload and target: the best program by the median of its runs (the tuner
    measures its leaders again, and one lucky run must not make a best), how far its runs
    spread ((max - min) / median) and over how many runs, and the number of records."""
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


def plot_curves(curves: dict[str, Sequence[tuple[int, float]]], path: str, title: str = "tuning curve",
                goal: tuple[float, str] | None = None) -> str:
    """Best GFLOP/s against trials, one line per curve, and a dashed `goal` line (GFLOP/s,
    label) when a conclusion is drawn from it; saves a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in curves.items():
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, label=label, linewidth=2)
    if goal is not None:
        ax.axhline(goal[0], color="gray", linestyle="--", linewidth=1, label=goal[1])
    ax.set_xlabel("trials (programs measured)")
    ax.set_ylabel("best GFLOP/s so far")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
