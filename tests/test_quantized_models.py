"""Quantized ONNX models as onnxruntime's tools write them (QDQ and QOperator formats), and the
integer operators by hand, imported, compiled and compared with onnxruntime running the same
model: requantized outputs equal except for rounding ties (counted, at most one step), integer
tasks 8-bit in and 8-bit out, top-1 classes equal; what is not supported is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,  # noqa: E402
                                      quantize_static)

from ansor.graph.compiled import build_model  # noqa: E402
from ansor.graph.onnx_importer import from_onnx  # noqa: E402
from ansor.graph.qdq_fusion import fuse_qdq  # noqa: E402
from ansor.graph.torch_importer import UnsupportedOperatorError  # noqa: E402


class _SmallCnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.c3 = torch.nn.Conv2d(16, 16, 3, padding=1, groups=2)
        self.fc = torch.nn.Linear(16 * 8 * 8, 10)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        x = torch.relu(self.c3(x))
        return self.fc(torch.flatten(x, 1))


class _RandomImages(CalibrationDataReader):
    def __init__(self, count: int = 8) -> None:
        self._batches = iter([{"x": np.random.RandomState(i).randn(1, 3, 16, 16).astype(np.float32)}
                              for i in range(count)])

    def get_next(self):
        return next(self._batches, None)


@pytest.fixture(scope="module")
def float_cnn(tmp_path_factory) -> str:
    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("cnn") / "float.onnx")
    torch.onnx.export(_SmallCnn().eval(), torch.randn(1, 3, 16, 16), path, input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False)
    return path


def _quantized(float_path: str, fmt: QuantFormat, activations: QuantType) -> str:
    out = float_path.replace("float.onnx", f"{fmt.name}_{activations.name}.onnx")
    quantize_static(float_path, out, _RandomImages(), quant_format=fmt, per_channel=True,
                    activation_type=activations, weight_type=QuantType.QInt8)
    return out


def _output_step(path: str) -> float:
    """The scale of the model's final DequantizeLinear (one step of its quantized output)."""
    model = onnx.load(path)
    last = model.graph.node[-1]
    assert last.op_type == "DequantizeLinear"
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return float(init[last.input[1]])


def _compare_with_onnxruntime(path: str, inputs: list[np.ndarray]) -> tuple[int, int]:
    """(elements differing by one step, top-1 disagreements) over `inputs`; fails on more."""
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    model = build_model(from_onnx(path), None, verbose=False)
    step = _output_step(path)
    differing = top1 = 0
    for x in inputs:
        expected = session.run(None, {"x": x})[0]
        got = _first(model(x))
        steps = np.rint(np.abs(got.astype(np.float64) - expected) / step)
        assert steps.max() <= 1, f"{path}: outputs differ by {steps.max()} steps"
        differing += int(np.count_nonzero(steps))
        top1 += int(got.argmax() != expected.argmax())
    return differing, top1


@pytest.mark.parametrize("activations", [QuantType.QUInt8, QuantType.QInt8])
def test_qdq_cnn_becomes_integer_tasks_and_matches_onnxruntime(float_cnn, activations):
    path = _quantized(float_cnn, QuantFormat.QDQ, activations)
    report = fuse_qdq(onnx.shape_inference.infer_shapes(onnx.load(path)))
    assert not report.rejected, report.rejected
    assert len(report.fused) == 5  # three convolutions, the flatten, the linear layer
    ops = [n.op_type for n in report.model.graph.node]
    assert ops.count("QLinearConv") == 3 and ops.count("QGemm") == 1 and "Conv" not in ops
    model = build_model(from_onnx(path), None, verbose=False)
    act = "uint8" if activations == QuantType.QUInt8 else "int8"
    integer_tasks = [t for t in model.tasks.tasks if "conv2d_integer" in t.name or "matmul_integer" in t.name]
    assert len(integer_tasks) == 4
    for task in integer_tasks[:3]:  # a convolution: 8-bit activation in, 8-bit activation out
        # (an int8 activation is read as its uint8 view x + 128, the operand VNNI takes)
        assert str(task.inputs[0].dtype) in (act, "uint8") and str(task.inputs[1].dtype) == "int8"
        assert [str(o.dtype) for o in task.outputs] in ([act], ["uint8"])
    inputs = [np.random.RandomState(100 + i).randn(1, 3, 16, 16).astype(np.float32) for i in range(10)]
    differing, top1 = _compare_with_onnxruntime(path, inputs)
    print(f"QDQ {act}: {differing} of {10 * 10} outputs differ by one step")
    assert top1 == 0


