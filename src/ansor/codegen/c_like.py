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

C_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t", "bool": "bool"}
TYPE_SUFFIX = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64"}  # of helper names

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
    for dtype in ("int32", "int64"):
        t, s = C_TYPES[dtype], TYPE_SUFFIX[dtype]
        pieces.append(PreludePiece(
            f"ansor_floordiv_{s}", f"{qualifier} {t} ansor_floordiv_{s}({t} a, {t} b) {{ {t} q = a / b; "
            f"return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }}\n", "helpers"))
        pieces.append(PreludePiece(
            f"ansor_floormod_{s}", f"{qualifier} {t} ansor_floormod_{s}({t} a, {t} b) {{ {t} r = a % b; "
            f"return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }}\n", "helpers"))
    for dtype in ("float32", "float64", "int32", "int64"):
        t, s = C_TYPES[dtype], TYPE_SUFFIX[dtype]
        # floats: a NaN in either operand is the result (numpy, PyTorch and ONNX propagate it;
        # `a > b ? a : b` alone would drop a NaN in a and keep one in b)
        nan = " || a != a" if dtype.startswith("float") else ""
        for op, cmp in (("max", ">"), ("min", "<")):
            body = f"{{ return (a {cmp} b{nan}) ? a : b; }}"
            pieces.append(PreludePiece(f"ansor_{op}_{s}", f"{qualifier} {t} ansor_{op}_{s}({t} a, {t} b) {body}\n",
                                       "helpers"))
    return tuple(pieces)


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
    PRELUDE: tuple[PreludePiece, ...] = _helpers("static inline")

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
            return f"{self.names(e.buffer, e.buffer.name)}[{self.flat_index(e.buffer, e.indices)}]"
        if isinstance(e, E.BinOp):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.op in ("min", "max"):
                return f"{self.use(f'ansor_{e.op}_{TYPE_SUFFIX[e.dtype]}')}({a}, {b})"
            if e.op in ("//", "%"):
                lo, _ = const_bounds(e.a, self.ranges)
                blo, _ = const_bounds(e.b, self.ranges)
                if lo >= 0 and blo > 0:
                    return f"({a} {'/' if e.op == '//' else '%'} {b})"
                fn = "floordiv" if e.op == "//" else "floormod"
                return f"{self.use(f'ansor_{fn}_{TYPE_SUFFIX[e.dtype]}')}({a}, {b})"
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
            return f"(({self.TYPES[e.dtype]}){self.expr(e.value)})"
        if isinstance(e, E.Call):
            return self.call(e)
        raise TypeError(f"cannot generate C for {type(e).__name__}")

    def math_function(self, name: str, dtype: str) -> str:
        """The dialect's name of a math function (`exp`, `log`, ...) for `dtype`."""
        return f"{name}f" if dtype == "float32" else name

    def call(self, e: E.Call) -> str:
        args = [self.expr(a) for a in e.args]
        f32 = e.dtype == "float32"
        one = "1.0f" if f32 else "1.0"
        if e.func == "rsqrt":
            return f"({one} / {self.math_function('sqrt', e.dtype)}({args[0]}))"
        if e.func == "sigmoid":
            return f"({one} / ({one} + {self.math_function('exp', e.dtype)}(-({args[0]}))))"
        if e.func == "abs":
            if E.is_int(e.dtype):
                return f"({args[0]} < 0 ? -({args[0]}) : {args[0]})"
            return f"{self.math_function('fabs', e.dtype)}({args[0]})"
        if e.func == "round":  # half to even: rint under the default rounding mode
            return f"{self.math_function('rint', e.dtype)}({args[0]})"
        return f"{self.math_function(e.func, e.dtype)}({', '.join(args)})"

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
            text = f"{text}f" if c.dtype == "float32" else text
            return f"({text})" if v < 0 else text
        if c.dtype == "int64":
            return f"{c.value}LL" if c.value >= 0 else f"({c.value}LL)"
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
        self.emit(f"{name}[{self.flat_index(s.buffer, s.indices)}] = {self.expr(s.value)};", depth)

    def loop_annotations(self, s: ir.For, in_parallel: bool) -> tuple[list[str], bool]:
        """Lines before the loop (pragmas) and whether its body runs inside a parallel region."""
        return [], in_parallel

    def loop(self, s: ir.For, depth: int, in_parallel: bool) -> None:
        var = self.names(s.var, s.var.name)
        self.ranges[id(s.var)] = (0, s.extent - 1)
        before, child_parallel = self.loop_annotations(s, in_parallel)
        for line in before:
            self.emit(line, depth)
        self.emit(f"for ({self.INDEX_TYPE} {var} = 0; {var} < {s.extent}; ++{var}) {{", depth)
        self.stmt(s.body, depth + 1, child_parallel)
        self.emit("}", depth)

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
    def signature(self, func: ir.PrimFunc, writes_packed: bool = False) -> str:
        """Pointer parameters, inputs (and packed buffers the function only reads) const."""
        params = []
        for b in func.params:
            const = "const " if b.role == "input" or (b.role == "packed" and not writes_packed) else ""
            params.append(f"{const}{self.TYPES[b.dtype]}* {self.RESTRICT} {self.names(b, b.name)}")
        return ", ".join(params)

    def function(self, func: ir.PrimFunc, fname: str, writes_packed: bool = False) -> str:
        self.lines = []
        self.stmt(func.body, 1, False)
        body = "\n".join(self.lines)
        return f"\n{self.FUNCTION_PREFIX}void {fname}({self.signature(func, writes_packed)}) {{\n{body}\n}}\n"
