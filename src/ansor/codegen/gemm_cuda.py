"""The CUDA text of a GEMM template program (`lower.gemm_template`): a block computes a
block_m x block_n tile of C over the reduction in block_k steps.

Per k tile, every thread fetches its share of the A and B tiles from global memory in runs
of `vector` elements (one 128-bit load per run where the knobs chose 8 float16 or 4 float32)
into registers and stores them to shared memory; with two stages the next tile's loads are
issued before this tile's products, so they are in flight while the arithmetic runs, and
land in the other shared buffer afterwards (one barrier per tile). Shared rows are padded by
`pad` elements against bank conflicts.

Tensor Cores: each warp owns a tile_m x tile_n tile of C as 16x16 float32 accumulator
fragments (`nvcuda::wmma`); per 16-step of k it loads its A and B fragments from shared
memory (A row-major, B row- or column-major as B is stored) and issues one mma_sync per
accumulator; the fragments are stored straight to C. FMA (sgemm): each thread owns a tile_m
x tile_n register tile; A and B are kept k-major in shared memory, so one k step's rows
and columns of a thread are contiguous (read 128 bits at a time, in runs of 4 spread over the
block when interleaved) and every product is one fused multiply-add.
"""

from __future__ import annotations

from ansor.lower.gemm_template import WARP, GemmProgram

