"""Inference rewrites of a model graph, run before it is cut into tasks.

An imported network still carries training-time structure that would cost a kernel each: batch
norms after convolutions, arithmetic on constants (transposed weights, scaled masks), and ops
that do nothing at these shapes (a reshape to the same shape, a cast to the same dtype). Each
pass removes one of these while computing the same function, so the tasks the tuner sees are the
ones that run: a convolution with its batch norm folded into its weights is one conv task with
a bias, not a conv task and an elementwise task.

Every pass takes a graph and returns a new validated graph; the input graph is left unchanged
(constant arrays are shared, never written). Constants are computed with the reference
executor, so a folded value is exactly what the unfolded graph would compute in numpy.
"""

from __future__ import annotations

import math

import numpy as np

from ansor.graph.half_precision import HALF_FLOAT_DTYPES
from ansor.graph.int8_offset import offset_signed_int8_matmuls
from ansor.graph.ir import Graph, Node
from ansor.graph.layout import to_channels_last
from ansor.graph.ops import conv_padding4
from ansor.graph.reference import run_node
from ansor.graph.rewrites import rewrite
from ansor.graph.winograd import to_winograd

#: A folded constant larger than this is left to run as a node: folding an `expand` of a
#: scalar into a big array trades a cheap kernel for memory held for the model's lifetime.
MAX_FOLDED_ELEMENTS = 1 << 22


def fold_batch_norm(graph: Graph) -> Graph:
    """Fold each inference `batch_norm` into the `conv2d` that produces its input.

    batch_norm(conv(x, w, b)) = conv(x, w * s, (b - mean) * s + beta) with
    s = gamma / sqrt(var + eps) per output channel. It applies only where the conv output has
    no other reader (and is no graph output), since the unnormalized value would be lost, and
    where the conv weight, bias and the statistics are constants."""
    g = graph.copy()
    producers = g.producers()
    consumers = g.consumers()
    outputs = set(g.outputs)
    removed: set[str] = set()
    for bn in list(g.nodes):
        if bn.op != "batch_norm":
            continue
        x, mean, var, gamma, beta = bn.inputs
        conv = producers.get(x)
        if (conv is None or conv.op != "conv2d" or x in outputs or len(consumers.get(x, [])) != 1
                or not all(g.is_constant(c) for c in (mean, var, gamma, beta))
                or not all(g.is_constant(c) for c in conv.inputs[1:])):
            continue
        w = g.constants[conv.inputs[1]]
        dtype = w.dtype
        if str(dtype) in HALF_FLOAT_DTYPES:
            continue  # PyTorch rounds the conv's result before normalizing; folded weights would be rounded too
        scale = (g.constants[gamma].astype(np.float64)
                 / np.sqrt(g.constants[var].astype(np.float64) + bn.attrs["eps"]))
        bias = (g.constants[conv.inputs[2]].astype(np.float64) if len(conv.inputs) == 3
                else np.zeros(w.shape[0]))
        new_w = (w.astype(np.float64) * scale[:, None, None, None]).astype(dtype)
        new_b = ((bias - g.constants[mean].astype(np.float64)) * scale
                 + g.constants[beta].astype(np.float64)).astype(dtype)
        conv.inputs = [conv.inputs[0], g.add_constant(new_w, g.fresh_name("w")),
                       g.add_constant(new_b, g.fresh_name("w"))]
        g.replace_uses(bn.output, conv.output)
        removed.add(bn.output)
    return _finish(g, removed)


def fold_pad_into_conv(graph: Graph) -> Graph:
    """A zero `pad` of the spatial axes feeding a `conv2d` becomes the conv's own padding.

    Models exported with TensorFlow's "same" padding (MobileNet-V2 in `transformers`) pad
    before every strided convolution, asymmetrically; as a node of its own the pad is a kernel
    and a pass over memory, as the conv's padding it is a bound check the search can place.
    The pad stays for its other readers, if any (`_finish` drops it when none is left)."""
    g = graph.copy()
    producers = g.producers()
    for conv in g.nodes:
        pad = producers.get(conv.inputs[0]) if conv.op == "conv2d" else None
        if pad is None or pad.op != "pad" or pad.attrs["value"] != 0 or len(pad.attrs["pads"]) != 4:
            continue
        (n0, n1), (c0, c1), (h0, h1), (w0, w1) = pad.attrs["pads"]
        if (n0, n1, c0, c1) != (0, 0, 0, 0) or min(h0, h1, w0, w1) < 0:
            continue
        pt, pl, pb, pr = conv_padding4(conv.attrs["padding"])
        pt, pl, pb, pr = pt + h0, pl + w0, pb + h1, pr + w1
        conv.attrs = {**conv.attrs, "padding": (pt, pl) if (pt, pl) == (pb, pr) else (pt, pl, pb, pr)}
        conv.inputs = [pad.inputs[0], *conv.inputs[1:]]
    return _finish(g, set())


