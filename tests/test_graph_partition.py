"""Graph passes, the cut into fused subgraphs, and subgraphs as te tasks.

Every numeric check compares with the numpy reference executor (`run_graph`) of the graph
before the rewrite, or of the subgraph's own nodes: the passes must not change what the model
computes, and a task's te declaration (evaluated in numpy, no schedule) must compute what its
nodes compute. Errors are max abs differences relative to the RMS of the expected output.
"""

from __future__ import annotations

import numpy as np
import pytest

import ansor
from ansor.graph import passes
from ansor.graph import winograd as graph_winograd
from ansor.graph.ir import Graph
from ansor.graph.partition import op_kind, partition, unique_tasks
from ansor.graph.reference import run_graph
from ansor.graph.to_te import lower_subgraph
from helpers import rel_err

PASS_TOLERANCE = 1e-5
TASK_TOLERANCE = 1e-4


def assert_same_function(before: Graph, after: Graph, inputs: list[np.ndarray]) -> None:
    want, got = run_graph(before, inputs), run_graph(after, inputs)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"output {k}"
        assert rel_err(g, w) < PASS_TOLERANCE, f"output {k}: {rel_err(g, w):.2e}\n{after}"


def subgraph_values(graph: Graph, subgraphs, inputs: list[np.ndarray]) -> dict:
    """Every value of the graph, computed subgraph by subgraph with the reference executor."""
    env = dict(graph.constants)
    env.update(zip(graph.inputs, inputs))
    for s in subgraphs:
        env.update(zip(s.outputs, run_graph(s.graph, [env[i] for i in s.inputs])))
    return env


def check_tasks(graph: Graph, inputs: list[np.ndarray]) -> tuple[list, list[str]]:
    """Partition, then check every subgraph that lowers against its nodes in numpy; return the
    subgraphs and the ops of those that fell back (raised NotImplementedError)."""
    subs = partition(graph)
    env = subgraph_values(graph, subs, inputs)
    for o, want in zip(graph.outputs, run_graph(graph, inputs)):
        assert rel_err(env[o], want) < PASS_TOLERANCE  # the pieces stitch back into the model
    fell_back = []
    for s in subs:
        try:
            lowered = lower_subgraph(s)
        except NotImplementedError as e:
            assert any(n.op in str(e) for n in s.nodes), str(e)
            fell_back.append("+".join(s.ops))
            continue
        ins = [env[i] for i in s.inputs]
        got = lowered.task.reference_outputs(lowered.arguments(ins))
        assert len(got) == len(s.outputs)
        for name, g in zip(s.outputs, got):
            assert g.shape == env[name].shape, s.name
            err = rel_err(g, env[name])
            assert err < TASK_TOLERANCE, f"{s.name} {s.ops}: {err:.2e}"
    return subs, fell_back


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------ passes


def conv_bn_graph(rng, bias: bool, extra_reader: bool) -> Graph:
    g = Graph()
    x = g.add_input("x", (2, 4, 9, 9), "float32")
    ins = [x, g.add_constant(rand(rng, 6, 4, 3, 3))] + ([g.add_constant(rand(rng, 6))] if bias
                                                        else [])
    c = g.add_node("conv2d", ins, {"stride": (2, 2), "padding": (1, 1)})
    stats = [rand(rng, 6), np.abs(rand(rng, 6)) + 0.5, rand(rng, 6), rand(rng, 6)]
    bn = g.add_node("batch_norm", [c] + [g.add_constant(s) for s in stats], {"eps": 1e-3})
    g.outputs = [g.add_node("relu", [bn])] + ([c] if extra_reader else [])
    g.validate()
    return g


@pytest.mark.parametrize("bias", [True, False])
def test_batch_norm_folds_into_the_conv(bias):
    rng = np.random.default_rng(0)
    g = conv_bn_graph(rng, bias, extra_reader=False)
    folded = passes.fold_batch_norm(g)
    assert [n.op for n in folded.nodes] == ["conv2d", "relu"]
    assert len(folded.nodes[0].inputs) == 3  # the folded shift is the conv's bias
    assert [n.op for n in g.nodes] == ["conv2d", "batch_norm", "relu"]  # input left unchanged
    assert_same_function(g, folded, [rand(rng, 2, 4, 9, 9)])


