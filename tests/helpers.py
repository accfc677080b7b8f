"""Shared helpers for the schedule, lowering and codegen tests.

`OPERATORS` holds small workloads, each with an independent numpy reference (the references
never go through `ansor.te.evaluate`, so a schedule bug cannot hide behind an evaluator bug).
`run_and_check` compiles a State, runs it on random inputs and compares with the reference.

A library bug found by these tests gets a minimal repro marked
`@pytest.mark.xfail(strict=True, reason="BUG ...")`; if the random programs of
test_schedule_property.py would hit it too, that generator steers around it (with a comment
naming the repro) until the fix lands, so the suite stays green and the fix shows as XPASS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import numpy as np

import ansor
from ansor import te
from ansor.kernel import compile_state
from ansor.measure import Builder

RTOL = 1e-4
ATOL_UNIT = 1e-5


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module, for tests of its arguments and dry runs (the folder is
    not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_close(actual: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """float32 comparison: rtol 1e-4, atol 1e-5 scaled by the largest expected magnitude."""
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    np.testing.assert_allclose(actual, expected.astype(actual.dtype), rtol=RTOL,
                               atol=ATOL_UNIT * scale, err_msg=what)


def rel_err(got, want) -> float:
    """Max abs difference relative to the RMS of `want` (1 where that is 0): the error measure
    of whole-model and graph checks, where a per-element tolerance would be set by outliers.
    Infinities (masked attention scores) must sit where `want` has them, with the same sign;
    the error is over the finite rest."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want)
    if not finite.all():
        if not np.array_equal(got[~finite], want[~finite], equal_nan=True):
            return math.inf
        got, want = got[finite], want[finite]
    if want.size == 0:
        return 0.0
    rms = float(np.sqrt(np.mean(np.square(want)))) or 1.0
    return float(np.max(np.abs(got - want))) / rms


def tiled_matmul() -> tuple[ansor.Task, ansor.State]:
    """matmul 32x40x64 with a 4 x 16 cache-write tile computed at the output's tile loop: k
    outermost in the tile, columns vectorized (a register tile for the CPU's lowering passes)."""
    A = te.placeholder((32, 40), name="A")
    B = te.placeholder((40, 64), name="B")
    task = ansor.Task([A, B, te.ops.matmul(A, B)])
    s = ansor.State(task.dag)
    cache = s.cache_write("matmul", "local")
    s.split("matmul", "i", [4])
    s.split("matmul", "j", [16])
    s.reorder("matmul", ["i.0", "j.0", "i.1", "j.1"])
    s.compute_at(cache, "matmul", "j.0")
    s.reorder("matmul.local", ["k", "i", "j"])
    s.annotate("matmul.local", "j", "vectorize")
    return task, s


def random_inputs(task: ansor.Task, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 1.0, size=t.shape).astype(t.dtype) for t in task.inputs]


def run_state(task: ansor.Task, state: ansor.State, builder: Builder,
              inputs: list[np.ndarray]) -> np.ndarray:
    kernel = compile_state(task, state, builder=builder)
    try:
        return kernel(*inputs)
    finally:
        kernel.close()


def run_and_check(op: "Operator", task: ansor.Task, state: ansor.State, builder: Builder,
                  seed: int = 0) -> np.ndarray:
    """Compile and run `state`; assert its output matches the numpy reference of `op`."""
    inputs = random_inputs(task, seed)
    out = run_state(task, state, builder, inputs)
    expected = op.reference(*[a.astype(np.float64) for a in inputs])
    assert_close(out, expected, f"{op.name}, steps {state.steps_json()}\n{state}")
    return out


# ---------------------------------------------------------------------------------------------
# numpy references (float64)

def np_conv2d_nchw(x, w, stride: int, pad: int):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = xp.shape
    o, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for ry in range(kh):
        for rx in range(kw):
            patch = xp[:, :, ry:ry + stride * oh:stride, rx:rx + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, ry, rx])
    return out


def np_depthwise_conv2d(x, w, stride: int, pad: int):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, c, h, wd = xp.shape
    _, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, c, oh, ow))
    for ry in range(kh):
        for rx in range(kw):
            patch = xp[:, :, ry:ry + stride * oh:stride, rx:rx + stride * ow:stride]
            out += patch * w[None, :, 0, ry, rx, None, None]
    return out


