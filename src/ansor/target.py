"""Target: the hardware a program is tuned for, with a stable key for records."""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import re
import sys
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
    #: the CPU's dot-product instruction sets, as /proc/cpuinfo names them (`DOT_PRODUCT_FEATURES`):
    #: part of the description, not of the key, so records of float32 programs made before
    #: targets knew them are still found (an int8 or bfloat16 workload has keys of its own)
    dot_products: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "dot_products", tuple(self.dot_products))  # a list from JSON
        unknown = [f for f in self.dot_products if f not in DOT_PRODUCT_FEATURES]
        if unknown:
            raise ValueError(f"unknown dot-product instruction set(s) {', '.join(unknown)}; "
                             f"known: {', '.join(DOT_PRODUCT_FEATURES)}")

    @classmethod
    def host(cls, isa: str | None = None, num_cores: int | None = None,
             dot_products: tuple[str, ...] | None = None) -> "Target":
        """The CPU this process runs on; `isa`, `num_cores` and `dot_products` restrict it (an
        AVX-512 machine compiling for AVX2 only, one core of two, no VNNI) to stand for a
        smaller machine."""
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
        present = tuple(f for f in DOT_PRODUCT_FEATURES if f in flags and _fits_isa(f, isa)
                        and (not f.startswith("amx") or _amx_permitted()))
        if dot_products is None:
            dot_products = present
        missing = [f for f in dot_products if f not in present]
        if missing:
            raise ValueError(f"this CPU has no {', '.join(missing)} under {isa} "
                             f"(it has: {', '.join(present) or 'none'})")
        return cls("cpu", isa, num_cores or cores, CPU_ISAS[isa], 64, dot_products=tuple(dot_products))

    @classmethod
    def cpu(cls, isa: str = "avx512", num_cores: int = 1, dot_products: tuple[str, ...] = ()) -> "Target":
        """A CPU that may be another machine than this one (programs for it are compiled here
        with its instruction sets, and run only where it is): `dot_products` as /proc/cpuinfo
        names them, e.g. ("avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")."""
        if isa not in CPU_ISAS:
            raise ValueError(f"unknown CPU ISA {isa!r}; known: {', '.join(CPU_ISAS)}")
        wrong = [f for f in dot_products if f in DOT_PRODUCT_FEATURES and not _fits_isa(f, isa)]
        if wrong:
            raise ValueError(f"{', '.join(wrong)} need AVX-512; the ISA is {isa}")
        return cls("cpu", isa, num_cores, CPU_ISAS[isa], 64, dot_products=tuple(dot_products))

    @property
    def compile_flags(self) -> tuple[str, ...]:
        """Compiler flags (after -march=native) that keep code to the target's ISA."""
        return _ISA_FLAGS.get(self.isa, ()) if self.kind == "cpu" else ()

    @property
    def instruction_flags(self) -> tuple[str, ...]:
        """Compiler flags (after `compile_flags`) that give gcc exactly the target's dot-product
        instruction sets: a program for a VNNI machine compiles on one without (it is not run
        there), and a target restricted to none gets no VNNI code from gcc either."""
        if self.kind != "cpu":
            return ()
        return tuple(("-m" if f in self.dot_products else "-mno-") + _FEATURE_FLAGS[f]
                     for f in DOT_PRODUCT_FEATURES if _fits_isa(f, self.isa))

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

#: /proc/cpuinfo flags of the dot-product instruction sets ansor knows, and gcc's names for them:
#: AVX512-VNNI and AVX-VNNI (vpdpbusd on 512- and 256-bit vectors), AVX512-BF16 (vdpbf16ps),
#: AMX (tile registers; tdpbusd, tdpbf16ps)
DOT_PRODUCT_FEATURES = ("avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
_FEATURE_FLAGS = {"avx512_vnni": "avx512vnni", "avx_vnni": "avxvnni", "avx512_bf16": "avx512bf16",
                  "amx_tile": "amx-tile", "amx_int8": "amx-int8", "amx_bf16": "amx-bf16"}
_NEEDS_AVX512 = ("avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def _fits_isa(feature: str, isa: str) -> bool:
    """Whether code for `isa` may use the instruction set `feature` (gcc's -mno-avx512f
    turns off every AVX-512 extension, and AMX is used beside AVX-512 only)."""
    if isa == "generic":
        return False
    return isa == "avx512" or feature not in _NEEDS_AVX512


@functools.lru_cache(maxsize=1)
def _amx_permitted() -> bool:
    """Whether Linux gives this process AMX's tile state (ARCH_REQ_XCOMP_PERM, kernels from
    5.16): without it the first tile instruction kills the process, so a CPU whose kernel
    refuses is treated as one without AMX."""
    if platform.machine() != "x86_64" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XTILEDATA
    except (OSError, AttributeError):
        return False


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
