"""Cutting a model graph into fused subgraphs, each one task for the tuner.

Ansor tunes a network as a set of subgraphs rather than one op at a time: a convolution with its
bias, activation and residual add is one kernel, so the elementwise work happens while the
convolution's output is still in registers instead of in a pass over memory of its own. The
rules are those of TVM's operator fusion, kept simple:

* an *anchor* (conv2d, linear, matmul, a reduction or normalization, pooling, the transforms
  of a Winograd convolution) starts a subgraph
  and absorbs the injective (elementwise or broadcasting) ops that follow it, as long as each
  value in the chain has exactly one reader and is not a graph output, so no intermediate has
  to be written out for someone else;
* a chain of injective ops without an anchor before it is one subgraph, fused the same way
  (gathers count as injective: each output element reads one input element, as in an
  embedding lookup followed by the position embedding's add);
* layout ops (reshape, permute, expand, slice, concat, pad) form their own cheap subgraphs
  (consecutive ones chained), and any other op stands alone;
* a chain of layout ops whose one result is read by an anchor alone joins that anchor's
  subgraph as its producer (the heads split of attention, reshape + permute before the
  attention op), computed inside the anchor's kernel instead of as a copy of its own;
  reshapes alone stay apart (the executor runs them as views of their input).

Many subgraphs of a network compute the same function on different weights (ResNet's repeated
blocks, every layer of a transformer). `Subgraph.key` names that function: ops, attributes,
shapes, internal edges and which inputs are constants, but not the constant values (small
scalar constants excepted, since they are written into the computation as literals). Subgraphs
with equal keys are one task to tune; `unique_tasks` groups them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ansor.graph.ir import Graph, Node, _canonical
from ansor.graph.ops import BINARY_OPS, COMPARE_OPS, LOGICAL_OPS, UNARY_OPS

ANCHOR_OPS = frozenset({
    "conv2d", "linear", "matmul", "scaled_dot_product_attention", "attention",
    "softmax", "log_softmax", "layer_norm", "mean", "sum", "max", "min",
    "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "winograd_input", "winograd_output",
    "conv2d_integer", "matmul_integer",
})
INJECTIVE_OPS = frozenset({*UNARY_OPS, *BINARY_OPS, *COMPARE_OPS, *LOGICAL_OPS, "logical_not",
                           "gelu", "clamp", "cast", "where", "batch_norm", "embedding", "index", "take"})
LAYOUT_OPS = frozenset({"reshape", "permute", "expand", "slice", "concat", "pad"})

#: Anchors written whole by a template (`te.attention`), which takes producers but no epilogue.
NO_EPILOGUE_OPS = frozenset({"attention"})

#: Constants of at most this many elements are part of a subgraph's key (and are written into
#: its computation as literals): a scale of 0.125 and one of 2.0 are different functions.
SCALAR_ELEMENTS = 1


def op_kind(op: str) -> str:
    """'anchor', 'injective', 'layout' or 'opaque' (no fusion, run on its own)."""
    if op in ANCHOR_OPS:
        return "anchor"
    if op in INJECTIVE_OPS:
        return "injective"
    if op in LAYOUT_OPS:
        return "layout"
    return "opaque"


@dataclass
class Subgraph:
    """A fused piece of a model graph, held as a graph of its own: `graph.inputs` are the values
    it reads from outside (activations, never constants), `graph.constants` its weights (the
    arrays of the model, shared), `graph.outputs` the values read outside it or returned by the
    model. Names are those of the whole graph, so the pieces can be stitched back together.
    `kind` is the kind of its first op ('anchor', 'injective', 'layout' or 'opaque'); `anchor`
    is the anchor op's output name, or None."""

    graph: Graph
    kind: str
    anchor: str | None = None

    @property
    def nodes(self) -> list[Node]:
        return self.graph.nodes

    @property
    def inputs(self) -> list[str]:
        return self.graph.inputs

    @property
    def constants(self) -> list[str]:
        """Constant names in the order the nodes first read them."""
        return [c for c in _first_use(self.graph) if self.graph.is_constant(c)]

    @property
    def outputs(self) -> list[str]:
        return self.graph.outputs

    @property
    def anchor_node(self) -> Node | None:
        return next((n for n in self.nodes if n.output == self.anchor), None)

    @property
    def ops(self) -> list[str]:
        return [n.op for n in self.nodes]

    @property
    def name(self) -> str:
        """Its ops in order, each once, as an identifier: `conv2d_add_relu` (at most five)."""
        ops = list(dict.fromkeys(self.ops))
        return "_".join(ops[:5] + (["etc"] if len(ops) > 5 else []))

    @property
    def label(self) -> str:
        """`name` and the output shape of its anchor (else first) op: `conv2d_relu 1x64x56x56`."""
        node = self.anchor_node or self.nodes[0]
        return f"{self.name} {'x'.join(str(d) for d in self.graph.types[node.output].shape) or 'scalar'}"

    @property
    def key(self) -> str:
        """Structural hash: equal for subgraphs computing the same function of their inputs and
        weights, whatever the names and weight values."""
        return hashlib.sha256(json.dumps(self.describe(), sort_keys=True,
                                         separators=(",", ":")).encode()).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        """The data `key` hashes: values renamed canonically (inputs x0.., constants w0..,
        node outputs t0.., in order of first use), with types and the structure of the nodes."""
        g = self.graph
        names = canonical_names(g)
        consts = {}
        for c in self.constants:
            arr = g.constants[c]
            desc: dict[str, Any] = {"shape": list(arr.shape), "dtype": str(arr.dtype)}
            if arr.size <= SCALAR_ELEMENTS:
                desc["value"] = _canonical(arr.reshape(-1).tolist())
            consts[names[c]] = desc
        return {
            "inputs": [[names[i], list(g.types[i].shape), g.types[i].dtype] for i in g.inputs],
            "constants": consts,
            "nodes": [[n.op, {k: _canonical(v) for k, v in sorted(n.attrs.items())},
                       [names[i] for i in n.inputs], names[n.output],
                       list(g.types[n.output].shape), g.types[n.output].dtype]
                      for n in g.nodes],
            "outputs": [names[o] for o in g.outputs],
        }

    def __str__(self) -> str:
        return f"{self.kind} subgraph {self.name}:\n{self.graph}"


