"""PyTorch import: every mapped operator and the reference networks, checked against eager.

Each case imports a module with `from_torch`, runs the graph with the numpy reference executor
and compares with PyTorch eager on the same inputs (max abs error relative to the output RMS).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from ansor.graph.torch_importer import UnsupportedOperatorError, from_torch  # noqa: E402
from ansor.graph.reference import run_graph  # noqa: E402

TOLERANCE = 1e-3


def check_import(module: "nn.Module", *inputs: "torch.Tensor"):
    """Import, run in numpy, compare every output with eager; return the graph."""
    module = module.eval()
    graph = from_torch(module, inputs)
    got = run_graph(graph, [x.numpy() for x in inputs])
    with torch.no_grad():
        want = module(*inputs)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        w = w.numpy()
        assert g.shape == w.shape and g.dtype == w.dtype, f"output {k}"
        if w.dtype == np.bool_:
            np.testing.assert_array_equal(g, w, err_msg=f"output {k}")
            continue
        rms = float(np.sqrt(np.mean(np.square(w.astype(np.float64))))) or 1.0
        err = float(np.max(np.abs(g.astype(np.float64) - w))) / rms
        assert err < TOLERANCE, f"output {k}: relative error {err:.2e}\n{graph}"
    return graph


def ops_of(graph) -> set[str]:
    return {n.op for n in graph.nodes}


class Lambda(nn.Module):
    """A module around a function, for operator cases that need no parameters."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def all_of(fns) -> Lambda:
    """One module computing every case of a list (one export instead of one per case)."""
    return Lambda(lambda *xs: tuple(fn(*xs) for fn in fns))


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------ operators


