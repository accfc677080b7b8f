"""Fit a lowered program to a GPU: one kernel per root stage, its launch shape, shared memory,
barriers, and a verifier of the target's limits.

The loop IR from `lower.lower` already has loops bound to blockIdx/vthread/threadIdx and
shared-scope buffers whose region covers the whole block (region relaxation by scope). What a
GPU adds, done here:

- every root stage becomes a `GPUKernel`; its outermost loops must be bound to blockIdx (the
  grid), and the largest extent of the loops bound to each threadIdx axis is the block. Loops
  bound to the same threadIdx axis are one hardware index: a shared stage's fetch loop bound
  to threadIdx.x inside the consumer's threadIdx.x loop is the cooperative fetch (each thread
  copies its share), and a thread loop shorter than the block is guarded by the printer;
- shared buffers are allocated at the top of their kernel; a barrier stands before and after
  each group of statements that fills shared memory (so no thread reads a tile before all of
  it is written, nor overwrites one another thread still reads);
- a bounds check that depends on the thread index, around a statement that contains a fill,
  is moved onto the statements that are not fills: a barrier must be reached by every thread
  of the block (a barrier under a thread-dependent branch is undefined behaviour);
- a reduction whose loop is bound to threadIdx (a cross-thread reduction) accumulates a
  partial result per thread, then the block combines them in shared memory (a tree of halving
  steps with a barrier after each) and one thread writes the result;
- the verifier rejects a program the target cannot run (threads per block, shared memory,
  virtual threads, local memory per thread, unbound stages) with `GPUScheduleError`, before
  it is built: such a program has no features, so the search ranks it last.

Virtual threads are injected (`lower.virtual_threads`): what does not depend on them runs once,
what does becomes V unrolled copies at the innermost level; a loop whose iterations are not
independent that way stays a serial loop inside each thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from ansor.lower import ir
from ansor.lower.rewrite import flat_seq, map_children
from ansor.lower.virtual_threads import inject_virtual_threads
from ansor.schedule.errors import ScheduleError
from ansor.te import expr as E

BLOCK_KINDS = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
THREAD_KINDS = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
AXIS = {"x": 0, "y": 1, "z": 2}


class GPUScheduleError(ScheduleError):
    """A program that cannot run on the GPU target as scheduled (a stage not bound to blocks
    and threads, a barrier under divergent control flow, a limit of the target exceeded)."""


@dataclass(frozen=True)
class GPULimits:
    """What one block may use on the target."""

    max_threads: int = 1024
    shared_bytes: int = 48 * 1024
    max_vthread: int = 8
    local_bytes: int = 4096          # per thread: larger private arrays spill to slow memory


def lower_for_gpu(func: ir.PrimFunc, limits: GPULimits) -> ir.PrimFunc:
    """`func` as a sequence of `GPUKernel`s. Stages computed from constant inputs alone (the
    CPU's prepack function) run as kernels of their own before the others, into workspace.
    A function of kernels already (a template's, written whole) is checked against the limits."""
    if kernels_of(func):
        for k in kernels_of(func):
            _check_written_limits(k, func.attrs.get("shared_bytes", 0), limits)
        return func
    prepack = func.attrs.get("prepack")
    nests: list[ir.Stmt] = flat_seq(prepack.body) if prepack is not None else []
    temps, body = _peel_allocates(func.body)
    nests += flat_seq(body)
    params = list(func.params) + temps
    kernels = [_kernel(func.name if len(nests) == 1 else f"{func.name}_{i}", nest, params, limits)
               for i, nest in enumerate(nests)]
    attrs = {k: v for k, v in func.attrs.items() if k != "prepack"}
    return ir.PrimFunc(func.name, params, ir.seq(kernels), attrs)


def _check_written_limits(k: ir.GPUKernel, shared_bytes: int, limits: GPULimits) -> None:
    if k.threads > limits.max_threads:
        raise GPUScheduleError(f"kernel {k.name!r}: {k.threads} threads per block, over the target's "
                               f"{limits.max_threads}")
    if shared_bytes > limits.shared_bytes:
        raise GPUScheduleError(f"kernel {k.name!r}: {shared_bytes} bytes of shared memory per block, over "
                               f"the target's {limits.shared_bytes}")


def kernels_of(func: ir.PrimFunc) -> list[ir.GPUKernel]:
    """The kernels of a function `lower_for_gpu` made, in launch order."""
    return [s for s in flat_seq(func.body) if isinstance(s, ir.GPUKernel)]


# --- one kernel ----------------------------------------------------------------------------------

def _kernel(name: str, nest: ir.Stmt, params: list[ir.Buffer], limits: GPULimits) -> ir.GPUKernel:
    stage = _stage_name(nest)
    grid = [1, 1, 1]
    node, bound = nest, set()
    while isinstance(node, ir.For) and node.kind in BLOCK_KINDS:
        if node.kind in bound:
            raise GPUScheduleError(f"stage {stage!r}: two loops bound to {node.kind}")
        bound.add(node.kind)
        grid[AXIS[node.kind[-1]]] = node.extent
        node = node.body
    if not bound:
        raise GPUScheduleError(f"stage {stage!r}: its outermost loops must be bound to blockIdx "
                               f"(a GPU runs every root stage as a grid of blocks)")
    block = [1, 1, 1]
    for s in ir.walk_stmts(node):
        if isinstance(s, ir.For):
            if s.kind in BLOCK_KINDS:
                raise GPUScheduleError(f"stage {stage!r}: a loop bound to {s.kind} inside other loops")
            if s.kind == "parallel":
                raise GPUScheduleError(f"stage {stage!r}: 'parallel' is a CPU annotation; bind the loop "
                                       f"to blockIdx/threadIdx instead")
            if s.kind in THREAD_KINDS:
                axis = AXIS[s.kind[-1]]
                block[axis] = max(block[axis], s.extent)
    threads = block[0] * block[1] * block[2]
    if threads > limits.max_threads:
        raise GPUScheduleError(f"stage {stage!r}: {threads} threads per block, over the target's "
                               f"{limits.max_threads}")
    nest = _cross_thread_reductions(nest, stage)
    thread_vars: set[int] = set()
    _check_bound_writes(nest, threads > 1, thread_vars, stage)
    body = _sink_thread_guards(nest, thread_vars)
    body = _insert_barriers(body)
    _check_uniform_barriers(body, thread_vars, tuple(block), stage)
    body, shared = _hoist_shared(body)
    used = sum(b.nbytes for b in shared)
    if used > limits.shared_bytes:
        raise GPUScheduleError(f"stage {stage!r}: {used} bytes of shared memory per block, over the "
                               f"target's {limits.shared_bytes}")
    _check_private_limits(body, limits, stage)
    body = inject_virtual_threads(body)
    for buf in reversed(shared):
        body = ir.Allocate(buf, body)
    touched = {id(b) for b in _buffers_touched(body)}
    kernel_params = [b for b in params if id(b) in touched]
    return ir.GPUKernel(name, tuple(grid), tuple(block), kernel_params, body)


def _stage_name(nest: ir.Stmt) -> str:
    """The buffer a root nest writes last (its stage), for error messages."""
    stores = [s for s in ir.walk_stmts(nest) if isinstance(s, ir.Store) and s.buffer.scope == "global"]
    return stores[-1].buffer.name if stores else "?"


def _peel_allocates(body: ir.Stmt) -> tuple[list[ir.Buffer], ir.Stmt]:
    """Buffers allocated around the whole function (intermediates between root stages): on a
    GPU they are device workspace passed to the kernels."""
    temps = []
    while isinstance(body, ir.Allocate):
        temps.append(body.buffer)
        body = body.body
    return temps, body


def _check_bound_writes(stmt: ir.Stmt, many_threads: bool, thread_vars: set[int], stage: str,
                        in_thread: bool = False) -> None:
    """Every store to memory the block shares (shared, global) must sit inside a loop bound
    to threads when the block has several: otherwise every thread writes it. Collects the
    thread loops' variables."""
    t = type(stmt)
    if t is ir.For:
        inside = in_thread or stmt.kind in THREAD_KINDS
        if stmt.kind in THREAD_KINDS:
            thread_vars.add(id(stmt.var))
        _check_bound_writes(stmt.body, many_threads, thread_vars, stage, inside)
    elif t is ir.Store:
        if many_threads and not in_thread and stmt.buffer.scope != "local":
            raise GPUScheduleError(f"stage {stage!r}: {stmt.buffer.name!r} ({stmt.buffer.scope}) is written "
                                   f"outside any loop bound to threadIdx, so every thread would write it")
    else:
        for child in _children(stmt):
            _check_bound_writes(child, many_threads, thread_vars, stage, in_thread)


def _children(stmt: ir.Stmt) -> list[ir.Stmt]:
    t = type(stmt)
    if t is ir.For or t is ir.Allocate or t is ir.GPUKernel:
        return [stmt.body]
    if t is ir.Seq:
        return list(stmt.stmts)
    if t is ir.IfThenElse:
        return [stmt.then] + ([stmt.orelse] if stmt.orelse is not None else [])
    return []


def _writes_shared(stmt: ir.Stmt) -> bool:
    return any(isinstance(s, ir.Store) and s.buffer.scope == "shared" for s in ir.walk_stmts(stmt))


def _is_fill(stmt: ir.Stmt) -> bool:
    """A statement whose every store goes to shared memory (a shared stage's copy)."""
    stores = [s for s in ir.walk_stmts(stmt) if isinstance(s, ir.Store)]
    return bool(stores) and all(s.buffer.scope == "shared" for s in stores)


def _depends_on(cond: E.Expr, var_ids: set[int]) -> bool:
    return any(id(v) in var_ids for v in E.free_vars(cond))


def _sink_thread_guards(stmt: ir.Stmt, thread_vars: set[int]) -> ir.Stmt:
    """Thread-dependent checks around fills moved onto the statements that are not fills."""
    t = type(stmt)
    if t is ir.IfThenElse and stmt.orelse is None and _depends_on(stmt.cond, thread_vars) \
            and _writes_shared(stmt.then) and not _is_fill(stmt.then):  # (a fill's own checks stay)
        return _guard_all_but_fills(_sink_thread_guards(stmt.then, thread_vars), stmt.cond)
    return map_children(stmt, lambda s: _sink_thread_guards(s, thread_vars))


def _guard_all_but_fills(stmt: ir.Stmt, cond: E.Expr) -> ir.Stmt:
    if not _writes_shared(stmt):
        return ir.IfThenElse(cond, stmt)
    if _is_fill(stmt):
        return stmt
    if type(stmt) in (ir.For, ir.Seq, ir.Allocate, ir.IfThenElse):
        return map_children(stmt, lambda s: _guard_all_but_fills(s, cond))
    return ir.IfThenElse(cond, stmt)


def _insert_barriers(stmt: ir.Stmt) -> ir.Stmt:
    """A barrier before and after each run of consecutive fills in a sequence (a statement
    with barriers of its own, a cross-thread reduction, synchronizes itself)."""
    t = type(stmt)
    if _has_barrier(stmt):
        return stmt
    if t is ir.Seq or _is_fill(stmt):
        items = flat_seq(stmt)
        out: list[ir.Stmt] = []
        filling = False
        for s in items:
            if _is_fill(s):
                if not filling:
                    out.append(ir.Barrier("shared"))
                    filling = True
                out.append(s)
            else:
                if filling:
                    out.append(ir.Barrier("shared"))
                    filling = False
                out.append(_insert_barriers(s) if _writes_shared(s) else s)
        if filling:
            out.append(ir.Barrier("shared"))
        return ir.Seq(out)
    return map_children(stmt, _insert_barriers) if _writes_shared(stmt) else stmt


def _has_barrier(stmt: ir.Stmt) -> bool:
    return any(isinstance(s, ir.Barrier) for s in ir.walk_stmts(stmt))


def _check_uniform_barriers(stmt: ir.Stmt, thread_vars: set[int], block: tuple[int, int, int],
                            stage: str) -> None:
    """No barrier under a thread-dependent branch (a check on a thread index, or a thread
    loop shorter than the block, which the printer guards)."""
    t = type(stmt)
    if t is ir.IfThenElse and _depends_on(stmt.cond, thread_vars) and _has_barrier(stmt):
        raise GPUScheduleError(f"stage {stage!r}: a shared-memory fill under a check on the thread "
                               f"index; barriers there would not be reached by every thread")
    if t is ir.For and stmt.kind in THREAD_KINDS and stmt.extent < block[AXIS[stmt.kind[-1]]] \
            and _has_barrier(stmt.body):
        raise GPUScheduleError(f"stage {stage!r}: a shared-memory fill inside a {stmt.kind} loop of "
                               f"{stmt.extent} in a block of {block[AXIS[stmt.kind[-1]]]}: some threads "
                               f"would skip its barriers")
    for child in _children(stmt):
        _check_uniform_barriers(child, thread_vars, block, stage)


def _hoist_shared(stmt: ir.Stmt) -> tuple[ir.Stmt, list[ir.Buffer]]:
    """Shared allocations removed from where they were attached (their index is relative to
    the block's tile, so one allocation per kernel serves every iteration)."""
    found: list[ir.Buffer] = []

    def strip(s: ir.Stmt) -> ir.Stmt:
        if type(s) is ir.Allocate and s.buffer.scope == "shared":
            found.append(s.buffer)
            return strip(s.body)
        return map_children(s, strip)

    try:
        return strip(stmt), found
    finally:
        strip = None  # noqa: F841 - a recursive closure refers to itself: free it now, not at GC


def _check_private_limits(stmt: ir.Stmt, limits: GPULimits, stage: str) -> None:
    """Virtual threads on any path and the private arrays alive at once in one thread."""
    def visit(s: ir.Stmt, vthreads: int, local: int) -> None:
        t = type(s)
        if t is ir.For and s.kind == "vthread":
            vthreads *= s.extent
            if vthreads > limits.max_vthread:
                raise GPUScheduleError(f"stage {stage!r}: {vthreads} virtual threads, over the target's "
                                       f"{limits.max_vthread}")
        if t is ir.Allocate and s.buffer.scope != "shared":
            local += s.buffer.nbytes * vthreads  # injected virtual threads: one copy each
            if local > limits.local_bytes:
                raise GPUScheduleError(f"stage {stage!r}: {local} bytes of private arrays per thread, over "
                                       f"{limits.local_bytes}")
        for child in _children(s):
            visit(child, vthreads, local)

    try:
        visit(stmt, 1, 0)
    finally:
        visit = None  # noqa: F841


def _buffers_touched(stmt: ir.Stmt) -> list[ir.Buffer]:
    out: dict[int, ir.Buffer] = {}
    for s in ir.walk_stmts(stmt):
        exprs: list[E.Expr] = []
        if isinstance(s, ir.Store):
            out[id(s.buffer)] = s.buffer
            exprs = [s.value, *s.indices]
        elif isinstance(s, ir.IfThenElse):
            exprs = [s.cond]
        for e in exprs:
            for n in E.walk(e):
                if isinstance(n, ir.BufferLoad):
                    out[id(n.buffer)] = n.buffer
    return list(out.values())


# --- cross-thread reduction ----------------------------------------------------------------------

_COMBINERS = ("+", "max", "min")


def _same_access(a: ir.BufferLoad, buffer: ir.Buffer, indices) -> bool:
    from ansor.te.printer import expr_to_str
    return a.buffer is buffer and [expr_to_str(i) for i in a.indices] == [expr_to_str(i) for i in indices]


def _reduction_update(store: ir.Store) -> tuple[str, E.Expr] | None:
    """(combiner, value added) when `store` is `B[i] = B[i] op value`."""
    v = store.value
    if not isinstance(v, E.BinOp) or v.op not in _COMBINERS:
        return None
    for mine, other in ((v.a, v.b), (v.b, v.a)):
        if isinstance(mine, ir.BufferLoad) and _same_access(mine, store.buffer, store.indices):
            return v.op, other
    return None


def _thread_reduction(stmt: ir.Stmt) -> tuple[ir.For, ir.Store] | None:
    """The thread loop and the update of a reduction nest whose reduction is bound to threads:
    a store to memory the block shares, inside a threadIdx loop, at indices that use no
    variable of the nest's own loops."""
    if not isinstance(stmt, ir.For):
        return None
    loops: dict[int, ir.For] = {}
    for s in ir.walk_stmts(stmt):
        if isinstance(s, ir.For):
            loops[id(s.var)] = s
    threads = [f for f in loops.values() if f.kind in THREAD_KINDS]
    if not threads:
        return None
    for s in ir.walk_stmts(stmt):
        if isinstance(s, ir.Store) and s.buffer.scope != "local" and _reduction_update(s) is not None:
            used = {id(v) for i in s.indices for v in E.free_vars(i)}
            if not used & set(loops):
                inside = [f for f in threads if any(x is s for x in ir.walk_stmts(f.body))]
                if inside:
                    return inside[0], s
    return None


def _initial_store(stmt: ir.Stmt, store: ir.Store) -> E.Expr | None:
    """The value of `stmt` if it is the reduction's initialization `B[i] = identity`."""
    if isinstance(stmt, ir.Store) and stmt.buffer is store.buffer and isinstance(stmt.value, E.Const) \
            and _same_access(ir.BufferLoad(stmt.buffer, stmt.indices), store.buffer, store.indices):
        return stmt.value
    return None


def _cross_thread_reductions(stmt: ir.Stmt, stage: str) -> ir.Stmt:
    """Every `init; reduction nest` pair whose reduction is bound to threads, rewritten so
    the threads combine their partial results in shared memory."""
    t = type(stmt)
    if t is ir.Seq:
        out: list[ir.Stmt] = []
        for item in flat_seq(stmt):
            found = _thread_reduction(item)
            if found is None:
                out.append(_cross_thread_reductions(item, stage))
                continue
            thread_loop, store = found
            identity = _initial_store(out[-1], store) if out else None
            if identity is None:
                raise GPUScheduleError(f"stage {stage!r}: a reduction bound to {thread_loop.kind} whose "
                                       f"initialization is not right before it")
            out[-1] = _all_reduce(item, thread_loop, store, identity)
        return ir.Seq(out)
    if t in (ir.For, ir.Allocate, ir.IfThenElse):
        return map_children(stmt, lambda s: _cross_thread_reductions(s, stage))
    if _thread_reduction(stmt) is not None:
        raise GPUScheduleError(f"stage {stage!r}: a reduction bound to threads without its initialization")
    return stmt


def _all_reduce(nest: ir.For, thread_loop: ir.For, store: ir.Store, identity: E.Expr) -> ir.Stmt:
    """Each thread accumulates into a private partial result (the nest as scheduled, its
    update redirected), the partials meet in a shared array, halving steps fold it (step s:
    thread t < s adds element t + s, when that is one of the n written), and thread 0 stores
    the total. Barriers separate the steps; all of it runs in every thread of the block."""
    op, _ = _reduction_update(store)
    dtype = store.buffer.dtype
    partial = ir.Buffer(f"{store.buffer.name}_partial", (1,), dtype, "local", "temp")
    n = thread_loop.extent
    size = 1 << max(0, (n - 1).bit_length())
    red = ir.Buffer(f"{store.buffer.name}_red", (size,), dtype, "shared", "temp")
    zero = E.Const(0, "int32")
    mine = ir.BufferLoad(partial, (zero,))

    def redirect(s: ir.Stmt) -> ir.Stmt:
        if s is store:
            _, value = _reduction_update(store)
            return ir.Store(partial, (zero,), E.BinOp(op, mine, value, dtype))
        return map_children(s, redirect)

    tid = E.Var(f"{thread_loop.var.name}.combine")
    steps: list[ir.Stmt] = [ir.Store(red, (tid,), mine), ir.Barrier("shared")]
    step = size // 2
    while step >= 1:
        fold = ir.Store(red, (tid,), E.BinOp(op, ir.BufferLoad(red, (tid,)),
                                              ir.BufferLoad(red, (tid + step,)), dtype))
        steps += [ir.IfThenElse((tid < step) & (tid + step < n), fold), ir.Barrier("shared")]
        step //= 2
    steps.append(ir.IfThenElse(tid == 0, ir.Store(store.buffer, store.indices, ir.BufferLoad(red, (zero,)))))
    steps.append(ir.Barrier("shared"))  # the shared array is free for the next reduction
    try:
        body = ir.Seq([ir.Store(partial, (zero,), identity), redirect(nest),
                       ir.For(tid, n, thread_loop.kind, ir.Seq(steps))])
    finally:
        redirect = None  # noqa: F841 - a recursive closure refers to itself: free it now, not at GC
    return ir.Allocate(partial, ir.Allocate(red, body))
