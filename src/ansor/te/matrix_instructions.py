"""Matrix instructions described as tiny computations, and the stages they can compute.

A matrix instruction (a Hopper warpgroup's `wgmma` product, a Tensor Core's WMMA 16x16x16
product, or the plain fused multiply-add of one thread) is declared with te like any workload: `C[i, j] = sum(A[i, k] * B[k, j])` of
its own shape and element types. A stage can use the instruction when its body has the same
form: one sum over one reduce axis of a product of two input reads, each operand converted
the way the instruction converts it, the operands indexed by (row, reduce) and (reduce,
column) or (column, reduce), which the instruction reads as a column-major B. The matcher
compares the canonical form of the two bodies (`body_form`), so what an instruction computes
is stated once, in te, and never restated as pattern code.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ansor.te import expr as E
from ansor.te.tensor import ComputeOp, PlaceholderOp, Tensor, compute, placeholder, reduce_axis


@dataclass(frozen=True)
class MatrixInstruction:
    """The product of an m x k and a k x n tile of `operand_dtype`, accumulated in
    `accumulate_dtype`, that `threads` threads issue together; usable on compute capabilities
    `min_arch` to `max_arch` (0: no upper bound). `kind` names the template text that uses it:
    "wgmma" (a warpgroup, operands in swizzled shared memory), "wmma" (a warp's fragments) or
    "fma" (one thread's multiply-add). For wgmma, m x n x k is the template's granularity (a
    warpgroup's 64 rows, 64-column swizzle atoms, 64-deep k tiles), not one instruction's."""

    name: str
    m: int
    n: int
    k: int
    operand_dtype: str
    accumulate_dtype: str
    min_arch: int
    tensor_core: bool
    kind: str = "wmma"
    threads: int = 32
    max_arch: int = 0

    def declaration(self) -> tuple[Tensor, Tensor, Tensor]:
        """The instruction as a te computation: (A, B, C)."""
        a = placeholder((self.m, self.k), self.operand_dtype, name="A")
        b = placeholder((self.k, self.n), self.operand_dtype, name="B")
        k = reduce_axis(self.k, name="k")
        acc = self.accumulate_dtype
        if acc == self.operand_dtype:
            c = compute((self.m, self.n), lambda i, j: E.sum(a[i, k] * b[k, j], axis=k), name="C")
        else:
            c = compute((self.m, self.n), lambda i, j: E.sum(a[i, k] * b[k, j], axis=k, dtype=acc), name="C")
        return a, b, c

    @cached_property
    def form(self) -> tuple:
        """The canonical form of the declaration's body (see `body_form`)."""
        return body_form(self.declaration()[2].op)[0]


#: Hopper's warpgroup products (`wgmma.mma_async`, sm_90a): 4 warps issue 64 x N x 16 products
#: from shared memory, asynchronously; compute capability 9.0 only (Blackwell has tcgen05 instead)
WGMMA_F16 = MatrixInstruction("wgmma_m64nNk16_f16_f32", 64, 64, 64, "float16", "float32", 90, True,
                              "wgmma", 128, 90)
WGMMA_BF16 = MatrixInstruction("wgmma_m64nNk16_bf16_f32", 64, 64, 64, "bfloat16", "float32", 90, True,
                               "wgmma", 128, 90)
#: Tensor Core products of one warp (nvcuda::wmma fragments): float16 from Volta, bfloat16 from
#: Ampere; both accumulate in float32
WMMA_F16 = MatrixInstruction("wmma_m16n16k16_f16_f32", 16, 16, 16, "float16", "float32", 70, True)
WMMA_BF16 = MatrixInstruction("wmma_m16n16k16_bf16_f32", 16, 16, 16, "bfloat16", "float32", 80, True)
#: one thread's float32 fused multiply-add (the sgemm instruction)
FMA_F32 = MatrixInstruction("fma_f32", 1, 1, 1, "float32", "float32", 0, False, "fma", 1)
#: in order of preference: the first that fits a stage computes it
INSTRUCTIONS = (WGMMA_F16, WGMMA_BF16, WMMA_F16, WMMA_BF16, FMA_F32)


@dataclass(frozen=True)
class GemmMatch:
    """A stage that computes C[M, N] = sum_k A[M, K] * B (B stored [K, N], or [N, K] when
    `b_transposed`), with the instruction that can compute it."""

    instruction: MatrixInstruction
    a: Tensor
    b: Tensor
    m: int
    n: int
    k: int
    b_transposed: bool


def body_form(op: ComputeOp) -> tuple[tuple, tuple[Tensor, ...], bool] | None:
    """(form, operands, b_transposed) of a matmul-shaped body, or None. The form names axes by
    role (i, j: the output's, k: the reduction's) and operands by order of reading (A, B), with
    every dtype and conversion kept; B read as [j, k] has the form of B read as [k, j], with
    `b_transposed` set."""
    body = op.body
    if not isinstance(body, E.Reduce) or body.combiner != "sum" or body.where is not None:
        return None
    if len(op.axes) != 2 or len(body.axes) != 1:
        return None
    roles = {id(op.axes[0]): "i", id(op.axes[1]): "j", id(body.axes[0]): "k"}
    operands: list[Tensor] = []
    transposed = [False]

    def form(e: E.Expr) -> tuple | None:
        if isinstance(e, E.Cast):
            inner = form(e.value)
            return None if inner is None else ("cast", e.dtype, inner)
        if isinstance(e, E.BinOp) and e.op == "*":
            a, b = form(e.a), form(e.b)
            return None if a is None or b is None else ("mul", e.dtype, a, b)
        if isinstance(e, E.TensorRead) and isinstance(e.tensor.op, PlaceholderOp):
            if not all(isinstance(x, E.IterVar) and id(x) in roles for x in e.indices):
                return None
            axes = tuple(roles[id(x)] for x in e.indices)
            role = "AB"[len(operands)] if len(operands) < 2 else "?"
            operands.append(e.tensor)
            if role == "B" and axes == ("j", "k"):
                transposed[0] = True
                axes = ("k", "j")
            return ("read", role, e.dtype, axes)
        return None

    source = form(body.source)
    if source is None or len(operands) != 2 or operands[0] is operands[1]:
        return None
    return ("sum", body.dtype, source), tuple(operands), transposed[0]


def match_gemm(op, arch: int, instructions: tuple[MatrixInstruction, ...] = INSTRUCTIONS) -> GemmMatch | None:
    """The first of `instructions` usable on compute capability `arch` whose form `op`'s body
    has, with every extent a multiple of the instruction's shape; None when none fits."""
    if not isinstance(op, ComputeOp) or op.attrs.get("template"):
        return None
    found = body_form(op)
    if found is None:
        return None
    form, (a, b), b_transposed = found
    m, n = op.shape
    k = op.body.axes[0].extent
    for ins in instructions:
        usable = arch >= ins.min_arch and (not ins.max_arch or arch <= ins.max_arch)
        if ins.form == form and usable and m % ins.m == 0 and n % ins.n == 0 and k % ins.k == 0:
            return GemmMatch(ins, a, b, m, n, k, b_transposed)
    return None
