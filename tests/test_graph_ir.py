"""The model graph IR: building, validation, ordering, rewriting, structural keys, printing,
and the numpy reference executor on hand-built graphs (no PyTorch needed)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ansor.graph import Graph, GraphError, TensorType
from ansor.graph.reference import run_graph


def conv_graph(seed: int = 0, channels: int = 8) -> Graph:
    rng = np.random.default_rng(seed)
    g = Graph()
    x = g.add_input("x", (1, 3, 16, 16), "float32")
    w = g.add_constant(rng.standard_normal((channels, 3, 3, 3)).astype("float32"))
    b = g.add_constant(rng.standard_normal(channels).astype("float32"))
    y = g.add_node("conv2d", [x, w, b], {"stride": (2, 2), "padding": (1, 1)})
    r = g.add_node("relu", [y])
    g.outputs.append(r)
    return g


def test_add_node_derives_types_and_fills_defaults():
    g = conv_graph()
    conv, relu = g.nodes
    assert g.types[conv.output] == TensorType((1, 8, 8, 8), "float32")
    assert conv.attrs["dilation"] == (1, 1) and conv.attrs["groups"] == 1
    assert g.types[relu.output] == g.types[conv.output]
    g.validate()


def test_add_node_rejects_inconsistent_shapes():
    g = conv_graph()
    w = g.add_constant(np.zeros((4, 5), "float32"))
    with pytest.raises(GraphError, match="linear"):
        g.add_node("linear", [g.outputs[0], w])
    with pytest.raises(GraphError, match="unknown operator"):
        g.add_node("no_such_op", [g.outputs[0]])
    with pytest.raises(GraphError, match="unknown attributes"):
        g.add_node("relu", [g.outputs[0]], {"alpha": 1.0})


def test_validate_catches_use_before_definition_and_wrong_types():
    g = conv_graph()
    g.nodes.reverse()
    with pytest.raises(GraphError, match="before its definition"):
        g.validate()
    g.nodes.reverse()
    g.validate()
    g.types[g.nodes[1].output] = TensorType((1, 8, 4, 4), "float32")
    with pytest.raises(GraphError, match="recorded type"):
        g.validate()


def test_topological_order_repairs_out_of_order_nodes():
    g = conv_graph()
    a = g.add_node("sigmoid", [g.outputs[0]])
    c = g.add_node("mul", [a, g.outputs[0]])
    g.nodes = [g.nodes[3], g.nodes[1], g.nodes[2], g.nodes[0]]
    g.sort()
    g.validate()
    assert [n.op for n in g.nodes] == ["conv2d", "relu", "sigmoid", "mul"]
    assert g.producers()[c].op == "mul"
    assert [n.op for n in g.consumers()[g.nodes[1].output]] == ["sigmoid", "mul"]


def test_replace_uses_and_remove_dead():
    original = conv_graph()
    g = original.copy()
    relu = g.outputs[0]
    conv = g.nodes[0].output
    g.replace_uses(relu, conv)
    g.remove_dead()
    assert [n.op for n in g.nodes] == ["conv2d"] and g.outputs == [conv]
    g.validate()
    with pytest.raises(GraphError, match="cannot replace"):
        g.replace_uses(conv, "x")
    assert [n.op for n in original.nodes] == ["conv2d", "relu"]  # the copy was independent
    original.validate()


def test_node_key_ignores_names_and_weights_but_not_structure():
    a, b = conv_graph(seed=0), conv_graph(seed=1)
    assert a.node_key(a.nodes[0]) == b.node_key(b.nodes[0])
    c = conv_graph(channels=16)
    assert a.node_key(a.nodes[0]) != c.node_key(c.nodes[0])
    d = conv_graph()
    d.nodes[0].attrs["stride"] = (1, 1)
    assert a.node_key(a.nodes[0]) != d.node_key(d.nodes[0])
    assert a.node_key(a.nodes[0]) != a.node_key(a.nodes[1])


def test_str_prints_one_line_per_node_with_types():
    g = conv_graph()
    text = str(g)
    conv_line = next(line for line in text.splitlines() if "conv2d" in line)
    w, b = g.nodes[0].inputs[1:]
    assert conv_line.strip() == (f"%{g.nodes[0].output} = conv2d(%x, {w}, {b}, stride=2, "
                                 f"padding=1)  # 1x8x8x8 float32")
    assert len(text.splitlines()) == len(g.nodes) + 3


def test_reference_runs_hand_built_graph():
    g = conv_graph()
    x = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype("float32")
    (y,) = run_graph(g, {"x": x})
    w, b = (g.constants[n] for n in g.nodes[0].inputs[1:])
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 8, 8, 8), "float32")
    for i in range(8):
        for j in range(8):
            patch = xp[0, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3]
            want[0, :, i, j] = np.tensordot(w, patch, axes=3) + b
    np.testing.assert_allclose(y, np.maximum(want, 0), rtol=1e-5, atol=1e-5)
    with pytest.raises(GraphError, match="expected shape"):
        run_graph(g, {"x": x[:, :, :8]})


def test_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import ansor.graph, ansor.graph.torch_importer,"
            " ansor.graph.reference; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
