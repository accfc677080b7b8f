"""Code generation: the loop IR to source text for a target."""

from __future__ import annotations

from ansor.lower.lower import lower
from ansor.target import Target


def generate_source(state, target: Target, name: str = "kernel") -> tuple[str, str]:
    """(source text, entry function name) of a complete program."""
    func = lower(state, name)
    if target.kind == "cpu":
        from ansor.codegen.c import generate_c

        return generate_c(func, target.vector_unit_bytes, target.vector_registers)
    raise ValueError(f"no code generator for target kind {target.kind!r}; the CPU backend is available")
