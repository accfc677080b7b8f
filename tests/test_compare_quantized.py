"""`ansor compare` on a quantized ONNX model: its outputs checked against onnxruntime within one
quantization step (rounding ties, counted in the report), and refused beyond it (what is
compared, not how fast)."""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static  # noqa: E402

import ansor  # noqa: E402
from ansor.compare import WrongResultError, compare_compiled, model_check  # noqa: E402
from ansor.graph.compiled import build_model  # noqa: E402
from ansor.graph.onnx_importer import from_onnx  # noqa: E402
from ansor.graph.quantized_outputs import (  # noqa: E402
    one_step_check,
    one_step_summary,
    quantized_output_steps,
    step_differences,
)


class _TinyCnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))


class _RandomImages(CalibrationDataReader):
    def __init__(self) -> None:
        self._batches = iter([{"x": np.random.RandomState(i).randn(1, 3, 8, 8).astype(np.float32)}
                              for i in range(8)])

    def get_next(self):
        return next(self._batches, None)


@pytest.fixture(scope="module")
def quantized_cnn(tmp_path_factory) -> str:
    """A QDQ model as quantize_static writes it: per-channel int8 weights, uint8 activations."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("qcnn")
    float_path, path = str(folder / "float.onnx"), str(folder / "qdq.onnx")
    torch.onnx.export(_TinyCnn().eval(), torch.randn(1, 3, 8, 8), float_path, input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False)
    quantize_static(float_path, path, _RandomImages(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return path


class _Answering:
    """A compiled model that answers onnxruntime's output moved by `steps` quantization steps
    (a wrong kernel beyond one step, or ties everywhere within it)."""

    def __init__(self, compiled, path: str, steps: float) -> None:
        self._compiled, self._steps = compiled, steps
        self._session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        self._step = np.float32(quantized_output_steps(path)[0])

    def __getattr__(self, name):
        return getattr(self._compiled, name)

    def __call__(self, x):
        return self._session.run(None, {"x": x})[0] + self._steps * self._step


def test_output_steps_are_the_last_dequantization_scales(quantized_cnn, tmp_path):
    steps = quantized_output_steps(quantized_cnn)
    model = onnx.load(quantized_cnn)
    last = model.graph.node[-1]
    scale = next(t for t in model.graph.initializer if t.name == last.input[1])
    assert last.op_type == "DequantizeLinear" and len(steps) == 1
    assert float(steps[0]) == float(onnx.numpy_helper.to_array(scale))
    assert quantized_output_steps(str(quantized_cnn).replace("qdq.onnx", "float.onnx")) is None


def test_one_step_check_accepts_ties_and_refuses_more():
    step = np.float64(0.25)
    want = (np.arange(-8, 8, dtype=np.float32) * 0.25).reshape(2, 8)
    tie = want.copy()
    tie[0, 3] += 0.25
    tie[1, 5] -= 0.25
    check = one_step_check([step], model_check)
    assert check([tie], [want]) is None
    assert step_differences(tie, want, step).differing == 2
    assert one_step_summary([tie], [want], [step]).startswith("2 of 16 quantized output elements")
    two = want.copy()
    two[1, 1] += 0.5
    assert "up to 2 quantization steps" in check([two], [want])
    nan = want.copy()
    nan[0, 0] = np.nan
    assert "quantization steps" in check([nan], [want])
    assert "shape" in check([want[:1]], [want])
    # an output with no step (a float operator after the last dequantization): the float check
    float_check = one_step_check([None], model_check)
    assert float_check([want], [want]) is None
    assert "float, after the last dequantization" in float_check([tie], [want])


def test_compare_counts_one_step_differences_against_onnxruntime(quantized_cnn):
    graph = from_onnx(quantized_cnn)
    compiled = build_model(graph, None, verbose=False)
    result = compare_compiled(quantized_cnn, graph, compiled, rounds=1, skip=("numpy",))
    assert [e.name for e in result.entries] == ["ansor", "onnxruntime"]
    assert "against onnxruntime" in result.checked
    assert ", ".join(ansor.Target.host().dot_products) in result.title
    assert "of 10 quantized output elements differ by one step" in result.checked
    with pytest.raises(WrongResultError, match="quantization steps"):
        compare_compiled(quantized_cnn, graph, _Answering(compiled, quantized_cnn, 2), rounds=1, skip=("numpy",))
    # one step everywhere is within the tolerance of ties, and counted
    ties = compare_compiled(quantized_cnn, graph, _Answering(compiled, quantized_cnn, 1), rounds=1,
                            skip=("numpy",))
    assert "10 of 10 quantized output elements differ by one step" in ties.checked
