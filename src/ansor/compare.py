"""ansor beside the other tools on one computation: one table, timed in turns in one process.

A number of ansor's against a number of PyTorch's measured in another process, an hour later,
says little: the machine's clock, its other load and its caches all moved. Here every
implementation runs on the same inputs in the same process, its output is checked against the
reference first (ansor's must agree, or nothing is timed), and the timing takes turns
(`baselines.time_in_turns`): each round times every implementation once, so a busy moment falls
on all of them alike. The result is a `Comparison`: a table (median time, spread of the rounds,
GFLOP/s, ansor's speedup over each) and a bar chart.

- `compare_workload(name, shape)`: a named workload (`ansor workloads`), ansor's best record
  for it (a quick search when the database has none) beside numpy, PyTorch eager and
  torch.compile where the workload has those implementations.
- `compare_model(path)`: an ONNX model compiled with its database's records beside the numpy
  reference executor, onnxruntime on the same file, and, given the PyTorch module it came from,
  PyTorch eager and torch.compile.
- `compare_calls(...)`: the same for any callables, for programs that declare their own
  computation (the tutorials do).

A tool that is not installed, or fails on the computation, is left out with a note saying why;
it never stops the comparison.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from ansor.baselines import time_in_turns, torch_available

#: Seconds of quiet before each turn when onnxruntime is compared.
ORT_PAUSE_S = 0.5

#: The baselines `compare_workload` and `compare_model` know, by the name `skip` takes.
BASELINES = ("numpy", "torch", "torch.compile", "onnxruntime")
#: The row of each baseline in the table.
ROW_NAMES = {"numpy": "numpy", "torch": "PyTorch eager", "torch.compile": "torch.compile",
             "onnxruntime": "onnxruntime"}


class WrongResultError(ValueError):
    """ansor's output disagrees with the reference: a comparison of its speed would be void."""


@dataclass(frozen=True)
class Entry:
    """One implementation's row: median seconds per call over the rounds, their spread
    ((max - min) / median), and what the row measures."""

    name: str
    seconds: float
    spread: float
    note: str = ""


