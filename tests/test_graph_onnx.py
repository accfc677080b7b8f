"""ONNX import: models exported by PyTorch, imported with `from_onnx`, run by the numpy reference
executor and compared with PyTorch eager (max error relative to the output's RMS)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")  # the torch.export-based exporter
from torch import nn  # noqa: E402

from ansor.graph.onnx_importer import from_onnx  # noqa: E402
from ansor.graph.torch_importer import UnsupportedOperatorError  # noqa: E402
from ansor.graph.reference import run_graph  # noqa: E402


def export(module: nn.Module, *inputs: torch.Tensor, dynamo: bool = True) -> "onnx.ModelProto":
    module = module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            return torch.onnx.export(module, inputs, dynamo=True, verbose=False).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(module, inputs, buffer, dynamo=False)
        return onnx.load_from_string(buffer.getvalue())


def check(module: nn.Module, *inputs: torch.Tensor, dynamo: bool = True, tol: float = 1e-3):
    graph = from_onnx(export(module, *inputs, dynamo=dynamo))
    with torch.no_grad():
        want = module.eval()(*inputs)
    got = run_graph(graph, [x.numpy() for x in inputs])
    want = want.numpy().astype(np.float64)
    rms = float(np.sqrt(np.mean(np.square(want)))) or 1.0
    err = float(np.max(np.abs(got[0].astype(np.float64) - want))) / rms
    assert got[0].shape == want.shape and err < tol, (err, got[0].shape, want.shape)
    return graph


class Net(nn.Module):
    """Convolutions (strided, grouped, asymmetric-free), batch norm, pooling and a linear head."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU6(),
            nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.Hardswish(),
            nn.MaxPool2d(2), nn.Conv2d(16, 8, 1), nn.Sigmoid(), nn.AvgPool2d(2),
        )
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        y = self.body(x)
        return torch.softmax(self.head(y.mean(dim=(2, 3))), dim=-1)


@pytest.mark.parametrize("dynamo", [True, False], ids=["torch.export exporter", "TorchScript exporter"])
def test_a_small_convolutional_network(dynamo):
    torch.manual_seed(0)
    g = check(Net(), torch.randn(2, 3, 32, 32), dynamo=dynamo)
    assert sum(n.op == "conv2d" for n in g.nodes) == 3


class Block(nn.Module):
    """Attention-like arithmetic: reshapes, transposes, batched matmul, layer norm, GELU."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.norm = nn.LayerNorm(32)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, 32)
        return nn.functional.gelu(self.norm(x + y))


def test_attention_arithmetic():
    torch.manual_seed(0)
    g = check(Block(), torch.randn(2, 10, 32))
    assert {"matmul", "softmax", "layer_norm"} <= {n.op for n in g.nodes}


transformers = pytest.importorskip("transformers")


class Hidden(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *xs):
        return self.model(*xs).last_hidden_state


def test_resnet18_through_onnx():
    torch.manual_seed(0)
    config = transformers.ResNetConfig(depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                                       layer_type="basic", embedding_size=64)
    g = check(Hidden(transformers.ResNetModel(config)), torch.randn(1, 3, 64, 64))
    assert sum(n.op == "conv2d" for n in g.nodes) == 20


def test_mobilenet_v2_through_onnx():
    torch.manual_seed(0)
    model = transformers.MobileNetV2Model(transformers.MobileNetV2Config(image_size=64))
    g = check(Hidden(model), torch.randn(1, 3, 64, 64))
    assert any(n.op == "conv2d" and n.attrs["groups"] > 1 for n in g.nodes)


def test_an_operator_outside_the_set_is_named():
    """Unique's output shape depends on the data: no static graph holds it."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Unique", ["x"], ["y"])], "unique",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(UnsupportedOperatorError, match="Unique"):
        from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_determinant_exported_by_pytorch_matches_it():
    from ansor.graph.reference import run_graph

    class Determinant(nn.Module):
        def forward(self, x):
            return torch.linalg.det(x)

    x = torch.randn(2, 3, 3)
    got = run_graph(from_onnx(export(Determinant(), x)), [x.numpy()])[0]
    np.testing.assert_allclose(got, Determinant()(x).numpy(), rtol=1e-5, atol=1e-6)


