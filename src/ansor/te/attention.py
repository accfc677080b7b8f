"""Attention as a template declaration: plain te stages for its meaning, one marked stage for
how it runs.

`softmax(q @ k^T * scale + mask) @ v` cannot be written in te as the kernel that runs it well:
that kernel computes the softmax online over tiles of keys (a running maximum and sum, the
accumulator rescaled when the maximum grows), a loop-carried recurrence that te's computes
(each element a pure function of its indices, a reduction the whole body) do not express. So
the declaration has two readers. Everything that asks *what* is computed (the numpy
reference, FLOPs, the workload key, serialization) reads the ordinary stages below: scores,
masked scores, the four softmax stages and the weighted sum. The weighted sum carries
`attrs["template"] = "attention"` with the parameters; the search (`search.template`) then
tunes only that stage's knobs, and the lowering (`lower.attention`) writes the fused
program from them. The marker is part of the workload key, so a template task never shares
records with the same stages tuned as ordinary stages.

Layout: q [B, H, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv]. Grouped-query attention is
Hkv dividing H (query head h reads key/value head h // (H // Hkv)); Hkv == H is multi-head.
The output is [B, H, Lq, Dv], or with `heads_last` [B, Lq, H, Dv]: the layout the output
projection reads after merging the heads, written directly so that no copy (and no permuted
read in the projection's kernel) is needed.
Masks: `causal` keeps key j for query i when j <= i (top left aligned, as PyTorch's
`is_causal`); `mask` is an additive float tensor broadcasting to [B, H, Lq, Lk]; `lengths`
([B] integers) keeps keys j < lengths[b] (padding). Masked scores are -inf, so a row with every
key masked gives NaN, as PyTorch's does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ansor.te import expr as E
from ansor.te.ops import softmax
from ansor.te.tensor import ComputeOp, Tensor, compute, reduce_axis

TEMPLATE = "attention"
#: The revision of the program `lower.attention` writes from the knobs: part of the workload
#: key, so records of an earlier program's knobs are never replayed as this one's.
PROGRAM_REVISION = 2
MASK_KINDS = ("none", "additive", "lengths")


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, lengths: Tensor | None = None,
              scale: float | None = None, causal: bool = False, name: str = "attention",
              template: bool = True, heads_last: bool = False) -> Tensor:
    """The attention output [B, H, Lq, Dv] ([B, Lq, H, Dv] with `heads_last`); with `template`
    (the default) it is the one tunable task of `lower.attention`, else ordinary stages the
    search schedules one by one."""
    _check(q, k, v, mask, lengths)
    b, h, lq, d = q.shape
    hkv, lk, dv = k.shape[1], k.shape[2], v.shape[3]
    group = h // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    kind = "additive" if mask is not None else "lengths" if lengths is not None else "none"
    rd = reduce_axis(d, "d")
    scores = compute((b, h, lq, lk), lambda n, c, i, j: E.sum(q[n, c, i, rd] * k[n, c // group, j, rd], axis=rd),
                     name=f"{name}_scores", tag="batch_matmul")
    lowest = E.const(-math.inf, q.dtype)

    def masked(n, c, i, j):
        value = scores[n, c, i, j] * scale
        if mask is not None:
            value = value + mask[_broadcast(mask, (n, c, i, j))]
        if lengths is not None:
            value = E.if_then_else(j < E.cast(lengths[n], "int32"), value, lowest)
        if causal:
            value = E.if_then_else(j <= i, value, lowest)
        return value

    p = softmax(compute((b, h, lq, lk), masked, name=f"{name}_masked", tag="elemwise"), axis=-1,
                name=f"{name}_softmax")
    rj = reduce_axis(lk, "j")
    attrs = {"template": TEMPLATE, "program": PROGRAM_REVISION, "scale": scale, "causal": bool(causal), "mask": kind} if template else None
    if heads_last:
        if attrs is not None:
            attrs["heads_last"] = True  # only when set: the keys of the default layout are unchanged
        return compute((b, lq, h, dv), lambda n, i, c, e: E.sum(p[n, c, i, rj] * v[n, c // group, rj, e], axis=rj),
                       name=name, tag="batch_matmul", attrs=attrs)
    return compute((b, h, lq, dv), lambda n, c, i, e: E.sum(p[n, c, i, rj] * v[n, c // group, rj, e], axis=rj),
                   name=name, tag="batch_matmul", attrs=attrs)


@dataclass(frozen=True)
class AttentionParts:
    """What the template lowering needs of a declaration: its input tensors by role and its
    parameters."""

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    lengths: Tensor | None
    scale: float
    causal: bool
    output: Tensor
    heads_last: bool = False  # the output is [B, Lq, H, Dv]

    @property
    def group(self) -> int:
        return self.q.shape[1] // self.k.shape[1]


def is_template(op) -> bool:
    """Whether `op` is the marked stage of an attention template."""
    return isinstance(op, ComputeOp) and op.attrs.get("template") == TEMPLATE


def attention_parts(output: Tensor) -> AttentionParts:
    """The roles of the inputs of the template whose marked stage is `output`, found from the
    stages `attention` declares (q and k are read by the scores, v by the weighted sum, the
    mask or lengths by the masked scores)."""
    op = output.op
    if not is_template(op):
        raise ValueError(f"{output.name!r} is not an attention template stage")
    p, v = _reads(op)
    exp = _reads(p.op)[0]          # softmax_norm reads exp, then sum
    masked = _reads(exp.op)[0]     # softmax_exp reads the masked scores, then their max
    reads = _reads(masked.op)  # the scores (the one reduction) and the mask or lengths, in any order
    scores = next(t for t in reads if isinstance(t.op, ComputeOp) and t.op.reduce_axes)
    extra = [t for t in reads if t is not scores]
    q, k = _reads(scores.op)
    mask = extra[0] if op.attrs["mask"] == "additive" else None
    lengths = extra[0] if op.attrs["mask"] == "lengths" else None
    return AttentionParts(q, k, v, mask, lengths, float(op.attrs["scale"]), bool(op.attrs["causal"]), output,
                          bool(op.attrs.get("heads_last", False)))


def _reads(op) -> list[Tensor]:
    return list(op.input_tensors()) if isinstance(op, ComputeOp) else []


def _broadcast(t: Tensor, idx: tuple) -> tuple:
    """`t`'s indices at output position `idx` of rank 4 under numpy broadcasting."""
    own = idx[4 - t.ndim:]
    return tuple(0 if t.shape[dim] == 1 else i for dim, i in enumerate(own))


