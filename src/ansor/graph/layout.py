"""Channels-last layout: convolutional networks rewritten to run on NHWC activations.

Models arrive from PyTorch and ONNX in NCHW, where a vector of neighbouring values is a run
along the image width. That suits a stride-1 convolution, but a strided or depthwise one then
needs strided loads or gathers. In NHWC a vector is a run of channels and loads contiguously
whatever the stride, and a 1x1 convolution is a plain matrix product over pixels; tuned with
the same budget, the convolutions of ResNet and MobileNet run several times faster in NHWC
(BENCHMARKS.md).

The pass turns every convolution with constant weights into its NHWC form (weights transposed
once, OIHW -> HWIO) between two transposes, and then sinks each transpose back to NCHW down
through the operators that do not care about the layout (elementwise arithmetic, with constant
operands transposed to match, and pooling, which has an NHWC form too). Where a transpose meets
the transpose into the next convolution the two cancel, so a chain of convolutions, activations,
residual additions and pools runs channels-last from the first convolution to the last pool,
with one transpose at each end. A transpose that only moves axes of extent 1 (after a global
pool) becomes a reshape, which the executors run as a view.
"""

from __future__ import annotations

import numpy as np

from ansor.graph.ir import Graph, Node
from ansor.graph.ops import BINARY_OPS, UNARY_OPS

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)

#: Operators whose NHWC form is the same operator with layout="NHWC".
LAYOUT_OPS = ("conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d")
#: Convolutions whose NHWC form takes the weight as HWIO (an integer one's input channels are
#: then contiguous, the depth of a dot-product instruction).
CONVOLUTIONS = ("conv2d", "conv2d_integer")
#: The depth of the int8 dot-product instructions (vpdpbusd, AMX, Arm's sdot): an integer
#: convolution's input channels are padded to a multiple of it.
INTEGER_CHANNEL_MULTIPLE = 4
#: Operators that compute each element from the elements at the same position of their inputs
#: (after broadcasting), so they commute with a transpose of all their operands.
ELEMENTWISE_OPS = frozenset(UNARY_OPS + BINARY_OPS + ("gelu", "clamp", "cast", "where"))


def to_channels_last(graph: Graph) -> Graph:
    """The same function with its convolutions, pools and the elementwise work between them
    on NHWC activations (see the module docstring). A graph without a convolution whose
    weights are constant is returned unchanged."""
    if not any(n.op in CONVOLUTIONS and n.attrs["layout"] == "NCHW" and _constant_weights(graph, n)
               for n in graph.nodes):
        return graph
    g = graph.copy()
    nhwc_source: dict[str, str] = {}  # an NCHW value made by this pass -> its NHWC original
    for node in list(g.nodes):
        new = _channels_last_form(g, node, nhwc_source)
        if new is None:
            continue
        back = g.add_node("permute", [new], {"axes": TO_NCHW}, node.source)
        nhwc_source[back] = new
        g.replace_uses(node.output, back)
    g.sort()
    _drop_inverse_permutes(g)
    _unit_permutes_as_reshapes(g)
    g.remove_dead()
    g.validate()
    return g


def _constant_weights(g: Graph, conv: Node) -> bool:
    return all(g.is_constant(i) for i in conv.inputs[1:])


def _channels_last_form(g: Graph, node: Node, nhwc_source: dict[str, str]) -> str | None:
    """Add `node` computed on NHWC values and return its (NHWC) output, or None where the
    node stays as it is."""
    if node.op in CONVOLUTIONS and node.attrs["layout"] == "NCHW" and _constant_weights(g, node):
        x = node.inputs[0]
        x = nhwc_source.get(x) or g.add_node("permute", [x], {"axes": TO_NHWC}, node.source)
        w = np.ascontiguousarray(g.constants[node.inputs[1]].transpose(2, 3, 1, 0))
        if node.op == "conv2d_integer":
            x, w = _channels_to_depth(g, node, x, w)
        inputs = [x, g.add_constant(w, g.fresh_name("w")), *node.inputs[2:]]
        return g.add_node(node.op, inputs, {**node.attrs, "layout": "NHWC"}, node.source)
    if node.op in LAYOUT_OPS and node.attrs["layout"] == "NCHW" and node.inputs[0] in nhwc_source:
        return g.add_node(node.op, [nhwc_source[node.inputs[0]]],
                          {**node.attrs, "layout": "NHWC"}, node.source)
    if node.op in ELEMENTWISE_OPS and len(g.types[node.output].shape) == 4:
        inputs = _elementwise_inputs(g, node, nhwc_source)
        if inputs is not None:
            return g.add_node(node.op, inputs, node.attrs, node.source)
    return None


def _channels_to_depth(g: Graph, node: Node, x: str, w: np.ndarray) -> tuple[str, np.ndarray]:
    """An integer convolution's NHWC input and HWIO weight with the input channels padded to
    a multiple of INTEGER_CHANNEL_MULTIPLE (the input with its zero point, the weight with
    zeros: the sums are unchanged), so that a 3-channel image's convolution also steps through
    its channels four at a time, as an int8 dot-product instruction does."""
    channels = w.shape[2]
    extra = -channels % INTEGER_CHANNEL_MULTIPLE
    if not extra or node.attrs["groups"] != 1:
        return x, w
    padded = g.add_node("pad", [x], {"pads": ((0, 0), (0, 0), (0, 0), (0, extra)),
                                     "value": node.attrs["pad_value"]}, node.source)
    return padded, np.ascontiguousarray(np.pad(w, ((0, 0), (0, 0), (0, extra), (0, 0))))


def _elementwise_inputs(g: Graph, node: Node, nhwc_source: dict[str, str]) -> list[str] | None:
    """The NHWC operands of an elementwise node whose 4-d operands all come from this pass's
    transposes (constants are transposed to match), or None if one does not."""
    if not any(i in nhwc_source for i in node.inputs):
        return None
    inputs = []
    for i in node.inputs:
        if i in nhwc_source:
            inputs.append(nhwc_source[i])
        elif g.is_constant(i) and g.constants[i].ndim == 0:
            inputs.append(i)
        elif g.is_constant(i) and g.constants[i].ndim <= 4:
            value = g.constants[i]
            value = value.reshape((1,) * (4 - value.ndim) + value.shape)
            inputs.append(g.add_constant(np.ascontiguousarray(value.transpose(TO_NHWC)),
                                         g.fresh_name("w")))
        else:
            return None
    return inputs


def _drop_inverse_permutes(g: Graph) -> None:
    """permute(permute(x, p), q) is one permute of x; where it is the identity, it is x."""
    producers = g.producers()
    for node in g.nodes:
        inner = producers.get(node.inputs[0]) if node.op == "permute" else None
        if inner is None or inner.op != "permute":
            continue
        axes = tuple(inner.attrs["axes"][a] for a in node.attrs["axes"])
        if axes == tuple(range(len(axes))):
            g.replace_uses(node.output, inner.inputs[0])
        else:
            node.inputs, node.attrs = [inner.inputs[0]], {**node.attrs, "axes": axes}


def _unit_permutes_as_reshapes(g: Graph) -> None:
    """A permute that keeps the order of the axes longer than 1 moves no data: a reshape."""
    for node in g.nodes:
        if node.op != "permute":
            continue
        shape = g.type_of(node.inputs[0]).shape
        moved = [a for a in node.attrs["axes"] if shape[a] != 1]
        if moved == sorted(moved):
            node.op = "reshape"
            node.attrs = {"shape": g.types[node.output].shape}
