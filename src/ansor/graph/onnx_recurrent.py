"""ONNX RNN, GRU and LSTM unrolled over their static sequence length into canonical operators.

The sequence length is part of the input's static shape, so each layer is a fixed chain of
steps: the input projection of every step at once (one matmul), then per step the recurrent
matmul, the gates (slices of the gate axis), their activations and the state update, as the
ONNX definitions write them. Every attribute is handled or refused by name: activations
(Sigmoid, Tanh, Relu), clip, direction (forward, reverse, bidirectional), layout, the
initial states, sequence_lens (only when every sequence has the full length), peepholes,
GRU's linear_before_reset; LSTM's input_forget and the activations that take alpha / beta
are refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ansor.graph.onnx_importer import _OnnxImporter, _attr, _handles, _text

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
_ACTIVATIONS = {"sigmoid": "sigmoid", "tanh": "tanh", "relu": "relu"}
_COMMON = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout")


class _Builder:
    """Graph nodes of one recurrent layer, named after the ONNX node."""

    def __init__(self, imp: _OnnxImporter, node: Any):
        self.imp, self.node = imp, node
        self.source = f"ONNX {node.op_type} {node.name!r}"

    def add(self, op: str, inputs: list[str], **attrs: Any) -> str:
        return self.imp.graph.add_node(op, inputs, attrs, source=self.source)

    def part(self, x: str, axis: int, start: int, end: int) -> str:
        return self.add("slice", [x], axis=axis, start=start, end=end, step=1)

    def row(self, x: str, index: int) -> str:
        """x[index] with the leading axis dropped."""
        shape = self.imp.graph.type_of(x).shape
        return self.add("reshape", [self.part(x, 0, index, index + 1)], shape=shape[1:])

    def stack(self, parts: list[str]) -> str:
        """The values stacked along a new leading axis."""
        shape = self.imp.graph.type_of(parts[0]).shape
        grown = [self.add("reshape", [p], shape=(1, *shape)) for p in parts]
        return grown[0] if len(grown) == 1 else self.add("concat", grown, axis=0)


@_handles("RNN", attrs=_COMMON)
def _rnn(imp: _OnnxImporter, node: Any) -> None:
    _recurrent(imp, node)


@_handles("GRU", attrs=_COMMON + ("linear_before_reset",))
def _gru(imp: _OnnxImporter, node: Any) -> None:
    _recurrent(imp, node)


@_handles("LSTM", attrs=_COMMON + ("input_forget",))
def _lstm(imp: _OnnxImporter, node: Any) -> None:
    if _attr(node, "input_forget", 0):
        imp._unsupported(node, "input_forget of")
    _recurrent(imp, node)


def _recurrent(imp: _OnnxImporter, node: Any) -> None:
    kind = node.op_type
    gates = _GATES[kind]
    b = _Builder(imp, node)

    def given(i: int) -> str:
        return node.input[i] if len(node.input) > i and node.input[i] else ""

    if _attr(node, "activation_alpha", None) is not None or _attr(node, "activation_beta", None) is not None:
        imp._unsupported(node, "activation_alpha / activation_beta of")
    direction = _text(_attr(node, "direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        imp._unsupported(node, f"direction {direction!r} of")
    directions = 2 if direction == "bidirectional" else 1
    layout = int(_attr(node, "layout", 0))
    if layout not in (0, 1):
        imp._unsupported(node, f"layout {layout} of")
    dtype = imp.dtype(node.input[0])
    if dtype not in ("float32", "float64"):
        imp._unsupported(node, f"{dtype} input of")
    x = imp.value(node.input[0])
    if layout:
        x = b.add("permute", [x], axes=(1, 0, 2))
    steps, batch, _ = imp.graph.type_of(x).shape
    w_shape = imp.shape(node.input[1])
    hidden = int(_attr(node, "hidden_size", imp.shape(node.input[2])[-1]))
    if w_shape[0] != directions or w_shape[1] != gates * hidden or imp.shape(node.input[2])[1:] != (gates * hidden, hidden):
        imp._unsupported(node, f"weights {list(w_shape)} / {list(imp.shape(node.input[2]))} for hidden_size {hidden} of")
    names = [_text(a) for a in _attr(node, "activations", [])] or _DEFAULT_ACTIVATIONS[kind] * directions
    per_direction = len(_DEFAULT_ACTIVATIONS[kind])
    if len(names) == per_direction and directions == 2:
        names = names * 2
    if len(names) != per_direction * directions:
        imp._unsupported(node, f"{len(names)} activations for {directions} direction(s) of")
    for name in names:
        if name.lower() not in _ACTIVATIONS:
            imp._unsupported(node, f"activation {name!r} of")
    clip = _attr(node, "clip", None)
    if given(4):
        lengths = np.asarray(imp.const(given(4), "sequence_lens", node)).reshape(-1)
        if not np.all(lengths == steps):
            imp._unsupported(node, f"sequence_lens {lengths.tolist()} shorter than the sequence ({steps}) of")
    linear_before_reset = bool(_attr(node, "linear_before_reset", 0))

    finals_h, finals_c, ys = [], [], []
    for d in range(directions):
        acts = [_ACTIVATIONS[n.lower()] for n in names[d * per_direction:(d + 1) * per_direction]]
        w = b.add("permute", [b.row(imp.value(node.input[1]), d)], axes=(1, 0))   # [I, G*H]
        r = b.add("permute", [b.row(imp.value(node.input[2]), d)], axes=(1, 0))   # [H, G*H]
        projected = b.add("matmul", [x, w])                                         # [T, N, G*H]
        r_bias = None
        if given(3):
            bias = b.row(imp.value(given(3)), d)                                     # [2*G*H]
            projected = b.add("add", [projected, b.part(bias, 0, 0, gates * hidden)])
            r_bias = b.part(bias, 0, gates * hidden, 2 * gates * hidden)
        zeros = imp.graph.add_constant(np.zeros((batch, hidden), dtype))
        h = b.row(imp.value(given(5)), d) if given(5) else zeros
        c = b.row(imp.value(given(6)), d) if kind == "LSTM" and given(6) else zeros
        peep = b.row(imp.value(given(7)), d) if kind == "LSTM" and given(7) else None
        order = range(steps - 1, -1, -1) if (direction == "reverse" or d == 1) else range(steps)
        outputs: dict[int, str] = {}
        for t in order:
            xt = b.row(projected, t)                                                 # [N, G*H]
            rec = b.add("matmul", [h, r])
            if r_bias is not None:
                rec = b.add("add", [rec, r_bias])
            if kind == "RNN":
                h = _act(b, acts[0], b.add("add", [xt, rec]), clip)
            elif kind == "GRU":
                h = _gru_step(b, xt, rec, h, r, r_bias, hidden, acts, clip, linear_before_reset)
            else:
                h, c = _lstm_step(b, xt, rec, c, peep, hidden, acts, clip)
            outputs[t] = h
        ys.append([outputs[t] for t in range(steps)])
        finals_h.append(h)
        finals_c.append(c)
    out = list(node.output) + [""] * 3
    if out[0]:
        y = b.stack([b.stack([ys[d][t] for d in range(directions)]) for t in range(steps)])  # [T, D, N, H]
        imp.values[out[0]] = b.add("permute", [y], axes=(2, 0, 1, 3)) if layout else y
    for position, finals in ((1, finals_h), (2, finals_c)):
        if out[position]:
            state = b.stack(finals)                                                   # [D, N, H]
            imp.values[out[position]] = b.add("permute", [state], axes=(1, 0, 2)) if layout else state


def _act(b: _Builder, op: str, x: str, clip: Any) -> str:
    if clip is not None:
        x = b.add("clamp", [x], min=-float(clip), max=float(clip))
    return b.add(op, [x])


def _gate(b: _Builder, x: str, k: int, hidden: int) -> str:
    return b.part(x, 1, k * hidden, (k + 1) * hidden)


def _gru_step(b: _Builder, xt: str, rec: str, h: str, r: str, r_bias: str | None, hidden: int,
              acts: list[str], clip: Any, linear_before_reset: bool) -> str:
    """Gates z, r, h (in that order): z = f(..), r = f(..), h~ = g(x Wh + (r * h) Rh + Rbh + Wbh)
    or, linear before reset, g(x Wh + r * (h Rh + Rbh) + Wbh); H = (1 - z) * h~ + z * H."""
    f, g = acts
    z = _act(b, f, b.add("add", [_gate(b, xt, 0, hidden), _gate(b, rec, 0, hidden)]), clip)
    reset = _act(b, f, b.add("add", [_gate(b, xt, 1, hidden), _gate(b, rec, 1, hidden)]), clip)
    if linear_before_reset:
        candidate = b.add("add", [_gate(b, xt, 2, hidden), b.add("mul", [reset, _gate(b, rec, 2, hidden)])])
    else:
        rh = b.part(r, 1, 2 * hidden, 3 * hidden)                                    # [H, H]
        inner = b.add("matmul", [b.add("mul", [reset, h]), rh])
        if r_bias is not None:
            inner = b.add("add", [inner, b.part(r_bias, 0, 2 * hidden, 3 * hidden)])
        candidate = b.add("add", [_gate(b, xt, 2, hidden), inner])
    candidate = _act(b, g, candidate, clip)
    # (1 - z) * h~ + z * H  ==  h~ + z * (H - h~)
    return b.add("add", [candidate, b.add("mul", [z, b.add("sub", [h, candidate])])])


def _lstm_step(b: _Builder, xt: str, rec: str, c: str, peep: str | None, hidden: int, acts: list[str],
               clip: Any) -> tuple[str, str]:
    """Gates i, o, f, c (in that order), peepholes P = [Pi, Po, Pf]: C = f * C + i * g(..),
    H = o * h(C), the output gate peeping at the new C."""
    f, g, h_act = acts
    pre = b.add("add", [xt, rec])

    def peeped(k: int, p: int, state: str) -> str:
        x = _gate(b, pre, k, hidden)
        if peep is not None:
            x = b.add("add", [x, b.add("mul", [b.part(peep, 0, p * hidden, (p + 1) * hidden), state])])
        return x

    i = _act(b, f, peeped(0, 0, c), clip)
    forget = _act(b, f, peeped(2, 2, c), clip)
    cell = _act(b, g, _gate(b, pre, 3, hidden), clip)
    c = b.add("add", [b.add("mul", [forget, c]), b.add("mul", [i, cell])])
    o = _act(b, f, peeped(1, 1, c), clip)
    return b.add("mul", [o, _act(b, h_act, c, clip)]), c
