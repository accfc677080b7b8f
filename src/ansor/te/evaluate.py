"""A numpy reference evaluator for tensor-expression programs.

Every scheduled kernel is checked against this evaluator, so it follows the declaration only and
never a schedule. Each compute stage is evaluated vectorized: its axes (spatial first, then the
reduce axes) become the dimensions of broadcast index arrays, and the body is evaluated as a tree
of numpy operations over them. The iteration space is cut into blocks so that no temporary holds
more than about `MAX_CHUNK_ELEMENTS` elements, whatever the problem size.

Semantics that matter for a reference:
- `//` and `%` on integers floor, as in Python; a zero divisor that is actually used raises.
- `if_then_else` never reads out of range in the branch it does not take: indices are clipped for
  the read and the select discards those lanes. A read that is out of range in a lane that *is*
  used raises IndexError naming the tensor and dimension.
- Reductions honor `where`, the reduce axis lower bound, and sum/max/min. Sums accumulate in
  float64 (int64 for integers) and are cast to the tensor's dtype at the end.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from ansor.te import expr as E
from ansor.te.dtypes import HALF_DTYPES, cast_array, is_unsigned
from ansor.te.arith import to_linear
from ansor.te.tensor import ComputeOp, Operation, PlaceholderOp, Tensor

MAX_CHUNK_ELEMENTS = 1 << 24

#: numpy's counterparts of the elementary functions (np.round rounds half to even, like rint)
_ELEMENTARY = {"sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
               "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh,
               "acosh": np.arccosh, "atanh": np.arctanh, "floor": np.floor, "ceil": np.ceil,
               "round": np.rint}

__all__ = ["evaluate", "random_inputs", "find_placeholders", "erf", "MAX_CHUNK_ELEMENTS"]


# ---------------------------------------------------------------------------------------------
# public API

def evaluate(outputs: Tensor | Sequence[Tensor], inputs: Mapping[Tensor, np.ndarray], *,
             max_chunk_elements: int = MAX_CHUNK_ELEMENTS) -> list[np.ndarray]:
    """Compute `outputs` from the placeholder values in `inputs`, one numpy array per output.

    `inputs` may also give the value of a compute tensor; that stage is then taken as given
    instead of being computed (useful to check one stage in isolation).
    """
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    for t in outs:
        if not isinstance(t, Tensor):
            raise TypeError(f"evaluate: outputs must be tensors, got {type(t).__name__}")
    if max_chunk_elements < 1:
        raise ValueError("evaluate: max_chunk_elements must be positive")
    given: dict[int, tuple[Tensor, object]] = {}
    for t, value in inputs.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"evaluate: inputs must be keyed by tensors, got {type(t).__name__}")
        given[id(t.op)] = (t, value)

    values: dict[int, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for op in _topo_order(outs, given):
            if id(op) in given:
                values[id(op)] = _check_input(*given[id(op)])
            elif isinstance(op, PlaceholderOp):
                raise ValueError(f"evaluate: no value given for placeholder {op.name!r} "
                                 f"(shape {op.shape}, {op.dtype})")
            elif isinstance(op, ComputeOp):
                values[id(op)] = _eval_compute(op, values, max_chunk_elements)
            else:
                raise TypeError(f"evaluate: cannot evaluate operation {op.name!r} of kind "
                                f"{type(op).__name__}")
    return [values[id(t.op)].copy() for t in outs]


def random_inputs(placeholders: Sequence[Tensor], seed: int = 0, low: float = -1.0,
                  high: float = 1.0, int_range: tuple[int, int] = (-8, 8)) -> list[np.ndarray]:
    """Reproducible random values: floats uniform in [low, high), ints in [int_range), bools
    with probability 1/2."""
    rng = np.random.default_rng(seed)
    out = []
    for t in placeholders:
        if E.is_float(t.dtype):
            out.append(rng.uniform(low, high, t.shape).astype(t.dtype))
        elif E.is_int(t.dtype):
            out.append(rng.integers(int_range[0], int_range[1], t.shape).astype(t.dtype))
        else:
            out.append(rng.random(t.shape) < 0.5)
    return out


def find_placeholders(outputs: Tensor | Sequence[Tensor]) -> list[Tensor]:
    """The placeholders the outputs depend on, in first-use (depth-first) order."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    found: list[Tensor] = []
    seen: set[int] = set()
    stack = list(reversed(outs))
    while stack:
        t = stack.pop()
        if id(t.op) in seen:
            continue
        seen.add(id(t.op))
        if isinstance(t.op, PlaceholderOp):
            found.append(t)
        else:
            stack.extend(reversed(t.op.input_tensors()))
    return found


