"""Canonical operators that exist only as numpy kernels: rare ONNX operators, defined here once.

Each operator registers its shape rule (in `ops.OPS`, like every canonical operator) and its
numpy kernel (in `reference.KERNELS`); having no te form, it runs as a numpy fallback
subgraph: correct, said at build time, not tuned. They follow the ONNX definitions:
`grid_sample_nd` (GridSample of any spatial rank, linear / nearest / cubic, zeros / border /
reflection padding, ONNX's own padding rule).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from ansor.graph.ops import TensorType, _check, _register
from ansor.graph.reference import _kernel


# ----------------------------------------------------------------------------- grid_sample_nd
@_register("grid_sample_nd", 2, {"mode": "linear", "padding_mode": "zeros", "align_corners": False})
def _grid_sample_nd_type(types, attrs):
    """ONNX GridSample: x [N, C, *S] sampled at grid [N, *O, r] (r = len(S) normalized
    coordinates in [-1, 1], the last spatial axis first); the output is [N, C, *O]."""
    x, grid = types
    rank = len(x.shape) - 2
    _check(rank >= 1 and len(grid.shape) == rank + 2 and grid.shape[-1] == rank and grid.shape[0] == x.shape[0],
           f"grid_sample_nd: input {x.shape} and grid {grid.shape}")
    _check(attrs["mode"] in ("linear", "nearest", "cubic"), f"grid_sample_nd: mode {attrs['mode']!r}")
    _check(attrs["padding_mode"] in ("zeros", "border", "reflection"),
           f"grid_sample_nd: padding_mode {attrs['padding_mode']!r}")
    return TensorType((x.shape[0], x.shape[1], *grid.shape[1:-1]), x.dtype)


def _reflect(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect by the nearer border until within [lo, hi] (ONNX's rule)."""
    span = hi - lo
    if span <= 0:
        return np.full_like(v, lo)
    below, above = v < lo, v > hi
    dx = np.where(below, lo - v, v - hi)
    n = np.trunc(dx / span)
    r = dx - n * span
    even = n % 2 == 0
    return np.where(below, np.where(even, lo + r, hi - r), np.where(above, np.where(even, hi - r, lo + r), v))


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    a = -0.75
    return [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
            ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a]


@_kernel("grid_sample_nd")
def _grid_sample_nd(xs, a):
    x, grid = xs
    n, c, *dims = x.shape
    rank = len(dims)
    mode, padding = a["mode"], a["padding_mode"]
    dtype = x.dtype.type
    taps_per_axis, weights_per_axis = [], []
    for axis in range(rank):
        size = dims[axis]
        g = grid[..., rank - 1 - axis].astype(x.dtype)       # [N, *O]: the grid's last entry is axis 0's
        if a["align_corners"]:
            pos, lo, hi = (g + dtype(1)) / dtype(2) * dtype(size - 1), 0.0, size - 1.0
        else:
            pos, lo, hi = ((g + dtype(1)) * dtype(size) - dtype(1)) / dtype(2), -0.5, size - 0.5
        if mode == "nearest":
            pos = np.rint(pos)
        outside = (pos < lo) | (pos > hi)
        if padding == "border":
            pos = np.where(outside, np.clip(pos, 0, size - 1), pos)
        elif padding == "reflection":
            pos = np.where(outside, _reflect(pos, lo, hi), pos)
        if mode == "nearest":
            taps, weights = [pos.astype(np.int64)], [np.ones_like(pos)]
        else:
            base = np.floor(pos)
            t = pos - base
            base = base.astype(np.int64)
            if mode == "linear":
                taps, weights = [base, base + 1], [1 - t, t]
            else:
                taps, weights = [base - 1, base, base + 1, base + 2], _cubic_weights(t)
        taps_per_axis.append([_padded_index(i, size, lo, hi, padding) for i in taps])
        weights_per_axis.append(weights)
    batch = np.arange(n).reshape((n,) + (1,) * (grid.ndim - 2))
    out = np.zeros((n, *grid.shape[1:-1], c), dtype=np.float64)
    for combo in itertools.product(*(range(len(t)) for t in taps_per_axis)):
        weight = np.ones(grid.shape[:-1], dtype=np.float64)
        inside = np.ones(grid.shape[:-1], dtype=bool)
        index = []
        for axis, k in enumerate(combo):
            i, ok = taps_per_axis[axis][k]
            weight = weight * weights_per_axis[axis][k]
            inside &= ok
            index.append(i)
        values = np.moveaxis(x, 1, -1)[(batch, *index)]     # [N, *O, C]
        out += np.where(inside[..., None], values, 0) * weight[..., None]
    return np.moveaxis(out, -1, 1).astype(x.dtype)


def _padded_index(i: np.ndarray, size: int, lo: float, hi: float, padding: str) -> tuple[np.ndarray, np.ndarray]:
    """An integer tap position after the padding rule, with whether it reads the input
    (zeros padding reads nothing outside)."""
    if padding == "zeros":
        inside = (i >= 0) & (i < size)
        return np.clip(i, 0, size - 1), inside
    if padding == "border":
        return np.clip(i, 0, size - 1), np.ones(i.shape, bool)
    reflected = _reflect(i.astype(np.float64), lo, hi).astype(np.int64)  # int(): toward zero
    return np.clip(reflected, 0, size - 1), np.ones(i.shape, bool)


# ----------------------------------------------------------------------------- det
@_register("det", 1)
def _det_type(types, attrs):
    """The determinant of each square matrix of the last two axes."""
    x = types[0]
    _check(len(x.shape) >= 2 and x.shape[-1] == x.shape[-2], f"det: square matrices needed, got {x.shape}")
    _check(x.dtype in ("float32", "float64"), f"det: float input, got {x.dtype}")
    return TensorType(x.shape[:-2], x.dtype)


@_kernel("det")
def _det(xs, a):
    return np.linalg.det(xs[0].astype(np.float64)).astype(xs[0].dtype)
