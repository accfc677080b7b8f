"""A whole model compiled: tuned kernels, weights bound once, memory planned once.

`build_model(graph, database)` extracts the model's tasks (`model_tasks`), compiles each
distinct task once (its best record, else the default schedule), and lays out the calls: every
subgraph occurrence is one step that calls its kernel on fixed buffers (its own weights, packed
once; activations in the buffers of the memory plan). A call of the model then copies the
inputs in, runs the steps and copies the outputs out. When every step is a compiled CPU kernel
the steps run as one foreign call (`measure.sequence`, the entry points and pointers taken at
build time); otherwise each step is its own foreign-function call, a few microseconds each.

Subgraphs that have no te form run the numpy reference kernels on the same buffers; reshapes
of contiguous values are views and cost nothing. Both are said once at build time.

A compiled kernel cannot raise, so the ids of every gather (`embedding`, `index`) are scanned
with numpy before the step that reads them, under the reference executor's rule
(`reference.check_indices`): an id outside the table raises IndexError, as in PyTorch and
onnxruntime, instead of reading a clamped row. Ids that are model inputs are scanned before the
first step; ids computed by the model split the one foreign call where they are read.

`CompiledModel.check` (and `build_model(..., check=True)`) compares the compiled model with the
numpy executor on the graph as it was given, under the tolerance every tuned kernel passed
(`measure.check`).
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ansor.records import RecordStore
from ansor.graph.ir import Graph, Node
from ansor.graph.kv_cache import cache_write_call, state_inputs
from ansor.graph.memory_plan import MemoryPlan, PlannedStep, plan_memory
from ansor.graph.model_tasks import ModelPiece, ModelTasks, extract_tasks
from ansor.graph.reference import check_indices, gathered_indices, random_inputs, run_graph
from ansor.graph.threads import single_threaded_blas
from ansor.kernel import Kernel, build_many, input_array
from ansor.measure.check import check_outputs, task_rtol
from ansor.measure.sequence import KernelSequence
from ansor.memory import aligned_copy, aligned_empty
from ansor.target import Target
from ansor.torch_arrays import numpy_to_tensor, tensor_to_numpy
from ansor.tuning.callbacks import TuningCallback
from ansor.tuning.quick import model_quick_seconds, quick_search_tasks, tasks_without_records


class OutputMismatchError(AssertionError):
    """A compiled model's (or kernel's) output differs from its reference (the numpy executor,
    PyTorch eager) beyond the tolerance: a wrong answer, never to be used silently. `report`
    holds a model's comparison (None for a kernel's)."""

    def __init__(self, message: str, report: CheckReport | None = None):
        self.report = report
        super().__init__(message)


@dataclass(frozen=True)
class IndexCheck:
    """The ids one gather of a kernel step reads along an axis of `size`, scanned before the
    step runs (the kernel cannot raise). `ids` returns them as they are at that moment;
    `needs` names the model values it reads, so a check of model inputs alone can run before
    the first step."""

    node: Node
    position: int
    size: int
    negative: bool
    ids: Callable[[], np.ndarray]
    needs: frozenset[str]
    buffer: np.ndarray | None = field(default=None, compare=False)  # the buffer holding the ids, if any

    def __call__(self) -> None:
        ids = self.ids()
        if ids.size == 1:  # one id (a decoding step's token or position): no array reductions
            value = ids.item()
            if (-self.size if self.negative else 0) <= value < self.size:
                return
        check_indices(self.node, self.position, ids, self.size, self.negative)

    def same_scan(self, other: "IndexCheck") -> bool:
        """Whether `other` scans the same buffer under the same bounds (one scan does for both)."""
        return (self.buffer is not None and self.buffer is other.buffer and self.size == other.size
                and self.negative == other.negative)


@dataclass(frozen=True)
class OutputCheck:
    """One output compared with its reference (`name`: its position and graph value, as in
    "output 0 (%72)"): the largest absolute error, the largest error
    relative to the expected value (over the elements where that is not zero), and what
    `measure.check.check_outputs` says (None: within the tolerance)."""

    name: str
    max_abs_error: float
    max_rel_error: float
    mismatch: str | None

    @property
    def ok(self) -> bool:
        return self.mismatch is None


@dataclass(frozen=True)
class CheckReport:
    """A compiled model's outputs against a reference on one set of inputs, under `rtol` (the
    largest `task_rtol` of the model's kernels: its longest reduction) and the dtype's default
    absolute tolerance scaled by the output's largest value."""

    outputs: tuple[OutputCheck, ...]
    rtol: float | None

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def first_mismatch(self) -> str | None:
        """The first output out of tolerance, named, with its errors; None when all pass."""
        bad = next((o for o in self.outputs if not o.ok), None)
        if bad is None:
            return None
        return (f"{bad.name}: max abs error {bad.max_abs_error:.3g}, max rel error "
                f"{bad.max_rel_error:.3g} ({bad.mismatch})")

    def __str__(self) -> str:
        lines = [f"{'ok' if self.ok else 'MISMATCH'}: {len(self.outputs)} outputs compared"
                 + (f" (rtol {self.rtol:g})" if self.rtol is not None else "")]
        lines += [f"  {'ok      ' if o.ok else 'mismatch'}  {o.name}: max abs error {o.max_abs_error:.3g}, "
                  f"max rel error {o.max_rel_error:.3g}" for o in self.outputs]
        return "\n".join(lines)


