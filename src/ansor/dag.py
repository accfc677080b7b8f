"""ComputeDAG: the stages of a computation in topological order, with the analysis the search
rules need (elementwise? reduction? data reuse? consumers), FLOPs and a canonical workload key."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Sequence

from ansor.te import expr as E
from ansor.te.serialize import COMPUTATION_FORMAT_VERSION, tensors_from_data, tensors_to_data
from ansor.te.tensor import ComputeOp, PlaceholderOp, Tensor

WORKLOAD_KEY_VERSION = 1

#: The "format" field of `ComputeDAG.to_data`.
COMPUTATION_FORMAT = "ansor.computation"


@dataclass
class StageInfo:
    """What the derivation rules ask about one stage."""

    name: str
    is_placeholder: bool
    is_output: bool = False
    has_reduce: bool = False
    strictly_inlineable: bool = False
    needs_multi_level_tiling: bool = False
    producers: list[int] = field(default_factory=list)
    consumers: list[int] = field(default_factory=list)
    flop: float = 0.0


def collect_tensors(outputs: Sequence[Tensor]) -> list[Tensor]:
    """Every tensor the outputs depend on, producers before consumers, in a deterministic order."""
    order: list[Tensor] = []
    seen: set[int] = set()

    def visit(t: Tensor) -> None:
        if id(t) in seen:
            return
        seen.add(id(t))
        for producer in t.op.input_tensors():
            visit(producer)
        order.append(t)

    for out in outputs:
        visit(out)
    return order


def reads_of(op) -> list[E.TensorRead]:
    return [n for n in E.walk(op.body) if isinstance(n, E.TensorRead)] if isinstance(op, ComputeOp) else []


def count_flops(op) -> float:
    """Float operations per output element times the element count (index arithmetic excluded)."""
    if not isinstance(op, ComputeOp):
        return 0.0
    per_point = _expr_flops(op.body)
    points = 1
    for ax in op.axes:
        points *= ax.extent
    return float(per_point * points)


def _expr_flops(expr: E.Expr) -> float:
    if isinstance(expr, E.Reduce):
        inner = _expr_flops(expr.source) + 1  # the combine
        n = 1
        for ax in expr.axes:
            n *= ax.extent
        return inner * n
    if isinstance(expr, E.TensorRead):
        return 0.0
    own = 0.0
    if isinstance(expr, (E.BinOp, E.Call)) and _is_data_op(expr, expr.dtype):
        own = 1.0
    elif isinstance(expr, E.Compare) and _is_data_op(expr, expr.a.dtype):
        own = 1.0
    if isinstance(expr, E.Select):
        return _expr_flops(expr.cond) + max(_expr_flops(expr.a), _expr_flops(expr.b))
    return own + sum(_expr_flops(c) for c in expr.children())


def _is_data_op(expr: E.Expr, dtype: str) -> bool:
    """Whether an operation computes on data rather than on indices: any float or narrow
    integer operation, and an int32/int64 one on values read from tensors (the products
    of an int8 matmul widened to int32) rather than on axes alone."""
    if not E.is_index(dtype):
        return True
    return any(isinstance(n, E.TensorRead) for n in E.walk(expr))


def _is_simple_access(read: E.TensorRead, axes: Sequence[E.IterVar]) -> tuple[bool, list[int]]:
    """Each index is a (shifted) axis of the reader, or a constant; returns the axis positions."""
    positions = []
    axis_pos = {id(a): p for p, a in enumerate(axes)}
    for idx in read.indices:
        if isinstance(idx, E.Const):
            continue
        base = idx
        if isinstance(idx, E.BinOp) and idx.op in ("+", "-") and isinstance(idx.b, E.Const):
            base = idx.a
        if not isinstance(base, E.Var) or id(base) not in axis_pos:
            return False, []
        positions.append(axis_pos[id(base)])
    return True, positions


def analyze_ops(tensors: Sequence[Tensor], ops: Sequence, outputs: Sequence[int]) -> list[StageInfo]:
    """Stage analysis over ops (which may be rewritten versions of the tensors' ops)."""
    index_of = {id(t): i for i, t in enumerate(tensors)}
    infos = [StageInfo(name=op.name, is_placeholder=isinstance(op, PlaceholderOp)) for op in ops]
    for i, op in enumerate(ops):
        if not isinstance(op, ComputeOp):
            continue
        info = infos[i]
        info.has_reduce = bool(op.reduce_axes)
        info.flop = count_flops(op)
        reads = reads_of(op)
        for r in reads:
            p = index_of[id(r.tensor)]
            if p not in info.producers:
                info.producers.append(p)
                infos[p].consumers.append(i)
        info.strictly_inlineable = not info.has_reduce and _strictly_inlineable(op, reads)
        info.needs_multi_level_tiling = _needs_multi_level_tiling(op, reads, index_of)
    out_set = set(outputs)
    for i, info in enumerate(infos):
        info.is_output = i in out_set or (not info.consumers and not info.is_placeholder)
    return infos


def _strictly_inlineable(op: ComputeOp, reads: list[E.TensorRead]) -> bool:
    for node in E.walk(op.body):
        if isinstance(node, E.Select) or (isinstance(node, E.Call) and node.func == "exp"):
            return False
    for r in reads:
        simple, positions = _is_simple_access(r, op.axes)
        if not simple or len(set(positions)) != len(positions) or positions != sorted(positions):
            return False
    return True


def _needs_multi_level_tiling(op: ComputeOp, reads: list[E.TensorRead], index_of) -> bool:
    """Data reuse: producers whose reads miss a non-unit spatial axis are read many times."""
    used_by_producer: dict[int, set[int]] = {}
    for r in reads:
        vars_ = used_by_producer.setdefault(index_of[id(r.tensor)], set())
        for idx in r.indices:
            vars_.update(id(v) for v in E.free_vars(idx))
    missing = 0
    for vars_ in used_by_producer.values():
        if any(ax.extent > 1 and id(ax) not in vars_ for ax in op.axes):
            missing += 1
    return missing >= 2 or (missing >= 1 and bool(op.reduce_axes))


class ComputeDAG:
    """The computation of a task: its tensors (stages) and their analysis."""

    def __init__(self, io_tensors: Sequence[Tensor]):
        io_tensors = list(io_tensors)
        if not io_tensors:
            raise ValueError("a ComputeDAG needs at least one output tensor")
        for t in io_tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"expected te tensors, got {type(t).__name__}")
        self.inputs = [t for t in io_tensors if isinstance(t.op, PlaceholderOp)]
        self.outputs = [t for t in io_tensors if isinstance(t.op, ComputeOp)]
        if not self.outputs:
            raise ValueError("a ComputeDAG needs at least one computed output tensor")
        if io_tensors != self.inputs + self.outputs:
            raise ValueError("list the input placeholders first, then the outputs")
        self.tensors = collect_tensors(self.outputs)
        ids = {id(t) for t in self.tensors}
        for t in self.inputs:
            if id(t) not in ids:
                raise ValueError(f"input {t.name!r} is not used by any output")
        needed = [t for t in self.tensors if isinstance(t.op, PlaceholderOp)]
        missing = [t.name for t in needed if all(t is not i for i in self.inputs)]
        if missing:
            raise ValueError(f"the outputs read placeholders that are not listed as inputs: {missing}")
        self.names = _unique_names([t.name for t in self.tensors])
        self.ops = [t.op for t in self.tensors]
        out_ids = [self.tensors.index(t) for t in self.outputs]
        self.infos = analyze_ops(self.tensors, self.ops, out_ids)
        self.flop = sum(i.flop for i in self.infos)
        self.workload_key = workload_key(self)

    @property
    def io_tensors(self) -> list[Tensor]:
        return self.inputs + self.outputs

    def stage_index(self, tensor: Tensor) -> int:
        for i, t in enumerate(self.tensors):
            if t is tensor:
                return i
        raise KeyError(tensor.name)

    def describe(self) -> dict:
        """A small JSON-able description for databases and reports."""
        return {
            "inputs": [[t.name, list(t.shape), t.dtype] for t in self.inputs],
            "outputs": [[t.name, list(t.shape), t.dtype] for t in self.outputs],
            "stages": [self.names[i] for i in range(len(self.tensors))],
            "flop": self.flop,
        }

    def to_data(self) -> dict:
        """The whole computation as JSON data, names included: `from_data` rebuilds it in any
        process, so records of a computation declared in a script replay without the script."""
        position = {id(t): i for i, t in enumerate(self.tensors)}
        return {
            "format": COMPUTATION_FORMAT,
            "version": COMPUTATION_FORMAT_VERSION,
            "tensors": tensors_to_data(self.tensors),
            "inputs": [position[id(t)] for t in self.inputs],
            "outputs": [position[id(t)] for t in self.outputs],
            "workload_key": self.workload_key,
        }

    @classmethod
    def from_data(cls, data: dict) -> "ComputeDAG":
        """Rebuild a DAG from `to_data`; data from a file is trusted in nothing, so anything
        malformed, or a rebuilt computation whose workload key differs from the stored one, is a
        ValueError."""
        if not isinstance(data, dict):
            raise ValueError(f"computation data must be an object, got {type(data).__name__}")
        if data.get("format") != COMPUTATION_FORMAT:
            raise ValueError(f"not computation data (format {data.get('format')!r}, "
                             f"expected {COMPUTATION_FORMAT!r})")
        if data.get("version") != COMPUTATION_FORMAT_VERSION:
            raise ValueError(f"computation data of version {data.get('version')!r}; this ansor reads "
                             f"version {COMPUTATION_FORMAT_VERSION}")
        unknown = sorted(set(data) - {"format", "version", "tensors", "inputs", "outputs", "workload_key"})
        if unknown:
            raise ValueError(f"computation data: unknown field(s) {', '.join(unknown)}")
        tensors = tensors_from_data(data.get("tensors"))
        io = []
        for role in ("inputs", "outputs"):
            refs = data.get(role)
            if not isinstance(refs, list):
                raise ValueError(f"computation data: {role!r} must be a list of tensor positions")
            for k in refs:
                if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(tensors):
                    raise ValueError(f"computation data: {role!r} refers to tensor {k!r}, but there are "
                                     f"{len(tensors)} tensors")
                io.append(tensors[k])
        if len({id(t) for t in io}) != len(io):
            raise ValueError("computation data: a tensor is listed twice among the inputs and outputs")
        try:
            dag = cls(io)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"computation data: {exc}") from None
        except RecursionError:  # the workload key walks the bodies recursively
            raise ValueError("computation data: an expression is nested too deeply") from None
        if len(dag.tensors) != len(tensors) or any(a is not b for a, b in zip(dag.tensors, tensors)):
            raise ValueError("computation data: the tensors are not in the order the outputs reach them "
                             "(or some are not used by any output)")
        stored = data.get("workload_key")
        if stored is not None and stored != dag.workload_key:
            raise ValueError(f"computation data: the rebuilt computation has workload key {dag.workload_key}, "
                             f"not the stored {stored}")
        return dag

    def __repr__(self) -> str:
        from ansor.te.printer import expr_to_str

        lines = []
        for t, name in zip(self.tensors, self.names):
            if isinstance(t.op, PlaceholderOp):
                lines.append(f"{name} = placeholder({list(t.shape)}, {t.dtype}"
                             + (", constant)" if t.op.constant else ")"))
            else:
                axes = ", ".join(a.name for a in t.op.axes)
                lines.append(f"{name}[{axes}] = {expr_to_str(t.op.body)}")
        return "\n".join(lines)


