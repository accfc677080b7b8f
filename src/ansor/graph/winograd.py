"""Winograd form for the 3x3 stride-1 convolutions of a channels-last graph.

Tuned direct convolutions run ResNet's 3x3 layers close to the FMA peak, and so does
onnxruntime: only doing less arithmetic pulls ahead. Winograd F(4x4, 3x3) (`te.winograd`) does
36 products per 16 outputs instead of 144. Each eligible conv2d becomes three graph ops, each
its own task: `winograd_input` (the input transform), a batched `matmul` with the weight
transformed once here (a constant [36, C, K], so its layout is rewritten like any weight), and
`winograd_output` (the output transform with the bias; the ReLU or residual add after it fuse
into that task as its injective consumers).

It pays where the image has many 4x4 output tiles. The products read the transformed weight,
4x the size of the original, once per call and do tiles/2 floating-point operations per byte of
it, so a deep layer with few tiles turns from compute-bound to memory-bound: `MIN_TILES` draws
that line (in ResNet-18 the 56x56 and 28x28 layers gained much, the 14x14 ones little:
BENCHMARKS.md).
"""

from __future__ import annotations

import numpy as np

from ansor.graph.ir import Graph, Node
from ansor.graph.ops import conv_padding4
from ansor.te import winograd

TILE = 4  # F(4x4, 3x3)
#: fewest 4x4 output tiles (over the batch) for which a convolution takes the Winograd form
#: (the products then do at least 16 operations per byte of the transformed weight)
MIN_TILES = 32


def to_winograd(graph: Graph, tile: int = TILE, min_tiles: int | None = None) -> Graph:
    """The graph with every eligible convolution (`eligible`; `min_tiles` defaults to
    `MIN_TILES`) in Winograd form; the graph itself if none is."""
    min_tiles = MIN_TILES if min_tiles is None else min_tiles
    targets = [n for n in graph.nodes if eligible(graph, n, tile, min_tiles)]
    if not targets:
        return graph
    g = graph.copy()
    at, _, bt = winograd.winograd_matrices(tile)
    bt_name = g.add_constant(bt.astype(np.float32), g.fresh_name("winograd_bt"))
    at_name = g.add_constant(at.astype(np.float32), g.fresh_name("winograd_at"))
    for node in targets:
        x, weight, *bias = node.inputs
        u = g.add_constant(winograd.transform_weight(g.constants[weight], tile), g.fresh_name("w"))
        v = g.add_node("winograd_input", [x, bt_name],
                       {"tile": tile, "padding": conv_padding4(node.attrs["padding"])}, node.source)
        m = g.add_node("matmul", [v, u], {}, node.source)
        _, height, width, _ = g.types[node.output].shape
        y = g.add_node("winograd_output", [m, at_name, *bias],
                       {"tile": tile, "height": height, "width": width}, node.source)
        g.replace_uses(node.output, y)
    g.sort()
    g.remove_dead()
    g.validate()
    return g


def eligible(g: Graph, node: Node, tile: int, min_tiles: int) -> bool:
    """A float32 NHWC conv2d with constant 3x3 weights, stride 1, dilation 1, one group, and at
    least `min_tiles` output tiles of tile x tile."""
    a = node.attrs
    if not (node.op == "conv2d" and a["layout"] == "NHWC" and a["groups"] == 1
            and tuple(a["stride"]) == (1, 1) and tuple(a["dilation"]) == (1, 1)
            and all(g.is_constant(i) for i in node.inputs[1:])):
        return False
    weight = g.constants[node.inputs[1]]
    if weight.shape[:2] != (3, 3) or weight.dtype != np.float32:
        return False
    n, height, width, _ = g.types[node.output].shape
    rows, cols = winograd.output_tiles(height, width, tile)
    return n * rows * cols >= min_tiles
