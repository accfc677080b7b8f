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
    "test_averagepool_2d_dilations": "refused",  # dilated windows in ceil mode
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
