"""Per-store program features for the learned cost model.

A lowered program (`PrimFunc`) becomes a matrix with one row per buffer written by a `Store`
and `FEATURE_COUNT` = 164 columns, in the layout of the reference auto-scheduler, so a model
sees the same kind of description of a loop nest that the original system was designed for.
All stores to one buffer share a row: their op counts add up, every other group is taken from
the last store (a reduction's update statement wins over its init statement).

Column list (names as in `FEATURE_NAMES`)
=========================================

Group 1 - compute and annotations (57)
  0-6    float_mad, float_addsub, float_mul, float_divmod, float_cmp, float_math_func,
         float_other_func: float operations in the stored value, times outer_prod.
         cmp includes min/max. math_func counts the pure math calls (exp, log, sqrt, ...).
         mad is always 0: the IR has no fused multiply-add node, so a*b+c counts as one mul
         and one add. other_func is always 0: every call in the IR is a pure math function.
  7-13   int_* : the same seven counts for integer operations (index arithmetic of loads).
  14     bool_op: and/or/not (an n-ary and/or counts n-1).
  15     select_op: conditional selects.
  16-18  vec_num, vec_prod, vec_len: number of vectorized loops around the store, product of
         their extents, extent of the innermost one.
  19-26  vec_type.kPosNone ... vec_type.kPosMixed: position one-hot (see "Position" below).
  27-37  unroll_num, unroll_prod, unroll_len, unroll_type.* (explicitly unrolled loops).
  38-48  parallel_num, parallel_prod, parallel_len, parallel_type.*.
  49     is_gpu: 1 when the program binds any loop to a GPU axis.
  50-56  blockIdx_x_len, blockIdx_y_len, blockIdx_z_len, threadIdx_x_len, threadIdx_y_len,
         threadIdx_z_len: extent of the innermost enclosing loop bound to that axis (1 when
         none, as in the reference); vthread_len: product of enclosing vthread extents (1).

Group 2 - buffer access (18 per buffer x 5 buffers = 90), columns B{k}.<field>, k = 0..4
  For every buffer the statement touches (the written one and each one read) an access
  record is built; records are sorted by (lines, bytes) descending (ties keep the order:
  written buffer first, then reads in order of first use), the first five are kept and
  missing slots stay zero.
  acc_type.kRead, acc_type.kWrite, acc_type.kReadWrite   one-hot
  bytes           outer_prod x element size
  unique_bytes    bytes of the region touched over all enclosing loops: for a linear index
                  the span of a dimension is sum(|coef| x (extent - 1)) + 1, the union over
                  the statement's accesses, capped by the buffer's extent
  lines           cache lines moved: (outer_prod / reduce_ratio) x min(1, stride x elem /
                  cache_line), at least 1, where stride is the flat-index stride of the
                  innermost loop whose variable moves the address and reduce_ratio is the
                  product of the extents of the loops inside it (those leave the address
                  unchanged)
  unique_lines    unique_bytes / min(contiguous bytes of the region, cache_line), at least 1
  reuse_type.kLoopMultipleRead, reuse_type.kSerialMultipleReadWrite, reuse_type.kNoReuse
                  one-hot, from the reuse analysis below
  reuse_dis_iter  iterations between two uses of the same data
  reuse_dis_bytes bytes touched between two uses
  reuse_ct        how many times the data is reused
  bytes_d_reuse_ct, unique_bytes_d_reuse_ct, lines_d_reuse_ct, unique_lines_d_reuse_ct
                  the four sizes divided by reuse_ct (multiplied by 2 when there is no reuse)
  stride          flat-index stride of the innermost loop, 0 when its variable does not
                  move the address

  Reuse analysis: the enclosing loops are scanned from the innermost outward. The first loop
  whose variable does not appear in the buffer's indices gives loop-multiple-read reuse: count
  = its extent, distance = product of the extents of the loops inside it, bytes = bytes the
  statements seen so far inside the next inner loop touch over that loop (one element per
  access when the innermost loop carries the reuse). Before that, a loop whose body accesses
  the buffer more than once (several statements seen so far, or several distinct indices in
  one statement) gives serial-multiple-read-write reuse: count = accesses - 1, distance =
  product of the extents of the loops inside it, bytes = bytes its body touches over the loop
  divided by its extent.

Group 3 - arithmetic intensity curve (10): arith_intensity_curve_0..9
  For each loop level from the innermost outward: float ops of the statement executed by that
  loop nest, and bytes that nest touches (sum over the statement's buffers of the touched
  region). The curve of intensity = ops / bytes against log2(ops) is sampled at i/10 of the
  largest log2(ops), i = 1..10, by linear interpolation. Zero for statements without float ops.

Group 4 - allocation (4), on the row of a buffer allocated by an `Allocate`
  alloc_size (bytes), alloc_prod (elements x outer_prod at the allocation), alloc_outer_prod
  (outer_prod at the allocation), alloc_inner_prod (the row's outer_prod / alloc_outer_prod).

Group 5 - outer scope (3)
  outer_prod (product of the enclosing loop extents, GPU-bound loops included, guards
  ignored), num_loops (number of enclosing loops), auto_unroll_max_step (product of the
  extents of the enclosing loops that an auto-unroll pragma unrolls, 0 when none).

Every value x except the one-hot columns and is_gpu is stored as sign(x) * log2(|x| + 1).

Programs are described as they run on their target: `program_features` applies the target
backend's lowering passes first. A register tile (`ir.RegisterTile`) is its update nest with
the loops inside the kept ones counted as unrolled (they become one vector statement per
point); a transposed store (`ir.TransposedStore`) is its staging nest, when it has one, then
the write as it runs, vectorized along the output's contiguous axis.

Where this differs from the reference implementation
  - reduce_ratio multiplies the extents of the skipped loops (the reference multiplies the
    innermost loop's extent once per skipped loop).
  - Strides are coefficients of the flattened row-major index (sum of index_d x stride_d);
    a loop variable inside a non-linear term (//, %, min, ...) counts with coefficient 1 in
    that dimension.
  - Contiguous bytes (for unique_lines) are the trailing dimensions the region fully covers
    times the first one it covers partially.
  - Serial reuse also counts distinct accesses within one statement, and its distances are
    measured in iterations and bytes of one iteration of the loop, like loop reuse.
  - The intensity curve uses ops / bytes (the reference divides log2(ops) by log2(bytes)).
  - Position one-hot: like the reference, "mixed" whenever the annotation is present and
    "none" otherwise. The loop IR does not record whether a loop came from a spatial or a
    reduce axis, and loops around a compute_at buffer do not appear in its indices, so a
    classification read off the indices would mislabel them; the columns are kept for layout.
  - auto_unroll_max_step is read off the loops the pragma unrolled (the IR keeps no pragma).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ansor.backend import backend_for
from ansor.lower import ir
from ansor.lower.lower import lower
from ansor.schedule.errors import ScheduleError
from ansor.target import Target
from ansor.te import expr as E
from ansor.te.arith import atom_key, const_bounds

if TYPE_CHECKING:
    from ansor.schedule.state import State

# ---------------------------------------------------------------------------------------------
# layout

_OP_KINDS = ("mad", "addsub", "mul", "divmod", "cmp", "math_func", "other_func")
_POS_TYPES = ("kPosNone", "kPosInnerSpatial", "kPosMiddleSpatial", "kPosOuterSpatial",
              "kPosInnerReduce", "kPosMiddleReduce", "kPosOuterReduce", "kPosMixed")
_GPU_AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
_BUFFER_FIELDS = (
    "acc_type.kRead", "acc_type.kWrite", "acc_type.kReadWrite",
    "bytes", "unique_bytes", "lines", "unique_lines",
    "reuse_type.kLoopMultipleRead", "reuse_type.kSerialMultipleReadWrite", "reuse_type.kNoReuse",
    "reuse_dis_iter", "reuse_dis_bytes", "reuse_ct",
    "bytes_d_reuse_ct", "unique_bytes_d_reuse_ct", "lines_d_reuse_ct", "unique_lines_d_reuse_ct",
    "stride",
)
MAX_BUFFERS = 5
CURVE_POINTS = 10


def _names() -> tuple[str, ...]:
    names = [f"float_{k}" for k in _OP_KINDS] + [f"int_{k}" for k in _OP_KINDS]
    names += ["bool_op", "select_op"]
    for prefix in ("vec", "unroll", "parallel"):
        names += [f"{prefix}_num", f"{prefix}_prod", f"{prefix}_len"]
        names += [f"{prefix}_type.{p}" for p in _POS_TYPES]
    names += ["is_gpu"] + [a.replace(".", "_") + "_len" for a in _GPU_AXES] + ["vthread_len"]
    for k in range(MAX_BUFFERS):
        names += [f"B{k}.{f}" for f in _BUFFER_FIELDS]
    names += [f"arith_intensity_curve_{i}" for i in range(CURVE_POINTS)]
    names += ["alloc_size", "alloc_prod", "alloc_outer_prod", "alloc_inner_prod"]
    names += ["outer_prod", "num_loops", "auto_unroll_max_step"]
    return tuple(names)


FEATURE_NAMES: tuple[str, ...] = _names()
FEATURE_COUNT = 164
assert len(FEATURE_NAMES) == FEATURE_COUNT

_N_OPS = 16
_N_CONTEXT = 41  # group 1 after the op counts
_N_BUFFER = len(_BUFFER_FIELDS)
_GROUP2 = _N_BUFFER * MAX_BUFFERS
# columns stored as they are: one-hots and is_gpu; everything else is log-scaled
_RAW_COLUMNS = np.array(["_type.k" in n or n == "is_gpu" for n in FEATURE_NAMES])

# op-count slots: float ops at 0..6, int ops at 7..13
_ADDSUB, _MUL, _DIVMOD, _CMP, _MATH = 1, 2, 3, 4, 5
_BINOP_SLOT = {"+": _ADDSUB, "-": _ADDSUB, "*": _MUL, "/": _DIVMOD, "//": _DIVMOD, "%": _DIVMOD,
               "min": _CMP, "max": _CMP}
_BOOL_OP, _SELECT_OP = 14, 15

_ONE_HOT_NONE = [1.0] + [0.0] * 7
_ONE_HOT_MIXED = [0.0] * 7 + [1.0]
_GPU_KINDS = frozenset(_GPU_AXES + ("vthread",))

_READ, _WRITE, _READ_WRITE = 0, 1, 2
_LOOP_REUSE, _SERIAL_REUSE, _NO_REUSE = 0, 1, 2


# ---------------------------------------------------------------------------------------------
# expressions

def _count_ops(value: E.Expr, counts: list[float], loads: list[ir.BufferLoad]) -> None:
    """Add the operations of `value` to `counts` and collect its loads in first-use order."""
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        node = pop()
        t = type(node)
        if t is E.BinOp:
            counts[_BINOP_SLOT[node.op] + (0 if node.dtype in E.FLOAT_DTYPES else 7)] += 1
            push(node.b)
            push(node.a)
        elif t is ir.BufferLoad:
            loads.append(node)
            extend(node.indices)
        elif t is E.Const or t is E.Var or t is E.IterVar:
            continue
        elif t is E.Compare:
            counts[_CMP + (0 if node.a.dtype in E.FLOAT_DTYPES else 7)] += 1
            push(node.b)
            push(node.a)
        elif t is E.Logical:
            counts[_BOOL_OP] += max(1, len(node.args) - 1)
            extend(reversed(node.args))
        elif t is E.Select:
            counts[_SELECT_OP] += 1
            push(node.b)
            push(node.a)
            push(node.cond)
        elif t is E.Call:
            counts[_MATH + (0 if node.dtype in E.FLOAT_DTYPES else 7)] += 1
            extend(reversed(node.args))
        else:
            extend(reversed(node.children()))


class _Form:
    """An integer index as sum(coef * loop var) + sum(coef * non-linear atom) + const: the
    canonical linear form of `arith.to_linear`, built in one pass with variables keyed by
    identity (this runs for every index of every program the search scores)."""

    __slots__ = ("coefs", "atoms", "const", "vids", "_key")

    def __init__(self, expr: E.Expr, atom_vars: dict):
        coefs: dict[int, int] = {}
        atoms: list[tuple[E.Expr, int, frozenset]] = []
        const = 0
        stack = [(expr, 1)]
        while stack:
            node, scale = stack.pop()
            t = type(node)
            if t is E.Var or t is E.IterVar:
                coefs[id(node)] = coefs.get(id(node), 0) + scale
            elif t is E.Const:
                const += scale * node.value
            elif t is E.BinOp and node.op in _LINEAR_OPS and node.dtype in E.INT_DTYPES:
                op = node.op
                if op == "+":
                    stack.append((node.a, scale))
                    stack.append((node.b, scale))
                elif op == "-":
                    stack.append((node.a, scale))
                    stack.append((node.b, -scale))
                elif type(node.b) is E.Const:
                    stack.append((node.a, scale * node.b.value))
                elif type(node.a) is E.Const:
                    stack.append((node.b, scale * node.a.value))
                else:
                    atoms.append(_atom(node, scale, atom_vars))
            else:
                atoms.append(_atom(node, scale, atom_vars))
        self.coefs = {k: c for k, c in coefs.items() if c} if 0 in coefs.values() else coefs
        self.atoms = atoms
        self.const = const
        vids = set(self.coefs)
        for _, _, atom_vids in atoms:
            vids |= atom_vids
        self.vids = vids
        self._key: tuple | None = None

    @property
    def key(self) -> tuple:
        """Structural identity (equal keys: the same index)."""
        if self._key is None:
            self._key = (tuple(sorted(self.coefs.items())), self.const,
                         tuple((atom_key(a), c) for a, c, _ in self.atoms))
        return self._key


_LINEAR_OPS = ("+", "-", "*")


def _atom(node: E.Expr, scale: int, known: dict) -> tuple[E.Expr, int, frozenset]:
    """A non-linear term and the ids of its variables (`known`: by id(node), for atoms such as
    a fused loop's `f // 7` that recur in many indices of a program)."""
    vids = known.get(id(node))
    if vids is None:
        vids = known[id(node)] = frozenset(id(n) for n in E.walk(node) if isinstance(n, E.Var))
    return node, scale, vids


# ---------------------------------------------------------------------------------------------
# loop nest state

class _Loop:
    """An enclosing loop and what the statements inside it have touched so far."""

    __slots__ = ("vid", "extent", "kind", "hint", "reg_bytes", "reg_elem_bytes", "stmts", "ctx")

    def __init__(self, loop: ir.For):
        self.vid = id(loop.var)
        self.extent = max(1, int(loop.extent))
        self.kind = loop.kind
        self.hint = loop.unroll_hint
        self.reg_bytes = 0.0       # bytes each statement's buffers touch over the whole loop
        self.reg_elem_bytes = 0.0  # bytes the statements' accesses touch in one iteration
        self.stmts: list[dict[int, int]] = []  # per statement: id(buffer) -> distinct accesses
        self.ctx: tuple | None = None  # (group-1 annotation values, outer_prod, unroll product)

    def accesses(self, bid: int) -> int:
        return sum(s.get(bid, 0) for s in self.stmts)


class _Access:
    """The accesses of one buffer in one statement (distinct index tuples)."""

    __slots__ = ("buffer", "read", "write", "forms")

    def __init__(self, buffer: ir.Buffer):
        self.buffer = buffer
        self.read = False
        self.write = False
        self.forms: list[tuple[_Form, ...]] = []

    def add(self, forms: tuple[_Form, ...]) -> None:
        for other in self.forms:
            if other == forms or all(a.key == b.key for a, b in zip(other, forms)):
                return
        self.forms.append(forms)

    def simple(self) -> bool:
        """One affine index tuple: the fast path of region computation applies."""
        return len(self.forms) == 1 and not any(f.atoms for f in self.forms[0])


class _Row:
    __slots__ = ("name", "ops", "ctx", "buffers", "curve", "outer", "alloc")

    def __init__(self, name: str):
        self.name = name
        self.ops = [0.0] * _N_OPS
        self.ctx: list[float] = [0.0] * _N_CONTEXT
        self.buffers: list[float] = [0.0] * _GROUP2
        self.curve: list[float] = [0.0] * CURVE_POINTS
        self.outer: list[float] = [0.0] * 3
        self.alloc: list[float] = [0.0] * 4


def _annotation(loops: list[_Loop]) -> list[float]:
    if not loops:
        return [0.0, 0.0, 0.0] + _ONE_HOT_NONE
    return [float(len(loops)), float(math.prod(f.extent for f in loops)),
            float(loops[-1].extent)] + _ONE_HOT_MIXED


def _context(loops: list[_Loop]) -> tuple[list[float], float, float]:
    """Group-1 annotation values, outer_prod and the auto-unrolled extent product of a nest."""
    vec = [f for f in loops if f.kind == "vectorized"]
    unroll = [f for f in loops if f.kind == "unrolled"]
    par = [f for f in loops if f.kind == "parallel"]
    gpu = dict.fromkeys(_GPU_AXES, 1)
    vthread = 1
    for f in loops:
        if f.kind == "vthread":
            vthread *= f.extent
        elif f.kind in gpu:
            gpu[f.kind] = f.extent
    values = _annotation(vec) + _annotation(unroll) + _annotation(par)
    values += [0.0] + [float(gpu[a]) for a in _GPU_AXES] + [float(vthread)]
    hinted = [f.extent for f in loops if f.hint]
    return values, float(math.prod(f.extent for f in loops)), float(math.prod(hinted) if hinted else 0)


def _prod_capped(span: list, shape: tuple[int, ...]) -> float:
    size = 1.0
    for s, e in zip(span, shape):
        size *= s if s < e else e
    return size


# ---------------------------------------------------------------------------------------------
# extraction

class _Extractor:
    def __init__(self, cache_line_bytes: int):
        self.line = float(cache_line_bytes)
        self.loops: list[_Loop] = []
        self.depth: dict[int, int] = {}  # id(loop var) -> position in self.loops
        self.rows: dict[int, _Row] = {}  # id(buffer) -> row, in first-store order
        self.allocs: dict[int, tuple[float, float, float]] = {}
        self.forms: dict[int, _Form] = {}  # id(index expr) -> linear form
        self.atom_vars: dict[int, frozenset] = {}  # id(non-linear index term) -> ids of its variables
        self.root_ctx: tuple | None = None
        self.is_gpu = False

    # --- walk -------------------------------------------------------------------------------
    def visit(self, stmt: ir.Stmt) -> None:
        t = type(stmt)
        if t is ir.For:
            frame = self.enter(stmt)
            self.visit(stmt.body)
            self.leave(frame)
        elif t is ir.Seq:
            for s in stmt.stmts:
                self.visit(s)
        elif t is ir.Store:
            self.store(stmt)
        elif t is ir.IfThenElse:
            self.visit(stmt.then)
            if stmt.orelse is not None:
                self.visit(stmt.orelse)
        elif t is ir.Allocate:
            outer = float(math.prod(f.extent for f in self.loops))
            buf = stmt.buffer
            self.allocs[id(buf)] = (float(buf.nbytes), float(buf.size) * outer, outer)
            self.visit(stmt.body)
        elif t is ir.RegisterTile:
            self.register_tile(stmt)
        elif t is ir.TransposedStore:  # the values (staged or not), then the write as it runs
            if stmt.staging is not None:
                self.visit(stmt.staging)
            self.visit(stmt.write)
        elif t is ir.Unswitched:  # the nest as scheduled, its bounds checks included
            self.visit(stmt.slow)
        elif t is ir.GPUKernel:
            self.visit(stmt.body)
        elif t is ir.WrittenProgram:  # a template's program: its work as plain loops
            self.visit(stmt.nest)

    def enter(self, loop: ir.For) -> _Loop:
        frame = _Loop(loop)
        if frame.kind in _GPU_KINDS:
            self.is_gpu = True
        self.depth[frame.vid] = len(self.loops)
        self.loops.append(frame)
        return frame

    def leave(self, frame: _Loop) -> None:
        self.loops.pop()
        del self.depth[frame.vid]

    def register_tile(self, tile: ir.RegisterTile) -> None:
        """The update nest with the loops inside the kept ones unrolled, as the tile runs."""
        loops = tile.loops()
        frames = [self.enter(f) for f in loops]
        for frame in frames[tile.kept:-1]:
            frame.kind = "unrolled"
        self.store(loops[-1].body)
        for frame in reversed(frames):
            self.leave(frame)

    def context(self) -> tuple[list[float], float, float]:
        if not self.loops:
            if self.root_ctx is None:
                self.root_ctx = _context([])
            return self.root_ctx
        top = self.loops[-1]
        if top.ctx is None:
            top.ctx = _context(self.loops)
        return top.ctx

    def index_forms(self, indices: tuple[E.Expr, ...]) -> tuple[_Form, ...]:
        memo = self.forms
        out = []
        for e in indices:
            f = memo.get(id(e))
            if f is None:
                f = memo[id(e)] = _Form(e, self.atom_vars)
            out.append(f)
        return tuple(out)

    # --- one statement ----------------------------------------------------------------------
    def store(self, st: ir.Store) -> None:
        loops = self.loops
        n = len(loops)
        ctx_values, outer_prod, unroll_prod = self.context()

        counts = [0.0] * _N_OPS
        loads: list[ir.BufferLoad] = []
        _count_ops(st.value, counts, loads)

        acc = _Access(st.buffer)
        acc.write = True
        acc.add(self.index_forms(st.indices))
        accesses = {id(st.buffer): acc}
        for load in loads:
            acc = accesses.get(id(load.buffer))
            if acc is None:
                acc = accesses[id(load.buffer)] = _Access(load.buffer)
            acc.read = True
            acc.add(self.index_forms(load.indices))

        # bytes touched per loop level, registered with the loops for the reuse analysis
        mem_bytes = [0.0] * n
        stmt_accesses: dict[int, int] = {}
        elem_bytes = 0.0
        infos = []
        for bid, acc in accesses.items():
            elem = float(E.DTYPE_BYTES[acc.buffer.dtype])
            region = self.touched(acc, elem, mem_bytes)
            stmt_accesses[bid] = len(acc.forms)
            elem_bytes += elem * len(acc.forms)
            infos.append((acc, elem, region))
        for i in range(n):
            frame = loops[i]
            frame.reg_bytes += mem_bytes[i]
            frame.reg_elem_bytes += elem_bytes
            frame.stmts.append(stmt_accesses)

        feats = [self.access_features(acc, elem, region, outer_prod) for acc, elem, region in infos]
        if len(feats) > 1:
            feats.sort(key=lambda f: (-f[5], -f[3]))  # stable: ties keep first-use order
        flat: list[float] = []
        for f in feats[:MAX_BUFFERS]:
            flat += f
        if len(flat) < _GROUP2:
            flat += [0.0] * (_GROUP2 - len(flat))

        row = self.rows.get(id(st.buffer))
        if row is None:
            row = self.rows[id(st.buffer)] = _Row(st.buffer.name)
        ops = row.ops
        for k in range(_N_OPS):
            if counts[k]:
                ops[k] += counts[k] * outer_prod
        row.ctx = ctx_values
        row.buffers = flat
        row.curve = self.curve(sum(counts[:7]), mem_bytes)
        row.outer = [outer_prod, float(n), unroll_prod]

    def touched(self, acc: _Access, elem: float, mem_bytes: list[float]) -> list[float]:
        """Add to mem_bytes[i] the bytes of the buffer touched when loops i..innermost sweep
        their ranges (outer loops held); return the per-dimension region over all loops."""
        loops, depth = self.loops, self.depth
        n = len(loops)
        shape = acc.buffer.shape
        if acc.simple():
            # one affine access: a dimension's span grows by |coef| * (extent - 1) per loop
            span = [1] * len(shape)
            events = []
            for d, f in enumerate(acc.forms[0]):
                for vid, c in f.coefs.items():
                    p = depth.get(vid)
                    if p is not None:
                        events.append((p, d, abs(c) * (loops[p].extent - 1)))
            events.sort(reverse=True)
            k, m = 0, len(events)
            size = 1.0
            for i in range(n - 1, -1, -1):
                if k < m and events[k][0] == i:
                    while k < m and events[k][0] == i:
                        span[events[k][1]] += events[k][2]
                        k += 1
                    size = _prod_capped(span, shape)
                mem_bytes[i] += size * elem
            return [float(s if s < e else e) for s, e in zip(span, shape)]
        # several index tuples or non-linear terms: recompute the union where it changes, in
        # the dimensions whose indices read the loop variable that starts to sweep
        ranges = {f.vid: (0, 0) for f in loops}
        moving: dict[int, list[int]] = {}  # loop depth -> dimensions it moves
        for forms in acc.forms:
            for d, f in enumerate(forms):
                for v in f.vids:
                    p = depth.get(v)
                    if p is not None:
                        dims = moving.setdefault(p, [])
                        if d not in dims:
                            dims.append(d)
        region = [self.extent_of(acc, d, n, ranges) for d in range(len(shape))]
        size = math.prod(region)
        for i in range(n - 1, -1, -1):
            ranges[loops[i].vid] = (0, loops[i].extent - 1)
            dims = moving.get(i)
            if dims is not None:
                for d in dims:
                    region[d] = self.extent_of(acc, d, i, ranges)
                size = math.prod(region)
            mem_bytes[i] += size * elem
        return region

    def extent_of(self, acc: _Access, d: int, level: int, ranges: dict) -> float:
        """Extent in dimension `d` of the union of a statement's accesses to one buffer when
        the loops from `level` inward sweep their ranges (as given in `ranges`)."""
        loops, depth = self.loops, self.depth
        lo_all, hi_all = math.inf, -math.inf
        for forms in acc.forms:
            f = forms[d]
            lo = hi = f.const
            for vid, c in f.coefs.items():
                p = depth.get(vid)
                if p is not None and p >= level:
                    delta = c * (loops[p].extent - 1)
                    if delta < 0:
                        lo += delta
                    else:
                        hi += delta
            for atom, c, _ in f.atoms:
                alo, ahi = const_bounds(atom, ranges)
                alo, ahi = (alo * c, ahi * c) if c > 0 else (ahi * c, alo * c)
                lo += alo
                hi += ahi
            lo_all = min(lo_all, lo)
            hi_all = max(hi_all, hi)
        span = hi_all - lo_all + 1
        return float(min(span, acc.buffer.shape[d]))

    def strides(self, acc: _Access) -> dict[int, int]:
        """Smallest nonzero flat-index stride of each loop variable over the accesses."""
        buf_strides = acc.buffer.strides()
        if len(acc.forms) == 1:
            flat: dict[int, int] = {}
            for f, s in zip(acc.forms[0], buf_strides):
                for vid, c in f.coefs.items():
                    flat[vid] = flat.get(vid, 0) + c * s
                for _, _, vids in f.atoms:
                    for vid in vids:
                        flat[vid] = flat.get(vid, 0) + s
            return {vid: abs(c) for vid, c in flat.items() if c}
        best: dict[int, int] = {}
        for forms in acc.forms:
            one = _Access(acc.buffer)
            one.forms = [forms]
            for vid, c in self.strides(one).items():
                if c < best.get(vid, math.inf):
                    best[vid] = c
        return best

    def access_features(self, acc: _Access, elem: float, region: list[float],
                        outer_prod: float) -> list[float]:
        loops = self.loops
        n = len(loops)
        line = self.line
        strides = self.strides(acc)

        # cache lines: the innermost loop that moves the address decides the stride
        reduce_ratio = 1.0
        stride = 0
        found = -1
        for i in range(n - 1, -1, -1):
            s = strides.get(loops[i].vid)
            if s:
                stride, found = s, i
                break
            reduce_ratio *= loops[i].extent
        lines = outer_prod / reduce_ratio * min(1.0, stride * elem / line)
        if lines < 1.0:
            lines = 1.0

        bytes_ = outer_prod * elem
        unique_bytes = math.prod(region) * elem
        contiguous = elem
        shape = acc.buffer.shape
        for d in range(len(shape) - 1, -1, -1):
            contiguous *= region[d]
            if region[d] < shape[d]:
                break
        unique_lines = unique_bytes / (contiguous if contiguous < line else line)
        if unique_lines < 1.0:
            unique_lines = 1.0

        reuse_type, dis_iter, dis_bytes, reuse_ct = self.reuse(acc)
        if reuse_ct > 0.5:
            r = 1.0 / reuse_ct
        else:
            r = 2.0  # no reuse: the reference's convention
        acc_type = _READ_WRITE if acc.read and acc.write else (_WRITE if acc.write else _READ)
        out = [0.0, 0.0, 0.0, bytes_, unique_bytes, lines, unique_lines, 0.0, 0.0, 0.0,
               dis_iter, dis_bytes, reuse_ct, bytes_ * r, unique_bytes * r, lines * r,
               unique_lines * r, float(stride) if found == n - 1 else 0.0]
        out[acc_type] = 1.0
        out[7 + reuse_type] = 1.0
        return out

    def reuse(self, acc: _Access) -> tuple[int, float, float, float]:
        """(reuse type, distance in iterations, distance in bytes, count); see the module doc."""
        if len(acc.forms) == 1 and len(acc.forms[0]) == 1:
            used = acc.forms[0][0].vids
        else:
            used = set()
            for forms in acc.forms:
                for f in forms:
                    used |= f.vids
        bid = id(acc.buffer)
        dis_iter = 1.0
        dis_bytes = -1.0
        for frame in reversed(self.loops):
            if frame.vid not in used:
                if dis_bytes < 0:  # reuse at the innermost loop: one element per access
                    dis_bytes = frame.reg_elem_bytes
                return _LOOP_REUSE, dis_iter, dis_bytes, float(frame.extent)
            count = frame.accesses(bid)
            if count > 1:
                return _SERIAL_REUSE, dis_iter, frame.reg_bytes / frame.extent, float(count - 1)
            dis_iter *= frame.extent
            dis_bytes = frame.reg_bytes
        return _NO_REUSE, 0.0, 0.0, 0.0

    def curve(self, flops: float, mem_bytes: list[float]) -> list[float]:
        """Arithmetic intensity against log2(ops), sampled at CURVE_POINTS points."""
        if flops <= 0 or not mem_bytes:
            return [0.0] * CURVE_POINTS
        xs, ys = [], []
        ops = flops
        loops = self.loops
        for i in range(len(loops) - 1, -1, -1):
            ops *= loops[i].extent
            xs.append(math.log2(ops))
            ys.append(ops / max(mem_bytes[i], 1.0))
        out = []
        pt, last = 0, len(xs) - 1
        top = xs[-1]
        for k in range(1, CURVE_POINTS + 1):
            x = top * k / CURVE_POINTS
            while pt < last and xs[pt] < x - 1e-4:
                pt += 1
            if pt == 0 or xs[pt] == xs[pt - 1]:
                out.append(ys[pt])
            else:
                t = (x - xs[pt - 1]) / (xs[pt] - xs[pt - 1])
                out.append(ys[pt - 1] + t * (ys[pt] - ys[pt - 1]))
        return out

    # --- result -----------------------------------------------------------------------------
    def matrix(self) -> tuple[list[str], np.ndarray]:
        names, table = [], []
        for bid, row in self.rows.items():
            alloc = self.allocs.get(bid)
            if alloc is not None:
                size, prod, outer = alloc
                row.alloc = [size, prod, outer, row.outer[0] / outer if outer else 0.0]
            ctx = row.ctx
            if self.is_gpu:
                ctx = list(ctx)
                ctx[_IS_GPU] = 1.0
            names.append(row.name)
            table.append(row.ops + ctx + row.buffers + row.curve + row.alloc + row.outer)
        if not table:
            return names, np.zeros((0, FEATURE_COUNT), dtype=np.float32)
        x = np.array(table, dtype=np.float64)
        scaled = np.log2(np.abs(x) + 1.0)
        np.copysign(scaled, x, out=scaled)
        return names, np.where(_RAW_COLUMNS, x, scaled).astype(np.float32)


_IS_GPU = FEATURE_NAMES.index("is_gpu") - _N_OPS


def extract_feature_rows(func: ir.PrimFunc, cache_line_bytes: int = 64) -> tuple[list[str], np.ndarray]:
    """Features of a lowered program and the name of the buffer each row describes."""
    ex = _Extractor(cache_line_bytes)
    ex.visit(func.body)
    return ex.matrix()


def extract_features(func: ir.PrimFunc, cache_line_bytes: int = 64) -> np.ndarray:
    """(n_rows, 164) float32 features of a lowered program: one row per written buffer."""
    return extract_feature_rows(func, cache_line_bytes)[1]


@lru_cache(maxsize=1)
def _host_target() -> Target:
    return Target.host()


def program_features(state: State, cache_line_bytes: int = 64, target: Target | None = None) -> np.ndarray:
    """Features of a complete State as it runs on `target` (default: this machine's CPU),
    its backend's lowering passes applied; a program that cannot be lowered has no rows (the
    search drops it). Errors in the passes or in extraction itself are bugs and propagate."""
    target = target or _host_target()
    backend = backend_for(target)
    try:
        func = lower(state, prepack=backend.analyses_read_prepack)
    except Exception:
        return np.zeros((0, FEATURE_COUNT), dtype=np.float32)
    try:
        func = backend.run_analysis_passes(func, target)
    except ScheduleError:  # the target cannot run it (a GPU's limits): no features, ranked last
        return np.zeros((0, FEATURE_COUNT), dtype=np.float32)
    return extract_features(func, cache_line_bytes)


def features_for_states(states: Sequence[State], cache_line_bytes: int = 64,
                        memo: dict[str, np.ndarray] | None = None, extract=None,
                        target: Target | None = None) -> list[np.ndarray]:
    """Features of many States; identical programs (same key) are extracted once. Pass a
    `memo` that outlives the call to reuse features across search rounds, and `extract` (a
    callable on a list of States, e.g. SearchWorkers) to compute the misses elsewhere."""
    memo = {} if memo is None else memo
    keys = [state.key() for state in states]
    missing: dict[str, State] = {}
    for key, state in zip(keys, states):
        if key not in memo and key not in missing:
            missing[key] = state
    if missing:
        todo = list(missing.values())
        found = extract(todo) if extract is not None else [program_features(s, cache_line_bytes, target)
                                                                for s in todo]
        memo.update(zip(missing.keys(), found))
    return [memo[key] for key in keys]
