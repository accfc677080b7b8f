"""What a backend is: one target kind's capabilities, lowering passes, printer, builder and
runner, as one value, and what building programs with it gives (`BuiltProgram`).

A backend is data plus a few functions, not a class to subclass: the CPU and GPU backends
(`backend.cpu`, `backend.gpu`) are instances of `Backend`, and the passes and legality checks
read its `Capabilities` instead of asking the target's kind.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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
    dot_products: tuple[str, ...] = ()  # CPU dot-product instruction sets (Target.dot_products)

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
    # the passes as analyses (the cost model's features) run them: each gives what they read of
    # its namesake's output, maybe more cheaply; None: `passes` themselves
    analysis_passes: tuple[LoweringPass, ...] | None = None
    # whether analyses see the prepack function's stages: a GPU program runs them as kernels of
    # its own, a CPU program once ahead of the calls (then analyses lower without them)
    analyses_read_prepack: bool = True

    def capabilities(self, target: Target) -> Capabilities:
        return _capabilities(self, target)

    def run_passes(self, func: ir.PrimFunc, target: Target) -> ir.PrimFunc:
        """The backend's lowering passes applied to an already lowered function."""
        caps = self.capabilities(target)
        for fitted in self.passes:
            func = fitted(func, caps)
        return func

    def run_analysis_passes(self, func: ir.PrimFunc, target: Target) -> ir.PrimFunc:
        """`run_passes` as analyses read its output (never printed: see `analysis_passes`)."""
        caps = self.capabilities(target)
        for fitted in self.passes if self.analysis_passes is None else self.analysis_passes:
            func = fitted(func, caps)
        return func

    def lower(self, state: State, target: Target, name: str = "kernel") -> ir.PrimFunc:
        """The loop IR of a complete program as it runs on `target`: lowered, then the passes."""
        return self.run_passes(lower_state(state, name), target)

    def generate_source(self, state: State, target: Target, name: str = "kernel") -> tuple[str, str]:
        """(source text, entry function name) of a complete program."""
        return self.printer(self.lower(state, target, name), self.capabilities(target))

    def build(self, states: Sequence[State], target: Target, name: str | Sequence[str] = "kernel",
              builder: Any = None, finish: Sequence[LoweringPass | None] | None = None) -> list[BuiltProgram]:
        """Each program lowered, printed (its entry called `name`, or its own of a list of
        names) and compiled (in parallel, by `builder` or the target's own). Never raises for a
        bad program: a lowering error or a failed build is in its `BuiltProgram`. A build that
        spilled registers is printed again by `refit_printers` until one builds, so the source
        kept is one that compiles clean. `finish[i]`, where given, is one more pass for program
        i after the backend's own (a model's use of it, such as skipping padded rows)."""
        builder = builder or self.builder(target)
        caps = self.capabilities(target)
        funcs: list[ir.PrimFunc | None] = []
        out: list[BuiltProgram] = []
        names = [name] * len(states) if isinstance(name, str) else list(name)
        if len(names) != len(states):
            raise ValueError(f"build: {len(states)} programs but {len(names)} entry names")
        finishing = list(finish) if finish is not None else [None] * len(states)
        if len(finishing) != len(states):
            raise ValueError(f"build: {len(states)} programs but {len(finishing)} finishing passes")

        def printed() -> Iterator[str | None]:
            # a generator: the builder compiles each source while the next program is lowered
            for state, entry_name, last in zip(states, names, finishing):
                try:
                    func = self.lower(state, target, entry_name)
                    if last is not None:
                        func = last(func, caps)
                    source, entry = self.printer(func, caps)
                except Exception as exc:  # a program that cannot be lowered is data, not a crash
                    funcs.append(None)
                    out.append(BuiltProgram(None, "", None, f"{type(exc).__name__}: {exc}"))
                    yield None
                    continue
                funcs.append(func)
                out.append(BuiltProgram(source, entry, None))
                yield source

        for i, result in enumerate(builder.build(printed())):
            if result is not None:
                out[i] = BuiltProgram(out[i].source, out[i].entry, result)
        printers = iter(self.refit_printers)
        printer = next(printers, None)
        pending = [i for i, p in enumerate(out) if p.build is not None and _spilled(p.build)] if printer else []
        while pending:
            for i in pending:
                source, entry = printer(funcs[i], caps)
                out[i] = BuiltProgram(source, entry, None)
            for i, result in zip(pending, builder.build([out[i].source for i in pending])):
                out[i] = BuiltProgram(out[i].source, out[i].entry, result)
            printer = next(printers, None)
            pending = [i for i in pending if _spilled(out[i].build)] if printer else []
        return out


def _spilled(result: Any) -> bool:
    """Whether a failed build failed for registers: the device compiler spilled some."""
    return result.error_no != 0 and any(
        usage.get("spill_stores") or usage.get("spill_loads") for usage in (result.resources or {}).values())


@lru_cache(maxsize=64)
def _capabilities(backend: Backend, target: Target) -> Capabilities:
    return backend.capabilities_of(target)
