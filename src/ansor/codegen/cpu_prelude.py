"""The definitions a CPU kernel may need ahead of its functions, one `PreludePiece` each: the
vectorizable float32 math and the GCC vector types, shuffle and register pin of register tiles
and transposed stores. The printer emits only the pieces the kernel uses."""

from __future__ import annotations

from ansor.codegen.c_like import PreludePiece

HEADER = """\
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
"""

# float32 math that goes to these definitions instead of libm (float64 stays on libm)
VECTOR_MATH = ("exp", "erf", "tanh", "log")

_VECMATH = """\
/* float32 exp, erf, tanh, log that gcc vectorizes inside `omp simd` loops (it keeps libm's expf
   etc. as scalar calls without -ffast-math). Only selects, integer bit tricks and mul/add: no
   calls, no branches, and no float op inside a ?: arm (with trapping math such arms stay branches).
   Accuracy, checked over every float against double libm: exp <= 1.1 ulp (results below
   FLT_MIN flushed to 0), erf <= 5e-7 absolute, tanh <= 3e-7 absolute, log <= 1 ulp. */
#define ANSOR_VECMATH static inline __attribute__((always_inline)) float
"""

_BITS = """\
typedef union { float f; int32_t i; } ansor_bits;
"""

_EXPF = """\
ANSOR_VECMATH ansor_expf(float x) {  /* x = n ln2 + r, |r| <= ln2/2 */
  float xc = x < -87.33654f ? -87.33654f : x; /* just above ln(FLT_MIN): results stay normal (denormals are slow); NaN passes */
  xc = xc > 88.75f ? 88.75f : xc;             /* above ln(FLT_MAX): the result still overflows to inf */
  float n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;  /* + 1.5*2^23 rounds to an integer, no roundf call */
  float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;    /* Cody-Waite: ln2 in two parts keeps r exact */
  float p = 1.9875691500e-4f;                 /* e^r = 1 + r + r^2 P(r), Cephes expf coefficients */
  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t k = (int32_t)n;                     /* 2^n as 2^(k/2) 2^(k-k/2): both normal for n in [-126, 128] */
  ansor_bits s1, s2;
  s1.i = ((k >> 1) + 127) << 23;
  s2.i = ((k - (k >> 1)) + 127) << 23;
  float y = p * s1.f * s2.f;
  return x < -87.33654f ? 0.0f : y;           /* results below FLT_MIN flush to 0; exp(-INFINITY) == 0 */
}
"""

_ERFF = """\
ANSOR_VECMATH ansor_erff(float x) {  /* x P(x^2) / Q(x^2) on [-4, 4], Eigen's generic_fast_erf_float coefficients */
  float xc = x < -4.0f ? -4.0f : x;           /* erf(+-4) rounds to +-1 in float32; NaN passes */
  xc = xc > 4.0f ? 4.0f : xc;
  float z = xc * xc, p = -2.72614225801306e-10f, q = -1.45660718464996e-05f;
  p = p * z + 2.77068142495902e-08f; p = p * z - 2.10102402082508e-06f; p = p * z - 5.69250639462346e-05f;
  p = p * z - 7.34990630326855e-04f; p = p * z - 2.95459980854025e-03f; p = p * z - 1.60960333262415e-02f;
  q = q * z - 2.13374055278905e-04f; q = q * z - 1.68282697438203e-03f; q = q * z - 7.37332916720468e-03f;
  q = q * z - 1.42647390514189e-02f;
  return xc * p / q;
}
"""

_TANHF = """\
ANSOR_VECMATH ansor_tanhf(float x) {  /* x P(x^2) / Q(x^2), Eigen's generic_fast_tanh_float coefficients */
  float xc = x < -7.90531110763549805f ? -7.90531110763549805f : x;  /* tanh rounds to +-1 beyond */
  xc = xc > 7.90531110763549805f ? 7.90531110763549805f : xc;
  float z = xc * xc, p = -2.76076847742355e-16f, q = 1.19825839466702e-06f;
  p = p * z + 2.00018790482477e-13f; p = p * z - 8.60467152213735e-11f; p = p * z + 5.12229709037114e-08f;
  p = p * z + 1.48572235717979e-05f; p = p * z + 6.37261928875436e-04f; p = p * z + 4.89352455891786e-03f;
  q = q * z + 1.18534705686654e-04f; q = q * z + 2.26843463243900e-03f; q = q * z + 4.89352518554385e-03f;
  return xc * p / q;
}
"""

_LOGF = """\
ANSOR_VECMATH ansor_logf(float x) {  /* x = 2^e m, m in [sqrt(1/2), sqrt(2)), f = m - 1 */
  ansor_bits u, k;
  u.f = x;
  k.i = (u.i & 0x7f800000) ? 0x3f800000 : 0x4b000000;  /* denormal x: scale by 2^23 (an int select) */
  u.f = x * k.f;
  int32_t mant = u.i & 0x007fffff;
  int32_t big = (0x003504f3 - mant) >> 31;    /* -1 where the mantissa is above sqrt(2): m/2, e+1 */
  int32_t e = ((u.i >> 23) & 0xff) - (k.i >> 23) - big;
  u.i = mant | (0x3f800000 - (big & 0x00800000));
  float f = u.f - 1.0f, fe = (float)e, z = f * f;
  float p = 7.0376836292e-2f;                 /* log(m) = f - f^2/2 + f^3 P(f), Cephes logf coefficients */
  p = p * f - 1.1514610310e-1f; p = p * f + 1.1676998740e-1f; p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f; p = p * f - 1.6668057665e-1f; p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f; p = p * f + 3.3333331174e-1f;
  float y = f * z * p + fe * -2.12194440e-4f - 0.5f * z + f + fe * 0.693359375f;
  /* y is finite for every x: adding +-inf or NaN gives the special cases without a branch */
  return y + (x >= 0.0f ? (x == 0.0f ? -INFINITY : (x == INFINITY ? INFINITY : 0.0f)) : NAN);
}
"""

