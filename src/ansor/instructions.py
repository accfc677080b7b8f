"""Dot-product instructions described as tiny computations, so that a stage can be matched
against them, tiled to their shape and its constant operand packed into their layout.

Each instruction computes, for every lane `l` of an accumulator vector,

    acc[l] += sum(lhs[t] * rhs[l * depth + t] for t in range(depth))

in the accumulator's type: `lhs` is `depth` consecutive elements of a row (broadcast to every
lane as one 32-bit word), `rhs` holds `depth` consecutive reduction elements per lane, lanes
after each other (a [.., K/depth, lanes, depth] layout). vpdpbusd multiplies unsigned by
signed bytes and adds the four int16-exact products to an int32 lane, wrapping as numpy's
int32 does; vdpbf16ps adds two bfloat16 products to a float32 lane.

AMX's tile instructions (tdpbusd, tdpbf16ps) compute the same sums for up to 16 rows of
accumulators at once, 16 of the vector instruction's steps deep: their right operand tile is 16
rows of the vector instruction's packed chunks (one row per step of `depth`), so a stage packed
for vpdpbusd or vdpbf16ps is packed for them too. They are never matched against a stage on
their own; the lowering (`lower/dot_product.py`) writes a register tile of the vector
instruction as tiles where the CPU has AMX and the tile's shape allows (`amx_form`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DotProductInstruction:
    """One instruction: its operand and accumulator types, its shape, the CPU feature that
    has it, and the C intrinsic that emits it."""

    name: str                  # the mnemonic
    feature: str               # the /proc/cpuinfo flag (`Target.dot_products`)
    lhs_dtype: str             # the broadcast row operand
    rhs_dtype: str             # the packed operand
    acc_dtype: str
    depth: int                 # products summed into each lane per instruction
    vector_bytes: int          # width of the accumulator vector (AMX: one tile row)
    intrinsic: str             # the immintrin.h function, or "" where ansor emits none yet
    rows: int = 1              # accumulator rows per instruction (AMX: 16)

    @property
    def lanes(self) -> int:
        """Accumulators per vector."""
        return self.vector_bytes // 4

    @property
    def emitted(self) -> bool:
        """Whether the printer writes programs that use it."""
        return bool(self.intrinsic)


INSTRUCTIONS: tuple[DotProductInstruction, ...] = (
    DotProductInstruction("vpdpbusd", "avx512_vnni", "uint8", "int8", "int32", 4, 64, "_mm512_dpbusd_epi32"),
    DotProductInstruction("vpdpbusd", "avx_vnni", "uint8", "int8", "int32", 4, 32, "_mm256_dpbusd_avx_epi32"),
    DotProductInstruction("vdpbf16ps", "avx512_bf16", "bfloat16", "bfloat16", "float32", 2, 64, "_mm512_dpbf16_ps"),
    DotProductInstruction("tdpbusd", "amx_int8", "uint8", "int8", "int32", 4, 64, "ansor_tile_dpbusd", rows=16),
    DotProductInstruction("tdpbf16ps", "amx_bf16", "bfloat16", "bfloat16", "float32", 2, 64, "ansor_tile_dpbf16ps",
                          rows=16),
)

#: Steps of the vector instruction's depth that one tile instruction sums per row (64 bytes).
AMX_STEPS = 16


def available_instructions(features: tuple[str, ...], vector_bytes: int) -> list[DotProductInstruction]:
    """The emitted vector instructions of a CPU with these dot-product `features` whose vectors
    are `vector_bytes` wide (an AVX2 target uses AVX-VNNI's 256-bit vpdpbusd, not AVX512-VNNI's)."""
    return [ins for ins in INSTRUCTIONS
            if ins.emitted and ins.rows == 1 and ins.feature in features and ins.vector_bytes == vector_bytes]


def amx_form(vector: DotProductInstruction, features: tuple[str, ...]) -> DotProductInstruction | None:
    """The AMX tile instruction that computes `vector`'s sums (same operand and accumulator
    types, 64-byte rows), where the CPU has it (its AMX feature and the tile registers)."""
    if vector.vector_bytes != 64 or "amx_tile" not in features:
        return None
    types = (vector.lhs_dtype, vector.rhs_dtype, vector.acc_dtype)
    return next((ins for ins in INSTRUCTIONS
                 if ins.rows > 1 and ins.feature in features
                 and (ins.lhs_dtype, ins.rhs_dtype, ins.acc_dtype) == types),
                None)


def find_instruction(features: tuple[str, ...], vector_bytes: int, lhs_dtype: str, rhs_dtype: str,
                     acc_dtype: str) -> DotProductInstruction | None:
    """The instruction that computes a sum of `lhs_dtype` x `rhs_dtype` products in
    `acc_dtype` on this CPU, or None (the stage keeps its widening loop)."""
    for ins in available_instructions(features, vector_bytes):
        if (ins.lhs_dtype, ins.rhs_dtype, ins.acc_dtype) == (lhs_dtype, rhs_dtype, acc_dtype):
            return ins
    return None
