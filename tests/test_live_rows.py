"""Kernels of a bucket that skip the padded rows of a shorter call (`lower.live_rows`): on random
programs of row-wise tasks, the kept rows equal numpy's, the padded rows are zero, and the
kernel with no length set (or the length reset) computes every row."""

from __future__ import annotations

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.kernel import compile_state
from ansor.lower.live_rows import LiveRowsSpec
from ansor.search.sketch_policy import SketchPolicy

from helpers import assert_close


def _dense_gelu(rows: int):
    x = te.placeholder((1, rows, 48), name="x")
    w = te.placeholder((40, 48), name="w", constant=True)  # packed ahead in some programs
    k = te.reduce_axis(48, name="k")
    y = te.compute((1, rows, 40), lambda b, i, j: te.sum(x[b, i, k] * w[j, k], axis=k), name="dense")
    return [x, w, te.compute((1, rows, 40), lambda b, i, j: te.maximum(y[b, i, j], 0.0) * 1.5, name="out")]


def _heads_softmax(rows: int):
    """[heads, rows, 24] with the padded axis second: rows zeroed per head (one slab each)."""
    x = te.placeholder((3, rows, 24), name="x")
    return [x, te.ops.softmax(x)]


def _np_dense_gelu(x, w):
    return np.maximum(x @ w.T, 0.0) * 1.5


def _np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


CASES = [
    # (make, reference, output axis of the padded dimension, inner, bucket size)
    (_dense_gelu, _np_dense_gelu, 1, 1, 40),
    (_dense_gelu, _np_dense_gelu, 1, 2, 20),   # the axis holds the length's index r // 2
    (_heads_softmax, _np_softmax, 1, 1, 32),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_random_programs_compute_the_kept_rows_and_zero_the_rest(case):
    make, reference, axis, inner, padded = CASES[case]
    task = ansor.Task(make(padded * inner))
    spec = LiveRowsSpec(axis, inner, padded)
    rng = np.random.default_rng(case)
    inputs = [rng.standard_normal(t.shape).astype(np.float32) for t in task.inputs]
    want = reference(*inputs)
    policy = SketchPolicy(task, seed=case)
    try:
        states = policy.sample(6)
    finally:
        policy.close()
    skipping = guarded = 0
    for n, state in enumerate(states):
        kernel = compile_state(task, state, live_rows=spec)
        skipping += kernel.skips_padded_rows
        guarded += "< ansor_live" in kernel.source or "ansor_live_trips" in kernel.source
        assert_close(kernel(*inputs), want, f"program {n}, every row")
        for length in (1, padded // 2 + 1, padded - 1, padded):
            kernel.set_live_rows(length)
            got = kernel(*inputs)
            kept = length * inner
            index = [slice(None)] * got.ndim
            index[axis] = slice(0, kept)
            assert_close(got[tuple(index)], want[tuple(index)], f"program {n}, length {length}")
            index[axis] = slice(kept, None)
            assert not got[tuple(index)].any(), f"program {n}, length {length}: padded rows not zero"
        kernel.set_live_rows(None)
        assert_close(kernel(*inputs), want, f"program {n}, every row after the reset")
    assert skipping == len(states) and guarded > 0


def test_a_task_without_the_padded_axis_is_compiled_as_it_was():
    task = ansor.Task(_dense_gelu(16))
    spec = LiveRowsSpec(1, 1, 24)  # the axis has 16 rows, not 24: not this task's padding
    policy = SketchPolicy(task, seed=0)
    try:
        state = policy.sample(1)[0]
    finally:
        policy.close()
    kernel = compile_state(task, state, live_rows=spec)
    assert not kernel.skips_padded_rows
    assert kernel.source == compile_state(task, state).source


def _dense(rows: int, dtypes: tuple[str, str, str]):
    x = te.placeholder((1, rows, 32), dtypes[0], name="x")
    w = te.placeholder((64, 32), dtypes[1], name="w", constant=True)
    k = te.reduce_axis(32, name="k")
    def body(b, i, j):
        if dtypes[0] == dtypes[2]:
            return te.sum(x[b, i, k] * w[j, k], axis=k)
        # a widening product: dot-product instructions where the CPU has them
        return te.sum(te.cast(x[b, i, k], dtypes[2]) * te.cast(w[j, k], dtypes[2]), axis=k)

    return [x, w, te.compute((1, rows, 64), body, name="dense")]


@pytest.mark.parametrize("dtypes", [("float32", "float32", "float32"), ("uint8", "int8", "int32")],
                         ids=["float32", "int8"])
def test_register_tiles_straddling_the_length_compute_the_kept_rows_bit_for_bit(dtypes):
    """A tile of several rows whose last rows are padding runs only its kept rows' updates
    (`ir.RaggedRows`, float and dot-product tiles): at every length the kept rows equal the
    whole tile's, bit for bit."""
    if dtypes[0] == "uint8" and "avx512_vnni" not in ansor.Target.host().dot_products \
            and "avx_vnni" not in ansor.Target.host().dot_products:
        pytest.skip("this CPU has no int8 dot-product instruction")
    padded = 24
    task = ansor.Task(_dense(padded, dtypes))
    spec = LiveRowsSpec(1, 1, padded)
    rng = np.random.default_rng(7)
    if dtypes[0] == "uint8":
        inputs = [rng.integers(0, 256, (1, padded, 32)).astype(np.uint8),
                  rng.integers(-128, 128, (64, 32)).astype(np.int8)]
        want = inputs[0].astype(np.int32) @ inputs[1].T.astype(np.int32)
    else:
        inputs = [rng.standard_normal(t.shape).astype(np.float32) for t in task.inputs]
        want = inputs[0] @ inputs[1].T
    policy = SketchPolicy(task, seed=7)
    try:
        states = policy.sample(24)
    finally:
        policy.close()
    ragged = 0
    for n, state in enumerate(states):
        kernel = compile_state(task, state, live_rows=spec)
        ragged += "kept rows only" in kernel.source
        whole = kernel(*inputs)
        assert_close(whole, want, f"program {n}, every row")
        for length in range(1, padded + 1):
            kernel.set_live_rows(length)
            got = kernel(*inputs)
            assert np.array_equal(got[:, :length], whole[:, :length]), f"program {n}, length {length}"
            assert not got[:, length:].any(), f"program {n}, length {length}: padded rows not zero"
    assert ragged > 0, "no sampled program had a tile of several rows straddling the length"
