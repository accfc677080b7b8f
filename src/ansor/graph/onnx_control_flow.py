"""ONNX control flow made static at import: If, Loop and Scan become straight-line graphs.

A static graph holds no branch and no loop, but most control flow in exported models is
decided by what is known at import: an `If` on the rank of a shape, a `Loop` whose trip count
is a static length (the standard's own `Range` expansion), a `Scan` over the time axis of a
statically shaped tensor. Here the `If` takes its branch, and `Loop` and `Scan` are unrolled:
each iteration's body is imported like any other nodes, its inputs bound to that iteration's
values, under a fresh name prefix. Names a body reads from the enclosing graph (outer scope)
keep their meaning. A condition or trip count computed at run time is refused by name.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ansor.graph.onnx_importer import _OnnxImporter, _attr, _handles

#: a loop unrolled past this many iterations is refused (the graph would be unreasonably large)
MAX_UNROLLED_ITERATIONS = 4096


def defined_names(graph: Any) -> set[str]:
    """Every value name a (sub)graph defines: its inputs, its initializers and its nodes'
    outputs, nested subgraphs included."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        names.update(o for o in node.output if o)
        for a in node.attribute:
            for sub in _subgraphs(a):
                names |= defined_names(sub)
    return names


def free_names(graph: Any) -> set[str]:
    """The names a (sub)graph reads from the enclosing scope."""
    used: set[str] = set()
    for node in graph.node:
        used.update(i for i in node.input if i)
        for a in node.attribute:
            for sub in _subgraphs(a):
                used |= free_names(sub)
    used.update(o.name for o in graph.output)
    return used - defined_names(graph)


def renamed_nodes(graph: Any, rename: Callable[[str], str]) -> list[Any]:
    """Copies of a graph's nodes with every value name passed through `rename`, inside
    nested subgraphs too."""
    out = []
    for node in graph.node:
        copy = type(node)()
        copy.CopyFrom(node)
        rename_in_node(copy, rename)
        out.append(copy)
    return out


def rename_in_node(node: Any, rename: Callable[[str], str]) -> None:
    """Rename, in place, the values a node reads and writes and those of its subgraphs."""
    for field in (node.input, node.output):
        for i, name in enumerate(field):
            if name:
                field[i] = rename(name)
    for a in node.attribute:
        for sub in _subgraphs(a):
            _rename_in_graph(sub, rename)


def _rename_in_graph(graph: Any, rename: Callable[[str], str]) -> None:
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        vi.name = rename(vi.name)
    for t in graph.initializer:
        t.name = rename(t.name)
    for node in graph.node:
        rename_in_node(node, rename)


def _subgraphs(attribute: Any) -> list[Any]:
    from onnx import AttributeProto

    if attribute.type == AttributeProto.GRAPH:
        return [attribute.g]
    if attribute.type == AttributeProto.GRAPHS:
        return list(attribute.graphs)
    return []


class _Body:
    """One subgraph imported inline: its inputs bound to values of the enclosing graph."""

    def __init__(self, imp: _OnnxImporter, graph: Any, owner: Any):
        self.imp, self.graph, self.owner = imp, graph, owner
        self.local = defined_names(graph)
        self.runs = 0

    def run(self, bound: list[str]) -> list[str]:
        """Import the body once with its inputs bound to the values named `bound` (known or
        in the graph); the names of its outputs."""
        imp = self.imp
        imp._expansions += 1
        self.runs += 1
        prefix = f"{self.owner.name or self.owner.op_type}#{imp._expansions}/"

        def rename(name: str) -> str:
            return prefix + name if name in self.local else name

        for formal, actual in zip(self.graph.input, bound):
            alias(imp, rename(formal.name), actual)
        for t in self.graph.initializer:
            from onnx import numpy_helper

            imp.known[rename(t.name)] = numpy_helper.to_array(t)
        for node in renamed_nodes(self.graph, rename):
            imp._import_node(node)
        return [rename(o.name) for o in self.graph.output]


def alias(imp: _OnnxImporter, name: str, actual: str) -> None:
    """`name` means the same value as `actual` (known or a graph value)."""
    if actual in imp.known:
        imp.known[name] = imp.known[actual]
    elif actual in imp.values:
        imp.values[name] = imp.values[actual]
        imp.producers[name] = [actual]
    else:
        raise KeyError(actual)


