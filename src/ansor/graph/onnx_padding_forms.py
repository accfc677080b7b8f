"""ONNX's implicit padding forms made explicit at import, so that one set of handlers runs them.

`auto_pad` (SAME_UPPER, SAME_LOWER, VALID) on Conv, ConvTranspose and the pools, a
ConvTranspose's `output_shape`, and a pool's `ceil_mode` where the compiled 2-d pools do not
run it (3-d, dilated averages, asymmetric pads) all fix the padding once the input shape is
known: each becomes explicit `pads` (the extra cells of ceil mode are padding at the end that
no window counts) and the node goes to the handler of its explicit form. MaxPool's second
output (the flat indices of the maxima) is the canonical `max_pool2d_indices` plus the offset
of each (n, c) plane.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ansor.graph.onnx_importer import _HANDLERS, _OnnxImporter, _attr, _handles, _text

_EXPLICIT = {op: _HANDLERS[op] for op in ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool")}


def _with_attrs(node: Any, drop: tuple[str, ...], **ints: list[int]) -> Any:
    """A copy of `node` without the attributes `drop`, with integer-list attributes set."""
    from onnx import helper

    copy = type(node)()
    copy.CopyFrom(node)
    kept = [a for a in copy.attribute if a.name not in drop and a.name not in ints]
    del copy.attribute[:]
    copy.attribute.extend(kept)
    copy.attribute.extend(helper.make_attribute(name, [int(v) for v in values]) for name, values in ints.items())
    return copy


def _same_pads(imp: _OnnxImporter, node: Any, spatial: tuple[int, ...], kernel: list[int]) -> list[int]:
    """The explicit pads (begins then ends) of auto_pad on a convolution or pool."""
    mode = _text(_attr(node, "auto_pad", "NOTSET"))
    rank = len(spatial)
    if mode == "VALID":
        return [0] * (2 * rank)
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        imp._unsupported(node, f"auto_pad {mode!r} of")
    strides = list(_attr(node, "strides", [1] * rank))
    dilations = list(_attr(node, "dilations", [1] * rank))
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else large)
        ends.append(large if mode == "SAME_UPPER" else small)
    return begins + ends


@_handles("Conv", attrs=("auto_pad", "pads", "strides", "dilations", "group", "kernel_shape"))
def _conv(imp: _OnnxImporter, node: Any) -> None:
    if _text(_attr(node, "auto_pad", "NOTSET")) != "NOTSET":
        kernel = list(imp.shape(node.input[1])[2:])
        node = _with_attrs(node, ("auto_pad",), pads=_same_pads(imp, node, imp.shape(node.input[0])[2:], kernel))
    _EXPLICIT["Conv"](imp, node)


@_handles("ConvTranspose", attrs=("auto_pad", "pads", "strides", "dilations", "group", "kernel_shape",
                                  "output_padding", "output_shape"))
def _conv_transpose(imp: _OnnxImporter, node: Any) -> None:
    """`output_shape` (or auto_pad SAME: the input times the stride) fixes the total padding
    of each axis: stride * (in - 1) + output_padding + (k - 1) * d + 1 - out, split as ONNX says
    (the larger half at the end for SAME_UPPER, at the beginning otherwise)."""
    mode = _text(_attr(node, "auto_pad", "NOTSET"))
    target = _attr(node, "output_shape", None)
    if mode == "NOTSET" and target is None:
        _EXPLICIT["ConvTranspose"](imp, node)
        return
    spatial = imp.shape(node.input[0])[2:]
    rank = len(spatial)
    kernel = list(imp.shape(node.input[1])[2:])
    strides = list(_attr(node, "strides", [1] * rank))
    dilations = list(_attr(node, "dilations", [1] * rank))
    output_padding = list(_attr(node, "output_padding", [0] * rank))
    if mode == "VALID" and target is None:
        _EXPLICIT["ConvTranspose"](imp, _with_attrs(node, ("auto_pad",), pads=[0] * (2 * rank)))
        return
    if target is not None:
        target = list(target)[-rank:]
    elif mode in ("SAME_UPPER", "SAME_LOWER"):
        target = [size * s for size, s in zip(spatial, strides)]
    else:
        imp._unsupported(node, f"auto_pad {mode!r} of")
    begins, ends = [], []
    for size, k, s, d, op, out in zip(spatial, kernel, strides, dilations, output_padding, target):
        total = s * (size - 1) + op + (k - 1) * d + 1 - out
        small, large = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else large)
        ends.append(large if mode == "SAME_UPPER" else small)
    if min(begins) < 0:
        imp._unsupported(node, f"output_shape {list(target)} that pads the beginning of")
    # a negative pad at the end extends the output there: cells no input reaches (the bias)
    output_padding = [op - min(0, e) for op, e in zip(output_padding, ends)]
    ends = [max(0, e) for e in ends]
    _EXPLICIT["ConvTranspose"](imp, _with_attrs(node, ("auto_pad", "output_shape"), pads=begins + ends,
                                                output_padding=output_padding))


@_handles("MaxPool", attrs=("auto_pad", "pads", "kernel_shape", "strides", "ceil_mode", "dilations", "storage_order"))
def _max_pool(imp: _OnnxImporter, node: Any) -> None:
    _pool(imp, node, "max")
    if len(node.output) > 1 and node.output[1]:
        _max_pool_indices(imp, node)


@_handles("AveragePool", attrs=("auto_pad", "pads", "kernel_shape", "strides", "ceil_mode", "count_include_pad",
                                "dilations"))
def _average_pool(imp: _OnnxImporter, node: Any) -> None:
    _pool(imp, node, "avg")


@_handles("LpPool", attrs=("auto_pad", "pads", "kernel_shape", "strides", "ceil_mode", "dilations", "p"))
def _lp_pool(imp: _OnnxImporter, node: Any) -> None:
    _pool(imp, node, "lp")


def _explicit_pool(imp: _OnnxImporter, node: Any) -> Any:
    """The node with auto_pad as explicit pads."""
    if _text(_attr(node, "auto_pad", "NOTSET")) == "NOTSET":
        return node
    spatial = imp.shape(node.input[0])[2:]
    kernel = list(_attr(node, "kernel_shape", []))
    return _with_attrs(node, ("auto_pad",), pads=_same_pads(imp, node, spatial, kernel))


def _pool(imp: _OnnxImporter, node: Any, kind: str) -> None:
    from ansor.graph.onnx_importer import _spatial_node

    node = _explicit_pool(imp, node)
    spatial = imp.shape(node.input[0])[2:]
    rank = len(spatial)
    pads = list(_attr(node, "pads", [0] * (2 * rank)))
    dilations = list(_attr(node, "dilations", [1] * rank))
    asymmetric = pads[:rank] != pads[rank:]
    ceil = bool(_attr(node, "ceil_mode", 0))
    compiled_ceil = rank == 2 and kind == "max" or (rank == 2 and kind == "avg" and set(dilations) == {1})
    if kind == "lp" or not (asymmetric or (ceil and not compiled_ceil)):
        _EXPLICIT[{"max": "MaxPool", "avg": "AveragePool", "lp": "LpPool"}[kind]](imp, node)
        return
    if ceil:
        kernel = list(_attr(node, "kernel_shape", []))
        strides = list(_attr(node, "strides", [1] * rank))
        for i, (size, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations)):
            reach = (k - 1) * d + 1
            out = math.ceil((size + pads[i] + pads[rank + i] - reach) / s) + 1
            if (out - 1) * s >= size + pads[i]:  # the last window must start inside the input or its left pad
                out -= 1
            extra = max(0, (out - 1) * s + reach - (size + pads[i] + pads[rank + i]))
            if extra and kind == "avg" and _attr(node, "count_include_pad", 0):
                imp._unsupported(node, "ceil_mode with count_include_pad of")
            pads[rank + i] += extra
        node = _with_attrs(node, ("ceil_mode",), pads=pads)
    _spatial_node(imp, node, "pool_nd", rank, kind=kind)


def _max_pool_indices(imp: _OnnxImporter, node: Any) -> None:
    """ONNX's indices count over the whole tensor (row-major): the position in the (n, c)
    plane plus (n * C + c) * H * W."""
    shape = imp.shape(node.input[0])
    if len(shape) != 4:
        imp._unsupported(node, f"Indices output of a {len(shape) - 2}-d")
    if _attr(node, "storage_order", 0):
        imp._unsupported(node, "column-major storage_order of the Indices output of")
    node = _explicit_pool(imp, node)
    pads = list(_attr(node, "pads", [0, 0, 0, 0]))
    if pads[:2] != pads[2:]:
        imp._unsupported(node, f"Indices output with asymmetric pads {pads} of")
    n, c, h, w = shape
    inside = imp.graph.add_node("max_pool2d_indices", [imp.value(node.input[0])], {
        "kernel": tuple(_attr(node, "kernel_shape", [1, 1])), "stride": tuple(_attr(node, "strides", [1, 1])),
        "padding": tuple(pads[:2]), "dilation": tuple(_attr(node, "dilations", [1, 1])),
        "ceil_mode": bool(_attr(node, "ceil_mode", 0))}, source=f"ONNX MaxPool {node.name!r}")
    planes = (np.arange(n * c, dtype=np.int64) * (h * w)).reshape(n, c, 1, 1)
    imp.emit(node, "add", [inside, imp.graph.add_constant(planes)], out=1)
