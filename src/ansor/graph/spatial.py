"""Convolutions and pools of any spatial rank, and transposed convolutions, in numpy.

The compiled path handles 2-d convolutions and pools (1-d ones go through it as images of
height 1). Models also hold 3-d convolutions and pools, transposed convolutions and Lp pools;
these run here, as numpy fallback subgraphs: correct, said at build time, not tuned. Each is
written once for any rank by iterating over the kernel's offsets: a strided slice of the
padded input per offset, contracted with that offset's weights.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

__all__ = ["conv_nd", "conv_transpose_nd", "pool_nd", "conv_output_size", "conv_transpose_output_size"]


def conv_output_size(size: int, kernel: int, stride: int, dilation: int, pad_begin: int, pad_end: int) -> int:
    """Output extent of one spatial axis of a convolution or pool (floor mode)."""
    return (size + pad_begin + pad_end - (dilation * (kernel - 1) + 1)) // stride + 1


def conv_transpose_output_size(size: int, kernel: int, stride: int, dilation: int, pad_begin: int,
                               pad_end: int, output_padding: int) -> int:
    """Output extent of one spatial axis of a transposed convolution."""
    return stride * (size - 1) + output_padding + dilation * (kernel - 1) + 1 - pad_begin - pad_end


def _offset_slices(offset: Sequence[int], dilation: Sequence[int], stride: Sequence[int],
                   out: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(k * d, k * d + (o - 1) * s + 1, s) for k, d, s, o in zip(offset, dilation, stride, out))


def conv_nd(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, stride: Sequence[int],
            pads: Sequence[tuple[int, int]], dilation: Sequence[int], groups: int) -> np.ndarray:
    """x [N, C, *S] convolved with w [O, C / groups, *K] (cross-correlation, as ONNX and PyTorch)."""
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    kernel = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), *pads))
    out = [conv_output_size(s, k, st, d, lo, hi) for s, k, st, d, (lo, hi)
           in zip(x.shape[2:], kernel, stride, dilation, pads)]
    acc = np.zeros((n, o, *out), dtype=np.float64)
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg].astype(np.float64)
        wg = w[g * og:(g + 1) * og].astype(np.float64)
        for offset in itertools.product(*(range(k) for k in kernel)):
            window = xs[(slice(None), slice(None), *_offset_slices(offset, dilation, stride, out))]
            acc[:, g * og:(g + 1) * og] += np.einsum("nc...,oc->no...", window, wg[(slice(None), slice(None), *offset)])
    if bias is not None:
        acc += bias.reshape((1, o) + (1,) * len(kernel))
    return acc.astype(x.dtype)


def conv_transpose_nd(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, stride: Sequence[int],
                      pads: Sequence[tuple[int, int]], dilation: Sequence[int], groups: int,
                      output_padding: Sequence[int]) -> np.ndarray:
    """x [N, C, *S] through the transpose of a convolution with w [C, O / groups, *K]: each
    input element scatters w's kernel into the output at stride, then the pads are cut off."""
    n, c = x.shape[:2]
    og = w.shape[1]
    kernel = w.shape[2:]
    cg = c // groups
    full = [stride[i] * (x.shape[2 + i] - 1) + output_padding[i] + dilation[i] * (kernel[i] - 1) + 1
            for i in range(len(kernel))]
    acc = np.zeros((n, og * groups, *full), dtype=np.float64)
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg].astype(np.float64)
        wg = w[g * cg:(g + 1) * cg].astype(np.float64)
        for offset in itertools.product(*(range(k) for k in kernel)):
            place = tuple(slice(k * d, k * d + (s_in - 1) * st + 1, st) for k, d, st, s_in
                          in zip(offset, dilation, stride, x.shape[2:]))
            acc[(slice(None), slice(g * og, (g + 1) * og), *place)] += np.einsum(
                "nc...,co->no...", xs, wg[(slice(None), slice(None), *offset)])
    cut = tuple(slice(lo, f - hi) for (lo, hi), f in zip(pads, full))
    y = acc[(slice(None), slice(None), *cut)]
    if bias is not None:
        y = y + bias.reshape((1, -1) + (1,) * len(kernel))
    return y.astype(x.dtype)


def pool_nd(x: np.ndarray, kind: str, kernel: Sequence[int], stride: Sequence[int],
            pads: Sequence[tuple[int, int]], dilation: Sequence[int], count_include_pad: bool = False,
            p: int = 2) -> np.ndarray:
    """Max, average or Lp pooling of x [N, C, *S] over windows of `kernel` (floor mode)."""
    out = [conv_output_size(s, k, st, d, lo, hi) for s, k, st, d, (lo, hi)
           in zip(x.shape[2:], kernel, stride, dilation, pads)]
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), *pads), constant_values=fill)
    valid = np.pad(np.ones(x.shape[2:]), list(pads))
    acc = np.full((*x.shape[:2], *out), fill)
    count = np.zeros(out)
    for offset in itertools.product(*(range(k) for k in kernel)):
        where = _offset_slices(offset, dilation, stride, out)
        window = xp[(slice(None), slice(None), *where)]
        if kind == "max":
            acc = np.maximum(acc, window)
        elif kind == "avg":
            acc = acc + window
            count = count + (1.0 if count_include_pad else valid[where])
        else:
            acc = acc + np.abs(window) ** p
    if kind == "avg":
        acc = acc / count
    elif kind == "lp":
        acc = acc ** (1.0 / p)
    return acc.astype(x.dtype)
