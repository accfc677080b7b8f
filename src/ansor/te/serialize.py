"""Tensors as JSON data and back: the complete declaration of a computation, so that a record
of any computation (not only a named workload) can be replayed in another process.

The data is plain JSON (never pickle): records are files from elsewhere, so reading trusts
nothing. Every tensor is rebuilt through the same functions a user declares with
(`placeholder`, `reduce_axis`, `compute`, the expression helpers and `Tensor.__getitem__`),
so a rebuilt computation passes the checks a declared one passes, and anything malformed is
a ValueError naming the tensor and the node.

A compute's body is stored as a node table in post-order (the body last): each node names its
children by their position in the table, so expressions shared by several parents stay shared, cycles
cannot be written, and reading needs no recursion however deep the expression.
"""

from __future__ import annotations

import inspect
import json
import math
from typing import Any, Sequence

from ansor.te import expr as E
from ansor.te.tensor import ComputeOp, PlaceholderOp, Tensor, compute, placeholder, reduce_axis

#: Version of the tensor data below; data of another version is refused.
COMPUTATION_FORMAT_VERSION = 1

BINARY_OPS = ("+", "-", "*", "/", "//", "%")
MINMAX_OPS = ("max", "min")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=")
LOGICAL_ARITY = {"and": 2, "or": 2, "not": 1}
CALL_ARITY = {f: (2 if f == "pow" else 1) for f in E.MATH_FUNCS}
COMBINERS = ("sum", "max", "min")


# ---------------------------------------------------------------------------------------------
# writing

def tensors_to_data(tensors: Sequence[Tensor]) -> list[dict]:
    """JSON data of tensors given producers first (a ComputeDAG's `tensors`): every tensor a
    compute reads must come earlier in the sequence."""
    position: dict[int, int] = {}
    out = []
    for t in tensors:
        op = t.op
        if isinstance(op, PlaceholderOp):
            out.append({"op": "placeholder", "name": op.name, "shape": list(op.shape), "dtype": op.dtype,
                        "constant": bool(op.constant)})
        elif isinstance(op, ComputeOp):
            out.append(_compute_to_data(op, position))
        else:
            raise TypeError(f"tensor {t.name!r}: cannot store an operation of type {type(op).__name__}")
        position[id(t)] = len(position)
    return out


