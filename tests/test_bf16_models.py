"""bfloat16 PyTorch models (`model.to(torch.bfloat16)`) through `from_torch`, the compiled model
and `torch.compile(backend="ansor")`, against PyTorch's own bf16 outputs: every operator
computed in float32 and rounded to bf16 once (graph/half_precision.py), matmuls and
convolutions summed in float32 with their bf16 weights read in place (the vdpbf16ps rule's
shape)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ansor
from ansor.graph.model_tasks import extract_tasks
from ansor.graph.reference import run_graph
from ansor.measure.run import load_array, save_array
from ansor.torch_arrays import numpy_to_tensor, tensor_to_numpy

BF16 = np.dtype(ml_dtypes.bfloat16)


def _close_in_bf16(got: np.ndarray, want: np.ndarray, carried: float = 1.0) -> None:
    """Within two bf16 roundings (2^-8 relative each) of PyTorch's value, plus `carried`
    roundings of the output's largest value: an intermediate rounded the other way (PyTorch's
    attention keeps its scores in float32 blocks) reaches a smaller output through a residual
    add or a cancelling sum."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    scale = float(np.abs(want).max())
    bound = 2.0 ** -8 * (2 * np.abs(want) + carried * scale)
    worst = float(np.max(np.abs(got - want) - bound))
    assert worst <= 0, f"off PyTorch bf16 by {np.abs(got - want).max():.4g} (scale {scale:.3g})"


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2 = torch.nn.Linear(64, 128), torch.nn.LayerNorm(128), torch.nn.Linear(128, 32)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x)))), dim=-1)


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.depthwise = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
        y = torch.nn.functional.silu(self.conv2(y))
        y = self.depthwise(y) + y
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))


class Block(torch.nn.Module):
    """A pre-norm transformer encoder block."""

    def __init__(self, width: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.fc1, self.fc2 = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


def _bf16_model(cls, shape):
    torch.manual_seed(0)
    model = cls().eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):  # statistics that are not the identity
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
    return model.to(torch.bfloat16), torch.randn(*shape).to(torch.bfloat16)


@pytest.mark.parametrize("cls,shape", [(MLP, (8, 64)), (ConvNet, (2, 3, 16, 16)), (Block, (2, 16, 64))],
                         ids=["mlp", "convnet", "transformer_block"])
def test_bf16_model_imports_and_compiles_within_bf16_rounding_of_pytorch(cls, shape, tmp_path):
    model, x = _bf16_model(cls, shape)
    with torch.no_grad():
        want = tensor_to_numpy(model(x))
    graph = ansor.graph.from_torch(model, (x,))
    assert graph.types[graph.inputs[0]].dtype == "bfloat16"
    assert all(str(w.dtype) == "bfloat16" for w in graph.constants.values() if w.size > 1)  # weights stay bf16
    (reference,) = run_graph(graph, [tensor_to_numpy(x)])
    assert reference.dtype == BF16
    _close_in_bf16(reference, want)
    compiled = ansor.build(graph, database=str(tmp_path / "bf16.db"), quick_seconds=0, verbose=False)
    got = compiled(x)
    assert got.dtype == torch.bfloat16
    _close_in_bf16(tensor_to_numpy(got), want)
    assert compiled.check().ok


def test_bf16_operators_round_once_as_pytorch_not_after_every_step():
    """layer norm, softmax and gelu in bf16: PyTorch computes them in float32 and rounds the
    result once, and so does ansor (exactly, for these sizes); rounding each step would not."""
    torch.manual_seed(1)
    x = (torch.randn(4, 256) * 3).to(torch.bfloat16)
    norm = torch.nn.LayerNorm(256).to(torch.bfloat16).eval()

    class Ops(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, -1), norm(x), torch.nn.functional.gelu(x), x.sum(-1)

    graph = ansor.graph.from_torch(Ops(), (x,))
    compiled = ansor.build(graph, quick_seconds=0, verbose=False)
    with torch.no_grad():
        wants = [tensor_to_numpy(w) for w in Ops()(x)]
    for got, ref, want in zip(compiled(x), run_graph(graph, [tensor_to_numpy(x)]), wants):
        _close_in_bf16(tensor_to_numpy(got), want, carried=0.05)
        _close_in_bf16(ref, want, carried=0.05)


def test_bf16_linear_task_reads_bf16_weights_and_matches_the_dot_product_rule():
    model, x = _bf16_model(MLP, (8, 64))
    graph = ansor.graph.from_torch(model, (x,))
    target = ansor.Target.cpu("avx512", 2, ("avx512_bf16",))
    linear = next(t for t in extract_tasks(graph, target).tasks if t.name.startswith("linear"))
    weights = [t for t in linear.inputs if t.op.constant]
    assert weights and all(t.dtype == "bfloat16" for t in weights)
    assert linear.outputs[0].dtype == "bfloat16"
    from ansor.search.sketch_policy import SketchPolicy

    policy = SketchPolicy(linear, seed=0)
    try:
        assert any("vdpbf16ps" in " ".join(s.history) for s in policy.sketches)
    finally:
        policy.close()


def test_torch_compile_backend_runs_bf16_models(tmp_path):
    model, x = _bf16_model(MLP, (8, 64))
    with torch.no_grad():
        want = tensor_to_numpy(model(x))
        fast = torch.compile(model, backend="ansor",
                             options={"database": str(tmp_path / "bf16.db"), "check": True, "verbose": False})
        got = fast(x)
    assert got.dtype == torch.bfloat16
    _close_in_bf16(tensor_to_numpy(got), want)


def test_bf16_arrays_cross_between_torch_numpy_and_the_measuring_worker(tmp_path):
    values = np.array([1.0, -2.5, 3.140625, np.inf], dtype=BF16)
    tensor = numpy_to_tensor(values)
    assert tensor.dtype == torch.bfloat16
    assert tensor.float().tolist() == values.astype(np.float32).tolist()
    back = tensor_to_numpy(tensor)
    assert back.dtype == BF16 and np.array_equal(back.view(np.uint16), values.view(np.uint16))
    path = save_array(str(tmp_path / "expected0"), values)
    loaded = load_array(path)
    assert loaded.dtype == BF16 and np.array_equal(loaded.view(np.uint16), values.view(np.uint16))
    plain = load_array(save_array(str(tmp_path / "input0"), np.arange(3, dtype=np.float32)))
    assert plain.dtype == np.float32
