"""The channels-last pass: convolutional graphs rewritten to NHWC compute the same function,
transpose only at their ends, and lower to tasks that compute what their nodes compute."""

from __future__ import annotations

import numpy as np
import pytest

from ansor import te
from ansor.graph import passes
from ansor.graph.ir import Graph
from ansor.graph.layout import to_channels_last
from ansor.graph.reference import run_graph
from ansor.te.evaluate import evaluate
from helpers import rel_err
from test_graph_partition import assert_same_function, check_tasks, rand


def small_cnn(rng) -> Graph:
    """Conv + bias + ReLU6, a strided depthwise conv, a residual add through a 1x1 conv, a
    per-channel scale (a [C,1,1] constant) and a per-column shift (a rank-1 constant along W),
    both pools, a global pool, flatten and a linear layer."""
    g = Graph()
    x = g.add_input("x", (1, 3, 17, 17), "float32")
    c1 = g.add_node("conv2d", [x, g.add_constant(rand(rng, 8, 3, 3, 3)),
                               g.add_constant(rand(rng, 8))], {"padding": (1, 1)})
    c1 = g.add_node("clamp", [c1], {"min": 0.0, "max": 6.0})
    dw = g.add_node("conv2d", [c1, g.add_constant(rand(rng, 8, 1, 3, 3))],
                    {"stride": (2, 2), "padding": (1, 1), "groups": 8})
    pw = g.add_node("conv2d", [dw, g.add_constant(rand(rng, 8, 8, 1, 1))])
    res = g.add_node("add", [pw, dw])
    scaled = g.add_node("mul", [res, g.add_constant(rand(rng, 8, 1, 1))])
    shifted = g.add_node("add", [scaled, g.add_constant(rand(rng, 9))])
    act = g.add_node("relu", [shifted])
    mp = g.add_node("max_pool2d", [act], {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)})
    ap = g.add_node("avg_pool2d", [mp], {"kernel": (2, 2), "stride": (1, 1)})
    gp = g.add_node("adaptive_avg_pool2d", [ap], {"output_size": (1, 1)})
    flat = g.add_node("reshape", [gp], {"shape": (1, 8)})
    y = g.add_node("linear", [flat, g.add_constant(rand(rng, 5, 8))])
    g.outputs = [y]
    g.validate()
    return g


def test_a_cnn_runs_channels_last_between_one_transpose_in_and_a_view_out():
    rng = np.random.default_rng(0)
    g = small_cnn(rng)
    nhwc = to_channels_last(g)
    inputs = [rand(rng, 1, 3, 17, 17)]
    assert_same_function(g, nhwc, inputs)
    spatial = [n for n in nhwc.nodes if n.op in ("conv2d", "max_pool2d", "avg_pool2d",
                                                 "adaptive_avg_pool2d")]
    assert len(spatial) == 6 and all(n.attrs["layout"] == "NHWC" for n in spatial)
    permutes = [n for n in nhwc.nodes if n.op == "permute"]
    assert len(permutes) == 1 and permutes[0].inputs == ["x"]  # only the input's transpose
    # the global pool's [1,1,1,8] -> [1,8,1,1] moves no data: a reshape (a view)
    assert [n.op for n in nhwc.nodes].count("reshape") == 2
    # the per-channel and per-column constants were transposed to broadcast over NHWC
    shapes = sorted(nhwc.constants[i].shape for n in nhwc.nodes if n.op in ("mul", "add")
                    for i in n.inputs if nhwc.is_constant(i))
    assert shapes == [(1, 1, 1, 8), (1, 1, 9, 1)]


def test_channels_last_tasks_compute_what_their_nodes_compute():
    rng = np.random.default_rng(1)
    g = small_cnn(rng)
    subs, fell_back = check_tasks(passes.simplify(g), [rand(rng, 1, 3, 17, 17)])
    assert not fell_back
    assert any(s.anchor_node.attrs.get("layout") == "NHWC" for s in subs if s.anchor_node)


def test_graphs_without_constant_convolutions_are_left_alone():
    g = Graph()
    x = g.add_input("x", (1, 4, 8, 8), "float32")
    w = g.add_input("w", (4, 4, 3, 3), "float32")  # weights computed at run time
    g.outputs = [g.add_node("relu", [g.add_node("conv2d", [x, w], {"padding": (1, 1)})])]
    assert to_channels_last(g) is g
    h = Graph()
    h.outputs = [h.add_node("relu", [h.add_input("x", (2, 3), "float32")])]
    assert to_channels_last(h) is h


def test_an_operand_the_pass_did_not_make_keeps_its_transpose():
    """An add of a conv output and a graph input (NCHW, not made by the pass) stays NCHW."""
    rng = np.random.default_rng(2)
    g = Graph()
    x = g.add_input("x", (1, 4, 6, 6), "float32")
    skip = g.add_input("skip", (1, 4, 6, 6), "float32")
    c = g.add_node("conv2d", [x, g.add_constant(rand(rng, 4, 4, 3, 3))], {"padding": (1, 1)})
    g.outputs = [g.add_node("add", [c, skip])]
    nhwc = to_channels_last(g)
    assert_same_function(g, nhwc, [rand(rng, 1, 4, 6, 6), rand(rng, 1, 4, 6, 6)])
    add = next(n for n in nhwc.nodes if n.op == "add")
    assert "skip" in add.inputs and nhwc.type_of(add.output).shape == (1, 4, 6, 6)


def test_simplify_can_keep_nchw():
    g = small_cnn(np.random.default_rng(3))
    assert all(n.attrs.get("layout", "NCHW") == "NCHW"
               for n in passes.simplify(g, channels_last=False).nodes)


@pytest.mark.parametrize("stride,mult", [(1, 1), (2, 1), (2, 2)])
def test_depthwise_nhwc_declaration_matches_nchw(stride, mult):
    rng = np.random.default_rng(4)
    x, w = rand(rng, 1, 6, 9, 9), rand(rng, 6 * mult, 1, 3, 3)
    a = te.placeholder(x.shape, "float32", "a")
    b = te.placeholder(w.shape, "float32", "b")
    (want,) = evaluate(te.ops.depthwise_conv2d(a, b, stride, 1), {a: x, b: w})
    c = te.placeholder((1, 9, 9, 6), "float32", "c")
    d = te.placeholder((3, 3, 1, 6 * mult), "float32", "d")
    (got,) = evaluate(te.ops.depthwise_conv2d(c, d, stride, 1, layout="NHWC"),
                   {c: x.transpose(0, 2, 3, 1), d: w.transpose(2, 3, 1, 0)})
    assert rel_err(got.transpose(0, 3, 1, 2), want) < 1e-5


def test_reference_executor_runs_nhwc_operators():
    rng = np.random.default_rng(5)
    g = small_cnn(rng)
    x = rand(rng, 1, 3, 17, 17)
    (want,), (got,) = run_graph(g, [x]), run_graph(to_channels_last(g), [x])
    assert rel_err(got, want) < 1e-5
