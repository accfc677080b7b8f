"""Finding attention in an imported graph: the chain scores -> scale -> mask -> softmax ->
weighted sum, and `scaled_dot_product_attention` nodes, become one canonical `attention` node.

Importers meet attention in several spellings: PyTorch's `F.scaled_dot_product_attention`
arrives whole; transformers' eager BERT and GPT-2 attention and ONNX exports arrive as
`matmul(q, k^T)`, a multiply or divide by a scalar, mask additions or `where`s, a softmax over
the last axis and `matmul(p, v)`. All of them become `attention(q, k, v[, mask])` with the
scale and the masks normalized: a chain's scalars multiply into `scale`, its masks are summed
into one additive mask (a `where(keep, x, very negative)` is the addition of
`where(keep, 0, very negative)`, and a scale after a mask scales the mask too), and a constant
mask that is 0 on and below the diagonal and very negative above it is `causal=True`.

The pass is a rewrite like the others of `graph.rewrites`: the caller keeps its result only
if the model's outputs agree on random inputs and its estimated cost drops.
"""

from __future__ import annotations

import math

import numpy as np

from ansor.graph.ir import Graph, Node

#: A fill at or below this (float32's lowest is -3.4e38) masks a score out as -inf would.
MASKED_BELOW = -1e30


def fuse_attention(graph: Graph) -> tuple[Graph, int]:
    """Every matched attention as one `attention` node; returns the graph and the count."""
    g = graph.copy()
    fused = 0
    for node in list(g.nodes):
        if node.op == "scaled_dot_product_attention":
            fused += _from_sdpa(g, node)
        elif node.op == "softmax":
            fused += _from_chain(g, node)
    g.sort()
    g.remove_dead()
    _causal_from_constant_masks(g)
    g.remove_dead()
    g.validate()
    return g, fused


def _from_sdpa(g: Graph, node: Node) -> int:
    q, k, v = node.inputs[:3]
    if not all(len(g.type_of(x).shape) == 4 for x in (q, k, v)):
        return 0
    if g.type_of(q).shape[:2] != g.type_of(k).shape[:2]:
        return 0
    d = g.type_of(q).shape[-1]
    scale = node.attrs["scale"] if node.attrs["scale"] is not None else 1 / math.sqrt(d)
    inputs, kind = [q, k, v], "none"
    if len(node.inputs) == 4:
        mask = node.inputs[3]
        if g.type_of(mask).dtype == "bool":
            mask = _additive(g, mask, -math.inf, g.type_of(q).dtype, node.source)
        if len(g.type_of(mask).shape) > 4:
            return 0
        inputs.append(mask)
        kind = "additive"
    out = g.add_node("attention", inputs, {"scale": float(scale), "causal": bool(node.attrs["is_causal"]),
                                           "mask": kind}, node.source)
    g.replace_uses(node.output, out)
    return 1


def _additive(g: Graph, keep: str, fill: float, dtype: str, source: str) -> str:
    """where(keep, 0, fill): a boolean mask as the additive one."""
    zero = g.add_constant(np.asarray(0, dtype=dtype), g.fresh_name("w"))
    low = g.add_constant(np.asarray(fill, dtype=dtype), g.fresh_name("w"))
    return g.add_node("where", [keep, zero, low], None, source)


