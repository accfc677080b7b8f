"""A whole model compiled for an NVIDIA GPU: one CUDA source, device buffers planned once,
kernels launched in order by a C driver.

`build_cuda_model(graph, store, Target.cuda(...))` extracts the model's tasks as the CPU path
does (`model_tasks.extract_tasks`, so records tuned for the graph are found), takes each
distinct task's program (its best record, else the default schedule) and writes them into one
translation unit: every task's kernels in a namespace of their own, renamed `t<task>_<kernel>`
so two tasks' kernels never clash, and after them a driver with C entry points:

    int ansor_model_init(const void* const* weights)    allocate every buffer, upload weights
    int ansor_model_run(const void* const* inputs, void* const* outputs)
                                                       copy inputs in, launch all, copy outputs out
    int ansor_model_launch(void)                       launch all on the device buffers (timing)
    void ansor_model_release(void)
    const char* ansor_model_error(void)

Activations live in the buffers of the CPU path's memory plan (`memory_plan.plan_memory`: a
value's buffer is reused after its last reader; reshapes share their source's buffer); each
distinct task's scratch buffers are allocated once and shared by its occurrences, which run
one after another on one stream; each occurrence's weights are uploaded once.

The launches go through the macro `ANSOR_LAUNCH` and memory through the CUDA runtime API, so
the same text runs on the CPU under an emulation of both (the tests' `cuda_emulation.h`).
A model that cannot run entirely as CUDA kernels is refused by name: a subgraph with no te
form (the CPU path runs it with numpy) and gathers, whose ids a kernel cannot check.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ansor.graph.ir import Graph
from ansor.graph.memory_plan import MemoryPlan, PlannedStep, plan_memory
from ansor.graph.model_tasks import ModelTasks, extract_tasks
from ansor.graph.reference import gathered_indices, random_inputs, run_graph
from ansor.kernel import Kernel, build_many, input_array
from ansor.measure.check import task_rtol
from ansor.measure.cuda import nvcc_arch
from ansor.measure.gpu_module import GPUModule
from ansor.records import RecordStore
from ansor.target import Target

ENTRY_POINTS = ("ansor_model_init", "ansor_model_run", "ansor_model_launch", "ansor_model_release",
                "ansor_model_error")


class CudaModelError(RuntimeError):
    """The CUDA runtime reported an error while the model was set up or run."""


@dataclass(frozen=True)
class Launch:
    """One kernel launch of the model: the kernel's name in the model's source, its grid and
    block, and the device buffers (indices into `CudaModel.buffer_bytes`) it takes."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    buffers: tuple[int, ...]
    shared_bytes: int = 0       # dynamic shared memory of each block


def refusal(tasks: ModelTasks) -> str | None:
    """Why the model cannot run entirely as CUDA kernels, naming the subgraph; None if it can."""
    for piece in tasks.pieces:
        if piece.view_of is not None:
            continue
        sub = piece.subgraph
        if piece.lowered is None:
            return f"subgraph {sub.label} has no CUDA kernel ({piece.fallback_reason})"
        for node in sub.graph.nodes:
            if gathered_indices(node, [sub.graph.type_of(i) for i in node.inputs]):
                return (f"subgraph {sub.label} gathers with {node.op}: its ids are not checked on the "
                        f"device (an id out of range would read memory silently)")
    return None