def test_scans_gathers_and_resampling_match_pytorch():
    """CumSum, GatherElements, TopK and Resize, exported by PyTorch, against PyTorch."""
    from ansor.graph.compiled import build_model

    class Mixed(nn.Module):
        def forward(self, x, idx):
            values, where = torch.topk(x, 3, dim=-1)
            up = nn.functional.interpolate(x[None, None], scale_factor=2.0, mode="bilinear", align_corners=False)
            return torch.cumsum(x, dim=1), torch.gather(x, 1, idx), values, where, up

    x = torch.randn(4, 6)
    idx = torch.randint(0, 6, (4, 5))
    graph = from_onnx(export(Mixed(), x, idx))
    expected = Mixed()(x, idx)
    for run in (lambda *a: run_graph(graph, list(a)), build_model(graph, None, verbose=False)):
        got = run(x.numpy(), idx.numpy())
        for g, e in zip(got, expected):
            np.testing.assert_allclose(np.asarray(g), e.numpy(), rtol=1e-5, atol=1e-5)


def test_gpt2_and_a_decoder_block_exported_by_torch_onnx_import_and_run_correct():
    """Models as `torch.onnx.export` writes them (Split, Gemm, LayerNormalization, Where on a
    causal mask...): imported with from_onnx, compiled, equal to PyTorch."""
    transformers = pytest.importorskip("transformers")
    from ansor.graph.compiled import build_model

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=100)

    class Gpt2(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = transformers.GPT2Model(config).eval()

        def forward(self, ids):
            return self.model(input_ids=ids).last_hidden_state

    class DecoderBlock(nn.Module):
        def __init__(self, width: int = 48, heads: int = 4):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x):
            n = x.shape[1]
            causal = torch.triu(torch.full((n, n), float("-inf")), diagonal=1)
            h = self.norm1(x)
            x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
            return x + self.mlp(self.norm2(x))

    cases = [(Gpt2().eval(), torch.randint(0, 100, (1, 16))), (DecoderBlock().eval(), torch.randn(2, 12, 48))]
    for module, x in cases:
        graph = from_onnx(export(module, x))
        with torch.no_grad():
            want = module(x).numpy()
        compiled = build_model(graph, None, verbose=False)
        np.testing.assert_allclose(compiled(x.numpy()), want, rtol=1e-4, atol=1e-4)


def test_three_d_and_transposed_convolutions_and_pools_match_pytorch():
    """The numpy kernels of graph/spatial.py (3-d convolutions and pools, transposed
    convolutions, Lp pools) through from_onnx, against PyTorch."""
    from ansor.graph.compiled import build_model

    torch.manual_seed(2)

    class Spatial(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv3d = nn.Conv3d(2, 4, (3, 2, 3), stride=(1, 2, 1), padding=(1, 0, 1), groups=2)
            self.up = nn.ConvTranspose2d(3, 6, 3, stride=2, padding=1, output_padding=1)

        def forward(self, v, x):
            a = nn.functional.max_pool3d(self.conv3d(v), 2)
            b = nn.functional.avg_pool3d(v, (2, 3, 2), stride=1, padding=(0, 1, 1), count_include_pad=False)
            return a, b, self.up(x), nn.functional.lp_pool2d(x, 2, 2)

    module = Spatial().eval()
    v, x = torch.randn(1, 2, 6, 8, 7), torch.randn(2, 3, 6, 6)
    graph = from_onnx(export(module, v, x))
    with torch.no_grad():
        want = module(v, x)
    got = build_model(graph, None, verbose=False)(v.numpy(), x.numpy())
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-4)
