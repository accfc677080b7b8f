"""C code generation for the CPU: OpenMP for parallel loops, `omp simd` for vectorized loops,
GCC unroll pragmas for unrolled loops, small local arrays for attached stages.

Every user-given name passes through `CNames`, which keeps only [A-Za-z0-9_], avoids C keywords
and makes names unique, so no declaration text reaches the compiler unsanitized.
"""

from __future__ import annotations

import math
import re

from ansor.codegen.register_tile import VECTOR_PRELUDE, emit_register_tile, plan_register_tile
from ansor.codegen.transposed_store import emit_transposed_store, plan_transposed_store
from ansor.lower import ir
from ansor.te import expr as E
from ansor.te.arith import const_bounds, simplify

C_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t", "bool": "bool"}
STACK_LIMIT_BYTES = 64 * 1024  # larger attached buffers go to the heap

# Names a generated kernel must never declare: C and GNU keywords, the types, macros and
# functions of the headers it includes, and the libm functions it calls.
_C_KEYWORDS = set("""auto break case char const continue default do double else enum extern float for
goto if inline int long register restrict return short signed sizeof static struct switch typedef
union unsigned void volatile while bool true false main asm typeof __asm__ __inline__ __restrict
_Bool _Complex _Alignas _Alignof _Atomic _Generic _Noreturn _Static_assert _Thread_local
int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t intptr_t uintptr_t
NULL INFINITY NAN HUGE_VAL HUGE_VALF EOF errno timespec clock_gettime CLOCK_MONOTONIC time clock
malloc free aligned_alloc calloc realloc abort exit memcpy memset
exp expf log logf sqrt sqrtf tanh tanhf erf erff fabs fabsf pow powf fmax fmaxf fmin fminf
floor floorf ceil ceilf sin sinf cos cosf""".split())

