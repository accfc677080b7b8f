"""The GPU backends: CUDA (built by nvcc, run through CuPy on an NVIDIA GPU) and OpenCL (built
and run through pyopencl: on a GPU, or on PoCL on the CPU, where GPU programs are checked
without a GPU).

Both lower the same way (`lower.gpu`: kernels, launch shapes, shared memory, barriers, the
target's limits) and print with one printer in two dialects (`codegen.gpu`). The measurement
modules are imported only when a program is built or run, so CUDA sources can be generated
and inspected on a machine without pyopencl, CuPy or a GPU.
"""

from __future__ import annotations

from typing import Any

from ansor.backend import Backend, Capabilities, Printer, register_backend
from ansor.codegen.gpu import MAX_UNROLLED_STATEMENTS, REFIT_UNROLLED_STATEMENTS, print_gpu
from ansor.lower import ir
from ansor.lower.gpu import GPULimits, lower_for_gpu
from ansor.target import Target

LOCAL_MEMORY_BYTES = 4096  # private arrays per thread: beyond this they live in slow local memory


def gpu_capabilities(target: Target) -> Capabilities:
    return Capabilities(thread_binding=True, shared_memory_bytes=target.max_shared_memory_per_block,
                        max_threads_per_block=target.max_threads_per_block, warp_size=target.warp_size,
                        max_vthread=target.max_vthread_extent, local_memory_bytes=LOCAL_MEMORY_BYTES)


def gpu_kernels(func: ir.PrimFunc, caps: Capabilities) -> ir.PrimFunc:
    """The lowering pass of both GPU backends (verifies the target's limits)."""
    limits = GPULimits(max_threads=caps.max_threads_per_block, shared_bytes=caps.shared_memory_bytes,
                       max_vthread=caps.max_vthread, local_bytes=caps.local_memory_bytes)
    return lower_for_gpu(func, limits)


def opencl_platform_of(target: Target) -> str:
    """The OpenCL platform a target's device name points to."""
    if target.isa.startswith("pocl"):
        return "Portable Computing Language"
    if target.isa.startswith("oclgrind"):
        return "Oclgrind"
    return ""  # the first platform with a GPU


def _opencl_builder(target: Target | None = None, **options) -> Any:
    from ansor.measure.opencl import OpenCLBuilder
    platform = opencl_platform_of(target) if target is not None else "Portable Computing Language"
    return OpenCLBuilder(platform=platform, **options)


def _opencl_loader(path: str, entry: str) -> Any:
    from ansor.measure.opencl import OpenCLKernel
    return OpenCLKernel(path, entry)


def _opencl_runner(*args, **kwargs) -> Any:
    from ansor.measure.opencl import OpenCLRunner
    return OpenCLRunner(*args, **kwargs)


def _cuda_builder(target: Target | None = None, **options) -> Any:
    from ansor.measure.cuda import CudaBuilder
    return CudaBuilder(arch=target.isa if target is not None else "sm_90", **options)


def _cuda_loader(path: str, entry: str) -> Any:
    from ansor.measure.cuda import CudaKernel
    return CudaKernel(path, entry)


def _cuda_runner(*args, **kwargs) -> Any:
    from ansor.measure.cuda import CudaRunner
    return CudaRunner(*args, **kwargs)


def _cuda_printer(max_unrolled_statements: int = MAX_UNROLLED_STATEMENTS) -> Printer:
    return lambda func, caps: print_gpu(func, "cuda", max_unrolled_statements)


# ptxas spills a few programs' registers however the printer counts unrolled copies (2 of 3,200
# sampled suite programs): those are printed again with shorter unrolled nests
CUDA = Backend(kind="cuda", language="cuda", capabilities_of=gpu_capabilities, passes=(gpu_kernels,),
               printer=_cuda_printer(), builder=_cuda_builder, loader=_cuda_loader, runner=_cuda_runner,
               refit_printers=tuple(_cuda_printer(n) for n in REFIT_UNROLLED_STATEMENTS))
OPENCL = Backend(kind="opencl", language="opencl", capabilities_of=gpu_capabilities, passes=(gpu_kernels,),
                 printer=lambda func, caps: print_gpu(func, "opencl"), builder=_opencl_builder,
                 loader=_opencl_loader, runner=_opencl_runner)
register_backend(CUDA)
register_backend(OPENCL)
