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

`ansor tune`'s closing table (`compare_task`) and `ansor run-model` (`compare_compiled`) are
these same comparisons. A GPU program run by an OpenCL implementation on this CPU (PoCL) is
checked and timed, but its time says nothing of a GPU's: its table has no speedup column.

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
from ansor.torch_arrays import tensor_to_numpy

#: Seconds of quiet before each turn when onnxruntime is compared.
ORT_PAUSE_S = 0.5

#: The baselines `compare_workload` and `compare_model` know, by the name `skip` takes.
BASELINES = ("numpy", "torch", "torch.compile", "onnxruntime")
#: The row of each baseline in the table.
ROW_NAMES = {"numpy": "numpy", "torch": "PyTorch eager", "torch.compile": "torch.compile",
             "onnxruntime": "onnxruntime"}


#: (outputs, expected outputs) -> None when they agree, else what differs.
Check = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], "str | None"]

#: A whole model's output may differ from the reference by this share of the reference's RMS:
#: float32 rounding over many layers (and Winograd's transforms) moves single elements more
#: than one kernel's element-wise tolerance allows, while a wrong kernel moves them by far more.
MODEL_TOLERANCE = 1e-3


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
    correctness_only: str = ""  # why ansor's time is no speed figure (e.g. a GPU emulated); no ratios then

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

        table = Table(title=self.title, caption=self.correctness_only or None)
        columns = ("implementation", "time (median)", "spread", "GFLOP/s", "ansor speedup", "note")
        for col in columns:
            if col != "ansor speedup" or not self.correctness_only:
                table.add_column(col, justify="left" if col in ("implementation", "note") else "right")
        for e in self.entries:
            gf = self.gflops(e)
            cells = [e.name, format_seconds(e.seconds), f"{e.spread:.0%}", "-" if gf is None else f"{gf:.1f}"]
            if not self.correctness_only:
                cells.append("-" if e is self.ansor else f"{self.speedup(e):.2f}x")
            table.add_row(*cells, e.note)
        return table

    def lines(self) -> list[str]:
        """The verdicts as plain lines, one per baseline timed (where `correctness_only`, that
        note instead: no verdict of speed), then one per baseline skipped."""
        from ansor.report import format_seconds

        out = [self.correctness_only] if self.correctness_only else []
        for e in self.entries[1:] if not self.correctness_only else ():
            s = self.speedup(e)
            verdict = f"{s:.2f}x faster" if s >= 1 else f"{1 / s:.2f}x slower"
            out.append(f"ansor vs {e.name}: ansor {verdict} ({format_seconds(self.ansor.seconds)} vs "
                       f"{format_seconds(e.seconds)}, spreads {self.ansor.spread:.0%} / {e.spread:.0%})")
        out += [f"skipped {s}" for s in self.skipped]
        return out

    def save_chart(self, path: str) -> str:
        """A bar chart of the median times (shorter is faster), each bar labelled with its time
        and ansor's speedup over it (none where `correctness_only`); saved as a PNG at `path`."""
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
        ax.set_title(self.title + (f"\n{self.correctness_only}" if self.correctness_only else ""), fontsize=9)
        for bar, e in zip(bars, self.entries):
            ratio = "" if e is self.ansor or self.correctness_only else f"  (ansor {self.speedup(e):.2f}x)"
            label = format_seconds(e.seconds) + ratio
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + label, va="center", fontsize=8)
        ax.set_xlim(0, max(ms) * 1.45)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


