"""The GPU GEMM template: a matmul-shaped stage's whole CUDA kernel, written from its knobs.

A stage that a matrix instruction can compute (`te.matrix_instructions.match_gemm`: a Tensor
Core's 16x16x16 product for float16/bfloat16 operands accumulated in float32, or one thread's
fused multiply-add for float32) is searched as a template, as attention is on the CPU: its
sketch (`search.sketch_gemm`) splits the output rows i into [warps, rows per warp] and the
columns j likewise (for the FMA instruction: threads and rows per thread), the reduction k
into [steps, block_k], and a pragma `gemm_template$KNOBS` holds the choices that are not
loop lengths: shared-memory stages (1, or 2: the next tile fetched into registers while this
one is computed), padding of the shared rows (against bank conflicts), the width of the
global loads in elements (128-bit where alignment allows), the unroll of the k-step loop and,
for the FMA instruction, whether a thread's rows and columns are interleaved in runs of 4
(conflict-free 128-bit shared reads) or contiguous.

On Hopper (compute capability 9.0) 16-bit operands take the `wgmma` instruction instead: the
splits then count warpgroups (4 warps) and their rows and columns, block_k is 64 (one 128-byte
swizzled row of 16-bit values), the stages are a ring of 2 to 6 shared tiles filled by
`cp.async`, and two more knobs apply: `w`, how many batches of products stay in flight while
the next tile's are issued, and `g`, how many rows of blocks run next to each other (the
raster that keeps operand tiles in L2).

The program is one `ir.GPUKernel` whose body is an `ir.WrittenProgram`: the CUDA printer
writes it (`codegen.gemm_cuda`), while the cost model reads `nest`, the same work as plain
loops (fetches into shared memory, the per-thread products, the write-back), so programs of
the template are ranked by the features of their tiles like any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ansor.lower import ir
from ansor.schedule.errors import ScheduleError
from ansor.schedule.state import Split, State
from ansor.te import expr as E
from ansor.te.dtypes import DTYPE_BYTES
from ansor.te.matrix_instructions import INSTRUCTIONS, GemmMatch, MatrixInstruction, match_gemm

PRAGMA = "gemm_template$"
KNOB_LETTERS = {"s": "stages", "p": "pad", "v": "vector", "u": "unroll", "x": "interleave",
                "h": "hopper", "w": "in_flight", "g": "group_rows"}
#: knobs written into a pragma only where they are not 0 (the wgmma template's), so the pragmas
#: of programs without them read as before
OPTIONAL_KNOBS = frozenset("hwg")
WARP = 32
#: shared memory a block may take on compute capability 9.0 (dynamic, opted into at launch)
HOPPER_SHARED_BYTES = 227 * 1024
WGMMA_K = 64                    # elements of a 16-bit k tile: one 128-byte swizzle row
WGMMA_TILES_N = (64, 128, 192, 256)
WGMMA_MAX_ACCUMULATORS = 128    # float registers per thread for a warpgroup's tile


@dataclass(frozen=True)
class GemmKnobs:
    """The choices of one GEMM template program (lengths in elements)."""

    warps_m: int        # warpgroups (wgmma), warps (wmma) or threads (FMA) along a block's rows
    warps_n: int
    tile_m: int         # rows of C per warp (a multiple of 16) or per thread
    tile_n: int
    block_k: int        # reduction steps per shared-memory tile
    stages: int = 2     # 1: one shared buffer; 2: double-buffered, the next fetch overlapping;
                        # wgmma: a ring of 2 to 6 tiles
    pad: int = 0        # elements added to each shared row
    vector: int = 1     # elements per global load (8 float16 or 4 float32: 128 bits)
    unroll: int = 0     # unroll of the k-step loop: 0 whole, else that factor
    interleave: int = 0  # FMA: a thread's rows and columns in runs of 4, spread over the block
    hopper: int = 0     # 1: Hopper's wgmma instructions (sm_90a); 0: wmma (16-bit) or FMA (float32)
    in_flight: int = 0  # wgmma: batches of products left running while the next are issued
    group_rows: int = 0  # wgmma: rows of blocks launched side by side (0: row after row)

    @property
    def block_m(self) -> int:
        return self.warps_m * self.tile_m

    @property
    def block_n(self) -> int:
        return self.warps_n * self.tile_n

    def pragma_text(self) -> str:
        return PRAGMA + ".".join(f"{k}{getattr(self, name)}" for k, name in KNOB_LETTERS.items()
                                 if k not in OPTIONAL_KNOBS or getattr(self, name))


def parse_knob_text(text: str) -> dict[str, int]:
    """`s2.p8.v8.u0.x0` -> {"stages": 2, ...}; an unknown or malformed knob is a ScheduleError."""
    out: dict[str, int] = {}
    for part in filter(None, text.split(".")):
        name = KNOB_LETTERS.get(part[:1])
        if name is None or not part[1:].isdigit():
            raise ScheduleError(f"gemm template: unknown knob {part!r} in {text!r} (known: "
                                f"{', '.join(f'{k}N ({v})' for k, v in KNOB_LETTERS.items())})")
        out[name] = int(part[1:])
    return out


@dataclass(frozen=True)
class GemmProgram:
    """What the printer needs: the match (operands, shape, instruction), the knobs and the
    buffers of the kernel's parameters."""

    match: GemmMatch
    knobs: GemmKnobs
    a: ir.Buffer
    b: ir.Buffer
    c: ir.Buffer

    @property
    def instruction(self) -> MatrixInstruction:
        return self.match.instruction

    @property
    def threads(self) -> int:
        return self.knobs.warps_m * self.knobs.warps_n * self.instruction.threads

    @property
    def is_wgmma(self) -> bool:
        return self.instruction.kind == "wgmma"

    @property
    def grid(self) -> tuple[int, int, int]:
        if self.is_wgmma:  # one dimension: the kernel maps a block's index to its tile (the raster)
            return ((self.match.n // self.knobs.block_n) * (self.match.m // self.knobs.block_m), 1, 1)
        return (self.match.n // self.knobs.block_n, self.match.m // self.knobs.block_m, 1)

    def shared_shapes(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(A tile, B tile) as [stages, rows, row length]. Tensor Cores read A as stored
        (row-major [BM][BK]) and B as stored ([BK][BN], or [BN][BK] for a transposed B, read
        column-major); the FMA reads both k-major ([BK][BM], [BK][BN]) so that a thread's
        rows and columns of one step are contiguous. wgmma keeps each in 128-byte swizzled rows:
        A as [BM][64], B as [BN][64] when transposed, else as BN/64 atoms of [64][64]."""
        k, st, pad = self.knobs, self.knobs.stages, self.knobs.pad
        if self.is_wgmma:
            return (st, k.block_m, WGMMA_K), (st, k.block_n, WGMMA_K)
        if self.instruction.tensor_core:
            b = (st, k.block_n, k.block_k + pad) if self.match.b_transposed else (st, k.block_k, k.block_n + pad)
            return (st, k.block_m, k.block_k + pad), b
        return (st, k.block_k, k.block_m + pad), (st, k.block_k, k.block_n + pad)

    @property
    def shared_bytes(self) -> int:
        size = DTYPE_BYTES[self.a.dtype]
        return sum(math.prod(s) for s in self.shared_shapes()) * size

    @property
    def dynamic_shared_bytes(self) -> int:
        """wgmma's tiles live in dynamic shared memory, with 1 KB to align the swizzle atoms."""
        return self.shared_bytes + 1024 if self.is_wgmma else 0

    def __str__(self) -> str:
        k = self.knobs
        if self.is_wgmma:
            return (f"{self.instruction.name}: block {k.block_m}x{k.block_n}x{k.block_k}, "
                    f"{k.warps_m}x{k.warps_n} warpgroups of {k.tile_m}x{k.tile_n}, {k.stages} stages, "
                    f"{k.in_flight} batch(es) in flight, rows of blocks grouped by {k.group_rows or 1}")
        unit = {"wmma": "warps", "fma": "threads"}[self.instruction.kind]
        return (f"{self.instruction.name}: block {k.block_m}x{k.block_n}x{k.block_k}, "
                f"{k.warps_m}x{k.warps_n} {unit} of "
                f"{k.tile_m}x{k.tile_n}, {k.stages} stage(s), pad {k.pad}, {k.vector}-element loads, "
                f"unroll {k.unroll or 'all'}" + (", interleaved" if k.interleave else ""))


def gemm_template_stage(state: State) -> int | None:
    """The stage a GEMM template pragma marks, or None."""
    for sid, stage in enumerate(state.stages):
        if stage.gemm_template:
            return sid
    return None


def _inner_lengths(stage) -> dict[str, tuple[int, ...]]:
    out = {}
    for rel in stage.relations:
        if isinstance(rel, Split) and None not in rel.factors:
            out[rel.parent] = tuple(int(f) for f in rel.factors)
    return out


def program_of(state: State, sid: int, arch: int = 90) -> GemmProgram:
    """The template program a state describes; ScheduleError where its choices are not sound
    (a tile that the instruction's shape, the operands' alignment or the extents do not allow)."""
    stage = state.stages[sid]
    chosen = parse_knob_text(stage.gemm_template)
    family = tuple(i for i in INSTRUCTIONS if (i.kind == "wgmma") == bool(chosen.get("hopper")))
    match = match_gemm(stage.op, 90 if chosen.get("hopper") else arch, family)
    if match is None:
        raise ScheduleError(f"gemm template on {stage.name!r}: no matrix instruction of the program's kind "
                            f"({'wgmma' if chosen.get('hopper') else 'wmma or FMA'}) computes this stage")
    lengths = _inner_lengths(stage)
    i_axis, j_axis = (a.name for a in stage.op.axes)
    k_axis = stage.op.reduce_axes[0].name
    if len(lengths.get(i_axis, ())) != 2 or len(lengths.get(j_axis, ())) != 2 or len(lengths.get(k_axis, ())) != 1:
        raise ScheduleError(f"gemm template on {stage.name!r}: expects splits i -> [warps, rows], "
                            f"j -> [warps, columns], k -> [block_k]")
    (wm, tm), (wn, tn), (bk,) = lengths[i_axis], lengths[j_axis], lengths[k_axis]
    knobs = GemmKnobs(wm, wn, tm, tn, bk, **chosen)
    names = {id(s.tensor): s.name for s in state.stages}
    a = ir.Buffer(names[id(match.a)], match.a.shape, match.a.dtype, "global", "input")
    b = ir.Buffer(names[id(match.b)], match.b.shape, match.b.dtype, "global", "input")
    c = ir.Buffer(stage.name, (match.m, match.n), stage.op.dtype, "global", "output")
    program = GemmProgram(match, knobs, a, b, c)
    check_program(program)
    return program


def check_program(p: GemmProgram) -> None:
    """Refuse, by name, the choices the printed kernel could not compute exactly."""
    k, ins, m = p.knobs, p.instruction, p.match

    def no(why: str) -> None:
        raise ScheduleError(f"gemm template ({ins.name}): {why}")

    if p.is_wgmma:
        _check_wgmma(p, no)
        return
    if k.in_flight or k.group_rows:
        no("the knobs w (batches in flight) and g (grouped rows) belong to the wgmma template (h1)")
    if min(k.warps_m, k.warps_n, k.tile_m, k.tile_n, k.block_k, k.stages) < 1 or k.stages > 2:
        no(f"every length must be positive and stages 1 or 2, got {k}")
    if m.m % k.block_m or m.n % k.block_n or m.k % k.block_k:
        no(f"block {k.block_m}x{k.block_n}x{k.block_k} does not divide {m.m}x{m.n}x{m.k}")
    if ins.tensor_core and (k.tile_m % ins.m or k.tile_n % ins.n or k.block_k % ins.k):
        no(f"a warp's tile {k.tile_m}x{k.tile_n} and block_k {k.block_k} must be multiples of "
           f"{ins.m}x{ins.n}x{ins.k}")
    size = DTYPE_BYTES[p.a.dtype]
    if k.vector < 1 or k.vector * size > 16 or k.vector & (k.vector - 1):
        no(f"a global load of {k.vector} elements is not a power of two of at most 16 bytes")
    b_row = m.k if m.b_transposed else m.n
    b_tile = k.block_k if m.b_transposed else k.block_n
    if m.k % k.vector or b_row % k.vector or k.block_k % k.vector or b_tile % k.vector:
        no(f"{k.vector}-element loads are not aligned: rows of {m.k} and {b_row}, tiles of {k.block_k} "
           f"and {b_tile} elements")
    if k.pad % (8 if ins.tensor_core else 4):  # 16 bytes: aligned fragments and vector stores
        no(f"a shared row's padding must be a multiple of 16 bytes, got {k.pad} elements")
    if not ins.tensor_core and k.interleave and (k.tile_m % 4 or k.tile_n % 4):
        no(f"interleaved runs of 4 need a thread tile of multiples of 4, got {k.tile_m}x{k.tile_n}")
    if k.unroll < 0:
        no(f"unroll {k.unroll} is negative")


def _check_wgmma(p: GemmProgram, no) -> None:
    k, m = p.knobs, p.match
    if k.warps_m not in (1, 2) or k.warps_n not in (1, 2):
        no(f"1 or 2 warpgroups along each axis, got {k.warps_m}x{k.warps_n}")
    if k.tile_m not in (64, 128) or k.tile_n not in WGMMA_TILES_N:
        no(f"a warpgroup's tile must be 64 or 128 rows by one of {WGMMA_TILES_N} columns, got "
           f"{k.tile_m}x{k.tile_n}")
    if k.tile_m * k.tile_n // 128 > WGMMA_MAX_ACCUMULATORS:
        no(f"a warpgroup's {k.tile_m}x{k.tile_n} tile needs {k.tile_m * k.tile_n // 128} float "
           f"registers a thread, over {WGMMA_MAX_ACCUMULATORS}")
    if k.block_k != WGMMA_K:
        no(f"block_k must be {WGMMA_K} (one 128-byte swizzled row), got {k.block_k}")
    if m.m % k.block_m or m.n % k.block_n or m.k % k.block_k:
        no(f"block {k.block_m}x{k.block_n}x{k.block_k} does not divide {m.m}x{m.n}x{m.k}")
    if not 0 <= k.in_flight <= 1 or not 2 <= k.stages <= 6 or k.stages - 1 - k.in_flight < 1:
        no(f"stages 2 to 6 and 0 or 1 batch in flight, with a tile to fetch ahead; got {k.stages} "
           f"and {k.in_flight}")
    if k.pad or k.vector != 8 or k.interleave:
        no(f"tiles are swizzled, not padded, and fetched 16 bytes at a time (p0, v8, x0), got {k}")
    if k.group_rows < 0 or k.unroll < 0:
        no(f"negative knob in {k}")
    if p.dynamic_shared_bytes > HOPPER_SHARED_BYTES:
        no(f"{p.dynamic_shared_bytes} bytes of shared memory, over the {HOPPER_SHARED_BYTES} a block may take")


def lower_gemm(state: State, name: str = "kernel", arch: int = 90) -> ir.PrimFunc:
    """The IR of a GEMM template program: one kernel, written whole by the printer."""
    sid = gemm_template_stage(state)
    if sid is None:
        raise ScheduleError("not a GEMM template program")
    p = program_of(state, sid, arch)
    body = ir.WrittenProgram(p, analysis_nest(p))
    kernel = ir.GPUKernel(name, p.grid, (p.threads, 1, 1), [p.a, p.b, p.c], body,
                          dynamic_shared_bytes=p.dynamic_shared_bytes)
    static = 0 if p.is_wgmma else p.shared_bytes
    return ir.PrimFunc(name, [p.a, p.b, p.c], kernel, {"gemm_template": p, "shared_bytes": static})


# --- the same work as plain loops, for analyses ---------------------------------------------------

def analysis_nest(p: GemmProgram) -> ir.Stmt:
    """Blocks, threads, the k tiles with each thread's share of the cooperative fetches (in
    `vector`-element runs), the k steps with the thread's products into its accumulator, and
    the write-back: the loop structure and memory traffic of the printed kernel."""
    k = p.knobs
    var = {n: E.Var(n, "int32") for n in ("block", "thread", "k0", "fa", "fb", "va", "vb", "kk", "r", "c",
                                             "wr", "wc")}
    per_thread = p.threads
    a_sh = ir.Buffer("A_shared", p.shared_shapes()[0][1:], p.a.dtype, "shared")
    b_sh = ir.Buffer("B_shared", p.shared_shapes()[1][1:], p.b.dtype, "shared")
    # a thread's share of its warp's (warpgroup's) tile: 8 of a 16x16 tile (of a 64x8 one)
    share = {"wmma": (4, 8), "wgmma": (16, 8), "fma": (1, 1)}[p.instruction.kind]
    rows, cols = k.tile_m // share[0], k.tile_n // share[1]
    acc = ir.Buffer("accumulator", (rows, cols), "float32", "local")
    bm, bn, bk = k.block_m, k.block_n, k.block_k
    v = k.vector
    vr, vc = var["r"], var["c"]

    block_row = var["block"] // p.grid[0] * bm
    block_col = var["block"] % p.grid[0] * bn

    def fetch(buf: ir.Buffer, src: ir.Buffer, fv: E.Var, ev: E.Var) -> ir.Stmt:
        """Each thread's share of one tile's cooperative fetch, in runs of `vector` elements."""
        if src is p.a:
            rows_, row_len = bm, bk
        else:
            rows_, row_len = (bn, bk) if p.match.b_transposed else (bk, bn)
        steps = max(1, -(-(rows_ * row_len) // (per_thread * v)))
        flat = (fv * per_thread + var["thread"]) * v + ev
        r_, c_ = flat // row_len, flat % row_len
        if src is p.a:
            src_idx = (block_row + r_, var["k0"] * bk + c_)
        elif p.match.b_transposed:
            src_idx = (block_col + r_, var["k0"] * bk + c_)
        else:
            src_idx = (var["k0"] * bk + r_, block_col + c_)
        k_major = (not p.instruction.tensor_core and (src is p.a or p.match.b_transposed)
                   or p.is_wgmma and src is p.b and not p.match.b_transposed)
        store = ir.Store(buf, (c_, r_) if k_major else (r_, c_), ir.BufferLoad(src, src_idx))
        return ir.For(fv, steps, "serial", ir.For(ev, v, "vectorized" if v > 1 else "serial", store))

    update = ir.Store(acc, (vr, vc), ir.BufferLoad(acc, (vr, vc)) + E.Cast("float32", ir.BufferLoad(
        a_sh, (vr % a_sh.shape[0], var["kk"] % a_sh.shape[1]))) * E.Cast("float32", ir.BufferLoad(
            b_sh, (var["kk"] % b_sh.shape[0], vc % b_sh.shape[1]))))
    product = ir.For(vr, rows, "unrolled", ir.For(vc, cols, "unrolled", update))
    steps = ir.For(var["kk"], bk, "unrolled" if k.unroll == 0 else "serial", product, unroll_hint=k.unroll > 1)
    tile = ir.seq([fetch(a_sh, p.a, var["fa"], var["va"]), fetch(b_sh, p.b, var["fb"], var["vb"]), steps])
    k_loop = ir.For(var["k0"], p.match.k // bk, "serial", tile)
    write = ir.For(var["wr"], rows, "unrolled", ir.For(var["wc"], cols, "unrolled", ir.Store(
        p.c, (block_row + var["wr"], block_col + var["wc"]),
        ir.BufferLoad(acc, (var["wr"], var["wc"])))))
    init = ir.For(vr, rows, "unrolled", ir.For(vc, cols, "unrolled", ir.Store(acc, (vr, vc), E.Const(0.0, "float32"))))
    body = ir.Allocate(acc, ir.seq([init, k_loop, write]))
    for buf in (b_sh, a_sh):
        body = ir.Allocate(buf, body)
    threads = ir.For(var["thread"], per_thread, "threadIdx.x", body)
    return ir.For(var["block"], p.grid[0] * p.grid[1], "blockIdx.x", threads)