_VECTOR_TYPES = """\
/* GCC vector types of register tiles and transposed stores (unaligned, may alias float) */
"""

_SHUFFLE = """\
/* two-input lane shuffle (transposed stores): gcc has __builtin_shuffle with a mask vector since
   4.7 but __builtin_shufflevector only since 12; clang has only the latter */
#if defined(__clang__)
#define ANSOR_SHUFFLE(a, b, mask_type, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define ANSOR_SHUFFLE(a, b, mask_type, ...) __builtin_shuffle(a, b, (mask_type){__VA_ARGS__})
#endif
"""

_PIN = """\
/* a pin keeps a loaded vector in a register instead of re-reading it as a memory operand of
   every FMA; a no-op where no register holds the vector */
#define ANSOR_PIN_ASM(v) __asm__("" : "+v"(v))
#define ANSOR_PIN_NONE(v) ((void)0)
"""


def _pin(bytes_: int, feature: str) -> PreludePiece:
    text = (f"#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && defined({feature})\n"
            f"#define ANSOR_PIN{bytes_} ANSOR_PIN_ASM\n#else\n#define ANSOR_PIN{bytes_} ANSOR_PIN_NONE\n#endif\n")
    return PreludePiece(f"ANSOR_PIN{bytes_}", text, "vector", ("ANSOR_PIN_ASM",))


def _vector_type(element: str, lanes: int) -> PreludePiece:
    if element == "f32":
        text = (f"typedef float ansor_f32x{lanes} __attribute__((vector_size({4 * lanes}), aligned(4), "
                f"__may_alias__));\n")
    else:
        text = f"typedef int32_t ansor_i32x{lanes} __attribute__((vector_size({4 * lanes})));\n"
    return PreludePiece(f"ansor_{element}x{lanes}", text, "vector", ("ansor_vector_types",))


_WORD32 = """\
#include <immintrin.h>
/* 4 bytes (a dot-product instruction's row operand) as one 32-bit word, at any alignment */
static inline int32_t ansor_word32(const void* p) { int32_t v; __builtin_memcpy(&v, p, 4); return v; }
"""

_AMX = """\
/* AMX tiles. Registers 0-5 hold `rows` rows (the accumulators and the row operands), 6-7 hold
   16 (the packed operands: one row per step of the vector instruction's depth); every row is
   64 bytes. Linux hands the tile state to a process that asks for it (ARCH_REQ_XCOMP_PERM).
   The configuration is loaded before every tile block: another library (oneDNN) may have
   loaded its own on this thread in between. ANSOR_AMX_EMULATION: the same instructions in
   plain C (tests/amx_emulation.h), for checking programs on CPUs without AMX. */
#ifdef ANSOR_AMX_EMULATION
#include "amx_emulation.h"
#else
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define ansor_tile_loadd(t, p, stride) _tile_loadd(t, p, stride)
#define ansor_tile_stored(t, p, stride) _tile_stored(t, p, stride)
#define ansor_tile_dpbusd(c, a, b) _tile_dpbusd(c, a, b)
#define ansor_tile_dpbf16ps(c, a, b) _tile_dpbf16ps(c, a, b)
static void ansor_amx_configure(int rows) {
  static volatile int permitted = 0;
  if (!permitted) { syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */); permitted = 1; }
  unsigned char config[64] = {1};  /* palette 1 */
  for (int t = 0; t < 8; ++t) {
    config[16 + 2 * t] = 64;                   /* bytes per row (little-endian 16-bit) */
    config[48 + t] = (unsigned char)(t < 6 ? rows : 16);
  }
  _tile_loadconfig(config);
}
#endif
"""

PIECES: tuple[PreludePiece, ...] = (
    PreludePiece("ansor_word32", _WORD32, "dot products"),
    PreludePiece("ansor_amx_configure", _AMX, "dot products"),
    PreludePiece("ANSOR_VECMATH", _VECMATH, "vecmath"),
    PreludePiece("ansor_bits", _BITS, "vecmath"),
    PreludePiece("ansor_expf", _EXPF, "vecmath", ("ANSOR_VECMATH", "ansor_bits")),
    PreludePiece("ansor_erff", _ERFF, "vecmath", ("ANSOR_VECMATH",)),
    PreludePiece("ansor_tanhf", _TANHF, "vecmath", ("ANSOR_VECMATH",)),
    PreludePiece("ansor_logf", _LOGF, "vecmath", ("ANSOR_VECMATH", "ansor_bits")),
    PreludePiece("ansor_vector_types", _VECTOR_TYPES, "vector"),
    *(_vector_type("f32", n) for n in (4, 8, 16)),
    *(_vector_type("i32", n) for n in (4, 8, 16)),
    PreludePiece("ANSOR_SHUFFLE", _SHUFFLE, "vector"),
    PreludePiece("ANSOR_PIN_ASM", _PIN, "vector"),
    _pin(16, "__SSE__"),
    _pin(32, "__AVX__"),
    _pin(64, "__AVX512F__"),
)
