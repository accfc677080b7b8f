"""The Winograd measurement (benchmarks/winograd_split.py) chains three kernels that must give
the direct convolution's answer, checked against numpy (the matrices themselves:
test_graph_winograd.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import winograd_split as W  # noqa: E402

from ansor.tuning.quick import build_task  # noqa: E402


def test_the_three_kernels_chained_match_a_numpy_convolution():
    """10 x 10 x 8 (tiles that overhang the image: the last ones read zeros), default schedules."""
    size, channels = 10, 8
    stage_in, products, stage_out = (build_task(t, quick_trials=0) for t in W.winograd_tasks(size, channels))
    at, _, bt = W.winograd.winograd_matrices(W.TILE)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, size, size, channels)).astype(np.float32)
    w = rng.standard_normal((3, 3, channels, channels)).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    u = W.winograd.transform_weight(w)
    out = stage_out(products(stage_in(x, bt.astype(np.float32)), u), at.astype(np.float32), b)
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = sum(np.einsum("nhwc,ck->nhwk", xp[:, i:i + size, j:j + size], w[i, j]) for i in range(3) for j in range(3))
    ref = np.maximum(ref + b, 0)
    assert np.abs(out - ref).max() <= 1e-4 * np.sqrt(np.mean(ref ** 2))
