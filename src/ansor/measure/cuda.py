"""Generated CUDA programs: nvcc builds them to cubins and reports each kernel's resources;
CuPy loads and runs them where there is a GPU.

Without a GPU, a build still tells a lot: whether the program compiles for the architecture,
and what ptxas allots each kernel (registers, shared memory, barriers, stack). A register
spill makes the build fail: such a program would be slow on the GPU, so a search should not
keep it. The cubin path is the "library" a loader opens; the source (with its launch plan)
stays beside it as `<hash>.cu`, and ptxas's report as `<hash>.resources.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .build import MAX_ERROR_CHARS, BuildResult, CachedBuilder, _write_atomically, run_compiler
from .errors import DeviceUnavailableError, MeasureErrorNo
from .gpu_module import DeviceKernel, GPUModule
from .run import Runner
from .timing import TimingPolicy

NO_DEVICE_MESSAGE = "no CUDA device: CUDA programs can be built and inspected here, not run"
INSTALL_HINT = "pip install 'ansor[cuda]'"


class NoCudaDeviceError(DeviceUnavailableError):
    """CuPy or a CUDA GPU is missing: programs can be built, not run."""


def nvcc_available(nvcc: str = "nvcc") -> bool:
    """Whether the CUDA compiler can be found."""
    return shutil.which(nvcc) is not None


def _normalize_arch(arch: str) -> str:
    arch = arch.strip()
    return f"sm_{arch}" if arch.isdigit() else arch


def nvcc_arch(arch: str) -> str:
    """The -arch nvcc builds for: sm_90 as sm_90a, whose cubins run on every compute-capability
    9.0 GPU and may hold Hopper's own instructions (wgmma), which plain sm_90 refuses."""
    arch = _normalize_arch(arch)
    return "sm_90a" if arch == "sm_90" else arch


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USAGE = {
    "registers": re.compile(r"Used (\d+) registers"),
    "barriers": re.compile(r"used (\d+) barriers"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "constant_bytes": re.compile(r"(\d+) bytes cmem\[0\]"),
}


def parse_ptxas_resources(output: str) -> dict[str, dict[str, int]]:
    """Per function, what `ptxas -v` reported: registers, barriers, shared_bytes, constant_bytes,
    stack_bytes, spill_stores, spill_loads (bytes; 0 where not mentioned)."""
    resources: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None

    def entry(name: str) -> dict[str, int]:
        return resources.setdefault(name, {
            "registers": 0, "barriers": 0, "shared_bytes": 0, "constant_bytes": 0,
            "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0,
        })

    for line in output.splitlines():
        if match := _ENTRY.search(line) or _PROPERTIES.search(line):
            current = entry(match.group(1))
        elif current is not None and (match := _FRAME.search(line)):
            current["stack_bytes"], current["spill_stores"], current["spill_loads"] = (
                int(group) for group in match.groups())
        elif current is not None and "Used " in line:
            for key, pattern in _USAGE.items():
                if found := pattern.search(line):
                    current[key] = int(found.group(1))
    return resources


class CudaBuilder(CachedBuilder):
    """Compiles CUDA programs to cubins with nvcc, cached by source hash, several at a time.

    The interface of `measure.Builder`; each BuildResult's `resources` holds the per-kernel
    report of ptxas. An nvcc error, a kernel of the launch plan missing from the cubin, or a
    register spill (unless `allow_spills`) is a COMPILE_HOST result whose message says why.
    """

    def __init__(
        self,
        arch: str = "sm_90",
        cache_dir: str | Path | None = None,
        n_parallel: int | None = None,
        timeout: float = 60.0,
        nvcc: str = "nvcc",
        flags: Sequence[str] = (),
        allow_spills: bool = False,
    ) -> None:
        super().__init__(cache_dir, n_parallel, timeout)
        self.arch = _normalize_arch(arch)
        self.nvcc = nvcc
        self.flags = tuple(flags)
        self.allow_spills = allow_spills

    def command(self, cu_path: str, cubin_path: str) -> list[str]:
        return [self.nvcc, "-cubin", f"-arch={nvcc_arch(self.arch)}", "-Xptxas", "-v", *self.flags,
                "-o", cubin_path, cu_path]

    def source_hash(self, source: str) -> str:
        """Cache key: the same text compiled by the same command (arch and flags)."""
        key = "\0".join((source, *self.command("", "")))
        return hashlib.sha256(key.encode()).hexdigest()

    SUFFIX = ".cubin"

    def _build_one(self, source_hash: str, source: str) -> BuildResult:
        ok = int(MeasureErrorNo.NO_ERROR)
        cubin = self.cache_dir / f"{source_hash}.cubin"
        report = self.cache_dir / f"{source_hash}.resources.json"
        if cubin.exists() and report.exists():
            return BuildResult(source_hash, str(cubin), ok, "", 0.0, json.loads(report.read_text()))
        try:
            module = GPUModule.parse(source)
        except ValueError as err:
            return BuildResult(source_hash, None, int(MeasureErrorNo.COMPILE_HOST), str(err), 0.0)
        if module.language != "cuda":
            return BuildResult(source_hash, None, int(MeasureErrorNo.COMPILE_HOST),
                               f"not a CUDA program: the header says {module.language!r}", 0.0)

        # the source keeps its hash name: nvcc's messages point at a file one can open, and a
        # loader finds the launch plan beside the cubin
        cu_path = self.cache_dir / f"{source_hash}.cu"
        _write_atomically(cu_path, source.encode())
        fd, tmp_cubin = tempfile.mkstemp(prefix=f".{source_hash}.", suffix=".cubin", dir=self.cache_dir)
        os.close(fd)
        start = time.perf_counter()
        try:
            error_no, output = run_compiler(self.command(str(cu_path), tmp_cubin), self.timeout)
            seconds = time.perf_counter() - start
            if error_no != MeasureErrorNo.NO_ERROR:
                return BuildResult(source_hash, None, int(error_no), output[:MAX_ERROR_CHARS], seconds)
            resources = parse_ptxas_resources(output)
            problem = self._problem(module, resources)
            if problem is not None:
                return BuildResult(source_hash, None, int(MeasureErrorNo.COMPILE_HOST), problem,
                                   seconds, resources)
            _write_atomically(report, json.dumps(resources, indent=1).encode())
            os.replace(tmp_cubin, cubin)  # readers only ever see a complete cubin
            return BuildResult(source_hash, str(cubin), ok, "", seconds, resources)
        finally:
            if os.path.exists(tmp_cubin):
                os.unlink(tmp_cubin)

    def _problem(self, module: GPUModule, resources: dict[str, dict[str, int]]) -> str | None:
        missing = [k.name for k in module.kernels if k.name not in resources]
        if missing:
            return (f"the launch plan names kernels the cubin lacks: {', '.join(missing)} "
                    f"(compiled: {', '.join(sorted(resources)) or 'none'}; declare them extern \"C\")")
        for name, usage in resources.items():
            if not self.allow_spills and (usage["spill_stores"] or usage["spill_loads"]):
                return (f"register spill in {name}: {usage['spill_stores']} bytes spill stores, "
                        f"{usage['spill_loads']} bytes spill loads with {usage['registers']} "
                        f"registers ({self.arch})")
        return None


def _cupy() -> Any:
    """CuPy with at least one CUDA device, else NoCudaDeviceError."""
    try:
        import cupy
    except ImportError:
        raise NoCudaDeviceError(f"{NO_DEVICE_MESSAGE} (CuPy is not installed: {INSTALL_HINT})") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # noqa: BLE001 - CUDARuntimeError without a driver
        raise NoCudaDeviceError(f"{NO_DEVICE_MESSAGE} ({err})") from None
    if count < 1:
        raise NoCudaDeviceError(NO_DEVICE_MESSAGE)
    return cupy


def _device_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a buffer has on the device: CuPy has no bfloat16, so its bits travel as uint16
    (the kernel reads them as __nv_bfloat16)."""
    return np.dtype(np.uint16) if dtype == np.dtype("bfloat16") else dtype


#: dynamic shared memory a kernel may take without opting in to more
DEFAULT_SHARED_BYTES = 48 * 1024


def kernel_launches(raw: Any, module: GPUModule, arrays: dict[str, Any]) -> list[tuple]:
    """Per kernel of `module`'s launch plan, in order: its function in `raw` (a loaded
    cupy.RawModule), grid, block, arguments (`arrays` by buffer name) and dynamic shared
    memory; a kernel that needs more than the default has its limit raised here, once."""
    launches = []
    for k in module.kernels:
        function = raw.get_function(k.name)
        if k.shared_bytes > DEFAULT_SHARED_BYTES:
            function.max_dynamic_shared_size_bytes = k.shared_bytes
        launches.append((function, k.grid, k.block, tuple(arrays[name] for name in k.args), k.shared_bytes))
    return launches


def launch_all(launches: Sequence[tuple]) -> None:
    """Launch `kernel_launches`' kernels in order (asynchronously, on the current stream)."""
    for function, grid, block, args, shared in launches:
        function(grid, block, args, shared_mem=shared)