class ConvBlock(nn.Module):
    """conv2d in its variants, batch norm in inference and the CNN activations."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 7, stride=2, padding=3)
        self.bn1 = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4, bias=False)
        self.c3 = nn.Conv2d(8, 8, 3, padding=1, groups=8)   # depthwise
        self.c4 = nn.Conv2d(8, 6, (3, 1), padding="same")
        self.c5 = nn.Conv2d(6, 4, 1, stride=(2, 1))
        self.bn2 = nn.BatchNorm2d(6, affine=False)
        for bn in (self.bn1, self.bn2):  # non-trivial running statistics
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        x = F.relu(self.bn1(self.c1(x)))
        x = F.relu6(self.c2(x))
        x = F.hardswish(self.c3(x))
        x = F.silu(self.bn2(self.c4(x)))
        return self.c5(x)


def test_conv_batch_norm_activations():
    torch.manual_seed(0)
    g = check_import(ConvBlock(), rand(2, 3, 20, 18))
    convs = [n for n in g.nodes if n.op == "conv2d"]
    assert [c.attrs["groups"] for c in convs] == [1, 4, 8, 1, 1]
    assert convs[0].attrs["stride"] == (2, 2) and convs[0].attrs["padding"] == (3, 3)
    assert convs[1].attrs["dilation"] == (2, 2)
    assert {"batch_norm", "relu", "clamp", "hardswish", "silu"} <= ops_of(g)


UNARY = [
    torch.relu, torch.sigmoid, torch.tanh, torch.exp, torch.abs, torch.neg, torch.erf,
    F.silu, F.hardswish, F.hardsigmoid, F.relu6,
    lambda x: F.gelu(x), lambda x: F.gelu(x, approximate="tanh"),
    lambda x: torch.log(x.abs() + 1), lambda x: torch.sqrt(x.abs()),
    lambda x: torch.rsqrt(x.abs() + 0.5),
    lambda x: torch.clamp(x, -0.5, 0.7), lambda x: x.clamp(min=0.1), lambda x: x.clamp(max=0.2),
    lambda x: F.hardtanh(x, -2.0, 1.5),
]


def test_unary():
    check_import(all_of(UNARY), rand(2, 3, 5) * 3)


BINARY = [
    lambda x, y: x + y, lambda x, y: x - y, lambda x, y: x * y, lambda x, y: x / (y.abs() + 1),
    lambda x, y: torch.add(x, y, alpha=2.5), lambda x, y: torch.sub(x, y, alpha=0.5),
    lambda x, y: 1.0 - x, lambda x, y: torch.rsub(x, y, alpha=2.0),
    lambda x, y: x * 3 + 2, lambda x, y: x / 4, lambda x, y: torch.pow(x, 2),
    lambda x, y: torch.maximum(x, y), lambda x, y: torch.minimum(x, y),
    lambda x, y: torch.where(x > y, x, y), lambda x, y: torch.where(x < 0, 0.0, y),
    lambda x, y: x.masked_fill(y > 0.5, -1e4), lambda x, y: (x >= y).float() + (x == x),
    lambda x, y: (x != y) & (y <= 0.3),
]


def test_binary_broadcasting():
    check_import(all_of(BINARY), rand(2, 1, 4, 5, seed=1), rand(3, 1, 5, seed=2))


POOL_REDUCE = [
    lambda x: F.max_pool2d(x, 3, 2, 1),
    lambda x: F.max_pool2d(x, 2, ceil_mode=True),
    lambda x: F.max_pool2d(x, 3, 1, 1, dilation=2),
    lambda x: F.avg_pool2d(x, 3, 2, 1),
    lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False, ceil_mode=True),
    lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    lambda x: F.adaptive_avg_pool2d(x, 1),
    lambda x: F.adaptive_avg_pool2d(x, (3, 2)),
    lambda x: x.mean((2, 3), keepdim=True), lambda x: x.mean(-1), lambda x: x.sum(1),
    lambda x: x.amax(2), lambda x: x.mean(),
]


def test_pooling_and_reductions():
    g = check_import(all_of(POOL_REDUCE), rand(1, 3, 7, 9))
    assert {"max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "mean", "sum", "max"} <= ops_of(g)


LAYOUT = [
    lambda x: torch.flatten(x, 1), lambda x: x.reshape(4, -1), lambda x: x.view(2, 3, 20),
    lambda x: x.transpose(1, 3), lambda x: x.permute(3, 0, 2, 1), lambda x: x.flatten(0, 2).t(),
    lambda x: torch.cat([x, x * 2], 1), lambda x: torch.cat([x[..., :1], x], dim=-1),
    lambda x: x[:, 1:3, ::2], lambda x: x[..., -3:], lambda x: x[:, 0], lambda x: x[1, :, 2],
    lambda x: torch.split(x, [1, 2], dim=1)[1], lambda x: x.chunk(2, dim=-1)[0] * 2,
    lambda x: x.unsqueeze(1).squeeze(1), lambda x: x[:, :1].expand(2, 3, 4, 5),
    lambda x: x.mean(1, keepdim=True).expand_as(x) - x,
    lambda x: x[torch.tensor([[1, 0], [0, 1]]), torch.tensor([2, 0])],
    lambda x: F.pad(x, (1, 2, 0, 3)), lambda x: F.pad(x, (2, 2), value=-1.5),
]


def test_layout():
    g = check_import(all_of(LAYOUT), rand(2, 3, 4, 5))
    assert {"reshape", "permute", "concat", "slice", "expand", "index", "pad"} <= ops_of(g)


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 6)
        self.fc_nobias = nn.Linear(6, 5, bias=False)
        self.b = nn.Parameter(rand(5, seed=3))
        self.w = nn.Parameter(rand(5, 4, seed=4))

    def forward(self, x, y):
        h = self.fc_nobias(F.gelu(self.fc(x)))                      # linear
        z = torch.addmm(self.b, h[0], torch.eye(5), beta=0.5, alpha=2.0)  # addmm
        m = torch.matmul(h, self.w)                                  # 3-d x 2-d
        b = torch.bmm(h, h.transpose(1, 2))                          # bmm
        v = torch.matmul(y, self.w)                                  # vector x matrix
        return z, m, b, v


def test_dense():
    g = check_import(Dense(), rand(2, 3, 8), rand(5, seed=5))
    assert {"linear", "matmul"} <= ops_of(g)


@pytest.mark.parametrize("mode", ["causal", "additive", "bool", "none"])
def test_attention(mode):
    def fn(q, k, v):
        if mode == "causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if mode == "additive":
            mask = (k.sum(-1, keepdim=True).transpose(-1, -2) > 0).float() * -1e4
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if mode == "bool":
            mask = torch.ones(6, 6, dtype=torch.bool).tril()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        return F.scaled_dot_product_attention(q, k, v)

    g = check_import(Lambda(fn), rand(2, 4, 6, 8, seed=1), rand(2, 4, 6, 8, seed=2),
                     rand(2, 4, 6, 8, seed=3))
    (node,) = [n for n in g.nodes if n.op == "scaled_dot_product_attention"]
    assert node.attrs["is_causal"] == (mode == "causal")
    assert len(node.inputs) == (3 if mode in ("causal", "none") else 4)


class Normalize(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(6)
        self.ln2 = nn.LayerNorm([4, 6], elementwise_affine=False)
        self.bn = nn.BatchNorm1d(4)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return (torch.softmax(self.ln(x), -1), F.log_softmax(x, dim=1), self.ln2(x),
                self.bn(x.mean(-1)))


def test_normalization_and_softmax():
    g = check_import(Normalize(), rand(3, 4, 6) * 2)
    assert {"layer_norm", "softmax", "log_softmax", "batch_norm"} <= ops_of(g)


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(50, 8)
        self.pos = nn.Embedding(16, 8)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        pad = (ids == 0).unsqueeze(-1)
        return self.tok(ids).masked_fill(pad, 0.0) + self.pos(pos), ids * 2 + 1


def test_embedding_with_integer_inputs():
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    ids[0, 0] = 0
    g = check_import(Embed(), ids)
    assert g.types[g.inputs[0]].dtype == "int64"
    assert g.types[g.outputs[1]].dtype == "int64"
    assert "embedding" in ops_of(g)


class Bessel(nn.Module):
    def forward(self, x):
        return torch.i0(x) + 1  # the marked line


def test_unsupported_operator_names_aten_op_and_location():
    with pytest.raises(UnsupportedOperatorError) as info:
        from_torch(Bessel(), (rand(2, 3),))
    message = str(info.value)
    assert "aten.i0" in message
    assert "test_graph_import.py" in message and "the marked line" in message


# ------------------------------------------------------------------------------ networks

transformers = pytest.importorskip("transformers")


class Hidden(nn.Module):
    """A transformers model's `last_hidden_state` as a plain tensor output."""

    def __init__(self, model, **kwargs):
        super().__init__()
        self.model = model
        self.kwargs = kwargs

    def forward(self, *xs):
        return self.model(*xs, **self.kwargs).last_hidden_state


