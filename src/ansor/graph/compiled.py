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
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ansor.records import RecordStore
from ansor.graph.ir import Graph
from ansor.graph.memory_plan import MemoryPlan, PlannedStep, plan_memory
from ansor.graph.model_tasks import ModelPiece, ModelTasks, extract_tasks
from ansor.graph.reference import run_graph
from ansor.graph.threads import single_threaded_blas
from ansor.kernel import Kernel, build_many
from ansor.measure.sequence import KernelSequence
from ansor.memory import aligned_copy, aligned_empty
from ansor.target import Target


@dataclass
class Step:
    """One subgraph occurrence at run time. kind: 'kernel', 'view' (a reshape: no work) or
    'fallback' (numpy reference kernels)."""

    piece: ModelPiece
    kind: str
    run: Callable[[], None]
    kernel: Kernel | None = None
    constants: tuple[np.ndarray, ...] = ()  # the weights in the kernel's order, aligned copies

    @property
    def name(self) -> str:
        return self.piece.subgraph.label


class CompiledModel:
    """The model as a callable: `model(*inputs)` takes numpy arrays (or torch CPU tensors) in
    the graph's input order and returns its output, or a tuple of them, of the same kind."""

    def __init__(self, tasks: ModelTasks, kernels: dict[str, Kernel]):
        self.tasks = tasks
        self.graph: Graph = tasks.graph
        self.kernels = kernels
        g = self.graph
        self._nbytes = {n: int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
                        for n, t in g.types.items()}
        planned = [PlannedStep(tuple(p.subgraph.inputs), tuple(p.subgraph.outputs), p.view_of)
                   for p in tasks.pieces]
        self.memory: MemoryPlan = plan_memory(planned, self._nbytes, g.inputs,
                                              [o for o in g.outputs if o in g.types])
        self._storage = [aligned_empty((max(size, 1),), np.uint8) for size in self.memory.sizes]
        self._values: dict[str, np.ndarray] = {name: self._view(name) for name in self.memory.storage}
        self._values.update(g.constants)
        self.steps: list[Step] = [self._make_step(p) for p in tasks.pieces]
        self._runs = [s.run for s in self.steps if s.kind != "view"]
        self._run_all = _as_one_call(self._runs)

    # ----------------------------------------------------------------------- construction

    def _view(self, name: str) -> np.ndarray:
        t = self.graph.types[name]
        size = self._nbytes[name]
        return self._storage[self.memory.storage[name]][:size].view(t.dtype).reshape(t.shape)

    def _make_step(self, piece: ModelPiece) -> Step:
        sub = piece.subgraph
        if piece.view_of is not None:
            return Step(piece, "view", lambda: None)
        ins = [self._values[n] for n in sub.inputs]
        outs = [self._values[n] for n in sub.outputs]
        if piece.lowered is None:
            return Step(piece, "fallback", _fallback_call(sub.graph, ins, outs))
        kernel = self.kernels[piece.key]
        constants = tuple(aligned_copy(a) for a in piece.lowered.constant_arrays())
        run = kernel.call_on([*ins, *constants, *outs])
        return Step(piece, "kernel", run, kernel, constants)

    # ----------------------------------------------------------------------- calling

    def nbytes(self, value: str) -> int:
        """Bytes of a value of the graph (an input, output or intermediate)."""
        return self._nbytes[value]

    def __call__(self, *inputs: Any):
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise TypeError(f"the model takes {len(g.inputs)} inputs ({', '.join(g.inputs)}), got {len(inputs)}")
        as_torch = any(_is_torch(x) for x in inputs)
        for name, x in zip(g.inputs, inputs):
            array = x.detach().cpu().numpy() if _is_torch(x) else np.asarray(x)
            t = g.types[name]
            if tuple(array.shape) != tuple(t.shape):
                raise ValueError(f"input {name!r}: expected shape {tuple(t.shape)}, got {tuple(array.shape)}")
            if not np.can_cast(array.dtype, t.dtype, casting="same_kind"):
                raise TypeError(f"input {name!r}: expected dtype {t.dtype}, got {array.dtype}")
            np.copyto(self._values[name], array, casting="same_kind")
        if self._run_all is not None:
            self._run_all()
        else:
            # numpy steps hold the BLAS to one thread: no BLAS workers left spinning on the kernels' cores
            with single_threaded_blas() if self.tasks.fallbacks else nullcontext():
                for run in self._runs:
                    run()
        results = [np.array(self._values[o]) for o in g.outputs]  # copies: the next call reuses the buffers
        if as_torch:
            import torch

            results = [torch.from_numpy(r) for r in results]
        return results[0] if len(results) == 1 else tuple(results)

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


def build_model(graph: Graph, store: RecordStore | None = None, target: Target | None = None,
                verbose: bool = True, winograd: bool = True) -> CompiledModel:
    """Compile `graph` with the best records of `store` for its tasks (default schedules
    for tasks without one; numpy reference kernels for subgraphs without a te form). With
    `winograd` False its 3x3 convolutions stay direct (tune the model the same way, since the
    two forms are different tasks)."""
    tasks = extract_tasks(graph, target, winograd=winograd)
    compiled = build_many(tasks.tasks, store)
    kernels = {key: compiled[i] for key, i in tasks.task_index.items()}
    if verbose:
        untuned = sum(1 for k in compiled if k.record is None)
        if untuned:
            print(f"ansor: {untuned} of {len(compiled)} kernels of the model have no tuning record and run "
                  f"an untuned default schedule (ansor.tune(graph) finds better ones)", file=sys.stderr)
        if tasks.fallbacks:
            print(f"ansor: {len(tasks.fallbacks)} subgraphs run with numpy reference kernels "
                  f"(no compiled form): {tasks.fallbacks[0].fallback_reason}", file=sys.stderr)
    return CompiledModel(tasks, kernels)


def _as_one_call(runs: Sequence[Callable[[], None]]) -> Callable[[], None] | None:
    """All the steps as one foreign call (`measure.sequence`) when every one is a compiled CPU
    kernel called on fixed buffers; None otherwise (numpy fallbacks, GPU kernels)."""
    if not runs or not all(hasattr(run, "address") for run in runs):
        return None
    try:
        return KernelSequence([(run.address, run.pointers) for run in runs])
    except (ValueError, RuntimeError):  # a call with very many arguments, or no C compiler
        return None


def _fallback_call(graph: Graph, ins: Sequence[np.ndarray], outs: Sequence[np.ndarray]) -> Callable[[], None]:
    def run() -> None:
        for out, value in zip(outs, run_graph(graph, list(ins))):
            np.copyto(out, value)

    return run


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
