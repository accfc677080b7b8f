"""The tile hierarchy of a lowered program, read off its loop IR.

The loops around the statement that does the most work (the "main" statement: a matmul's or a
convolution's update, a softmax's exponentials) form a path from the root. Cutting that path
between loops of different roles (spatial loops, which move over the output, and reduction
loops, which revisit it) or kinds (parallel, GPU-bound, serial, unrolled, vectorized) gives the
tile levels: what one iteration of a group of loops covers. For each level the analysis gives
the tile of the output (in the output's own dimensions, also when the work is done in a fused
stage's private buffer), the bytes every buffer touches during one such iteration, and how
many of those iterations run. Everything comes from the IR after the target's passes, so a
register tile, a packed layout, a compute_at buffer or a GPU block's shared memory is seen as it
runs; nothing depends on which sketch produced the program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ansor.lower import ir
from ansor.te import expr as E
from ansor.te.arith import const_bounds

_GPU_GROUPS = {"blockIdx.x": "block", "blockIdx.y": "block", "blockIdx.z": "block", "vthread": "vthread",
               "threadIdx.x": "thread", "threadIdx.y": "thread", "threadIdx.z": "thread"}
CONCURRENT_KINDS = frozenset(["parallel", *_GPU_GROUPS])


@dataclass(frozen=True)
class LoopInfo:
    """One loop on the main statement's path."""

    name: str
    extent: int
    kind: str        # the IR's kind: serial, parallel, vectorized, unrolled, blockIdx.x, ...
    unrolled: bool   # unrolled by an auto-unroll pragma or as part of a register tile
    role: str        # "spatial": its iterations cover different outputs; "reduce": the same ones

    @property
    def label(self) -> str:
        """`name ×extent kind`, the kind left out for plain serial loops."""
        kind = self.kind if self.kind != "serial" else ("unrolled" if self.unrolled else "")
        return f"{self.name} \u00d7{self.extent}" + (f" {kind}" if kind else "")


@dataclass(frozen=True)
class TileLevel:
    """What one iteration of `loops` covers (level 0, with no loops: the whole program)."""

    loops: tuple[LoopInfo, ...]
    tile: tuple[int, ...]           # extents of the tile, in the dimensions of `tensor`
    tensor: str                     # the tensor the tile is a part of
    footprint: dict[str, int]       # bytes of each buffer touched during one iteration
    iterations: int                 # iterations of this level in one call
    concurrent: bool                # inside a parallel (or GPU-bound) loop: tiles run at once

    @property
    def footprint_bytes(self) -> int:
        """Unique bytes one iteration touches, all buffers together."""
        return sum(self.footprint.values())

    @property
    def bytes_moved(self) -> int:
        """Bytes brought in if each iteration loads its footprint once: what a cache that holds
        one tile of this level (and no more) transfers."""
        return self.footprint_bytes * self.iterations

    @property
    def role(self) -> str:
        roles = {lp.role for lp in self.loops}
        return roles.pop() if len(roles) == 1 else ("mixed" if roles else "")


