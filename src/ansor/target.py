"""Target: the hardware a program is tuned for, with a stable key for records."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Target:
    """Hardware parameters the search and cost model use (after Ansor's HardwareParams)."""

    kind: str = "cpu"                # "cpu" | "cuda" | "opencl"
    isa: str = "generic"             # cpu: "avx512" | "avx2" | "generic"
    num_cores: int = 1
    vector_unit_bytes: int = 16
    cache_line_bytes: int = 64
    max_shared_memory_per_block: int = 0
    max_threads_per_block: int = 0
    max_vthread_extent: int = 0
    warp_size: int = 0

    @classmethod
    def host(cls, isa: str | None = None, num_cores: int | None = None) -> "Target":
        """The CPU this process runs on; `isa` and `num_cores` restrict it (an AVX-512 machine
        compiling for AVX2 only, one core of two) to stand for a smaller machine."""
        flags = _cpu_flags()
        best = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "generic"
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if isa is None:
            isa = best
        if isa not in CPU_ISAS:
            raise ValueError(f"unknown CPU ISA {isa!r}; known: {', '.join(CPU_ISAS)}")
        if list(CPU_ISAS).index(isa) < list(CPU_ISAS).index(best):
            raise ValueError(f"this CPU has no {isa} (its best is {best})")
        if num_cores is not None and not 1 <= num_cores <= cores:
            raise ValueError(f"num_cores must be between 1 and this machine's {cores}, got {num_cores}")
        return cls("cpu", isa, num_cores or cores, CPU_ISAS[isa], 64)

    @property
    def compile_flags(self) -> tuple[str, ...]:
        """Compiler flags (after -march=native) that keep code to the target's ISA."""
        return _ISA_FLAGS.get(self.isa, ()) if self.kind == "cpu" else ()

    @classmethod
    def cuda(cls, arch: str = "sm_90", shared_memory: int | None = None, max_threads: int = 1024) -> "Target":
        """An NVIDIA GPU of compute capability `arch` ("sm_80", "sm_90", ...): 32-thread warps,
        at most `max_threads` threads and `shared_memory` bytes of static shared memory per block
        (48 KiB, the most a kernel gets without opting in to more)."""
        if not re.fullmatch(r"sm_\d{2,3}[a-z]?", arch):
            raise ValueError(f"CUDA architecture must look like 'sm_90', got {arch!r}")
        return cls("cuda", arch, 1, 16, 128, shared_memory or 48 * 1024, max_threads, 8, 32)

    @classmethod
    def opencl(cls, device: str = "pocl-cpu", shared_memory: int = 48 * 1024, max_threads: int = 256,
               warp_size: int = 32) -> "Target":
        """An OpenCL device named by `device` (a short stable name: "pocl-cpu" is PoCL on this
        machine's CPU, used to check GPU programs without a GPU; "nvidia-h100" a real GPU), so
        OpenCL-on-CPU timings never mix with a GPU's in the records."""
        name = re.sub(r"[^a-z0-9_.]+", "-", device.lower()).strip("-")
        if not name:
            raise ValueError("an OpenCL target needs a device name")
        return cls("opencl", name, 1, 16, 64, shared_memory, max_threads, 8, warp_size)

    @property
    def is_gpu(self) -> bool:
        """Programs for this target bind loops to blocks and threads."""
        return self.kind in GPU_KINDS

    @property
    def key(self) -> str:
        """Stable text naming the target in the database (same machine kind -> same key)."""
        if self.kind == "cpu":
            return f"cpu-{platform.machine() or 'unknown'}-{self.isa}-{self.num_cores}c"
        return f"{self.kind}-{self.isa}"

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers (zmm0-31 with AVX-512, ymm/xmm0-15 otherwise)."""
        return 32 if self.isa == "avx512" else 16

    def describe(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return self.key


#: Target kinds whose programs run as GPU kernels.
GPU_KINDS = ("cuda", "opencl")

#: CPU instruction sets, widest first, with their vector width in bytes.
CPU_ISAS = {"avx512": 64, "avx2": 32, "generic": 16}
_ISA_FLAGS = {"avx2": ("-mno-avx512f",), "generic": ("-mno-avx",)}


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