def decompose_attention(graph: Graph) -> Graph:
    """Write each `scaled_dot_product_attention` as the ops it is made of: a batched matmul of
    the queries with the transposed keys, the scale and mask, a softmax, and a batched matmul
    with the values.

    As one kernel, attention is three loop nests of different shapes (two contractions over
    different axes and a row reduction between them) that no single tiling serves: tuned whole,
    a BERT layer's attention was many times slower than its pieces (BENCHMARKS.md). Cut apart,
    each piece is a task the search
    handles well (a batch matmul with its scale and mask fused as the epilogue, a softmax), and
    the scores of one head (seq x seq) stay in cache between them at the sizes of encoder
    layers. Masked positions take -inf, as in the fused lowering."""
    g = graph.copy()
    removed: set[str] = set()
    for node in list(g.nodes):
        if node.op != "scaled_dot_product_attention":
            continue
        q, k, v = node.inputs[:3]
        qt = g.type_of(q)
        rank = len(g.type_of(k).shape)
        kt = g.add_node("permute", [k], {"axes": (*range(rank - 2), rank - 1, rank - 2)}, node.source)
        scores = g.add_node("matmul", [q, kt], None, node.source)
        scale = node.attrs["scale"] if node.attrs["scale"] is not None else 1 / math.sqrt(qt.shape[-1])
        scores = g.add_node("mul", [scores, g.add_constant(np.asarray(scale, dtype=qt.dtype))], None, node.source)
        lowest = g.add_constant(np.asarray(-np.inf, dtype=qt.dtype))
        lq, lk = g.type_of(scores).shape[-2:]
        if node.attrs["is_causal"]:
            keep = g.add_constant(np.tril(np.ones((lq, lk), dtype=bool)))
            scores = g.add_node("where", [keep, scores, lowest], None, node.source)
        if len(node.inputs) == 4:
            mask = node.inputs[3]
            if g.type_of(mask).dtype == "bool":
                scores = g.add_node("where", [mask, scores, lowest], None, node.source)
            else:
                scores = g.add_node("add", [scores, mask], None, node.source)
        weights = g.add_node("softmax", [scores], {"axis": -1}, node.source)
        out = g.add_node("matmul", [weights, v], None, node.source)
        g.replace_uses(node.output, out)
        removed.add(node.output)
    g.sort()
    return _finish(g, removed)


def fold_constants(graph: Graph, max_elements: int = MAX_FOLDED_ELEMENTS) -> Graph:
    """Replace every node whose inputs are all constants by the constant it computes.

    Nodes are visited in order, so a chain of constant arithmetic folds completely (a folded
    node's output is a constant for the nodes after it)."""
    g = graph.copy()
    removed: set[str] = set()
    for node in list(g.nodes):
        if not node.inputs or not all(g.is_constant(i) for i in node.inputs):
            continue
        out_type = g.types[node.output]
        if int(np.prod(out_type.shape)) > max_elements:
            continue
        value = run_node(g, node, [g.constants[i] for i in node.inputs])
        name = g.add_constant(value, g.fresh_name("w"))
        g.replace_uses(node.output, name)
        removed.add(node.output)
    return _finish(g, removed)


def _is_identity(g: Graph, node: Node) -> str | None:
    """The input `node` passes through unchanged, or None when it changes something."""
    out = g.types[node.output]
    first = node.inputs[0]
    same = g.type_of(first) == out
    a = node.attrs
    if node.op in ("reshape", "expand", "cast") and same:
        return first
    if node.op == "permute" and tuple(a["axes"]) == tuple(range(len(out.shape))):
        return first
    if node.op == "slice" and same and a["step"] == 1:
        return first
    if node.op == "pad" and all(lo == 0 and hi == 0 for lo, hi in a["pads"]):
        return first
    if node.op == "concat" and len(node.inputs) == 1:
        return first
    if node.op == "clamp" and a["min"] is None and a["max"] is None:
        return first
    if node.op in ("add", "sub", "mul", "div") and len(node.inputs) == 2:
        # x + 0, x - 0, x * 1, x / 1 with a constant that does not broadcast x to a bigger shape
        neutral = 1 if node.op in ("mul", "div") else 0
        x, c = node.inputs
        if g.is_constant(c) and g.type_of(x) == out and np.all(g.constants[c] == neutral):
            return x
        if (node.op in ("add", "mul") and g.is_constant(x) and g.type_of(c) == out
                and np.all(g.constants[x] == neutral)):
            return c
    return None


def remove_identities(graph: Graph) -> Graph:
    """Drop ops that return their input unchanged: reshape/expand/cast to the input's own type,
    the identity permutation, a full unit-step slice, zero padding, a one-input concat, an
    unbounded clamp, and adding (multiplying by) a constant zero (one) that does not broadcast."""
    g = graph.copy()
    removed: set[str] = set()
    for node in list(g.nodes):
        source = _is_identity(g, node)
        if source is None or g.type_of(source) != g.types[node.output]:
            continue
        g.replace_uses(node.output, source)
        removed.add(node.output)
    return _finish(g, removed)


def simplify(graph: Graph, channels_last: bool = True, winograd: bool = True) -> Graph:
    """All the inference rewrites in an order where each enables the next: constants first (a
    folded weight transpose makes a conv's weight constant), then batch norms, then identities,
    then pads into convolutions, then attention into its pieces, then constants again (a
    removed identity can leave constant-only nodes); last, with `channels_last`, the
    convolutional parts of the network to NHWC (`layout.to_channels_last`) and then, with
    `winograd`, their 3x3 stride-1 convolutions over large images to Winograd form
    (`winograd.to_winograd`)."""
    g = fold_constants(graph)
    g = fold_batch_norm(g)
    g = remove_identities(g)
    g = fold_pad_into_conv(g)
    g = rewrite(g).graph  # checked, cost-lowering rewrites; attention fused into one operator
    g = decompose_attention(g)
    g = offset_signed_int8_matmuls(g)  # int8 x int8 as uint8 x int8, the VNNI instruction's form
    g = fold_constants(g)
    if not channels_last:
        return g
    g = to_channels_last(g)
    return to_winograd(g) if winograd else g


def _finish(g: Graph, removed: set[str]) -> Graph:
    """Drop the replaced nodes and whatever became unused, and check the result."""
    g.nodes = [n for n in g.nodes if n.output not in removed]
    for name in removed:
        g.types.pop(name, None)
    g.remove_dead()
    g.validate()
    return g