_VECTOR_BITS = {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short"}
_FLOAT_VECTORS = {4: "float4", 2: "float2", 1: "float"}
_LANES = "xyzw"
_ELEMENT = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float"}
WMMA = "nvcuda::wmma"
#: the names the kernel text declares, which the printer keeps its buffers' names clear of
TEMPLATE_LOCALS = frozenset("""tid block_m block_n A_shared B_shared A_shared_stage B_shared_stage warp warp_m
warp_n thread_m thread_n acc a_frag b_frag a_reg b_reg kt cur kk run r c s i j v out nvcuda""".split())


def _unroll(factor: int) -> str:
    return "#pragma unroll" if factor == 0 else f"#pragma unroll {factor}"


class _Fetch:
    """One operand's cooperative fetch: a tile of `rows` x `length` elements (`length` along the
    operand's contiguous dimension) at (`row0`, `col0`) of a global array with rows of `ld`."""

    def __init__(self, p: GemmProgram, name: str, shared: str, rows: int, length: int, ld: int,
                 row0: str, col0: str, k_major: bool):
        self.p, self.name, self.shared = p, name, shared
        self.rows, self.length, self.ld = rows, length, ld
        self.row0, self.col0, self.k_major = row0, col0, k_major
        k = p.knobs
        self.v = k.vector
        self.runs = rows * length // self.v
        self.steps = -(-self.runs // p.threads)
        self.ragged = self.runs % p.threads != 0
        size = 4 if p.a.dtype == "float32" else 2
        self.vtype = _FLOAT_VECTORS[self.v] if k_major else _VECTOR_BITS[self.v * size]
        self.stage = f"{shared}_stage"

    def declare(self) -> str:
        return f"{self.vtype} {self.stage}[{self.steps}];"

    def _each(self, lines: list[str], depth: int, body) -> None:
        pad = "  " * depth
        per_row = self.length // self.v
        lines.append(f"{pad}#pragma unroll")
        lines.append(f"{pad}for (int s = 0; s < {self.steps}; ++s) {{")
        lines.append(f"{pad}  const int run = s * {self.p.threads} + tid;")
        inner = depth + 1
        if self.ragged:
            lines.append(f"{pad}  if (run < {self.runs}) {{")
            inner += 1
        ipad = "  " * inner
        lines.append(f"{ipad}const int r = run / {per_row}, c = (run % {per_row}) * {self.v};")
        body(lines, ipad)
        if self.ragged:
            lines.append(f"{pad}  }}")
        lines.append(f"{pad}}}")

    def load(self, lines: list[str], depth: int, kt: str) -> None:
        """Global loads of tile `kt` into the thread's registers."""
        col0 = self.col0.format(kt=kt)
        row0 = self.row0.format(kt=kt)

        def body(out, ipad):
            out.append(f"{ipad}{self.stage}[s] = *(const {self.vtype}*)&{self.name}[({row0} + r) * {self.ld} "
                       f"+ {col0} + c];")
        self._each(lines, depth, body)

    def store(self, lines: list[str], depth: int, buf: str) -> None:
        """The registers into shared buffer `buf` (transposed when the tile is kept k-major)."""
        def body(out, ipad):
            if not self.k_major:
                out.append(f"{ipad}*({self.vtype}*)&{self.shared}[{buf}][r][c] = {self.stage}[s];")
            elif self.v == 1:
                out.append(f"{ipad}{self.shared}[{buf}][c][r] = {self.stage}[s];")
            else:
                for e in range(self.v):
                    out.append(f"{ipad}{self.shared}[{buf}][c + {e}][r] = {self.stage}[s].{_LANES[e]};")
        self._each(lines, depth, body)


def _fetches(p: GemmProgram, a: str, b: str) -> tuple[_Fetch, _Fetch]:
    k, m = p.knobs, p.match
    fma = not p.instruction.tensor_core
    fa = _Fetch(p, a, "A_shared", k.block_m, k.block_k, m.k, "block_m", "{kt} * %d" % k.block_k, fma)
    if m.b_transposed:
        fb = _Fetch(p, b, "B_shared", k.block_n, k.block_k, m.k, "block_n", "{kt} * %d" % k.block_k, fma)
    else:
        fb = _Fetch(p, b, "B_shared", k.block_k, k.block_n, m.n, "{kt} * %d" % k.block_k, "block_n", False)
    return fa, fb


def _position(index: str, run_of: str, tile: int, threads: int, interleave: int) -> str:
    """The row (or column) within the block of a thread's element `index`."""
    if interleave:
        return f"(({index}) / 4) * {4 * threads} + {run_of} * 4 + ({index}) % 4"
    return f"{run_of} * {tile} + ({index})"


def gemm_cuda_body(p: GemmProgram, a: str, b: str, c: str) -> list[str]:
    """The statements of the kernel (inside its braces), indented one level."""
    k, m = p.knobs, p.match
    el = _ELEMENT[p.a.dtype]
    (sa, ra, la), (sb, rb, lb) = p.shared_shapes()
    fa, fb = _fetches(p, a, b)
    kt_count = m.k // k.block_k
    lines = [
        "  const int tid = (int)threadIdx.x;",
        f"  const int block_m = (int)blockIdx.y * {k.block_m};",
        f"  const int block_n = (int)blockIdx.x * {k.block_n};",
        f"  __shared__ __align__(32) {el} A_shared[{sa}][{ra}][{la}];",
        f"  __shared__ __align__(32) {el} B_shared[{sb}][{rb}][{lb}];",
        "  " + fa.declare(),
        "  " + fb.declare(),
    ]
    tc = p.instruction.tensor_core
    fm, fn = (k.tile_m // 16, k.tile_n // 16) if tc else (k.tile_m, k.tile_n)
    if tc:
        lines += [
            f"  const int warp = tid / {WARP};",
            f"  const int warp_m = warp / {k.warps_n}, warp_n = warp % {k.warps_n};",
            f"  {WMMA}::fragment<{WMMA}::accumulator, 16, 16, 16, float> acc[{fm}][{fn}];",
            "  #pragma unroll",
            f"  for (int i = 0; i < {fm}; ++i)",
            "    #pragma unroll",
            f"    for (int j = 0; j < {fn}; ++j) {WMMA}::fill_fragment(acc[i][j], 0.0f);",
        ]
    else:
        lines += [
            f"  const int thread_m = tid / {k.warps_n}, thread_n = tid % {k.warps_n};",
            f"  float acc[{fm}][{fn}];",
            "  #pragma unroll",
            f"  for (int i = 0; i < {fm}; ++i)",
            "    #pragma unroll",
            f"    for (int j = 0; j < {fn}; ++j) acc[i][j] = 0.0f;",
        ]

    def compute(depth: int, buf: str) -> list[str]:
        pad = "  " * depth
        out = [f"{pad}{_unroll(k.unroll)}"]
        if tc:
            b_layout = "col_major" if m.b_transposed else "row_major"
            b_at = (f"&B_shared[{buf}][warp_n * {k.tile_n} + j * 16][kk]" if m.b_transposed
                    else f"&B_shared[{buf}][kk][warp_n * {k.tile_n} + j * 16]")
            out += [
                f"{pad}for (int kk = 0; kk < {k.block_k}; kk += 16) {{",
                f"{pad}  {WMMA}::fragment<{WMMA}::matrix_a, 16, 16, 16, {el}, {WMMA}::row_major> a_frag[{fm}];",
                f"{pad}  {WMMA}::fragment<{WMMA}::matrix_b, 16, 16, 16, {el}, {WMMA}::{b_layout}> b_frag[{fn}];",
                f"{pad}  #pragma unroll",
                f"{pad}  for (int i = 0; i < {fm}; ++i) {WMMA}::load_matrix_sync(a_frag[i], "
                f"&A_shared[{buf}][warp_m * {k.tile_m} + i * 16][kk], {la});",
                f"{pad}  #pragma unroll",
                f"{pad}  for (int j = 0; j < {fn}; ++j) {WMMA}::load_matrix_sync(b_frag[j], {b_at}, {lb});",
                f"{pad}  #pragma unroll",
                f"{pad}  for (int i = 0; i < {fm}; ++i)",
                f"{pad}    #pragma unroll",
                f"{pad}    for (int j = 0; j < {fn}; ++j) {WMMA}::mma_sync(acc[i][j], a_frag[i], b_frag[j], acc[i][j]);",
                f"{pad}}}",
            ]
            return out
        out += [f"{pad}for (int kk = 0; kk < {k.block_k}; ++kk) {{",
                f"{pad}  float a_reg[{fm}], b_reg[{fn}];"]
        for reg, tile, threads, who, shared, n in (("a_reg", k.tile_m, k.warps_m, "thread_m", "A_shared", fm),
                                                   ("b_reg", k.tile_n, k.warps_n, "thread_n", "B_shared", fn)):
            step = 4 if n % 4 == 0 else 1
            out.append(f"{pad}  #pragma unroll")
            out.append(f"{pad}  for (int i = 0; i < {n}; i += {step}) {{")
            at = f"{shared}[{buf}][kk][{_position('i', who, tile, threads, k.interleave)}]"
            if step == 4:
                out.append(f"{pad}    const float4 v = *(const float4*)&{at};")
                out.append(f"{pad}    {reg}[i] = v.x; {reg}[i + 1] = v.y; {reg}[i + 2] = v.z; {reg}[i + 3] = v.w;")
            else:
                out.append(f"{pad}    {reg}[i] = {at};")
            out.append(f"{pad}  }}")
        out += [f"{pad}  #pragma unroll",
                f"{pad}  for (int i = 0; i < {fm}; ++i)",
                f"{pad}    #pragma unroll",
                f"{pad}    for (int j = 0; j < {fn}; ++j) acc[i][j] = fmaf(a_reg[i], b_reg[j], acc[i][j]);",
                f"{pad}}}"]
        return out

    if k.stages == 2:
        fa.load(lines, 1, "0")
        fb.load(lines, 1, "0")
        fa.store(lines, 1, "0")
        fb.store(lines, 1, "0")
        lines += ["  __syncthreads();", "  #pragma unroll 1", f"  for (int kt = 0; kt < {kt_count}; ++kt) {{",
                  "    const int cur = kt & 1;", f"    if (kt + 1 < {kt_count}) {{  /* the next tile's loads in flight */"]
        fa.load(lines, 3, "(kt + 1)")
        fb.load(lines, 3, "(kt + 1)")
        lines.append("    }")
        lines += compute(2, "cur")
        lines.append(f"    if (kt + 1 < {kt_count}) {{  /* into the buffer no thread reads now */")
        fa.store(lines, 3, "cur ^ 1")
        fb.store(lines, 3, "cur ^ 1")
        lines += ["    }", "    __syncthreads();", "  }"]
    else:
        lines += ["  #pragma unroll 1", f"  for (int kt = 0; kt < {kt_count}; ++kt) {{"]
        fa.load(lines, 2, "kt")
        fb.load(lines, 2, "kt")
        fa.store(lines, 2, "0")
        fb.store(lines, 2, "0")
        lines.append("    __syncthreads();")
        lines += compute(2, "0")
        lines += ["    __syncthreads();", "  }"]

    if tc:
        lines += [
            "  #pragma unroll",
            f"  for (int i = 0; i < {fm}; ++i)",
            "    #pragma unroll",
            f"    for (int j = 0; j < {fn}; ++j)",
            f"      {WMMA}::store_matrix_sync(&{c}[(block_m + warp_m * {k.tile_m} + i * 16) * {m.n} + block_n "
            f"+ warp_n * {k.tile_n} + j * 16], acc[i][j], {m.n}, {WMMA}::mem_row_major);",
        ]
        return lines
    step = 4 if fn % 4 == 0 and (k.interleave or k.tile_n % 4 == 0) else 1
    row = _position("i", "thread_m", k.tile_m, k.warps_m, k.interleave)
    col = _position("j", "thread_n", k.tile_n, k.warps_n, k.interleave)
    lines += ["  #pragma unroll", f"  for (int i = 0; i < {fm}; ++i) {{",
              "    #pragma unroll", f"    for (int j = 0; j < {fn}; j += {step}) {{",
              f"      float* out = &{c}[(block_m + {row}) * {m.n} + block_n + {col}];"]
    if step == 4:
        lines.append("      *(float4*)out = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);")
    else:
        lines.append("      *out = acc[i][j];")
    lines += ["    }", "  }"]
    return lines