def known_value(imp: _OnnxImporter, array: np.ndarray, hint: str) -> str:
    """A fresh name for a value known at import."""
    imp._expansions += 1
    name = f"{hint}#{imp._expansions}"
    imp.known[name] = np.asarray(array)
    return name


@_handles("If", attrs=("then_branch", "else_branch"))
def _if(imp: _OnnxImporter, node: Any) -> None:
    """The branch that the condition (known at import) selects, imported inline."""
    cond = np.asarray(imp.const(node.input[0], "condition", node))
    if cond.size != 1:
        imp._unsupported(node, f"condition of {cond.size} elements of")
    branch = _attr_graph(node, "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch")
    if branch is None:
        imp._unsupported(node, "missing branch of")
    outs = _Body(imp, branch, node).run([])
    if len(outs) != len([o for o in node.output]):
        imp._unsupported(node, f"branch of {len(outs)} outputs for {len(node.output)} of")
    for name, actual in zip(node.output, outs):
        if name:
            alias(imp, name, actual)


@_handles("Loop", attrs=("body",))
def _loop(imp: _OnnxImporter, node: Any) -> None:
    """Unrolled: the trip count and every iteration's condition must be known at import;
    loop-carried values flow from one iteration's body to the next, scan outputs are stacked."""
    body = _attr_graph(node, "body")
    trip_name = node.input[0] if node.input else ""
    cond_name = node.input[1] if len(node.input) > 1 else ""
    carried = list(node.input[2:])
    n_carried = len(carried)
    n_scan = len(body.output) - 1 - n_carried
    if n_scan < 0 or len(body.input) != 2 + n_carried:
        imp._unsupported(node, "body of mismatched inputs and outputs of")
    trips = int(np.asarray(imp.const(trip_name, "trip count", node)).reshape(-1)[0]) if trip_name else None
    go = bool(np.asarray(imp.const(cond_name, "condition", node)).reshape(-1)[0]) if cond_name else True
    if trips is None and not cond_name:
        imp._unsupported(node, "infinite loop (no trip count, no condition) of")
    limit = MAX_UNROLLED_ITERATIONS if trips is None else trips
    if limit > MAX_UNROLLED_ITERATIONS:
        imp._unsupported(node, f"trip count {trips} (more than {MAX_UNROLLED_ITERATIONS} to unroll) of")
    inline = _Body(imp, body, node)
    state, scans, i = carried, [[] for _ in range(n_scan)], 0
    while go and i < limit:
        iteration = known_value(imp, np.array(i, dtype=np.int64), "iteration")
        cond_in = known_value(imp, np.array(True), "condition")
        outs = inline.run([iteration, cond_in, *state])
        state = outs[1:1 + n_carried]
        for k, name in enumerate(outs[1 + n_carried:]):
            scans[k].append(name)
        go = bool(np.asarray(imp.const(outs[0], "condition (computed by the body)", node)).reshape(-1)[0])
        i += 1
    if go and trips is None:
        imp._unsupported(node, f"loop running past {MAX_UNROLLED_ITERATIONS} iterations of")
    outputs = list(node.output)
    for name, actual in zip(outputs[:n_carried], state):
        if name:
            alias(imp, name, actual)
    for name, parts in zip(outputs[n_carried:], scans):
        if name:
            if not parts:
                imp._unsupported(node, "scan output of a loop that runs no iteration of")
            alias(imp, name, stack(imp, node, parts, 0, reverse=False))


@_handles("Scan", attrs=("body", "num_scan_inputs", "scan_input_axes", "scan_input_directions",
                         "scan_output_axes", "scan_output_directions"))
