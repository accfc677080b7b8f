"""Integer simplification: the one-pass linear form agrees with the recursive one, and
simplified expressions keep their value."""

from __future__ import annotations

import random

import pytest

from ansor.te import expr as E
from ansor.te.arith import Simplifier


def _random_int_expr(rng: random.Random, leaves: list[E.Expr], depth: int) -> E.Expr:
    if depth == 0 or rng.random() < 0.2:
        return rng.choice(leaves) if rng.random() < 0.8 else E.Const(rng.randint(-5, 9), "int32")
    a = _random_int_expr(rng, leaves, depth - 1)
    b = _random_int_expr(rng, leaves, depth - 1)
    op = rng.choice(["+", "+", "-", "*", "*c", "//", "%"])
    if op == "*c":
        return E.BinOp("*", a, E.Const(rng.randint(-3, 8), "int32"), "int32")
    if op in ("//", "%"):
        return E.BinOp(op, a, E.Const(rng.randint(1, 8), "int32"), "int32")
    return E.BinOp(op, a, b, "int32")


def _value(expr: E.Expr, env: dict[int, int]) -> int:
    if isinstance(expr, E.Const):
        return int(expr.value)
    if isinstance(expr, E.Var):
        return env[id(expr)]
    a, b = _value(expr.a, env), _value(expr.b, env)
    return {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0, "%": a % b if b else 0,
            "min": min(a, b), "max": max(a, b)}[expr.op]


@pytest.mark.parametrize("seed", range(40))
def test_flat_linear_form_matches_the_recursive_one(seed):
    rng = random.Random(seed)
    vs = [E.Var(n) for n in ("i", "j", "k", "i")]  # two variables share a name: order must still agree
    ranges = {id(vs[0]): (0, 7), id(vs[1]): (0, 0), id(vs[2]): (0, 15)}  # j is fixed at 0
    expr = _random_int_expr(rng, vs, 5)
    if not (isinstance(expr, E.BinOp) and expr.op in ("+", "-", "*")):
        expr = E.BinOp("+", expr, vs[2], "int32")
    flat = Simplifier(ranges)._flat_linear(expr)
    recursive = Simplifier(ranges)._linear_of(expr)
    assert flat.const == recursive.const
    assert [(k, c) for k, (_, c) in flat.terms.items()] == [(k, c) for k, (_, c) in recursive.terms.items()]


@pytest.mark.parametrize("seed", range(40))
def test_simplified_expressions_keep_their_value(seed):
    rng = random.Random(1000 + seed)
    vs = [E.Var(n) for n in ("i", "j", "k")]
    extents = [8, 1, 16]
    ranges = {id(v): (0, e - 1) for v, e in zip(vs, extents)}
    expr = _random_int_expr(rng, vs, 5)
    simplified = Simplifier(ranges).simplify(expr)
    for _ in range(20):
        env = {id(v): rng.randrange(e) for v, e in zip(vs, extents)}
        assert _value(simplified, env) == _value(expr, env)


