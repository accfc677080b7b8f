"""Int8 convolutions through VNNI's vpdpbusd, found by the search: NHWC convolutions of any
kernel size, stride and padding whose input channels are the instruction's depth, bit-exact
against numpy's int32 arithmetic with the instruction and with the widening loop (a target
without dot products); int8 activations read as their uint8 view x + 128 (the correction in
the bias), so onnxruntime's QDQ models with int8 activations take the same instruction; the
requantization fused into the convolution's task."""

from __future__ import annotations

import numpy as np
import pytest

from ansor import te
from ansor.backend.cpu import cpu_builder
from ansor.backend.registry import generate_source
from ansor.graph.ops import TensorType
from ansor.graph.quantized_ops import _lower_conv2d_integer  # noqa: F401  (registers the operator)
from ansor.kernel import compile_state
from ansor.search.sketch_policy import SketchPolicy
from ansor.target import Target
from ansor.task import Task

HOST = Target.host()
VNNI_512 = Target.cpu("avx512", 2, ("avx512_vnni",))
HAS_VNNI = "avx512_vnni" in HOST.dot_products and HOST.isa == "avx512"
#: the instruction where this CPU has it, and the widening loop everywhere
TARGETS = ([Target.host(dot_products=("avx512_vnni",))] if HAS_VNNI else []) + [Target.host(dot_products=())]


def _numpy_conv_nhwc(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], pads: tuple[int, int, int, int],
                     pad_value: int) -> np.ndarray:
    """int32 sums of x [N, H, W, C] (padded with `pad_value`) times w [KH, KW, C, O], in int64
    then checked to fit: the exact arithmetic the kernel must reproduce."""
    pt, pl, pb, pr = pads
    xp = np.pad(x.astype(np.int64), ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=pad_value)
    kh, kw, _, o = w.shape
    sh, sw = stride
    oh, ow = (xp.shape[1] - kh) // sh + 1, (xp.shape[2] - kw) // sw + 1
    out = np.zeros((x.shape[0], oh, ow, o), np.int64)
    for ry in range(kh):
        for rx in range(kw):
            window = xp[:, ry:ry + sh * (oh - 1) + 1:sh, rx:rx + sw * (ow - 1) + 1:sw, :]
            out += window @ w[ry, rx].astype(np.int64)
    assert np.abs(out).max() < 2 ** 31
    return out.astype(np.int32)


def _conv_task(target: Target, shape, kernel, channels_out, stride, pads, pad_value) -> Task:
    from ansor.graph.quantized_ops import _conv2d_integer_nhwc

    n, h, w, c = shape
    x = te.placeholder(shape, "uint8", name="x")
    weight = te.placeholder((*kernel, c, channels_out), "int8", name="W", constant=True)
    oh = (h + pads[0] + pads[2] - kernel[0]) // stride[0] + 1
    ow = (w + pads[1] + pads[3] - kernel[1]) // stride[1] + 1
    attrs = {"stride": stride, "padding": pads, "dilation": (1, 1), "groups": 1, "pad_value": pad_value}
    out = _conv2d_integer_nhwc(x, weight, attrs, TensorType((n, oh, ow, channels_out), "int32"), "conv")
    return Task([x, weight, out], target=target)


def _sampled(task: Task, count: int = 12, seed: int = 0) -> list[tuple[object, str]]:
    policy = SketchPolicy(task, seed=seed)
    try:
        states = policy.sample(count)
    finally:
        policy.close()
    return [(state, generate_source(state, task.target)[0]) for state in states]