def test_resnet18():
    torch.manual_seed(0)
    config = transformers.ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                                       layer_type="basic", embedding_size=64)
    g = check_import(Hidden(transformers.ResNetModel(config)), rand(1, 3, 64, 64))
    assert sum(n.op == "conv2d" for n in g.nodes) == 20
    assert {"batch_norm", "relu", "max_pool2d", "add"} <= ops_of(g)


def test_resnet50_bottleneck():
    torch.manual_seed(0)
    config = transformers.ResNetConfig(depths=[1, 1, 1, 1], layer_type="bottleneck")
    g = check_import(Hidden(transformers.ResNetModel(config)), rand(1, 3, 64, 64))
    assert sum(n.op == "conv2d" for n in g.nodes) == 1 + 4 * 3 + 4  # stem, blocks, shortcuts


def test_mobilenet_v2():
    torch.manual_seed(0)
    model = transformers.MobileNetV2Model(transformers.MobileNetV2Config(image_size=64))
    g = check_import(Hidden(model), rand(1, 3, 64, 64))
    assert any(n.op == "conv2d" and n.attrs["groups"] > 1 for n in g.nodes)  # depthwise


def test_bert_layer_with_attention_mask():
    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=1, hidden_size=768,
                                     num_attention_heads=12, intermediate_size=3072)
    model = transformers.BertModel(config, add_pooling_layer=False)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (2, 24), generator=gen)
    mask = torch.ones(2, 24, dtype=torch.int64)
    mask[1, 17:] = 0
    g = check_import(Hidden(model), ids, mask)
    assert [g.types[i].dtype for i in g.inputs] == ["int64", "int64"]
    assert {"embedding", "linear", "layer_norm", "gelu"} <= ops_of(g)


class GPT2Hidden(nn.Module):
    """GPT-2 without its key/value cache, the padding mask passed by keyword."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state


def test_gpt2_one_layer():
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(n_layer=1))
    ids = torch.randint(0, 50257, (2, 20), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 20, dtype=torch.int64)
    mask[0, 13:] = 0
    g = check_import(GPT2Hidden(model), ids, mask)
    assert [g.types[i].dtype for i in g.inputs] == ["int64", "int64"]
    assert {"embedding", "matmul", "layer_norm", "tanh"} <= ops_of(g)
    assert any(n.op == "scaled_dot_product_attention" for n in g.nodes)


class Gathers(nn.Module):
    """torch.embedding (negative ids are out of range) and tensor indexing (negative indices
    count from the end) of the same table."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(6, 3)

    def forward(self, ids, rows):
        return self.table(ids), self.table.weight[rows] * 2.0


def test_gather_ids_keep_torch_semantics_in_the_reference_executor():
    torch.manual_seed(3)
    module = Gathers().eval()
    g = check_import(module, torch.tensor([[0, 5, 2]]), torch.tensor([-6, -1, 5]))
    assert [n.attrs["negative_ids"] for n in g.nodes if n.op == "embedding"] == [False]
    for ids, rows in (([[0, -1, 2]], [0, 1, 2]), ([[0, 6, 2]], [0, 1, 2]), ([[0, 1, 2]], [0, 6, 2]),
                      ([[0, 1, 2]], [0, -7, 2])):
        with pytest.raises(IndexError):
            module(torch.tensor(ids), torch.tensor(rows))
        with pytest.raises(IndexError, match=r"must lie in \[(0|-6), 6\)"):
            run_graph(g, [np.array(ids), np.array(rows)])
