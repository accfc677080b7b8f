"""Quantities as the explanation and the picture write them: bytes, FLOPs, seconds, shapes.

One place for the units, so the text and the picture of a kernel never disagree on how a number
reads.
"""

from __future__ import annotations

from collections.abc import Sequence


def format_bytes(n: float) -> str:
    """Bytes with a binary unit: 512 B, 12.0 KiB, 3.5 MiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def format_flop(n: float) -> str:
    """Floating-point operations with a decimal unit: 2.15 GFLOP, 64.00 KFLOP."""
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("KFLOP", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} FLOP"


def format_seconds(sec: float) -> str:
    """A duration in the unit that keeps it readable: 12.5 us, 3.210 ms, 1.500 s."""
    return f"{sec * 1e6:.1f} us" if sec < 1e-3 else (f"{sec * 1e3:.3f} ms" if sec < 1 else f"{sec:.3f} s")


def format_shape(shape: Sequence[int]) -> str:
    """A tensor shape as 64x56x56 ("scalar" for none)."""
    return "x".join(map(str, shape)) if shape else "scalar"
