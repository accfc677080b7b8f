"""The C dialect of the CPU: OpenMP for parallel loops, `omp simd` for vectorized loops, GCC
unroll pragmas for unrolled loops, vectorizable float32 math, and GCC vector code for the
register tiles and transposed stores the CPU's lowering passes made.

Besides the kernel, the file defines `<entry>_timed(number, ...)` (the calls timed in C) and,
for a program with stages that depend on constant inputs alone, `<entry>_prepack(...)` and
`<entry>_packed_bytes(i)` (the calling convention of `measure/library.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ansor.codegen import cpu_prelude
from ansor.codegen.c_like import CLikePrinter
from ansor.instructions import AMX_STEPS
from ansor.lower import ir, live_rows
from ansor.lower.dot_product import AMX_ACCUMULATOR_TILES, AMX_ROW_TILES, operand_roles
from ansor.lower.register_tile import index_coefficient, load_key, load_offset, loads_in
from ansor.te import expr as E

MAX_UNROLLED_VECTOR_LOOPS = 32  # copies of an `omp simd` loop an auto-unroll pragma may make: gcc
                                # vectorizes each copy on its own, and its compile time grows
                                # faster than the number of copies


def unrolled_vector_loops(loop: ir.For) -> int:
    """Copies of vectorized loops that unrolling `loop` makes, with the auto-unrolled loops
    inside it unrolled too (0: no vectorized loop inside). Register tiles and transposed
    stores count as the loops they were scheduled as."""
    def inside(stmt: ir.Stmt) -> int:
        t = type(stmt)
        if t is ir.For:
            if stmt.kind == "vectorized":
                return 1
            n = inside(stmt.body)
            return n * stmt.extent if stmt.unroll_hint or stmt.kind == "unrolled" else n
        if t is ir.Seq:
            return sum(inside(x) for x in stmt.stmts)
        if t is ir.IfThenElse:
            return inside(stmt.then) + (inside(stmt.orelse) if stmt.orelse is not None else 0)
        if t is ir.Allocate:
            return inside(stmt.body)
        if t is ir.RegisterTile or t is ir.TransposedStore:
            return inside(stmt.nest)
        if t is ir.Unswitched:
            return inside(stmt.fast) + inside(stmt.slow)
        return 0

    try:
        return loop.extent * inside(loop.body)
    finally:
        inside = None  # noqa: F841 - a recursive closure refers to itself: free it now, not at GC


def interleave_rounds(group: int, lanes: int) -> tuple[list[list[tuple[int, int, tuple[int, ...]]]], list[list]]:
    """The shuffle network that transposes `group` vectors of `lanes` values.

    Returns the rounds, each a list of (left, right, indices) per output vector (indices into
    the concatenation of the two inputs, as `ANSOR_SHUFFLE` takes them), and what
    each lane of each final vector holds, as (vector, lane) of the inputs. Every round zips
    vector i with vector i + group/2: the low halves interleaved, then the high halves."""
    half = lanes // 2
    low = tuple(i for k in range(half) for i in (k, lanes + k))
    high = tuple(i for k in range(half, lanes) for i in (k, lanes + k))
    contents = [[(v, lane) for lane in range(lanes)] for v in range(group)]
    rounds = []
    for _ in range(group.bit_length() - 1):
        shuffles, nxt = [], []
        for i in range(group // 2):
            left, right = i, i + group // 2
            for indices in (low, high):
                shuffles.append((left, right, indices))
                both = contents[left] + contents[right]
                nxt.append([both[j] for j in indices])
        rounds.append(shuffles)
        contents = nxt
    return rounds, contents


@dataclass(frozen=True)
class _VectorForm:
    """The immintrin.h spelling of one accumulator vector width and type."""

    acc: str
    load_acc: str
    store_acc: str
    operand: str
    broadcast: str
    load_operand: str
    cast: str = ""  # what the instruction's operands are cast to


_VECTOR_FORMS = {
    (64, "int32"): _VectorForm("__m512i", "_mm512_loadu_si512", "_mm512_storeu_si512", "__m512i",
                               "_mm512_set1_epi32", "_mm512_loadu_si512"),
    (32, "int32"): _VectorForm("__m256i", "_mm256_loadu_si256", "_mm256_storeu_si256", "__m256i",
                               "_mm256_set1_epi32", "_mm256_loadu_si256"),
    (64, "float32"): _VectorForm("__m512", "_mm512_loadu_ps", "_mm512_storeu_ps", "__m512i",
                                 "_mm512_set1_epi32", "_mm512_loadu_si512", "(__m512bh)"),
}


class CPrinter(CLikePrinter):
    """C for gcc (or clang) with OpenMP, for the CPU backend."""

    HEADER = cpu_prelude.HEADER
    threads = 0  # of parallel loops (0: OpenMP's default)
    BARRIER = "/* barrier: no-op on the CPU */"
    PRELUDE = CLikePrinter.PRELUDE + cpu_prelude.PIECES

    def math_function(self, name: str, dtype: str) -> str:
        if dtype == "float32" and name in cpu_prelude.VECTOR_MATH:
            return self.use(f"ansor_{name}f")  # vectorizable; libm's stay scalar calls
        return super().math_function(name, dtype)

    def loop_annotations(self, s: ir.For, in_parallel: bool) -> tuple[list[str], bool]:
        if s.kind == "parallel" and not in_parallel:
            return ["#pragma omp parallel for" + (f" num_threads({self.threads})" if self.threads else "")
                    + self.live_rows_schedule(s)], True
        if s.kind == "vectorized" and not any(type(x) is ir.For for x in ir.walk_stmts(s.body)):
            return ["#pragma omp simd"], in_parallel
        if s.kind == "unrolled" or (s.unroll_hint and unrolled_vector_loops(s) <= MAX_UNROLLED_VECTOR_LOOPS):
            return [f"#pragma GCC unroll {min(s.extent, 65534)}"], in_parallel
        return [], in_parallel

    # --- padded rows skipped at run time (`lower.live_rows`) ------------------------------------
    live_plan = None  # the `lower.live_rows` plan of the function being printed, if it skips rows

    def loop_bound(self, s: ir.For) -> str:
        plan = self.live_plan
        table = plan.trips_name(s) if plan is not None else None
        return f"{table}[ansor_live_length]" if table else super().loop_bound(s)

    def function_prologue(self, func: ir.PrimFunc) -> None:
        """A kernel that skips padded rows reads the call's length first (clamped to the bucket)."""
        self.live_plan = plan = func.attrs.get("live_rows") if func is self.func else None
        if plan is None:
            return
        spec = plan.spec
        self.names.names[id(plan.live)] = "ansor_live"
        self.emit(f"const int32_t ansor_live_length = {live_rows.GLOBAL} >= 0 && {live_rows.GLOBAL} <= "
                  f"{spec.padded} ? {live_rows.GLOBAL} : {spec.padded};", 1)
        self.emit(f"const int32_t ansor_live = ansor_live_length * {spec.inner};", 1)

    def function_epilogue(self, func: ir.PrimFunc) -> None:
        """... and then sets its output's padded rows to zero, slab by slab."""
        plan = self.live_plan
        if plan is None:
            return
        padded_rows = plan.spec.padded * plan.spec.inner
        out = self.names(plan.output, plan.output.name)
        slab = padded_rows * plan.row_elements
        self.emit(f"if (ansor_live < {padded_rows})", 1)
        self.emit(f"for (int64_t ansor_slab = 0; ansor_slab < {plan.slabs}; ++ansor_slab)", 2)
        self.emit(f"__builtin_memset({out} + ansor_slab * {slab} + (int64_t)ansor_live * {plan.row_elements}, 0, "
                  f"(size_t)({padded_rows} - ansor_live) * {plan.row_elements} * sizeof(*{out}));", 3)

    def live_rows_schedule(self, s: ir.For) -> str:
        """A skipping kernel's parallel loop: the usual static blocks at the full length, one
        iteration per thread in turn at a shorter one, so that the iterations with rows to skip
        are not all in one thread's block (the skipped work is shared out)."""
        if self.live_plan is None or not self.threads:
            return ""
        trips = self.loop_bound(s)
        return (f" schedule(static, (ansor_live_length == {self.live_plan.spec.padded} ? ({trips} + "
                f"{self.threads - 1}) / {self.threads} : 1))")

    def live_rows_globals(self) -> str:
        """The length global and the trip tables of a kernel that skips padded rows."""
        plan = self.func.attrs.get("live_rows")
        if plan is None:
            return ""
        lines = ["\n/* the call's length (rows past it are padding, skipped and set to zero) */",
                 f"int {live_rows.GLOBAL} = {plan.spec.padded};"]
        for loop, table in plan.trip_tables.values():
            lines.append(f"static const int32_t {plan.trips_name(loop)}[{len(table)}] = "
                         f"{{{', '.join(map(str, table))}}};")
        return "\n".join(lines) + "\n"

    def dialect_stmt(self, s: ir.Stmt, depth: int, in_parallel: bool) -> None:
        if type(s) is ir.RegisterTile:
            self.register_tile(s, depth)
        elif type(s) is ir.TransposedStore:
            self.transposed_store(s, depth, in_parallel)
        else:
            super().dialect_stmt(s, depth, in_parallel)

    # --- register tiles ---------------------------------------------------------------------
    def register_tile(self, tile: ir.RegisterTile, depth: int) -> None:
        """The accumulator in one vector variable per vector across the kept loops; each
        update one vector statement (one dot-product instruction in a dot-product tile). A
        ragged tile (`ir.RaggedRows`) is printed whole where every row it holds is kept, and
        again with only the kept rows' updates for the tile that straddles the length."""
        if tile.amx is not None:
            self.amx_tile(tile, depth)
            return
        dot = tile.instruction is not None
        block = self._dot_product_block if dot else self._float_tile_block
        loops = tile.loops()
        d = depth
        for f in loops[:tile.outer]:
            if dot:
                d = self._open_loop(f, d)
                continue
            var = self.names(f.var, f.var.name)
            self.ranges[id(f.var)] = (0, f.extent - 1)
            self.emit(f"for ({self.INDEX_TYPE} {var} = 0; {var} < {f.extent}; ++{var}) {{", d)
            d += 1
        ragged = tile.ragged
        if ragged is None:
            block(tile, d, None)
        else:
            left = self.names.fresh("rows_left")
            self.emit(f"const {self.INDEX_TYPE} {left} = {self.expr(ragged.rows_left)};", d)
            self.emit(f"if ({left} > {max(ragged.slot_rows)}) {{", d)
            block(tile, d + 1, None)
            if max(ragged.slot_rows) > 0:  # a block of one row is kept whole or not at all
                self.emit("} else {", d)
                block(tile, d + 1, left)
            self.emit("}", d)
        self._close_loops(d, tile.outer)

    def _print_updates(self, tile: ir.RegisterTile, rows_left: str | None, d: int,
                       print_update: Callable[[int, E.Expr, int, int], None]) -> int:
        """`print_update(slot, value, start, depth)` for each of the tile's updates; the depth
        after them. With `rows_left` (a ragged tile's kept rows), the updates go in row order
        under `if (rows_left > row)` tests, nested so that an operand loaded for one row is in
        scope for the rows after it; each accumulator still sees its updates in their order,
        so kept rows get the same values as from the whole tile."""
        if rows_left is None:
            for slot, value, start in tile.updates:
                print_update(slot, value, start, d)
            return d
        rows = tile.ragged.slot_rows
        guards, row = 0, None
        for slot, value, start in sorted(tile.updates, key=lambda update: rows[update[0]]):  # stable
            if rows[slot] != row:
                row = rows[slot]
                self.emit(f"if ({rows_left} > {row}) {{", d)
                d += 1
                guards += 1
            print_update(slot, value, start, d)
        return self._close_loops(d, guards)

    def _float_tile_block(self, tile: ir.RegisterTile, d: int, rows_left: str | None) -> None:
        """One block of a float register tile: its vectors loaded, the kept loops of updates, the
        vectors stored; with `rows_left`, only the kept rows' updates (`_print_updates`)."""
        loops = tile.loops()
        vt = self.use(f"ansor_f32x{tile.lanes}")
        acc = self.names(tile.buffer, tile.buffer.name)
        regs = [self.names.fresh(f"{acc}_r{s}") for s in range(len(tile.offsets))]
        base = "" if tile.base is None or (isinstance(tile.base, E.Const) and tile.base.value == 0) \
            else f"{self.expr(tile.base)} + "
        self.emit(f"/* register tile: {acc} in {len(regs)} {vt} variables across the reduction"
                  + (", kept rows only */" if rows_left else " */"), d)
        self.emit("{", d)
        d += 1
        self.emit(f"{vt} " + ", ".join(f"{r} = *({vt}*)&{acc}[{base}{o}]" for o, r in zip(tile.offsets, regs)) + ";", d)
        for f in loops[tile.outer:tile.kept]:
            d = self._open_loop(f, d)
        for buf, offset in tile.prefetches:
            self.emit(f"__builtin_prefetch(&{self.names(buf, buf.name)}[{self.expr(offset)}], 0, 3);", d)
        vector_loop = loops[-1]
        self.ranges[id(vector_loop.var)] = (0, vector_loop.extent - 1)
        loaded: dict[str, str] = {}

        def update(slot: int, value: E.Expr, start: int, depth: int) -> None:
            rhs = self._vector_text(tile, vector_loop.var, value, E.Const(start, "int32"), loaded, depth)
            self.emit(f"{regs[slot]} = {regs[slot]} + {rhs};", depth)

        d = self._print_updates(tile, rows_left, d, update)
        d = self._close_loops(d, tile.kept - tile.outer)
        for o, r in zip(tile.offsets, regs):
            self.emit(f"*({vt}*)&{acc}[{base}{o}] = {r};", d)
        self._close_loops(d, 1)

    def _vector_text(self, tile: ir.RegisterTile, vec_var: E.Var, expr: E.Expr, chunk_start: E.Const,
                     loaded: dict[str, str], depth: int) -> str:
        """`expr` for one vector chunk: contiguous loads become (pinned, shared) vector
        variables, everything invariant in the vector variable stays scalar (GNU C broadcasts)."""
        vt = f"ansor_f32x{tile.lanes}"
        if isinstance(expr, ir.BufferLoad):
            offset = load_offset(expr, self.ranges)
            if index_coefficient(offset, vec_var) == 0:
                return self.expr(expr)
            text = f"*(const {vt}*)&{self.expr(E.substitute(expr, {vec_var: chunk_start}))}"
            name = loaded.get(text)
            if name is None:
                name = self.names.fresh("vec")
                loaded[text] = name
                self.emit(f"{vt} {name} = {text};", depth)
                if load_key(expr, offset) in tile.pinned:
                    self.emit(f"{self.use(f'ANSOR_PIN{4 * tile.lanes}')}({name});", depth)
            return name
        if isinstance(expr, E.BinOp) and expr.op in ("+", "-", "*") and loads_in(expr):
            a = self._vector_text(tile, vec_var, expr.a, chunk_start, loaded, depth)
            b = self._vector_text(tile, vec_var, expr.b, chunk_start, loaded, depth)
            return f"({a} {expr.op} {b})"
        return self.expr(expr)

    def _dot_product_block(self, tile: ir.RegisterTile, d: int, rows_left: str | None) -> None:
        """One block of a register tile whose updates are one dot-product instruction each
        (immintrin.h), the depth loop stepping by the instruction's depth; with `rows_left`,
        only the kept rows' updates (`_print_updates`)."""
        ins = tile.instruction
        form = _VECTOR_FORMS[(ins.vector_bytes, ins.acc_dtype)]
        self.use("ansor_word32")
        loops = tile.loops()
        acc = self.names(tile.buffer, tile.buffer.name)
        regs = [self.names.fresh(f"{acc}_r{s}") for s in range(len(tile.offsets))]
        base = "" if tile.base is None or (isinstance(tile.base, E.Const) and tile.base.value == 0) \
            else f"{self.expr(tile.base)} + "
        self.emit(f"/* dot-product tile: {acc} in {len(regs)} {form.acc} variables across the reduction, "
                  f"{ins.name} ({ins.depth} products per lane)" + (", kept rows only */" if rows_left else " */"), d)
        self.emit("{", d)
        d += 1
        self.emit(f"{form.acc} " + ", ".join(f"{r} = {form.load_acc}((const void*)&{acc}[{base}{o}])"
                                             for o, r in zip(tile.offsets, regs)) + ";", d)
        for f in loops[tile.outer:tile.kept - 1]:
            d = self._open_loop(f, d)
        depth_loop, vector_loop = loops[tile.kept - 1], loops[-1]
        group = E.Var(f"{depth_loop.var.name}_q")
        group_name = self.names(group, group.name)
        self.ranges[id(group)] = (0, depth_loop.extent // ins.depth - 1)
        self.ranges[id(depth_loop.var)] = (0, depth_loop.extent - 1)
        self.ranges[id(vector_loop.var)] = (0, vector_loop.extent - 1)
        self.emit(f"for ({self.INDEX_TYPE} {group_name} = 0; {group_name} < {depth_loop.extent // ins.depth}; "
                  f"++{group_name}) {{", d)
        d += 1
        made: dict[str, str] = {}

        def operand(load: ir.BufferLoad, start: int, text_of, depth: int) -> str:
            bound = {depth_loop.var: group * ins.depth, vector_loop.var: E.Const(start, "int32")}
            moved = E.substitute(load, bound)
            text = text_of(f"&{self.names(load.buffer, load.buffer.name)}[{self.flat_index(load.buffer, moved.indices)}]")
            name = made.get(text)
            if name is None:
                name = made[text] = self.names.fresh("dp")
                self.emit(f"{form.operand} {name} = {text};", depth)
            return name

        def update(slot: int, value: E.Expr, start: int, depth: int) -> None:
            _, lhs, rhs = operand_roles(value, tile.buffer.dtype, (ins.feature,), ins.vector_bytes)
            a = operand(lhs, start, lambda p: f"{form.broadcast}(ansor_word32({p}))", depth)
            b = operand(rhs, start, lambda p: f"{form.load_operand}((const void*){p})", depth)
            self.emit(f"{regs[slot]} = {ins.intrinsic}({regs[slot]}, {form.cast}{a}, {form.cast}{b});", depth)

        d = self._print_updates(tile, rows_left, d, update)
        d = self._close_loops(d, tile.kept - tile.outer)  # the depth loop and the kept ones
        for o, r in zip(tile.offsets, regs):
            self.emit(f"{form.store_acc}((void*)&{acc}[{base}{o}], {r});", d)
        self._close_loops(d, 1)

    def amx_tile(self, tile: ir.RegisterTile, depth: int) -> None:
        """A dot-product register tile as AMX tiles (`ir.AmxShape`): the accumulator tiles
        loaded from the accumulator buffer, then per tile instruction's steps of the depth
        loop the row and packed operands' tiles loaded and each accumulator tile updated, then
        the accumulators stored back. Tile registers: accumulators from 0, then the row
        operands, then the packed operands (`lower.dot_product.AMX_ACCUMULATOR_TILES`...)."""
        amx, ins = tile.amx, tile.instruction
        self.use("ansor_amx_configure")
        loops = tile.loops()
        depth_loop, row_loop, vector_loop = loops[tile.kept - 1], loops[tile.kept], loops[-1]
        store = tile.nest
        while isinstance(store, ir.For):
            store = store.body
        _, lhs, rhs = operand_roles(store.value.b, tile.buffer.dtype, (ins.feature,), ins.vector_bytes)
        acc = self.names(tile.buffer, tile.buffer.name)
        rows = amx.instruction.rows
        acc_bytes = amx.acc_row_stride * E.DTYPE_BYTES[tile.buffer.dtype]
        lhs_bytes = amx.lhs_row_stride * E.DTYPE_BYTES[lhs.buffer.dtype]
        rhs_bytes = amx.rhs_step_stride * E.DTYPE_BYTES[rhs.buffer.dtype]
        blocks = [(b, c) for b in range(amx.row_blocks) for c in range(amx.chunks)]
        row_tiles, packed_tiles = AMX_ACCUMULATOR_TILES, AMX_ACCUMULATOR_TILES + AMX_ROW_TILES  # first registers

        def at(load_buffer, indices, bound) -> str:
            moved = [E.substitute(i, bound) for i in indices]
            return f"&{self.names(load_buffer, load_buffer.name)}[{self.flat_index(load_buffer, moved)}]"

        def acc_at(b: int, c: int) -> str:
            bound = {row_loop.var: E.Const(b * rows, "int32"), vector_loop.var: E.Const(c * ins.lanes, "int32")}
            return at(tile.buffer, store.indices, bound)

        d = depth
        for f in loops[:tile.outer]:
            d = self._open_loop(f, d)
        self.emit(f"/* AMX tile: {acc} as {len(blocks)} accumulator tiles of {rows} x {ins.lanes}, "
                  f"{amx.instruction.name} ({ins.depth * AMX_STEPS} products per element and instruction) */", d)
        self.emit("{", d)
        d += 1
        self.emit(f"ansor_amx_configure({rows});", d)
        for n, (b, c) in enumerate(blocks):
            self.emit(f"ansor_tile_loadd({n}, {acc_at(b, c)}, {acc_bytes});", d)
        for f in loops[tile.outer:tile.kept - 1]:
            d = self._open_loop(f, d)
        steps = depth_loop.extent // (ins.depth * AMX_STEPS)
        group = E.Var(f"{depth_loop.var.name}_t")
        group_name = self.names(group, group.name)
        self.ranges[id(group)] = (0, steps - 1)
        self.ranges[id(depth_loop.var)] = (0, depth_loop.extent - 1)
        self.ranges[id(row_loop.var)] = (0, row_loop.extent - 1)
        self.ranges[id(vector_loop.var)] = (0, vector_loop.extent - 1)
        self.emit(f"for ({self.INDEX_TYPE} {group_name} = 0; {group_name} < {steps}; ++{group_name}) {{", d)
        d += 1
        first = group * (ins.depth * AMX_STEPS)
        for b in range(amx.row_blocks):
            bound = {depth_loop.var: first, row_loop.var: E.Const(b * rows, "int32")}
            self.emit(f"ansor_tile_loadd({row_tiles + b}, {at(lhs.buffer, lhs.indices, bound)}, {lhs_bytes});", d)
        for c in range(amx.chunks):
            bound = {depth_loop.var: first, vector_loop.var: E.Const(c * ins.lanes, "int32")}
            self.emit(f"ansor_tile_loadd({packed_tiles + c}, {at(rhs.buffer, rhs.indices, bound)}, {rhs_bytes});", d)
        for n, (b, c) in enumerate(blocks):
            self.emit(f"{amx.instruction.intrinsic}({n}, {row_tiles + b}, {packed_tiles + c});", d)
        d = self._close_loops(d, tile.kept - tile.outer)  # the tile instructions' loop and the kept ones
        for n, (b, c) in enumerate(blocks):
            self.emit(f"ansor_tile_stored({n}, {acc_at(b, c)}, {acc_bytes});", d)
        self._close_loops(d, tile.outer + 1)

    def _close_loops(self, d: int, count: int) -> int:
        """`count` closing braces, each one level out; the depth after them."""
        for _ in range(count):
            d -= 1
            self.emit("}", d)
        return d

    def _open_loop(self, f: ir.For, d: int) -> int:
        var = self.names(f.var, f.var.name)
        self.ranges[id(f.var)] = (0, f.extent - 1)
        if f.kind == "unrolled" or f.unroll_hint:
            self.emit(f"#pragma GCC unroll {min(f.extent, 65534)}", d)
        self.emit(f"for ({self.INDEX_TYPE} {var} = 0; {var} < {f.extent}; ++{var}) {{", d)
        return d + 1

    # --- transposed stores ------------------------------------------------------------------
    def transposed_store(self, node: ir.TransposedStore, depth: int, in_parallel: bool) -> None:
        """Vectors along f transposed in registers, stored as runs of contiguous a."""
        outer, inner = node.nest, node.nest.body
        store = inner.body
        source = node.write.body.body.value
        lanes, group = node.lanes, node.group
        vt = self.use(f"ansor_f32x{lanes}")
        out = self.names(store.buffer, store.buffer.name)
        a_name, f_name = self.names(outer.var, outer.var.name), self.names(inner.var, inner.var.name)
        self.emit(f"/* transposed store: {out} is contiguous along {a_name}, strided along the vector "
                  f"axis {f_name} */", depth)
        self.emit("{", depth)
        d = depth + 1
        if node.staging is not None:  # the values, computed into a contiguous buffer first
            staging = node.staging.buffer
            self.emit(f"float {self.names(staging, staging.name)}[{staging.size}] __attribute__((aligned(64)));", d)
            self.stmt(node.staging.body, d, in_parallel)
        block = E.Var("fb")
        block_name = self.names(block, "fb")
        blocks = inner.extent // lanes
        self.ranges[id(block)] = (0, blocks - 1)
        self.emit(f"for ({self.INDEX_TYPE} {block_name} = 0; {block_name} < {blocks}; ++{block_name}) {{", d)
        d += 1

        def at(load: ir.BufferLoad, a_value: int, f_lane: int) -> str:
            """`load` at a = a_value and f = block * lanes + f_lane."""
            bound = {outer.var: E.Const(a_value, "int32"), inner.var: block * lanes + E.Const(f_lane, "int32")}
            return self.expr(E.substitute(load, bound))

        rounds, contents = interleave_rounds(group, lanes)
        if rounds:
            self.use("ANSOR_SHUFFLE")
            self.use(f"ansor_i32x{lanes}")
        target = ir.BufferLoad(store.buffer, store.indices)
        for start in range(0, outer.extent, group):
            vectors = [self.names.fresh("tv") for _ in range(group)]
            self.emit(f"{vt} " + ", ".join(f"{v} = *(const {vt}*)&{at(source, start + i, 0)}"
                                           for i, v in enumerate(vectors)) + ";", d)
            for shuffles in rounds:
                made = [self.names.fresh("tv") for _ in shuffles]
                parts = [f"{m} = ANSOR_SHUFFLE({vectors[left]}, {vectors[right]}, ansor_i32x{lanes}, "
                         f"{', '.join(map(str, idx))})" for m, (left, right, idx) in zip(made, shuffles)]
                self.emit(f"{vt} " + ", ".join(parts) + ";", d)
                vectors = made
            for v, lanes_held in zip(vectors, contents):
                for g in range(0, lanes, group):
                    held = lanes_held[g:g + group]
                    f_lane = held[0][1]
                    assert held == [(i, f_lane) for i in range(group)], "the interleave network is a transpose"
                    address = at(target, start, f_lane)
                    if group == lanes:
                        self.emit(f"*({vt}*)&{address} = {v};", d)
                    else:
                        self.emit(f"__builtin_memcpy(&{address}, (const char*)&{v} + {4 * g}, {4 * group});", d)
        d -= 1
        self.emit("}", d)
        self.emit("}", depth)

    # --- the file ---------------------------------------------------------------------------
    def generate(self) -> str:
        """The whole file: prelude, kernel, its C timer, and the prepack functions if any."""
        func = self.func
        sig = self.signature(func, False)
        args = ", ".join(self.names(b, b.name) for b in func.params)
        text = (
            self.live_rows_globals()
            + self.function(func, self.fname)
            + f"\ndouble {self.fname}_timed(long long ansor_number, {sig}) {{\n"
            + "  struct timespec ansor_t0, ansor_t1;\n"
            + "  clock_gettime(CLOCK_MONOTONIC, &ansor_t0);\n"
            + f"  for (long long ansor_r = 0; ansor_r < ansor_number; ++ansor_r) {self.fname}({args});\n"
            + "  clock_gettime(CLOCK_MONOTONIC, &ansor_t1);\n"
            + "  return (double)(ansor_t1.tv_sec - ansor_t0.tv_sec)"
            + " + 1e-9 * (double)(ansor_t1.tv_nsec - ansor_t0.tv_nsec);\n"
            + "}\n"
        )
        prepack = func.attrs.get("prepack")
        if prepack is not None:
            text += self.function(prepack, f"{self.fname}_prepack", writes_packed=True)
            sizes = [b.nbytes for b in func.params if b.role == "packed"]
            cases = "".join(f"    case {i}: return {n}LL;\n" for i, n in enumerate(sizes))
            text += (f"\n/* bytes of packed parameter i (after the inputs and outputs); -1 past the last */\n"
                     f"long long {self.fname}_packed_bytes(int i) {{\n  switch (i) {{\n{cases}"
                     f"    default: return -1LL;\n  }}\n}}\n")
        return exact_division_pragma(text) + self.prelude() + text


#: What in a kernel turns a float into an integer: rounding to nearest and the saturating casts.
ROUNDING_MARKS = ("rintf(", "rint(", "ansor_sat_f")
#: gcc's `-freciprocal-math` (DEFAULT_CFLAGS) turns x / s into x * (1/s), an ulp off; a kernel that
#: then rounds to an integer (ONNX's QuantizeLinear: round(x / scale)) would step across a tie and
#: be a whole quantization step off. Such kernels divide exactly.
EXACT_DIVISION = '#pragma GCC optimize ("no-reciprocal-math")\n'


def exact_division_pragma(text: str) -> str:
    """The pragma that makes a kernel's divisions exact when it rounds floats to integers."""
    return EXACT_DIVISION if any(mark in text for mark in ROUNDING_MARKS) else ""


def print_c(func: ir.PrimFunc, threads: int = 0) -> tuple[str, str]:
    """(C source, entry function name) of a function the CPU's lowering passes have run on;
    parallel loops run on `threads` threads (0: OpenMP's default, all the cores)."""
    printer = CPrinter(func)
    printer.threads = threads
    return printer.generate(), printer.fname