def test_qoperator_cnn_matches_onnxruntime(float_cnn):
    path = _quantized(float_cnn, QuantFormat.QOperator, QuantType.QUInt8)
    ops = [n.op_type for n in onnx.load(path).graph.node]
    assert "QLinearConv" in ops and "QGemm" in ops
    inputs = [np.random.RandomState(200 + i).randn(1, 3, 16, 16).astype(np.float32) for i in range(10)]
    differing, top1 = _compare_with_onnxruntime(path, inputs)
    print(f"QOperator: {differing} of {10 * 10} outputs differ by one step")
    assert top1 == 0


# ----------------------------------------------------------------------------- single layers by hand


def _model(nodes, inputs, outputs, initializers, microsoft: bool = False, opset: int = 17):
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if microsoft else [])
    graph = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in initializers.items()])
    return helper.make_model(graph, opset_imports=imports)


def _run_both(model, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    compiled = build_model(from_onnx(model), None, verbose=False)
    return _first(compiled(*feeds.values())), expected


def _first(outputs):
    """The model's first output (a one-output model returns the array itself)."""
    return outputs[0] if isinstance(outputs, (list, tuple)) else outputs


def _assert_requantized_equal(got: np.ndarray, expected: np.ndarray) -> int:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    diff = np.abs(got.astype(np.int64) - expected.astype(np.int64))
    assert diff.max() <= 1
    assert np.count_nonzero(diff) <= 0.01 * diff.size
    return int(np.count_nonzero(diff))


@pytest.mark.parametrize("x_type,zero", [(TensorProto.UINT8, 131), (TensorProto.INT8, -7)])
def test_qdq_conv_relu_with_nonzero_zero_points_fuses_and_matches(x_type, zero):
    """A Relu between the convolution and its QuantizeLinear (which onnxruntime's quantizer
    folds away, but hand-written models keep), padding that reads the input's zero point,
    per-channel weights with a bias."""
    rng = np.random.default_rng(0)
    np_x = helper.tensor_dtype_to_np_dtype(x_type)
    w = rng.integers(-127, 128, (6, 4, 3, 3), dtype=np.int8)
    w_scale = rng.uniform(0.002, 0.01, 6).astype(np.float32)
    x_scale = np.float32(0.05)
    init = {"xs": np.array(x_scale), "xz": np.array(zero, np_x), "w": w, "ws": w_scale,
            "b": rng.integers(-2000, 2000, 6).astype(np.int32), "bs": (x_scale * w_scale).astype(np.float32),
            "ys": np.array(0.04, np.float32), "yz": np.array(zero - 3, np_x)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "bs"], ["bf"], axis=0),
             helper.make_node("Conv", ["xf", "wf", "bf"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", x_type, [1, 4, 9, 9])],
                   [helper.make_tensor_value_info("y", x_type, [1, 6, 9, 9])], init)
    report = fuse_qdq(onnx.shape_inference.infer_shapes(model))
    assert report.fused == ["Conv ''"] and [n.op_type for n in report.model.graph.node] == ["QLinearConv", "Max"]
    info = np.iinfo(np_x)
    x = rng.integers(info.min, info.max, (1, 4, 9, 9), dtype=np_x, endpoint=True)
    got, expected = _run_both(model, {"x": x})
    print(f"conv relu {np.dtype(np_x)}: {_assert_requantized_equal(got, expected)} of {got.size} differ by one")


def test_qdq_matmul_of_a_3d_activation_fuses_and_matches():
    rng = np.random.default_rng(1)
    init = {"xs": np.array(0.03, np.float32), "xz": np.array(120, np.uint8),
            "w": rng.integers(-127, 128, (32, 24), dtype=np.int8), "ws": rng.uniform(0.001, 0.01, 24).astype(np.float32),
            "ys": np.array(0.05, np.float32), "yz": np.array(128, np.uint8)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], axis=1),
             helper.make_node("MatMul", ["xf", "wf"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "ys", "yz"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, [2, 5, 32])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 5, 24])], init)
    report = fuse_qdq(onnx.shape_inference.infer_shapes(model))
    assert [n.op_type for n in report.model.graph.node] == ["QLinearMatMul"]
    x = rng.integers(0, 256, (2, 5, 32), dtype=np.uint8)
    got, expected = _run_both(model, {"x": x})
    _assert_requantized_equal(got, expected)


