"""The registry of backends: a target's kind -> the one `Backend` that serves it, and the ways
from programs to sources and libraries that go through it.

The built-in backends register themselves when their module is imported, which happens the
first time a target of their kind asks (so a CPU-only run never imports the GPU toolchains'
modules); `register_backend` adds or replaces one.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ansor.backend.base import Backend, BuiltProgram
from ansor.lower import ir
from ansor.target import Target

if TYPE_CHECKING:
    from ansor.schedule.state import State


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
                   builder: Any = None, finish: Sequence[Any] | None = None) -> list[BuiltProgram]:
    """Programs for `target` lowered, printed and compiled: see `Backend.build`."""
    return backend_for(target).build(states, target, name, builder, finish)
