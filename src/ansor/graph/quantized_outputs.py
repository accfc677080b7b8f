"""How close a quantized model's outputs must be to another runtime's: within one quantization step.

A model written by `onnxruntime.quantization` ends in DequantizeLinear: its float outputs are
8-bit codes times a scale. Two correct runtimes may round a requantization tie (a value exactly
halfway between two codes, after float32 arithmetic done in a slightly different order) to
different codes, so their outputs may differ by one step, the output's scale, and never by more.
A float tolerance relative to the output's size cannot tell that from a wrong kernel (one step
of an 8-bit output is about 1% of its range); this check can: an output more than one step
away is refused, and the elements one step away are counted, to be reported.

An output that no DequantizeLinear produces (a float Softmax after the last dequantization)
has no step: it is checked as a float model's output is, with the caller's tolerance.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: operators that mark a model as quantized (ONNX's and onnxruntime's contrib operators)
QUANTIZED_OPERATORS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
    "MatMulInteger", "ConvInteger", "QGemm", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
    "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearConcat",
    "QLinearSoftmax", "QLinearReduceMean", "QLinearWhere", "QAttention", "DynamicQuantizeMatMul",
})

#: slack on "one step", for the float32 rounding of (code - zero point) * scale
STEP_SLACK = 1e-3


@dataclass(frozen=True)
class StepDifferences:
    """How far one output is from its reference, in quantization steps."""

    max_steps: float  # the largest difference, in steps
    differing: int    # elements that differ at all (by one step where max_steps <= 1)
    size: int


def quantized_output_steps(model: Any) -> list[np.ndarray | None] | None:
    """The quantization step of each output of an ONNX model (a ModelProto or a path): the scale
    of the DequantizeLinear that produces it, shaped to broadcast over the output (per-axis
    scales along their axis), or None for an output no DequantizeLinear produces. None in
    place of the list when the model has no quantized operator at all."""
    import onnx
    from onnx import numpy_helper

    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model))
    graph = model.graph
    if not any(n.op_type in QUANTIZED_OPERATORS for n in graph.node):
        return None
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    producers = {out: node for node in graph.node for out in node.output}
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in graph.output}
    steps: list[np.ndarray | None] = []
    for out in graph.output:
        node = producers.get(out.name)
        scale = constants.get(node.input[1]) if node is not None and node.op_type == "DequantizeLinear" else None
        if scale is None:
            steps.append(None)
            continue
        scale = np.asarray(scale, dtype=np.float64)
        if scale.size > 1:  # per axis: the scales along the output's `axis` (default 1)
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % max(ranks[out.name], 1)
            scale = scale.reshape([-1 if d == axis else 1 for d in range(ranks[out.name])])
        steps.append(scale)
    return steps


def step_differences(got: np.ndarray, expected: np.ndarray, step: np.ndarray) -> StepDifferences:
    """`got` against `expected` in units of the quantization `step` (any shape that broadcasts)."""
    steps = np.abs(np.asarray(got, np.float64) - np.asarray(expected, np.float64)) / step
    steps = np.where(np.isnan(steps), np.inf, steps)  # a NaN is never within a step
    return StepDifferences(float(steps.max(initial=0.0)), int(np.count_nonzero(steps > STEP_SLACK)), steps.size)


Check = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], "str | None"]


def one_step_check(steps: Sequence[np.ndarray | None], float_check: Check) -> Check:
    """A check of a quantized model's outputs: each output with a step within one step of its
    reference everywhere (rounding ties), each output without one by `float_check`; None when
    they agree, else what differs."""

    def check(outputs: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> str | None:
        if len(outputs) != len(expected):
            return f"got {len(outputs)} outputs, expected {len(expected)}"
        for k, (got, want, step) in enumerate(zip(outputs, expected, steps)):
            got, want = np.asarray(got), np.asarray(want)
            if got.shape != want.shape:
                return f"output {k} has shape {got.shape}, expected {want.shape}"
            if step is None:
                problem = float_check([got], [want])
                if problem:
                    return (f"output {k} (float, after the last dequantization): "
                            f"{problem.removeprefix('output 0: ')}")
                continue
            found = step_differences(got, want, step)
            if found.max_steps > 1 + STEP_SLACK:
                return (f"output {k}: differs by up to {found.max_steps:.3g} quantization steps "
                        f"({found.differing} of {found.size} elements differ; rounding ties move one step at most)")
        return None

    return check


def one_step_summary(outputs: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                     steps: Sequence[np.ndarray | None]) -> str:
    """'N of M output elements differ by one quantization step' over the outputs that have a
    step (call it after the check passed)."""
    found = [step_differences(np.asarray(g), np.asarray(w), s) for g, w, s in zip(outputs, expected, steps)
             if s is not None]
    differing, size = sum(f.differing for f in found), sum(f.size for f in found)
    return f"{differing} of {size} quantized output elements differ by one step (rounding ties)"