def _from_chain(g: Graph, softmax: Node) -> int:
    producers, consumers = g.producers(), g.consumers()
    rank = len(g.types[softmax.output].shape)
    if rank != 4 or softmax.attrs["axis"] % rank != rank - 1:
        return 0
    readers = consumers.get(softmax.output, [])
    if softmax.output in g.outputs or len(readers) != 1 or readers[0].op != "matmul" \
            or readers[0].inputs[0] != softmax.output:
        return 0
    weighted = readers[0]
    steps, cur = [], softmax.inputs[0]
    while True:  # walk back from the softmax to the scores' matmul
        node = producers.get(cur)
        if node is None or cur in g.outputs or len(consumers.get(cur, [])) != 1:
            return 0
        if node.op == "matmul":
            break
        step = _chain_step(g, node, producers)
        if step is None:
            return 0
        steps.append(step)
        cur = step[-1]
    q, kt = node.inputs
    v = weighted.inputs[1]
    shapes = [g.type_of(x).shape for x in (q, kt, v)]
    if any(len(s) != 4 for s in shapes) or not shapes[0][:2] == shapes[1][:2] == shapes[2][:2]:
        return 0
    dtype = g.type_of(q).dtype
    scale, mask = 1.0, None
    for kind, operand, _ in reversed(steps):  # from the scores outward
        if kind == "scale":
            scale *= operand
            if mask is not None:
                mask = g.add_node("mul", [mask, g.add_constant(np.asarray(operand, dtype=dtype), g.fresh_name("w"))],
                                  None, softmax.source)
        else:
            term = operand if kind == "add" else _additive(g, operand[0], operand[1], dtype, softmax.source)
            mask = term if mask is None else g.add_node("add", [mask, term], None, softmax.source)
    if mask is not None and (g.type_of(mask).dtype != dtype or len(g.type_of(mask).shape) > 4):
        return 0
    k = g.add_node("permute", [kt], {"axes": (0, 1, 3, 2)}, softmax.source)
    inputs = [q, k, v] + ([mask] if mask is not None else [])
    out = g.add_node("attention", inputs, {"scale": float(scale), "causal": False,
                                           "mask": "none" if mask is None else "additive"}, softmax.source)
    g.replace_uses(weighted.output, out)
    return 1


def _chain_step(g: Graph, node: Node, producers: dict) -> tuple | None:
    """('scale', factor, x), ('add', mask, x) or ('where', (keep, fill), x) for one op between
    the scores and the softmax, x being the operand that leads back to the scores; None for
    any other op."""
    if node.op in ("mul", "div") and len(node.inputs) == 2:
        x, c = node.inputs
        if node.op == "mul" and g.is_constant(x):
            x, c = c, x
        if g.is_constant(c) and g.constants[c].size == 1 and g.type_of(x) == g.types[node.output]:
            value = float(g.constants[c].reshape(-1)[0])
            if node.op == "div":
                return ("scale", 1.0 / value, x) if value != 0 else None
            return ("scale", value, x)
        return None
    if node.op == "add":
        a, b = node.inputs
        out = g.types[node.output]
        for x, m in ((a, b), (b, a)):
            if g.type_of(x) == out and _leads_to_scores(x, producers):
                return ("add", m, x)
        return None
    if node.op == "where":
        keep, x, fill = node.inputs
        if (g.is_constant(fill) and g.constants[fill].size == 1 and g.type_of(x) == g.types[node.output]
                and float(g.constants[fill].reshape(-1)[0]) <= MASKED_BELOW):
            return ("where", (keep, float(g.constants[fill].reshape(-1)[0])), x)
    return None


def _leads_to_scores(name: str, producers: dict) -> bool:
    """Whether `name` comes from a matmul through scale, mask and where ops alone."""
    node = producers.get(name)
    while node is not None and node.op in ("mul", "div", "add", "where"):
        node = producers.get(node.inputs[1] if node.op == "where" else node.inputs[0])
    return node is not None and node.op == "matmul"


def _causal_from_constant_masks(g: Graph) -> None:
    """An attention whose mask is a constant that keeps exactly the keys j <= i gets
    `causal=True` and no mask (its constant chain folded here with the reference kernels)."""
    from ansor.graph.passes import fold_constants  # passes runs this module's callers

    folded = fold_constants(g)
    for node in folded.nodes:
        if node.op != "attention" or node.attrs["mask"] != "additive" or not folded.is_constant(node.inputs[3]):
            continue
        m = folded.constants[node.inputs[3]]
        lq, lk = g.type_of(node.inputs[0]).shape[2], g.type_of(node.inputs[1]).shape[2]
        if m.ndim < 2 or m.shape[-2:] != (lq, lk) or any(s != 1 for s in m.shape[:-2]):
            continue
        m2 = m.reshape(lq, lk)
        below = np.tril(np.ones((lq, lk), dtype=bool))
        if np.all(m2[below] == 0) and np.all(m2[~below] <= MASKED_BELOW):
            original = next(n for n in g.nodes if n.output == node.output)
            original.inputs = original.inputs[:3]
            original.attrs = {**original.attrs, "causal": True, "mask": "none"}