def test_a_bias_in_another_scale_is_not_fused_and_the_float_form_stays():
    rng = np.random.default_rng(2)
    init = {"xs": np.array(0.05, np.float32), "xz": np.array(128, np.uint8),
            "w": rng.integers(-127, 128, (4, 3, 1, 1), dtype=np.int8), "ws": np.array(0.01, np.float32),
            "b": rng.integers(-100, 100, 4).astype(np.int32), "bs": np.array(0.1, np.float32),
            "ys": np.array(0.04, np.float32), "yz": np.array(128, np.uint8)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"]),
             helper.make_node("DequantizeLinear", ["b", "bs"], ["bf"]),
             helper.make_node("Conv", ["xf", "wf", "bf"], ["c"]),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 4, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 4, 4, 4])], init)
    report = fuse_qdq(onnx.shape_inference.infer_shapes(model))
    assert report.fused == [] and "Conv" in [n.op_type for n in report.model.graph.node]
    x = rng.integers(0, 256, (1, 3, 4, 4), dtype=np.uint8)
    got, expected = _run_both(model, {"x": x})
    _assert_requantized_equal(got, expected)


def test_matmul_integer_and_conv_integer_are_exact():
    rng = np.random.default_rng(3)
    init = {"b": rng.integers(-128, 128, (16, 8), dtype=np.int8), "az": np.array(7, np.uint8),
            "bz": rng.integers(-3, 4, 8).astype(np.int8)}
    model = _model([helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])],
                   [helper.make_tensor_value_info("a", TensorProto.UINT8, [3, 16])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, [3, 8])], init)
    a = rng.integers(0, 256, (3, 16), dtype=np.uint8)
    got, expected = _run_both(model, {"a": a})
    np.testing.assert_array_equal(got, expected)

    init = {"w": rng.integers(0, 256, (5, 2, 3, 3), dtype=np.uint8), "xz": np.array(9, np.uint8),
            "wz": np.array(100, np.uint8)}
    model = _model([helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 0, 1, 2],
                                     strides=[2, 1])],
                   [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 2, 7, 6])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, None)], init)
    x = rng.integers(0, 256, (1, 2, 7, 6), dtype=np.uint8)
    got, expected = _run_both(model, {"x": x})
    np.testing.assert_array_equal(got, expected)


def test_qlinear_add_matches_onnxruntime():
    rng = np.random.default_rng(4)
    init = {"as": np.array(0.02, np.float32), "az": np.array(100, np.uint8), "bs": np.array(0.03, np.float32),
            "bz": np.array(140, np.uint8), "cs": np.array(0.045, np.float32), "cz": np.array(120, np.uint8)}
    node = helper.make_node("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"], domain="com.microsoft")
    spec = [helper.make_tensor_value_info(n, TensorProto.UINT8, [2, 8, 5, 5]) for n in ("a", "b")]
    model = _model([node], spec, [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 8, 5, 5])], init,
                   microsoft=True)
    feeds = {n: rng.integers(0, 256, (2, 8, 5, 5), dtype=np.uint8) for n in ("a", "b")}
    got, expected = _run_both(model, feeds)
    _assert_requantized_equal(got, expected)


