"""Generated OpenCL programs: build (validated, cached), load and run on numpy arrays, time, check.

Without a GPU, OpenCL on PoCL's CPU device runs GPU-style programs (work-groups, `__local`
memory, barriers) for correctness, not speed; Oclgrind (see `oclgrind`) finds the races PoCL
hides. pyopencl and the platforms come with `pip install 'ansor[opencl]'`.

A program is one source text that starts with its launch plan (`gpu_module`). `OpenCLKernel`
follows the calling convention of the CPU's `KernelLibrary` (inputs, then outputs, written in
place), so `evaluate_kernel` and the isolated `Runner` worker measure it unchanged:
`OpenCLRunner` is that runner with this loader.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .build import MAX_ERROR_CHARS, BuildResult, CachedBuilder, _write_atomically
from .errors import DeviceUnavailableError, MeasureErrorNo
from .gpu_module import DeviceKernel, GPUModule
from .run import Runner
from .timing import TimingPolicy

if TYPE_CHECKING:
    import pyopencl as cl

DEFAULT_PLATFORM = "Portable Computing Language"
INSTALL_HINT = "pip install 'ansor[opencl]'"
EVENTS_PER_WAIT = 256  # launches whose profiling events are held before they are read


class OpenCLUnavailableError(DeviceUnavailableError):
    """pyopencl, or the requested OpenCL platform, is not installed."""


class OpenCLBuildError(RuntimeError):
    """An OpenCL program failed to compile; `log` is the compiler's message."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


def _pyopencl() -> Any:
    try:
        import pyopencl
    except ImportError as err:
        raise OpenCLUnavailableError(f"pyopencl is not installed ({err}); install it with "
                                     f"{INSTALL_HINT}") from None
    # a successful build with warnings in its log is no error; the log goes nowhere useful
    warnings.filterwarnings("ignore", category=pyopencl.CompilerWarning)
    return pyopencl


def opencl_platforms() -> list[str]:
    """Names of the OpenCL platforms pyopencl sees; empty without pyopencl or any platform."""
    try:
        cl = _pyopencl()
        return [platform.name for platform in cl.get_platforms()]
    except Exception:  # noqa: BLE001 - no pyopencl; no ICD at all raises a cl.Error
        return []


@cache
def platform_problem(platform: str = DEFAULT_PLATFORM) -> str | None:
    """Why programs cannot run on the named platform here, or None when a trivial kernel
    builds: it may be missing, or present but unable to compile for this CPU (PoCL's LLVM
    names a CPU newer than itself 'generic', and every build fails). Checked once per process."""
    if platform not in opencl_platforms():
        return f"the OpenCL platform {platform!r} is not installed (pip install {INSTALL_HINT})"
    cl = _pyopencl()
    program = None
    try:
        device = find_device(platform)
        program = cl.Program(cl.Context([device]), "__kernel void probe(__global float* x) { x[0] += 1.0f; }")
        program.build()
    except Exception as exc:  # noqa: BLE001 - any failure to build means nothing runs here
        log = ""
        try:
            log = program.get_build_info(device, cl.program_build_info.LOG) if program is not None else ""
        except Exception:  # noqa: BLE001 - no log to add
            pass
        text = " ".join((log or str(exc)).split())
        return f"{platform} cannot build programs on this machine: {text[:200]}"
    return None


def find_device(platform: str = DEFAULT_PLATFORM) -> cl.Device:
    """The first device of the named platform; the error names the platforms that are there."""
    cl = _pyopencl()
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    for found in platforms:
        if found.name == platform:
            devices = found.get_devices()
            if not devices:
                raise OpenCLUnavailableError(f"OpenCL platform {platform!r} has no device")
            return devices[0]
    installed = ", ".join(repr(p.name) for p in platforms) or "none"
    raise OpenCLUnavailableError(f"no OpenCL platform {platform!r} (installed: {installed}); "
                                 f"install PoCL and Oclgrind with {INSTALL_HINT}")


@cache
def opencl_context(platform: str = DEFAULT_PLATFORM) -> cl.Context:
    """One context per platform for the process: contexts are costly and hold compiled programs."""
    cl = _pyopencl()
    return cl.Context([find_device(platform)])


@cache
def _profiling_queue(platform: str) -> cl.CommandQueue:
    cl = _pyopencl()
    return cl.CommandQueue(opencl_context(platform),
                           properties=cl.command_queue_properties.PROFILING_ENABLE)


