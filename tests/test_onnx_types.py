"""ONNX's type operators (Cast, CastLike, QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear) and operators on the narrow integer types, checked with ONNX's own
conformance cases: each passes, or is refused naming a type ansor does not compute in
(float8, int4, int2, float4)."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("onnx")

from ansor.graph.onnx_conformance import node_cases, run_case  # noqa: E402

#: element types whose refusal is expected (te has no such type)
UNSUPPORTED = re.compile(r"float8|float4|uint4|int4|uint2|int2|FLOAT8|FLOAT4|INT4|INT2|E4M3|E5M2|e4m3|e5m2|e8m0")

MUST_PASS = [
    "test_cast_FLOAT_to_FLOAT16", "test_cast_FLOAT16_to_FLOAT", "test_cast_FLOAT_to_BFLOAT16",
    "test_cast_BFLOAT16_to_FLOAT", "test_cast_DOUBLE_to_FLOAT16", "test_castlike_FLOAT_to_BFLOAT16_expanded",
    "test_quantizelinear", "test_quantizelinear_axis", "test_quantizelinear_blocked_asymmetric",
    "test_quantizelinear_int16", "test_quantizelinear_uint16", "test_dequantizelinear",
    "test_dequantizelinear_axis", "test_dequantizelinear_blocked", "test_dequantizelinear_int16",
    "test_dynamicquantizelinear", "test_dynamicquantizelinear_min_adjusted_expanded",
    "test_add_uint8", "test_sub_uint64", "test_mul_int8", "test_mul_uint16", "test_less_uint64",
    "test_mod_mixed_sign_int8", "test_max_float16", "test_min_int16", "test_top_k_uint64",
]


def _type_cases():
    names = ("test_cast", "quantizelinear", "test_top_k", *MUST_PASS)
    return [c for c in node_cases() if any(n in c.name for n in names)]


def test_type_operator_cases_pass_or_refuse_an_unsupported_type_by_name():
    cases = _type_cases()
    verdicts = {c.name: run_case(c) for c in cases}
    assert verdicts
    wrong = [v for v in verdicts.values() if v.status == "wrong"]
    assert not wrong, wrong
    for name in MUST_PASS:
        assert verdicts[name].status == "pass", verdicts[name]
    for v in verdicts.values():
        if v.status == "refused" and ("test_cast" in v.case or "quantizelinear" in v.case):
            assert UNSUPPORTED.search(v.case), v  # every refusal involves a type te does not have
