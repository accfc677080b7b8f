"""The CPU backend: C with OpenMP and GCC vector extensions, compiled by gcc into a shared
library that ctypes calls (inputs, then outputs, then packed buffers, as pointers)."""

from __future__ import annotations

from ansor.backend import Backend, Capabilities, register_backend
from ansor.codegen.cpu import print_c
from ansor.lower import ir
from ansor.lower.dot_product import form_dot_product_tiles
from ansor.lower.prefetch import prefetch_next_tasks
from ansor.lower.register_tile import form_register_tiles, form_register_tiles_for_analysis
from ansor.lower.small_parallel import serial_small_kernels
from ansor.lower.transposed_store import form_transposed_stores
from ansor.lower.unswitch import unswitch_bounds_checks, unswitched_as_scheduled
from ansor.measure import DEFAULT_CFLAGS, Builder, KernelLibrary, Runner
from ansor.target import Target


def cpu_capabilities(target: Target) -> Capabilities:
    return Capabilities(vector_bytes=target.vector_unit_bytes, vector_registers=target.vector_registers,
                        parallel_loops=True, threads=target.num_cores, dot_products=target.dot_products)


def cpu_builder(target: Target | None = None, **options) -> Builder:
    """A builder whose flags keep the code to the target's ISA (an AVX2 target compiled on an
    AVX-512 machine has no AVX-512 instruction)."""
    flags = DEFAULT_CFLAGS + ((target.compile_flags + target.instruction_flags) if target is not None else ())
    return Builder(cflags=options.pop("cflags", flags), **options)


def serial_when_small(func: ir.PrimFunc, caps: Capabilities) -> ir.PrimFunc:
    return serial_small_kernels(func)


def dot_product_tiles(func: ir.PrimFunc, caps: Capabilities) -> ir.PrimFunc:
    return form_dot_product_tiles(func, caps.dot_products, caps.vector_bytes, caps.vector_registers)


def register_tiles(func: ir.PrimFunc, caps: Capabilities) -> ir.PrimFunc:
    return form_register_tiles(func, caps.vector_bytes, caps.vector_registers)


def register_tiles_for_analysis(func: ir.PrimFunc, caps: Capabilities) -> ir.PrimFunc:
    return form_register_tiles_for_analysis(func, caps.vector_bytes, caps.vector_registers)


def next_task_prefetches(func: ir.PrimFunc, caps: Capabilities) -> ir.PrimFunc:
    return prefetch_next_tasks(func)


def transposed_stores(func: ir.PrimFunc, caps: Capabilities) -> ir.PrimFunc:
    return form_transposed_stores(func, caps.vector_bytes)


def unswitched_bounds_checks(func: ir.PrimFunc, caps: Capabilities) -> ir.PrimFunc:
    return unswitch_bounds_checks(func)


def unswitched_for_analysis(func: ir.PrimFunc, caps: Capabilities) -> ir.PrimFunc:
    return unswitched_as_scheduled(func)


CPU = Backend(
    kind="cpu",
    language="c",
    capabilities_of=cpu_capabilities,
    # small kernels serial first (it counts plain loops); tiles next: their nests are vector code
    # already; checks unswitched in the plain nests left
    passes=(serial_when_small, dot_product_tiles, register_tiles, next_task_prefetches, transposed_stores,
            unswitched_bounds_checks),
    analysis_passes=(serial_when_small, dot_product_tiles, register_tiles_for_analysis, transposed_stores,
                     unswitched_for_analysis),
    analyses_read_prepack=False,
    printer=lambda func, caps: print_c(func, caps.threads),
    builder=cpu_builder,
    loader=KernelLibrary,
    runner=Runner,
)
register_backend(CPU)


def generate_c(func: ir.PrimFunc, vector_bytes: int = 0, vector_registers: int = 16,
               dot_products: tuple[str, ...] = ()) -> tuple[str, str]:
    """(C source, entry function name) of a lowered function for a CPU with `vector_bytes` wide
    vectors (0: none, so neither register tiles nor transposed stores), `vector_registers` and
    the dot-product instruction sets `dot_products`."""
    caps = Capabilities(vector_bytes=vector_bytes, vector_registers=vector_registers, parallel_loops=True,
                        dot_products=dot_products)
    for fitted in CPU.passes:
        func = fitted(func, caps)
    return print_c(func)