def test_batch_norm_stays_when_the_conv_output_is_read_elsewhere():
    rng = np.random.default_rng(1)
    g = conv_bn_graph(rng, bias=True, extra_reader=True)
    assert [n.op for n in passes.fold_batch_norm(g).nodes] == ["conv2d", "batch_norm", "relu"]


def test_zero_pad_folds_into_the_conv_as_asymmetric_padding_and_the_task_computes_it():
    rng = np.random.default_rng(4)
    g = Graph()
    x = g.add_input("x", (1, 8, 9, 9), "float32")
    p = g.add_node("pad", [x], {"pads": ((0, 0), (0, 0), (0, 1), (1, 2)), "value": 0.0})
    depthwise = g.add_node("conv2d", [p, g.add_constant(rand(rng, 8, 1, 3, 3))],
                           {"stride": (2, 2), "padding": (1, 1), "groups": 8})
    other = g.add_node("relu", [p])  # a second reader keeps the pad alive for itself
    g.outputs = [depthwise, other]
    g.validate()
    folded = passes.fold_pad_into_conv(g)
    conv = next(n for n in folded.nodes if n.op == "conv2d")
    assert conv.attrs["padding"] == (1, 2, 2, 3) and conv.inputs[0] == x
    assert [n.op for n in folded.nodes].count("pad") == 1
    inputs = [rand(rng, 1, 8, 9, 9)]
    assert_same_function(g, folded, inputs)
    g.outputs = [depthwise]
    subs, fell_back = check_tasks(passes.simplify(g, channels_last=False), inputs)  # te's conv takes the 4 paddings
    assert not fell_back and [s.ops for s in subs] == [["conv2d"]]


def test_constant_subexpressions_fold():
    rng = np.random.default_rng(2)
    g = Graph()
    x = g.add_input("x", (3, 5), "float32")
    wt = g.add_node("permute", [g.add_constant(rand(rng, 4, 5))], {"axes": (1, 0)})  # [5, 4]
    scale = g.add_node("mul", [g.add_constant(np.float32(0.5)), g.add_constant(np.float32(3))])
    y = g.add_node("matmul", [x, g.add_node("mul", [wt, scale])])
    g.outputs = [g.add_node("add", [y, g.add_node("neg", [g.add_constant(rand(rng, 4))])])]
    folded = passes.fold_constants(g)
    assert [n.op for n in folded.nodes] == ["matmul", "add"]
    assert all(not all(folded.is_constant(i) for i in n.inputs) for n in folded.nodes)
    assert_same_function(g, folded, [rand(rng, 3, 5)])


def test_identity_ops_are_dropped():
    rng = np.random.default_rng(3)
    g = Graph()
    x = g.add_input("x", (2, 3, 4), "float32")
    v = g.add_node("reshape", [x], {"shape": (2, 3, 4)})
    v = g.add_node("cast", [v], {"dtype": "float32"})
    v = g.add_node("permute", [v], {"axes": (0, 1, 2)})
    v = g.add_node("add", [v, g.add_constant(np.zeros((3, 4), np.float32))])
    v = g.add_node("mul", [g.add_constant(np.float32(1)), v])
    v = g.add_node("slice", [v], {"axis": 1, "start": 0, "end": 3})
    v = g.add_node("relu", [v])
    # multiplying by ones that broadcast to a bigger shape changes the shape: it stays
    g.outputs = [g.add_node("mul", [v, g.add_constant(np.ones((5, 1, 1, 1), np.float32))])]
    cleaned = passes.remove_identities(g)
    assert [n.op for n in cleaned.nodes] == ["relu", "mul"]
    assert_same_function(g, cleaned, [rand(rng, 2, 3, 4)])


