"""ONNX's own conformance cases through `from_onnx` and the compiler: never a wrong answer.

Every case either matches the expected outputs or is refused with a reason naming the
operator. The node cases run as a deterministic third of the set (all of them:
`python -m ansor.graph.onnx_conformance`), the shipped model folders in full.
"""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")

from ansor.graph.onnx_conformance import model_cases, node_cases, run_case  # noqa: E402

#: cases that once returned a wrong answer silently, each with what it must be now
ONCE_WRONG = {
    "test_flatten_negative_axis1": "pass", "test_flatten_negative_axis4": "pass",
    "test_gathernd_example_float32": "pass", "test_max_int32": "pass", "test_min_int64": "pass",
    "test_averagepool_2d_dilations": "pass",  # dilated windows in ceil mode: explicit end padding
    "test_dynamicquantizelinear": "pass",  # round(x / scale) at a tie: the division must be exact
    "test_attention_4d_causal_bf16": "pass",  # bfloat16 computed in float32, rounded once
}


def test_cases_that_once_were_wrong_now_pass_or_are_refused():
    cases = [c for c in node_cases() if c.name in ONCE_WRONG]
    assert len(cases) == len(ONCE_WRONG)
    for case in cases:
        verdict = run_case(case)
        assert verdict.status == ONCE_WRONG[case.name], verdict
        if verdict.status == "refused":
            assert "AveragePool" in verdict.reason and "ceil_mode" in verdict.reason


def test_a_third_of_the_node_cases_gives_no_wrong_answer():
    cases = node_cases()[::3]
    verdicts = [run_case(c) for c in cases]
    wrong = [v for v in verdicts if v.status == "wrong"]
    assert not wrong, "\n".join(f"{v.case}: {v.reason}" for v in wrong)
    refused = [v for v in verdicts if v.status == "refused"]
    unnamed = [v for v in refused if not (v.operator.split(" ")[0] in v.reason or "ONNX" in v.reason
                                          or "input" in v.reason)]
    assert not unnamed, "refusals must name the ONNX operator or the input: " + "; ".join(
        f"{v.case}: {v.reason}" for v in unnamed[:5])
    assert sum(v.status == "pass" for v in verdicts) > len(verdicts) // 4  # the suite really ran kernels


def test_the_shipped_model_folders_give_no_wrong_answer():
    verdicts = [run_case(c) for c in model_cases()]
    wrong = [v for v in verdicts if v.status == "wrong"]
    assert not wrong, "\n".join(f"{v.case}: {v.reason}" for v in wrong)
    passed = sum(v.status == "pass" for v in verdicts)
    assert passed >= 0.95 * len(verdicts), [f"{v.case}: {v.reason}" for v in verdicts if v.status != "pass"]


#: one or two cases of each converter group added beside the handlers of onnx_importer.py,
#: with the verdict each must have (the third of the node cases above may miss them)
CONVERTER_GROUPS = {
    # control flow made static: If on a condition known at import, Loop and Scan unrolled,
    # function bodies with subgraphs (AffineGrid's If, Range's Loop), shapes folded
    "test_if": "pass", "test_loop11": "pass", "test_scan9_sum": "pass", "test_affine_grid_3d": "pass",
    "test_range_float_type_positive_delta_expanded": "pass", "test_hannwindow_symmetric": "pass",
    "test_center_crop_pad_crop_and_pad": "pass", "test_linear_attention_gated_expanded": "pass",
    "test_if_seq": "refused",  # a sequence is no tensor
    "test_scan_sum": "refused",  # opset 8's batch axis
    # grid sampling: the canonical operator and the numpy one
    "test_gridsample_bilinear": "pass", "test_gridsample_bicubic_align_corners_1_additional_1": "pass",
    "test_gridsample_reflection_padding": "pass", "test_gridsample_volumetric_nearest_align_corners_1": "pass",
    # implicit padding forms
    "test_averagepool_2d_same_lower": "pass", "test_maxpool_2d_same_upper": "pass",
    "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True": "pass",
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True": "refused",
    "test_maxpool_with_argmax_2d_precomputed_pads": "pass", "test_conv_with_autopad_same": "pass",
    "test_convtranspose_output_shape": "pass", "test_convtranspose_autopad_same": "pass",
    "test_lppool_2d_same_upper": "pass",
    # recurrent layers unrolled
    "test_simple_rnn_bidirectional": "pass", "test_gru_with_initial_bias": "pass",
    "test_lstm_with_peepholes": "pass", "test_lstm_batchwise": "pass",
    # operand forms and small operators
    "test_matmul_1d_3d": "pass", "test_pow_types_int64_float32": "pass", "test_lrn": "pass",
    "test_det_nd": "pass", "test_reversesequence_batch": "pass", "test_dropout_default_mask": "pass",
    "test_eyelike_populate_off_main_diagonal": "pass", "test_constantofshape_float_ones": "pass",
}


def test_each_converter_group_passes_its_cases_and_refuses_what_it_cannot_hold():
    cases = [c for c in node_cases() if c.name in CONVERTER_GROUPS]
    assert len(cases) == len(CONVERTER_GROUPS), sorted(set(CONVERTER_GROUPS) - {c.name for c in cases})
    verdicts = {c.name: run_case(c) for c in cases}
    mismatched = [f"{v.case}: {v.status} ({v.reason})" for name, v in verdicts.items()
                  if v.status != CONVERTER_GROUPS[name]]
    assert not mismatched, "\n".join(mismatched)


def test_a_shape_computed_from_a_graph_input_names_that_input():
    """CenterCropPad's pads come from Max(Shape(x), shape): without `shape` given at import the
    error names it; with it, the graph is static."""
    import numpy as np

    from ansor.graph.onnx_importer import StaticInputRequired, from_onnx

    case = next(c for c in node_cases("test_center_crop_pad_crop_and_pad") if c.name == "test_center_crop_pad_crop_and_pad")
    with pytest.raises(StaticInputRequired) as info:
        from_onnx(case.model)
    assert info.value.input_name == "shape"
    inputs, expected = case.data_sets[0]
    graph = from_onnx(case.model, inputs={"shape": inputs[1]})
    from ansor.graph.reference import run_graph

    np.testing.assert_allclose(run_graph(graph, [inputs[0]])[0], expected[0])
