"""Quantize-dequantize (QDQ) models as integer layers: the pass onnxruntime applies before it
runs a model `onnxruntime.quantization.quantize_static` wrote in QDQ format.

Such a model keeps float operators and marks their operands with DequantizeLinear and their
result with QuantizeLinear. Imported as written, each layer would dequantize its input and its
weight, convolve in float32 and quantize again: float tasks moving float activations. This pass
rewrites, on the ONNX model before import,

* DequantizeLinear(x) , DequantizeLinear(W const) [, DequantizeLinear(bias const int32)]
  -> Conv | MatMul | Gemm [-> Relu] -> QuantizeLinear
  into QLinearConv, QLinearMatMul or onnxruntime's QGemm (a Relu as a Max with the output zero
  point: quantizing is monotone, so Q(relu(y)) = max(Q(y), zero point)), which the importer turns
  into one integer task, 8-bit in and 8-bit out, with the requantization as its epilogue
  (`onnx_quantized.py`);
* DequantizeLinear -> Flatten | Reshape | Transpose | Squeeze | Unsqueeze | MaxPool ->
  QuantizeLinear with one scale and zero point into the same operator on the 8-bit values (a
  maximum commutes with a monotone quantization);
* DequantizeLinear(a), DequantizeLinear(b) -> Add -> QuantizeLinear (a residual connection)
  into onnxruntime's QLinearAdd, which the importer computes as MLAS does,

so activations stay 8-bit between layers, as in onnxruntime. The integer layer computes what
onnxruntime computes, not exactly what the float form computes (the two round differently at
ties), so each rewrite is checked as the graph rewrites are: both forms of the region are
imported and run by the numpy reference executor on random 8-bit inputs, and the rewrite is
kept only where every output element agrees within one quantization step and at most
`MAX_DIFFERING_SHARE` of them differ at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: the share of a region's output elements that may differ (by one step: rounding ties)
MAX_DIFFERING_SHARE = 0.01

_DATA_MOVEMENT = frozenset({"Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "MaxPool"})
_LINEAR = frozenset({"Conv", "MatMul", "Gemm"})


@dataclass
class QdqFusionReport:
    """The rewritten model and what became of each region found."""

    model: Any
    fused: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)


@dataclass
class _Region:
    anchor: Any                 # the float operator
    old_nodes: list[Any]        # the nodes the rewrite replaces (DQs only where this region reads them alone)
    new_nodes: list[Any]
    new_initializers: list[Any]
    input_names: list[str]      # the quantized activations the region reads
    original: list[Any]         # the region as written, every DequantizeLinear included (for the check)


def fuse_qdq(model: Any, seed: int = 0) -> QdqFusionReport:
    """`model` with every checked QDQ region rewritten (see the module docstring)."""
    import onnx
    from onnx import numpy_helper

    report = QdqFusionReport(model)
    graph = model.graph
    if not any(n.op_type == "DequantizeLinear" for n in graph.node):
        return report
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}
    regions: list[_Region] = []
    for node in graph.node:
        region = None
        if node.op_type in _LINEAR:
            region = _linear_region(node, constants, producer, readers, outputs)
        elif node.op_type in _DATA_MOVEMENT:
            region = _movement_region(node, constants, producer, readers, outputs)
        elif node.op_type == "Add":
            region = _add_region(node, constants, producer, readers, outputs)
        if region is None:
            continue
        verdict = _check(model, region, seed)
        label = f"{node.op_type} {node.name!r}"
        if verdict:
            report.rejected[label] = verdict
        else:
            regions.append(region)
            report.fused.append(label)
    if not regions:
        return report
    removed = {id(n) for r in regions for n in r.old_nodes}
    replacement = {id(r.anchor): r.new_nodes for r in regions}
    nodes = []
    for n in graph.node:
        nodes.extend(replacement.get(id(n), []))
        if id(n) not in removed:
            nodes.append(n)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(_without_unread_dequantize(nodes, outputs))
    out.graph.initializer.extend(t for r in regions for t in r.new_initializers)
    if not any(o.domain == "com.microsoft" for o in out.opset_import):
        out.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    report.model = out
    return report


def _without_unread_dequantize(nodes: list[Any], outputs: set[str]) -> list[Any]:
    """Drop DequantizeLinear nodes whose result nobody reads any more (a weight's, once its
    layer reads the stored integers)."""
    read = {i for n in nodes for i in n.input} | outputs
    return [n for n in nodes if n.op_type != "DequantizeLinear" or any(o in read for o in n.output)]


def _dequantize_of(name: str, producer: dict[str, Any], constants: dict[str, np.ndarray]) -> Any | None:
    """The DequantizeLinear producing `name`, when its scale and zero point are constants and
    it carries no attribute beyond axis."""
    node = producer.get(name)
    while node is not None and node.op_type == "Identity":  # an exporter's shared constant
        node = producer.get(node.input[0])
    if node is None or node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
        return None
    if any(a.name != "axis" for a in node.attribute):
        return None
    if not all(i in constants for i in node.input[1:] if i):
        return None
    return node


def _only_reader(name: str, readers: dict[str, list[Any]], outputs: set[str]) -> Any | None:
    users = readers.get(name, [])
    return users[0] if len(users) == 1 and name not in outputs else None


def _zero(dq: Any, constants: dict[str, np.ndarray]) -> np.ndarray | None:
    return constants[dq.input[2]] if len(dq.input) > 2 and dq.input[2] else None


def _linear_region(node: Any, constants: dict[str, np.ndarray], producer: dict[str, Any],
                   readers: dict[str, list[Any]], outputs: set[str]) -> _Region | None:
    from onnx import helper, numpy_helper

    if len(node.input) < 2 or any(a.name == "auto_pad" for a in node.attribute):
        return None
    x_dq = _dequantize_of(node.input[0], producer, constants)
    w_dq = _dequantize_of(node.input[1], producer, constants)
    if x_dq is None or w_dq is None or x_dq.input[0] in constants or w_dq.input[0] not in constants:
        return None
    x_scale, w_scale = constants[x_dq.input[1]], constants[w_dq.input[1]]
    x_zero, w_zero = _zero(x_dq, constants), _zero(w_dq, constants)
    if x_scale.size != 1 or (x_zero is not None and x_zero.size != 1) or x_zero is None:
        return None
    if str(x_zero.dtype) not in ("uint8", "int8") or str(constants[w_dq.input[0]].dtype) not in ("uint8", "int8"):
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Gemm":
        if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0):
            return None
    # per-channel weight scales must lie along the output channels
    w = constants[w_dq.input[0]]
    out_axis = {"Conv": 0, "MatMul": 1, "Gemm": 0 if attrs.get("transB", 0) else 1}[node.op_type]
    w_axis = next((helper.get_attribute_value(a) for a in w_dq.attribute if a.name == "axis"), 1) % w.ndim
    if w_scale.size != 1 and (w_scale.ndim != 1 or w_axis != out_axis):
        return None
    bias_q = None
    if node.op_type != "MatMul" and len(node.input) > 2 and node.input[2]:
        b_dq = _dequantize_of(node.input[2], producer, constants)
        if b_dq is None or b_dq.input[0] not in constants or constants[b_dq.input[0]].dtype != np.int32:
            return None
        b_zero = _zero(b_dq, constants)
        expected = (np.float32(x_scale.reshape(())) * w_scale.astype(np.float32)).astype(np.float32)
        same_scale = np.allclose(constants[b_dq.input[1]], expected, rtol=1e-6, atol=0)
        if (b_zero is not None and b_zero.any()) or not (same_scale or not constants[b_dq.input[0]].any()):
            return None
        bias_q = b_dq
    # the result: [Relu ->] QuantizeLinear, each the only reader
    after = _only_reader(node.output[0], readers, outputs)
    relu = None
    if after is not None and after.op_type == "Relu":
        relu, after = after, _only_reader(after.output[0], readers, outputs)
    if after is None or after.op_type != "QuantizeLinear" or any(a.name != "axis" for a in after.attribute):
        return None
    if not all(i in constants for i in after.input[1:] if i) or len(after.input) < 3 or not after.input[2]:
        return None
    y_scale, y_zero = constants[after.input[1]], constants[after.input[2]]
    if y_scale.size != 1 or y_zero.size != 1:
        return None
    if any(i in producer and producer[i].op_type == "Identity" and producer[producer[i].input[0]].op_type == "Identity"
           for i in node.input):
        return None  # (the check rebuilds one Identity between a DequantizeLinear and its reader)
    q_inputs = [x_dq.input[0], x_dq.input[1], x_dq.input[2], w_dq.input[0], w_dq.input[1]]
    w_zero_name = w_dq.input[2] if len(w_dq.input) > 2 and w_dq.input[2] else ""
    new_inits = []
    if not w_zero_name:  # the integer operators take a zero point beside every scale
        w_zero_name = f"{w_dq.input[0]}_fused_zero"
        new_inits.append(numpy_helper.from_array(np.zeros((), dtype=w.dtype), w_zero_name))
    q_inputs.append(w_zero_name)
    result = after.output[0] if relu is None else f"{after.output[0]}_before_relu"
    name = f"{node.name or node.op_type}_fused"
    if node.op_type == "Conv":
        q_inputs += [after.input[1], after.input[2]] + ([bias_q.input[0]] if bias_q is not None else [])
        fused = helper.make_node("QLinearConv", q_inputs, [result], name=name)
        fused.attribute.extend(node.attribute)
    elif node.op_type == "MatMul":
        if w.ndim != 2:
            return None
        fused = helper.make_node("QLinearMatMul", q_inputs + [after.input[1], after.input[2]], [result], name=name)
    else:
        if w.ndim != 2:
            return None
        q_inputs += [bias_q.input[0] if bias_q is not None else "", after.input[1], after.input[2]]
        fused = helper.make_node("QGemm", q_inputs, [result], name=name, domain="com.microsoft",
                                 transB=int(attrs.get("transB", 0)))
    new_nodes = [fused]
    if relu is not None:
        new_nodes.append(helper.make_node("Max", [result, after.input[2]], [after.output[0]], name=f"{name}_relu"))
    old = [node, after] + ([relu] if relu is not None else [])
    # the activation's DequantizeLinear goes where this region was its only reader
    if _only_reader(x_dq.output[0], readers, outputs) is node:
        old.append(x_dq)
    dequantized = [x_dq, w_dq] + ([bias_q] if bias_q is not None else [])
    dequantized += [producer[i] for i in node.input if i in producer and producer[i].op_type == "Identity"]
    return _Region(node, old, new_nodes, new_inits, [x_dq.input[0]], dequantized + [node] + ([relu] if relu is not None else []) + [after])


def _movement_region(node: Any, constants: dict[str, np.ndarray], producer: dict[str, Any],
                     readers: dict[str, list[Any]], outputs: set[str]) -> _Region | None:
    from onnx import helper

    x_dq = _dequantize_of(node.input[0], producer, constants)
    after = _only_reader(node.output[0], readers, outputs)
    if x_dq is None or after is None or after.op_type != "QuantizeLinear" or x_dq.input[0] in constants:
        return None
    if not all(i in constants for i in after.input[1:] if i) or len(after.input) < 3 or len(x_dq.input) < 3:
        return None
    same = all(constants[a].shape == () or constants[a].size == 1 for a in (*x_dq.input[1:3], *after.input[1:3])) \
        and constants[x_dq.input[1]].reshape(()) == constants[after.input[1]].reshape(()) \
        and constants[x_dq.input[2]].reshape(()) == constants[after.input[2]].reshape(()) \
        and constants[x_dq.input[2]].dtype == constants[after.input[2]].dtype
    if not same or not all(i in constants for i in node.input[1:] if i):
        return None
    moved = helper.make_node(node.op_type, [x_dq.input[0], *node.input[1:]], [after.output[0]],
                             name=f"{node.name or node.op_type}_on_integers")
    moved.attribute.extend(node.attribute)
    old = [node, after]
    if _only_reader(x_dq.output[0], readers, outputs) is node:
        old.append(x_dq)
    return _Region(node, old, [moved], [], [x_dq.input[0]], [x_dq, node, after])


def _add_region(node: Any, constants: dict[str, np.ndarray], producer: dict[str, Any],
                readers: dict[str, list[Any]], outputs: set[str]) -> _Region | None:
    """DequantizeLinear(a), DequantizeLinear(b) -> Add -> QuantizeLinear, every scale and zero
    point a per-tensor constant, as QLinearAdd."""
    from onnx import helper

    if len(node.input) != 2:
        return None
    dqs = [_dequantize_of(i, producer, constants) for i in node.input]
    after = _only_reader(node.output[0], readers, outputs)
    if any(dq is None or dq.input[0] in constants or len(dq.input) < 3 for dq in dqs) or after is None \
            or after.op_type != "QuantizeLinear" or len(after.input) < 3 or any(a.name != "axis" for a in after.attribute):
        return None
    scalars = [*(i for dq in dqs for i in dq.input[1:3]), *after.input[1:3]]
    if not all(i in constants and constants[i].size == 1 for i in scalars):
        return None
    if len({str(constants[i].dtype) for i in (dqs[0].input[2], dqs[1].input[2], after.input[2])}) != 1:
        return None
    (a, b), result = dqs, after.output[0]
    fused = helper.make_node("QLinearAdd", [*a.input[:3], *b.input[:3], *after.input[1:3]], [result],
                             name=f"{node.name or 'Add'}_fused", domain="com.microsoft")
    if dqs[0] is dqs[1]:
        return None  # x + x: one DequantizeLinear read twice
    old = [node, after] + [dq for dq in dqs if _only_reader(dq.output[0], readers, outputs) is node]
    return _Region(node, old, [fused], [], [a.input[0], b.input[0]], [*dqs, node, after])


# ----------------------------------------------------------------------------- the check


def _check(model: Any, region: _Region, seed: int) -> str:
    """'' when both forms of `region` agree on random 8-bit inputs, else why not."""
    from onnx import helper

    from ansor.graph.onnx_importer import _OnnxImporter
    from ansor.graph.reference import run_graph

    known = {t.name: t for t in model.graph.initializer}
    typed = {vi.name: vi for vi in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    rng = np.random.default_rng(seed)
    specs, xs = [], []
    for name in region.input_names:
        source = typed.get(name)
        if source is None or not source.type.tensor_type.HasField("shape"):
            return f"the type of {name!r} is unknown"
        dims = [d.dim_value for d in source.type.tensor_type.shape.dim]
        if not dims or any(d <= 0 for d in dims):
            return f"{name!r} has no static shape"
        elem = source.type.tensor_type.elem_type
        dtype = helper.tensor_dtype_to_np_dtype(elem)
        info = np.iinfo(dtype)
        specs.append(helper.make_tensor_value_info(name, elem, dims))
        xs.append(rng.integers(info.min, info.max, dims, dtype=dtype, endpoint=True))
    result = region.new_nodes[-1].output[0]
    results = []
    for nodes, extra in ((region.original, []), (region.new_nodes, region.new_initializers)):
        names = {i for n in nodes for i in n.input if i}
        inits = [known[i] for i in names if i in known] + list(extra)
        g = helper.make_graph(nodes, "region", specs, [helper.make_tensor_value_info(result, 0, None)], inits)
        m = helper.make_model(g, opset_imports=list(model.opset_import) +
                              ([] if any(o.domain == "com.microsoft" for o in model.opset_import)
                               else [helper.make_opsetid("com.microsoft", 1)]))
        try:
            imported = _OnnxImporter(m, {}).run()
            results.append(run_graph(imported, xs)[0])
        except Exception as exc:  # a form the importer refuses: the region stays as written
            return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
    before, after = (r.astype(np.int64) for r in results)
    if before.shape != after.shape:
        return f"shapes {before.shape} and {after.shape} differ"
    differ = np.abs(before - after)
    if differ.max(initial=0) > 1:
        return f"outputs differ by up to {int(differ.max())} steps"
    if np.count_nonzero(differ) > MAX_DIFFERING_SHARE * differ.size:
        return f"{np.count_nonzero(differ)} of {differ.size} outputs differ by one step"
    return ""