# ------------------------------------------------------------------------------ models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class Hidden(torch.nn.Module):
    def __init__(self, model, **kwargs):
        super().__init__()
        self.model, self.kwargs = model, kwargs

    def forward(self, *xs):
        return self.model(*xs, **self.kwargs).last_hidden_state


@pytest.fixture(scope="module")
def resnet18():
    from ansor.graph.torch_importer import from_torch

    torch.manual_seed(0)
    config = transformers.ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                                       layer_type="basic", embedding_size=64)
    model = transformers.ResNetModel(config)
    for m in model.modules():  # non-trivial statistics, so a wrong fold shows
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    graph = from_torch(Hidden(model), [x])
    return graph, [x.numpy()]


@pytest.fixture(scope="module")
def bert_layer():
    from ansor.graph.torch_importer import from_torch

    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=1, hidden_size=256, num_attention_heads=4,
                                     intermediate_size=1024, vocab_size=1000)
    model = transformers.BertModel(config, add_pooling_layer=False)
    ids = torch.randint(0, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, 16, dtype=torch.int64)
    mask[0, 11:] = 0
    graph = from_torch(Hidden(model), [ids, mask])
    return graph, [ids.numpy(), mask.numpy()]


def test_resnet18_simplified_computes_the_same(resnet18):
    graph, inputs = resnet18
    simple = passes.simplify(graph, winograd=False)  # (with Winograd: test_graph_winograd.py)
    assert "batch_norm" in {n.op for n in graph.nodes}
    assert "batch_norm" not in {n.op for n in simple.nodes}
    assert sum(n.op == "conv2d" for n in simple.nodes) == sum(n.op == "conv2d"
                                                              for n in graph.nodes)
    assert_same_function(graph, simple, inputs)


def test_resnet18_partition(resnet18):
    graph, inputs = resnet18
    simple = passes.simplify(graph, winograd=False)
    subs, fell_back = check_tasks(simple, inputs)
    assert fell_back == []
    # every node in exactly one subgraph
    assert sorted(n.output for s in subs for n in s.nodes) == sorted(n.output
                                                                    for n in simple.nodes)
    for s in subs:
        ops = [op for op in s.ops if op_kind(op) != "layout"]  # the transposes to/from NHWC
        if not ops:
            assert s.outputs == simple.outputs  # the output's transpose back to NCHW
            continue
        assert sum(op_kind(op) == "anchor" for op in ops) == 1  # no standalone elementwise
        assert all(op_kind(op) == "injective" for op in ops[1:])
    # each ReLU is fused into the conv that feeds it, and each residual add with its ReLU
    for s in subs:
        if "add" in s.ops:
            assert s.ops == ["conv2d", "add", "relu"]
    convs_with_relu = [s for s in subs if s.ops[0] == "conv2d" and "relu" in s.ops]
    downsample = [s for s in subs if s.ops == ["conv2d"]]
    assert len(convs_with_relu) + len(downsample) == sum(s.ops[0] == "conv2d" for s in subs)
    assert all(s.anchor_node.attrs["stride"] == (2, 2) for s in downsample)
    unique = unique_tasks(subs)
    assert sum(n for _, _, n in unique) == len(subs)
    assert len(unique) < len(subs)
    # the two blocks of a stage end in the same conv + add + relu function (different weights)
    residual = [(k, n) for k, s, n in unique if s.ops == ["conv2d", "add", "relu"]]
    assert residual and all(n == 2 for _, n in residual)


def test_resnet18_with_winograd_convolutions_computes_the_same(resnet18, monkeypatch):
    """With 16 tiles enough, the 16x16 stage's 3x3 convolutions take the Winograd form; the
    model's function is kept, each output transform absorbs its ReLU or residual add + ReLU,
    and every task computes what its ops compute."""
    monkeypatch.setattr(graph_winograd, "MIN_TILES", 16)
    graph, inputs = resnet18
    simple = passes.simplify(graph)
    outputs = [n for n in simple.nodes if n.op == "winograd_output"]
    assert len(outputs) == 4 and all(n.attrs["height"] == 16 for n in outputs)
    assert_same_function(graph, simple, inputs)
    subs, fell_back = check_tasks(simple, inputs)
    assert not fell_back
    epilogues = sorted(tuple(s.ops) for s in subs if s.ops[0] == "winograd_output")
    assert epilogues == [("winograd_output", "add", "relu")] * 2 + [("winograd_output", "relu")] * 2