def _scan(imp: _OnnxImporter, node: Any) -> None:
    """Unrolled over the scan axis (static): each iteration's body reads one slice of every
    scan input; states carry over; scan outputs are stacked along their axes."""
    if imp.opset < 9:
        imp._unsupported(node, "opset-8 form (sequence_lens and a batch axis) of")
    body = _attr_graph(node, "body")
    n_in = int(_attr(node, "num_scan_inputs", 0))
    inputs = list(node.input)
    n_state = len(inputs) - n_in
    n_out_scan = len(body.output) - n_state
    if n_in < 1 or n_state < 0 or n_out_scan < 0 or len(body.input) != len(inputs):
        imp._unsupported(node, "body of mismatched inputs and outputs of")
    in_axes = list(_attr(node, "scan_input_axes", [0] * n_in))
    in_dirs = list(_attr(node, "scan_input_directions", [0] * n_in))
    out_axes = list(_attr(node, "scan_output_axes", [0] * n_out_scan))
    out_dirs = list(_attr(node, "scan_output_directions", [0] * n_out_scan))
    if not (len(in_axes) == len(in_dirs) == n_in and len(out_axes) == len(out_dirs) == n_out_scan):
        imp._unsupported(node, "axes or directions not one per scan value of")
    scanned = inputs[n_state:]
    shapes = [imp.shape(s) for s in scanned]
    in_axes = [int(a) % len(s) for a, s in zip(in_axes, shapes)]
    lengths = {s[a] for a, s in zip(in_axes, shapes)}
    if len(lengths) != 1:
        imp._unsupported(node, f"scan inputs of different lengths {sorted(lengths)} of")
    steps = lengths.pop()
    if steps == 0:
        imp._unsupported(node, "scan of length 0 of")
    if steps > MAX_UNROLLED_ITERATIONS:
        imp._unsupported(node, f"scan of {steps} steps (more than {MAX_UNROLLED_ITERATIONS} to unroll) of")
    inline = _Body(imp, body, node)
    state, scans = inputs[:n_state], [[] for _ in range(n_out_scan)]
    for t in range(steps):
        slices = [take_slice(imp, node, s, a, steps - 1 - t if d else t)
                  for s, a, d in zip(scanned, in_axes, in_dirs)]
        outs = inline.run([*state, *slices])
        state = outs[:n_state]
        for k, name in enumerate(outs[n_state:]):
            scans[k].append(name)
    for name, actual in zip(node.output[:n_state], state):
        if name:
            alias(imp, name, actual)
    for name, parts, axis, direction in zip(node.output[n_state:], scans, out_axes, out_dirs):
        if name:
            rank = len(imp.shape(parts[0])) + 1
            if not -rank <= int(axis) < rank:
                imp._unsupported(node, f"scan output axis {axis} for rank {rank} of")
            alias(imp, name, stack(imp, node, parts, int(axis) % rank, reverse=bool(direction)))


def take_slice(imp: _OnnxImporter, node: Any, name: str, axis: int, index: int) -> str:
    """x[..., index, ...] along `axis`, the axis dropped (folded when x is known)."""
    shape = imp.shape(name)
    if name in imp.known and name not in imp.values:
        return known_value(imp, np.take(imp.known[name], index, axis=axis), "slice")
    part = imp.graph.add_node("slice", [imp.value(name)], {"axis": axis, "start": index, "end": index + 1, "step": 1},
                              source=f"ONNX {node.op_type} {node.name!r}")
    return graph_value(imp, imp.graph.add_node("reshape", [part], {"shape": shape[:axis] + shape[axis + 1:]}), name)


def stack(imp: _OnnxImporter, node: Any, parts: list[str], axis: int, reverse: bool) -> str:
    """The values named `parts` stacked along a new `axis` (in reverse order if asked);
    folded when all are known."""
    if reverse:
        parts = parts[::-1]
    if all(p in imp.known and p not in imp.values for p in parts):
        return known_value(imp, np.stack([imp.known[p] for p in parts], axis=axis), "stacked")
    shape = imp.shape(parts[0])
    grown = shape[:axis] + (1,) + shape[axis:]
    pieces = [imp.graph.add_node("reshape", [imp.value(p)], {"shape": grown}) for p in parts]
    joined = pieces[0] if len(pieces) == 1 else imp.graph.add_node(
        "concat", pieces, {"axis": axis}, source=f"ONNX {node.op_type} {node.name!r}")
    return graph_value(imp, joined, *parts)


def graph_value(imp: _OnnxImporter, graph_name: str, *sources: str) -> str:
    """A fresh ONNX-level name for a graph value made here (computed from `sources`)."""
    imp._expansions += 1
    name = f"{graph_name}#{imp._expansions}"
    imp.values[name] = graph_name
    imp.producers[name] = list(sources)
    return name


def _attr_graph(node: Any, name: str) -> Any:
    for a in node.attribute:
        if a.name == name:
            return a.g
    return None
