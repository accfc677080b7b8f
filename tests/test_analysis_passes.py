"""The CPU passes as the cost model's features run them (`Backend.analysis_passes`): each gives
what the features read of its code-generation namesake's output, so the features of a program
are those of the program as it is printed and run."""

from __future__ import annotations

import random

import numpy as np
import pytest

import ansor
from ansor.backend import backend_for
from ansor.costmodel.features import extract_features, program_features
from ansor.lower import ir
from ansor.lower.lower import lower
from ansor.lower.register_tile import form_register_tiles, form_register_tiles_for_analysis
from ansor.lower.rewrite import map_children
from ansor.lower.unswitch import unswitch_bounds_checks, unswitched_as_scheduled
from ansor.search.evolution import breed_one
from ansor.search.sketch_policy import SketchPolicy
from ansor.target import Target
from ansor.te import expr as E
from ansor.workloads import make_task_tensors

TARGET = Target.cpu("avx512", num_cores=4)

WORKLOADS = [
    ("conv2d", (1, 32, 14, 14, 32, 3, 3), {"padding": 1}),   # padded input: bounds checks, weight prepack
    ("depthwise_conv2d", (1, 32, 28, 28, 3, 3), {"padding": 1}),
    ("matmul", (64, 64, 64), {}),                            # register tiles
    ("max_pool2d", (1, 16, 28, 28, 3), {"stride": 2, "padding": 1}),
]


def sampled(name: str, shape: tuple, options: dict, count: int = 12) -> tuple[ansor.Task, list]:
    task = ansor.Task(make_task_tensors(name, shape, **options), target=TARGET, name=name)
    policy = SketchPolicy(task, seed=0, params={"search_workers": 1})
    try:
        parents = policy.sample(count, set())
        children = [breed_one("tile_size", p, None, random.Random(i), policy.params)
                    for i, p in enumerate(parents)]
    finally:
        policy.close()
    return task, parents + [c for c in children if c is not None]


def as_scheduled(stmt: ir.Stmt) -> ir.Stmt:
    """A program as analyses read it: every `Unswitched` nest as its `slow` nest."""
    if type(stmt) is ir.Unswitched:
        return as_scheduled(stmt.slow)
    return map_children(stmt, as_scheduled)


@pytest.mark.parametrize("name, shape, options", WORKLOADS, ids=[w[0] for w in WORKLOADS])
def test_features_are_those_of_the_printed_program(name, shape, options):
    """Rows from the analysis passes (no prepack function, unswitching and register tiles as
    read) equal rows from the code generation passes, bit for bit."""
    task, states = sampled(name, shape, options)
    backend = backend_for(TARGET)
    compared = 0
    for state in states:
        printed = backend.run_passes(lower(state), TARGET)
        expected = extract_features(printed)
        got = program_features(state, target=TARGET)
        assert got.shape == expected.shape and np.array_equal(got, expected), state.key()
        compared += len(expected) > 0
    assert compared >= len(states) // 2


@pytest.mark.parametrize("name, shape, options", WORKLOADS[:2], ids=[w[0] for w in WORKLOADS[:2]])
def test_unswitching_as_scheduled_is_the_slow_nests(name, shape, options):
    """`unswitched_as_scheduled` is `unswitch_bounds_checks` with each `Unswitched` read as its
    slow nest: the same IR, printed."""
    _, states = sampled(name, shape, options)
    switched = 0
    for state in states:
        func = lower(state)
        full = unswitch_bounds_checks(func)
        switched += sum(isinstance(x, ir.Unswitched) for x in ir.walk_stmts(full.body))
        assert ir.ir_to_str(unswitched_as_scheduled(func).body) == ir.ir_to_str(as_scheduled(full.body))
    assert switched  # the programs do have nests to unswitch


def test_checks_that_always_pass_are_dropped_as_in_code_generation():
    """A nest whose bounds check holds throughout runs unguarded in both views."""
    a = ir.Buffer("A", (32,), "float32", role="input")
    c = ir.Buffer("C", (32,), "float32", role="output")
    i, v = E.Var("i"), E.Var("v")
    idx = i * 8 + v
    value = E.Select((i >= 0) & (idx < 32), ir.BufferLoad(a, (idx,)), E.Const(0.0, "float32"))
    func = ir.PrimFunc("k", [a, c], ir.For(i, 4, "serial", ir.For(v, 8, "vectorized", ir.Store(c, (idx,), value))))
    full = unswitch_bounds_checks(func)
    view = unswitched_as_scheduled(func)
    assert "select" not in ir.ir_to_str(full.body)
    assert ir.ir_to_str(view.body) == ir.ir_to_str(full.body)


def test_checks_that_fail_somewhere_keep_the_nest_as_scheduled():
    """A padded read (the check fails at the border) keeps its select in the analysis view,
    and the code generation pass unswitches the same nest."""
    a = ir.Buffer("A", (30,), "float32", role="input")
    c = ir.Buffer("C", (32,), "float32", role="output")
    i, v = E.Var("i"), E.Var("v")
    idx = i * 8 + v
    value = E.Select((idx >= 1) & (idx < 31), ir.BufferLoad(a, (idx - 1,)), E.Const(0.0, "float32"))
    func = ir.PrimFunc("k", [a, c], ir.For(i, 4, "serial", ir.For(v, 8, "vectorized", ir.Store(c, (idx,), value))))
    view = unswitched_as_scheduled(func)
    assert view.body is func.body
    full = unswitch_bounds_checks(func)
    assert any(isinstance(x, ir.Unswitched) for x in ir.walk_stmts(full.body))
    assert ir.ir_to_str(as_scheduled(full.body)) == ir.ir_to_str(func.body)


def test_register_tiles_for_analysis_keep_the_same_loops():
    """The analysis tiles are the code generation tiles: same nests, same loops kept."""
    _, states = sampled("matmul", (64, 64, 64), {}, count=48)
    caps = backend_for(TARGET).capabilities(TARGET)
    tiles = 0
    for state in states:
        func = lower(state, prepack=False)
        full = [x for x in ir.walk_stmts(form_register_tiles(func, caps.vector_bytes, caps.vector_registers).body)
                if isinstance(x, ir.RegisterTile)]
        seen = [x for x in ir.walk_stmts(form_register_tiles_for_analysis(func, caps.vector_bytes,
                                                                          caps.vector_registers).body)
                if isinstance(x, ir.RegisterTile)]
        assert [(t.nest, t.kept, t.outer) for t in seen] == [(t.nest, t.kept, t.outer) for t in full]
        tiles += len(full)
    assert tiles