class CudaModel:
    """The model as one CUDA program and its C driver; `model(*inputs)` runs it on the GPU
    (numpy in, numpy out) once it is compiled and loaded (`load`, or on the first call with
    nvcc for the target's architecture). `source` is the whole text, whatever the machine."""

    def __init__(self, tasks: ModelTasks, kernels: dict[str, Kernel], target: Target,
                 source_graph: Graph | None = None):
        reason = refusal(tasks)
        if reason is not None:
            raise NotImplementedError(f"CUDA model: {reason}")
        self.tasks, self.kernels, self.target = tasks, kernels, target
        self.graph: Graph = tasks.graph
        self.source_graph: Graph = source_graph if source_graph is not None else tasks.graph
        g = self.graph
        nbytes = {n: int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize for n, t in g.types.items()}
        steps = [PlannedStep(tuple(p.subgraph.inputs), tuple(p.subgraph.outputs), p.view_of) for p in tasks.pieces]
        self.memory: MemoryPlan = plan_memory(steps, nbytes, g.inputs, [o for o in g.outputs if o in g.types])
        self.buffer_bytes: list[int] = list(self.memory.sizes)      # activations first, then
        self.weights: list[np.ndarray] = []                          # weights, then scratch
        self.weight_buffers: list[int] = []
        self.modules = {key: GPUModule.parse(k.source) for key, k in kernels.items()}
        scratch: dict[tuple[str, str], int] = {}
        self.launches: list[Launch] = []
        for piece in tasks.pieces:
            if piece.view_of is not None:
                continue
            index = tasks.task_index[piece.key]
            module = self.modules[piece.key]
            where: dict[str, int] = {}
            values = [*piece.subgraph.inputs, *piece.subgraph.outputs]
            params = [*module.inputs[:len(piece.subgraph.inputs)], *module.outputs]
            for buf, value in zip(params, values):
                where[buf.name] = self.memory.storage[value]
            for buf, array in zip(module.inputs[len(piece.subgraph.inputs):], piece.lowered.constant_arrays()):
                where[buf.name] = self._new_buffer(array.nbytes)
                self.weights.append(np.ascontiguousarray(array))
                self.weight_buffers.append(where[buf.name])
            for buf in module.buffers:
                if buf.role == "temp":
                    if (piece.key, buf.name) not in scratch:
                        scratch[(piece.key, buf.name)] = self._new_buffer(buf.nbytes)
                    where[buf.name] = scratch[(piece.key, buf.name)]
            self.launches += [Launch(_kernel_name(index, k.name), k.grid, k.block, tuple(where[a] for a in k.args),
                                     k.shared_bytes) for k in module.kernels]
        self.source = self._write_source()
        self._lib: Any = None

    def _new_buffer(self, size: int) -> int:
        self.buffer_bytes.append(size)
        return len(self.buffer_bytes) - 1

    # ----------------------------------------------------------------------- the program

    def _write_source(self) -> str:
        includes: list[str] = ["#include <cuda_runtime.h>"]
        parts: list[str] = []
        for key, index in self.tasks.task_index.items():
            module = self.modules[key]
            body = module.source.split("\n", 1)[1]
            lines = []
            for line in body.split("\n"):
                if line.startswith("#include"):
                    includes += [] if line in includes else [line]
                else:
                    lines.append(line)
            text = "\n".join(lines)
            for k in module.kernels:
                text = re.sub(rf"\b{re.escape(k.name)}\b", _kernel_name(index, k.name), text)
            parts.append(f"/* task {index}: {self.kernels[key].task.label} */\n"
                         f"namespace ansor_task{index} {{\n{text}\n}}  // namespace ansor_task{index}\n")
        kernel_ns = {_kernel_name(i, k.name): f"ansor_task{i}" for key, i in self.tasks.task_index.items()
                     for k in self.modules[key].kernels}
        return "\n".join([*includes, "", *parts, _driver(self, kernel_ns)])

    @property
    def inputs(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def rtol(self) -> float | None:
        """The loosest relative tolerance any of the model's kernels was checked against."""
        return max((task_rtol(k.task) for k in self.kernels.values()), default=None)

    # ----------------------------------------------------------------------- compiling, running

    def compile(self, path: str | os.PathLike | None = None, nvcc: str = "nvcc") -> Path:
        """Build the model as a shared library with nvcc for the target's architecture (in the
        user's cache when no path is given; the same source is built once)."""
        if path is None:
            digest = hashlib.sha256(self.source.encode()).hexdigest()[:16]
            path = Path(tempfile.gettempdir()) / f"ansor-cuda-model-{digest}-{self.target.isa}.so"
        path = Path(path)
        if not path.exists():
            cu = path.with_suffix(".cu")
            cu.write_text(self.source)
            done = subprocess.run([nvcc, f"-arch={nvcc_arch(self.target.isa)}", "-O3", "--shared", "-Xcompiler", "-fPIC",
                                   "-o", str(path), str(cu), "-lcudart"], capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"nvcc could not build the CUDA model: {done.stderr[-2000:]}")
        return path

    def load(self, library: str | os.PathLike) -> CudaModel:
        """Open a built library of this model's source and set it up: every buffer allocated,
        the weights uploaded (a CudaModelError names the runtime's complaint, as without a GPU)."""
        lib = ctypes.CDLL(str(library))
        lib.ansor_model_init.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.ansor_model_run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
        lib.ansor_model_error.restype = ctypes.c_char_p
        self.release()
        weights = (ctypes.c_void_p * max(1, len(self.weights)))(*[w.ctypes.data for w in self.weights])
        if lib.ansor_model_init(weights):
            raise CudaModelError(f"CUDA model: setting up failed: {lib.ansor_model_error().decode()}")
        self._lib = lib
        return self

    def __call__(self, *inputs: Any):
        g = self.graph
        if len(inputs) != len(g.inputs):
            raise TypeError(f"the model takes {len(g.inputs)} inputs ({', '.join(g.inputs)}), got {len(inputs)}")
        arrays = [np.ascontiguousarray(input_array(n, x, tuple(g.types[n].shape), g.types[n].dtype))
                  for n, x in zip(g.inputs, inputs)]
        if self._lib is None:
            self.load(self.compile())
        outputs = [np.empty(tuple(g.types[o].shape), g.types[o].dtype) for o in g.outputs]
        ins = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        outs = (ctypes.c_void_p * max(1, len(outputs)))(*[o.ctypes.data for o in outputs])
        if self._lib.ansor_model_run(ins, outs):
            raise CudaModelError(f"CUDA model: a run failed: {self._lib.ansor_model_error().decode()}")
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def launch(self) -> None:
        """Launch every kernel on the inputs already on the device, without waiting (what a
        timing between two CUDA events measures)."""
        if self._lib is None or self._lib.ansor_model_launch():
            raise CudaModelError("CUDA model: not loaded, or a launch failed")

    def release(self) -> None:
        """Free the device buffers (a later call sets them up again)."""
        if self._lib is not None:
            self._lib.ansor_model_release()
            self._lib = None

    def check(self, *inputs: Any, seed: int = 0):
        """Run once on `inputs` (default: random ones) and compare with the numpy executor on
        the graph as given (`compiled.compare_outputs`)."""
        from ansor.graph.compiled import compare_outputs

        arrays = list(inputs) if inputs else random_inputs(self.source_graph, seed=seed)
        got = self(*arrays)
        got = list(got) if isinstance(got, tuple) else [got]
        return compare_outputs(self, got, run_graph(self.source_graph, [np.asarray(a) for a in arrays]))

    def summary(self) -> str:
        tuned = sum(1 for k in self.kernels.values() if k.record is not None)
        return (f"CUDA model for {self.target.isa}: {len(self.launches)} kernel launches of "
                f"{len(self.kernels)} distinct tasks ({tuned} tuned); {len(self.buffer_bytes)} device "
                f"buffers, {sum(self.buffer_bytes) / 2**20:.1f} MiB in all")


def _kernel_name(task_index: int, name: str) -> str:
    return f"t{task_index}_{name}"


def _driver(model: CudaModel, kernel_ns: dict[str, str]) -> str:
    """The C entry points: buffers allocated and weights uploaded once, inputs copied in, the
    launches in order, outputs copied out."""
    g = model.graph
    n = len(model.buffer_bytes)
    sizes = ", ".join(str(max(1, s)) for s in model.buffer_bytes)
    weights = ", ".join(map(str, model.weight_buffers)) or "0"
    ins = ", ".join(str(model.memory.storage[i]) for i in g.inputs) or "0"
    outs = ", ".join(str(model.memory.storage[o]) for o in g.outputs) or "0"
    in_bytes = ", ".join(str(int(np.prod(g.types[i].shape)) * np.dtype(g.types[i].dtype).itemsize) for i in g.inputs) or "0"
    out_bytes = ", ".join(str(int(np.prod(g.types[o].shape)) * np.dtype(g.types[o].dtype).itemsize) for o in g.outputs) or "0"
    launches, shared_limits = [], []
    for launch in model.launches:
        args = ", ".join(f"ansor_arg{{ansor_buffers[{b}]}}" for b in launch.buffers)
        kernel = f"{kernel_ns[launch.kernel]}::{launch.kernel}"
        dims = f"{launch.grid[0]}, {launch.grid[1]}, {launch.grid[2]}, {launch.block[0]}, {launch.block[1]}, {launch.block[2]}"
        if launch.shared_bytes:
            launches.append(f"  ANSOR_LAUNCH_SHARED({kernel}, {dims}, {launch.shared_bytes}, {args});")
            shared_limits.append(f"  if (ansor_failed(cudaFuncSetAttribute({kernel}, "
                                 f"cudaFuncAttributeMaxDynamicSharedMemorySize, {launch.shared_bytes}))) return 1;")
        else:
            launches.append(f"  ANSOR_LAUNCH({kernel}, {dims}, {args});")
    return f"""/* ---- the driver: {len(model.launches)} launches on {n} device buffers ---- */
#ifndef ANSOR_LAUNCH
#define ANSOR_LAUNCH(kernel, gx, gy, gz, bx, by, bz, ...) kernel<<<dim3(gx, gy, gz), dim3(bx, by, bz)>>>(__VA_ARGS__)
#endif
#define ANSOR_LAUNCH_SHARED(kernel, gx, gy, gz, bx, by, bz, shared, ...) \\
  kernel<<<dim3(gx, gy, gz), dim3(bx, by, bz), shared>>>(__VA_ARGS__)
struct ansor_arg {{ void* p; template <class T> operator T*() const {{ return (T*)p; }} }};
static void* ansor_buffers[{n}];
static const size_t ansor_buffer_bytes[{n}] = {{{sizes}}};
static const int ansor_weight_buffers[] = {{{weights}}};
static const int ansor_input_buffers[] = {{{ins}}};
static const size_t ansor_input_bytes[] = {{{in_bytes}}};
static const int ansor_output_buffers[] = {{{outs}}};
static const size_t ansor_output_bytes[] = {{{out_bytes}}};
static cudaError_t ansor_status = cudaSuccess;

static int ansor_failed(cudaError_t status) {{ if (status != cudaSuccess) ansor_status = status; return status != cudaSuccess; }}

extern "C" const char* ansor_model_error(void) {{ return cudaGetErrorString(ansor_status); }}

extern "C" void ansor_model_release(void) {{
  for (int i = 0; i < {n}; ++i) {{ if (ansor_buffers[i]) cudaFree(ansor_buffers[i]); ansor_buffers[i] = 0; }}
}}

extern "C" int ansor_model_init(const void* const* weights) {{
  ansor_model_release();
  for (int i = 0; i < {n}; ++i)
    if (ansor_failed(cudaMalloc(&ansor_buffers[i], ansor_buffer_bytes[i]))) return 1;
  for (int i = 0; i < {len(model.weight_buffers)}; ++i) {{
    int b = ansor_weight_buffers[i];
    if (ansor_failed(cudaMemcpy(ansor_buffers[b], weights[i], ansor_buffer_bytes[b], cudaMemcpyHostToDevice))) return 1;
  }}
{chr(10).join(shared_limits)}
  return 0;
}}

extern "C" int ansor_model_launch(void) {{
{chr(10).join(launches)}
  return ansor_failed(cudaGetLastError());
}}

extern "C" int ansor_model_run(const void* const* inputs, void* const* outputs) {{
  for (int i = 0; i < {len(g.inputs)}; ++i)
    if (ansor_failed(cudaMemcpy(ansor_buffers[ansor_input_buffers[i]], inputs[i], ansor_input_bytes[i], cudaMemcpyHostToDevice))) return 1;
  if (ansor_model_launch()) return 1;
  for (int i = 0; i < {len(g.outputs)}; ++i)
    if (ansor_failed(cudaMemcpy(outputs[i], ansor_buffers[ansor_output_buffers[i]], ansor_output_bytes[i], cudaMemcpyDeviceToHost))) return 1;
  return ansor_failed(cudaDeviceSynchronize());
}}
"""


def build_cuda_model(graph: Graph, store: RecordStore | None, target: Target, verbose: bool = True,
                     winograd: bool = True, check: bool = False, **_ignored: Any) -> CudaModel:
    """Compile `graph` for the CUDA `target` with the best records of `store` for its tasks
    (the untuned default schedule for a task without one, said once). With `check`, the model
    runs once on random inputs against the numpy executor (this needs a GPU)."""
    tasks = extract_tasks(graph, target, winograd=winograd)
    reason = refusal(tasks)
    if reason is not None:
        raise NotImplementedError(f"CUDA model: {reason}")
    compiled = build_many(tasks.tasks, store)
    kernels = {key: compiled[i] for key, i in tasks.task_index.items()}
    untuned = sum(1 for k in compiled if k.record is None)
    if verbose and untuned:
        print(f"ansor: {untuned} of {len(compiled)} CUDA kernels of the model have no record for {target.key} "
              f"and use the default schedule (tune the graph with this target to improve them)", file=sys.stderr)
    model = CudaModel(tasks, kernels, target, source_graph=graph)
    if check:
        from ansor.graph.compiled import OutputMismatchError

        report = model.check()
        if not report.ok:
            raise OutputMismatchError(f"the CUDA model disagrees with the numpy reference: {report.first_mismatch}",
                                      report)
    return model