def test_identical_subgraphs_share_the_task(resnet18):
    subs = partition(passes.simplify(resnet18[0]))
    by_key: dict[str, list] = {}
    for s in subs:
        by_key.setdefault(s.key, []).append(s)
    shared = [group for group in by_key.values() if len(group) > 1]
    assert shared
    for a, b, *_ in shared:
        assert (a.constants, a.inputs) != (b.constants, b.inputs)  # different weights or data ...
        ta, tb = lower_subgraph(a).task, lower_subgraph(b).task
        assert ta.workload_key == tb.workload_key  # ... one tuning task
    keys_and_workloads = {(s.key, lower_subgraph(s).task.workload_key) for s in subs}
    assert len({w for _, w in keys_and_workloads}) == len(by_key)


def test_bert_layer_partition(bert_layer):
    graph, inputs = bert_layer
    simple = passes.simplify(graph)
    assert_same_function(graph, simple, inputs)
    subs, fell_back = check_tasks(simple, inputs)
    ops = [s.ops for s in subs]
    assert ["linear", "gelu"] in ops
    assert ops.count(["layer_norm"]) == sum(n.op == "layer_norm" for n in simple.nodes)
    # attention output and feed-forward: a linear with the residual add fused in; the attention
    # writes its heads last, so the merge of the heads is a reshape (a view), not a permute
    assert ops.count(["linear", "add"]) == 2 and ["reshape"] in ops
    # attention fused into one task (graph.rewrites): the Q, K, V projections merged into one
    # linear, whose slices and heads' splits join the attention task; no softmax of its own
    attention = [o for o in ops if o[-1] == "attention"]
    assert len(attention) == 1 and attention[0].count("slice") == 3
    assert ["softmax"] not in ops and ops.count(["linear"]) == 1
    assert not any(op_kind(s.ops[0]) == "layout" and len(s.inputs) == 1 and s.ops[-1] == "permute"
                   for s in subs)
    assert ["embedding", "add", "add"] in ops  # token + position + type embeddings
    # only the attention mask falls back (te tensors hold numbers, not bools), now with the
    # where that turns it into the fused attention's additive mask ([batch, 1, 1, length])
    assert fell_back == ["cast+index+logical_and+where"]
    assert len(unique_tasks(subs)) < len(subs)  # query, key and value projections share one


# ------------------------------------------------------------------------------ lowering


def test_convolutions_with_activations():
    rng = np.random.default_rng(4)
    g = Graph()
    x = g.add_input("x", (1, 8, 11, 10), "float32")
    w = lambda *s: g.add_constant(rand(rng, *s) * 0.3)  # noqa: E731
    v = g.add_node("conv2d", [x, w(8, 8, 3, 3), w(8)], {"padding": (1, 1)})
    v = g.add_node("clamp", [g.add_node("relu", [v])], {"min": 0.0, "max": 6.0})
    v = g.add_node("conv2d", [v, w(8, 2, 3, 3)], {"padding": (2, 2), "dilation": (2, 2),
                                                  "groups": 4})
    v = g.add_node("hardswish", [v])
    v = g.add_node("conv2d", [v, w(16, 1, 3, 3), w(16)], {"padding": (1, 1), "groups": 8,
                                                           "stride": (2, 1)})  # depthwise x2
    v = g.add_node("silu", [v])
    v = g.add_node("conv2d", [v, w(4, 16, 1, 3)], {"stride": (1, 2), "padding": (0, 1)})
    v = g.add_node("mul", [g.add_node("sigmoid", [v]), g.add_node("tanh", [v])])
    v = g.add_node("gelu", [g.add_node("add", [v, w(4, 1, 1)])])
    g.outputs = [g.add_node("gelu", [v], {"approximate": "tanh"})]
    subs, fell_back = check_tasks(g, [rand(rng, 1, 8, 11, 10)])
    assert fell_back == []
    assert [s.ops[0] for s in subs].count("conv2d") == 4