# ---------------------------------------------------------------------------------------------
# graph traversal and inputs

def _topo_order(outs: list[Tensor], given: dict) -> list[Operation]:
    """Operations in dependency order (iterative, so deep graphs do not hit recursion limits)."""
    order: list[Operation] = []
    state: dict[int, int] = {}  # 1: in progress, 2: done
    for root in outs:
        stack: list[tuple[Operation, bool]] = [(root.op, False)]
        while stack:
            op, expanded = stack.pop()
            if expanded:
                state[id(op)] = 2
                order.append(op)
                continue
            if state.get(id(op)) is not None:
                continue
            state[id(op)] = 1
            stack.append((op, True))
            if id(op) not in given:
                for t in reversed(op.input_tensors()):
                    if state.get(id(t.op)) is None:
                        stack.append((t.op, False))
    return order


def _check_input(t: Tensor, value) -> np.ndarray:
    arr = np.asarray(value)
    if arr.shape != t.shape:
        raise ValueError(f"evaluate: value for {t.name!r} has shape {arr.shape}, "
                         f"expected {t.shape}")
    target = np.dtype(t.dtype)
    if arr.dtype != target:
        if not np.can_cast(arr.dtype, target, "same_kind"):
            raise TypeError(f"evaluate: value for {t.name!r} has dtype {arr.dtype}, which does not "
                            f"convert safely to {t.dtype}")
        arr = arr.astype(target)
    return arr


# ---------------------------------------------------------------------------------------------
# erf: scipy when present, else a piecewise Chebyshev interpolant of math.erf (float64, ~4e-15
# relative). The first piece interpolates erf(x)/x so that tiny arguments keep full precision.

_ERF_PIECES = 6       # unit intervals covering [0, 6); erf(x) rounds to 1 in float64 beyond 6
_ERF_DEGREE = 20
_erf_coeffs: np.ndarray | None = None


def _erf_table() -> np.ndarray:
    global _erf_coeffs
    if _erf_coeffs is None:
        cheb = np.polynomial.chebyshev
        scalar_erf = np.vectorize(math.erf, otypes=[np.float64])

        def piece(k: int) -> Callable[[np.ndarray], np.ndarray]:
            if k == 0:  # Chebyshev nodes never hit t = -1, so x = 0 is never sampled
                return lambda t: scalar_erf((t + 1.0) / 2.0) / ((t + 1.0) / 2.0)
            return lambda t: scalar_erf(k + (t + 1.0) / 2.0)

        _erf_coeffs = np.stack([cheb.chebinterpolate(piece(k), _ERF_DEGREE)
                                for k in range(_ERF_PIECES)])
    return _erf_coeffs