class CudaKernel(DeviceKernel):
    """A built CUDA program, called like a CPU `KernelLibrary`: `kernel(*inputs, *outputs)`.

    The launch plan comes from the source beside the cubin (or `module`). Device buffers are
    allocated once; a call copies inputs and outputs in, launches the kernels in order and
    copies the outputs back into the given arrays.
    """

    def __init__(self, cubin_path: str | os.PathLike, entry: str | None = None,
                 module: GPUModule | None = None) -> None:
        cupy = _cupy()
        self._cupy = cupy
        self.path = os.path.abspath(cubin_path)
        self.entry = entry
        self.module = module or GPUModule.parse(Path(self.path).with_suffix(".cu").read_text())
        self._device = {b.name: cupy.empty(b.shape, dtype=_device_dtype(b.np_dtype)) for b in self.module.buffers}
        self._launches = kernel_launches(cupy.RawModule(path=self.path), self.module, self._device)

    def _copy_in(self, checked: list[np.ndarray]) -> None:
        for buffer, array in zip(self.module.parameters, checked):
            self._device[buffer.name].set(array.view(_device_dtype(array.dtype)))

    def _launch(self) -> None:
        launch_all(self._launches)

    def __call__(self, *arrays: np.ndarray) -> None:
        """Run the program once on `(*inputs, *outputs)` (or one list, as KernelLibrary)."""
        checked = self._upload(arrays)
        self._launch()
        for buffer, array in zip(self.module.outputs, checked[len(self.module.inputs):]):
            self._device[buffer.name].get(out=array.view(_device_dtype(array.dtype)))
        self._cupy.cuda.get_current_stream().synchronize()

    def timed(self, buffers: Sequence[np.ndarray], number: int) -> float:
        """Total seconds of `number` runs between two CUDA events (no copies)."""
        self._upload_for_timing(buffers)
        start, end = self._cupy.cuda.Event(), self._cupy.cuda.Event()
        start.record()
        for _ in range(number):
            self._launch()
        end.record()
        end.synchronize()
        return self._cupy.cuda.get_elapsed_time(start, end) * 1e-3

    def close(self) -> None:
        self._launches = []
        self._device = {}
        self._current = ()


class CudaRunner(Runner):
    """`Runner` for CUDA programs (CuPy in the isolated worker); needs a CUDA device."""

    def __init__(self, timeout: float = 10.0, timing: TimingPolicy = TimingPolicy(),
                 rtol: float | None = None, atol: float | None = None) -> None:
        _cupy()  # no device: say so now, not once per program
        super().__init__(timeout, timing, rtol, atol, loader=CudaKernel)