def test_dense_and_broadcasting_elementwise():
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.add_input("x", (2, 3, 6), "float32")
    y = g.add_input("y", (3, 6, 5), "float32")
    a = g.add_node("linear", [x, g.add_constant(rand(rng, 7, 6)), g.add_constant(rand(rng, 7))])
    x4 = g.add_node("reshape", [x], {"shape": (2, 1, 3, 6)})
    b = g.add_node("matmul", [x4, y])                                    # batches [2, 1] x [3]
    c = g.add_node("matmul", [g.add_node("reshape", [x], {"shape": (6, 6)}),
                              g.add_constant(rand(rng, 6, 4))])          # constant weight
    d = g.add_node("sub", [g.add_node("div", [b, g.add_constant(np.float32(4.0))]),
                           g.add_constant(rand(rng, 3, 1, 1))])
    e = g.add_node("mul", [a, g.add_node("exp", [g.add_input("s", (7,), "float32")])])
    g.outputs = [a, g.add_node("abs", [d]), c, e]
    inputs = [rand(rng, 2, 3, 6), rand(rng, 3, 6, 5), rand(rng, 7)]
    subs, fell_back = check_tasks(g, inputs)
    assert fell_back == []
    assert ["matmul", "div", "sub", "abs"] in [s.ops for s in subs]


def test_normalizations_reductions_and_pooling():
    rng = np.random.default_rng(6)
    g = Graph()
    x = g.add_input("x", (2, 3, 9, 8), "float32")
    outs = [
        g.add_node("softmax", [x], {"axis": 1}),
        g.add_node("log_softmax", [x], {"axis": -1}),
        g.add_node("layer_norm", [x, g.add_constant(rand(rng, 8)), g.add_constant(rand(rng, 8))],
                   {"eps": 1e-6}),
        g.add_node("layer_norm", [x]),
        g.add_node("mean", [x], {"axes": (2, 3), "keepdims": True}),
        g.add_node("sum", [x], {"axes": (1,)}),
        g.add_node("max", [x], {"axes": (0, -1), "keepdims": True}),
        g.add_node("max_pool2d", [x], {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}),
        g.add_node("max_pool2d", [x], {"kernel": (2, 2), "stride": (2, 2), "ceil_mode": True}),
        g.add_node("max_pool2d", [x], {"kernel": (3, 3), "padding": (1, 1), "dilation": (2, 2)}),
        g.add_node("avg_pool2d", [x], {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1)}),
        g.add_node("avg_pool2d", [x], {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1),
                                       "ceil_mode": True, "count_include_pad": False}),
        g.add_node("avg_pool2d", [x], {"kernel": (2, 2), "stride": (2, 2),
                                       "divisor_override": 3}),
        g.add_node("adaptive_avg_pool2d", [x], {"output_size": (1, 1)}),
        g.add_node("adaptive_avg_pool2d", [x], {"output_size": (3, 4)}),
    ]
    g.outputs = outs
    subs, fell_back = check_tasks(g, [rand(rng, 2, 3, 9, 8)])
    assert fell_back == [] and len(subs) == len(outs)


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_attention(mask):
    rng = np.random.default_rng(8)
    g = Graph()
    q = g.add_input("q", (2, 3, 5, 4), "float32")
    k = g.add_input("k", (2, 3, 6, 4), "float32")
    v = g.add_input("v", (2, 3, 6, 7), "float32")
    inputs = [rand(rng, 2, 3, 5, 4), rand(rng, 2, 3, 6, 4), rand(rng, 2, 3, 6, 7)]
    args, attrs = [q, k, v], {}
    if mask == "causal":
        attrs["is_causal"] = True
    elif mask == "bool":
        keep = rng.random((2, 1, 5, 6)) < 0.7
        keep[..., 0] = True  # no fully masked row (its softmax is undefined)
        args.append(g.add_node("logical_not", [g.add_constant(~keep)]))
    elif mask == "float":
        args.append(g.add_input("m", (5, 6), "float32"))
        inputs.append(rand(rng, 5, 6))
    out = g.add_node("scaled_dot_product_attention", args, {**attrs, "scale": 0.3})
    g.outputs = [g.add_node("relu", [out])]
    g = passes.fold_constants(g)  # the bool mask becomes a constant input of the attention
    subs, fell_back = check_tasks(g, inputs)
    assert fell_back == [] and [s.ops for s in subs] == [["scaled_dot_product_attention", "relu"]]
    # as the tuner gets it: cut into scores (scale and mask as their epilogue), softmax and
    # weighted sum, the same function, every piece lowered
    pieces = passes.decompose_attention(g)
    assert_same_function(g, pieces, inputs)
    subs, fell_back = check_tasks(pieces, inputs)
    epilogue = {"none": [], "causal": ["where"], "bool": ["where"], "float": ["add"]}[mask]
    assert fell_back == [] and [s.ops for s in subs] == [
        ["permute", "matmul", "mul", *epilogue], ["softmax"], ["matmul", "relu"]]


