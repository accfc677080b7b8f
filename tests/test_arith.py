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