def _unique_names(names: list[str]) -> list[str]:
    out, used = [], set()
    for n in names:
        cand, k = n, 1
        while cand in used:
            cand = f"{n}_{k}"
            k += 1
        used.add(cand)
        out.append(cand)
    return out


# ---------------------------------------------------------------------------------------------
# the workload key: a hash of a canonical structural form (names and printing do not matter)

def canonical_form(dag: ComputeDAG) -> list:
    """The computation with tensors numbered by topological position and axes by position."""
    tensor_pos = {id(t): i for i, t in enumerate(dag.tensors)}
    stages = []
    for t in dag.tensors:
        op = t.op
        if isinstance(op, PlaceholderOp):
            # constant inputs change what is timed (their packing is not), so they change the key
            stages.append(["placeholder", list(op.shape), op.dtype] + (["constant"] if op.constant else []))
            continue
        var_names = {id(a): f"s{p}" for p, a in enumerate(op.axes)}
        var_names.update({id(a): f"r{p}" for p, a in enumerate(op.reduce_axes)})
        reduce_doms = [[a.lo, a.extent] for a in op.reduce_axes]
        stages.append(["compute", list(op.shape), op.dtype, reduce_doms,
                       _canonical_expr(op.body, var_names, tensor_pos)])
        if op.attrs.get("template"):  # written by its template, so never another stage's records
            stages[-1].append(["template", {k: repr(v) for k, v in sorted(op.attrs.items())}])
    signature = [[tensor_pos[id(t)] for t in dag.inputs], [tensor_pos[id(t)] for t in dag.outputs]]
    return [WORKLOAD_KEY_VERSION, stages, signature]