@dataclass
class Comparison:
    """The result of one comparison. `entries[0]` is ansor's; `skipped` says which baselines are
    missing and why; `checked` how the outputs were checked."""

    title: str
    flop: float
    entries: list[Entry]
    skipped: list[str] = field(default_factory=list)
    checked: str = ""
    rounds: int = 0

    @property
    def ansor(self) -> Entry:
        """ansor's row (the first)."""
        return self.entries[0]

    def entry(self, name: str) -> Entry | None:
        """The row named `name`, None when that implementation was not timed."""
        return next((e for e in self.entries if e.name == name), None)

    def speedup(self, entry: Entry) -> float:
        """The entry's time over ansor's: above 1, ansor is faster."""
        return entry.seconds / self.ansor.seconds if self.ansor.seconds > 0 else math.nan

    def gflops(self, entry: Entry) -> float | None:
        """GFLOP/s of the entry, None when the computation's FLOPs are unknown."""
        return self.flop / entry.seconds / 1e9 if self.flop and entry.seconds > 0 else None

    def table(self):
        """The comparison as a rich Table (print it with `ansor.report.console`)."""
        from rich.table import Table

        from ansor.report import format_seconds

        table = Table(title=self.title)
        for col in ("implementation", "time (median)", "spread", "GFLOP/s", "ansor speedup", "note"):
            table.add_column(col, justify="left" if col in ("implementation", "note") else "right")
        for e in self.entries:
            gf = self.gflops(e)
            table.add_row(e.name, format_seconds(e.seconds), f"{e.spread:.0%}", "-" if gf is None else f"{gf:.1f}",
                          "-" if e is self.ansor else f"{self.speedup(e):.2f}x", e.note)
        return table

    def lines(self) -> list[str]:
        """The verdicts as plain lines, one per baseline timed, then one per baseline skipped."""
        from ansor.report import format_seconds

        out = []
        for e in self.entries[1:]:
            s = self.speedup(e)
            verdict = f"{s:.2f}x faster" if s >= 1 else f"{1 / s:.2f}x slower"
            out.append(f"ansor vs {e.name}: ansor {verdict} ({format_seconds(self.ansor.seconds)} vs "
                       f"{format_seconds(e.seconds)}, spreads {self.ansor.spread:.0%} / {e.spread:.0%})")
        out += [f"skipped {s}" for s in self.skipped]
        return out

    def save_chart(self, path: str) -> str:
        """A bar chart of the median times (shorter is faster), each bar labelled with its time
        and ansor's speedup over it; saved as a PNG at `path`."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from ansor.report import format_seconds

        names = [e.name for e in self.entries]
        ms = [e.seconds * 1e3 for e in self.entries]
        fig, ax = plt.subplots(figsize=(8, 1.2 + 0.55 * len(names)))
        colors = ["#d62728" if e is self.ansor else "#7f7f7f" for e in self.entries]
        bars = ax.barh(range(len(names)), ms, color=colors)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlabel("median time per call, ms (shorter is faster)")
        ax.set_title(self.title, fontsize=9)
        for bar, e in zip(bars, self.entries):
            label = format_seconds(e.seconds) + ("" if e is self.ansor else f"  (ansor {self.speedup(e):.2f}x)")
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + label, va="center", fontsize=8)
        ax.set_xlim(0, max(ms) * 1.45)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


def compare_calls(title: str, flop: float, ansor_call: Callable[[], Any], reference: Sequence[np.ndarray],
                  baselines: Mapping[str, Callable[[], Any] | None] | None = None,
                  notes: Mapping[str, str] | None = None, skipped: Sequence[str] = (), rounds: int = 7, min_repeat_s: float = 0.05,
                  ansor_name: str = "ansor", rtol: float | None = None) -> Comparison:
    """Check every call's output against `reference`, then time them in turns.

    ansor's output must match (else WrongResultError, and nothing is timed); a baseline that
    raises or disagrees is left out with a note. A baseline given as None is left out with the
    note in `notes` (e.g. "torch is not installed").

    Args:
        title: The table's title (the computation and its shape).
        flop: Floating-point operations of one call, for GFLOP/s (0: unknown).
        ansor_call: ansor's implementation, a call with no arguments returning the output(s).
        reference: The expected outputs (numpy arrays).
        baselines: Row name -> a call with no arguments returning the output(s) (numpy arrays
            or torch tensors), or None for a baseline that is not available.
        notes: Row name -> what the row measures, or why it is missing.
        skipped: Notes for baselines left out before this call.
        rounds: Timing rounds; every round times each implementation once.
        min_repeat_s: Each timing lasts at least this long (enough calls of a fast one).
        ansor_name: The name of ansor's row.
        rtol: The relative tolerance of ansor's check (None: the dtype's default); a long
            float32 reduction needs more (`ansor.measure.check.reduction_rtol`).
    """
    from ansor.measure import check_outputs

    baselines, notes = baselines or {}, notes or {}
    problem = check_outputs(_outputs(ansor_call()), list(reference), rtol=rtol)
    if problem:
        raise WrongResultError(f"{ansor_name} disagrees with the reference: {problem}")
    calls: dict[str, Callable[[], Any]] = {ansor_name: ansor_call}
    left_out = list(skipped)
    for name, call in baselines.items():
        if call is None:
            left_out.append(f"{name}: {notes.get(name, 'not available')}")
            continue
        try:
            problem = check_outputs(_outputs(call()), list(reference), rtol=1e-3, atol=1e-3)
        except Exception as exc:  # a baseline that cannot run this computation is a note, not a crash
            left_out.append(f"{name}: failed ({type(exc).__name__}: {_first_line(exc)})")
            continue
        if problem:
            left_out.append(f"{name}: its output disagrees with the reference ({problem})")
            continue
        calls[name] = call
    # onnxruntime's threads slow the turn after its own for a while (BENCHMARKS.md): pause first
    pause = ORT_PAUSE_S if "onnxruntime" in calls else 0.0
    timings = time_in_turns(calls, rounds=rounds, min_repeat_s=min_repeat_s, pause_s=pause)
    entries = [Entry(name, t.median, t.spread, notes.get(name, "")) for name, t in timings.items()]
    return Comparison(f"{title}; timed in turns ({rounds} rounds, medians)", flop, entries, left_out,
                      "every output checked against the reference before timing", rounds)


def torch_calls(fn: Callable[..., Any], inputs: Sequence[np.ndarray], skip: Collection[str] = ()
                ) -> tuple[dict[str, Callable[[], Any] | None], dict[str, str]]:
    """PyTorch eager and torch.compile of `fn` (a function of torch tensors) on copies of
    `inputs`, as `compare_calls` baselines, with notes. Without torch both are None with the
    reason; torch.compile compiles on its first call (in `compare_calls`' check, not timed)."""
    calls: dict[str, Callable[[], Any] | None] = {}
    notes: dict[str, str] = {}
    wanted = [k for k in ("torch", "torch.compile") if k not in skip]
    if not wanted:
        return calls, notes
    if not torch_available():
        for k in wanted:
            calls[ROW_NAMES[k]] = None
            notes[ROW_NAMES[k]] = "torch is not installed (pip install 'ansor[torch]')"
        return calls, notes
    import torch

    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
    threads = f"{torch.get_num_threads()} threads"
    if "torch" in wanted:
        calls["PyTorch eager"] = _no_grad(fn, tensors)
        notes["PyTorch eager"] = threads
    if "torch.compile" in wanted:
        calls["torch.compile"] = _no_grad(torch.compile(fn), tensors)
        notes["torch.compile"] = f"inductor, {threads}; compiled before timing"
    return calls, notes


def _no_grad(fn: Callable[..., Any], tensors: Sequence[Any]) -> Callable[[], Any]:
    import torch

    def call():
        with torch.no_grad():
            return fn(*tensors)

    return call


def compare_workload(name: str, shape: Sequence[int] | None = None, dtype: str = "float32",
                     options: Mapping[str, int | None] | None = None, database: Any = None,
                     rounds: int = 7, skip: Collection[str] = (), quick_trials: int | None = None) -> Comparison:
    """A named workload (see `ansor workloads`): the best program of `database` for it (a quick
    search first when it has none, see `ansor.build`), checked and timed in turns beside numpy,
    PyTorch eager and torch.compile where the workload has them.

    Args:
        name: The workload's name, e.g. "matmul".
        shape: Its dimensions (None: the workload's default shape).
        dtype: Element type.
        options: Workload options such as stride and padding (None: the workload's defaults).
        database: A record store or a path; None for the default database.
        rounds: Timing rounds.
        skip: Baselines to leave out, from `BASELINES`.
        quick_trials: Programs the quick search measures when there is no record (None: the
            default of `ansor.build`; 0: the untuned default schedule).
    """
    import ansor
    from ansor.store import open_store
    from ansor.measure.check import task_rtol
    from ansor.tuning.quick import has_record
    from ansor.workloads import WORKLOADS, make_task, workload_options

    _check_skip(skip)
    options = dict(options or {})
    task = make_task(name, shape, dtype, **options)
    w = WORKLOADS[name]
    kwargs = {} if quick_trials is None else {"quick_trials": quick_trials}
    db, owned = open_store(database)
    try:
        had_record = has_record(task, db)
        kernel = ansor.build(task, database=db, **kwargs)
    finally:
        if owned:
            db.close()
    inputs = task.random_inputs(seed=1)
    reference = task.reference_outputs(inputs)
    if kernel.record is None:
        origin = "untuned default schedule (no record)"
    elif had_record:
        origin = f"the database's best record{_measured_text(kernel)}"
    else:
        origin = f"no record: the best of a quick search, now recorded{_measured_text(kernel)}"
    notes = {"ansor": origin}
    baselines: dict[str, Callable[[], Any] | None] = {}
    if kernel.packs_ahead:  # the weights' tiled copy made once (bind) and in every call: both are real uses
        notes["ansor"] += f"; {', '.join(kernel.constant_inputs)} packed ahead of the calls"
        baselines["ansor, packing in every call"] = kernel.prepared(*inputs, include_prepack=True)
        notes["ansor, packing in every call"] = "kernel(...) without bind()"
    skipped = []
    if "numpy" not in skip:
        if w.numpy_fn is not None:
            baselines["numpy"] = lambda: w.numpy_fn(*inputs)
            notes["numpy"] = _numpy_note()
        else:
            skipped.append(f"numpy: no numpy implementation of {name}")
    if w.torch_fn is not None:
        opts = workload_options(name, shape, **options)
        fn = w.torch_fn
        calls, torch_notes = torch_calls(lambda *xs: fn(opts, *xs), inputs, skip)
        baselines.update(calls)
        notes.update(torch_notes)
    elif not {"torch", "torch.compile"} <= set(skip):
        skipped.append(f"PyTorch: no PyTorch implementation of {name}")
    if "onnxruntime" not in skip:
        skipped.append("onnxruntime: compares models (`ansor compare model.onnx`), not named workloads")
    dims = "x".join(map(str, task.spec["shape"]))
    return compare_calls(f"{name} {dims} {dtype} on {task.target.key}", task.flop, kernel.prepared(*inputs),
                         reference, baselines, notes, skipped, rounds,
                         rtol=task_rtol(task))


def compare_model(path: str, database: Any = None, rounds: int = 7, skip: Collection[str] = (),
                  module: Any = None, seed: int = 0) -> Comparison:
    """An ONNX model compiled with the records of `database` (untuned default schedules for
    tasks without one), checked against the numpy reference executor and timed in turns beside
    it, onnxruntime on the same file, and, when `module` (the torch.nn.Module the file was
    exported from) is given, PyTorch eager and torch.compile.

    Args:
        path: An .onnx file with static input shapes.
        database: A record store or a path; None for the default database. A path with no file
            is not created: every kernel then runs its untuned default schedule.
        rounds: Timing rounds.
        skip: Baselines to leave out, from `BASELINES`.
        module: The PyTorch module the file holds, for the PyTorch rows (None: no PyTorch rows).
        seed: Seed of the random inputs.
    """
    import ansor
    from ansor.records import RecordStore
    from ansor.store import default_database_path, open_store
    from ansor.graph import from_onnx
    from ansor.graph.reference import run_graph

    _check_skip(skip)
    if not str(path).endswith(".onnx"):
        raise ValueError(f"{path}: give an .onnx file (PyTorch models: ansor.graph.from_torch in Python)")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    graph = from_onnx(str(path))
    notes: dict[str, str] = {}
    if isinstance(database, RecordStore):
        compiled = ansor.build(graph, database=database, verbose=False)
    else:
        db_path = str(database) if database is not None else str(default_database_path())
        if os.path.exists(db_path):
            store, _ = open_store(db_path, create=False)
        else:
            store, _ = open_store(":memory:")
            notes["ansor"] = f"no database at {db_path}: "
        with store:
            compiled = ansor.build(graph, database=store, verbose=False)
    tuned = sum(1 for k in compiled.kernels.values() if k.record is not None)
    notes["ansor"] = notes.get("ansor", "") + (f"{tuned} of {len(compiled.kernels)} kernels tuned, "
                                               f"{len(compiled.tasks.fallbacks)} subgraphs on numpy")
    rng = np.random.default_rng(seed)
    inputs = [_random_input(rng, graph.types[name]) for name in graph.inputs]
    reference = run_graph(graph, inputs)
    baselines: dict[str, Callable[[], Any] | None] = {}
    skipped = []
    if "numpy" not in skip:
        baselines["numpy"] = lambda: run_graph(graph, inputs)
        notes["numpy"] = "ansor's reference executor, one numpy call per operator"
    if "onnxruntime" not in skip:
        baselines["onnxruntime"] = _onnxruntime_call(str(path), inputs, notes)
    if module is not None:
        calls, torch_notes = torch_calls(module.eval() if hasattr(module, "eval") else module, inputs, skip)
        baselines.update(calls)
        notes.update(torch_notes)
    elif not {"torch", "torch.compile"} <= set(skip):
        skipped.append("PyTorch: an .onnx file holds no PyTorch module (in Python: compare_model(path, "
                       "module=...))")
    flop = sum(t.flop * w for t, w in zip(compiled.tasks.tasks, compiled.tasks.weights))
    return compare_calls(f"{os.path.basename(str(path))} on {ansor.Target.host().key}", flop,
                         lambda: compiled(*inputs), reference, baselines, notes, skipped, rounds,
                         min_repeat_s=0.2)


def _onnxruntime_call(path: str, inputs: Sequence[np.ndarray], notes: dict[str, str]) -> Callable[[], Any] | None:
    try:
        import onnxruntime
    except ImportError:
        notes["onnxruntime"] = "onnxruntime is not installed (pip install 'ansor[models]')"
        return None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    try:
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # a file onnxruntime cannot load is a note, not a crash
        notes["onnxruntime"] = f"cannot load the file ({_first_line(exc)})"
        return None
    feed = {i.name: x for i, x in zip(session.get_inputs(), inputs)}
    notes["onnxruntime"] = f"CPU provider, {options.intra_op_num_threads} intra-op threads"
    return lambda: session.run(None, feed)


def _random_input(rng: np.random.Generator, t: Any) -> np.ndarray:
    if np.dtype(t.dtype).kind in "iu":
        return rng.integers(0, 2, size=t.shape).astype(t.dtype)  # token ids and masks: small valid values
    if t.dtype == "bool":
        return rng.random(t.shape) < 0.5
    return rng.standard_normal(t.shape).astype(t.dtype)


def _outputs(value: Any) -> list[np.ndarray]:
    """A call's output(s) as a list of numpy arrays (torch tensors converted)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    out = []
    for x in items:
        if hasattr(x, "detach"):
            x = x.detach().cpu().numpy()
        out.append(np.asarray(x))
    return out


def _measured_text(kernel: Any) -> str:
    """' (N GFLOP/s when measured)': the record's own figure, beside this run's."""
    cost = getattr(kernel.record, "median_cost", None)
    if cost and math.isfinite(cost) and kernel.task.flop:
        return f" ({kernel.task.flop / cost / 1e9:.1f} GFLOP/s when measured)"
    return ""


def _numpy_note() -> str:
    """Which BLAS numpy calls, when threadpoolctl can tell."""
    try:
        from threadpoolctl import threadpool_info

        blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    except Exception:  # an informational note only
        blas = []
    if not blas:
        return ""
    b = blas[0]
    return f"{b.get('internal_api', 'BLAS')}, {b.get('num_threads')} threads"


def _check_skip(skip: Collection[str]) -> None:
    unknown = sorted(set(skip) - set(BASELINES))
    if unknown:
        raise ValueError(f"unknown baseline {', '.join(map(repr, unknown))} to skip; the baselines are "
                         f"{', '.join(BASELINES)}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else type(exc).__name__
