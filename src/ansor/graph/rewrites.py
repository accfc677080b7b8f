"""Graph rewrites before scheduling (the TASO idea): each one checked, each one paid for.

A rewrite here changes what the tasks are, not only how a task is scheduled: three projections
of one input become one wider matmul, attention's chain of ops becomes one fused task, a pair
of transposes disappears. Such a rewrite is kept only when two things hold, as in TASO
(Jia et al., SOSP 2019): the rewritten model computes the same outputs on random inputs (run by
the numpy reference executor; a rewrite is never trusted because its pattern looked right), and
the model's estimated cost drops (`estimated_cost`: per fused subgraph the bytes it moves, its
FLOPs and a fixed cost per kernel, so fewer and wider kernels win and added copies lose).

`rewrite(graph)` applies them in order and returns the graph with the names of those kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ansor.graph.attention_fusion import fuse_attention
from ansor.graph.ir import Graph, Node
from ansor.graph.partition import partition
from ansor.graph.reference import random_inputs, run_graph

#: The machine the estimate assumes: rough, but the same for both sides of every comparison.
PEAK_FLOPS = 100e9
BANDWIDTH = 20e9
KERNEL_OVERHEAD_S = 2e-6
#: A reshape moves nothing; this much per reshape breaks ties towards fewer of them.
VIEW_STEP_S = 1e-7


@dataclass
class RewriteReport:
    """The rewritten graph and, per rewrite tried, what became of it."""

    graph: Graph
    applied: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)


def rewrite(graph: Graph, seed: int = 0) -> RewriteReport:
    """Every rewrite of `REWRITES` in turn, each kept only if the outputs agree and the
    estimated cost drops."""
    report = RewriteReport(graph)
    inputs: list[np.ndarray] = []
    expected: list[np.ndarray] = []
    cost = estimated_cost(graph)
    for name, fn in REWRITES:
        candidate, count = fn(report.graph)
        if count == 0:
            continue
        new_cost = estimated_cost(candidate)
        if new_cost >= cost:
            report.rejected[name] = f"estimated cost {new_cost * 1e6:.1f} us, not below {cost * 1e6:.1f} us"
            continue
        if not expected:  # the model is run once, and only when some rewrite matched
            inputs = random_inputs(graph, seed)
            expected = run_graph(graph, inputs)
        mismatch = _mismatch(expected, run_graph(candidate, inputs))
        if mismatch:
            report.rejected[name] = mismatch
            continue
        report.graph, cost = candidate, new_cost
        report.applied.append(f"{name} x{count}")
    return report


def _mismatch(expected: list[np.ndarray], got: list[np.ndarray]) -> str:
    for k, (a, b) in enumerate(zip(expected, got)):
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-3, atol=1e-4, equal_nan=True):
            return f"output {k} differs on random inputs"
    return ""


# ----------------------------------------------------------------------------- the estimate


def estimated_cost(graph: Graph) -> float:
    """Seconds the model would take on an assumed machine: per fused subgraph (a kernel), a
    fixed overhead, the bytes of what it reads and writes, and its FLOPs; a subgraph of
    reshapes alone is a view, a step that moves nothing. A permute fused into a kernel's
    reads costs the bytes it reorders once more: its strided reads are no cheaper than a copy."""
    total = 0.0
    for sub in partition(graph):
        if all(n.op == "reshape" for n in sub.nodes):
            total += VIEW_STEP_S * len(sub.nodes)
            continue
        g = sub.graph
        moved = sum(_nbytes(g, v) for v in list(g.inputs) + list(g.outputs) + sub.constants)
        for n in sub.nodes:
            if n.op == "permute" and sub.kind == "anchor":
                moved += _nbytes(g, n.output)
            if n.op == "scaled_dot_product_attention":  # cut into three kernels by the passes
                scores = math.prod(g.types[n.output].shape[:-1]) * g.type_of(n.inputs[1]).shape[-2]
                moved += 4 * scores * np.dtype(g.types[n.output].dtype).itemsize
                total += 2 * KERNEL_OVERHEAD_S
        total += KERNEL_OVERHEAD_S + moved / BANDWIDTH + sum(node_flops(g, n) for n in sub.nodes) / PEAK_FLOPS
    return total


def _nbytes(g: Graph, name: str) -> int:
    t = g.type_of(name)
    return math.prod(t.shape) * np.dtype(t.dtype).itemsize


def node_flops(g: Graph, node: Node) -> float:
    """Multiply-adds counted twice for the contractions, one operation per output element for
    everything else."""
    out = math.prod(g.types[node.output].shape)
    if node.op in ("matmul", "linear"):
        return 2.0 * out * g.type_of(node.inputs[0]).shape[-1]
    if node.op == "conv2d":
        w = g.type_of(node.inputs[1]).shape
        return 2.0 * out * math.prod(w) / max(w) if node.attrs["layout"] == "NHWC" else 2.0 * out * math.prod(w[1:])
    if node.op in ("attention", "scaled_dot_product_attention"):
        q, k = g.type_of(node.inputs[0]).shape, g.type_of(node.inputs[1]).shape
        lk = k[-2]
        return 2.0 * math.prod(q) * lk + 2.0 * out * lk + 5.0 * math.prod(q[:-1]) * lk
    return float(out)


# ----------------------------------------------------------------------------- the rewrites


def merge_shared_input_projections(graph: Graph) -> tuple[Graph, int]:
    """Linears (and matmuls by a constant, and 1x1 convolutions) of one input with constant
    weights become one of the concatenated weights, followed by a slice per original output:
    the Q, K and V projections as one wider product that reads the input once."""
    g = graph.copy()
    groups: dict[tuple, list[Node]] = {}
    for n in g.nodes:
        key = _projection_key(g, n)
        if key is not None:
            groups.setdefault(key, []).append(n)
    merged = 0
    for key, nodes in groups.items():
        if len(nodes) < 2:
            continue
        kind = key[0]
        nhwc = kind == "conv2d" and nodes[0].attrs["layout"] == "NHWC"
        axis = {"linear": 0, "matmul": 1, "conv2d": 3 if nhwc else 0}[kind]
        weights = np.concatenate([g.constants[n.inputs[1]] for n in nodes], axis=axis)
        inputs = [nodes[0].inputs[0], g.add_constant(weights, g.fresh_name("w"))]
        if len(nodes[0].inputs) == 3:
            inputs.append(g.add_constant(np.concatenate([g.constants[n.inputs[2]] for n in nodes]), g.fresh_name("w")))
        wide = g.add_node(kind, inputs, nodes[0].attrs, nodes[0].source)
        out_axis = 1 if kind == "conv2d" and not nhwc else -1
        rank = len(g.types[wide].shape)
        start = 0
        for n in nodes:
            width = g.types[n.output].shape[out_axis]
            part = g.add_node("slice", [wide], {"axis": out_axis % rank, "start": start, "end": start + width},
                              n.source)
            g.replace_uses(n.output, part)
            start += width
        merged += len(nodes)
    return _finish(g), merged


def _projection_key(g: Graph, n: Node) -> tuple | None:
    """What projections must share to merge: kind, input, weight shape but the output axis,
    attributes, bias or not."""
    if len(n.inputs) < 2 or not g.is_constant(n.inputs[1]) or g.is_constant(n.inputs[0]):
        return None
    if any(not g.is_constant(b) for b in n.inputs[2:]):
        return None
    w = g.type_of(n.inputs[1]).shape
    if n.op == "linear":
        return ("linear", n.inputs[0], w[1], len(n.inputs))
    if n.op == "matmul" and len(w) == 2:
        return ("matmul", n.inputs[0], w[0], 2)
    if n.op == "conv2d" and n.attrs["groups"] == 1:
        hw = w[2:] if n.attrs["layout"] == "NCHW" else w[:2]
        if tuple(hw) == (1, 1):
            attrs = tuple(sorted((k, repr(v)) for k, v in n.attrs.items()))
            return ("conv2d", n.inputs[0], attrs, len(n.inputs))
    return None


def fold_transpose_pairs(graph: Graph) -> tuple[Graph, int]:
    """permute(permute(x, a), b) = permute(x, a o b); the identity permutation that is left
    when they cancel is dropped."""
    g = graph.copy()
    producers, consumers = g.producers(), g.consumers()
    count = 0
    for n in g.nodes:
        inner = producers.get(n.inputs[0]) if n.op == "permute" else None
        if inner is None or inner.op != "permute" or not _single_use(g, inner, consumers):
            continue
        a, b = inner.attrs["axes"], n.attrs["axes"]
        n.attrs = {**n.attrs, "axes": tuple(a[j] for j in b)}
        n.inputs = [inner.inputs[0]]
        count += 1
    for n in list(g.nodes):
        if n.op == "permute" and tuple(n.attrs["axes"]) == tuple(range(len(n.attrs["axes"]))):
            g.replace_uses(n.output, n.inputs[0])
            count += 1
    return _finish(g), count


def fold_reshape_chains(graph: Graph) -> tuple[Graph, int]:
    """reshape(reshape(x)) = reshape(x); a reshape back to x's own shape is dropped."""
    g = graph.copy()
    producers, consumers = g.producers(), g.consumers()
    count = 0
    for n in g.nodes:
        inner = producers.get(n.inputs[0]) if n.op == "reshape" else None
        if inner is None or inner.op != "reshape" or not _single_use(g, inner, consumers):
            continue
        n.inputs = [inner.inputs[0]]
        count += 1
    for n in list(g.nodes):
        if n.op == "reshape" and g.type_of(n.inputs[0]) == g.types[n.output]:
            g.replace_uses(n.output, n.inputs[0])
            count += 1
    return _finish(g), count