def build_program(source: str, platform: str = DEFAULT_PLATFORM) -> cl.Program:
    """Compile OpenCL C for the platform's device; OpenCLBuildError carries the compiler log."""
    cl = _pyopencl()
    try:
        return cl.Program(opencl_context(platform), source).build()
    except cl.RuntimeError as err:
        if err.code != cl.status_code.BUILD_PROGRAM_FAILURE:
            raise
        log = _build_log(str(err))
        raise OpenCLBuildError(f"OpenCL build failed on {platform!r}:\n{log}", log) from None


def _build_log(message: str) -> str:
    """The compiler's own lines out of pyopencl's message (which repeats the call and options)."""
    _, marker, rest = message.partition("Build on ")
    if not marker:
        return message.strip()
    rest = rest.split(":\n", 1)[-1]  # drop "<pyopencl.Device ...>"
    return rest.rsplit("\n(options:", 1)[0].strip()


def _read_program(path_or_source: str | os.PathLike) -> tuple[str, str | None]:
    """(source, path or None): a generated source starts with its header, anything else is a path."""
    if isinstance(path_or_source, str) and path_or_source.lstrip().startswith("//"):
        return path_or_source, None
    path = os.fspath(path_or_source)
    return Path(path).read_text(), os.path.abspath(path)


class OpenCLKernel(DeviceKernel):
    """A generated OpenCL program, built once, called like a CPU `KernelLibrary`.

    Device buffers (one per buffer of the plan) and kernel arguments are set up once; a call
    copies the inputs and the outputs' current contents to the device (so an element the
    program fails to write keeps its value, as on the CPU), launches the kernels in order and
    copies the outputs back into the given arrays. `entry` is the program's name as the
    printer gave it, kept for the loader signature (path, entry): the plan says what runs.
    """

    def __init__(self, path_or_source: str | os.PathLike, entry: str | None = None,
                 platform: str = DEFAULT_PLATFORM) -> None:
        cl = _pyopencl()
        source, self.path = _read_program(path_or_source)
        self.module = GPUModule.parse(source)
        if self.module.language != "opencl":
            raise ValueError(f"an OpenCL loader cannot run a {self.module.language} program")
        self.entry = entry
        self.platform = platform
        self._queue = _profiling_queue(platform)
        context = opencl_context(platform)
        program = build_program(source, platform)
        self._device: dict[str, Any] = {
            b.name: cl.Buffer(context, cl.mem_flags.READ_WRITE, size=max(1, b.nbytes))
            for b in self.module.buffers
        }
        self._launches: list[tuple[Any, tuple[int, ...], tuple[int, ...]]] = []
        for launch in self.module.kernels:
            try:
                kernel = cl.Kernel(program, launch.name)
            except cl.Error:
                names = program.get_info(cl.program_info.KERNEL_NAMES)
                self.close()
                raise ValueError(f"the program has no kernel {launch.name!r} (it has: {names})") from None
            if kernel.num_args != len(launch.args):
                self.close()
                raise ValueError(f"kernel {launch.name!r} takes {kernel.num_args} arguments, "
                                 f"the launch plan passes {len(launch.args)}")
            kernel.set_args(*(self._device[name] for name in launch.args))
            self._launches.append((kernel, launch.global_size, launch.block))

    def _copy_in(self, checked: list[np.ndarray]) -> None:
        cl = _pyopencl()
        if self._launches is None:
            raise RuntimeError("the kernel is closed")
        for buffer, array in zip(self.module.parameters, checked):
            if buffer.nbytes:
                cl.enqueue_copy(self._queue, self._device[buffer.name], array, is_blocking=False)

    def _launch(self) -> list[Any]:
        cl = _pyopencl()
        return [cl.enqueue_nd_range_kernel(self._queue, kernel, global_size, local_size)
                for kernel, global_size, local_size in self._launches]

    def __call__(self, *arrays: np.ndarray) -> None:
        """Run the program once: `kernel(*inputs, *outputs)` (or one list, as KernelLibrary)."""
        cl = _pyopencl()
        checked = self._upload(arrays)
        try:
            self._launch()
            n_inputs = len(self.module.inputs)
            for buffer, array in zip(self.module.outputs, checked[n_inputs:]):
                if buffer.nbytes:
                    cl.enqueue_copy(self._queue, array, self._device[buffer.name], is_blocking=False)
        finally:
            self._queue.finish()  # the copies are done with the arrays before they may go

    def timed(self, buffers: Sequence[np.ndarray], number: int) -> float:
        """Total kernel seconds of `number` runs (profiling events, summed over the program's
        kernels; copies are not counted). The device outputs change; the arrays do not."""
        self._upload_for_timing(buffers)
        self._queue.finish()  # the copies have read the arrays (which may be temporary copies)
        total_ns = 0
        done = 0
        while done < number:
            events = []
            for _ in range(min(EVENTS_PER_WAIT, number - done)):
                events.extend(self._launch())
            self._queue.finish()
            total_ns += sum(event.profile.end - event.profile.start for event in events)
            done += EVENTS_PER_WAIT
        return total_ns * 1e-9

    def close(self) -> None:
        """Release the device buffers now rather than when the garbage collector gets to them."""
        device, self._device = getattr(self, "_device", {}), {}
        self._launches = None  # type: ignore[assignment]
        self._current = ()
        for buffer in device.values():
            buffer.release()