def _canonical_expr(e: E.Expr, var_names: dict, tensor_pos: dict):
    def go(x: E.Expr):
        if isinstance(x, E.Const):
            return ["const", x.dtype, repr(x.value)]
        if isinstance(x, E.Var):
            return ["var", var_names[id(x)]]
        if isinstance(x, E.BinOp):
            return [x.op, x.dtype, go(x.a), go(x.b)]
        if isinstance(x, E.Compare):
            return ["cmp", x.op, go(x.a), go(x.b)]
        if isinstance(x, E.Logical):
            return ["logic", x.op, [go(a) for a in x.args]]
        if isinstance(x, E.Call):
            return ["call", x.func, x.dtype, [go(a) for a in x.args]]
        if isinstance(x, E.Select):
            return ["select", go(x.cond), go(x.a), go(x.b)]
        if isinstance(x, E.Cast):
            return ["cast", x.dtype, go(x.value)]
        if isinstance(x, E.TensorRead):
            return ["read", tensor_pos[id(x.tensor)], [go(i) for i in x.indices]]
        if isinstance(x, E.Reduce):
            return ["reduce", x.combiner, [var_names[id(a)] for a in x.axes], go(x.source),
                    None if x.where is None else go(x.where)]
        raise TypeError(f"cannot form a workload key over {type(x).__name__}")

    return go(e)


def workload_key(dag: ComputeDAG) -> str:
    """Stable across renaming and releases: derived from `canonical_form`, never from printing."""
    text = json.dumps(canonical_form(dag), separators=(",", ":"), sort_keys=True)
    return "wk1-" + hashlib.sha256(text.encode()).hexdigest()[:32]
