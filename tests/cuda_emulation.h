/* Runs a generated CUDA kernel's text on the CPU, for tests: every block in turn, its threads
   as std::threads meeting at a std::barrier for __syncthreads, __shared__ arrays as statics
   (one block at a time shares them), and WMMA fragments as whole 16x16 tiles that each thread
   of a warp holds and computes in full (the collective operations' meaning, computed 32 times).
   float16 is _Float16; bfloat16 is its bits, rounded to nearest even on conversion. */
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

using std::min;
using std::max;
struct emu_dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local emu_dim3 threadIdx, blockIdx;
inline std::barrier<>* emu_block_barrier = nullptr;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __syncthreads() emu_block_barrier->arrive_and_wait()

struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }

typedef _Float16 __half;
struct __nv_bfloat16 { uint16_t bits; };
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half_rn(float x) { return (__half)x; }
inline float __bfloat162float(__nv_bfloat16 h) { uint32_t u = (uint32_t)h.bits << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  uint32_t u; std::memcpy(&u, &x, 4);
  u = (u & 0x7fffffffu) > 0x7f800000u ? ((u & 0x80000000u) | 0x7fc00000u) : u + 0x7fffu + ((u >> 16) & 1u);
  return {(uint16_t)(u >> 16)};
}
inline float emu_float(float x) { return x; }
inline float emu_float(__half x) { return (float)x; }
inline float emu_float(__nv_bfloat16 x) { return __bfloat162float(x); }

namespace nvcuda { namespace wmma {
struct matrix_a {}; struct matrix_b {}; struct accumulator {};
struct row_major {}; struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment { float x[16 * 16]; };  /* [row][col]: A (m, k), B (k, n), C (m, n) */

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.x[r * 16 + c] = emu_float(std::is_same<Layout, col_major>::value ? p[c * ldm + r] : p[r * ldm + c]);
}
template <typename T>
void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, T v) { for (float& x : f.x) x = (float)v; }
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[256];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float s = c.x[i * 16 + j];
      for (int k = 0; k < 16; ++k) s += a.x[i * 16 + k] * b.x[k * 16 + j];
      out[i * 16 + j] = s;
    }
  std::memcpy(d.x, out, sizeof out);
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) p[r * ldm + c] = f.x[r * 16 + c];
}
}}  // namespace nvcuda::wmma

/* launch `kernel` on a grid of blocks, one block after another */
template <typename F>
void emu_launch(F kernel, emu_dim3 grid, unsigned threads) {
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      std::barrier<> barrier((std::ptrdiff_t)threads);
      emu_block_barrier = &barrier;
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, t] { threadIdx = {t, 0, 0}; blockIdx = {bx, by, 0}; kernel(); });
      for (auto& th : pool) th.join();
    }
}

/* Hopper's wgmma template (ansor.codegen.gemm_wgmma): dynamic shared memory is one static
   array whose offsets stand for shared addresses; cp.async is a plain copy; a product reads
   its operands through the descriptors as the PTX ISA's canonical 128-byte-swizzled layouts
   say (K-major: 8-row groups SBO apart, 16 k contiguous; MN-major: 64-wide atoms LBO apart,
   8-k-row groups SBO apart; the 16-byte chunk of an address XORed with its 128-byte row mod
   8), and each thread computes its own accumulators in the fragment layout. */
#define ANSOR_EMULATED_WGMMA 1
inline unsigned char* emu_smem = nullptr;
#define ANSOR_DYNAMIC_SHARED(name) alignas(1024) static unsigned char name[232448 + 1024]; emu_smem = name
inline unsigned ansor_smem_address(const void* p) { return (unsigned)((const unsigned char*)p - emu_smem); }
inline void ansor_cp_async16(unsigned dst, const void* src) { std::memcpy(emu_smem + dst, src, 16); }
inline void ansor_cp_async_commit() {}
template <int N> void ansor_cp_async_wait() {}
inline void ansor_fence_proxy_async() {}
inline void ansor_wgmma_fence() {}
inline void ansor_wgmma_commit() {}
template <int N> void ansor_wgmma_wait() {}

inline unsigned emu_swizzle128(unsigned address) { return address ^ (((address >> 7) & 7u) << 4); }
template <typename T>
float emu_operand(unsigned long long desc, int mn, int k, bool mn_major) {
  if ((desc >> 62) != 1) { std::fprintf(stderr, "emulation: only the 128-byte swizzle\n"); std::abort(); }
  const unsigned start = (unsigned)(desc & 0x3FFFull) << 4;
  const unsigned leading = (unsigned)((desc >> 16) & 0x3FFFull) << 4;
  const unsigned stride = (unsigned)((desc >> 32) & 0x3FFFull) << 4;
  const unsigned size = (unsigned)sizeof(T);
  unsigned address = mn_major
      ? start + (mn % 64) * size + (mn / 64) * leading + (k % 8) * 128 + (k / 8) * stride
      : start + (mn % 8) * 128 + (mn / 8) * stride + k * size;
  T value;
  std::memcpy(&value, emu_smem + emu_swizzle128(address), sizeof(T));
  return emu_float(value);
}
template <int N, typename T, int TRANS_B>
void emu_wgmma(float (&d)[N / 2], unsigned long long a, unsigned long long b) {
  const int lane = (int)(threadIdx.x % 128);
  for (int r = 0; r < N / 2; ++r) {
    const int row = 16 * (lane / 32) + (lane % 32) / 4 + 8 * ((r % 4) / 2);
    const int col = 8 * (r / 4) + 2 * (lane % 4) + r % 2;
    float sum = d[r];
    for (int k = 0; k < 16; ++k) sum += emu_operand<T>(a, row, k, false) * emu_operand<T>(b, col, k, TRANS_B);
    d[r] = sum;
  }
}
#define EMU_WGMMA(N, NAME, T) \
  inline void ansor_wgmma_m64n##N##k16_##NAME##_b0(float (&d)[N / 2], unsigned long long a, unsigned long long b) { emu_wgmma<N, T, 0>(d, a, b); } \
  inline void ansor_wgmma_m64n##N##k16_##NAME##_b1(float (&d)[N / 2], unsigned long long a, unsigned long long b) { emu_wgmma<N, T, 1>(d, a, b); }
EMU_WGMMA(64, f16, __half) EMU_WGMMA(128, f16, __half) EMU_WGMMA(192, f16, __half) EMU_WGMMA(256, f16, __half)
EMU_WGMMA(64, bf16, __nv_bfloat16) EMU_WGMMA(128, bf16, __nv_bfloat16) EMU_WGMMA(192, bf16, __nv_bfloat16)
EMU_WGMMA(256, bf16, __nv_bfloat16)
