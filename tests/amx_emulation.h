/* AMX's tile instructions in plain C, as Intel's instruction reference defines them, so that
   programs written for AMX can be run and checked on CPUs without it. Compiled into a kernel
   with -DANSOR_AMX_EMULATION and this folder on the include path (the prelude includes this
   file instead of <immintrin.h>'s tile intrinsics).

   The tile configuration is the one `ansor_amx_configure` loads: tiles 0-5 have `rows` rows,
   tiles 6-7 have 16; every row is 64 bytes. */
#ifndef ANSOR_AMX_EMULATION_H
#define ANSOR_AMX_EMULATION_H

#include <stdint.h>
#include <string.h>

static __thread unsigned char ansor_emulated_tiles[8][16][64];
static __thread int ansor_emulated_rows[8];
static __thread int ansor_emulated_configured;

static inline void ansor_amx_configure(int rows) {
  for (int t = 0; t < 8; ++t) ansor_emulated_rows[t] = t < 6 ? rows : 16;
  memset(ansor_emulated_tiles, 0, sizeof ansor_emulated_tiles);  /* ldtilecfg zeroes the tiles */
  ansor_emulated_configured = 1;
}

static inline void ansor_emulated_check(int t) {
  if (!ansor_emulated_configured || t < 0 || t > 7) __builtin_trap();  /* #UD on real hardware */
}

static inline void ansor_tile_loadd(int t, const void* base, long stride) {
  ansor_emulated_check(t);
  for (int r = 0; r < ansor_emulated_rows[t]; ++r)
    memcpy(ansor_emulated_tiles[t][r], (const unsigned char*)base + r * stride, 64);
}

static inline void ansor_tile_stored(int t, void* base, long stride) {
  ansor_emulated_check(t);
  for (int r = 0; r < ansor_emulated_rows[t]; ++r)
    memcpy((unsigned char*)base + r * stride, ansor_emulated_tiles[t][r], 64);
}

/* c[m][n] += sum over k < 16, i < 4 of u8 a[m][4k+i] * s8 b[k][4n+i], int32 lanes wrapping */
static inline void ansor_tile_dpbusd(int c, int a, int b) {
  ansor_emulated_check(c); ansor_emulated_check(a); ansor_emulated_check(b);
  if (ansor_emulated_rows[c] != ansor_emulated_rows[a] || ansor_emulated_rows[b] != 16) __builtin_trap();
  for (int m = 0; m < ansor_emulated_rows[c]; ++m) {
    for (int n = 0; n < 16; ++n) {
      int32_t acc;
      memcpy(&acc, &ansor_emulated_tiles[c][m][4 * n], 4);
      uint32_t sum = (uint32_t)acc;
      for (int k = 0; k < 16; ++k)
        for (int i = 0; i < 4; ++i)
          sum += (uint32_t)((int32_t)ansor_emulated_tiles[a][m][4 * k + i]
                            * (int32_t)(int8_t)ansor_emulated_tiles[b][k][4 * n + i]);
      acc = (int32_t)sum;
      memcpy(&ansor_emulated_tiles[c][m][4 * n], &acc, 4);
    }
  }
}

static inline float ansor_emulated_bf16(const unsigned char* p) {
  uint16_t h;
  memcpy(&h, p, 2);
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* c[m][n] += sum over k < 16 of a[m][2k] * b[k][2n] + a[m][2k+1] * b[k][2n+1], in float32 */
static inline void ansor_tile_dpbf16ps(int c, int a, int b) {
  ansor_emulated_check(c); ansor_emulated_check(a); ansor_emulated_check(b);
  if (ansor_emulated_rows[c] != ansor_emulated_rows[a] || ansor_emulated_rows[b] != 16) __builtin_trap();
  for (int m = 0; m < ansor_emulated_rows[c]; ++m) {
    for (int n = 0; n < 16; ++n) {
      float acc;
      memcpy(&acc, &ansor_emulated_tiles[c][m][4 * n], 4);
      for (int k = 0; k < 16; ++k)
        for (int i = 0; i < 2; ++i)
          acc += ansor_emulated_bf16(&ansor_emulated_tiles[a][m][4 * k + 2 * i])
                 * ansor_emulated_bf16(&ansor_emulated_tiles[b][k][4 * n + 2 * i]);
      memcpy(&ansor_emulated_tiles[c][m][4 * n], &acc, 4);
    }
  }
}

#endif