@dataclass(frozen=True)
class NestAnalysis:
    """The tile levels of a program and the facts the picture and the text need."""

    levels: tuple[TileLevel, ...]
    main_buffer: str                # the buffer the main statement writes
    output: str                     # the tensor whose tiles `levels` give (an output if fused)
    shapes: dict[str, tuple[int, ...]]  # shape of `output` and of `main_buffer`
    dtype: str
    vectorized: tuple[tuple[str, str, int], ...]  # (buffer written, loop, extent)
    parallel: tuple[tuple[str, int], ...]          # (loop, extent) of parallel / block loops
    main_nest_bytes: int            # unique bytes of the top-level nest holding the main statement
    other_nest_bytes: tuple[int, ...] = field(default_factory=tuple)  # of each other top-level nest

    @property
    def total_bytes(self) -> int:
        """Unique bytes the whole program touches (its compulsory traffic)."""
        return self.levels[0].footprint_bytes if self.levels else 0

    def traffic(self, capacity: int, shared_by: int = 1, threads: int = 1) -> int:
        """Bytes moved into a cache of `capacity` bytes (one instance, shared by `shared_by`
        cores, with `threads` tiles running at once in parallel levels): everything once if the
        whole program fits; else, for the main nest, the bytes moved at its outermost level
        whose tile fits (the innermost when none does), and for the other nests their data once."""
        if not self.levels:
            return 0
        if self.total_bytes <= capacity:
            return self.total_bytes
        others = sum(self.other_nest_bytes)
        if self.main_nest_bytes <= capacity:
            return others + self.main_nest_bytes
        per_tile = capacity / max(1, min(shared_by, threads))
        for level in self.levels[1:]:
            if level.footprint_bytes <= (per_tile if level.concurrent else capacity):
                return others + level.bytes_moved
        return others + (self.levels[-1].bytes_moved if len(self.levels) > 1 else self.main_nest_bytes)


@dataclass
class _Access:
    buffer: ir.Buffer
    indices: tuple
    chain: tuple[ir.For, ...]
    write: bool
    store: int          # which statement (index of its write access)
    ops: int = 0        # float operations of a written value
    common: int = 0     # loops shared with the main path (a prefix)


def _float_ops(value: E.Expr) -> int:
    n = 0
    for node in E.walk(value):
        t = type(node)
        if (t is E.BinOp or t is E.Call) and node.dtype in E.FLOAT_DTYPES:
            n += 1
    return n


def _collect(stmt: ir.Stmt, chain: tuple[ir.For, ...], out: list[_Access], unrolled: set[int]) -> None:
    """Every buffer access of the program with the loops around it (as the statement runs:
    an unswitched nest as its checked version, a register tile's inner loops unrolled)."""
    if isinstance(stmt, ir.For):
        _collect(stmt.body, chain + (stmt,), out, unrolled)
    elif isinstance(stmt, ir.Seq):
        for s in stmt.stmts:
            _collect(s, chain, out, unrolled)
    elif isinstance(stmt, ir.Store):
        sid = len(out)
        out.append(_Access(stmt.buffer, tuple(stmt.indices), chain, True, sid, _float_ops(stmt.value)))
        for node in E.walk(stmt.value):
            if isinstance(node, ir.BufferLoad):
                out.append(_Access(node.buffer, tuple(node.indices), chain, False, sid))
    elif isinstance(stmt, ir.IfThenElse):
        _collect(stmt.then, chain, out, unrolled)
        if stmt.orelse is not None:
            _collect(stmt.orelse, chain, out, unrolled)
    elif isinstance(stmt, ir.Allocate):
        _collect(stmt.body, chain, out, unrolled)
    elif isinstance(stmt, ir.RegisterTile):
        loops = stmt.loops()
        unrolled.update(id(f) for f in loops[stmt.kept:-1])
        _collect(stmt.nest, chain, out, unrolled)
    elif isinstance(stmt, ir.TransposedStore):
        if stmt.staging is not None:
            _collect(stmt.staging, chain, out, unrolled)
        _collect(stmt.write, chain, out, unrolled)
    elif isinstance(stmt, ir.Unswitched):
        _collect(stmt.slow, chain, out, unrolled)
    elif isinstance(stmt, ir.GPUKernel):
        _collect(stmt.body, chain, out, unrolled)


def _iterations(chain) -> int:
    return math.prod(max(1, f.extent) for f in chain)


