"""The numpy reference evaluator (ansor.te.evaluate)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from ansor import te
from ansor.te import evaluate as ev_mod
from ansor.te.evaluate import evaluate, find_placeholders, random_inputs


def test_elementwise_and_dtype_kept():
    A = te.placeholder((3, 4), name="A")
    B = te.compute((3, 4), lambda i, j: A[i, j] * 0.1 + 1.0, name="B")
    a = random_inputs([A])[0]
    (b,) = evaluate([B], {A: a})
    assert b.dtype == np.float32
    np.testing.assert_array_equal(b, a * np.float32(0.1) + np.float32(1.0))
    (b2,) = evaluate(B, {A: a})  # a single tensor is accepted too
    np.testing.assert_array_equal(b, b2)


def test_axis_values_and_index_arithmetic():
    C = te.compute((4, 5), lambda i, j: te.cast(i * 10 + j, "float32"), name="C")
    (c,) = evaluate([C], {})
    np.testing.assert_array_equal(c, np.arange(4)[:, None] * 10 + np.arange(5))


def test_integer_floor_division_and_mod_follow_python():
    A = te.placeholder((12,), "int32", name="A")
    vals = np.array([-7, -6, -5, -1, 0, 1, 5, 6, 7, -13, 13, 2], dtype=np.int32)
    outs = [
        te.compute((12,), lambda i: A[i] // 3, name="fd"),
        te.compute((12,), lambda i: A[i] % 3, name="md"),
        te.compute((12,), lambda i: A[i] // -4, name="fdn"),
        te.compute((12,), lambda i: A[i] % -4, name="mdn"),
        te.compute((12,), lambda i: (i - 6) // 4, name="axis_div"),
    ]
    got = evaluate(outs, {A: vals})
    py = [int(v) for v in vals]
    assert got[0].tolist() == [v // 3 for v in py]
    assert got[1].tolist() == [v % 3 for v in py]
    assert got[2].tolist() == [v // -4 for v in py]
    assert got[3].tolist() == [v % -4 for v in py]
    assert got[4].tolist() == [(i - 6) // 4 for i in range(12)]
    assert all(g.dtype == np.int32 for g in got)


def test_division_by_zero_raises_only_where_used():
    A = te.placeholder((4,), "int32", name="A")
    D = te.placeholder((4,), "int32", name="D")
    a = np.array([5, 6, 7, 8], dtype=np.int32)
    d = np.array([2, 0, 3, 0], dtype=np.int32)
    with pytest.raises(ZeroDivisionError, match="'q'"):
        evaluate([te.compute((4,), lambda i: A[i] // D[i], name="q")], {A: a, D: d})
    safe = te.compute((4,), lambda i: te.if_then_else(D[i] != 0, A[i] // D[i], -1), name="safe")
    (got,) = evaluate([safe], {A: a, D: d})
    assert got.tolist() == [2, -1, 2, -1]


def test_int32_int64_mix_promotes():
    A = te.placeholder((3,), "int64", name="A")
    B = te.compute((3,), lambda i: A[i] + i, name="B")
    assert B.dtype == "int64"
    (b,) = evaluate([B], {A: np.array([2**40, 1, 2], dtype=np.int64)})
    assert b.dtype == np.int64 and b.tolist() == [2**40, 2, 4]


def test_math_functions():
    X = te.placeholder((50,), name="X")
    x = np.linspace(0.05, 3, 50).astype(np.float32)
    fns = {
        "exp": (te.exp, np.exp), "log": (te.log, np.log), "sqrt": (te.sqrt, np.sqrt),
        "rsqrt": (te.rsqrt, lambda v: 1 / np.sqrt(v)), "tanh": (te.tanh, np.tanh),
        "sigmoid": (te.sigmoid, lambda v: 1 / (1 + np.exp(-v))),
        "abs": (lambda e: te.abs(e - 1.5), lambda v: np.abs(v - 1.5)),
        "erf": (lambda e: te.erf(e - 1.5), lambda v: np.vectorize(math.erf)(v - 1.5)),
        "pow": (lambda e: te.pow(e, 2.5), lambda v: v ** 2.5),
        "max": (lambda e: te.maximum(e, 1.0), lambda v: np.maximum(v, 1.0)),
        "min": (lambda e: te.minimum(e, 1.0), lambda v: np.minimum(v, 1.0)),
    }

    def apply(f):
        return lambda i: f(X[i])

    outs = [te.compute((50,), apply(f), name=n) for n, (f, _) in fns.items()]
    got = evaluate(outs, {X: x})
    for (n, (_, ref)), g in zip(fns.items(), got):
        assert g.dtype == np.float32, n
        np.testing.assert_allclose(g, ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6, err_msg=n)


def test_erf_both_implementations_match_math_erf():
    x = np.concatenate([np.linspace(-7, 7, 20001), [0.0, 1e-30, -1e-8, np.inf, -np.inf]])
    ref = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(ev_mod._erf_chebyshev(x), ref, rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(ev_mod.erf(x), ref, rtol=1e-14, atol=1e-300)
    assert np.isnan(ev_mod._erf_chebyshev(np.array([np.nan]))[0])


def test_cast_and_logic():
    A = te.placeholder((6,), name="A")
    a = np.array([-1.7, -0.2, 0.0, 0.4, 1.5, 2.9], dtype=np.float32)
    trunc = te.compute((6,), lambda i: te.cast(A[i], "int32"), name="trunc")
    logic = te.compute((6,), lambda i: te.if_then_else((A[i] > 0.0) & ~(A[i] > 2.0) | (i == 0),
                                                        te.const(1, "int32"), 0), name="logic")
    t, lg = evaluate([trunc, logic], {A: a})
    assert t.tolist() == [-1, 0, 0, 0, 1, 2]
    assert lg.tolist() == [1, 0, 0, 1, 1, 0]


# ---------------------------------------------------------------------------------------------
# reductions

def test_where_clause_prefix_sum():
    A = te.placeholder((6, 5), name="A")
    k = te.reduce_axis(5, "k")
    S = te.compute((6, 5), lambda i, j: te.sum(A[i, k], axis=k, where=k <= j), name="prefix")
    a = random_inputs([A])[0]
    (s,) = evaluate([S], {A: a})
    np.testing.assert_allclose(s, np.cumsum(a.astype(np.float64), axis=1), rtol=1e-6, atol=1e-6)


def test_reduce_axis_with_lower_bound():
    A = te.placeholder((4, 9), name="A")
    k = te.reduce_axis((2, 7), "k")
    S = te.compute((4,), lambda i: te.sum(A[i, k], axis=k), name="s")
    r = te.reduce_axis((3, 5), "r")
    Mx = te.compute((4,), lambda i: te.max(A[i, r], axis=r), name="mx")
    a = random_inputs([A])[0]
    s, mx = evaluate([S, Mx], {A: a})
    np.testing.assert_allclose(s, a[:, 2:7].astype(np.float64).sum(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(mx, a[:, 3:5].max(axis=1))


def test_max_min_reductions_and_empty_where():
    A = te.placeholder((3, 7), name="A")
    Ai = te.placeholder((3, 7), "int32", name="Ai")
    k = te.reduce_axis(7, "k")
    mx = te.compute((3,), lambda i: te.max(A[i, k], axis=k), name="mx")
    mn = te.compute((3,), lambda i: te.min(Ai[i, k], axis=k), name="mn")
    none = te.compute((3,), lambda i: te.max(A[i, k], axis=k, where=k > 10), name="none")
    nonei = te.compute((3,), lambda i: te.min(Ai[i, k], axis=k, where=k < 0), name="nonei")
    a, ai = random_inputs([A, Ai])
    g = evaluate([mx, mn, none, nonei], {A: a, Ai: ai})
    np.testing.assert_array_equal(g[0], a.max(axis=1))
    np.testing.assert_array_equal(g[1], ai.min(axis=1))
    assert g[1].dtype == np.int32
    assert np.all(g[2] == -np.inf)
    assert np.all(g[3] == np.iinfo(np.int32).max)


def test_multi_axis_reduction_and_int_sum():
    A = te.placeholder((2, 3, 4), "int32", name="A")
    r1, r2 = te.reduce_axis(3, "r1"), te.reduce_axis(4, "r2")
    S = te.compute((2,), lambda i: te.sum(A[i, r1, r2] * 2, axis=[r1, r2]), name="s")
    a = random_inputs([A])[0]
    (s,) = evaluate([S], {A: a})
    assert s.dtype == np.int32 and s.tolist() == (a * 2).sum(axis=(1, 2)).tolist()


def test_reduction_not_depending_on_its_axis_counts_each_point():
    A = te.placeholder((3,), name="A")
    B = te.placeholder((3,), name="B")
    k, r = te.reduce_axis(4, "k"), te.reduce_axis(5, "r")
    S = te.compute((3,), lambda i: te.sum(A[i] * B[i], axis=[k, r]), name="s")
    G = te.compute((3,), lambda i: te.sum(A[i] + 0.0, axis=k), name="g")
    a, b = random_inputs([A, B])
    s, g = evaluate([S, G], {A: a, B: b})
    np.testing.assert_allclose(s, 20 * a.astype(np.float64) * b, rtol=1e-6)
    np.testing.assert_allclose(g, 4 * a.astype(np.float64), rtol=1e-6)


def test_spatial_axis_unused_by_reduction_broadcasts():
    A = te.placeholder((5,), name="A")
    B = te.placeholder((5,), name="B")
    k = te.reduce_axis(5, "k")
    S = te.compute((3, 2), lambda i, j: te.sum(A[k] * B[k], axis=k), name="dot")
    a, b = random_inputs([A, B])
    (s,) = evaluate([S], {A: a, B: b})
    np.testing.assert_allclose(s, np.full((3, 2), np.dot(a.astype(np.float64), b)), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# guarded reads

def test_select_never_reads_out_of_bounds():
    A = te.placeholder((5,), name="A")
    shifted = te.compute((7,), lambda i: te.if_then_else((i >= 1) & (i < 6), A[i - 1], -1.0),
                         name="shifted")
    a = random_inputs([A])[0]
    (s,) = evaluate([shifted], {A: a})
    np.testing.assert_array_equal(s, np.concatenate([[-1], a, [-1]]).astype(np.float32))


def test_nested_select_and_data_dependent_index():
    A = te.placeholder((4,), name="A")
    Idx = te.placeholder((6,), "int32", name="Idx")
    gather = te.compute((6,), lambda i: te.if_then_else(
        (Idx[i] >= 0) & (Idx[i] < 4),
        te.if_then_else(Idx[i] > 1, A[Idx[i]] * 2.0, A[Idx[i]]), 0.0), name="gather")
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    idx = np.array([0, 3, -5, 9, 2, 1], dtype=np.int32)
    (g,) = evaluate([gather], {A: a, Idx: idx})
    assert g.tolist() == [1, 8, 0, 0, 6, 2]


def test_out_of_bounds_read_in_a_taken_branch_raises():
    A = te.placeholder((5,), name="A")
    bad = te.compute((5,), lambda i: te.if_then_else(i < 5, A[i + 1], 0.0), name="bad")
    with pytest.raises(IndexError, match=r"'bad' reads tensor 'A' out of bounds in dimension 0"):
        evaluate([bad], {A: np.zeros(5, np.float32)})


def test_where_guards_reads_in_reductions():
    A = te.placeholder((6,), name="A")
    k = te.reduce_axis(3, "k")
    # window sum of A[i - 1 + k], skipping the positions that fall outside A
    W = te.compute((6,), lambda i: te.sum(A[i - 1 + k], axis=k,
                                          where=(i - 1 + k >= 0) & (i - 1 + k < 6)), name="win")
    a = random_inputs([A])[0].astype(np.float64)
    (w,) = evaluate([W], {A: a})
    ref = np.convolve(a, np.ones(3), mode="same")
    np.testing.assert_allclose(w, ref, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# multi-stage graphs and inputs

def test_multi_stage_graph_and_given_intermediate():
    A = te.placeholder((4, 4), name="A")
    B = te.compute((4, 4), lambda i, j: A[i, j] * 2.0, name="B")
    C = te.compute((4, 4), lambda i, j: B[j, i] + A[i, j], name="C")
    a = random_inputs([A])[0]
    b, c = evaluate([B, C], {A: a})
    np.testing.assert_allclose(c, (a * 2).T + a, rtol=1e-6)
    (c2,) = evaluate([C], {A: a, B: np.ones((4, 4), np.float32)})
    np.testing.assert_allclose(c2, 1 + a, rtol=1e-6)
    assert find_placeholders([C]) == [A]


def test_input_validation():
    A = te.placeholder((2, 3), name="A")
    B = te.compute((2, 3), lambda i, j: A[i, j] + 1.0, name="B")
    with pytest.raises(ValueError, match="no value given for placeholder 'A'"):
        evaluate([B], {})
    with pytest.raises(ValueError, match=r"'A' has shape \(3, 2\), expected \(2, 3\)"):
        evaluate([B], {A: np.zeros((3, 2))})
    with pytest.raises(TypeError, match="'A' has dtype complex128"):
        evaluate([B], {A: np.zeros((2, 3), complex)})
    (b,) = evaluate([B], {A: np.zeros((2, 3))})  # float64 converts to float32
    assert b.dtype == np.float32


def test_random_inputs():
    A = te.placeholder((100,), name="A")
    I = te.placeholder((100,), "int32", name="I")
    Bo = te.placeholder((10,), "bool", name="Bo")
    a, i, bo = random_inputs([A, I, Bo], seed=3)
    assert a.dtype == np.float32 and a.min() >= -1 and a.max() < 1
    assert i.dtype == np.int32 and i.min() >= -8 and i.max() < 8
    assert bo.dtype == np.bool_
    a2, _, _ = random_inputs([A, I, Bo], seed=3)
    np.testing.assert_array_equal(a, a2)


# ---------------------------------------------------------------------------------------------
# chunking

def _chunked_vs_whole(outs, inputs, budget):
    whole = evaluate(outs, inputs)
    chunked = evaluate(outs, inputs, max_chunk_elements=budget)
    for w, c in zip(whole, chunked):
        np.testing.assert_allclose(c, w, rtol=1e-6, atol=1e-6)
    return whole


@pytest.mark.parametrize("budget", [1, 7, 64, 1000])
def test_chunking_matches_unchunked(budget):
    A = te.placeholder((9, 11), name="A")
    B = te.placeholder((11, 6), name="B")
    k = te.reduce_axis(11, "k")
    mm = te.compute((9, 6), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="mm")
    k2 = te.reduce_axis((1, 10), "k2")
    mx = te.compute((9, 6), lambda i, j: te.max(A[i, k2] + B[k2, j], axis=k2,
                                                where=k2 != j), name="mx")
    sel = te.compute((9, 11), lambda i, j: te.if_then_else(j > 0, A[i, j - 1], A[i, j]),
                     name="sel")
    a, b = random_inputs([A, B])
    mmv, mxv, _ = _chunked_vs_whole([mm, mx, sel], {A: a, B: b}, budget)
    np.testing.assert_allclose(mmv, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-6)


def test_chunking_beyond_default_budget():
    n = ev_mod.MAX_CHUNK_ELEMENTS // 4096 + 3  # a little over one default chunk
    A = te.placeholder((n, 4096), name="A")
    B = te.compute((n, 4096), lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
    axes = [te.reduce_axis(n, "r0"), te.reduce_axis(4096, "r1")]
    S = te.compute((1,), lambda i: te.sum(A[axes[0], axes[1]], axis=axes), name="S")
    a = np.random.default_rng(0).standard_normal((n, 4096), dtype=np.float32)
    b, s = evaluate([B, S], {A: a})
    np.testing.assert_array_equal(b, a * np.float32(2) + np.float32(1))
    np.testing.assert_allclose(s[0], a.sum(dtype=np.float64), rtol=1e-6)


def test_large_matmul_is_fast():
    n = 1024
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis(n, "k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    a, b = random_inputs([A, B])
    start = time.perf_counter()
    (c,) = evaluate([C], {A: a, B: b})
    assert time.perf_counter() - start < 10.0
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5,
                               atol=1e-5)
