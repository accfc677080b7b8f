"""CUDA and OpenCL from the GPU kernels of a lowered program: one printer, two dialects.

The dialects differ only in a table (kernel and pointer qualifiers, shared memory, barrier,
block and thread indices, scalar types, math function names, unroll pragma). The file's
first line is the launch metadata the GPU runners read (`// ansor-launch: {json}`: each
kernel's name, grid, block and arguments in launch order, and every buffer's role), so one
text is the whole program.

Loops bound to blockIdx/threadIdx print as a named index read from the hardware (`const int
i_tx = threadIdx.x;`), guarded where the loop is shorter than the block; unrolled and
auto-unrolled loops print with an unroll pragma, virtual threads as a plain loop, so a reader
sees the schedule's tile structure in the source. nvcc is kept from spilling registers (a spill
fails the build): loops that index a thread's local array are always unrolled, an unrolled nest
counts the copies that the unrolled loops around it make (GPUPrinter.loop), and the launch
bounds ask for one block per multiprocessor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ansor.codegen.c_like import C_KEYWORDS, CLikePrinter, PreludePiece, _helpers
from ansor.codegen.gemm_cuda import TEMPLATE_LOCALS, gemm_cuda_body
from ansor.codegen.gemm_wgmma import WGMMA_LOCALS, gemm_wgmma_body, wgmma_prelude
from ansor.lower import ir
from ansor.lower.gemm_template import GemmProgram
from ansor.lower.gpu import AXIS, BLOCK_KINDS, THREAD_KINDS, kernels_of
from ansor.te import expr as E
from ansor.te.dtypes import HALF_DTYPES

LAUNCH_PREFIX = "// ansor-launch: "
LONG_FETCH = 16   # a cooperative fetch loop of more steps is long: see _is_long_fetch
FETCH_UNROLL = 8  # a long fetch loop is unrolled this far, no further
MAX_UNROLLED_STATEMENTS = 1024  # copies of the innermost statement that a fully unrolled nest
                                # may make, those of the unrolled loops around it included (the
                                # largest auto-unroll depth): see GPUPrinter.loop
REFIT_UNROLLED_STATEMENTS = (256, 64)  # the same limit for a program printed again because its
                                       # build spilled registers (`Backend.refit_printers`)


@dataclass(frozen=True)
class Dialect:
    """What differs between CUDA and OpenCL C."""

    language: str
    header: str
    kernel_prefix: str            # before `void`; `{threads}` is the block's thread count
    global_pointer: str           # before the element type of a global pointer parameter
    restrict: str
    shared: str                   # qualifier of a shared-memory array; `{decl}` is `type name[size]`
    barrier: str
    block_index: str              # `{axis}` is x/y/z, `{dim}` is 0/1/2
    thread_index: str
    types: dict[str, str]
    float_suffix_math: bool       # expf (CUDA) rather than the overloaded exp (OpenCL)
    helper_qualifier: str
    half_headers: str = ""        # included where a kernel has float16/bfloat16 values; none: refused


_CUDA_TYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "long long", "bool": "bool",
               "float16": "__half", "bfloat16": "__nv_bfloat16",  # cuda_fp16.h, cuda_bf16.h
               "int8": "signed char", "int16": "short", "uint8": "unsigned char", "uint16": "unsigned short",
               "uint32": "unsigned int", "uint64": "unsigned long long"}
_OPENCL_TYPES = {"float32": "float", "float64": "double", "int32": "int", "int64": "long", "bool": "uchar",
                 "int8": "char", "int16": "short", "uint8": "uchar", "uint16": "ushort", "uint32": "uint",
                 "uint64": "ulong"}

CUDA = Dialect(
    language="cuda",
    header=("#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif\n"
            "#ifndef NAN\n#define NAN __int_as_float(0x7fffffff)\n#endif\n"),
    # one block per multiprocessor is enough: without the 1, ptxas spills a few values of a small
    # block's kernel to fit more blocks, and a spill fails the build (BENCHMARKS.md)
    kernel_prefix='extern "C" __global__ void __launch_bounds__({threads}, 1)',
    global_pointer="",
    restrict="__restrict__",
    shared="__shared__ __align__(16) {decl}",  # aligned: nvcc then reads 4 neighbours in one
                                                # 128-bit load (the best sgemm: 320 -> 80 loads)
    barrier="__syncthreads();",
    block_index="(int)blockIdx.{axis}",
    thread_index="(int)threadIdx.{axis}",
    types=_CUDA_TYPES,
    float_suffix_math=True,
    helper_qualifier="__device__ __forceinline__",
    half_headers="#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n",
)

OPENCL = Dialect(
    language="opencl",
    header="",
    kernel_prefix="__kernel __attribute__((reqd_work_group_size({bx}, {by}, {bz}))) void",
    global_pointer="__global ",
    restrict="restrict",
    shared="__local {decl} __attribute__((aligned(16)))",
    barrier="barrier(CLK_LOCAL_MEM_FENCE);",
    block_index="(int)get_group_id({dim})",
    thread_index="(int)get_local_id({dim})",
    types=_OPENCL_TYPES,
    float_suffix_math=False,
    helper_qualifier="inline",
)

DIALECTS = {"cuda": CUDA, "opencl": OPENCL}

# OpenCL C's built-in function names, which a kernel must not declare
_OPENCL_KEYWORDS = frozenset("""kernel global local constant private read_only write_only half uchar
ushort uint ulong barrier get_group_id get_local_id get_global_id get_local_size mad clamp mix sign
float2 float4 float8 float16 int2 int4 exp log tanh erf sqrt fabs pow fmax fmin floor ceil""".split())
_CUDA_KEYWORDS = frozenset("""threadIdx blockIdx blockDim gridDim warpSize __syncthreads expf logf tanhf
erff sqrtf fabsf powf fmaxf fminf floorf ceilf""".split())


def _is_long_fetch(s: ir.For) -> bool:
    """Whether `s` is a serial loop of more than LONG_FETCH steps whose body is one thread's
    share of a cooperative fetch (a thread index, perhaps a guard, one store into shared memory).

    nvcc unrolls such a loop whole by itself and hoists each step's address and padding tests out
    of the enclosing reduction loop: with 28-70 steps that alone took 255 registers and spilled
    (4 of the 5 spills among 640 sampled suite programs). Unrolled FETCH_UNROLL steps at a time,
    as many loads are in flight and none of those 4 spills. Shorter loops are left to nvcc: a
    partial unroll of an 11- or 13-step loop made ptxas settle on 32 registers and spill.
    """
    if s.kind != "serial" or s.unroll_hint or s.extent <= LONG_FETCH:
        return False
    body = s.body
    while True:
        if isinstance(body, ir.For) and body.kind in THREAD_KINDS:
            body = body.body
        elif isinstance(body, ir.IfThenElse) and body.orelse is None:
            body = body.then
        else:
            break
    return isinstance(body, ir.Store) and body.buffer.scope == "shared"


def _local_accesses(stmt: ir.Stmt):
    """The index tuples of every load and store of a local (register) array under `stmt`."""
    for node in ir.walk_stmts(stmt):
        exprs = []
        if isinstance(node, ir.Store):
            if node.buffer.scope == "local":
                yield node.indices
            exprs = [node.value, *node.indices]
        elif isinstance(node, ir.IfThenElse):
            exprs = [node.cond]
        for e in exprs:
            for sub in E.walk(e):
                if isinstance(sub, ir.BufferLoad) and sub.buffer.scope == "local":
                    yield sub.indices


def _indexes_registers(s: ir.For) -> bool:
    """Whether `s`'s variable is in the index of a local array in its body: such a loop must be
    unrolled whole, or the array cannot live in registers."""
    return any(v is s.var for idx in _local_accesses(s.body) for i in idx for v in E.free_vars(i))


def _nest_statements(stmt: ir.Stmt) -> int:
    """How many statements `stmt` becomes when every loop in it is unrolled."""
    if isinstance(stmt, ir.For):
        return stmt.extent * _nest_statements(stmt.body)
    if isinstance(stmt, ir.Seq):
        return sum(_nest_statements(x) for x in stmt.stmts)
    if isinstance(stmt, ir.IfThenElse):
        return _nest_statements(stmt.then) + (_nest_statements(stmt.orelse) if stmt.orelse else 0)
    if isinstance(stmt, ir.Allocate):
        return _nest_statements(stmt.body)
    return 1


class GPUPrinter(CLikePrinter):
    """Prints the `GPUKernel`s of a function `lower.gpu.lower_for_gpu` made."""

    INDEX_TYPE = "int"

    def __init__(self, func: ir.PrimFunc, dialect: Dialect,
                 max_unrolled_statements: int = MAX_UNROLLED_STATEMENTS):
        self.dialect = dialect
        self.max_unrolled_statements = max_unrolled_statements
        self.TYPES = dialect.types
        self.RESTRICT = dialect.restrict
        self.BARRIER = dialect.barrier
        self.KEYWORDS = C_KEYWORDS | (_OPENCL_KEYWORDS if dialect.language == "opencl" else _CUDA_KEYWORDS)
        self.PRELUDE: tuple[PreludePiece, ...] = _helpers(dialect.helper_qualifier)
        super().__init__(func)
        self.block = (1, 1, 1)
        self.copies = 1  # statement copies that the enclosing unrolled loops make
        # the kernels are the entry points: they get the function's name first
        self.names.names.pop(id(func), None)
        self.names.used.discard(self.fname)
        self.kernels = kernels_of(func)
        self.uses_half = False  # whether the text needs the half-float headers
        for b in func.params:
            if b.dtype in HALF_DTYPES:
                self._half_types(b.dtype)  # refused by name where the dialect has none
        self.fname = ""
        self.uses_mma = False  # whether a template's text uses Tensor Core fragments (mma.h)
        self.wgmma_shapes: set[tuple[int, str, int]] = set()  # the wgmma products the text calls
        if any(isinstance(s, ir.WrittenProgram) for k in self.kernels for s in ir.walk_stmts(k)):
            self.names.used |= TEMPLATE_LOCALS | WGMMA_LOCALS  # the names a template's text declares
        for k in self.kernels:
            self.names(k, k.name)

    # --- expressions --------------------------------------------------------------------------
    # float16/bfloat16 values are computed in float, as on the CPU: a load widens, every
    # operation's float result is rounded to the type (round to nearest even), a store narrows
    # the rounded value exactly. CUDA has the conversions in cuda_fp16.h and cuda_bf16.h.
    _WIDEN = {"float16": "__half2float", "bfloat16": "__bfloat162float"}
    _NARROW = {"float16": "__float2half_rn", "bfloat16": "__float2bfloat16_rn"}

    def _half_types(self, dtype: str) -> None:
        if not self.dialect.half_headers:
            raise TypeError(f"{self.dialect.language} kernels of {dtype} are not supported: compute in "
                            f"float32 on this target (the CPU and CUDA backends have {dtype})")
        self.uses_half = True

    def half_load(self, dtype: str, text: str) -> str:
        self._half_types(dtype)
        return f"{self._WIDEN[dtype]}({text})"

    def half_round(self, dtype: str, text: str) -> str:
        self._half_types(dtype)
        return f"{self._WIDEN[dtype]}({self._NARROW[dtype]}({text}))"

    def half_store(self, dtype: str, text: str) -> str:
        self._half_types(dtype)
        return f"{self._NARROW[dtype]}({text})"

    def cast(self, source: str, dtype: str, text: str) -> str:
        if source == "float64" and dtype == "float16":  # directly, as numpy rounds a double
            self._half_types(dtype)
            return f"__half2float(__double2half({text}))"
        if source == "float64" and dtype == "bfloat16":  # through float, as ml_dtypes converts
            return self.half_round(dtype, f"((float){text})")
        return super().cast(source, dtype, text)

    def math_function(self, name: str, dtype: str) -> str:
        if dtype == "float32" and self.dialect.float_suffix_math:
            return f"{name}f"
        return name

    # --- statements ---------------------------------------------------------------------------
    def loop(self, s: ir.For, depth: int, in_parallel: bool) -> None:
        var = self.names(s.var, s.var.name)
        self.ranges[id(s.var)] = (0, s.extent - 1)
        if s.kind in BLOCK_KINDS or s.kind in THREAD_KINDS:
            axis = s.kind[-1]
            pattern = self.dialect.block_index if s.kind in BLOCK_KINDS else self.dialect.thread_index
            index = pattern.format(axis=axis, dim=AXIS[axis])
            self.emit(f"const int {var} = {index};  /* {s.kind}, {s.extent} */", depth)
            if s.kind in THREAD_KINDS and s.extent < self.block[AXIS[axis]]:
                self.emit(f"if ({var} < {s.extent}) {{", depth)
                self.stmt(s.body, depth + 1, in_parallel)
                self.emit("}", depth)
            else:
                self.stmt(s.body, depth, in_parallel)
            return
        # Unrolling is the schedule's to decide, with two exceptions. A loop whose variable
        # indexes a local array is always unrolled: otherwise the array lives in local memory,
        # not registers. And a nest is counted with the copies that the unrolled loops around
        # it make (the schedule's auto-unroll depth counts only the nest itself): past
        # MAX_UNROLLED_STATEMENTS it stays rolled, and inside such copies a loop the schedule
        # left rolled is kept rolled, which nvcc would otherwise unroll when it is short. Both
        # kept nvcc from filling all 255 registers and spilling (BENCHMARKS.md).
        unrolled = False
        if s.kind == "vthread":  # a whole tile's work with its barriers: a loop, not unrolled copies
            self.emit("/* virtual threads, one after another */", depth)
        elif s.kind == "serial" and _indexes_registers(s):
            unrolled = True
        elif s.kind == "unrolled" or s.unroll_hint:
            unrolled = self.copies * _nest_statements(s) <= self.max_unrolled_statements
            if not unrolled:
                self.emit("#pragma unroll 1", depth)
        elif _is_long_fetch(s):
            self.emit(f"#pragma unroll {FETCH_UNROLL}", depth)
        elif s.kind == "serial" and self.copies > 1:  # nvcc would unroll it on its own
            self.emit("#pragma unroll 1", depth)
        if unrolled:
            self.emit("#pragma unroll", depth)
            self.copies *= s.extent
        self.emit(f"for ({self.INDEX_TYPE} {var} = 0; {var} < {s.extent}; ++{var}) {{", depth)
        self.stmt(s.body, depth + 1, in_parallel)
        self.emit("}", depth)
        if unrolled:
            self.copies //= s.extent

    def dialect_stmt(self, s: ir.Stmt, depth: int, in_parallel: bool) -> None:
        if isinstance(s, ir.WrittenProgram) and isinstance(s.template, GemmProgram):
            if self.dialect.language != "cuda":
                raise TypeError(f"the GEMM template has no {self.dialect.language} text: it targets CUDA")
            p = s.template
            if p.a.dtype in HALF_DTYPES:
                self._half_types(p.a.dtype)
            self.uses_mma |= p.instruction.kind == "wmma"
            if p.is_wgmma:
                self.wgmma_shapes.add((p.knobs.tile_n, p.a.dtype, 0 if p.match.b_transposed else 1))
            names = (self.names(b, b.name) for b in (p.a, p.b, p.c))
            self.lines.extend((gemm_wgmma_body if p.is_wgmma else gemm_cuda_body)(p, *names))
            return
        super().dialect_stmt(s, depth, in_parallel)

    def allocate(self, s: ir.Allocate, depth: int, in_parallel: bool) -> None:
        b = s.buffer
        name = self.names(b, b.name)
        ctype = self.TYPES[b.dtype]
        if b.scope == "shared":
            self.emit(self.dialect.shared.format(decl=f"{ctype} {name}[{b.size}]") + ";", depth)
            self.stmt(s.body, depth, in_parallel)
            return
        self.emit("{", depth)
        self.emit(f"{ctype} {name}[{b.size}];", depth + 1)
        self.stmt(s.body, depth + 1, in_parallel)
        self.emit("}", depth)

    # --- kernels ------------------------------------------------------------------------------
    def kernel_signature(self, k: ir.GPUKernel) -> str:
        written = {id(s.buffer) for s in ir.walk_stmts(k.body) if isinstance(s, ir.Store)}
        params = []
        for b in k.params:
            const = "const " if id(b) not in written else ""
            params.append(f"{self.dialect.global_pointer}{const}{self.TYPES[b.dtype]}* {self.RESTRICT} "
                          f"{self.names(b, b.name)}")
        return ", ".join(params)

    def kernel(self, k: ir.GPUKernel) -> str:
        self.lines = []
        self.block = k.block
        self.stmt(k.body, 1, False)
        bx, by, bz = k.block
        prefix = self.dialect.kernel_prefix.format(threads=k.threads, bx=bx, by=by, bz=bz)
        grid = " x ".join(map(str, k.grid))
        block = " x ".join(map(str, k.block))
        return (f"\n/* {grid} blocks of {block} threads */\n"
                f"{prefix} {self.names(k, k.name)}({self.kernel_signature(k)}) {{\n"
                + "\n".join(self.lines) + "\n}\n")

    def generate(self) -> str:
        kernels = self.kernels
        text = "".join(self.kernel(k) for k in kernels)
        launches = [{"name": self.names(k, k.name), "grid": list(k.grid), "block": list(k.block),
                     "args": [self.names(b, b.name) for b in k.params],
                     **({"shared": k.dynamic_shared_bytes} if k.dynamic_shared_bytes else {})} for k in kernels]
        buffers = [{"name": self.names(b, b.name), "shape": list(b.shape), "dtype": b.dtype,
                    "role": b.role if b.role in ("input", "output") else "temp"} for b in self.func.params]
        header = LAUNCH_PREFIX + json.dumps({"language": self.dialect.language, "kernels": launches,
                                             "buffers": buffers}, separators=(",", ":"))
        uses_double = any(b.dtype == "float64" for b in self.func.params) or "double" in text
        fp64 = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if uses_double and self.dialect is OPENCL else ""
        half = self.dialect.half_headers if self.uses_half else ""
        half += "#include <mma.h>\n" if self.uses_mma else ""
        wgmma = wgmma_prelude(self.wgmma_shapes) if self.wgmma_shapes else ""
        return header + "\n" + fp64 + half + self.dialect.header + self.prelude() + wgmma + text


def print_gpu(func: ir.PrimFunc, language: str,
              max_unrolled_statements: int = MAX_UNROLLED_STATEMENTS) -> tuple[str, str]:
    """(source, name of the first kernel) of a function of GPU kernels, in `language`
    ("cuda" or "opencl"); unrolled nests make at most `max_unrolled_statements` copies."""
    if language not in DIALECTS:
        raise ValueError(f"no GPU dialect {language!r}; known: {', '.join(DIALECTS)}")
    if not kernels_of(func):
        raise ValueError(f"{func.name!r} has no GPU kernels: run lower.gpu.lower_for_gpu first")
    printer = GPUPrinter(func, DIALECTS[language], max_unrolled_statements)
    source = printer.generate()
    return source, printer.names(printer.kernels[0], printer.kernels[0].name)

