"""Backends: what it takes to run a program on one kind of target.

A backend is chosen by the target's kind and is one unit (`backend.base`): the capabilities it
offers programs (read by passes and legality checks instead of the kind), the lowering passes
that fit the loop IR to the hardware (run before features are extracted, so the cost model sees
the program that runs), the printer (IR to source), the builder (source to library), and the
loader and runner that call a built kernel by its calling convention. The registry
(`backend.registry`) maps kinds to backends; `build_programs` is the one way from programs to
built libraries. Nothing outside this package asks a target's kind which code to generate.
This module only gathers the names.
"""

from __future__ import annotations

from ansor.backend.base import Backend, BuiltProgram, Capabilities, LoweringPass, Printer
from ansor.backend.registry import _BACKENDS, backend_for, build_programs, generate_source, lower_for, register_backend

# `_BACKENDS` is the registry's own table, not a copy: a test swaps a backend in for one test
# with `monkeypatch.setitem(ansor.backend._BACKENDS, kind, backend)` and it is undone after.

__all__ = ["Backend", "BuiltProgram", "Capabilities", "LoweringPass", "Printer", "backend_for", "build_programs",
           "generate_source", "lower_for", "register_backend"]