_T = TypeVar("_T")


def _call_with_timeout(func: Callable[[], _T], timeout: float) -> _T:
    """`func()` in a daemon thread; TimeoutError when it takes longer. A compiler call cannot be
    interrupted in-process: it finishes in the background and its result is dropped."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = func()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = err

    thread = threading.Thread(target=target, name="opencl-build", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class OpenCLBuilder(CachedBuilder):
    """Validates OpenCL programs by compiling them for the platform's device, and caches the
    sources that compile as `<cache_dir>/<sha256>.cl` (the "library" a loader opens).

    The interface of `measure.Builder`: `build(sources)` in parallel, results in input order,
    failures as results (COMPILE_HOST with the compiler log, BUILD_TIMEOUT).
    """

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        n_parallel: int | None = None,
        timeout: float = 30.0,
        platform: str = DEFAULT_PLATFORM,
    ) -> None:
        super().__init__(cache_dir, n_parallel, timeout)
        self.platform = platform
        find_device(platform)  # fail now, with the reason, rather than once per program

    def source_hash(self, source: str) -> str:
        """Cache key: the same text validated on the same platform."""
        return hashlib.sha256("\0".join((source, "opencl", self.platform)).encode()).hexdigest()

    SUFFIX = ".cl"

    def _build_one(self, source_hash: str, source: str) -> BuildResult:
        path = self.cache_dir / f"{source_hash}.cl"
        if path.exists():
            return BuildResult(source_hash, str(path), int(MeasureErrorNo.NO_ERROR), "", 0.0)
        start = time.perf_counter()
        error = _validate(source, self.platform, self.timeout)
        seconds = time.perf_counter() - start
        if error is not None:
            error_no, message = error
            return BuildResult(source_hash, None, int(error_no), message[:MAX_ERROR_CHARS], seconds)
        _write_atomically(path, source.encode())  # readers only ever see a complete file
        return BuildResult(source_hash, str(path), int(MeasureErrorNo.NO_ERROR), "", seconds)


def _validate(source: str, platform: str, timeout: float) -> tuple[MeasureErrorNo, str] | None:
    """None when the plan is sound and the program compiles with every planned kernel taking
    the planned number of arguments; else (error number, why)."""
    try:
        module = GPUModule.parse(source)
    except ValueError as err:
        return MeasureErrorNo.COMPILE_HOST, str(err)
    if module.language != "opencl":
        return MeasureErrorNo.COMPILE_HOST, f"not an OpenCL program: the header says {module.language!r}"
    cl = _pyopencl()
    try:
        program = _call_with_timeout(partial(build_program, source, platform), timeout)
    except TimeoutError:
        return MeasureErrorNo.BUILD_TIMEOUT, f"compilation exceeded the {timeout:g} s timeout"
    except OpenCLBuildError as err:
        return MeasureErrorNo.COMPILE_HOST, err.log or str(err)
    except cl.Error as err:
        return MeasureErrorNo.COMPILE_HOST, f"OpenCL error while building: {err}"
    names = set(program.get_info(cl.program_info.KERNEL_NAMES).split(";"))
    for launch in module.kernels:
        if launch.name not in names:
            return MeasureErrorNo.COMPILE_HOST, (f"the launch plan names kernel {launch.name!r}, the "
                                                 f"program defines {', '.join(sorted(names)) or 'none'}")
        n_args = cl.Kernel(program, launch.name).num_args
        if n_args != len(launch.args):
            return MeasureErrorNo.COMPILE_HOST, (f"kernel {launch.name!r} takes {n_args} arguments, "
                                                 f"the launch plan passes {len(launch.args)}")
    return None


class OpenCLRunner(Runner):
    """`Runner` for OpenCL programs: checks and times them in the isolated worker process, where
    a wild write that crashes the OpenCL runtime becomes an error result."""

    def __init__(
        self,
        timeout: float = 10.0,
        timing: TimingPolicy = TimingPolicy(),
        rtol: float | None = None,
        atol: float | None = None,
        platform: str = DEFAULT_PLATFORM,
    ) -> None:
        find_device(platform)  # the worker would fail every run for the same reason
        super().__init__(timeout, timing, rtol, atol, loader=partial(OpenCLKernel, platform=platform))
        self.platform = platform