def _erf_chebyshev(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    ax = np.abs(x)
    out = np.ones_like(ax)
    out[np.isnan(ax)] = np.nan
    piece = np.floor(ax)
    table = _erf_table()
    for k in range(_ERF_PIECES):
        sel = piece == k
        if sel.any():
            t = ax[sel]
            value = np.polynomial.chebyshev.chebval(2.0 * (t - k) - 1.0, table[k])
            out[sel] = t * value if k == 0 else value
    return np.copysign(out, x)


def _erf_scipy() -> Callable[[np.ndarray], np.ndarray] | None:
    try:
        from scipy.special import erf as scipy_erf
    except ImportError:
        return None
    return lambda x: scipy_erf(np.asarray(x, dtype=np.float64))


_erf_impl = _erf_scipy() or _erf_chebyshev


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorized error function in float64 (numpy has none)."""
    return _erf_impl(x)


# ---------------------------------------------------------------------------------------------
# compute stages

def _eval_compute(op: ComputeOp, values: dict[int, np.ndarray], budget: int) -> np.ndarray:
    body = op.body
    reduce_axes = list(body.axes) if isinstance(body, E.Reduce) else []
    dims = list(op.axes) + reduce_axes
    n_spatial = len(op.axes)
    extents = [a.extent for a in dims]
    stage = _Stage(op, dims, values)

    factors: list[E.Expr] | None = None
    if isinstance(body, E.Reduce):
        roots = [body.source] + ([body.where] if body.where is not None else [])
        factors = _einsum_factors(body, stage)
        temporaries = ([stage.deps(f) for f in factors] if factors is not None
                       else [frozenset().union(*(stage.deps(r) for r in roots))])
    else:
        temporaries = [stage.deps(body)]
    temporaries.append(frozenset(range(n_spatial)))

    def cost(blocks: list[int]) -> int:
        return max(math.prod(blocks[d] for d in t) for t in temporaries)

    blocks = _plan_blocks(extents, cost, budget)
    out = np.empty(op.shape, dtype=np.dtype(op.dtype))
    spatial_ranges = [_ranges(extents[d], blocks[d]) for d in range(n_spatial)]
    reduce_ranges = [_ranges(extents[d], blocks[d]) for d in range(n_spatial, len(dims))]
    for sp in itertools.product(*spatial_ranges):
        block_shape = tuple(stop - start for start, stop in sp)
        if not isinstance(body, E.Reduce):
            value = stage.block(list(sp)).ev(body, None)
            out[tuple(slice(*r) for r in sp)] = np.broadcast_to(value, block_shape)
            continue
        acc = None
        for rd in itertools.product(*reduce_ranges):
            block = stage.block(list(sp) + list(rd))
            part = (block.reduce_einsum(body, factors) if factors is not None
                    else block.reduce_generic(body))
            acc = part if acc is None else _combine(body.combiner, acc, part)
        out[tuple(slice(*r) for r in sp)] = np.broadcast_to(acc, block_shape)
    return out


def _ranges(extent: int, block: int) -> list[tuple[int, int]]:
    return [(s, min(s + block, extent)) for s in range(0, extent, block)]


def _plan_blocks(extents: list[int], cost: Callable[[list[int]], int], budget: int) -> list[int]:
    """Block sizes per dimension: whole dimensions where they fit, cutting the outermost first
    (spatial before reduce), each cut as coarse as the budget allows."""
    blocks = list(extents)
    for d in range(len(extents)):
        if cost(blocks) <= budget:
            break
        blocks[d] = 1
        if cost(blocks) > budget:
            continue
        lo, hi = 1, extents[d]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            blocks[d] = mid
            if cost(blocks) <= budget:
                lo = mid
            else:
                hi = mid - 1
        blocks[d] = lo
        break
    return blocks


def _combine(combiner: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if combiner == "sum":
        return a + b
    return np.maximum(a, b) if combiner == "max" else np.minimum(a, b)


def _accumulator_dtype(dtype: str) -> np.dtype:
    if E.is_float(dtype):
        return np.dtype(np.float64)
    if E.is_int(dtype):  # modulo 2**64, then wrapped to the dtype: what a wrapping sum gives
        return np.dtype(np.uint64 if is_unsigned(dtype) else np.int64)
    return np.dtype(dtype)


def _einsum_factors(body: E.Reduce, stage: "_Stage") -> list[E.Expr] | None:
    """The factors of a float sum-of-products with no `where`, which numpy contracts with BLAS
    instead of materializing the whole iteration space; None when the body has another form."""
    if body.combiner != "sum" or body.where is not None or not E.is_float(body.dtype):
        return None
    factors: list[E.Expr] = []
    stack = [body.source]
    while stack:
        node = stack.pop()
        if isinstance(node, E.BinOp) and node.op == "*":
            stack.extend((node.b, node.a))
        else:
            factors.append(node)
    if sum(1 for f in factors if stage.deps(f)) < 2:
        return None
    return factors


class _Stage:
    """Per-stage static facts: which dimension each axis is, and what each node depends on."""

    def __init__(self, op: ComputeOp, dims: list[E.IterVar], values: dict[int, np.ndarray]):
        self.op = op
        self.dims = dims
        self.values = values
        self.dim_of = {id(a): d for d, a in enumerate(dims)}
        self._deps: dict[int, frozenset[int]] = {}
        self._read_plans: dict[int, list | None] = {}
        self.shared = _shared_nodes(op.body)

    def deps(self, node: E.Expr) -> frozenset[int]:
        """The dimensions an expression varies over."""
        key = id(node)
        got = self._deps.get(key)
        if got is None:
            if isinstance(node, E.Var):
                got = frozenset((self.dim_of[key],)) if key in self.dim_of else frozenset()
            else:
                got = frozenset().union(*(self.deps(c) for c in node.children()))
            self._deps[key] = got
        return got

    def read_plan(self, node: E.TensorRead) -> list | None:
        """Per index, (dim, stride, offset) or (None, 0, constant) when every index is an affine
        function of its own axis with a positive stride (so the read can be a strided slice)."""
        key = id(node)
        if key not in self._read_plans:
            plan: list | None = []
            used: set[int] = set()
            for idx in node.indices:
                lin = to_linear(idx)
                if not lin.terms:
                    plan.append((None, 0, int(lin.const)))
                    continue
                atom, coef = next(iter(lin.terms.values()))
                d = self.dim_of.get(id(atom)) if len(lin.terms) == 1 else None
                if d is None or coef <= 0 or d in used:
                    plan = None
                    break
                used.add(d)
                plan.append((d, int(coef), int(lin.const)))
            self._read_plans[key] = plan
        return self._read_plans[key]

    def block(self, ranges: list[tuple[int, int]]) -> "_Block":
        return _Block(self, ranges)


_NP_COMPARE = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
               "==": np.equal, "!=": np.not_equal}


class _Block:
    """Evaluates expressions over one block of the iteration space of a stage."""

    def __init__(self, stage: _Stage, ranges: list[tuple[int, int]]):
        self.stage = stage
        self.ranges = ranges
        self.nd = len(ranges)
        self.shape = tuple(stop - start for start, stop in ranges)
        self.memo: dict[tuple[int, int], np.ndarray] = {}
        self.masks: list[np.ndarray] = []  # keeps masks alive so their ids stay unique

    # -- reductions ---------------------------------------------------------------------------
    def reduce_generic(self, body: E.Reduce) -> np.ndarray:
        n_spatial = self.nd - len(body.axes)
        axes = tuple(range(n_spatial, self.nd))
        mask = None
        if body.where is not None:
            mask = np.broadcast_to(self.ev(body.where, None), self.shape)
        src = np.broadcast_to(self.ev(body.source, mask), self.shape)
        if mask is not None:
            identity = E.reduce_identity(body.combiner, body.dtype).value
            src = np.where(mask, src, np.asarray(identity, dtype=src.dtype))
        if body.combiner == "sum":
            return np.sum(src, axis=axes, dtype=_accumulator_dtype(body.dtype))
        return np.max(src, axis=axes) if body.combiner == "max" else np.min(src, axis=axes)

    def reduce_einsum(self, body: E.Reduce, factors: list[E.Expr]) -> np.ndarray:
        n_spatial = self.nd - len(body.axes)
        scale = np.float64(1.0)
        operands, subscripts = [], []
        present: set[int] = set()
        for f in factors:
            arr = self.ev(f, None)
            labels = [d for d in range(self.nd) if arr.shape[d] != 1]
            if not labels:
                scale = scale * np.float64(arr.reshape(()))
                continue
            operands.append(arr.reshape([arr.shape[d] for d in labels]).astype(np.float64))
            subscripts.append("".join(_label(d) for d in labels))
            present.update(labels)
        out_dims = [d for d in range(n_spatial) if d in present]
        if operands:
            spec = ",".join(subscripts) + "->" + "".join(_label(d) for d in out_dims)
            result = np.einsum(spec, *operands, optimize=True)
        else:
            result = np.float64(1.0)
        # reduce dimensions that no factor varies over still count once per point
        repeats = math.prod(self.shape[d] for d in range(n_spatial, self.nd) if d not in present)
        result = result * (scale * repeats)
        spatial_shape = self.shape[:n_spatial]
        keep = [spatial_shape[d] if d in present else 1 for d in range(n_spatial)]
        return np.broadcast_to(np.reshape(result, keep), spatial_shape)

    # -- expressions --------------------------------------------------------------------------
    def ev(self, node: E.Expr, mask: np.ndarray | None) -> np.ndarray:
        """The value of `node` over the block, as an array with one (possibly size-1) dimension
        per iteration dimension. `mask` marks the lanes whose value is actually used. Only
        subexpressions used more than once are kept, so temporaries die as soon as possible."""
        if id(node) not in self.stage.shared:
            return self._ev(node, mask)
        key = (id(node), 0 if mask is None else id(mask))
        got = self.memo.get(key)
        if got is None:
            got = self._ev(node, mask)
            self.memo[key] = got
        return got

    def _ev(self, node: E.Expr, mask: np.ndarray | None) -> np.ndarray:
        if isinstance(node, E.Const):
            return np.full((1,) * self.nd, node.value, dtype=np.dtype(node.dtype))
        if isinstance(node, E.Var):
            d = self.stage.dim_of.get(id(node))
            if d is None:
                raise ValueError(f"evaluate: stage {self.stage.op.name!r} uses variable "
                                 f"{node.name!r}, which is not one of its axes")
            start, stop = self.ranges[d]
            lo = self.stage.dims[d].lo
            shape = [1] * self.nd
            shape[d] = stop - start
            return np.arange(lo + start, lo + stop, dtype=np.dtype(node.dtype)).reshape(shape)
        if isinstance(node, E.TensorRead):
            return self._read(node, mask)
        if isinstance(node, E.BinOp):
            return self._binop(node, mask)
        if isinstance(node, E.Compare):
            return _NP_COMPARE[node.op](self.ev(node.a, mask), self.ev(node.b, mask))
        if isinstance(node, E.Logical):
            args = [self.ev(a, mask) for a in node.args]
            if node.op == "not":
                return np.logical_not(args[0])
            fn = np.logical_and if node.op == "and" else np.logical_or
            out = args[0]
            for a in args[1:]:
                out = fn(out, a)
            return out
        if isinstance(node, E.Select):
            cond = self.ev(node.cond, mask)
            then_mask = cond if mask is None else cond & mask
            else_mask = ~cond if mask is None else ~cond & mask
            self.masks += [then_mask, else_mask]
            a = self.ev(node.a, then_mask)
            b = self.ev(node.b, else_mask)
            return np.where(cond, a, b).astype(np.dtype(node.dtype), copy=False)
        if isinstance(node, E.Cast):  # saturating float to int, as every kernel converts
            return cast_array(self.ev(node.value, mask), node.dtype)
        if isinstance(node, E.Call):
            return self._call(node, mask)
        if isinstance(node, E.Reduce):
            raise ValueError(f"evaluate: stage {self.stage.op.name!r} has a reduction inside its "
                             f"body; a reduction must be the whole body of a compute")
        raise TypeError(f"evaluate: cannot evaluate expression node {type(node).__name__} in "
                        f"stage {self.stage.op.name!r}")

    def _binop(self, node: E.BinOp, mask: np.ndarray | None) -> np.ndarray:
        a, b = self.ev(node.a, mask), self.ev(node.b, mask)
        op, dtype = node.op, np.dtype(node.dtype)
        if op in ("//", "%"):
            zero = b == 0
            if zero.any():
                used = zero if mask is None else zero & mask
                if np.any(used):
                    raise ZeroDivisionError(f"evaluate: stage {self.stage.op.name!r} divides by "
                                            f"zero in {node!r}")
                b = np.where(zero, np.ones_like(b), b)
            if E.is_int(node.dtype) and dtype.itemsize < 8:  # -128 // -1 wraps to -128, as in C
                a, b = a.astype(np.int64), b.astype(np.int64)
            out = np.floor_divide(a, b) if op == "//" else np.mod(a, b)
        elif op == "+":
            out = a + b
        elif op == "-":
            out = a - b
        elif op == "*":
            out = a * b
        elif op == "/":
            out = a / b
        elif op == "min":
            out = np.minimum(a, b)
        elif op == "max":
            out = np.maximum(a, b)
        else:
            raise TypeError(f"evaluate: unknown arithmetic operator {op!r}")
        return out.astype(dtype, copy=False)

    def _call(self, node: E.Call, mask: np.ndarray | None) -> np.ndarray:
        args = [self.ev(a, mask) for a in node.args]
        if node.dtype in HALF_DTYPES:  # computed in float32, rounded once, as the kernels do
            args = [a.astype(np.float32) for a in args]
        x = args[0]
        f = node.func
        dtype = np.dtype(node.dtype)
        if f == "exp":
            out = np.exp(x)
        elif f == "log":
            out = np.log(x)
        elif f == "sqrt":
            out = np.sqrt(x)
        elif f == "rsqrt":
            out = np.reciprocal(np.sqrt(x))
        elif f == "tanh":
            out = np.tanh(x)
        elif f == "erf":
            out = erf(x)
        elif f == "sigmoid":
            out = np.reciprocal(np.exp(-x) + np.ones((), dtype=x.dtype))
        elif f == "abs":
            out = np.abs(x)
        elif f == "pow":
            out = np.power(x, args[1])
        elif f in _ELEMENTARY:
            out = _ELEMENTARY[f](x)
        else:
            raise TypeError(f"evaluate: unknown math function {f!r}")
        return out.astype(dtype, copy=False)

    def _read(self, node: E.TensorRead, mask: np.ndarray | None) -> np.ndarray:
        tensor = node.tensor
        data = self.stage.values[id(tensor.op)]
        plan = self.stage.read_plan(node)
        if plan is not None:
            sliced = self._read_slices(data, tensor, plan)
            if sliced is not None:
                return sliced
        index_arrays = []
        for dim, idx in enumerate(node.indices):
            v = self.ev(idx, mask)
            n = tensor.shape[dim]
            outside = (v < 0) | (v >= n)
            if outside.any():
                used = outside if mask is None else outside & mask
                if np.any(used):
                    values, lanes = np.broadcast_arrays(v, used)
                    bad = int(values[lanes][0])
                    raise IndexError(
                        f"evaluate: stage {self.stage.op.name!r} reads tensor {tensor.name!r} out "
                        f"of bounds in dimension {dim}: index {bad} is outside "
                        f"[0, {n}) (index expression {idx!r})")
                v = np.clip(v, 0, n - 1)
            index_arrays.append(v)
        out = data[tuple(index_arrays)]
        if out.ndim != self.nd:
            out = np.reshape(out, np.broadcast_shapes(*(a.shape for a in index_arrays),
                                                      (1,) * self.nd))
        return out

    def _read_slices(self, data: np.ndarray, tensor: Tensor, plan: list) -> np.ndarray | None:
        """The read as a strided view of `data` when it stays in bounds over the block."""
        index: list = []
        placed: list[int] = []
        for dim, (d, stride, offset) in enumerate(plan):
            n = tensor.shape[dim]
            if d is None:
                if not 0 <= offset < n:
                    return None
                index.append(offset)
                continue
            start, stop = self.ranges[d]
            lo = self.stage.dims[d].lo
            first = stride * (lo + start) + offset
            last = stride * (lo + stop - 1) + offset
            if first < 0 or last >= n:
                return None
            index.append(slice(first, last + 1, stride))
            placed.append(d)
        view = data[tuple(index)]
        order = sorted(range(len(placed)), key=lambda k: placed[k])
        view = view.transpose(order)
        shape = [1] * self.nd
        for d in placed:
            shape[d] = self.shape[d]
        return view.reshape(shape)


def _shared_nodes(body: E.Expr) -> set[int]:
    """Ids of the nodes that more than one parent refers to (the expression is a DAG)."""
    uses: dict[int, int] = {}
    stack = [body]
    while stack:
        node = stack.pop()
        for child in node.children():
            uses[id(child)] = uses.get(id(child), 0) + 1
            if uses[id(child)] == 1:
                stack.append(child)
    return {key for key, n in uses.items() if n > 1}


def _label(d: int) -> str:
    return "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[d]