def _regions(accesses: list[_Access], fixed: int, writes_only: bool = False) -> dict[int, tuple[ir.Buffer, list[int]]]:
    """Per buffer (by identity): the extent of each dimension touched when the loops of each
    access's chain from position `fixed` inward sweep their ranges, the outer ones held."""
    hulls: dict[int, tuple[ir.Buffer, list[list[float]]]] = {}
    for acc in accesses:
        if writes_only and not acc.write:
            continue
        ranges = {}
        for p, f in enumerate(acc.chain):
            ranges[id(f.var)] = (0, 0) if p < fixed else (0, max(1, f.extent) - 1)
        entry = hulls.get(id(acc.buffer))
        if entry is None:
            entry = hulls[id(acc.buffer)] = (acc.buffer, [[math.inf, -math.inf] for _ in acc.buffer.shape])
        for d, idx in enumerate(acc.indices[:len(acc.buffer.shape)]):
            lo, hi = const_bounds(idx, ranges)
            hull = entry[1][d]
            hull[0], hull[1] = min(hull[0], lo), max(hull[1], hi)
    out = {}
    for bid, (buf, hull) in hulls.items():
        extents = []
        for (lo, hi), size in zip(hull, buf.shape):
            lo, hi = max(lo, 0), min(hi, size - 1)
            extents.append(int(hi - lo + 1) if hi >= lo else 1)
        out[bid] = (buf, extents)
    return out


