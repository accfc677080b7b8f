"""A computation as JSON data (`ComputeDAG.to_data` / `from_data`): every declaration comes back
with the same workload key, the same printed form and the same reference outputs, and corrupt
data is refused with a ValueError that says what is wrong."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.dag import ComputeDAG
from ansor.te import ops
from ansor.te.evaluate import evaluate, random_inputs
from ansor.workloads import WORKLOADS, make_task_tensors

# small shapes, so the reference evaluation of every workload takes milliseconds
SMALL_SHAPES = {
    "matmul": (8, 6, 5), "batch_matmul": (2, 4, 6, 3), "matmul_bias_relu": (8, 6, 5), "dense": (4, 6, 5),
    "conv2d": (1, 4, 7, 7, 4, 3, 3), "conv2d_bias_relu": (1, 4, 7, 7, 4, 3, 3),
    "depthwise_conv2d": (1, 4, 7, 7, 3, 3), "conv2d_transpose": (1, 4, 3, 3, 2, 4, 4),
    "max_pool2d": (1, 2, 8, 8, 3), "avg_pool2d": (1, 2, 8, 8, 2), "relu": (5, 7), "gelu": (5, 7),
    "softmax": (4, 9), "layer_norm": (4, 9), "layer_norm_gelu": (4, 9), "norm2": (5, 7),
}


def _custom() -> list[te.Tensor]:
    """Every expression kind: if_then_else, a max reduction with `where` over a shifted axis,
    casts, int tensors, logic, comparisons, math calls, an infinite constant, shared nodes, a
    constant input, tags/attrs and two outputs."""
    X = te.placeholder((6, 8), "float32", name="X")
    idx = te.placeholder((6,), "int32", name="idx", constant=True)
    W = te.placeholder((8, 8), "float64", name="W")
    r = te.reduce_axis((1, 7), name="r")
    rowmax = te.compute((6,), lambda i: te.max(X[i, r] * 2.0, axis=r, where=(r % 2 == 1) | (i == 0)),
                        name="rowmax", tag="reduce", attrs={"note": "row max", "levels": [1, 2]})

    def body(i, j):
        x = X[i, j]  # shared by several parents
        cond = (x > 0.0) & ~(idx[i] >= 4)
        wide = te.cast(W[j, j], "float32") + te.cast(idx[i] * 3 // 2 % 5, "float32")
        return te.if_then_else(cond, te.exp(x) - rowmax[i], te.pow(te.abs(x), 1.5) + wide)

    mixed = te.compute((6, 8), body, name="mixed")
    counted = te.compute((6,), lambda i: te.cast(idx[i], "int64") * 7 - te.minimum(idx[i], 3), name="counted")
    k = te.reduce_axis(8, name="k")
    floor = te.compute((6,), lambda i: te.min(te.maximum(mixed[i, k], te.const(-float("inf"))), axis=k),
                       name="floor")
    return [X, idx, W, floor, counted]


def _operator_cases() -> dict[str, list[te.Tensor]]:
    def ph(shape, name="X", dtype="float32", constant=False):
        return te.placeholder(shape, dtype, name=name, constant=constant)

    cases = {}
    A, B = ph((5, 4), "A"), ph((6, 5), "B")
    cases["matmul_transposed"] = [A, B, ops.matmul(A, B, transpose_a=True, transpose_b=True)]
    A, B = ph((2, 3, 4), "A"), ph((2, 5, 4), "B")
    cases["batch_matmul_t"] = [A, B, ops.batch_matmul(A, B, transpose_b=True)]
    X, W = ph((3, 4)), ph((5, 4), "W")
    cases["dense_no_bias"] = [X, W, ops.dense(X, W)]
    A, b = ph((3, 4), "A"), ph((4,), "b")
    cases["broadcast"] = [A, b, ops.divide(ops.subtract(ops.multiply(ops.add(A, b), b), A), b)]
    X = ph((2, 5))
    cases["pad"] = [X, ops.pad(X, (1, 2), (0, 1), value=-1.5)]
    d, w = ph((1, 4, 9, 9), "data"), ph((6, 2, 3, 3), "weight", constant=True)
    cases["conv2d_groups_stride_dilation"] = [d, w, ops.conv2d(d, w, stride=2, padding=(1, 2), dilation=2,
                                                                groups=2)]
    d, w = ph((1, 7, 7, 4), "data"), ph((3, 3, 4, 5), "weight")
    cases["conv2d_nhwc"] = [d, w, ops.conv2d(d, w, padding=1, layout="NHWC")]
    d, w = ph((1, 3, 5, 5), "data"), ph((3, 2, 3, 3), "weight")
    cases["conv2d_transpose_stride"] = [d, w, ops.conv2d_transpose(d, w, stride=2, padding=1, output_padding=1)]
    d = ph((1, 2, 7, 7), "data")
    cases["pools"] = [d, ops.avg_pool2d(ops.max_pool2d(d, 3, stride=1, padding=1), 2, padding=1)]
    X = ph((3, 4, 5))
    cases["softmax_axis"] = [X, ops.softmax(X, axis=1)]
    X = ph((3, 6))
    cases["layer_norm_no_affine"] = [X, ops.layer_norm(X, None, None, eps=1e-3)]
    X = ph((4, 4), dtype="float64")
    cases["gelu_relu_norm2_f64"] = [X, ops.norm2(ops.relu(ops.gelu(X)))]
    return cases


CASES = {f"workload:{name}": (lambda n=name: make_task_tensors(n, SMALL_SHAPES[n])) for name in WORKLOADS}
CASES.update({f"ops:{name}": (lambda t=tensors: t) for name, tensors in _operator_cases().items()})
CASES["custom"] = _custom


def test_every_named_workload_has_a_small_shape():
    assert set(SMALL_SHAPES) == set(WORKLOADS)


def _round_trip(dag: ComputeDAG) -> ComputeDAG:
    text = json.dumps(dag.to_data(), allow_nan=False)  # strict JSON: no NaN/Infinity tokens
    return ComputeDAG.from_data(json.loads(text))


@pytest.mark.parametrize("case", sorted(CASES))
def test_round_trip_keeps_key_printing_and_outputs(case):
    dag = ComputeDAG(CASES[case]())
    back = _round_trip(dag)
    assert back.workload_key == dag.workload_key
    assert repr(back) == repr(dag)
    assert [t.name for t in back.io_tensors] == [t.name for t in dag.io_tensors]
    assert [t.op.constant for t in back.inputs] == [t.op.constant for t in dag.inputs]
    assert [(getattr(t.op, "tag", None), getattr(t.op, "attrs", None)) for t in back.tensors] == \
        [(getattr(t.op, "tag", None), getattr(t.op, "attrs", None)) for t in dag.tensors]
    assert back.to_data() == dag.to_data()
    values = random_inputs(dag.inputs, seed=3)
    if case == "custom":
        values[1] = np.array([0, 5, 2, 4, 1, 3], dtype="int32")  # idx: both sides of `idx[i] >= 4`
    expected = evaluate(dag.outputs, dict(zip(dag.inputs, values)))
    got = evaluate(back.outputs, dict(zip(back.inputs, values)))
    for e, g in zip(expected, got):
        assert e.dtype == g.dtype
        np.testing.assert_array_equal(g, e)


def test_shared_expressions_stay_shared():
    dag = ComputeDAG(_custom())
    data = dag.to_data()
    mixed = next(t for t in data["tensors"] if t["name"] == "mixed")
    reads_of_x = [n for n in mixed["nodes"] if n[0] == "read" and n[1] == 0]
    assert len(reads_of_x) == 1  # X[i, j] written once, referred to by each parent
    back = ComputeDAG.from_data(data)
    body = back.tensors[[t.name for t in back.tensors].index("mixed")].op.body
    from ansor.te.expr import TensorRead, walk

    x_reads = {id(n) for n in walk(body) if isinstance(n, TensorRead) and n.tensor.name == "X"}
    assert len(x_reads) == 1


def test_task_description_carries_the_computation():
    task = ansor.Task(_custom())
    desc = json.loads(json.dumps(task.describe()))
    assert ComputeDAG.from_data(desc["computation"]).workload_key == task.workload_key


def test_attrs_that_are_not_json_leave_the_computation_out_of_the_description():
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i] + 1.0, name="B", attrs={"fn": len})
    task = ansor.Task([A, B])
    with pytest.raises(ValueError, match="attrs"):
        task.dag.to_data()
    assert "computation" not in task.describe()


# ---------------------------------------------------------------------------------------------
# corrupt data


def _matmul_data() -> dict:
    return ComputeDAG(make_task_tensors("matmul", (4, 4, 4))).to_data()


def _compute_entry(data: dict) -> dict:
    return next(t for t in data["tensors"] if t["op"] == "compute")


def _node_index(entry: dict, kind: str) -> int:
    return next(i for i, n in enumerate(entry["nodes"]) if n[0] == kind)


def _corrupt(edit):
    def make():
        data = copy.deepcopy(_matmul_data())
        edit(data)
        return data
    return make


def _set_node(kind, value):
    def edit(data):
        entry = _compute_entry(data)
        entry["nodes"][_node_index(entry, kind)] = value(entry["nodes"][_node_index(entry, kind)])
    return edit


CORRUPT = {
    "wrong version": (_corrupt(lambda d: d.update(version=99)), "version 99"),
    "not computation data": (_corrupt(lambda d: d.update(format="pickle")), "not computation data"),
    "unknown top-level field": (_corrupt(lambda d: d.update(extra=1)), "unknown field"),
    "unknown node kind": (_corrupt(_set_node("binop", lambda n: ["lambda", "x"])), "unknown expression kind"),
    "unknown operator": (_corrupt(_set_node("binop", lambda n: [n[0], "**"] + n[2:])), "unknown arithmetic"),
    "wrong arity": (_corrupt(_set_node("binop", lambda n: n[:-1])), "fields, expected"),
    "bad dtype": (_corrupt(lambda d: d["tensors"][0].update(dtype="complex64")), "bad dtype"),
    "dtype that disagrees": (_corrupt(_set_node("binop", lambda n: [n[0], n[1], "float64"] + n[3:])),
                             "stored dtype"),
    "tensor reference out of range": (_corrupt(_set_node("read", lambda n: ["read", 7, n[2]])),
                                      "tensor reference 7"),
    "forward node reference": (_corrupt(_set_node("binop", lambda n: n[:3] + [99, n[4]])),
                               "must name an earlier node"),
    "non-positive shape": (_corrupt(lambda d: d["tensors"][0].update(shape=[4, 0])), "positive"),
    "negative axis extent": (_corrupt(lambda d: _compute_entry(d)["axes"][0].__setitem__(1, -4)), "positive"),
    "bool as a shape": (_corrupt(lambda d: d["tensors"][0].update(shape=[True, 4])), "positive"),
    "read with too few indices": (_corrupt(_set_node("read", lambda n: ["read", n[1], n[2][:1]])),
                                  "indexed with 1"),
    "read out of bounds": (_corrupt(lambda d: d["tensors"][0].update(shape=[2, 4])), "out of bounds"),
    "unknown reduction": (_corrupt(_set_node("reduce", lambda n: [n[0], "prod"] + n[2:])), "unknown reduction"),
    "inputs out of range": (_corrupt(lambda d: d.update(inputs=[0, 5])), "refers to tensor 5"),
    "output listed as input": (_corrupt(lambda d: d.update(inputs=[0, 1, 2])), "twice"),
    "stored key differs": (_corrupt(lambda d: d.update(workload_key="wk1-" + "0" * 32)), "workload key"),
    "missing field": (_corrupt(lambda d: _compute_entry(d).pop("tag")), "missing field"),
    "not a list of tensors": (_corrupt(lambda d: d.update(tensors={"A": 1})), "non-empty list"),
    "const of the wrong type": (_corrupt(lambda d: _compute_entry(d)["nodes"].insert(0, ["const", "int32", 1.5])),
                                "not a value of dtype int32"),
    "bad axis name": (_corrupt(lambda d: _compute_entry(d)["axes"][0].__setitem__(0, "not a name")),
                      "axis names"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_data_is_refused_clearly(case):
    make, words = CORRUPT[case]
    with pytest.raises(ValueError, match=words):
        ComputeDAG.from_data(make())


def test_uncorrupted_data_rebuilds():  # the corruptions above start from data that is valid
    assert ComputeDAG.from_data(_matmul_data()).workload_key == ComputeDAG(
        make_task_tensors("matmul", (4, 4, 4))).workload_key


def test_a_reduction_inside_an_expression_is_refused_as_when_declaring():
    data = _matmul_data()
    entry = _compute_entry(data)
    n = len(entry["nodes"])
    entry["nodes"].append(["const", "float32", 1.0])
    entry["nodes"].append(["binop", "+", "float32", n - 1, n])  # sum(...) + 1: not a whole body
    with pytest.raises(ValueError, match="whole body"):
        ComputeDAG.from_data(data)


def test_an_expression_too_deep_to_declare_is_refused_as_data():
    data = _matmul_data()
    entry = _compute_entry(data)
    entry["reduce_axes"] = []
    entry["nodes"] = [["axis", 0], ["axis", 1], ["read", 0, [0, 1]]]
    for _ in range(20000):
        entry["nodes"].append(["binop", "+", "float32", len(entry["nodes"]) - 1, 2])
    del data["workload_key"]
    with pytest.raises(ValueError, match="nested too deeply"):
        ComputeDAG.from_data(data)
