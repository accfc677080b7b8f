"""The Winograd pass: eligible 3x3 convolutions become three ops that compute the same function
(in numpy and as compiled tasks), others stay direct, and a model keeps its answer."""

from __future__ import annotations

import numpy as np
import pytest

import ansor
from ansor.graph import passes
from ansor.graph.ir import Graph
from ansor.graph.layout import to_channels_last
from ansor.graph.model_tasks import extract_tasks
from ansor.graph.reference import run_graph
from ansor.graph import winograd as graph_winograd
from ansor.graph.winograd import to_winograd
from ansor.te import winograd
from helpers import rel_err
from test_graph_partition import assert_same_function, check_tasks, rand


@pytest.fixture(autouse=True)
def _small_images_take_the_winograd_form(monkeypatch):
    """The graphs here are small: 16 tiles are enough (the default asks for more)."""
    monkeypatch.setattr(graph_winograd, "MIN_TILES", 16)


@pytest.mark.parametrize("tile", sorted(winograd.POINTS))
def test_the_matrices_compute_a_3_tap_correlation(tile):
    """Y = A^T [(G g) * (B^T d)] is the correlation of tile + 2 inputs with 3 taps, exactly."""
    at, g, bt = winograd.winograd_matrices(tile)
    rng = np.random.default_rng(tile)
    d, taps = rng.standard_normal(tile + 2), rng.standard_normal(3)
    expected = np.array([d[i:i + 3] @ taps for i in range(tile)])
    np.testing.assert_allclose(at @ ((g @ taps) * (bt @ d)), expected, rtol=1e-10, atol=1e-10)


def test_an_unsupported_tile_is_a_clear_error():
    with pytest.raises(ValueError, match="tile 3 not supported"):
        winograd.winograd_matrices(3)
    with pytest.raises(ValueError, match="3x3 filters"):
        winograd.transform_weight(np.zeros((5, 5, 2, 2), np.float32))


def conv_graph(rng, batch: int, size: tuple[int, int], padding, bias: bool, stride=(1, 1),
               kernel: int = 3) -> Graph:
    """conv2d (+ bias) + ReLU + a residual add of the input, NCHW as imported."""
    g = Graph()
    x = g.add_input("x", (batch, 6, *size), "float32")
    ins = [x, g.add_constant(rand(rng, 6, 6, kernel, kernel) / 4)] + ([g.add_constant(rand(rng, 6))] if bias else [])
    c = g.add_node("conv2d", ins, {"padding": padding, "stride": stride})
    r = g.add_node("relu", [c])
    g.outputs = [g.add_node("add", [r, x]) if g.types[r].shape == g.types[x].shape else r]
    g.validate()
    return g


@pytest.mark.parametrize("batch,size,padding,bias", [
    (1, (16, 16), (1, 1), True),          # whole tiles
    (2, (13, 18), (1, 1), False),         # tiles that overhang the image, a batch of two
    (1, (17, 15), (1, 0, 2, 1), True),    # asymmetric padding (a folded pad)
])
def test_eligible_convolutions_take_the_winograd_form_and_keep_their_function(batch, size, padding, bias):
    rng = np.random.default_rng(batch)
    g = conv_graph(rng, batch, size, padding, bias)
    simplified = passes.simplify(g)
    ops = [n.op for n in simplified.nodes]
    assert "conv2d" not in ops and ops.count("winograd_input") == ops.count("winograd_output") == 1
    inputs = [rand(rng, batch, 6, *size)]
    assert_same_function(g, simplified, inputs)
    subs, fell_back = check_tasks(simplified, inputs)  # each task computes what its ops compute
    assert not fell_back
    output_task = next(s for s in subs if "winograd_output" in s.ops)
    assert "relu" in output_task.ops  # the activation fused into the output transform's task


def test_other_convolutions_stay_direct():
    rng = np.random.default_rng(3)
    cases = [conv_graph(rng, 1, (16, 16), (1, 1), True, stride=(2, 2)),  # strided
             conv_graph(rng, 1, (16, 16), (2, 2), True, kernel=5),       # 5x5
             conv_graph(rng, 1, (6, 6), (1, 1), True)]                   # 4 tiles: too few
    for g in cases:
        nhwc = to_channels_last(g)
        assert to_winograd(nhwc) is nhwc
        assert "winograd_input" not in [n.op for n in passes.simplify(g).nodes]
    assert "conv2d" in [n.op for n in passes.simplify(conv_graph(rng, 1, (16, 16), (1, 1), True),
                                                      winograd=False).nodes]


def test_identical_convolutions_share_their_three_tasks():
    """Two same-shaped convolutions share the products and output transform tasks, whatever
    their weights (the first input transform also does the NCHW -> NHWC transpose)."""
    rng = np.random.default_rng(4)
    g = Graph()
    x = g.add_input("x", (1, 8, 20, 20), "float32")
    y = x
    for _ in range(2):
        y = g.add_node("relu", [g.add_node("conv2d", [y, g.add_constant(rand(rng, 8, 8, 3, 3)),
                                                     g.add_constant(rand(rng, 8))], {"padding": (1, 1)})])
    g.outputs = [y]
    model = extract_tasks(g)
    weights = {t.name.split()[0]: w for t, w in zip(model.tasks, model.weights)}
    assert weights == {"permute_winograd_input": 1, "winograd_input": 1, "matmul": 2,
                       "winograd_output_relu": 2, "permute": 1}, weights
    got = model.graph.constants
    weights = [c for c in got.values() if c.shape == (36, 8, 8)]
    assert len(weights) == 2 and rel_err(weights[0], weights[1]) > 0.1


def test_a_compiled_model_with_winograd_convolutions_matches_the_reference(tmp_path):
    """Default schedules of the three tasks, run as a model, against the graph's numpy meaning."""
    rng = np.random.default_rng(5)
    g = conv_graph(rng, 1, (16, 16), (1, 1), True)
    compiled = ansor.build(g, database=str(tmp_path / "empty.db"))
    assert "winograd_output" in [n.op for n in compiled.tasks.graph.nodes]
    x = rand(rng, 1, 6, 16, 16)
    (want,) = run_graph(g, [x])
    assert rel_err(compiled(x), want) < 1e-4