@dataclass
class Step:
    """One subgraph occurrence at run time. kind: 'kernel', 'view' (a reshape: no work) or
    'fallback' (numpy reference kernels)."""

    piece: ModelPiece
    kind: str
    run: Callable[[], None]
    kernel: Kernel | None = None
    constants: tuple[np.ndarray, ...] = ()  # the weights in the kernel's order, aligned copies
    index_checks: tuple[IndexCheck, ...] = ()  # the ids its gathers read, scanned before it runs

    @property
    def name(self) -> str:
        return self.piece.subgraph.label


class CompiledModel:
    """The model as a callable: `model(*inputs)` takes numpy arrays (or torch CPU tensors) in
    the graph's input order and returns its output, or a tuple of them, of the same kind.

    Inputs follow the one rule of compiled callables (`ansor.kernel.input_array`, as for a
    `Kernel`): an array or tensor must have the dtype the graph declares (a float64 array for
    a float32 input raises TypeError naming the input), a Python list is converted. A gather id
    outside its table raises IndexError naming the operator and the ids.

    A graph with key/value caches (`cache_write`, `graph.kv_cache`) has *state*: its cache
    inputs live in buffers the model owns (`state`, zeroed by `reset_state`), which a call
    neither takes nor copies; the call takes the other inputs, and each step writes its new
    rows into the caches in place."""

    def __init__(self, tasks: ModelTasks, kernels: dict[str, Kernel], source: Graph | None = None):
        self.tasks = tasks
        self.graph: Graph = tasks.graph
        self.source: Graph = source if source is not None else tasks.graph  # as given to build, for `check`
        self.kernels = kernels
        g = self.graph
        self._nbytes = {n: int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
                        for n, t in g.types.items()}
        self._state_writes = state_inputs(g)  # cache input -> the value written into it
        self._ends = frozenset(self.call_inputs) | frozenset(g.outputs)  # what `buffer` gives
        planned = [PlannedStep(tuple(p.subgraph.inputs), tuple(p.subgraph.outputs), p.view_of, p.in_place)
                   for p in tasks.pieces]
        self.memory: MemoryPlan = plan_memory(planned, self._nbytes, g.inputs,
                                              [o for o in g.outputs if o in g.types])
        self._storage = [aligned_empty((max(size, 1),), np.uint8) for size in self.memory.sizes]
        self._values: dict[str, np.ndarray] = {name: self._view(name) for name in self.memory.storage}
        self._values.update(g.constants)
        for cache in self._state_writes:
            self._values[cache].fill(0)
        self._view_source = {p.subgraph.outputs[0]: p.view_of for p in tasks.pieces if p.view_of is not None}
        self.steps: list[Step] = [self._make_step(p) for p in tasks.pieces]
        self._runs = [s.run for s in self.steps if s.kind != "view"]
        self._segments = self._plan_segments()
        # the whole model as one foreign call, where every step is a compiled CPU kernel and
        # no ids computed by the model need scanning between them
        self._run_all = self._segments[0][1] if len(self._segments) == 1 else None
        self._has_fallbacks = bool(tasks.fallbacks)

    # ----------------------------------------------------------------------- construction

    def _view(self, name: str) -> np.ndarray:
        t = self.graph.types[name]
        size = self._nbytes[name]
        return self._storage[self.memory.storage[name]][:size].view(t.dtype).reshape(t.shape)

    def _make_step(self, piece: ModelPiece) -> Step:
        sub = piece.subgraph
        if piece.in_place:
            node = sub.nodes[0]
            cache, rows, position = (self._values[n] for n in node.inputs)
            checks = tuple(self._index_check(sub.graph, node, p, size, negative)
                           for p, size, negative in gathered_indices(node, [cache, rows, position]))
            return Step(piece, "cache_write", cache_write_call(node, cache, rows, position), index_checks=checks)
        if piece.view_of is not None:
            return Step(piece, "view", lambda: None)
        ins = [self._values[n] for n in sub.inputs]
        outs = [self._values[n] for n in sub.outputs]
        if piece.lowered is None:  # the numpy executor checks the ids itself
            return Step(piece, "fallback", _fallback_call(sub.graph, ins, outs))
        kernel = self.kernels[piece.key]
        constants = tuple(aligned_copy(a) for a in piece.lowered.constant_arrays())
        run = kernel.call_on([*ins, *constants, *outs])
        checks = tuple(self._index_check(sub.graph, node, position, size, negative)
                       for node in sub.graph.nodes
                       for position, size, negative in gathered_indices(node, [sub.graph.type_of(i)
                                                                                for i in node.inputs]))
        return Step(piece, "kernel", run, kernel, constants, checks)

    def _index_check(self, sub: Graph, node: Node, position: int, size: int, negative: bool) -> IndexCheck:
        """The scan of one gather's ids in subgraph `sub`: read from their buffer when the
        subgraph reads them from outside (or holds them as a constant), else computed from
        its inputs by the numpy executor (ids made inside a fused kernel exist nowhere else)."""
        value = node.inputs[position]
        if value in sub.constants:
            array = sub.constants[value]
            return IndexCheck(node, position, size, negative, lambda: array, frozenset())
        if value in sub.inputs:
            buffer = self._values[value]
            return IndexCheck(node, position, size, negative, lambda: buffer, frozenset({self._root(value)}), buffer)
        part = _producing_graph(sub, value)
        buffers = [self._values[n] for n in part.inputs]
        return IndexCheck(node, position, size, negative, lambda: run_graph(part, buffers)[0],
                          frozenset(self._root(n) for n in part.inputs))

    def _root(self, value: str) -> str:
        """The value whose memory `value` is (through reshapes that are views)."""
        while value in self._view_source:
            value = self._view_source[value]
        return value

    def _plan_segments(self) -> list[tuple[list[IndexCheck], Callable[[], None] | None, list[Callable[[], None]]]]:
        """The steps in runs between index checks: (checks, one foreign call of the runs or
        None, the runs). Checks of model inputs and constants go first, before any step; a
        check of ids the model computes starts a new run at the step that reads them."""
        given = set(self.graph.inputs)
        segments: list[tuple[list[IndexCheck], list[Callable[[], None]]]] = [([], [])]
        for step in self.steps:
            if step.kind == "view":
                continue
            late = [c for c in step.index_checks if not c.needs <= given]
            segments[0][0].extend(c for c in step.index_checks if c.needs <= given)
            if late and segments[-1][1]:
                segments.append(([], []))
            segments[-1][0].extend(late)
            segments[-1][1].append(step.run)
        return [(_distinct_scans(checks), _as_one_call(runs), runs) for checks, runs in segments]

    # ----------------------------------------------------------------------- calling

    @property
    def state(self) -> dict[str, np.ndarray]:
        """The key/value caches the model owns, by input name: its own buffers (writing into
        them sets the state; their addresses never change), empty for a model without caches."""
        return {name: self._values[name] for name in self._state_writes}

    @property
    def call_inputs(self) -> list[str]:
        """The inputs a call takes, in order: the graph's inputs less the state."""
        return [name for name in self.graph.inputs if name not in self._state_writes]

    def reset_state(self) -> None:
        """Zero every cache (a new sequence)."""
        for buffer in self.state.values():
            buffer.fill(0)

    def nbytes(self, value: str) -> int:
        """Bytes of a value of the graph (an input, output or intermediate)."""
        return self._nbytes[value]

    def __call__(self, *inputs: Any):
        g = self.graph
        names = self.call_inputs
        if len(inputs) != len(names):
            raise TypeError(f"the model takes {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
        as_torch = any(_is_torch(x) for x in inputs)
        arrays = [input_array(name, x, tuple(g.types[name].shape), g.types[name].dtype)
                  for name, x in zip(names, inputs)]
        for name, array in zip(names, arrays):
            np.copyto(self._values[name], array)
        self.run()
        results = [np.array(self._values[o]) for o in g.outputs]  # copies: the next call reuses the buffers
        if as_torch:
            results = [numpy_to_tensor(r) for r in results]
        return results[0] if len(results) == 1 else tuple(results)

    def buffer(self, value: str) -> np.ndarray:
        """The model's own memory for a graph input or output: write an input's there and
        `run`, then read an output's (valid until the next call). What a caller that prepares
        its inputs in place (a bucket's padding) uses instead of a call's copies."""
        if value not in self._ends:
            raise KeyError(f"{value!r} is neither an input a call takes nor an output of the model")
        return self._values[value]

    def run(self) -> None:
        """The steps, on the inputs already in their buffers (`buffer`)."""
        # numpy steps hold the BLAS to one thread: no BLAS workers left spinning on the kernels' cores
        with single_threaded_blas() if self._has_fallbacks else nullcontext():
            for checks, one_call, runs in self._segments:
                for check in checks:
                    check()
                if one_call is not None:
                    one_call()
                else:
                    for run in runs:
                        run()

    # ----------------------------------------------------------------------- checking

    @property
    def rtol(self) -> float | None:
        """The relative tolerance of a check: the largest `task_rtol` of the model's kernels
        (the loosest its own kernels were held to); None (the dtype's default) without any."""
        return max((task_rtol(k.task) for k in self.kernels.values()), default=None)

    def check(self, *inputs: Any, seed: int = 0) -> CheckReport:
        """Run the model once on `inputs` (default: random inputs of the graph's input types,
        `reference.random_inputs(seed)`, ids inside their tables) and compare every output with
        the numpy executor's on the graph as it was given to `build` (so the simplification
        passes are checked too). Returns the report; `report.ok` says whether all outputs are
        within the tolerance (`rtol`, see `CheckReport`)."""
        arrays = list(inputs) if inputs else random_inputs(self.source, seed=seed)
        if self._state_writes:  # the state as given (or random), then the call on the rest
            if len(arrays) != len(self.source.inputs):
                raise TypeError(f"check of a model with state takes every graph input, caches included "
                                f"({', '.join(self.source.inputs)})")
            given = dict(zip(self.source.inputs, arrays))
            for name, buffer in self.state.items():
                np.copyto(buffer, given[name])
            got = self(*(given[n] for n in self.call_inputs))
        else:
            got = self(*arrays)
        got = list(got) if isinstance(got, tuple) else [got]
        types = self.source.types
        given = [input_array(n, x, tuple(types[n].shape), types[n].dtype) for n, x in zip(self.source.inputs, arrays)]
        return compare_outputs(self, [_as_numpy(g) for g in got], run_graph(self.source, given))

    # ----------------------------------------------------------------------- reporting

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights as the kernels read them (aligned copies and packed layouts)."""
        return sum(c.nbytes for s in self.steps for c in s.constants)

    def summary(self) -> str:
        """One line per distinct task: occurrences, whether it is tuned, its record's latency."""
        tuned = sum(1 for k in self.kernels.values() if k.record is not None)
        lines = [f"{len(self.steps)} subgraphs, {len(self.kernels)} distinct kernels ({tuned} tuned), "
                 f"{len(self.tasks.fallbacks)} on numpy fallback; activations "
                 f"{_mib(self.memory.total_bytes)} planned (one buffer per value: "
                 f"{_mib(self.memory.naive_bytes)}), weights {_mib(self.weight_bytes)}"]
        for key, index in self.tasks.task_index.items():
            k = self.kernels[key]
            cost = f"{k.record.median_cost * 1e3:9.3f} ms" if k.record is not None else "    untuned"
            lines.append(f"  {cost}  x{self.tasks.weights[index]:<3d} {k.task.label}")
        for p in self.tasks.fallbacks:
            lines.append(f"   fallback      {p.subgraph.label}: {p.fallback_reason}")
        return "\n".join(lines)

    def profile(self, *inputs: Any, rounds: int = 20) -> list[tuple[str, str, float]]:
        """(subgraph name, kind, median seconds) of every step over `rounds` calls of the model
        on `inputs`, in execution order."""
        self(*inputs)
        times: list[list[float]] = [[] for _ in self.steps]
        for _ in range(rounds):
            for k, step in enumerate(self.steps):
                start = time.perf_counter()
                step.run()
                times[k].append(time.perf_counter() - start)
        return [(s.name, s.kind, statistics.median(t)) for s, t in zip(self.steps, times)]

    def export_library(self, path: str) -> str:
        """Write the model as one shared library with a C entry point (see `graph.export`)."""
        from ansor.graph.export import export_library

        return export_library(self, path)


def compare_outputs(model: CompiledModel, got: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> CheckReport:
    """The report of `got` (the model's outputs) against `expected`, output by output, under
    the model's tolerance (`CompiledModel.rtol` and the dtype's default absolute one)."""
    if len(got) != len(expected):
        raise ValueError(f"the compiled model gave {len(got)} outputs, the reference {len(expected)}")
    values = list(model.graph.outputs)
    names = [f"output {k}" + (f" (%{values[k]})" if k < len(values) else "") for k in range(len(got))]
    rtol = model.rtol
    results = []
    for name, out, want in zip(names, got, expected):
        out, want = np.asarray(out), np.asarray(want)
        mismatch = check_outputs([out], [want], rtol=rtol)
        abs_error, rel_error = _largest_errors(out, want) if out.shape == want.shape else (np.inf, np.inf)
        results.append(OutputCheck(name, abs_error, rel_error,
                                   None if mismatch is None else mismatch.removeprefix("output 0 ")))
    return CheckReport(tuple(results), rtol)


def build_model(graph: Graph, store: RecordStore | None = None, target: Target | None = None,
                verbose: bool = True, winograd: bool = True, check: bool = False,
                quick_seconds: float | None = None, callbacks: Sequence[TuningCallback] = ()) -> CompiledModel:
    """Compile `graph` with the best records of `store` for its tasks (numpy reference kernels
    for subgraphs without a te form). Tasks the store has no record of first get programs
    chosen by the cost model and measured (`tuning.quick.quick_search_tasks`: the pretrained
    model ranks, every task's default schedule is among the candidates, all recorded), for
    `quick_seconds` in all (None: `MODEL_QUICK_SECONDS`, or $ANSOR_MODEL_QUICK_SECONDS; 0 or
    no store: untuned default schedules); `callbacks` see that job (a progress display). With
    `winograd` False its 3x3 convolutions stay direct (tune the model the same way, since the
    two forms are different tasks). With `check`, the compiled model runs once on random inputs
    and is compared with the numpy executor (`CompiledModel.check`); a mismatch raises
    OutputMismatchError naming the first output out of tolerance. A CUDA target gives a
    `cuda_model.CudaModel` (every subgraph a CUDA kernel, or refused by name)."""
    if target is not None and target.kind == "cuda":
        from ansor.graph.cuda_model import build_cuda_model

        return build_cuda_model(graph, store, target, verbose=verbose, winograd=winograd, check=check)
    tasks = extract_tasks(graph, target, winograd=winograd)
    seconds = model_quick_seconds() if quick_seconds is None else quick_seconds
    if store is not None and not store.read_only and seconds > 0:
        missing = tasks_without_records(tasks.tasks, store)
        if missing:
            if verbose:
                print(f"ansor: {len(missing)} of {len(tasks.tasks)} kernels of the model have no record in "
                      f"{store.path}: choosing programs for them with the cost model, up to {seconds:.0f} s "
                      f"(quick_seconds= sets it, 0 builds them untuned; ansor.tune(graph) goes further)",
                      file=sys.stderr)
            quick_search_tasks(missing, store, seconds, callbacks=callbacks, timing=tasks.measured_as_in_model())
    compiled = build_many(tasks.tasks, store)
    kernels = {key: compiled[i] for key, i in tasks.task_index.items()}
    if verbose:
        untuned = sum(1 for k in compiled if k.record is None)
        if untuned:
            where = f" in {store.path}" if store is not None else " (no record store given)"
            print(f"ansor: {untuned} of {len(compiled)} kernels of the model have no tuning record{where} and "
                  f"run an untuned default schedule (tune the model into this database, or build from the "
                  f"database it was tuned into)", file=sys.stderr)
        if tasks.fallbacks:
            print(f"ansor: {len(tasks.fallbacks)} subgraphs run with numpy reference kernels "
                  f"(no compiled form): {tasks.fallbacks[0].fallback_reason}", file=sys.stderr)
    model = CompiledModel(tasks, kernels, source=graph)
    if check:
        report = model.check()
        if not report.ok:
            raise OutputMismatchError(f"the compiled model disagrees with the numpy reference on random "
                                      f"inputs: {report.first_mismatch}", report)
        if verbose:
            print(f"ansor: the compiled model matches the numpy reference on random inputs "
                  f"({', '.join(f'{o.name}: max abs error {o.max_abs_error:.2g}' for o in report.outputs)})",
                  file=sys.stderr)
    return model


def _as_one_call(runs: Sequence[Callable[[], None]]) -> Callable[[], None] | None:
    """All the steps as one foreign call (`measure.sequence`) when every one is a compiled CPU
    kernel called on fixed buffers; None otherwise (numpy fallbacks, GPU kernels)."""
    if not runs or not all(hasattr(run, "address") for run in runs):
        return None
    try:
        return KernelSequence([(run.address, run.pointers) for run in runs])
    except (ValueError, RuntimeError):  # a call with very many arguments, or no C compiler
        return None


def _distinct_scans(checks: Sequence[IndexCheck]) -> list[IndexCheck]:
    """The checks less those that scan a buffer an earlier one scans under the same bounds (a
    decoding step's position, read by every cache write): each is scanned once a call."""
    kept: list[IndexCheck] = []
    for check in checks:
        if not any(k.same_scan(check) for k in kept):
            kept.append(check)
    return kept


def _fallback_call(graph: Graph, ins: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> Callable[[], None]:
    def run() -> None:
        for out, value in zip(outs, run_graph(graph, list(ins))):
            np.copyto(out, value)

    return run


def _producing_graph(graph: Graph, value: str) -> Graph:
    """The nodes of `graph` that `value` depends on, as a graph of their own whose inputs are
    the inputs of `graph` they read and whose one output is `value`."""
    producers = graph.producers()
    needed: set[str] = set()
    pending = [value]
    while pending:
        name = pending.pop()
        if name in needed or name not in producers:
            continue
        needed.add(name)
        pending.extend(producers[name].inputs)
    nodes = [n for n in graph.nodes if n.output in needed]
    read = {i for n in nodes for i in n.inputs}
    return Graph(inputs=[i for i in graph.inputs if i in read], outputs=[value], nodes=nodes,
                 types={n: t for n, t in graph.types.items() if n in read or n in needed},
                 constants={c: a for c, a in graph.constants.items() if c in read})


def _largest_errors(got: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(max |got - expected|, max |got - expected| / |expected| where expected is not zero);
    a non-finite value where the reference has another counts as an infinite error."""
    g, e = got.astype(np.float64), expected.astype(np.float64)
    if e.size == 0:
        return 0.0, 0.0
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.abs(g - e)
        same = (g == e) | (np.isnan(g) & np.isnan(e))
        diff = np.where(same, 0.0, np.where(np.isnan(diff), np.inf, diff))
        nonzero = e != 0
        rel = diff[nonzero] / np.abs(e[nonzero])
    return float(diff.max()), float(rel.max()) if rel.size else 0.0


def _as_numpy(x: Any) -> np.ndarray:
    return tensor_to_numpy(x) if _is_torch(x) else np.asarray(x)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
