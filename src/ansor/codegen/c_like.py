"""The printer the C-like backends share (C for the CPU; CUDA and OpenCL to come).

Expressions, statements, loops, stores, buffer allocations and names are printed here. A
dialect is a subclass that sets the table of differences (class attributes: type names,
qualifiers, reserved names, the file header, its prelude pieces) and overrides a few hooks
(loop annotations, math function names, the nodes only it prints).

The prelude holds only what the body uses: printing records each helper it calls (`use`), and
the file starts with those helpers and what they depend on, in the order of the dialect's table.

Every user-given name passes through `CNames`, which keeps only [A-Za-z0-9_], avoids reserved
words and makes names unique, so no declaration text reaches the compiler unsanitized.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ansor.lower import ir
from ansor.te import expr as E
from ansor.te.arith import const_bounds, simplify
from ansor.te.dtypes import HALF_DTYPES, int_range, is_unsigned

C_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t", "bool": "bool",
           "float16": "_Float16", "bfloat16": "uint16_t",  # bfloat16: its bits (gcc has no __bf16 arithmetic)
           "int8": "int8_t", "int16": "int16_t", "uint8": "uint8_t", "uint16": "uint16_t",
           "uint32": "uint32_t", "uint64": "uint64_t"}
TYPE_SUFFIX = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64",  # of helper names
               "int8": "i8", "int16": "i16", "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
               "float16": "f32", "bfloat16": "f32"}  # float16/bfloat16 values are computed as float
#: integers that C promotes to int before any arithmetic: each result is cast back to the type
#: (wrapping, as numpy's arithmetic in the type does)
NARROW_INTS = ("int8", "int16", "uint8", "uint16")

# Names a generated kernel must never declare: C and GNU keywords, the types, macros and
# functions of the headers it includes, and the libm functions it calls.
C_KEYWORDS = frozenset("""auto break case char const continue default do double else enum extern float for
goto if inline int long register restrict return short signed sizeof static struct switch typedef
union unsigned void volatile while bool true false main asm typeof __asm__ __inline__ __restrict
_Bool _Complex _Alignas _Alignof _Atomic _Generic _Noreturn _Static_assert _Thread_local
int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t intptr_t uintptr_t
NULL INFINITY NAN HUGE_VAL HUGE_VALF EOF errno timespec clock_gettime CLOCK_MONOTONIC time clock
malloc free aligned_alloc calloc realloc abort exit memcpy memset
exp expf log logf sqrt sqrtf tanh tanhf erf erff fabs fabsf pow powf fmax fmaxf fmin fminf
floor floorf ceil ceilf sin sinf cos cosf tan tanf asin asinf acos acosf atan atanf sinh sinhf
cosh coshf asinh asinhf acosh acoshf atanh atanhf rint rintf""".split())


@dataclass(frozen=True)
class PreludePiece:
    """One definition the prelude may hold: emitted when the body uses `name`, or a piece
    that is emitted requires it. Pieces of one `group` are printed together."""

    name: str
    text: str
    group: str
    requires: tuple[str, ...] = ()


def assemble_prelude(table: Sequence[PreludePiece], used: Iterable[str]) -> str:
    """The pieces of `table` that `used` names, with the pieces they require, in table order;
    a blank line before each group. Names the table does not hold are left to the compiler."""
    by_name = {p.name: p for p in table}
    wanted: set[str] = set()
    todo = [n for n in used if n in by_name]
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(r for r in by_name[name].requires if r in by_name)
    out, group = [], None
    for piece in table:
        if piece.name in wanted:
            if piece.group != group:
                out.append("\n")
                group = piece.group
            out.append(piece.text)
    return "".join(out)


def _helpers(qualifier: str) -> tuple[PreludePiece, ...]:
    """Floor division and modulo (C's / and % truncate) and min/max, one per type."""
    pieces = []
    for dtype in ("int32", "int64", "int8", "int16"):
        t, s = C_TYPES[dtype], TYPE_SUFFIX[dtype]
        pieces.append(PreludePiece(
            f"ansor_floordiv_{s}", f"{qualifier} {t} ansor_floordiv_{s}({t} a, {t} b) {{ {t} q = a / b; "
            f"return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }}\n", "helpers"))
        pieces.append(PreludePiece(
            f"ansor_floormod_{s}", f"{qualifier} {t} ansor_floormod_{s}({t} a, {t} b) {{ {t} r = a % b; "
            f"return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }}\n", "helpers"))
    for dtype in ("float32", "float64", *E.INT_DTYPES):
        t, s = C_TYPES[dtype], TYPE_SUFFIX[dtype]
        # floats: a NaN in either operand is the result (numpy, PyTorch and ONNX propagate it;
        # `a > b ? a : b` alone would drop a NaN in a and keep one in b)
        nan = " || a != a" if dtype.startswith("float") else ""
        for op, cmp in (("max", ">"), ("min", "<")):
            body = f"{{ return (a {cmp} b{nan}) ? a : b; }}"
            pieces.append(PreludePiece(f"ansor_{op}_{s}", f"{qualifier} {t} ansor_{op}_{s}({t} a, {t} b) {body}\n",
                                       "helpers"))
    # float to integer: truncated toward zero, saturated at the type's range, NaN to 0 (C leaves
    # the out-of-range case undefined; ansor.te.dtypes defines it)
    for src in ("float32", "float64"):
        ft = C_TYPES[src]
        for dtype in E.INT_DTYPES:
            t, lo, hi = C_TYPES[dtype], *int_range(dtype)
            # the bounds as powers of two, exact in every float type: x >= 2^(bits-1) saturates
            suffix = "f" if src == "float32" else ""
            top = f"{float(hi + 1)!r}{suffix}"
            low = f"{float(lo)!r}{suffix}" if lo else f"0.0{suffix}"
            max_text = f"{hi}ULL" if dtype == "uint64" else (f"{hi}LL" if hi > 2**31 else str(hi))
            min_text = f"(-{hi}LL - 1)" if dtype == "int64" else (f"(-{hi} - 1)" if lo else "0")
            if hi < 2 ** 16:
                # 8 and 16 bits: clamped as a float to the range (exact in every float type),
                # then truncated through int32. The same values as the chain below; gcc 12
                # vectorizes this form after a float clamp, but not the chain into an unsigned
                # byte (a requantized uint8 layer's epilogue stayed scalar: most of its time)
                bound_lo, bound_hi = f"{float(lo)!r}{suffix}", f"{float(hi)!r}{suffix}"
                pieces.append(PreludePiece(
                    f"ansor_sat_{TYPE_SUFFIX[src]}_{TYPE_SUFFIX[dtype]}",
                    f"{qualifier} {t} ansor_sat_{TYPE_SUFFIX[src]}_{TYPE_SUFFIX[dtype]}({ft} x) {{ "
                    f"{ft} c = x < {bound_lo} ? {bound_lo} : x > {bound_hi} ? {bound_hi} : x; "
                    f"return x != x ? ({t})0 : ({t})({C_TYPES['int32']})c; }}\n",
                    "helpers"))
                continue
            pieces.append(PreludePiece(
                f"ansor_sat_{TYPE_SUFFIX[src]}_{TYPE_SUFFIX[dtype]}",
                f"{qualifier} {t} ansor_sat_{TYPE_SUFFIX[src]}_{TYPE_SUFFIX[dtype]}({ft} x) {{ "
                f"return x != x ? ({t})0 : x <= {low} ? ({t}){min_text} : x >= {top} ? ({t}){max_text} : ({t})x; }}\n",
                "helpers"))
    return tuple(pieces)


# float16 and bfloat16 values are computed as float: a load widens, every operation rounds its
# float result to the type (an exact float then, so a store only narrows), as numpy computes them
_HALF_PIECES = (
    PreludePiece("ansor_f32_bits", "typedef union { float f; uint32_t u; } ansor_f32_bits;\n", "half"),
    PreludePiece("ansor_round_bf16", """\
/* x rounded to bfloat16 (nearest, ties to even; a NaN stays a quiet NaN), as ml_dtypes rounds;
   the result is a float whose low 16 bits are zero */
static inline float ansor_round_bf16(float x) {
  ansor_f32_bits v; v.f = x;
  uint32_t rounded = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) & 0xffff0000u;
  v.u = (v.u & 0x7fffffffu) > 0x7f800000u ? ((v.u & 0x80000000u) | 0x7fc00000u) : rounded;
  return v.f;
}
""", "half", ("ansor_f32_bits",)),
    PreludePiece("ansor_load_bf16", "static inline float ansor_load_bf16(uint16_t h) { ansor_f32_bits v; "
                 "v.u = (uint32_t)h << 16; return v.f; }\n", "half", ("ansor_f32_bits",)),
    PreludePiece("ansor_store_bf16", "static inline uint16_t ansor_store_bf16(float x) { ansor_f32_bits v; "
                 "v.f = x; return (uint16_t)(v.u >> 16); }  /* x is rounded already */\n", "half", ("ansor_f32_bits",)),
)


class CNames:
    """Maps objects to unique, sanitized identifiers."""

    def __init__(self, reserved: Iterable[str] = (), keywords: frozenset = C_KEYWORDS):
        self.used: set[str] = set(reserved)
        self.keywords = keywords
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
            if base in self.keywords or base.startswith("ansor_") or _looks_like_macro(base):
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


class CLikePrinter:
    """Prints one `ir.PrimFunc` (and the functions a dialect adds around it) as C-like text."""

    TYPES: dict[str, str] = C_TYPES
    KEYWORDS: frozenset = C_KEYWORDS
    INDEX_TYPE = "int32_t"                  # loop variables
    RESTRICT = "restrict"                   # on pointer parameters
    FUNCTION_PREFIX = ""                    # before `void` of a kernel function
    HEADER = ""                             # the file's first lines (includes)
    BARRIER: str | None = None              # the statement of an `ir.Barrier`; None: unsupported
    STACK_LIMIT_BYTES = 64 * 1024           # larger allocated buffers go to the heap
    PRELUDE: tuple[PreludePiece, ...] = _helpers("static inline") + _HALF_PIECES

    def __init__(self, func: ir.PrimFunc):
        self.func = func
        self.names = CNames(keywords=self.KEYWORDS)
        self.ranges: dict[int, tuple[int, int]] = {}
        self.lines: list[str] = []
        self.uses: dict[str, None] = {}  # prelude pieces the printed text calls, in first-use order
        self.fname = self.names(func, func.name)

    def use(self, name: str) -> str:
        """Record that the text calls the prelude's `name`; returns the name."""
        self.uses[name] = None
        return name

    def prelude(self) -> str:
        """The header and the prelude pieces the printed text used."""
        return self.HEADER + assemble_prelude(self.PRELUDE, self.uses)

    # --- expressions ------------------------------------------------------------------------
    def expr(self, e: E.Expr) -> str:
        if isinstance(e, E.Const):
            return self.literal(e)
        if isinstance(e, E.Var):
            return self.names(e, e.name)
        if isinstance(e, ir.BufferLoad):
            text = f"{self.names(e.buffer, e.buffer.name)}[{self.flat_index(e.buffer, e.indices)}]"
            return self.half_load(e.buffer.dtype, text) if e.buffer.dtype in HALF_DTYPES else text
        if isinstance(e, E.BinOp):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.op in ("min", "max"):
                return f"{self.use(f'ansor_{e.op}_{TYPE_SUFFIX[e.dtype]}')}({a}, {b})"
            if e.dtype in HALF_DTYPES:
                return self.half_round(e.dtype, f"({a} {e.op} {b})")
            if e.op in ("//", "%"):
                if is_unsigned(e.dtype):
                    return self.narrow(e.dtype, f"({a} {'/' if e.op == '//' else '%'} {b})")
                lo, _ = const_bounds(e.a, self.ranges)
                blo, _ = const_bounds(e.b, self.ranges)
                if lo >= 0 and blo > 0:
                    return self.narrow(e.dtype, f"({a} {'/' if e.op == '//' else '%'} {b})")
                fn = "floordiv" if e.op == "//" else "floormod"
                return f"{self.use(f'ansor_{fn}_{TYPE_SUFFIX[e.dtype]}')}({a}, {b})"
            if e.dtype == "uint16" and e.op == "*":  # promoted to int, 65535 * 65535 would overflow
                return self.narrow(e.dtype, f"((uint32_t){a} * (uint32_t){b})")
            return self.narrow(e.dtype, f"({a} {e.op} {b})")
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
            return self.cast(e.value.dtype, e.dtype, self.expr(e.value))
        if isinstance(e, E.Call):
            return self.call(e)
        raise TypeError(f"cannot generate C for {type(e).__name__}")

    def narrow(self, dtype: str, text: str) -> str:
        """`text`, an arithmetic result, cast back to `dtype` where C computed it in int."""
        return f"(({self.TYPES[dtype]}){text})" if dtype in NARROW_INTS else text

    def cast(self, source: str, dtype: str, text: str) -> str:
        """The conversion of `text`, a value of `source`, to `dtype` (`ansor.te.dtypes`'s rules)."""
        if source == dtype:
            return text
        if dtype in HALF_DTYPES:
            if source == "float64" and dtype == "float16":
                return self.half_round(dtype, text)  # double to half directly, as numpy rounds
            return self.half_round(dtype, text if source in E.FLOAT_DTYPES else f"((float){text})")
        value = "float32" if source in HALF_DTYPES else source  # the float that holds it
        if E.is_int(dtype) and E.is_float(value):
            return f"{self.use(f'ansor_sat_{TYPE_SUFFIX[value]}_{TYPE_SUFFIX[dtype]}')}({text})"
        if value == dtype:
            return text
        return f"(({self.TYPES[dtype]}){text})"

    def half_load(self, dtype: str, text: str) -> str:
        """A float16/bfloat16 element `text` read as the float that computes with it."""
        if dtype == "bfloat16":
            return f"{self.use('ansor_load_bf16')}({text})"
        return f"((float){text})"

    def half_round(self, dtype: str, text: str) -> str:
        """The float (or double) `text` rounded to `dtype`, as a float."""
        if dtype == "bfloat16":  # from a double through float, as ml_dtypes converts
            return f"{self.use('ansor_round_bf16')}({text})"
        return f"((float)(_Float16){text})"  # from a double directly, as numpy converts

    def half_store(self, dtype: str, text: str) -> str:
        """A float holding a `dtype` value (rounded already) as the element stored."""
        if dtype == "bfloat16":
            return f"{self.use('ansor_store_bf16')}({text})"
        return f"((_Float16){text})"

    def math_function(self, name: str, dtype: str) -> str:
        """The dialect's name of a math function (`exp`, `log`, ...) for `dtype`."""
        return f"{name}f" if dtype == "float32" else name

    def call(self, e: E.Call) -> str:
        if e.dtype in HALF_DTYPES:  # computed in float, rounded once
            if e.func in ("abs", "floor", "ceil", "round"):  # exact: the result is of the type
                return self._call(e, "float32")
            return self.half_round(e.dtype, self._call(e, "float32"))
        return self._call(e, e.dtype)

    def _call(self, e: E.Call, dtype: str) -> str:
        args = [self.expr(a) for a in e.args]
        f32 = dtype == "float32"
        one = "1.0f" if f32 else "1.0"
        if e.func == "rsqrt":
            return f"({one} / {self.math_function('sqrt', dtype)}({args[0]}))"
        if e.func == "sigmoid":
            return f"({one} / ({one} + {self.math_function('exp', dtype)}(-({args[0]}))))"
        if e.func == "abs":
            if is_unsigned(dtype):
                return args[0]
            if E.is_int(dtype):
                return self.narrow(dtype, f"({args[0]} < 0 ? -({args[0]}) : {args[0]})")
            return f"{self.math_function('fabs', dtype)}({args[0]})"
        if e.func == "round":  # half to even: rint under the default rounding mode
            return f"{self.math_function('rint', dtype)}({args[0]})"
        return f"{self.math_function(e.func, dtype)}({', '.join(args)})"

    def literal(self, c: E.Const) -> str:
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
            text = f"{text}f" if c.dtype != "float64" else text  # float16/bfloat16: a float
            return f"({text})" if v < 0 else text
        if c.dtype == "int64":
            return f"{c.value}LL" if c.value >= 0 else f"({c.value}LL)"
        if c.dtype in ("uint32", "uint64"):
            return f"{c.value}U" if c.dtype == "uint32" else f"{c.value}ULL"
        return str(c.value) if c.value >= 0 else f"({c.value})"

    def flat_index(self, buf: ir.Buffer, indices) -> str:
        return self.expr(simplify(buf.flat_index(indices), self.ranges))

    # --- statements -------------------------------------------------------------------------
    def emit(self, line: str, depth: int) -> None:
        self.lines.append("  " * depth + line)

    def stmt(self, s: ir.Stmt, depth: int, in_parallel: bool) -> None:
        t = type(s)
        if t is ir.Seq:
            for x in s.stmts:
                self.stmt(x, depth, in_parallel)
        elif t is ir.For:
            self.loop(s, depth, in_parallel)
        elif t is ir.Store:
            self.store(s, depth)
        elif t is ir.IfThenElse:
            self.emit(f"if ({self.expr(s.cond)}) {{", depth)
            self.stmt(s.then, depth + 1, in_parallel)
            if s.orelse is not None:
                self.emit("} else {", depth)
                self.stmt(s.orelse, depth + 1, in_parallel)
            self.emit("}", depth)
        elif t is ir.Allocate:
            self.allocate(s, depth, in_parallel)
        elif t is ir.Unswitched:
            self.emit(f"if ({self.expr(s.cond)}) {{", depth)
            self.stmt(s.fast, depth + 1, in_parallel)
            self.emit("} else {", depth)
            self.stmt(s.slow, depth + 1, in_parallel)
            self.emit("}", depth)
        elif t is ir.Barrier and self.BARRIER is not None:
            self.emit(self.BARRIER, depth)
        else:
            self.dialect_stmt(s, depth, in_parallel)

    def dialect_stmt(self, s: ir.Stmt, depth: int, in_parallel: bool) -> None:
        """Statements only some dialects print (the nodes of their lowering passes)."""
        raise TypeError(f"cannot generate {type(self).__name__} code for {type(s).__name__}")

    def store(self, s: ir.Store, depth: int) -> None:
        name = self.names(s.buffer, s.buffer.name)
        value = self.expr(s.value)
        if s.buffer.dtype in HALF_DTYPES:
            value = self.half_store(s.buffer.dtype, value)
        self.emit(f"{name}[{self.flat_index(s.buffer, s.indices)}] = {value};", depth)

    def loop_annotations(self, s: ir.For, in_parallel: bool) -> tuple[list[str], bool]:
        """Lines before the loop (pragmas) and whether its body runs inside a parallel region."""
        return [], in_parallel

    def loop(self, s: ir.For, depth: int, in_parallel: bool) -> None:
        var = self.names(s.var, s.var.name)
        self.ranges[id(s.var)] = (0, s.extent - 1)
        before, child_parallel = self.loop_annotations(s, in_parallel)
        for line in before:
            self.emit(line, depth)
        self.emit(f"for ({self.INDEX_TYPE} {var} = 0; {var} < {self.loop_bound(s)}; ++{var}) {{", depth)
        self.stmt(s.body, depth + 1, child_parallel)
        self.emit("}", depth)

    def loop_bound(self, s: ir.For) -> str:
        """The loop's trip count as printed (its extent, unless a dialect runs it shorter)."""
        return str(s.extent)

    def allocate(self, s: ir.Allocate, depth: int, in_parallel: bool) -> None:
        b = s.buffer
        name = self.names(b, b.name)
        ctype = self.TYPES[b.dtype]
        self.emit("{", depth)
        on_heap = b.nbytes > self.STACK_LIMIT_BYTES
        if on_heap:
            nbytes = -(-b.nbytes // 64) * 64
            self.emit(f"{ctype}* {self.RESTRICT} {name} = ({ctype}*)aligned_alloc(64, {nbytes});", depth + 1)
        else:
            self.emit(f"{ctype} {name}[{b.size}] __attribute__((aligned(64)));", depth + 1)
        self.stmt(s.body, depth + 1, in_parallel)
        if on_heap:
            self.emit(f"free({name});", depth + 1)
        self.emit("}", depth)

    # --- functions --------------------------------------------------------------------------
    def function_prologue(self, func: ir.PrimFunc) -> None:
        """Lines a dialect puts before a function's body (none by default)."""

    def function_epilogue(self, func: ir.PrimFunc) -> None:
        """Lines a dialect puts after a function's body (none by default)."""

    def signature(self, func: ir.PrimFunc, writes_packed: bool = False) -> str:
        """Pointer parameters, inputs (and packed buffers the function only reads) const."""
        params = []
        for b in func.params:
            const = "const " if b.role == "input" or (b.role == "packed" and not writes_packed) else ""
            params.append(f"{const}{self.TYPES[b.dtype]}* {self.RESTRICT} {self.names(b, b.name)}")
        return ", ".join(params)

    def function(self, func: ir.PrimFunc, fname: str, writes_packed: bool = False) -> str:
        self.lines = []
        self.function_prologue(func)
        self.stmt(func.body, 1, False)
        self.function_epilogue(func)
        body = "\n".join(self.lines)
        return f"\n{self.FUNCTION_PREFIX}void {fname}({self.signature(func, writes_packed)}) {{\n{body}\n}}\n"