def test_unsupported_quantized_forms_are_refused_by_name():
    rng = np.random.default_rng(5)
    w = rng.integers(-127, 128, (4, 3, 1, 1), dtype=np.int8)
    scalars = {"xs": np.array(0.1, np.float32), "xz": np.array(0, np.uint8), "ys": np.array(0.1, np.float32),
               "yz": np.array(0, np.uint8), "ws": np.array(0.1, np.float32), "wz": np.array(0, np.int8)}
    x_spec = [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 4, 4])]
    # a weight computed at run time
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
    model = _model([node], x_spec + [helper.make_tensor_value_info("w", TensorProto.INT8, [4, 3, 1, 1])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], scalars)
    with pytest.raises(UnsupportedOperatorError, match="non-constant weight 'w' of 'QLinearConv'"):
        from_onnx(model)
    # auto_pad
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], auto_pad="SAME_UPPER")
    model = _model([node], x_spec, [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], {**scalars, "w": w})
    with pytest.raises(UnsupportedOperatorError, match="auto_pad of 'QLinearConv'"):
        from_onnx(model)
    # QGemm with a transposed activation, and an operator of onnxruntime's domain not imported
    gemm = helper.make_node("QGemm", ["x2", "xs", "xz", "w2", "ws", "wz", "", "ys", "yz"], ["y"],
                            domain="com.microsoft", transA=1)
    model = _model([gemm], [helper.make_tensor_value_info("x2", TensorProto.UINT8, [3, 2])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
                   {**scalars, "w2": rng.integers(-127, 128, (3, 4), dtype=np.int8)}, microsoft=True)
    with pytest.raises(UnsupportedOperatorError, match="transA=1 of 'QGemm'"):
        from_onnx(model)
    pool = helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft")
    model = _model([pool], x_spec, [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], scalars,
                   microsoft=True)
    with pytest.raises(UnsupportedOperatorError, match="domain 'com.microsoft'"):
        from_onnx(model)


@pytest.mark.parametrize("x_type", [TensorProto.UINT8, TensorProto.INT8])
def test_qdq_residual_add_and_max_pool_stay_integer_and_match(x_type):
    """A residual connection (DequantizeLinear of both operands, Add, QuantizeLinear) becomes
    QLinearAdd and a MaxPool between a DequantizeLinear and a QuantizeLinear of one scale runs
    on the 8-bit values: the tensors between layers stay 8-bit, as in onnxruntime."""
    rng = np.random.default_rng(6)
    np_x = helper.tensor_dtype_to_np_dtype(x_type)
    zero = 130 if x_type == TensorProto.UINT8 else -4
    init = {"as": np.array(0.02, np.float32), "az": np.array(zero, np_x), "bs": np.array(0.03, np.float32),
            "bz": np.array(zero - 9, np_x), "ys": np.array(0.05, np.float32), "yz": np.array(zero + 2, np_x)}
    nodes = [helper.make_node("DequantizeLinear", ["a", "as", "az"], ["af"]),
             helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bf"]),
             helper.make_node("Add", ["af", "bf"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "ys", "yz"], ["sq"]),
             helper.make_node("DequantizeLinear", ["sq", "ys", "yz"], ["sf"]),
             helper.make_node("MaxPool", ["sf"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["p", "ys", "yz"], ["y"])]
    spec = [helper.make_tensor_value_info(n, x_type, [1, 8, 9, 9]) for n in ("a", "b")]
    model = _model(nodes, spec, [helper.make_tensor_value_info("y", x_type, [1, 8, 5, 5])], init)
    report = fuse_qdq(onnx.shape_inference.infer_shapes(model))
    assert sorted(n.op_type for n in report.model.graph.node) == ["MaxPool", "QLinearAdd"], report.rejected
    info = np.iinfo(np_x)
    feeds = {n: rng.integers(info.min, info.max, (1, 8, 9, 9), dtype=np_x, endpoint=True) for n in ("a", "b")}
    got, expected = _run_both(model, feeds)
    print(f"add + max pool {np.dtype(np_x)}: {_assert_requantized_equal(got, expected)} of {got.size} differ by one")