CONVOLUTIONS = [  # (N, H, W, C), kernel, output channels, stride, padding (top, left, bottom, right)
    ((1, 10, 10, 32), (3, 3), 32, (1, 1), (1, 1, 1, 1)),
    ((1, 11, 11, 16), (3, 3), 48, (2, 2), (1, 1, 1, 1)),
    ((2, 8, 8, 64), (1, 1), 32, (2, 2), (0, 0, 0, 0)),
    ((1, 9, 7, 8), (5, 3), 16, (2, 1), (2, 0, 1, 2)),
]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: "vnni" if t.dot_products else "widening")
@pytest.mark.parametrize("shape,kernel,channels_out,stride,pads", CONVOLUTIONS)
def test_nhwc_int8_convolution_is_bit_exact_with_and_without_vpdpbusd(target, shape, kernel, channels_out,
                                                                      stride, pads):
    pad_value = 131  # the input's zero point: the border is not 0
    task = _conv_task(target, shape, kernel, channels_out, stride, pads, pad_value)
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, shape, dtype=np.uint8)
    w = rng.integers(-128, 128, (*kernel, shape[3], channels_out), dtype=np.int8)
    x.reshape(-1)[:64], w.reshape(-1)[:64] = 255, -128  # the extreme products
    want = _numpy_conv_nhwc(x, w, stride, pads, pad_value)
    programs = _sampled(task)
    using = [state for state, source in programs if "_mm512_dpbusd_epi32" in source]
    assert bool(using) == bool(target.dot_products), "vpdpbusd where the target has it, and only there"
    for state, _ in programs[:6] + [(s, "") for s in using[:2]]:
        np.testing.assert_array_equal(compile_state(task, state)(x, w), want)


@pytest.mark.parametrize("target,intrinsic", [(VNNI_512, "_mm512_dpbusd_epi32"),
                                              (Target.cpu("avx2", 2, ("avx_vnni",)), "_mm256_dpbusd_avx_epi32")])
def test_int8_convolution_programs_compile_for_a_vnni_target_on_any_x86_cpu(target, intrinsic):
    """Compiled (never run) with the target's flags: the rule and the printer are checked on
    CPUs without the instruction too (AVX-VNNI: 256-bit vectors of 8 lanes)."""
    task = _conv_task(target, (1, 10, 10, 32), (3, 3), 32, (1, 1), (1, 1, 1, 1), 3)
    sources = [source for _, source in _sampled(task) if intrinsic in source][:2]
    assert sources
    for result in cpu_builder(target).build(sources):
        assert result.error_no == 0, result.error_msg


def test_a_channel_count_not_divisible_by_the_depth_keeps_the_widening_loop():
    task = _conv_task(VNNI_512, (1, 8, 8, 6), (3, 3), 16, (1, 1), (1, 1, 1, 1), 0)
    policy = SketchPolicy(task, seed=0)
    try:
        assert not any("dot_product" in " ".join(s.history) for s in policy.sketches)
    finally:
        policy.close()


# ----------------------------------------------------------------------------- through ONNX


onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from ansor.graph.compiled import build_model  # noqa: E402
from ansor.graph.model_tasks import extract_tasks  # noqa: E402
from ansor.graph.onnx_importer import from_onnx  # noqa: E402


def _model(nodes, inputs, outputs, initializers):
    graph = helper.make_graph(nodes, "m", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv_tasks(model, target: Target) -> list[Task]:
    return [t for t in extract_tasks(from_onnx(model), target).tasks if "conv2d_integer" in t.name]


def test_int8_activations_are_read_as_uint8_and_stay_bit_exact():
    """ConvInteger of an int8 input with a nonzero zero point and an int8 weight: the
    convolution reads x + 128 as uint8 (what vpdpbusd multiplies), padded with the zero
    point + 128, and -128 * sum(w) joins the per-channel term: exact against numpy."""
    rng = np.random.default_rng(11)
    w = rng.integers(-128, 128, (16, 8, 3, 3), dtype=np.int8)
    model = _model([helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])],
                   [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 8, 9, 9])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
                   {"w": w, "xz": np.array(-5, np.int8)})
    x = rng.integers(-128, 128, (1, 8, 9, 9), dtype=np.int8)
    x.reshape(-1)[:8] = -128
    want = _numpy_conv_nhwc(x.transpose(0, 2, 3, 1).astype(np.int64) + 5, w.transpose(2, 3, 1, 0),
                            (2, 2), (1, 1, 1, 1), 0).transpose(0, 3, 1, 2)
    (conv,) = _conv_tasks(model, HOST)
    assert [str(t.dtype) for t in conv.inputs[:2]] == ["uint8", "int8"]
    compiled = build_model(from_onnx(model), None, verbose=False)
    np.testing.assert_array_equal(compiled(x), want)


