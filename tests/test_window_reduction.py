"""The untuned program of a pooling window over channels-last data: channels as vectors, the
padded input read in place, the answer equal to numpy's."""

from __future__ import annotations

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.kernel import build
from ansor.search.basic import default_schedule
from ansor.search.window_reduction import window_axes, window_program


def nhwc_pool(combiner: str, size: int = 9, channels: int = 32, window: int = 3, stride: int = 2, pad: int = 1):
    x = te.placeholder((1, size, size, channels), "float32", name="x")
    low = float("-inf") if combiner == "max" else 0.0
    padded = te.compute(
        (1, size + 2 * pad, size + 2 * pad, channels),
        lambda n, i, j, c: te.if_then_else((i >= pad) & (i < size + pad) & (j >= pad) & (j < size + pad),
                                           x[n, i - pad, j - pad, c], low), name="pad")
    out = (size + 2 * pad - window) // stride + 1
    ry, rx = te.reduce_axis(window, name="ry"), te.reduce_axis(window, name="rx")
    reduce = te.max if combiner == "max" else te.sum
    y = te.compute((1, out, out, channels),
                   lambda n, i, j, c: reduce(padded[n, i * stride + ry, j * stride + rx, c], axis=[ry, rx]),
                   name="pool")
    return ansor.Task([x, y])


def numpy_pool(x: np.ndarray, combiner: str, window: int = 3, stride: int = 2, pad: int = 1) -> np.ndarray:
    low = -np.inf if combiner == "max" else 0.0
    p = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=low)
    out = (p.shape[1] - window) // stride + 1
    windows = np.stack([p[:, i:i + stride * out:stride, j:j + stride * out:stride, :]
                        for i in range(window) for j in range(window)])
    return windows.max(0) if combiner == "max" else windows.sum(0)


@pytest.mark.parametrize("combiner", ["max", "sum"])
def test_pooling_window_runs_channels_as_vectors_and_matches_numpy(combiner):
    task = nhwc_pool(combiner)
    state = default_schedule(task)
    pool = [st for st in state.stages if st.name == "pool"][0]
    assert [it.annotation for it in pool.iters][-1] == "vectorize"       # channels innermost, as vectors
    assert [it.kind for it in pool.iters][-3:-1] == ["reduce", "reduce"]  # the window outside them
    assert [st.attach for st in state.stages if st.name == "pad"] == ["inline"]  # read in place
    x = np.random.default_rng(0).standard_normal((1, 9, 9, 32)).astype(np.float32)
    np.testing.assert_allclose(build(task, state=state)(x), numpy_pool(x, combiner), rtol=1e-5, atol=1e-5)


def test_other_reductions_keep_the_plain_program():
    nchw = te.placeholder((1, 8, 10, 10), "float32", name="x")
    assert window_axes(default_schedule(ansor.Task([nchw, te.ops.max_pool2d(nchw, 2)])), 1) is None
    a = te.placeholder((16, 128), "float32", name="a")
    k = te.reduce_axis(128, name="k")
    rowsum = te.compute((16,), lambda i: te.sum(a[i, k], axis=k), name="rowsum")
    task = ansor.Task([a, rowsum])                                       # rows, not a window over channels
    assert window_program(default_schedule(task), 1, 2) is None
