"""The CUDA text of a Hopper GEMM template program (`lower.gemm_template`, wgmma instructions).

A block of `warps_m x warps_n` warpgroups (128 threads each) computes a block_m x block_n
tile of C; each warpgroup owns tile_m x tile_n of it as float32 accumulators in registers.

Operands: every k tile (64 deep) of A and B is copied by all threads with `cp.async`, 16
bytes at a time, into a ring of `stages` shared tiles, `stages - 1 - in_flight` tiles ahead
of the one being multiplied. Shared tiles use the 128-byte swizzle that wgmma reads: a row
of 64 16-bit values is 128 bytes, and its 16-byte chunk c is stored at chunk c ^ (row % 8),
so that the 8 rows of a core matrix sit in 8 different bank groups. A is kept K-major (its
rows as stored); B is K-major when stored [N, K] and MN-major otherwise (64-column atoms of
64 k-rows, which wgmma reads transposed), so neither operand is transposed by a thread.

Products: per k tile a warpgroup issues 4 (k steps of 16) x tile_m / 64 `wgmma.mma_async`
of shape m64 x tile_n x k16, each given two shared-memory descriptors (start address, the
byte strides between 8-row groups and between atoms, the swizzle mode), commits them as one
batch and waits until at most `in_flight` batches run, so the tensor cores work while the
next tile's copies and products are issued. The barrier at the top of each k tile orders
the copies' writes before the products' reads (with a proxy fence: wgmma reads shared memory
through the async proxy) and the products' reads of a stage before its refill.

The raster: blocks are numbered along `group_rows` rows of tiles at a time, so the blocks
running together share their A rows and B columns in L2.

The PTX is written once, in `wgmma_prelude`: small inline functions (`ansor_cp_async16`,
`ansor_wgmma_m64n128k16_f16_b1`, ...) that the kernel calls. A CPU emulation of CUDA can
define the same functions (and `ANSOR_EMULATED_WGMMA`) to run the kernel's text.
"""

from __future__ import annotations

from ansor.lower.gemm_template import WGMMA_K, GemmProgram

#: the names the kernel text declares, which the printer keeps its buffers' names clear of
WGMMA_LOCALS = frozenset("""tid warpgroup wg_m wg_n lane block_id tiles_n group first_m rows_here tile_m_index
tile_n_index block_m block_n smem_raw smem_base acc load_tile a_tile b_tile stage kt t s run r c kr cc
src dst desc_a0 desc_a1 desc_b kk row col""".split())

ROW_BYTES = 128             # one swizzled row: 64 16-bit values
GROUP_BYTES = 8 * ROW_BYTES  # 8 rows: the swizzle's period and a core matrix's height
ATOM_BYTES = WGMMA_K * ROW_BYTES  # an MN-major atom: 64 k-rows of 64 columns
_PTX_TYPE = {"float16": "f16", "bfloat16": "bf16"}
_ELEMENT = {"float16": "__half", "bfloat16": "__nv_bfloat16"}


def _descriptor(address: str, leading: int, stride: int) -> str:
    """A wgmma shared-memory matrix descriptor: the start address and the two byte offsets in
    16-byte units, and bits 62-63 = 1, the 128-byte swizzle."""
    return (f"((unsigned long long)(({address}) >> 4) & 0x3FFFull) | ({leading >> 4}ull << 16) | "
            f"({stride >> 4}ull << 32) | (1ull << 62)")


def wgmma_function(n: int, dtype: str, trans_b: int) -> str:
    """The name of the prelude's function for one m64 x n x k16 product."""
    return f"ansor_wgmma_m64n{n}k16_{_PTX_TYPE[dtype]}_b{trans_b}"


def _wgmma_definition(n: int, dtype: str, trans_b: int) -> str:
    regs = n // 2
    ptype = _PTX_TYPE[dtype]
    operands = ", ".join(f"%{r}" for r in range(regs))
    outputs = ", ".join(f'"+f"(d[{r}])' for r in range(regs))
    return (f"__device__ __forceinline__ void {wgmma_function(n, dtype, trans_b)}(float (&d)[{regs}], "
            f"unsigned long long a, unsigned long long b) {{\n"
            f'  asm volatile("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptype}.{ptype} '
            f'{{{operands}}}, %{regs}, %{regs + 1}, 1, 1, 1, 0, {trans_b};\\n"\n'
            f"    : {outputs}\n"
            f'    : "l"(a), "l"(b));\n}}\n')