def test_layout_ops():
    rng = np.random.default_rng(7)
    g = Graph()
    x = g.add_input("x", (2, 3, 4), "float32")
    y = g.add_input("y", (2, 5, 4), "float32")
    g.outputs = [
        g.add_node("permute", [g.add_node("reshape", [x], {"shape": (6, 2, 2)})],
                   {"axes": (2, 0, 1)}),
        g.add_node("expand", [g.add_node("slice", [x], {"axis": 1, "start": 1, "end": 2})],
                   {"shape": (3, 2, 4, 4)}),
        g.add_node("slice", [y], {"axis": 1, "start": 1, "end": 5, "step": 2}),
        g.add_node("concat", [x, y, x], {"axis": 1}),
        g.add_node("pad", [x], {"pads": ((0, 0), (1, 2), (0, 1)), "value": -1.5}),
    ]
    subs, fell_back = check_tasks(g, [rand(rng, 2, 3, 4), rand(rng, 2, 5, 4)])
    assert fell_back == []
    assert all(s.kind == "layout" for s in subs)


def test_gathers():
    rng = np.random.default_rng(9)
    g = Graph()
    ids = g.add_input("ids", (2, 3), "int64")
    rows = g.add_input("rows", (4, 1), "int64")
    table = g.add_constant(rand(rng, 7, 5))
    e = g.add_node("embedding", [table, ids])
    x = g.add_node("add", [e, g.add_constant(rand(rng, 3, 5))])
    picked = g.add_node("index", [g.add_input("x", (6, 4, 3), "float32"), rows,
                                  g.add_constant(np.array([0, 3, -1], np.int64))])
    g.outputs = [x, g.add_node("relu", [picked])]
    inputs = [np.array([[0, 6, 2], [-1, 3, 3]]), np.array([[5], [0], [-2], [1]]),
              rand(rng, 6, 4, 3)]
    subs, fell_back = check_tasks(g, inputs)
    assert fell_back == []
    assert [s.ops for s in subs] == [["embedding", "add"], ["index", "relu"]]


@pytest.mark.parametrize("case", ["layer_norm", "gt"])
def test_ops_without_a_te_form_name_themselves(case):
    g = Graph()
    x = g.add_input("x", (2, 3, 4), "float32")
    if case == "layer_norm":
        y = g.add_node("layer_norm", [x], {"normalized_ndim": 2})
    else:  # a bool result
        y = g.add_node("gt", [x, g.add_constant(np.zeros(4, np.float32))])
    g.outputs = [y]
    (sub,) = partition(g)
    with pytest.raises(NotImplementedError, match=case):
        lower_subgraph(sub)