def canonical_names(g: Graph) -> dict[str, str]:
    """Names that depend only on structure: x<i> for inputs (in `g.inputs` order), w<i> for
    constants and t<i> for node outputs, both in order of first use."""
    names = {name: f"x{i}" for i, name in enumerate(g.inputs)}
    n_const = 0
    for name in _first_use(g):
        if name not in names and g.is_constant(name):
            names[name] = f"w{n_const}"
            n_const += 1
    for k, n in enumerate(g.nodes):
        names[n.output] = f"t{k}"
    return names


def _first_use(g: Graph) -> list[str]:
    return list(dict.fromkeys(i for n in g.nodes for i in n.inputs))


def partition(graph: Graph) -> list[Subgraph]:
    """Cut `graph` into fused subgraphs (see the module docstring for the rules), listed in an
    order where each subgraph comes after the ones producing its inputs."""
    consumers = graph.consumers()
    graph_outputs = set(graph.outputs)
    group_of: dict[str, int] = {}
    groups: list[list[Node]] = []

    def sole_reader(name: str) -> Node | None:
        users = consumers.get(name, [])
        if name in graph_outputs or len(users) != 1:
            return None
        return users[0]

    # Anchors claim their chains first: an injective op reading both an anchor's chain and
    # another injective chain (attention scores masked by a mask computed from the inputs)
    # becomes the anchor's epilogue instead of extending the other chain.
    for node in sorted(graph.nodes, key=lambda n: op_kind(n.op) != "anchor"):  # stable
        if node.output in group_of:
            continue
        kind = op_kind(node.op)
        group = [node]
        if kind in ("anchor", "injective", "layout") and node.op not in NO_EPILOGUE_OPS:
            follow = "layout" if kind == "layout" else "injective"
            cur = node
            while True:
                nxt = sole_reader(cur.output)
                if nxt is None or nxt.output in group_of or op_kind(nxt.op) != follow:
                    break
                # Each value of the chain has one reader (the next op), so the other inputs of
                # `nxt` cannot depend on the chain: absorbing it creates no cycle.
                group.append(nxt)
                cur = nxt
        for n in group:
            group_of[n.output] = len(groups)
        groups.append(group)

    _merge_layout_producers(graph, groups, group_of, consumers, graph_outputs)
    order = _topological_groups(graph, groups, group_of)
    return [_make_subgraph(graph, groups[i], consumers, graph_outputs) for i in order if groups[i]]