def _check(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, lengths: Tensor | None) -> None:
    if not (q.ndim == k.ndim == v.ndim == 4):
        raise ValueError(f"attention: q, k, v must be [batch, heads, length, dim], got {q.shape} {k.shape} {v.shape}")
    b, h, _, d = q.shape
    if k.shape[0] != b or v.shape[0] != b or k.shape[3] != d or v.shape[1:3] != k.shape[1:3]:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not agree")
    if h % k.shape[1]:
        raise ValueError(f"attention: {h} query heads cannot share {k.shape[1]} key/value heads")
    if not (q.dtype == k.dtype == v.dtype) or not E.is_float(q.dtype):
        raise ValueError(f"attention: q, k, v must share one float dtype, got {q.dtype} {k.dtype} {v.dtype}")
    if mask is not None and lengths is not None:
        raise ValueError("attention: give an additive mask or padding lengths, not both")
    if mask is not None:
        full = (b, h, q.shape[2], k.shape[2])
        if mask.ndim > 4 or any(m not in (1, f) for m, f in zip(mask.shape, full[4 - mask.ndim:])):
            raise ValueError(f"attention: mask {mask.shape} does not broadcast to {full}")
        if mask.dtype != q.dtype:
            raise ValueError(f"attention: an additive mask of {mask.dtype} for {q.dtype} scores")
    if lengths is not None and (lengths.shape != (b,) or not lengths.dtype.startswith("int")):
        raise ValueError(f"attention: lengths must be [{b}] integers, got {lengths.shape} {lengths.dtype}")