@pytest.mark.parametrize("x_type,zero", [(TensorProto.UINT8, 120), (TensorProto.INT8, -10)])
def test_a_requantized_convolution_is_one_task_whose_reduction_uses_vpdpbusd(x_type, zero):
    """QLinearConv (u8 or s8 activations, per-channel weights, bias): the sum, the per-channel
    term, the scale, rounding, the zero point and saturation in one task, 8-bit in and out;
    its sampled programs with the instruction agree with the numpy reference executor."""
    rng = np.random.default_rng(12)
    np_x = helper.tensor_dtype_to_np_dtype(x_type)
    init = {"xs": np.array(0.05, np.float32), "xz": np.array(zero, np_x),
            "w": rng.integers(-127, 128, (32, 16, 3, 3), dtype=np.int8),
            "ws": rng.uniform(0.002, 0.01, 32).astype(np.float32), "ys": np.array(0.3, np.float32),
            "yz": np.array(zero + 3, np_x), "b": rng.integers(-3000, 3000, 32).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                            pads=[1, 1, 1, 1])
    init["wz"] = np.array(0, np.int8)
    model = _model([node], [helper.make_tensor_value_info("x", x_type, [1, 16, 8, 8])],
                   [helper.make_tensor_value_info("y", x_type, None)], init)
    target = VNNI_512 if not HAS_VNNI else Target.host(dot_products=("avx512_vnni",))
    (task,) = _conv_tasks(model, target)
    assert [str(o.dtype) for o in task.outputs] in (["uint8"], [str(np.dtype(np_x))])
    assert str(task.inputs[0].dtype) == "uint8"
    programs = [(s, src) for s, src in _sampled(task, 16) if "_mm512_dpbusd_epi32" in src]
    assert programs and all("rintf(" in src for _, src in programs)  # rounding in the same kernel
    if not HAS_VNNI:
        return  # compiled for the instruction above; nothing here can run it
    inputs = task.random_inputs(seed=1)
    want = task.reference_outputs(inputs)
    for state, _ in programs[:3]:
        got = compile_state(task, state)(*inputs)
        np.testing.assert_array_equal(got, want[0])


def test_a_three_channel_image_is_padded_to_the_depth_and_takes_the_instruction():
    """The stem of a CNN: 3 input channels become 4 (the input padded with its zero point, the
    weight with zeros), so its convolution matches vpdpbusd too, with the same int32 sums."""
    rng = np.random.default_rng(13)
    w = rng.integers(-128, 128, (16, 3, 7, 7), dtype=np.int8)
    model = _model([helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], pads=[3, 3, 3, 3], strides=[2, 2])],
                   [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 12, 12])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
                   {"w": w, "xz": np.array(100, np.uint8)})
    x = rng.integers(0, 256, (1, 3, 12, 12), dtype=np.uint8)
    want = _numpy_conv_nhwc(x.transpose(0, 2, 3, 1).astype(np.int64) - 100, w.transpose(2, 3, 1, 0),
                            (2, 2), (3, 3, 3, 3), 0).transpose(0, 3, 1, 2)
    (conv,) = _conv_tasks(model, VNNI_512)
    policy = SketchPolicy(conv, seed=0)
    try:
        assert all("vpdpbusd" in " ".join(s.history) for s in policy.sketches)
    finally:
        policy.close()
    compiled = build_model(from_onnx(model), None, verbose=False)
    np.testing.assert_array_equal(compiled(x), want)