def _merge_layout_producers(graph: Graph, groups: list[list[Node]], group_of: dict[str, int],
                            consumers: dict[str, list[Node]], graph_outputs: set[str]) -> None:
    """Move each layout-only group whose single result has one reader, an anchor, into the
    anchor's group (ahead of its nodes, in graph order). Emptied groups stay, empty. Groups of
    reshapes alone stay: the executor runs them as views, which costs nothing at all."""
    for k, group in enumerate(groups):
        if (not group or any(op_kind(n.op) != "layout" for n in group)
                or all(n.op == "reshape" for n in group)):
            continue
        inside = {n.output for n in group}
        leaving = [n.output for n in group
                   if n.output in graph_outputs or any(u.output not in inside for u in consumers.get(n.output, []))]
        if len(leaving) != 1 or leaving[0] in graph_outputs:
            continue
        readers = consumers.get(leaving[0], [])
        if len(readers) != 1 or op_kind(readers[0].op) != "anchor":
            continue
        target = group_of[readers[0].output]
        if groups[target][0] is not readers[0] and op_kind(groups[target][0].op) != "layout":
            continue  # the anchor is not the head of its group (never so today)
        position = {n.output: i for i, n in enumerate(graph.nodes)}
        groups[target] = sorted(group + groups[target], key=lambda n: position[n.output])
        for n in group:
            group_of[n.output] = target
        groups[k] = []


def _topological_groups(graph: Graph, groups: list[list[Node]],
                        group_of: dict[str, int]) -> list[int]:
    """Group indices ordered so producers come first (stable: by first node otherwise)."""
    deps = [sorted({group_of[i] for n in grp for i in n.inputs
                    if i in group_of and group_of[i] != k}) for k, grp in enumerate(groups)]
    done: set[int] = set()
    order: list[int] = []
    for root in range(len(groups)):
        stack = [(root, False)]
        while stack:
            k, expanded = stack.pop()
            if expanded:
                if k not in done:
                    done.add(k)
                    order.append(k)
                continue
            if k in done:
                continue
            stack.append((k, True))
            stack.extend((d, False) for d in reversed(deps[k]) if d not in done)
    return order


def _make_subgraph(graph: Graph, nodes: list[Node], consumers: dict[str, list[Node]],
                   graph_outputs: set[str]) -> Subgraph:
    inside = {n.output for n in nodes}
    inputs = [i for i in dict.fromkeys(i for n in nodes for i in n.inputs)
              if i not in inside and not graph.is_constant(i)]
    constants = {i: graph.constants[i] for n in nodes for i in n.inputs if graph.is_constant(i)}
    outputs = [n.output for n in nodes
               if n.output in graph_outputs
               or any(u.output not in inside for u in consumers.get(n.output, []))]
    types = {i: graph.types[i] for i in inputs}
    types.update({n.output: graph.types[n.output] for n in nodes})
    sub = Graph(inputs, outputs,
                [Node(n.op, list(n.inputs), dict(n.attrs), n.output, n.source) for n in nodes],
                types, constants)
    sub.validate()
    anchor = next((n for n in nodes if op_kind(n.op) == "anchor"), None)  # after any layout producers
    if anchor is not None:
        return Subgraph(sub, "anchor", anchor.output)
    return Subgraph(sub, op_kind(nodes[0].op))


def unique_tasks(subgraphs: list[Subgraph]) -> list[tuple[str, Subgraph, int]]:
    """(key, the first subgraph with that key, how many subgraphs have it), in order of first
    appearance: the distinct computations to tune, and the weight of each in the model."""
    seen: dict[str, list] = {}
    for s in subgraphs:
        entry = seen.setdefault(s.key, [s, 0])
        entry[1] += 1
    return [(k, s, n) for k, (s, n) in seen.items()]