def fold_scalar_chains(graph: Graph) -> tuple[Graph, int]:
    """(x * a) * b = x * (a * b) and (x + a) + b = x + (a + b) for scalar constants (division
    and subtraction by a constant count as multiplication and addition of its inverse)."""
    g = graph.copy()
    producers, consumers = g.producers(), g.consumers()
    count = 0
    for n in g.nodes:
        outer = _scalar_operand(g, n)
        if outer is None:
            continue
        family, x, c2 = outer
        inner = producers.get(x)
        inner_op = _scalar_operand(g, inner) if inner is not None else None
        if inner_op is None or inner_op[0] != family or not _single_use(g, inner, consumers):
            continue
        _, x0, c1 = inner_op
        value = c1 * c2 if family == "mul" else c1 + c2
        n.op = "mul" if family == "mul" else "add"
        n.inputs = [x0, g.add_constant(np.asarray(value, dtype=g.type_of(x0).dtype), g.fresh_name("w"))]
        count += 1
    return _finish(g), count


def _scalar_operand(g: Graph, n: Node) -> tuple[str, str, float] | None:
    """('mul' or 'add', the other operand, the constant as multiplier or addend) of a node that
    multiplies, divides, adds or subtracts a float scalar constant without broadcasting."""
    if n.op not in ("mul", "div", "add", "sub") or len(n.inputs) != 2:
        return None
    x, c = n.inputs
    if n.op in ("mul", "add") and g.is_constant(x) and not g.is_constant(c):
        x, c = c, x
    if not g.is_constant(c) or g.constants[c].size != 1 or g.type_of(x) != g.types[n.output]:
        return None
    if np.dtype(g.type_of(x).dtype).kind != "f":
        return None
    value = float(g.constants[c].reshape(-1)[0])
    if n.op == "div":
        return ("mul", x, 1.0 / value) if value != 0 else None
    if n.op == "sub":
        return ("add", x, -value)
    return (n.op, x, value)