_PRELUDE = """\
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline int32_t ansor_floordiv_i32(int32_t a, int32_t b) { int32_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int32_t ansor_floormod_i32(int32_t a, int32_t b) { int32_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline int64_t ansor_floordiv_i64(int64_t a, int64_t b) { int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t ansor_floormod_i64(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline float ansor_max_f32(float a, float b) { return a > b ? a : b; }
static inline float ansor_min_f32(float a, float b) { return a < b ? a : b; }
static inline double ansor_max_f64(double a, double b) { return a > b ? a : b; }
static inline double ansor_min_f64(double a, double b) { return a < b ? a : b; }
static inline int32_t ansor_max_i32(int32_t a, int32_t b) { return a > b ? a : b; }
static inline int32_t ansor_min_i32(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int64_t ansor_max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t ansor_min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

/* float32 exp, erf, tanh, log that gcc vectorizes inside `omp simd` loops (it keeps libm's expf
   etc. as scalar calls without -ffast-math). Only selects, integer bit tricks and mul/add: no
   calls, no branches, and no float op inside a ?: arm (with trapping math such arms stay branches).
   Accuracy, checked over every float against double libm: exp <= 1.1 ulp (results below
   FLT_MIN flushed to 0), erf <= 5e-7 absolute, tanh <= 3e-7 absolute, log <= 1 ulp. */
#define ANSOR_VECMATH static inline __attribute__((always_inline)) float
typedef union { float f; int32_t i; } ansor_bits;
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
ANSOR_VECMATH ansor_tanhf(float x) {  /* x P(x^2) / Q(x^2), Eigen's generic_fast_tanh_float coefficients */
  float xc = x < -7.90531110763549805f ? -7.90531110763549805f : x;  /* tanh rounds to +-1 beyond */
  xc = xc > 7.90531110763549805f ? 7.90531110763549805f : xc;
  float z = xc * xc, p = -2.76076847742355e-16f, q = 1.19825839466702e-06f;
  p = p * z + 2.00018790482477e-13f; p = p * z - 8.60467152213735e-11f; p = p * z + 5.12229709037114e-08f;
  p = p * z + 1.48572235717979e-05f; p = p * z + 6.37261928875436e-04f; p = p * z + 4.89352455891786e-03f;
  q = q * z + 1.18534705686654e-04f; q = q * z + 2.26843463243900e-03f; q = q * z + 4.89352518554385e-03f;
  return xc * p / q;
}
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

_VECMATH = ("exp", "erf", "tanh", "log")  # float32 calls that go to the prelude's ansor_<f>f
_SUFFIX = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64"}


MAX_UNROLLED_VECTOR_LOOPS = 32  # copies of an `omp simd` loop an auto-unroll pragma may make: gcc
                                # vectorizes each copy on its own, and compile time grows faster
                                # than the copies (a depthwise nest: 27 copies 0.9 s, 81 copies
                                # 2.9 s, 243 copies 21 s of gcc -O3)


def unrolled_vector_loops(loop: ir.For) -> int:
    """Copies of vectorized loops that unrolling `loop` makes, with the auto-unrolled loops
    inside it unrolled too (0: no vectorized loop inside)."""
    def inside(stmt: ir.Stmt) -> int:
        if isinstance(stmt, ir.For):
            if stmt.kind == "vectorized":
                return 1
            n = inside(stmt.body)
            return n * stmt.extent if stmt.unroll_hint or stmt.kind == "unrolled" else n
        if isinstance(stmt, ir.Seq):
            return sum(inside(x) for x in stmt.stmts)
        if isinstance(stmt, ir.IfThenElse):
            return inside(stmt.then) + (inside(stmt.orelse) if stmt.orelse is not None else 0)
        if isinstance(stmt, ir.Allocate):
            return inside(stmt.body)
        return 0

    try:
        return loop.extent * inside(loop.body)
    finally:
        inside = None  # noqa: F841 - a recursive closure refers to itself: free it now, not at GC


class CNames:
    """Maps objects to unique, sanitized C identifiers."""

    def __init__(self, reserved=()):
        self.used: set[str] = set(reserved)
        self.names: dict[int, str] = {}
        self._held: list[object] = []  # objects behind fresh names: their ids must stay unique

    def fresh(self, hint: str) -> str:
        """A new identifier for a variable the generator introduces itself."""
        token = object()
        self._held.append(token)
        return self(token, hint)

    def __call__(self, obj, hint: str) -> str:
        key = id(obj)
        if key not in self.names:
            base = re.sub(r"[^A-Za-z0-9_]", "_", hint) or "v"
            base = re.sub(r"_+", "_", base).strip("_") or "v"
            if base[0].isdigit():
                base = "v" + base
            if base in _C_KEYWORDS or base.startswith("ansor_") or _looks_like_macro(base):
                base = base + "_"
            cand, k = base, 1
            while cand in self.used:
                cand = f"{base}_{k}"
                k += 1
            self.used.add(cand)
            self.names[key] = cand
        return self.names[key]


def _looks_like_macro(name: str) -> bool:
    """Upper-case names of three or more characters (M_PI, INT32_MAX, HUGE_VALL, ...) and the
    lower-case names GNU C predefines could be macros of the system headers: keep clear of
    them. Short names like A, B, W stay as they are, for readability."""
    if name.lower() in ("linux", "unix", "i386", "i686", "x86_64"):
        return True
    return name.upper() == name and any(c.isalpha() for c in name) and (len(name) >= 3 or "_" in name)


class CCodegen:
    def __init__(self, func: ir.PrimFunc, vector_bytes: int = 0, vector_registers: int = 16):
        self.func = func
        self.vector_bytes = vector_bytes  # 0: no register tiles
        self.vector_registers = vector_registers
        self.names = CNames()
        self.ranges: dict[int, tuple[int, int]] = {}
        self.lines: list[str] = []
        self.fname = self.names(func, func.name)

    # --- expressions ------------------------------------------------------------------------
    def expr(self, e: E.Expr) -> str:
        if isinstance(e, E.Const):
            return _literal(e)
        if isinstance(e, E.Var):
            return self.names(e, e.name)
        if isinstance(e, ir.BufferLoad):
            return f"{self.names(e.buffer, e.buffer.name)}[{self.flat_index(e.buffer, e.indices)}]"
        if isinstance(e, E.BinOp):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.op in ("min", "max"):
                return f"ansor_{e.op}_{_SUFFIX[e.dtype]}({a}, {b})"
            if e.op in ("//", "%"):
                lo, _ = const_bounds(e.a, self.ranges)
                blo, _ = const_bounds(e.b, self.ranges)
                if lo >= 0 and blo > 0:
                    return f"({a} {'/' if e.op == '//' else '%'} {b})"
                fn = "floordiv" if e.op == "//" else "floormod"
                return f"ansor_{fn}_{_SUFFIX[e.dtype]}({a}, {b})"
            return f"({a} {e.op} {b})"
        if isinstance(e, E.Compare):
            return f"({self.expr(e.a)} {e.op} {self.expr(e.b)})"
        if isinstance(e, E.Logical):
            if e.op == "not":
                return f"(!{self.expr(e.args[0])})"
            joiner = " && " if e.op == "and" else " || "
            return "(" + joiner.join(self.expr(a) for a in e.args) + ")"
        if isinstance(e, E.Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, E.Cast):
            return f"(({C_TYPES[e.dtype]}){self.expr(e.value)})"
        if isinstance(e, E.Call):
            return self.call(e)
        raise TypeError(f"cannot generate C for {type(e).__name__}")

    def call(self, e: E.Call) -> str:
        args = [self.expr(a) for a in e.args]
        f32 = e.dtype == "float32"
        f = "f" if f32 else ""
        one = "1.0f" if f32 else "1.0"
        exp = "ansor_expf" if f32 else "exp"
        if e.func == "rsqrt":
            return f"({one} / sqrt{f}({args[0]}))"
        if e.func == "sigmoid":
            return f"({one} / ({one} + {exp}(-({args[0]}))))"
        if f32 and e.func in _VECMATH:
            # the prelude's vectorizable versions; float64 stays on libm
            return f"ansor_{e.func}f({args[0]})"
        if e.func == "abs":
            if E.is_int(e.dtype):
                return f"({args[0]} < 0 ? -({args[0]}) : {args[0]})"
            return f"fabs{f}({args[0]})"
        return f"{e.func}{f}({', '.join(args)})"

    def flat_index(self, buf: ir.Buffer, indices) -> str:
        return self.expr(simplify(buf.flat_index(indices), self.ranges))

    # --- statements -------------------------------------------------------------------------
    def emit(self, line: str, depth: int) -> None:
        self.lines.append("  " * depth + line)

    def stmt(self, s: ir.Stmt, depth: int, in_parallel: bool) -> None:
        if isinstance(s, ir.Seq):
            for x in s.stmts:
                self.stmt(x, depth, in_parallel)
        elif isinstance(s, ir.For):
            self.loop(s, depth, in_parallel)
        elif isinstance(s, ir.Store):
            name = self.names(s.buffer, s.buffer.name)
            self.emit(f"{name}[{self.flat_index(s.buffer, s.indices)}] = {self.expr(s.value)};", depth)
        elif isinstance(s, ir.IfThenElse):
            self.emit(f"if ({self.expr(s.cond)}) {{", depth)
            self.stmt(s.then, depth + 1, in_parallel)
            if s.orelse is not None:
                self.emit("} else {", depth)
                self.stmt(s.orelse, depth + 1, in_parallel)
            self.emit("}", depth)
        elif isinstance(s, ir.Allocate):
            self.allocate(s, depth, in_parallel)
        elif isinstance(s, ir.Barrier):
            self.emit("/* barrier: no-op on the CPU */", depth)
        else:
            raise TypeError(f"cannot generate C for {type(s).__name__}")

    def loop(self, s: ir.For, depth: int, in_parallel: bool) -> None:
        if self.vector_bytes:
            plan = plan_transposed_store(s, self.vector_bytes, self.ranges)
            if plan is not None:
                emit_transposed_store(self, plan, depth, in_parallel)
                return
        var = self.names(s.var, s.var.name)
        self.ranges[id(s.var)] = (0, s.extent - 1)
        has_inner_loop = any(isinstance(x, ir.For) for x in ir.walk_stmts(s.body))
        child_parallel = in_parallel
        if s.kind == "parallel" and not in_parallel:
            self.emit("#pragma omp parallel for", depth)
            child_parallel = True
        elif s.kind == "vectorized" and not has_inner_loop:
            self.emit("#pragma omp simd", depth)
        elif s.kind == "unrolled" or (s.unroll_hint and unrolled_vector_loops(s) <= MAX_UNROLLED_VECTOR_LOOPS):
            self.emit(f"#pragma GCC unroll {min(s.extent, 65534)}", depth)
        self.emit(f"for (int32_t {var} = 0; {var} < {s.extent}; ++{var}) {{", depth)
        self.stmt(s.body, depth + 1, child_parallel)
        self.emit("}", depth)

    def allocate(self, s: ir.Allocate, depth: int, in_parallel: bool) -> None:
        b = s.buffer
        name = self.names(b, b.name)
        ctype = C_TYPES[b.dtype]
        self.emit("{", depth)
        on_heap = b.nbytes > STACK_LIMIT_BYTES
        if on_heap:
            nbytes = -(-b.nbytes // 64) * 64
            self.emit(f"{ctype}* restrict {name} = ({ctype}*)aligned_alloc(64, {nbytes});", depth + 1)
        else:
            self.emit(f"{ctype} {name}[{b.size}] __attribute__((aligned(64)));", depth + 1)
        for part in _flat_seq([s.body]):
            tile = None
            if b.scope == "local" and self.vector_bytes and isinstance(part, ir.For):
                tile = plan_register_tile(part, b, self.vector_bytes, self.vector_registers, self.ranges)
            if tile is not None:
                emit_register_tile(self, tile, depth + 1)
            else:
                self.stmt(part, depth + 1, in_parallel)
        if on_heap:
            self.emit(f"free({name});", depth + 1)
        self.emit("}", depth)

    # --- function ---------------------------------------------------------------------------
    def _signature(self, func: ir.PrimFunc, writes_packed: bool) -> str:
        params = []
        for b in func.params:
            const = "const " if b.role == "input" or (b.role == "packed" and not writes_packed) else ""
            params.append(f"{const}{C_TYPES[b.dtype]}* restrict {self.names(b, b.name)}")
        return ", ".join(params)

    def _function(self, func: ir.PrimFunc, fname: str, writes_packed: bool = False) -> str:
        self.lines = []
        self.stmt(func.body, 1, False)
        body = "\n".join(self.lines)
        return f"\nvoid {fname}({self._signature(func, writes_packed)}) {{\n{body}\n}}\n"

    def generate(self) -> str:
        func = self.func
        sig = self._signature(func, False)
        args = ", ".join(self.names(b, b.name) for b in func.params)
        text = (
            _PRELUDE
            + VECTOR_PRELUDE
            + self._function(func, self.fname)
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
            text += self._function(prepack, f"{self.fname}_prepack", writes_packed=True)
            sizes = [b.nbytes for b in func.params if b.role == "packed"]
            cases = "".join(f"    case {i}: return {n}LL;\n" for i, n in enumerate(sizes))
            text += (f"\n/* bytes of packed parameter i (after the inputs and outputs); -1 past the last */\n"
                     f"long long {self.fname}_packed_bytes(int i) {{\n  switch (i) {{\n{cases}"
                     f"    default: return -1LL;\n  }}\n}}\n")
        return text


def _flat_seq(stmts) -> list:
    out = []
    for x in stmts:
        out.extend(_flat_seq(x.stmts) if isinstance(x, ir.Seq) else [x])
    return out


def _literal(c: E.Const) -> str:
    if c.dtype == "bool":
        return "true" if c.value else "false"
    if E.is_float(c.dtype):
        v = c.value
        if math.isinf(v):
            return "(-INFINITY)" if v < 0 else "INFINITY"
        if math.isnan(v):
            return "NAN"
        text = repr(float(v))
        if "e" not in text and "." not in text:
            text += ".0"
        text = f"{text}f" if c.dtype == "float32" else text
        return f"({text})" if v < 0 else text
    if c.dtype == "int64":
        return f"{c.value}LL" if c.value >= 0 else f"({c.value}LL)"
    return str(c.value) if c.value >= 0 else f"({c.value})"


def generate_c(func: ir.PrimFunc, vector_bytes: int = 0, vector_registers: int = 16) -> tuple[str, str]:
    """(C source, entry function name). The source also defines `<entry>_timed(number, ...)`,
    and for a program with stages that depend on constant inputs alone, `<entry>_prepack(...)`
    (same parameters; fills the packed ones) and `<entry>_packed_bytes(i)`. With `vector_bytes`
    (the target's vector width), small accumulators become register tiles (register_tile.py)."""
    gen = CCodegen(func, vector_bytes, vector_registers)
    return gen.generate(), gen.fname
