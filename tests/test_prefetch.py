"""Next-task prefetches (`lower/prefetch.py`): a register tile that sweeps its rows over a panel
of packed weights walks the panel of the thread's next task, exactly and within the buffer, and
the program computes what it computed without them."""

from __future__ import annotations

import numpy as np
import pytest

from ansor import te
from ansor.backend import backend_for
from ansor.kernel import compile_state
from ansor.lower import ir
from ansor.lower.prefetch import plan_prefetch
from ansor.search.sketch_policy import SketchPolicy
from ansor.task import Task
from ansor.te import expr as E


def _linear_task() -> Task:
    a = te.placeholder((64, 512), name="A")
    w = te.placeholder((192, 512), name="W")
    k = te.reduce_axis(512, name="k")
    c = te.compute((64, 192), lambda i, j: te.sum(a[i, k] * w[j, k], axis=k), name="C")
    return Task([a, w, c])


def _tiles_with_context(body: ir.Stmt, parallel=None, path=()):
    """(tile, parallel loop, loops between them) of every register tile."""
    if type(body) is ir.RegisterTile:
        yield body, parallel, list(path)
        return
    if type(body) is ir.For:
        if parallel is None and body.kind == "parallel":
            yield from _tiles_with_context(body.body, body, ())
        else:
            inner = (*path, body) if parallel is not None else path
            yield from _tiles_with_context(body.body, parallel, inner)
    elif type(body) is ir.Seq:
        for s in body.stmts:
            yield from _tiles_with_context(s, parallel, path)
    elif type(body) is ir.Allocate:
        yield from _tiles_with_context(body.body, parallel, path)


@pytest.fixture(scope="module")
def prefetched():
    """A sampled program of the linear whose lowering prefetches, with its tile in context."""
    task = _linear_task()
    backend = backend_for(task.target)
    policy = SketchPolicy(task, seed=0, params={"search_workers": 1})
    for _ in range(10):
        for state in policy.sample(100):
            func = backend.lower(state, task.target, "kernel")
            for tile, parallel, path in _tiles_with_context(func.body):
                if tile.prefetches:
                    return task, state, tile, parallel, path
    pytest.fail("no sampled program of a swept weight panel got a prefetch")


_NUMPY_OPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "//": np.floor_divide, "%": np.mod,
              "min": np.minimum, "max": np.maximum}


def _evaluate(expr: E.Expr, env: dict) -> np.ndarray:
    """An integer index expression over numpy arrays of its variables' values."""
    if isinstance(expr, E.Const):
        return np.int64(expr.value)
    if isinstance(expr, E.Var):
        return env[id(expr)]
    assert isinstance(expr, E.BinOp), expr
    return _NUMPY_OPS[expr.op](_evaluate(expr.a, env), _evaluate(expr.b, env))


def _values(expr: E.Expr, loops: list[ir.For], fixed: dict) -> np.ndarray:
    """`expr` at every point of the loops (the variables of `fixed` at its values), flat."""
    grids = np.meshgrid(*[np.arange(f.extent, dtype=np.int64) for f in loops], indexing="ij")
    env = {id(f.var): g for f, g in zip(loops, grids)}
    env.update({id(v): np.int64(n) for v, n in fixed.items()})
    return np.broadcast_to(_evaluate(expr, env), grids[0].shape if grids else ()).ravel()


def test_the_prefetches_walk_the_next_tasks_panel_within_the_buffer(prefetched):
    task, state, tile, parallel, path = prefetched
    loops = tile.loops()
    walked = [*path, *loops[:tile.kept]]
    store = loops[-1].body
    weights = next(ld for ld in E.walk(store.value)
                   if isinstance(ld, ir.BufferLoad) and ld.buffer is tile.prefetches[0][0])
    offset = weights.buffer.flat_index(weights.indices)
    size = weights.buffer.size
    lines = 64 // E.DTYPE_BYTES[weights.buffer.dtype]
    for p in range(parallel.extent):
        at = {parallel.var: p}
        following = {parallel.var: min(p + 1, parallel.extent - 1)}
        panel = set((_values(offset, [*path, *loops], following) // lines).tolist())
        fetched = set()
        for buf, index in tile.prefetches:
            assert buf is weights.buffer
            elements = _values(index, walked, at)
            assert elements.min() >= 0 and elements.max() < size
            fetched |= set((elements // lines).tolist())
        assert fetched == panel, f"task {p}: the prefetches miss or overrun the next task's panel"


def test_a_prefetching_program_computes_the_linear(prefetched, tmp_path):
    from ansor.measure import Builder

    task, state, *_ = prefetched
    source, _ = backend_for(task.target).generate_source(state, task.target)
    assert "__builtin_prefetch" in source
    inputs = task.random_inputs(0)
    expected = task.reference_outputs(inputs)[0]
    out = compile_state(task, state, builder=Builder(cache_dir=tmp_path))(*inputs)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)


def test_no_prefetch_of_an_operand_every_task_reads_alike_nor_of_a_small_panel(prefetched):
    """Prefetched: an operand whose elements depend on the task (the weights' column panel, or
    the activations' rows where the columns are swept). Not prefetched: one every task reads
    alike, and any panel under the size bound."""
    task, state, tile, parallel, path = prefetched
    loads = {id(ld.buffer): ld for ld in E.walk(tile.loops()[-1].body.value) if isinstance(ld, ir.BufferLoad)}
    for buf, _ in tile.prefetches:
        ld = loads[id(buf)]
        assert buf.role in ("input", "packed")
        assert any(v is parallel.var for v in E.free_vars(buf.flat_index(ld.indices)))
    # the same nest under a parallel loop none of its operands depends on: nothing to fetch ahead
    unrelated = ir.For(E.Var("q", "int32"), parallel.extent, "parallel", parallel.body)
    assert plan_prefetch(tile, unrelated, path, {}) == ()
    import ansor.lower.prefetch as prefetch
    bound = prefetch.MIN_PANEL_BYTES
    try:
        prefetch.MIN_PANEL_BYTES = 1 << 30
        assert plan_prefetch(tile, parallel, path, {}) == ()
    finally:
        prefetch.MIN_PANEL_BYTES = bound
    assert plan_prefetch(tile, parallel, path, {})