def np_max_pool2d(x, k: int, stride: int, pad: int):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    n, c, h, w = xp.shape
    oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
    out = np.full((n, c, oh, ow), -np.inf)
    for ry in range(k):
        for rx in range(k):
            out = np.maximum(out, xp[:, :, ry:ry + stride * oh:stride, rx:rx + stride * ow:stride])
    return out


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_layer_norm(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


# ---------------------------------------------------------------------------------------------
# operators

@dataclass(frozen=True)
class Operator:
    name: str
    make: Callable[[], list]           # -> [inputs..., output] tensors, fresh each call
    reference: Callable[..., np.ndarray]

    def task(self) -> ansor.Task:
        return ansor.Task(self.make())


def _matmul():
    A = te.placeholder((16, 24), name="A")
    B = te.placeholder((24, 20), name="B")
    return [A, B, te.ops.matmul(A, B)]


def _matmul_bias_relu():
    A = te.placeholder((16, 24), name="A")
    B = te.placeholder((24, 20), name="B")
    bias = te.placeholder((20,), name="bias")
    mm = te.ops.matmul(A, B)
    return [A, B, bias, te.ops.relu(te.ops.bias_add(mm, bias, axis=1))]


def _batch_matmul():
    A = te.placeholder((2, 8, 12), name="A")
    B = te.placeholder((2, 12, 10), name="B")
    return [A, B, te.ops.batch_matmul(A, B)]


def _conv2d(stride: int):
    def make():
        x = te.placeholder((1, 3, 10, 10), name="data")
        w = te.placeholder((4, 3, 3, 3), name="weight")
        return [x, w, te.ops.conv2d(x, w, stride=stride, padding=1)]
    return make


def _depthwise_conv2d():
    x = te.placeholder((1, 4, 9, 9), name="data")
    w = te.placeholder((4, 1, 3, 3), name="weight")
    return [x, w, te.ops.depthwise_conv2d(x, w, stride=1, padding=1)]


def _softmax():
    X = te.placeholder((6, 20), name="X")
    return [X, te.ops.softmax(X)]


def _layer_norm():
    X = te.placeholder((6, 20), name="X")
    g = te.placeholder((20,), name="gamma")
    b = te.placeholder((20,), name="beta")
    return [X, g, b, te.ops.layer_norm(X, g, b)]


def _norm2():
    X = te.placeholder((6, 20), name="X")
    return [X, te.ops.norm2(X)]


def _max_pool2d():
    x = te.placeholder((1, 3, 9, 9), name="data")
    return [x, te.ops.max_pool2d(x, 3, stride=2, padding=1)]


def _elementwise_chain():
    """Four elementwise stages declared directly (a candidate for inlining everything)."""
    x = te.placeholder((8, 12), name="x")
    y = te.placeholder((8, 12), name="y")
    s = te.compute((8, 12), lambda i, j: x[i, j] + y[i, j], name="sum_xy")
    h = te.compute((8, 12), lambda i, j: s[i, j] * 0.5 - y[i, j], name="half")
    e = te.compute((8, 12), lambda i, j: te.exp(h[i, j]), name="expo")
    return [x, y, te.compute((8, 12), lambda i, j: te.maximum(e[i, j] - 1.0, h[i, j]), name="out")]


def _np_chain(x, y):
    h = (x + y) * 0.5 - y
    return np.maximum(np.exp(h) - 1.0, h)


OPERATORS: dict[str, Operator] = {op.name: op for op in [
    Operator("matmul", _matmul, lambda a, b: a @ b),
    Operator("matmul_bias_relu", _matmul_bias_relu, lambda a, b, c: np.maximum(a @ b + c, 0.0)),
    Operator("batch_matmul", _batch_matmul, lambda a, b: a @ b),
    Operator("conv2d_s1", _conv2d(1), lambda x, w: np_conv2d_nchw(x, w, 1, 1)),
    Operator("conv2d_s2", _conv2d(2), lambda x, w: np_conv2d_nchw(x, w, 2, 1)),
    Operator("depthwise_conv2d", _depthwise_conv2d, lambda x, w: np_depthwise_conv2d(x, w, 1, 1)),
    Operator("softmax", _softmax, np_softmax),
    Operator("layer_norm", _layer_norm, np_layer_norm),
    Operator("norm2", _norm2, lambda x: np.sqrt(np.sum(x * x)).reshape(1)),
    Operator("max_pool2d", _max_pool2d, lambda x: np_max_pool2d(x, 3, 2, 1)),
    Operator("elementwise_chain", _elementwise_chain, _np_chain),
]}


def built_libraries(builder: Builder, sources: dict[str, str]) -> dict[str, str]:
    """Each named C source built (in one parallel batch), as {name: library path}; a source
    that does not build fails the test that asked for it."""
    from ansor.measure import MeasureErrorNo

    results = builder.build(list(sources.values()))
    for name, result in zip(sources, results):
        assert result.error_no == MeasureErrorNo.NO_ERROR, (name, result.error_msg)
    return {name: result.lib_path for name, result in zip(sources, results)}


def vector_add_arrays(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Inputs and expected output of an elementwise float32 `a + b` of n values, seeded: the
    task the measurement tests' C kernels compute."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    return [a, b], [a + b]
