"""Signed 8-bit matmuls on the unsigned-by-signed dot-product instruction (the +128 offset).

VNNI's vpdpbusd multiplies *unsigned* bytes by signed bytes; an int8 x int8 matmul
(`torch._int_mm`, a model quantized with signed activations) does not match it and keeps the
widening loop. Shifting the activations into the unsigned range makes it match:

    sum_k a[i, k] * b[k, j] = sum_k (a[i, k] + 128) * b[k, j] - 128 * sum_k b[k, j]

`a + 128` fits uint8 exactly, each product fits the instruction's int16-exact products, and
int32 arithmetic wraps the same on both sides, so the result is bit-exact with numpy's int32
matmul whatever the sizes. The column sums of a constant `b` are computed here, once; the shift
is a cheap elementwise task over `a` (it reads M x K bytes, the matmul does M x N x K products),
and the subtraction is the matmul's epilogue, fused into its task.
"""

from __future__ import annotations

import numpy as np

from ansor.graph.ir import Graph

#: the shift that takes int8 into uint8
OFFSET = 128


def offset_signed_int8_matmuls(graph: Graph) -> Graph:
    """`graph` with every `matmul_integer` of int8 activations and a constant int8 weight in
    the offset form (module docstring); the graph itself when there is none."""
    targets = [n for n in graph.nodes
               if n.op == "matmul_integer" and graph.type_of(n.inputs[0]).dtype == "int8"
               and graph.is_constant(n.inputs[1]) and graph.constants[n.inputs[1]].dtype == np.int8]
    if not targets:
        return graph
    g = graph.copy()
    for node in targets:
        x, w = node.inputs
        wide = g.add_node("cast", [x], {"dtype": "int16"}, node.source)
        shifted = g.add_node("add", [wide, g.add_constant(np.asarray(OFFSET, np.int16))], {}, node.source)
        unsigned = g.add_node("cast", [shifted], {"dtype": "uint8"}, node.source)
        column_sums = g.constants[w].astype(np.int64).sum(axis=0) * OFFSET
        correction = g.add_constant(column_sums.astype(np.int32), g.fresh_name("w"))  # wrapped as int32 sums wrap
        product = g.add_node("matmul_integer", [unsigned, w], dict(node.attrs), node.source)
        result = g.add_node("sub", [product, correction], {}, node.source)
        g.replace_uses(node.output, result)
    g.sort()
    g.remove_dead()
    g.validate()
    return g