def attention_heads_last(graph: Graph) -> tuple[Graph, int]:
    """attention(q, k, v) followed by the permute that brings the heads next to the head
    dimension ([B, H, L, D] -> [B, L, H, D], before the reshape that merges them) becomes an
    attention that writes that layout itself. The output projection then reads its input as
    a plain matrix: the same task as the model's other linears of that width (their programs
    and records carry over), instead of one with a permuted read of its own."""
    g = graph.copy()
    consumers = g.consumers()
    count = 0
    for n in g.nodes:
        if n.op != "attention" or n.attrs["heads_last"] or not _single_use(g, n, consumers):
            continue
        reader = consumers[n.output][0]
        if reader.op != "permute" or tuple(reader.attrs["axes"]) != (0, 2, 1, 3):
            continue
        n.attrs = {**n.attrs, "heads_last": True}
        g.types[n.output] = g.types[reader.output]
        g.replace_uses(reader.output, n.output)
        count += 1
    return _finish(g), count


def _single_use(g: Graph, node: Node, consumers: dict) -> bool:
    return node.output not in g.outputs and len(consumers.get(node.output, [])) == 1


def _finish(g: Graph) -> Graph:
    g.sort()
    g.remove_dead()
    g.validate()
    return g


REWRITES: tuple[tuple[str, Callable[[Graph], tuple[Graph, int]]], ...] = (
    ("fold_transpose_pairs", fold_transpose_pairs),
    ("fold_reshape_chains", fold_reshape_chains),
    ("fold_scalar_chains", fold_scalar_chains),
    ("merge_shared_input_projections", merge_shared_input_projections),
    ("fuse_attention", lambda g: _then_fold_transposes(*fuse_attention(g))),
    ("attention_heads_last", attention_heads_last),
)


def _then_fold_transposes(g: Graph, count: int) -> tuple[Graph, int]:
    """The key transpose fused attention adds cancels the one the scores' matmul had."""
    return (fold_transpose_pairs(g)[0], count) if count else (g, 0)