def _footprint(accesses: list[_Access], fixed: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for buf, extents in _regions(accesses, fixed).values():
        out[buf.name] = out.get(buf.name, 0) + math.prod(extents) * E.DTYPE_BYTES.get(buf.dtype, 4)
    return out


def _vars_of(index: E.Expr) -> set[int]:
    return {id(n) for n in E.walk(index) if isinstance(n, (E.Var, E.IterVar))}


def _dim_map(src: _Access, dst: _Access) -> dict[int, int]:
    """Dimensions of a read buffer -> dimensions of the buffer its statement writes, matched by
    the loop variables their indices share (then by position, for equal ranks)."""
    src_vars = [_vars_of(i) for i in src.indices]
    dst_vars = [_vars_of(i) for i in dst.indices]
    out: dict[int, int] = {}
    for k, vs in enumerate(src_vars):
        hits = [e for e, ws in enumerate(dst_vars) if vs & ws]
        if len(hits) == 1 and hits[0] not in out.values():
            out[k] = hits[0]
    if len(src_vars) == len(dst_vars):
        for k in range(len(src_vars)):
            if k not in out and k not in out.values():
                out[k] = k
    return out


def _consumer_maps(accesses: list[_Access], main: ir.Buffer) -> list[tuple[ir.Buffer, dict[int, int]]]:
    """The buffers the main buffer's values flow into (a fused ReLU reading a matmul's private
    tile, the copy out of a cache stage), nearest first, each with how the main buffer's
    dimensions sit in its own: matched statement by statement along the chain of reads and
    writes. Only chains where every dimension finds its place are followed."""
    writes = {a.store: a for a in accesses if a.write}
    maps: dict[int, dict[int, int]] = {id(main): {d: d for d in range(len(main.shape))}}
    found = [(main, maps[id(main)])]
    frontier = [main]
    while frontier:
        nxt = []
        for buf in frontier:
            for acc in accesses:
                if acc.write or acc.buffer is not buf:
                    continue
                dst = writes[acc.store]
                if id(dst.buffer) in maps:
                    continue
                step = _dim_map(acc, dst)
                composed = {k: step[m] for k, m in maps[id(buf)].items() if m in step}
                if len(composed) < len(main.shape):
                    continue
                maps[id(dst.buffer)] = composed
                found.append((dst.buffer, composed))
                nxt.append(dst.buffer)
        frontier = nxt
    return found


def analyze_nest(func: ir.PrimFunc) -> NestAnalysis:
    """The tile levels of a lowered program (see the module docstring)."""
    accesses: list[_Access] = []
    unrolled: set[int] = set()
    _collect(func.body, (), accesses, unrolled)
    writes = [a for a in accesses if a.write]
    if not writes:
        raise ValueError("the program stores nothing")
    # the statement doing the most floating-point work (a matmul's update, not the copies that
    # feed it); among programs of copies alone, the one running most often
    main = max(reversed(writes), key=lambda a: (_iterations(a.chain) * a.ops, _iterations(a.chain)))
    path = main.chain
    for acc in accesses:
        n = 0
        while n < min(len(acc.chain), len(path)) and acc.chain[n] is path[n]:
            n += 1
        acc.common = n

    in_main_nest = [a for a in accesses if a.common >= 1] if path else accesses
    # the tiles are drawn in the tensor the main statement's results end up in within its nest:
    # an output if one is reached, else the last buffer reached
    reached = _consumer_maps(in_main_nest, main.buffer)
    output, to_output = next(((b, m) for b, m in reached if b.role == "output"), reached[-1])

    def tile_at(b: int) -> tuple[tuple[int, ...], str]:
        inside = [a for a in accesses if a.common >= b] if b else accesses
        regions = _regions(inside, b, writes_only=True)
        if id(output) in regions:
            return tuple(regions[id(output)][1]), output.name
        extents = regions[id(main.buffer)][1]
        tile = [1] * len(output.shape)
        for k, e in to_output.items():
            tile[e] = extents[k]
        return tuple(tile), output.name

    tiles = [tile_at(b) for b in range(len(path) + 1)]
    loops = []
    for j, f in enumerate(path):
        (outer, outer_name), (inner, inner_name) = tiles[j], tiles[j + 1]
        moves = outer != inner if outer_name == inner_name else math.prod(outer) != math.prod(inner)
        role = "spatial" if moves else "reduce"
        loops.append(LoopInfo(f.var.name, int(f.extent), f.kind, bool(f.unroll_hint) or id(f) in unrolled, role))

    # groups of consecutive loops of one role and kind; a level is what one iteration covers
    def group_key(lp: LoopInfo) -> tuple[str, str]:
        kind = _GPU_GROUPS.get(lp.kind) or ("unrolled" if lp.kind == "serial" and lp.unrolled else lp.kind)
        return lp.role, kind

    groups: list[list[int]] = []  # [start, end) of each group; loops of one iteration join a neighbour
    for j, lp in enumerate(loops):
        if groups and (lp.extent == 1 or group_key(loops[groups[-1][0]]) == group_key(lp)
                       or all(x.extent == 1 for x in loops[groups[-1][0]:groups[-1][1]])):
            groups[-1][1] = j + 1
        else:
            groups.append([j, j + 1])
    starts = [g[0] for g in groups]
    ends = [g[1] for g in groups[:-1]]  # the innermost group's end is one statement instance
    levels = [TileLevel((), tiles[0][0], tiles[0][1], _footprint(accesses, 0), 1, False)]
    for start, end in zip(starts, ends):
        inside = [a for a in accesses if a.common >= end]
        levels.append(TileLevel(tuple(loops[start:end]), tiles[end][0], tiles[end][1], _footprint(inside, end),
                                _iterations(path[:end]), any(lp.kind in CONCURRENT_KINDS for lp in loops[:end])))

    # the other top-level nests: their data once each
    nests: dict[int, list[_Access]] = {}
    for acc in accesses:
        top = acc.chain[0] if acc.chain else None
        nests.setdefault(id(top), []).append(acc)
    main_top = id(path[0]) if path else id(None)
    main_nest_bytes = sum(_footprint(nests.get(main_top, []), 0).values())
    others = tuple(sum(_footprint(group, 0).values()) for key, group in nests.items() if key != main_top)

    vectorized = {}
    for acc in writes:
        for f in acc.chain:
            if f.kind == "vectorized":
                vectorized[(acc.buffer.name, f.var.name)] = int(f.extent)
    parallel = {}
    for acc in writes:
        for f in acc.chain:
            if f.kind == "parallel" or f.kind.startswith("blockIdx"):
                parallel[f.var.name] = int(f.extent)
    shapes = {output.name: tuple(output.shape), main.buffer.name: tuple(main.buffer.shape)}
    return NestAnalysis(tuple(levels), main.buffer.name, output.name, shapes, main.buffer.dtype,
                        tuple((b, v, n) for (b, v), n in vectorized.items()), tuple(parallel.items()),
                        main_nest_bytes, others)