def test_a_packed_split_index_becomes_contiguous_in_the_inner_loop():
    """(16*i0 + i1) % 64 and // 64 with i1 < 16, the index of a split loop packed into tiles of
    64: rewritten without i1 inside the mod, so the store is contiguous in i1."""
    from ansor.te.printer import expr_to_str

    i0, i1 = E.Var("i0"), E.Var("i1")
    s = Simplifier({id(i0): (0, 63), id(i1): (0, 15)})
    x = i0 * 16 + i1
    assert expr_to_str(s.simplify(x % 64)) == "i1 + i0 % 4 * 16"
    assert expr_to_str(s.simplify(x // 64)) == "i0 // 4"
    # i1 may reach 16: the split is not exact and the expression stays as it was
    wide = Simplifier({id(i0): (0, 63), id(i1): (0, 16)})
    assert expr_to_str(wide.simplify(x % 64)) == "(i0 * 16 + i1) % 64"


@pytest.mark.parametrize("seed", range(30))
def test_divisions_split_at_a_divisor_keep_their_value(seed):
    """Random (c1*(sum of terms) + b + k) // c and % c, c a multiple of c1, signed coefficients
    and ranges, compared with Python's floor division at random points."""
    rng = random.Random(seed)
    c1 = rng.choice([2, 4, 8, 16, 3])
    c = c1 * rng.choice([1, 2, 4, 3])
    vs = [E.Var(n) for n in ("a", "b", "r")]
    ranges = {id(vs[0]): (rng.randint(-8, 0), rng.randint(0, 20)), id(vs[1]): (0, rng.randint(0, 9)),
              id(vs[2]): (0, c1 - 1 if rng.random() < 0.8 else c1)}
    expr = (vs[0] * (c1 * rng.choice([1, -1, 3])) + vs[1] * (c1 * rng.randint(1, 5)) + vs[2]
            + E.Const(c1 * rng.randint(-3, 3), "int32"))
    for op in ("//", "%"):
        node = E.BinOp(op, expr, E.Const(c, "int32"), "int32")
        simplified = Simplifier(ranges).simplify(node)
        for _ in range(40):
            env = {id(v): rng.randint(*ranges[id(v)]) for v in vs}
            assert _value(simplified, env) == _value(node, env)


def test_a_split_division_and_its_remainder_recombine():
    """((32*i + k) % 1024) + ((32*i + k) // 1024)*1024 is 32*i + k, also after the division
    was split at 32 (a 2-norm's fused reduction index: left split, gcc stopped vectorizing)."""
    from ansor.te.printer import expr_to_str

    i, k = E.Var("i"), E.Var("k")
    s = Simplifier({id(i): (0, 1023), id(k): (0, 31)})
    x = i * 32 + k
    assert expr_to_str(s.simplify((x % 1024) + (x // 1024) * 1024)) == "i * 32 + k"
    assert expr_to_str(s.simplify((i % 7) * 2 + (i // 7) * 14 + 5)) == "i * 2 + 5"
    assert expr_to_str(s.simplify((i % 7) * 2 + (i // 7) * 7)) == "i % 7 * 2 + i // 7 * 7"  # not k*m


@pytest.mark.parametrize("seed", range(20))
def test_recombined_divisions_keep_their_value(seed):
    rng = random.Random(500 + seed)
    vs = [E.Var(n) for n in ("a", "b")]
    ranges = {id(vs[0]): (rng.randint(-9, 0), rng.randint(0, 40)), id(vs[1]): (0, rng.randint(0, 12))}
    x = vs[0] * rng.randint(-4, 6) + vs[1] * rng.randint(1, 5) + E.Const(rng.randint(-5, 5), "int32")
    m, k = rng.randint(1, 9), rng.randint(-3, 4)
    expr = (x % m) * k + (x // m) * (k * m) + vs[1]
    simplified = Simplifier(ranges).simplify(expr)
    for _ in range(40):
        env = {id(v): rng.randint(*ranges[id(v)]) for v in vs}
        assert _value(simplified, env) == _value(expr, env)


def test_loads_of_different_buffers_at_one_index_are_different_values():
    """max(A[i], B[i]) of integers once compiled to B[i] (and a gather's A[R[i] * 2 + K[i]] to
    K[i] * 6): the simplifier keyed a load by its index alone, and a cast without its dtype.
    Checked against numpy; the gather is covered by ONNX's GatherND cases."""
    import numpy as np

    from ansor import te
    from ansor.kernel import build
    from ansor.task import Task

    n = 16
    a = te.placeholder((n,), "int32", name="A")
    b = te.placeholder((n,), "int32", name="B")
    c = te.compute((n,), lambda i: te.maximum(a[i], b[i]), name="C")
    rng = np.random.default_rng(0)
    x, y = rng.integers(-50, 50, n).astype("int32"), rng.integers(-50, 50, n).astype("int32")
    np.testing.assert_array_equal(build(Task([a, b, c]))(x, y), np.maximum(x, y))

    f = te.placeholder((n,), "float32", name="F")
    wide = te.compute((n,), lambda i: te.cast(te.cast(f[i], "int64") + te.cast(f[i], "int32"), "float32"),
                      name="W")
    v = (rng.standard_normal(n) * 100).astype("float32")
    np.testing.assert_array_equal(build(Task([f, wide]))(v), (v.astype("int64") + v.astype("int32")).astype("float32"))
