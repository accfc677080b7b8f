"""int8 x int8 -> int32 matmuls (`torch._int_mm`) on VNNI's uint8 x int8 instruction through the
+128 offset (graph/int8_offset.py): bit-exact against numpy's int32 matmul, with the
instruction where the CPU has it and with the widening loop everywhere."""

from __future__ import annotations

import numpy as np
import pytest

import ansor
from ansor.backend.registry import generate_source
from ansor.graph import (
    passes,
    quantized_ops,  # noqa: F401  (registers matmul_integer)
)
from ansor.graph.int8_offset import offset_signed_int8_matmuls
from ansor.graph.ir import Graph
from ansor.graph.model_tasks import extract_tasks
from ansor.graph.reference import run_graph
from ansor.kernel import compile_state
from ansor.search.sketch_policy import SketchPolicy
from ansor.target import Target


def _operands(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a[0, :], b[:, 0] = -128, -128  # the extreme products, and the largest column sum
    a[1, :], b[:, 1] = 127, 127
    return a, b


def _int_mm_graph(a_shape: tuple[int, int], b: np.ndarray) -> Graph:
    g = Graph()
    x = g.add_input("a", a_shape, "int8")
    g.outputs.append(g.add_node("matmul_integer", [x, g.add_constant(b, "w")]))
    g.validate()
    return g


def test_offset_form_is_bit_exact_in_the_reference_executor():
    a, b = _operands(16, 96, 24)
    g = _int_mm_graph(a.shape, b)
    offset = offset_signed_int8_matmuls(g)
    ops = [n.op for n in offset.nodes]
    assert ops == ["cast", "add", "cast", "matmul_integer", "sub"]
    assert offset.type_of(offset.nodes[3].inputs[0]).dtype == "uint8"
    want = a.astype(np.int32) @ b.astype(np.int32)
    (got,) = run_graph(offset, [a])
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int32
    uint8_graph = Graph()  # an unsigned activation is the instruction's form already: untouched
    x = uint8_graph.add_input("a", a.shape, "uint8")
    uint8_graph.outputs.append(uint8_graph.add_node("matmul_integer", [x, uint8_graph.add_constant(b, "w")]))
    assert offset_signed_int8_matmuls(uint8_graph) is uint8_graph


def test_int8_matmul_model_compiles_bit_exact():
    a, b = _operands(32, 64, 48, seed=1)
    model = ansor.build(_int_mm_graph(a.shape, b), quick_seconds=0, verbose=False)
    np.testing.assert_array_equal(model(a), a.astype(np.int32) @ b.astype(np.int32))
    assert "matmul_integer_sub" in model.summary()  # the correction fused into the matmul's task


@pytest.mark.parametrize("features", [("avx512_vnni",), ()], ids=["vnni", "widening"])
def test_int8_matmul_task_uses_vpdpbusd_and_is_bit_exact(features):
    """The matmul's sampled programs use vpdpbusd on a VNNI target (compiled for it on any
    x86 CPU) and, where this CPU has the instruction (or with none), run bit-exact."""
    a, b = _operands(64, 128, 64, seed=2)
    host = Target.host()
    runnable = all(f in host.dot_products for f in features)
    target = Target.host(dot_products=features) if runnable else Target.cpu("avx512", 2, features)
    g = passes.simplify(_int_mm_graph(a.shape, b))
    tasks = extract_tasks(g, target)
    matmul = next(t for t in tasks.tasks if t.name.startswith("matmul_integer"))
    shifted = (a.astype(np.int16) + 128).astype(np.uint8)
    want = a.astype(np.int32) @ b.astype(np.int32)
    correction = 128 * b.astype(np.int32).sum(axis=0)
    policy = SketchPolicy(matmul, seed=0)
    try:
        states = policy.sample(24)
    finally:
        policy.close()
    using = [s for s in states if "dpbusd" in generate_source(s, target)[0]]
    assert bool(using) == bool(features)
    if not runnable:
        return
    for state in (using or states)[:3]:
        got = compile_state(matmul, state)(shifted, b, correction.astype(np.int32))
        np.testing.assert_array_equal(got, want)


def test_torch_int_mm_imports_as_an_integer_matmul():
    torch = pytest.importorskip("torch")
    a, b = _operands(32, 64, 32, seed=3)

    class IntMM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("w", torch.from_numpy(b))

        def forward(self, x):
            return torch._int_mm(x, self.w)

    graph = ansor.graph.from_torch(IntMM(), (torch.from_numpy(a),))
    assert [n.op for n in graph.nodes] == ["matmul_integer"]
    want = torch._int_mm(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_array_equal(want, a.astype(np.int32) @ b.astype(np.int32))
    model = ansor.build(graph, quick_seconds=0, verbose=False)
    np.testing.assert_array_equal(model(torch.from_numpy(a)).numpy(), want)
