"""A compiled model as one shared library with a C entry point: runs without Python.

`export_library(model, "resnet18.so")` writes `resnet18.so` and `resnet18.h`. The library holds
every kernel of the model (each compiled on its own, under a unique name), the weights as the
kernels read them (embedded in the library's read-only data with the assembler's `.incbin`, so
there is no side file to lose), and a driver that replays the model's steps on the same memory
plan as the Python executor: one arena for the activations and the packed weight layouts,
allocated and packed once by `<name>_create`. The header documents every input and output.

    <name>_model* m = <name>_create();            // NULL if out of memory
    <name>_run(m, inputs, outputs);                  // arrays of pointers, in the header's order
    <name>_destroy(m);

A model with subgraphs on the numpy fallback cannot be exported (they need Python); the error
names them.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ansor.backend import backend_for, generate_source
from ansor.codegen.c_like import C_TYPES

if TYPE_CHECKING:
    from ansor.graph.compiled import CompiledModel

ALIGN = 64
_C_TYPES = C_TYPES  # the kernels' element types (bfloat16: its uint16_t bits)


class ExportError(RuntimeError):
    """The model cannot be written as a C library (a fallback subgraph, a compiler error)."""


def export_library(model: "CompiledModel", path: str | os.PathLike, name: str | None = None) -> str:
    """Write the shared library `path` and its header (`path` with `.h`); returns the library's
    path. `name` prefixes the C symbols (default: the file's stem, made an identifier)."""
    if model.state:
        raise ExportError(f"a model with key/value caches written in place ({', '.join(model.state)}) "
                          f"cannot be exported as a C library yet")
    fallbacks = [s.name for s in model.steps if s.kind == "fallback"]
    if fallbacks:
        raise ExportError(f"{len(fallbacks)} subgraphs run on the numpy fallback and cannot go into a C "
                          f"library: {', '.join(fallbacks)}")
    lib_path = Path(path).resolve()
    prefix = name or re.sub(r"\W", "_", lib_path.name.split(".")[0]) or "model"
    if prefix[0].isdigit():
        prefix = "m_" + prefix
    header_path = lib_path.with_suffix(".h")
    layout = _Layout(model)
    kernel_steps = [s for s in model.steps if s.kind == "kernel"]
    entries = {}   # kernel key -> (entry name, packed byte sizes)
    sources = []
    for key, kernel in model.kernels.items():
        entry = f"{prefix}_k{len(entries)}"
        source, _ = generate_source(kernel.state, kernel.task.target, entry)
        entries[key] = (entry, kernel.packed_nbytes)
        sources.append(source)
    lib_path.parent.mkdir(parents=True, exist_ok=True)
    header_path.write_text(_header(model, prefix))
    with tempfile.TemporaryDirectory(prefix="ansor-export-") as tmp:
        weights_file = Path(tmp) / "weights.bin"
        weights_file.write_bytes(layout.weights_blob())
        driver = _driver(model, prefix, layout, kernel_steps, entries, weights_file, header_path.name)
        _compile(model, sources, driver, Path(tmp), lib_path, header_path.parent)
    return str(lib_path)


class _Layout:
    """Offsets of every buffer: activations and packed layouts in one arena, weights in one blob."""

    def __init__(self, model: "CompiledModel"):
        self.storage_offset: list[int] = []
        end = 0
        for size in model.memory.sizes:
            self.storage_offset.append(end)
            end += _aligned(max(size, 1))
        self.packed_offset: dict[tuple[int, int], int] = {}  # (step, k) -> arena offset
        self.weight_offset: dict[tuple[int, int], int] = {}  # (step, k) -> blob offset
        self.weights: list[np.ndarray] = []
        blob_end = 0
        for index, step in enumerate(model.steps):
            if step.kind != "kernel":
                continue
            for k, nbytes in enumerate(step.kernel.packed_nbytes):
                self.packed_offset[(index, k)] = end
                end += _aligned(max(nbytes, 1))
            for k, array in enumerate(step.constants):
                self.weight_offset[(index, k)] = blob_end
                self.weights.append(array)
                blob_end += _aligned(array.nbytes)
        self.arena_bytes = end
        self.value_offset = {name: self.storage_offset[b] for name, b in model.memory.storage.items()}

    def weights_blob(self) -> bytes:
        parts = []
        for array in self.weights:
            data = np.ascontiguousarray(array).tobytes()
            parts.append(data + b"\0" * (_aligned(len(data)) - len(data)))
        return b"".join(parts) or b"\0"


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _io(model: "CompiledModel", names: list[str]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(n, model.graph.types[n].dtype, tuple(model.graph.types[n].shape)) for n in names]


def _header(model: "CompiledModel", prefix: str) -> str:
    guard = f"{prefix.upper()}_H"
    lines = [f"/* {prefix}: a model compiled by ansor. Inputs and outputs are dense C-order arrays. */",
             f"#ifndef {guard}", f"#define {guard}", "#include <stdbool.h>", "#include <stdint.h>", "",
             "#ifdef __cplusplus", 'extern "C" {', "#endif", ""]
    for what, names in (("input", model.graph.inputs), ("output", model.graph.outputs)):
        lines.append(f"/* {what}s, in this order: */")
        for k, (name, dtype, shape) in enumerate(_io(model, names)):
            dims = "x".join(map(str, shape)) or "scalar"
            lines.append(f"/*   {what} {k}: {_C_TYPES[dtype]} [{dims}] ({name!r}) */")
        lines.append(f"#define {prefix.upper()}_NUM_{what.upper()}S {len(names)}")
    lines += ["", f"typedef struct {prefix}_model {prefix}_model;", "",
              "/* Allocates the buffers and packs the weights; NULL when out of memory. */",
              f"{prefix}_model* {prefix}_create(void);",
              "/* Runs the model: inputs[k] and outputs[k] point to the arrays listed above. */",
              f"void {prefix}_run({prefix}_model* model, const void* const* inputs, void* const* outputs);",
              f"void {prefix}_destroy({prefix}_model* model);", "",
              "#ifdef __cplusplus", "}", "#endif", f"#endif  /* {guard} */", ""]
    return "\n".join(lines)


def _driver(model: "CompiledModel", prefix: str, layout: _Layout, kernel_steps, entries, weights_file: Path,
            header_name: str) -> str:
    step_index = {id(s): i for i, s in enumerate(model.steps)}
    out = [f'#include "{header_name}"', "#include <stdlib.h>", "#include <string.h>", "",
           "/* the weights as the kernels read them, embedded by the assembler */",
           f'__asm__(".section .rodata\\n.balign {ALIGN}\\n{prefix}_weights:\\n'
           f'.incbin \\"{_asm_path(weights_file)}\\"\\n.previous\\n");',
           f"extern const unsigned char {prefix}_weights[];", ""]
    for key, (entry, packed) in entries.items():
        n_args = len(model.kernels[key].task.inputs) + len(model.kernels[key].task.outputs) + len(packed)
        params = ", ".join(["void*"] * n_args)
        out.append(f"void {entry}({params});")
        if packed:
            out.append(f"void {entry}_prepack({params});")
    out += ["", f"struct {prefix}_model {{ unsigned char* arena; }};", ""]

    def args(step) -> str:
        index = step_index[id(step)]
        sub = step.piece.subgraph
        parts = [f"m->arena + {layout.value_offset[n]}" for n in sub.inputs]
        parts += [f"(void*)({prefix}_weights + {layout.weight_offset[(index, k)]})"
                  for k in range(len(step.constants))]
        parts += [f"m->arena + {layout.value_offset[n]}" for n in sub.outputs]
        parts += [f"m->arena + {layout.packed_offset[(index, k)]}"
                  for k in range(len(step.kernel.packed_nbytes))]
        return ", ".join(parts)

    out += [f"{prefix}_model* {prefix}_create(void) {{",
            f"  {prefix}_model* m = ({prefix}_model*)malloc(sizeof({prefix}_model));",
            "  if (!m) return NULL;",
            f"  m->arena = (unsigned char*)aligned_alloc({ALIGN}, {_aligned(max(layout.arena_bytes, 1))});",
            "  if (!m->arena) { free(m); return NULL; }"]
    for step in kernel_steps:
        entry, packed = entries[step.piece.key]
        if packed:
            out.append(f"  {entry}_prepack({args(step)});")
    out += ["  return m;", "}", "",
            f"void {prefix}_run({prefix}_model* m, const void* const* inputs, void* const* outputs) {{"]
    for k, (name, dtype, shape) in enumerate(_io(model, model.graph.inputs)):
        out.append(f"  memcpy(m->arena + {layout.value_offset[name]}, inputs[{k}], {model.nbytes(name)});")
    for step in kernel_steps:
        out.append(f"  {entries[step.piece.key][0]}({args(step)});  /* {step.name} */")
    for k, name in enumerate(model.graph.outputs):
        if name in layout.value_offset:
            source = f"m->arena + {layout.value_offset[name]}"
        else:  # an output that is a weight of the graph itself
            raise ExportError(f"output {name!r} is a constant of the graph; nothing computes it")
        out.append(f"  memcpy(outputs[{k}], {source}, {model.nbytes(name)});")
    out += ["}", "", f"void {prefix}_destroy({prefix}_model* m) {{", "  if (!m) return;",
            "  free(m->arena);", "  free(m);", "}", ""]
    return "\n".join(out)


def _asm_path(path: Path) -> str:
    text = str(path)
    if '"' in text or "\\" in text or "\n" in text:
        raise ExportError(f"cannot embed {text!r}: the path holds a quote or backslash")
    return text


def _compile(model: "CompiledModel", sources: list[str], driver: str, tmp: Path, lib_path: Path,
             include_dir: Path) -> None:
    """Each kernel to an object of its own (their static helpers stay private), then the driver
    and the objects linked into one library."""
    targets = {k.task.target.key: k.task.target for k in model.kernels.values()}
    target = next(iter(targets.values()))
    builder = backend_for(target).builder(target)
    compiler = shlex.split(builder.compiler)
    flags = [f for f in builder.cflags if f != "-shared"]
    objects = []
    for k, source in enumerate(sources):
        c_file, obj = tmp / f"kernel{k}.c", tmp / f"kernel{k}.o"
        c_file.write_text(source)
        _run([*compiler, *flags, "-c", str(c_file), "-o", str(obj)])
        objects.append(str(obj))
    driver_file = tmp / "driver.c"
    driver_file.write_text(driver)
    _run([*compiler, *flags, "-shared", f"-I{include_dir}", str(driver_file), *objects, "-o", str(lib_path), "-lm"])


def _run(command: list[str]) -> None:
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ExportError(f"{' '.join(command[:2])} ... failed:\n{proc.stderr[-2000:]}")
