"""The model graph: operators over typed values, with the weights held as constants.

This is what a whole network looks like between an importer and the tuner. It is kept small and
plain so that passes can walk it and rewrite it: a node is an operator name from `ops.OPS`, the
names of its inputs and attributes, and the name of its one output; every value (graph input or
node output) has a static `TensorType`; constants are numpy arrays named in the same namespace
as values, so an input list can mix activations and weights without wrappers. Types are derived
from the operator's shape rule when a node is added, and `validate` rechecks the whole graph,
so a rewrite that breaks the graph fails at the rewrite instead of in an executor.

`node_key` is a structural hash of one node (operator, attributes, the types of its inputs and
whether each is a constant) that does not depend on names or weight values: nodes with equal
keys compute the same function of their inputs and can share one tuned kernel.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ansor.graph.ops import OPS, ShapeError, TensorType, infer_type


class GraphError(ValueError):
    """The graph is malformed (a value used before its definition, a type that disagrees)."""


@dataclass
class Node:
    """One operator application. `attrs` holds every attribute of the operator (defaults
    filled in), so two nodes that compute the same thing have equal attrs. `source` says where
    the node came from in the original model, for error messages."""

    op: str
    inputs: list[str]
    attrs: dict[str, Any]
    output: str
    source: str = ""


@dataclass
class Graph:
    """A dataflow graph in topological order (`nodes`), with its inputs, outputs, the types
    of all values and the constants (weights) it holds."""

    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    types: dict[str, TensorType] = field(default_factory=dict)     # inputs and node outputs
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    _counter: int = 0

    # ------------------------------------------------------------------------- building

    def fresh_name(self, prefix: str = "") -> str:
        """A name not used by any value or constant (node outputs are numbered)."""
        while True:
            name = f"{prefix}{self._counter}"
            self._counter += 1
            if name not in self.types and name not in self.constants:
                return name

    def add_input(self, name: str, shape: Sequence[int], dtype: str) -> str:
        """Declare a graph input (activations, or integer inputs such as token ids)."""
        self._check_new(name)
        self.types[name] = TensorType(tuple(int(d) for d in shape), str(np.dtype(dtype)))
        self.inputs.append(name)
        return name

    def add_constant(self, value: Any, name: str | None = None, dtype: str | None = None) -> str:
        """Hold a weight (or a scalar operand) as a named constant and return its name."""
        array = np.asarray(value, dtype=dtype)
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would make a scalar 1-d)
            array = np.ascontiguousarray(array)
        name = name if name is not None else self.fresh_name("w")
        self._check_new(name)
        self.constants[name] = array
        return name

    def add_node(self, op: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None,
                 source: str = "", name: str | None = None) -> str:
        """Append `op(inputs, **attrs)`, derive its output type, and return the output name."""
        if op not in OPS:
            raise GraphError(f"unknown operator {op!r}")
        full = {**OPS[op].attrs, **(attrs or {})}
        try:
            out_type = infer_type(op, [self.type_of(i) for i in inputs], full)
        except ShapeError as e:
            raise GraphError(f"{e}{f' (at {source})' if source else ''}") from e
        name = name if name is not None else self.fresh_name()
        self._check_new(name)
        self.types[name] = out_type
        self.nodes.append(Node(op, list(inputs), full, name, source))
        return name

    def _check_new(self, name: str) -> None:
        if name in self.types or name in self.constants:
            raise GraphError(f"name {name!r} is already defined")

    # ------------------------------------------------------------------------- queries

    def type_of(self, name: str) -> TensorType:
        """The type of a value or constant."""
        if name in self.types:
            return self.types[name]
        if name in self.constants:
            c = self.constants[name]
            return TensorType(tuple(int(d) for d in c.shape), str(c.dtype))
        raise GraphError(f"undefined value {name!r}")

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def producers(self) -> dict[str, Node]:
        """Each node output name to the node that defines it."""
        return {n.output: n for n in self.nodes}

    def consumers(self) -> dict[str, list[Node]]:
        """Each value or constant name to the nodes that read it (in node order)."""
        uses: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                uses.setdefault(i, []).append(n)
        return uses

    def topological_order(self) -> list[Node]:
        """The nodes ordered so each comes after its producers (stable: the current order
        wherever it is already valid), for passes that append nodes out of order."""
        producers = self.producers()
        order: list[Node] = []
        state: dict[str, int] = {}  # 1: in progress, 2: done

        for root in self.nodes:
            stack = [(root, False)]
            while stack:
                node, expanded = stack.pop()
                if expanded:
                    state[node.output] = 2
                    order.append(node)
                    continue
                s = state.get(node.output)
                if s == 2:
                    continue
                if s == 1:
                    raise GraphError(f"cycle through %{node.output}")
                state[node.output] = 1
                stack.append((node, True))
                for i in reversed(node.inputs):
                    p = producers.get(i)
                    if p is not None and state.get(p.output) != 2:
                        if state.get(p.output) == 1:
                            raise GraphError(f"cycle through %{p.output}")
                        stack.append((p, False))
        return order

    # ------------------------------------------------------------------------- rewriting

    def copy(self) -> "Graph":
        """A copy whose structure can be rewritten independently; the constant arrays are
        shared (passes replace constants, they do not write into them)."""
        return Graph(list(self.inputs), list(self.outputs),
                     [Node(n.op, list(n.inputs), dict(n.attrs), n.output, n.source)
                      for n in self.nodes],
                     dict(self.types), dict(self.constants), self._counter)

    def sort(self) -> None:
        """Put `nodes` in topological order."""
        self.nodes = self.topological_order()

    def replace_uses(self, old: str, new: str) -> None:
        """Make every reader of `old` (and the graph outputs) read `new` instead."""
        if self.type_of(old) != self.type_of(new):
            raise GraphError(f"cannot replace {old} ({self.type_of(old)}) by {new} "
                             f"({self.type_of(new)})")
        for n in self.nodes:
            n.inputs = [new if i == old else i for i in n.inputs]
        self.outputs = [new if o == old else o for o in self.outputs]

    def remove_dead(self) -> None:
        """Drop nodes and constants that no output depends on."""
        producers = self.producers()
        live: set[str] = set()
        stack = list(self.outputs)
        while stack:
            name = stack.pop()
            if name in live:
                continue
            live.add(name)
            if name in producers:
                stack.extend(producers[name].inputs)
        for n in self.nodes:
            if n.output not in live:
                del self.types[n.output]
        self.nodes = [n for n in self.nodes if n.output in live]
        self.constants = {k: v for k, v in self.constants.items() if k in live}

    # ------------------------------------------------------------------------- checking

    def validate(self) -> None:
        """Check that every value is defined once before its use, that every node's recorded
        output type is what its operator's shape rule gives, and that the outputs exist."""
        defined = set(self.constants)
        for name in self.inputs:
            if name in defined:
                raise GraphError(f"input {name!r} is defined twice")
            if name not in self.types:
                raise GraphError(f"input {name!r} has no type")
            defined.add(name)
        for n in self.nodes:
            for i in n.inputs:
                if i not in defined:
                    raise GraphError(f"%{n.output} = {n.op} uses {i!r} before its definition")
            if n.output in defined:
                raise GraphError(f"{n.output!r} is defined twice")
            try:
                expected = infer_type(n.op, [self.type_of(i) for i in n.inputs], n.attrs)
            except ShapeError as e:
                raise GraphError(f"%{n.output} = {n.op}: {e}") from e
            if self.types.get(n.output) != expected:
                raise GraphError(f"%{n.output} = {n.op}: recorded type "
                                 f"{self.types.get(n.output)}, operator gives {expected}")
            defined.add(n.output)
        for o in self.outputs:
            if o not in defined:
                raise GraphError(f"output {o!r} is not defined")

    # ------------------------------------------------------------------------- identity

    def node_key(self, node: Node) -> str:
        """Structural hash of a node: operator, attributes, and per input its type and
        whether it is a constant, independent of names and weight values."""
        data = {
            "op": node.op,
            "attrs": {k: _canonical(v) for k, v in sorted(node.attrs.items())},
            "inputs": [[list(self.type_of(i).shape), self.type_of(i).dtype, self.is_constant(i)]
                       for i in node.inputs],
        }
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # ------------------------------------------------------------------------- printing

    def format_value(self, name: str) -> str:
        return name if name in self.constants else f"%{name}"

    def format_node(self, node: Node) -> str:
        args = [self.format_value(i) for i in node.inputs]
        defaults = OPS[node.op].attrs
        args += [f"{k}={_format_attr(v)}" for k, v in node.attrs.items() if defaults.get(k) != v]
        return f"%{node.output} = {node.op}({', '.join(args)})  # {self.types[node.output]}"

    def __str__(self) -> str:
        lines = [f"graph({', '.join(f'%{i}: {self.types[i]}' for i in self.inputs)}) "
                 f"[{len(self.constants)} constants, "
                 f"{sum(c.size for c in self.constants.values())} elements] {{"]
        lines += ["  " + self.format_node(n) for n in self.nodes]
        lines.append(f"  return {', '.join(self.format_value(o) for o in self.outputs)}")
        lines.append("}")
        return "\n".join(lines)


def _canonical(value: Any) -> Any:
    """Attribute values in a JSON form where equal values have equal text."""
    if isinstance(value, (tuple, list)):
        return [_canonical(v) for v in value]
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (np.integer, np.floating)):
        return _canonical(value.item())
    return value


def _format_attr(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        if len(value) > 0 and all(v == value[0] for v in value) and not isinstance(value[0],
                                                                                   (tuple, list)):
            return _format_attr(value[0])
        return "(" + ", ".join(_format_attr(v) for v in value) + ")"
    return repr(value) if isinstance(value, str) else str(value)