def compare_calls(title: str, flop: float, ansor_call: Callable[[], Any], reference: Sequence[np.ndarray],
                  baselines: Mapping[str, Callable[[], Any] | None] | None = None,
                  notes: Mapping[str, str] | None = None, skipped: Sequence[str] = (), rounds: int = 7,
                  min_repeat_s: float = 0.05, ansor_name: str = "ansor", rtol: float | None = None,
                  check: Check | None = None, reference_name: str = "the reference",
                  also_check: Mapping[str, Sequence[np.ndarray]] | None = None,
                  correctness_only: str = "") -> Comparison:
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
        check: (outputs, expected) -> None or what differs, for every check instead of the
            element-wise tolerances (a whole model's: `model_check`).
        reference_name: What `reference` is, in the messages ("the numpy reference executor").
        also_check: Other references ansor's output must match too, by name (onnxruntime's
            output of the same model file), else WrongResultError naming it.
        correctness_only: When set, why ansor's time is no speed figure (a GPU program on an
            OpenCL implementation that runs on this CPU): the table shows no speedups.
    """
    from ansor.measure import check_outputs

    baselines, notes = baselines or {}, notes or {}
    ansor_check = check or (lambda out, exp: check_outputs(out, exp, rtol=rtol))
    baseline_check = check or (lambda out, exp: check_outputs(out, exp, rtol=1e-3, atol=1e-3))
    got = _outputs(ansor_call())
    for name, expected in {reference_name: reference, **(also_check or {})}.items():
        problem = ansor_check(got, list(expected))
        if problem:
            raise WrongResultError(f"{ansor_name} disagrees with {name}: {problem}")
    calls: dict[str, Callable[[], Any]] = {ansor_name: ansor_call}
    left_out = list(skipped)
    for name, call in baselines.items():
        if call is None:
            left_out.append(f"{name}: {notes.get(name, 'not available')}")
            continue
        try:
            problem = baseline_check(_outputs(call()), list(reference))
        except Exception as exc:  # a baseline that cannot run this computation is a note, not a crash
            left_out.append(f"{name}: failed ({type(exc).__name__}: {_first_line(exc)})")
            continue
        if problem:
            left_out.append(f"{name}: its output disagrees with {reference_name} ({problem})")
            continue
        calls[name] = call
    # onnxruntime's threads slow the turn after its own for a while (BENCHMARKS.md): pause first
    pause = ORT_PAUSE_S if "onnxruntime" in calls else 0.0
    timings = time_in_turns(calls, rounds=rounds, min_repeat_s=min_repeat_s, pause_s=pause)
    entries = [Entry(name, t.median, t.spread, notes.get(name, "")) for name, t in timings.items()]
    if also_check:
        checked = (f"{ansor_name}'s output checked against {' and '.join([reference_name, *also_check])}, every "
                   f"baseline's against {reference_name}, before timing")
    else:
        checked = f"every output checked against {reference_name} before timing"
    return Comparison(f"{title}; timed in turns ({rounds} rounds, medians)", flop, entries, left_out, checked,
                      rounds, correctness_only)


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
    from ansor.workloads import make_task

    _check_skip(skip)
    return compare_task(make_task(name, shape, dtype, **dict(options or {})), database, rounds, skip, quick_trials)


def compare_task(task: Any, database: Any = None, rounds: int = 7, skip: Collection[str] = (),
                 quick_trials: int | None = None) -> Comparison:
    """`compare_workload` of a named workload's Task (`ansor.workloads.make_task`), on its own
    target: what `ansor tune` prints after tuning. On an OpenCL implementation that runs on this
    CPU the comparison is of correctness only (`emulation_note`)."""
    import ansor
    from ansor.measure.check import task_rtol
    from ansor.store import open_store
    from ansor.tuning.quick import has_record
    from ansor.workloads import WORKLOADS, task_label, workload_options

    _check_skip(skip)
    spec = task.spec if isinstance(task.spec, dict) else {}
    if spec.get("workload") not in WORKLOADS:
        raise ValueError(f"{task.name!r} is not a named workload; compare a declared computation with "
                         f"compare_calls")
    name, options = spec["workload"], dict(spec.get("options") or {})
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
        opts = workload_options(name, spec.get("shape"), **options)
        fn = w.torch_fn
        calls, torch_notes = torch_calls(lambda *xs: fn(opts, *xs), inputs, skip)
        baselines.update(calls)
        notes.update(torch_notes)
    elif not {"torch", "torch.compile"} <= set(skip):
        skipped.append(f"PyTorch: no PyTorch implementation of {name}")
    if "onnxruntime" not in skip:
        skipped.append("onnxruntime: compares models (`ansor compare model.onnx`), not named workloads")
    dtype = spec.get("dtype", "float32")
    return compare_calls(f"{task_label(task)}{' float32' if dtype == 'float32' else ''} on {task.target.key}",
                         task.flop, kernel.prepared(*inputs), reference, baselines, notes, skipped, rounds,
                         rtol=task_rtol(task), correctness_only=emulation_note(task.target))


def emulation_note(target: Any) -> str:
    """What a comparison on `target` can say when its device is emulated on this CPU (a GPU
    program on PoCL or Oclgrind: its time says nothing of a GPU's); "" for real hardware."""
    if getattr(target, "kind", None) != "opencl":
        return ""
    from ansor.backend.gpu import opencl_platform_of

    emulator = {"Portable Computing Language": "PoCL", "Oclgrind": "Oclgrind"}.get(opencl_platform_of(target))
    return f"{emulator}: correctness only, not a speed figure" if emulator else ""


def load_model(path: str | os.PathLike[str]) -> Any:
    """The graph of a model file: an .onnx file, or a PyTorch model given as a Python file or
    module (`model.py`, `pkg.mod`, either with `:NAME`; see `load_torch_model`). A missing file
    or one that is not a model is a one-line error naming it (ValueError, FileNotFoundError)."""
    from ansor.graph import from_onnx

    path = str(path)
    if not path.endswith(".onnx"):
        return load_torch_model(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: a directory, not an ONNX file")
    try:
        return from_onnx(path)
    except onnx_errors() as exc:
        raise ValueError(f"{path}: not a readable ONNX model ({_first_line(exc)})") from None


def load_torch_model(spec: str) -> Any:
    """The graph of a PyTorch model named by `spec` (see `torch_model_and_inputs`), imported
    with `from_torch` in eval mode."""
    from ansor.graph import from_torch

    module, inputs = torch_model_and_inputs(spec)
    return from_torch(module.eval(), inputs)


def torch_model_and_inputs(spec: str) -> tuple[Any, tuple]:
    """The PyTorch module and example inputs named by `spec`: a Python file (`model.py`) or an
    importable module (`pkg.models`), optionally `:NAME`. NAME (default `model`) is a callable
    returning `(module, example_inputs)`, or an `nn.Module` beside `example_inputs` in the same
    file."""
    import importlib
    import importlib.util

    where, _, name = spec.partition(":")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise FileNotFoundError(f"{where}: no such file")
        loaded = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(where))[0], where)
        source = importlib.util.module_from_spec(loaded)
        try:
            loaded.loader.exec_module(source)
        except Exception as exc:  # the user's file: any error there is one line, naming it
            raise ValueError(f"{where}: running it failed: {type(exc).__name__}: {_first_line(exc)}") from None
    else:
        try:
            source = importlib.import_module(where)
        except ImportError as exc:
            raise ValueError(f"{spec}: give an .onnx file, a Python file or an importable module ({exc})") from None
    found = getattr(source, name or "model", None)
    if found is None:
        raise ValueError(f"{spec}: defines no {name or 'model'!r} (a function returning (module, example_inputs), "
                         f"or an nn.Module beside example_inputs)")
    try:
        import torch
    except ImportError:
        raise ValueError(f"{spec}: a PyTorch model needs torch (pip install torch==2.13.0)") from None
    if isinstance(found, torch.nn.Module):
        module, inputs = found, getattr(source, "example_inputs", None)
    elif callable(found):
        made = found()
        if not (isinstance(made, tuple) and len(made) == 2):
            raise ValueError(f"{spec}: {name or 'model'}() must return (module, example_inputs)")
        module, inputs = made
    else:
        raise ValueError(f"{spec}: {name or 'model'!r} is neither an nn.Module nor a function")
    if not isinstance(module, torch.nn.Module) or inputs is None:
        raise ValueError(f"{spec}: needs an nn.Module and example_inputs (a tensor or a tuple of them)")
    return module, inputs if isinstance(inputs, tuple) else (inputs,)


