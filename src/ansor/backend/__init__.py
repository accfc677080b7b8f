"""Backends: what it takes to run a program on one kind of target.

A backend is chosen by the target's kind and is one unit: the capabilities it offers programs
(read by passes and legality checks instead of the kind), the lowering passes that fit the loop
IR to the hardware (run before features are extracted, so the cost model sees the program that
runs), the printer (IR to source), the builder (source to library), and the loader and runner
that call a built kernel by its calling convention. Nothing outside this package asks a
target's kind which code to generate.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable

from ansor.lower import ir
from ansor.lower.lower import lower as lower_state
from ansor.target import Target

if TYPE_CHECKING:
    from ansor.schedule.state import State


@dataclass(frozen=True)
class Capabilities:
    """What a target offers a program, as passes and legality checks need it."""

    vector_bytes: int = 0             # width of a vector register (0: no vectors)
    vector_registers: int = 0         # architectural vector registers (a register tile must fit)
    parallel_loops: bool = False      # `parallel` loops run on several cores
    threads: int = 0                  # ... on this many threads (0: the runtime's default)
    thread_binding: bool = False      # loops may be bound to blockIdx / vthread / threadIdx
    shared_memory_bytes: int = 0      # per block; 0: no `shared` buffer scope
    max_threads_per_block: int = 0
    warp_size: int = 0
    max_vthread: int = 0              # virtual threads per thread (their product on any path)
    local_memory_bytes: int = 0       # private arrays per thread before they spill

    @property
    def has_shared_memory(self) -> bool:
        return self.shared_memory_bytes > 0


LoweringPass = Callable[[ir.PrimFunc, Capabilities], ir.PrimFunc]
Printer = Callable[[ir.PrimFunc, Capabilities], tuple[str, str]]  # -> (source, entry name)


@dataclass(frozen=True)
class BuiltProgram:
    """One program's source and what its build gave (`build` is None when the program could
    not be lowered: `error` says why)."""

    source: str | None
    entry: str
    build: Any  # a measure.BuildResult
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.build is not None and self.build.error_no == 0 and self.build.lib_path is not None

    @property
    def message(self) -> str:
        return self.error if self.build is None else self.build.error_msg


@dataclass(frozen=True)
class Backend:
    """One target kind's code generation and execution."""

    kind: str                                              # the `Target.kind` it serves
    language: str                                          # of the source its printer writes
    capabilities_of: Callable[[Target], Capabilities]
    passes: tuple[LoweringPass, ...]                       # run in order on the lowered IR
    printer: Printer
    builder: Callable[..., Any]     # (target) -> a builder: `.build(sources)` -> libraries, cached
    loader: Callable[[str, str], Any]  # (library path, entry name) -> a kernel that follows the
                                       # calling convention (`measure.KernelLibrary`'s, on the CPU)
    runner: Callable[..., Any]      # makes a runner: checks and times built kernels in isolation
    # printed in turn for a program whose build ran out of registers (the device compiler
    # reported a spill), each asking less of them; the first source that builds is the program's
    refit_printers: tuple[Printer, ...] = ()

    def capabilities(self, target: Target) -> Capabilities:
        return _capabilities(self, target)

    def run_passes(self, func: ir.PrimFunc, target: Target) -> ir.PrimFunc:
        """The backend's lowering passes applied to an already lowered function."""
        caps = self.capabilities(target)
        for fitted in self.passes:
            func = fitted(func, caps)
        return func

    def lower(self, state: State, target: Target, name: str = "kernel") -> ir.PrimFunc:
        """The loop IR of a complete program as it runs on `target`: lowered, then the passes."""
        return self.run_passes(lower_state(state, name), target)

    def generate_source(self, state: State, target: Target, name: str = "kernel") -> tuple[str, str]:
        """(source text, entry function name) of a complete program."""
        return self.printer(self.lower(state, target, name), self.capabilities(target))

    def build(self, states: Sequence[State], target: Target, name: str | Sequence[str] = "kernel",
              builder: Any = None) -> list[BuiltProgram]:
        """Each program lowered, printed (its entry called `name`, or its own of a list of
        names) and compiled (in parallel, by `builder` or the target's own). Never raises for a
        bad program: a lowering error or a failed build is in its `BuiltProgram`. A build that
        spilled registers is printed again by `refit_printers` until one builds, so the source
        kept is one that compiles clean."""
        builder = builder or self.builder(target)
        caps = self.capabilities(target)
        funcs: list[ir.PrimFunc | None] = []
        out: list[BuiltProgram] = []
        names = [name] * len(states) if isinstance(name, str) else list(name)
        for state, entry_name in zip(states, names, strict=True):
            try:
                func = self.lower(state, target, entry_name)
                source, entry = self.printer(func, caps)
            except Exception as exc:  # a program that cannot be lowered is data, not a crash
                funcs.append(None)
                out.append(BuiltProgram(None, "", None, f"{type(exc).__name__}: {exc}"))
                continue
            funcs.append(func)
            out.append(BuiltProgram(source, entry, None))
        pending = [i for i, p in enumerate(out) if p.source is not None]
        printers = iter(self.refit_printers)
        while pending:
            for i, result in zip(pending, builder.build([out[i].source for i in pending])):
                out[i] = BuiltProgram(out[i].source, out[i].entry, result)
            printer = next(printers, None)
            pending = [i for i in pending if _spilled(out[i].build)] if printer else []
            for i in pending:
                source, entry = printer(funcs[i], caps)
                out[i] = BuiltProgram(source, entry, None)
        return out


def _spilled(result: Any) -> bool:
    """Whether a failed build failed for registers: the device compiler spilled some."""
    return result.error_no != 0 and any(
        usage.get("spill_stores") or usage.get("spill_loads") for usage in (result.resources or {}).values())


@lru_cache(maxsize=64)
def _capabilities(backend: Backend, target: Target) -> Capabilities:
    return backend.capabilities_of(target)


_BACKENDS: dict[str, Backend] = {}
_BUILT_IN = {"cpu": "ansor.backend.cpu", "cuda": "ansor.backend.gpu", "opencl": "ansor.backend.gpu"}  # kinds whose module registers a backend when imported


def register_backend(backend: Backend) -> None:
    """Make `backend` the one for targets of its kind."""
    _BACKENDS[backend.kind] = backend


def backend_for(target: Target) -> Backend:
    """The backend of the target's kind; a clear error for a kind none serves."""
    found = _BACKENDS.get(target.kind)
    if found is None and target.kind in _BUILT_IN:
        importlib.import_module(_BUILT_IN[target.kind])
        found = _BACKENDS.get(target.kind)
    if found is None:
        known = sorted(set(_BACKENDS) | set(_BUILT_IN))
        raise ValueError(f"no backend for target kind {target.kind!r}; available: {', '.join(known)}")
    return found


def lower_for(state: State, target: Target, name: str = "kernel") -> ir.PrimFunc:
    """The loop IR of a complete program as it runs on `target` (its backend's passes applied)."""
    return backend_for(target).lower(state, target, name)


def generate_source(state: State, target: Target, name: str = "kernel") -> tuple[str, str]:
    """(source text, entry function name) of a complete program for `target`, as first printed
    (`build_programs` may print a program again to fit the device's registers)."""
    return backend_for(target).generate_source(state, target, name)


def build_programs(states: Sequence[State], target: Target, name: str | Sequence[str] = "kernel",
                   builder: Any = None) -> list[BuiltProgram]:
    """Programs for `target` lowered, printed and compiled: see `Backend.build`."""
    return backend_for(target).build(states, target, name, builder)