_PRELUDE = """#ifndef ANSOR_EMULATED_WGMMA
#define ANSOR_DYNAMIC_SHARED(name) extern __shared__ __align__(1024) unsigned char name[]
__device__ __forceinline__ unsigned ansor_smem_address(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void ansor_cp_async16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void ansor_cp_async_commit() { asm volatile("cp.async.commit_group;\\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void ansor_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\\n" :: "n"(N) : "memory");
}
/* shared memory written by the generic proxy (cp.async), read next by wgmma (the async proxy) */
__device__ __forceinline__ void ansor_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory"); }
__device__ __forceinline__ void ansor_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory"); }
__device__ __forceinline__ void ansor_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void ansor_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\\n" :: "n"(N) : "memory");
}
"""


def wgmma_prelude(shapes: set[tuple[int, str, int]]) -> str:
    """The helper functions the kernels use: the PTX of copies, fences and waits, and one
    function per (n, dtype, trans_b) product in `shapes`; none where an emulation has its own."""
    products = "".join(_wgmma_definition(*shape) for shape in sorted(shapes))
    return _PRELUDE + products + "#endif\n"


def gemm_wgmma_body(p: GemmProgram, a: str, b: str, c: str) -> list[str]:
    """The statements of the kernel (inside its braces), indented one level."""
    k, m = p.knobs, p.match
    el = _ELEMENT[p.a.dtype]
    threads = p.threads
    bm, bn = k.block_m, k.block_n
    a_bytes = bm * ROW_BYTES
    stage_bytes = (bm + bn) * ROW_BYTES
    kt_count = m.k // WGMMA_K
    ahead = k.stages - 1 - k.in_flight          # tiles being copied while one is multiplied
    mi_count = k.tile_m // 64
    regs = k.tile_n // 2
    tiles_n, tiles_m = m.n // bn, m.m // bm
    group = k.group_rows or tiles_m
    lines = [
        "  const int tid = (int)threadIdx.x;",
        "  const int warpgroup = tid / 128, lane = tid % 128;",
        f"  const int wg_m = warpgroup / {k.warps_n}, wg_n = warpgroup % {k.warps_n};",
        "  /* the raster: group rows of tiles at a time, column by column within a group */",
        "  const int block_id = (int)blockIdx.x;",
        f"  const int first_m = block_id / ({group} * {tiles_n}) * {group};",
        f"  const int rows_here = min({tiles_m} - first_m, {group});",
        f"  const int tile_m_index = first_m + block_id % ({group} * {tiles_n}) % rows_here;",
        f"  const int tile_n_index = block_id % ({group} * {tiles_n}) / rows_here;",
        f"  const int block_m = tile_m_index * {bm}, block_n = tile_n_index * {bn};",
        "  ANSOR_DYNAMIC_SHARED(smem_raw);",
        "  /* swizzle atoms are aligned to their 1 KB period (the launch gives 1 KB extra) */",
        "  const unsigned smem_base = (ansor_smem_address(smem_raw) + 1023u) & ~1023u;",
        f"  float acc[{mi_count}][{regs}];",
        "  #pragma unroll",
        f"  for (int i = 0; i < {mi_count}; ++i)",
        "    #pragma unroll",
        f"    for (int j = 0; j < {regs}; ++j) acc[i][j] = 0.0f;",
        "  auto load_tile = [&](int kt, int stage) {",
        f"    const unsigned a_tile = smem_base + stage * {stage_bytes};",
        f"    const unsigned b_tile = a_tile + {a_bytes};",
        "    #pragma unroll",
        f"    for (int s = 0; s < {bm * 8 // threads}; ++s) {{",
        f"      const int run = s * {threads} + tid;",
        "      const int r = run >> 3, c = run & 7;",
        f"      const {el}* src = &{a}[(size_t)(block_m + r) * {m.k} + kt * {WGMMA_K} + c * 8];",
        f"      const unsigned dst = a_tile + r * {ROW_BYTES} + ((c ^ (r & 7)) << 4);",
        "      ansor_cp_async16(dst, src);",
        "    }",
        "    #pragma unroll",
        f"    for (int s = 0; s < {bn * 8 // threads}; ++s) {{",
        f"      const int run = s * {threads} + tid;",
    ]
    if m.b_transposed:  # B stored [N, K]: rows of k, as A
        lines += [
            "      const int r = run >> 3, c = run & 7;",
            f"      const {el}* src = &{b}[(size_t)(block_n + r) * {m.k} + kt * {WGMMA_K} + c * 8];",
            f"      const unsigned dst = b_tile + r * {ROW_BYTES} + ((c ^ (r & 7)) << 4);",
        ]
    else:  # B stored [K, N]: each 64-column atom holds 64 k-rows
        lines += [
            f"      const int kr = run / {bn // 8}, cc = run % {bn // 8}, c = cc & 7;",
            f"      const {el}* src = &{b}[(size_t)(kt * {WGMMA_K} + kr) * {m.n} + block_n + cc * 8];",
            f"      const unsigned dst = b_tile + (cc >> 3) * {ATOM_BYTES} + kr * {ROW_BYTES} + ((c ^ (kr & 7)) << 4);",
        ]
    lines += [
        "      ansor_cp_async16(dst, src);",
        "    }",
        "  };",
        "  #pragma unroll",
        f"  for (int t = 0; t < {ahead}; ++t) {{",
        f"    if (t < {kt_count}) load_tile(t, t);",
        "    ansor_cp_async_commit();",
        "  }",
        "  #pragma unroll 1",
        f"  for (int kt = 0; kt < {kt_count}; ++kt) {{",
        f"    ansor_cp_async_wait<{ahead - 1}>();  /* tile kt has landed */",
        "    ansor_fence_proxy_async();",
        "    __syncthreads();",
        f"    if (kt + {ahead} < {kt_count}) load_tile(kt + {ahead}, (kt + {ahead}) % {k.stages});",
        "    ansor_cp_async_commit();",
        f"    const unsigned a_tile = smem_base + (kt % {k.stages}) * {stage_bytes};",
        f"    const unsigned b_tile = a_tile + {a_bytes};",
        "    ansor_wgmma_fence();",
        "    #pragma unroll",
        "    for (int kk = 0; kk < 4; ++kk) {",
    ]
    if m.b_transposed:
        b_start = f"b_tile + wg_n * {k.tile_n * ROW_BYTES} + kk * 32"
        b_desc = _descriptor(b_start, 16, GROUP_BYTES)
    else:
        b_start = f"b_tile + wg_n * {k.tile_n // 64 * ATOM_BYTES} + kk * {16 * ROW_BYTES}"
        b_desc = _descriptor(b_start, ATOM_BYTES, GROUP_BYTES)
    lines.append(f"      const unsigned long long desc_b = {b_desc};")
    for mi in range(mi_count):
        a_start = f"a_tile + (wg_m * {k.tile_m} + {mi * 64}) * {ROW_BYTES} + kk * 32"
        lines.append(f"      const unsigned long long desc_a{mi} = {_descriptor(a_start, 16, GROUP_BYTES)};")
    product = wgmma_function(k.tile_n, p.a.dtype, 0 if m.b_transposed else 1)
    for mi in range(mi_count):
        lines.append(f"      {product}(acc[{mi}], desc_a{mi}, desc_b);")
    lines += [
        "    }",
        "    ansor_wgmma_commit();",
        f"    ansor_wgmma_wait<{k.in_flight}>();",
        "  }",
        "  ansor_wgmma_wait<0>();",
        "  /* accumulator r of a thread: row 16 * warp + lane / 4 (+ 8 for r % 4 >= 2) of its 64, */",
        "  /* column 8 * (r / 4) + 2 * (lane % 4) + r % 2 */",
        "  #pragma unroll",
        f"  for (int i = 0; i < {mi_count}; ++i) {{",
        f"    const int row = block_m + wg_m * {k.tile_m} + i * 64 + (lane / 32) * 16 + (lane % 32) / 4;",
        "    #pragma unroll",
        f"    for (int j = 0; j < {k.tile_n // 8}; ++j) {{",
        f"      const int col = block_n + wg_n * {k.tile_n} + j * 8 + (lane % 4) * 2;",
        f"      *(float2*)&{c}[(size_t)row * {m.n} + col] = make_float2(acc[i][4 * j], acc[i][4 * j + 1]);",
        f"      *(float2*)&{c}[(size_t)(row + 8) * {m.n} + col] = make_float2(acc[i][4 * j + 2], acc[i][4 * j + 3]);",
        "    }",
        "  }",
    ]
    return lines