def onnx_errors() -> tuple[type[BaseException], ...]:
    """What reading a file that is no ONNX model raises: protobuf's decoding error, onnx's
    checker and shape-inference errors (none without onnx)."""
    found: list[type[BaseException]] = []
    try:
        from google.protobuf.message import Error as ProtobufError

        found.append(ProtobufError)
    except ImportError:
        pass
    try:
        from onnx.checker import ValidationError
        from onnx.shape_inference import InferenceError

        found += [ValidationError, InferenceError]
    except ImportError:
        pass
    return tuple(found)


def model_check(outputs: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> str | None:
    """None when each output is within MODEL_TOLERANCE of its reference's RMS everywhere (a NaN
    never is), else the worst output's error."""
    if len(outputs) != len(expected):
        return f"got {len(outputs)} outputs, expected {len(expected)}"
    for k, (got, want) in enumerate(zip(outputs, expected)):
        got, want = np.asarray(got), np.asarray(want)
        if got.shape != want.shape:
            return f"output {k} has shape {got.shape}, expected {want.shape}"
        if not want.size:
            continue
        wide = want.astype(np.float64)
        rms = float(np.sqrt(np.mean(np.square(wide)))) or 1.0
        err = float(np.max(np.abs(got.astype(np.float64) - wide))) / rms
        if not err <= MODEL_TOLERANCE:
            return f"output {k}: max error {err:.2e} of the reference's RMS (tolerance {MODEL_TOLERANCE:g})"
    return None


def compare_model(path: str, database: Any = None, rounds: int = 7, skip: Collection[str] = (),
                  module: Any = None, seed: int = 0, winograd: bool = True) -> Comparison:
    """An ONNX model compiled with the records of `database` (untuned default schedules for
    tasks without one), checked against the numpy reference executor and onnxruntime, and timed
    in turns beside them, and, when `module` (the torch.nn.Module the file was exported from) is
    given, PyTorch eager and torch.compile (see `compare_compiled`).

    Args:
        path: An .onnx file with static input shapes.
        database: A record store or a path; None for the default database. A path with no file
            is not created: every kernel then runs its untuned default schedule.
        rounds: Timing rounds.
        skip: Baselines to leave out, from `BASELINES`.
        module: The PyTorch module the file holds, for the PyTorch rows (None: no PyTorch rows).
        seed: Seed of the random inputs.
        winograd: As in `ansor.build`: 3x3 convolutions in Winograd form (as they were tuned).
    """
    import ansor
    from ansor.records import RecordStore
    from ansor.store import default_database_path, is_database_url, open_store

    _check_skip(skip)
    graph = load_model(path)
    note = ""
    if isinstance(database, RecordStore):
        compiled = ansor.build(graph, database=database, verbose=False, winograd=winograd)
    else:
        db_path = str(database) if database is not None else str(default_database_path())
        if is_database_url(db_path) or os.path.exists(db_path):
            store, _ = open_store(db_path, create=False)
        else:
            store, _ = open_store(":memory:")
            note = f"no database at {db_path}: "
        with store:
            compiled = ansor.build(graph, database=store, verbose=False, winograd=winograd)
    return compare_compiled(str(path), graph, compiled, rounds, skip, module, seed, note)


def compare_compiled(path: str, graph: Any, compiled: Any, rounds: int = 7, skip: Collection[str] = (),
                     module: Any = None, seed: int = 0, note: str = "") -> Comparison:
    """A compiled model (`ansor.build` of `graph`, read from the .onnx file `path`) on random
    inputs: its output checked against the numpy reference executor and, unless skipped,
    onnxruntime's on the same file (WrongResultError when it disagrees with either), then timed
    in turns beside the baselines not in `skip`. `note` starts ansor's row note."""
    import ansor
    from ansor.graph.quantized_outputs import one_step_check, one_step_summary, quantized_output_steps
    from ansor.graph.reference import run_graph

    _check_skip(skip)
    notes: dict[str, str] = {}
    tuned = sum(1 for k in compiled.kernels.values() if k.record is not None)
    notes["ansor"] = note + (f"{tuned} of {len(compiled.kernels)} kernels tuned, "
                             f"{len(compiled.tasks.fallbacks)} subgraphs on numpy")
    inputs = model_inputs(graph, seed)
    reference = run_graph(graph, inputs)
    baselines: dict[str, Callable[[], Any] | None] = {}
    also_check: dict[str, Sequence[np.ndarray]] = {}
    skipped = []
    if "numpy" not in skip:
        baselines["numpy"] = lambda: run_graph(graph, inputs)
        notes["numpy"] = "ansor's reference executor, one numpy call per operator"
    if "onnxruntime" not in skip:
        ort = baselines["onnxruntime"] = _onnxruntime_call(path, inputs, notes)
        if ort is not None:
            try:
                also_check["onnxruntime"] = _outputs(ort())
            except Exception as exc:  # a file onnxruntime cannot run is a note, not a crash
                notes["onnxruntime"] = f"cannot run the file ({_first_line(exc)})"
                baselines["onnxruntime"] = None
    if module is not None:
        calls, torch_notes = torch_calls(module.eval() if hasattr(module, "eval") else module, inputs, skip)
        baselines.update(calls)
        notes.update(torch_notes)
    elif not {"torch", "torch.compile"} <= set(skip):
        skipped.append("PyTorch: an .onnx file holds no PyTorch module (in Python: compare_model(path, "
                       "module=...))")
    flop = sum(t.flop * w for t, w in zip(compiled.tasks.tasks, compiled.tasks.weights))
    # a quantized model's outputs may differ by one quantization step (rounding ties), no more
    steps = quantized_output_steps(path) if path.endswith(".onnx") and os.path.isfile(path) else None
    target = ansor.Target.host()
    instructions = "" if steps is None else f" ({', '.join(target.dot_products) or 'no dot-product instructions'})"
    result = compare_calls(f"{os.path.basename(path)} on {target.key}{instructions}", flop,
                           lambda: compiled(*inputs), reference, baselines, notes, skipped, rounds,
                           min_repeat_s=0.2,
                           check=model_check if steps is None else one_step_check(steps, model_check),
                           reference_name="the numpy reference executor", also_check=also_check)
    if steps is not None:
        got = _outputs(compiled(*inputs))
        against = {"onnxruntime": also_check["onnxruntime"]} if "onnxruntime" in also_check else {
            "the numpy reference executor": reference}
        result.checked += "".join(f"; against {name}, {one_step_summary(got, want, steps)}"
                                  for name, want in against.items())
    return result


#: a bfloat16 model may differ from PyTorch's bf16 output by this share of its RMS: a few bf16
#: roundings (2^-8 each) taken the other way, carried through the layers
BF16_MODEL_TOLERANCE = 2.0 ** -5


def bf16_model_check(outputs: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> str | None:
    """`model_check` at `BF16_MODEL_TOLERANCE`: a bf16 model against PyTorch's bf16 outputs."""
    for k, (got, want) in enumerate(zip(outputs, expected)):
        wide, got64 = np.asarray(want).astype(np.float64), np.asarray(got).astype(np.float64)
        if got64.shape != wide.shape:
            return f"output {k} has shape {got64.shape}, expected {wide.shape}"
        rms = float(np.sqrt(np.mean(np.square(wide)))) or 1.0
        err = float(np.max(np.abs(got64 - wide))) / rms if wide.size else 0.0
        if not err <= BF16_MODEL_TOLERANCE:
            return f"output {k}: max error {err:.2e} of PyTorch's RMS (tolerance {BF16_MODEL_TOLERANCE:g})"
    return None if len(outputs) == len(expected) else f"got {len(outputs)} outputs, expected {len(expected)}"


def compare_bf16_model(module: Any, example_inputs: Sequence[Any], database: Any = None, rounds: int = 7,
                       skip: Collection[str] = (), name: str = "model") -> Comparison:
    """A PyTorch model run in bfloat16 (`module.to(torch.bfloat16)`, float inputs likewise):
    ansor's compiled model (the records of `database`, untuned default schedules elsewhere)
    checked against PyTorch eager in bf16 (`bf16_model_check`), then timed in turns beside it
    and beside PyTorch eager in float32. The title names the machine's dot-product
    instructions (vdpbf16ps is what ansor's bf16 matmuls use where the CPU has AVX512-BF16)."""
    import copy

    import torch

    import ansor
    from ansor.graph import from_torch
    from ansor.store import open_store

    _check_skip(skip)
    target = ansor.Target.host()
    as_bf16 = [x.to(torch.bfloat16) if x.is_floating_point() else x for x in example_inputs]
    inputs32 = [x.float() if x.is_floating_point() else x for x in example_inputs]
    model32 = copy.deepcopy(module).eval().float()  # .float() and .to() convert in place: copies
    model16 = copy.deepcopy(module).eval().to(torch.bfloat16)
    notes = {"PyTorch eager float32": f"{torch.get_num_threads()} threads, the model before .to(torch.bfloat16)"}
    baselines: dict[str, Callable[[], Any] | None] = {}
    if "torch" not in skip:
        baselines["PyTorch eager float32"] = _no_grad(model32, inputs32)
    graph = from_torch(model16, tuple(as_bf16))
    store, owned = open_store(database)
    try:
        compiled = ansor.build(graph, database=store, verbose=False)
    finally:
        if owned:
            store.close()
    with torch.no_grad():
        reference = _outputs(model16(*as_bf16))
    baselines["PyTorch eager bf16"] = _no_grad(model16, as_bf16)
    notes["PyTorch eager bf16"] = f"{torch.get_num_threads()} threads (oneDNN's bf16 kernels)"
    tuned = sum(1 for k in compiled.kernels.values() if k.record is not None)
    notes["ansor bf16"] = (f"{tuned} of {len(compiled.kernels)} kernels tuned, "
                           f"{len(compiled.tasks.fallbacks)} subgraphs on numpy")
    arrays = [tensor_to_numpy(x) for x in as_bf16]
    instructions = ", ".join(target.dot_products) or "no dot-product instructions"
    flop = sum(t.flop * w for t, w in zip(compiled.tasks.tasks, compiled.tasks.weights))
    # the float32 model's output is a different computation: compared loosely, not as a reference
    return compare_calls(f"{name} in bfloat16 on {target.key} ({instructions})", flop,
                         lambda: compiled(*arrays), reference, baselines, notes, (), rounds, min_repeat_s=0.2,
                         ansor_name="ansor bf16", check=bf16_model_check,
                         reference_name="PyTorch eager in bf16")


def model_inputs(graph: Any, seed: int = 0) -> list[np.ndarray]:
    """Random inputs of a model graph, one per graph input, reproducible from `seed`."""
    rng = np.random.default_rng(seed)
    return [random_input(rng, graph.types[name]) for name in graph.inputs]


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


def random_input(rng: np.random.Generator, t: Any) -> np.ndarray:
    """A random value of a model input's type: small valid ids for integers, normal floats."""
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
            x = tensor_to_numpy(x)
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