def _compute_to_data(op: ComputeOp, position: dict[int, int]) -> dict:
    axis_pos = {id(a): p for p, a in enumerate(op.axes)}
    reduce_pos = {id(a): p for p, a in enumerate(op.reduce_axes)}
    node_pos: dict[int, int] = {}
    nodes: list[list] = []

    def ref(node: E.Expr) -> int:
        return node_pos[id(node)]

    def encode(x: E.Expr) -> list:
        if isinstance(x, E.Var):
            if id(x) in axis_pos:
                return ["axis", axis_pos[id(x)]]
            if id(x) in reduce_pos:
                return ["reduce_axis", reduce_pos[id(x)]]
            raise ValueError(f"compute {op.name!r}: variable {x.name!r} is not one of its axes")
        if isinstance(x, E.Const):
            return ["const", x.dtype, _const_to_data(x.value)]
        if isinstance(x, E.BinOp):
            return ["binop", x.op, x.dtype, ref(x.a), ref(x.b)]
        if isinstance(x, E.Compare):
            return ["compare", x.op, ref(x.a), ref(x.b)]
        if isinstance(x, E.Logical):
            return ["logical", x.op, [ref(a) for a in x.args]]
        if isinstance(x, E.Call):
            return ["call", x.func, x.dtype, [ref(a) for a in x.args]]
        if isinstance(x, E.Select):
            return ["select", ref(x.cond), ref(x.a), ref(x.b)]
        if isinstance(x, E.Cast):
            return ["cast", x.dtype, ref(x.value)]
        if isinstance(x, E.TensorRead):
            if id(x.tensor) not in position:
                raise ValueError(f"compute {op.name!r} reads tensor {x.tensor.name!r}, which is not "
                                 f"among the tensors before it")
            return ["read", position[id(x.tensor)], [ref(i) for i in x.indices]]
        if isinstance(x, E.Reduce):
            where = None if x.where is None else ref(x.where)
            return ["reduce", x.combiner, [reduce_pos[id(a)] for a in x.axes], ref(x.source), where]
        raise TypeError(f"compute {op.name!r}: cannot store an expression node of type {type(x).__name__}")

    # post-order without recursion: a node is written once all its children are
    stack: list[tuple[E.Expr, bool]] = [(op.body, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in node_pos:
            continue
        if not expanded:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(node.children()))
            continue
        node_pos[id(node)] = len(nodes)
        nodes.append(encode(node))
    attrs = dict(op.attrs)
    try:
        json.dumps(attrs, allow_nan=False)
    except (TypeError, ValueError):
        raise ValueError(f"compute {op.name!r}: its attrs are not JSON data, so it cannot be stored") from None
    return {
        "op": "compute",
        "name": op.name,
        "dtype": op.dtype,
        "axes": [[a.name, a.extent] for a in op.axes],
        "reduce_axes": [[a.name, a.lo, a.extent] for a in op.reduce_axes],
        "nodes": nodes,  # the last node is the body
        "tag": op.tag,
        "attrs": attrs,
    }


def _const_to_data(value):
    """JSON has no infinities or NaN: those floats are written as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "inf", "-inf", "nan"
    return value


# ---------------------------------------------------------------------------------------------
# reading

def tensors_from_data(data: Any) -> list[Tensor]:
    """Rebuild the tensors of `tensors_to_data`, validating everything; raises ValueError."""
    if not isinstance(data, list) or not data:
        raise ValueError("computation data: 'tensors' must be a non-empty list")
    tensors: list[Tensor] = []
    for i, entry in enumerate(data):
        what = f"computation data: tensor {i}"
        if not isinstance(entry, dict):
            raise ValueError(f"{what}: expected an object, got {type(entry).__name__}")
        name = entry.get("name")
        if not isinstance(name, str):
            raise ValueError(f"{what}: 'name' must be a string")
        what = f"{what} ({name!r})"
        kind = entry.get("op")
        try:
            if kind == "placeholder":
                tensors.append(_placeholder_from_data(entry, name))
            elif kind == "compute":
                tensors.append(_compute_from_data(entry, name, tensors))
            else:
                raise ValueError(f"unknown operation {kind!r} (expected 'placeholder' or 'compute')")
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            message = exc.args[0] if exc.args else type(exc).__name__
            raise ValueError(f"{what}: {message}") from None
        except RecursionError:  # the declaration checks walk the body recursively
            raise ValueError(f"{what}: the expression is nested too deeply to declare") from None
    return tensors


def _placeholder_from_data(entry: dict, name: str) -> Tensor:
    _expect_keys(entry, {"op", "name", "shape", "dtype", "constant"})
    shape = _int_list(entry["shape"], "shape")
    constant = entry["constant"]
    if not isinstance(constant, bool):
        raise ValueError("'constant' must be true or false")
    return placeholder(tuple(shape), _dtype(entry["dtype"]), name=name, constant=constant)


def _compute_from_data(entry: dict, name: str, earlier: list[Tensor]) -> Tensor:
    _expect_keys(entry, {"op", "name", "dtype", "axes", "reduce_axes", "nodes", "tag", "attrs"})
    axes_data = _list(entry["axes"], "axes")
    axis_names = []
    for a in axes_data:
        if not (isinstance(a, list) and len(a) == 2 and isinstance(a[0], str)):
            raise ValueError(f"an axis must be [name, extent], got {a!r}")
        axis_names.append(a[0])
    shape = _int_list([a[1] for a in axes_data], "axis extents")
    reduce_axes = []
    for a in _list(entry["reduce_axes"], "reduce_axes"):
        if not (isinstance(a, list) and len(a) == 3 and isinstance(a[0], str)):
            raise ValueError(f"a reduce axis must be [name, lo, extent], got {a!r}")
        lo, extent = _int(a[1], "reduce axis lo"), _int(a[2], "reduce axis extent")
        if extent <= 0:
            raise ValueError(f"reduce axis {a[0]!r}: extent must be positive, got {extent}")
        reduce_axes.append(reduce_axis((lo, lo + extent), name=a[0]))
    nodes = _list(entry["nodes"], "nodes")
    if not nodes:
        raise ValueError("'nodes' is empty: a compute needs a body")
    tag = entry["tag"]
    if not isinstance(tag, str):
        raise ValueError("'tag' must be a string")
    attrs = entry["attrs"]
    if not isinstance(attrs, dict):
        raise ValueError("'attrs' must be an object")
    dtype = _dtype(entry["dtype"])

    def fcompute(*axes: E.IterVar) -> E.Expr:
        return _body_from_nodes(nodes, axes, reduce_axes, earlier)

    try:  # te.compute names its axes after the function's parameters
        fcompute.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in axis_names])
    except ValueError as exc:
        raise ValueError(f"bad axis names {axis_names}: {exc}") from None
    out = compute(tuple(shape), fcompute, name=name, tag=tag, attrs=attrs)
    if out.dtype != dtype:
        raise ValueError(f"'dtype' is {dtype} but the body has dtype {out.dtype}")
    if len(out.op.reduce_axes) != len(reduce_axes):
        raise ValueError("a declared reduce axis is not used by the body's reduction")
    return out


def _body_from_nodes(nodes: list, axes: Sequence[E.IterVar], reduce_axes: list[E.IterVar],
                     earlier: list[Tensor]) -> E.Expr:
    built: list[E.Expr] = []

    def child(k: Any) -> E.Expr:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(built):
            raise ValueError(f"node {len(built)}: child reference {k!r} must name an earlier node "
                             f"(0..{len(built) - 1})")
        return built[k]

    def arity(node: list, n: int) -> None:
        if len(node) != n:
            raise ValueError(f"node {len(built)} ({node[0]}) has {len(node) - 1} fields, expected {n - 1}")

    for node in nodes:
        if not isinstance(node, list) or not node or not isinstance(node[0], str):
            raise ValueError(f"node {len(built)}: expected [kind, ...], got {node!r}")
        kind = node[0]
        if kind == "axis":
            arity(node, 2)
            built.append(axes[_index(node[1], len(axes), "axis")])
        elif kind == "reduce_axis":
            arity(node, 2)
            built.append(reduce_axes[_index(node[1], len(reduce_axes), "reduce axis")])
        elif kind == "const":
            arity(node, 3)
            built.append(E.const(_const_from_data(node[2], _dtype(node[1])), node[1]))
        elif kind == "binop":
            arity(node, 5)
            op, dtype, a, b = node[1], _dtype(node[2]), child(node[3]), child(node[4])
            _same_dtype(op, a, b)
            if op in BINARY_OPS:
                e = E.binary(op, a, b)
            elif op in MINMAX_OPS:
                e = E.maximum(a, b) if op == "max" else E.minimum(a, b)
            else:
                raise ValueError(f"unknown arithmetic operator {op!r}")
            if e.dtype != dtype:
                raise ValueError(f"operator {op!r}: stored dtype {dtype}, operands give {e.dtype}")
            built.append(e)
        elif kind == "compare":
            arity(node, 4)
            op, a, b = node[1], child(node[2]), child(node[3])
            if op not in COMPARE_OPS:
                raise ValueError(f"unknown comparison {op!r}")
            _same_dtype(op, a, b)
            built.append(E.compare(op, a, b))
        elif kind == "logical":
            arity(node, 3)
            op, args = node[1], [child(k) for k in _list(node[2], "logical arguments")]
            if op not in LOGICAL_ARITY:
                raise ValueError(f"unknown logical operator {op!r}")
            if len(args) != LOGICAL_ARITY[op]:
                raise ValueError(f"'{op}' takes {LOGICAL_ARITY[op]} arguments, got {len(args)}")
            built.append(E.Logical(op, tuple(E.as_bool(a) for a in args)))
        elif kind == "call":
            arity(node, 4)
            func, dtype, args = node[1], _dtype(node[2]), [child(k) for k in _list(node[3], "call arguments")]
            if func not in CALL_ARITY:
                raise ValueError(f"unknown function {func!r}; known: {', '.join(E.MATH_FUNCS)}")
            if len(args) != CALL_ARITY[func]:
                raise ValueError(f"{func} takes {CALL_ARITY[func]} arguments, got {len(args)}")
            e = getattr(E, func)(*args)
            if e.dtype != dtype:
                raise ValueError(f"{func}: stored dtype {dtype}, arguments give {e.dtype}")
            built.append(e)
        elif kind == "select":
            arity(node, 4)
            cond, a, b = child(node[1]), child(node[2]), child(node[3])
            _same_dtype("if_then_else", a, b)
            built.append(E.if_then_else(cond, a, b))
        elif kind == "cast":
            arity(node, 3)
            built.append(E.Cast(_dtype(node[1]), child(node[2])))
        elif kind == "read":
            arity(node, 3)
            tensor = earlier[_index(node[1], len(earlier), "tensor")]
            indices = [child(k) for k in _list(node[2], "read indices")]
            built.append(tensor[tuple(indices)])
        elif kind == "reduce":
            arity(node, 5)
            combiner = node[1]
            if combiner not in COMBINERS:
                raise ValueError(f"unknown reduction {combiner!r}; known: {', '.join(COMBINERS)}")
            positions = [_index(k, len(reduce_axes), "reduce axis") for k in _list(node[2], "reduce axes")]
            if len(set(positions)) != len(positions):
                raise ValueError(f"a reduction lists a reduce axis twice: {positions}")
            where = None if node[4] is None else child(node[4])
            built.append(getattr(E, combiner)(child(node[3]), axis=[reduce_axes[p] for p in positions],
                                              where=where))
        else:
            raise ValueError(f"node {len(built)}: unknown expression kind {kind!r}")
    return built[-1]


def _const_from_data(value: Any, dtype: str):
    if E.is_float(dtype):
        if isinstance(value, str) and value in ("inf", "-inf", "nan"):
            return float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif E.is_int(dtype):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, bool):
        return value
    raise ValueError(f"constant {value!r} is not a value of dtype {dtype}")


def _same_dtype(op: str, a: E.Expr, b: E.Expr) -> None:
    """The declaring helpers would insert a cast here; stored data already has its casts."""
    if a.dtype != b.dtype:
        raise ValueError(f"operator {op!r} has operands of dtypes {a.dtype} and {b.dtype}")


def _expect_keys(entry: dict, keys: set[str]) -> None:
    missing = sorted(keys - set(entry))
    unknown = sorted(set(entry) - keys)
    if missing:
        raise ValueError(f"missing field(s) {', '.join(missing)}")
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}")


def _dtype(value: Any) -> str:
    if not isinstance(value, str) or value not in E.DTYPES:
        raise ValueError(f"bad dtype {value!r}; ansor supports {', '.join(E.DTYPES)}")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return value


def _index(value: Any, n: int, what: str) -> int:
    k = _int(value, f"{what} reference")
    if not 0 <= k < n:
        raise ValueError(f"{what} reference {k} is out of range (there are {n})")
    return k


def _list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list, got {type(value).__name__}")
    return value


def _int_list(value: Any, what: str) -> list[int]:
    items = _list(value, what)
    for n in items:
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"{what} must be positive integers, got {items!r}")
    return items