def test_a_float16_subgraph_lowers_to_a_float16_task():
    g = Graph()
    g.outputs = [g.add_node("relu", [g.add_input("x", (2, 3, 4), "float16")])]
    (sub,) = partition(g)
    task = lower_subgraph(sub).task
    assert [t.dtype for t in (*task.inputs, *task.outputs)] == ["float16", "float16"]


def test_a_scalar_constant_is_part_of_the_key():
    def scaled(value: float) -> Graph:
        g = Graph()
        x = g.add_input("x", (4, 4), "float32")
        g.outputs = [g.add_node("mul", [x, g.add_constant(np.float32(value))])]
        return g

    def weighted(seed: int) -> Graph:
        g = Graph()
        x = g.add_input("x", (4, 4), "float32")
        w = np.random.default_rng(seed).standard_normal(4).astype(np.float32)
        g.outputs = [g.add_node("mul", [x, g.add_constant(w)])]
        return g

    assert partition(scaled(0.5))[0].key != partition(scaled(2.0))[0].key
    assert partition(weighted(0))[0].key == partition(weighted(1))[0].key


# ------------------------------------------------------------------------------ compiled


def test_subgraph_kernels_match_numpy(resnet18, bert_layer, tmp_path, monkeypatch):
    """An untuned default schedule of a ResNet conv + relu and a BERT layer norm, compiled."""
    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ANSOR_DB", str(tmp_path / "ansor.db"))
    picked = []
    for (graph, inputs), ops in ((resnet18, ["conv2d", "relu"]), (bert_layer, ["layer_norm"])):
        simple = passes.simplify(graph)
        subs = partition(simple)
        env = subgraph_values(simple, subs, inputs)
        sub = next(s for s in subs if s.ops == ops)
        picked.append(sub)
        lowered = lower_subgraph(sub)
        kernel = ansor.build(lowered.task, database=str(tmp_path / "ansor.db"), quick_trials=0)
        ins = [np.ascontiguousarray(env[i]) for i in sub.inputs]
        want = env[sub.outputs[0]]
        got = kernel(*lowered.arguments(ins))
        assert rel_err(got, want) < TASK_TOLERANCE, sub.name
        bound = kernel.bind(**lowered.bindings())
        assert rel_err(bound(*ins), want) < TASK_TOLERANCE, sub.name
    assert [s.ops for s in picked] == [["conv2d", "relu"], ["layer_norm"]]


@pytest.mark.parametrize("model", ["resnet18", "bert_layer"])
def test_models_run_subgraph_by_subgraph_with_compiled_kernels(model, request, tmp_path,
                                                               monkeypatch):
    """Every task compiled with its default schedule (one kernel per unique key), the rest run
    with the reference kernels: the stitched outputs are the original graph's."""
    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ANSOR_DB", str(tmp_path / "ansor.db"))
    graph, inputs = request.getfixturevalue(model)
    simple = passes.simplify(graph)
    subs = partition(simple)
    kernels = {}
    for key, sub, _ in unique_tasks(subs):
        try:
            task = lower_subgraph(sub).task
            kernels[key] = ansor.build(task, database=str(tmp_path / "ansor.db"), quick_trials=0)
        except NotImplementedError:  # only the attention mask (bool values) has no te form
            assert any(sub.graph.types[n.output].dtype == "bool" for n in sub.nodes), sub.ops
    assert kernels
    env = dict(simple.constants)
    env.update(zip(simple.inputs, inputs))
    for s in subs:
        ins = [np.ascontiguousarray(env[i]) for i in s.inputs]
        if s.key in kernels:
            out = kernels[s.key](*lower_subgraph(s).arguments(ins))
            outs = list(out) if isinstance(out, tuple) else [out]
        else:
            outs = run_graph(s.graph, ins)
        env.update(zip(s.outputs, outs))
    for o, want in zip(simple.outputs, run_graph(graph, inputs)):
        assert rel_err(env[o], want) < TASK_TOLERANCE
