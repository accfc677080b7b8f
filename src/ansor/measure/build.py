"""Compile C kernel sources to shared libraries: in parallel, with timeouts, cached by source hash.

Compiling costs more than timing (a few hundred ms per kernel), so every library is kept under
`<cache_dir>/<sha256>.so` and a source seen before is never compiled again. The compiler is
`$CC` when set, else gcc; `check_compiler` tells before any work whether it can be found.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ansor.process_lifetime import child_preexec_bound_to_this_thread

from .errors import MeasureErrorNo

DEFAULT_CFLAGS: tuple[str, ...] = (
    "-O3",
    "-march=native",
    "-mprefer-vector-width=512",  # gcc 12 picks 256-bit vectors on AVX-512 CPUs otherwise
    "-fno-math-errno",  # sqrtf may then be one instruction, so a loop calling it can vectorize
    "-fno-trapping-math",  # lets gcc turn branches into selects without AVX-512 masks (AVX2 machines):
                           # otherwise a clamp in ansor_expf & co. stops the loop from vectorizing
    "-freciprocal-math",  # x / s with s fixed in the loop becomes x * (1/s) (softmax's normalization);
                          # at most an ulp more error, inside the output check
    "-fopenmp",
    "-fPIC",
    "-shared",
)
LINK_FLAGS: tuple[str, ...] = ("-lm",)
MAX_ERROR_CHARS = 2000


class CompilerNotFoundError(RuntimeError):
    """No C compiler under the configured name: every program would fail to build."""


def default_compiler() -> str:
    """The C compiler command: `$CC` when set (split like a shell, e.g. "ccache gcc"), else gcc."""
    return os.environ.get("CC", "").strip() or "gcc"


def check_compiler(compiler: str | None = None) -> str:
    """The path of the compiler's program (default: `default_compiler()`).

    Raises CompilerNotFoundError, one line naming the compiler and how to get one, so a job
    without a compiler stops before any search instead of recording every program as failed.
    """
    command = compiler if compiler is not None else default_compiler()
    try:
        words = shlex.split(command)
    except ValueError:  # an unbalanced quote
        words = [command]
    program = words[0] if words else ""
    path = shutil.which(program) if program else None
    if path is None:
        origin = " (from $CC)" if compiler is None and os.environ.get("CC", "").strip() else ""
        raise CompilerNotFoundError(
            f"C compiler {program or command!r}{origin} not found: install gcc "
            f"(e.g. `apt install gcc`, `dnf install gcc`) or set CC to a C compiler with OpenMP")
    return path


def default_cache_dir() -> Path:
    """Where built libraries live: `$ANSOR_CACHE_DIR/build`, else the user's XDG cache."""
    root = os.environ.get("ANSOR_CACHE_DIR")
    if root:
        return Path(root) / "build"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "ansor" / "build"


@dataclass(frozen=True)
class BuildResult:
    """One compiled source: the library path, or why there is none."""

    source_hash: str
    lib_path: str | None
    error_no: int
    error_msg: str
    compile_seconds: float
    # per kernel, what the device compiler reported (CUDA: registers, shared_bytes, spills...);
    # None where the compiler reports none. Left out of ==/hash: a dict is unhashable.
    resources: dict[str, dict[str, int]] | None = field(default=None, compare=False)


class CachedBuilder:
    """What every builder shares: sources compiled into a content-addressed cache directory,
    several at a time, each distinct text once. A subclass says how a source is keyed
    (`source_hash`: the text and everything that changes what it compiles to), what its
    product is called (`SUFFIX`) and how one is built (`_build_one`)."""

    SUFFIX = ".so"

    def __init__(self, cache_dir: str | Path | None = None, n_parallel: int | None = None,
                 timeout: float = 30.0) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.n_parallel = max(1, n_parallel or os.cpu_count() or 1)
        self.timeout = timeout

    def source_hash(self, source: str) -> str:
        raise NotImplementedError

    def lib_path(self, source: str) -> Path:
        """Where the product of `source` is (or will be) cached."""
        return self.cache_dir / f"{self.source_hash(source)}{self.SUFFIX}"

    def build(self, sources: Iterable[str | None]) -> list[BuildResult | None]:
        """Compile every source (duplicates once), in parallel; results in input order (None
        for a None source). `sources` may be a generator: each source starts compiling as soon
        as it is produced, so whatever produces the next one (lowering and printing a program)
        overlaps the compilers already running."""
        futures: dict[str, Future] = {}
        order: list[str | None] = []
        pool: ThreadPoolExecutor | None = None
        try:
            for source in sources:
                if source is None:
                    order.append(None)
                    continue
                key = self.source_hash(source)
                order.append(key)
                if key not in futures:
                    if pool is None:
                        self.cache_dir.mkdir(parents=True, exist_ok=True)
                        pool = ThreadPoolExecutor(max_workers=self.n_parallel)
                    futures[key] = pool.submit(self._build_one, key, source)
            return [None if key is None else futures[key].result() for key in order]
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def compile_one(self, source: str) -> BuildResult:
        return self.build([source])[0]

    def _build_one(self, source_hash: str, source: str) -> BuildResult:
        raise NotImplementedError


class Builder(CachedBuilder):
    """Compiles C sources into a content-addressed cache directory, several at a time."""

    def __init__(
        self,
        cache_dir: str | Path | None = None,
        n_parallel: int | None = None,
        timeout: float = 30.0,
        compiler: str | None = None,
        cflags: tuple[str, ...] = DEFAULT_CFLAGS,
    ) -> None:
        super().__init__(cache_dir, n_parallel, timeout)
        self.compiler = compiler if compiler is not None else default_compiler()
        self.cflags = tuple(cflags)

    def source_hash(self, source: str) -> str:
        """Cache key: the same text built by the same compiler with the same flags."""
        key = "\0".join((source, self.compiler, *self.cflags, *LINK_FLAGS))
        return hashlib.sha256(key.encode()).hexdigest()

    def _build_one(self, source_hash: str, source: str) -> BuildResult:
        lib_path = self.cache_dir / f"{source_hash}.so"
        ok = int(MeasureErrorNo.NO_ERROR)
        if lib_path.exists():
            return BuildResult(source_hash, str(lib_path), ok, "", 0.0)

        # The source keeps its hash name so compiler messages point at a file one can open.
        c_path = self.cache_dir / f"{source_hash}.c"
        _write_atomically(c_path, source.encode())
        fd, tmp_lib = tempfile.mkstemp(prefix=f".{source_hash}.", suffix=".so", dir=self.cache_dir)
        os.close(fd)
        command = [*shlex.split(self.compiler), *self.cflags, "-o", tmp_lib, str(c_path), *LINK_FLAGS]
        start = time.perf_counter()
        try:
            error_no, error_msg = run_compiler(command, self.timeout)
            seconds = time.perf_counter() - start
            if error_no != MeasureErrorNo.NO_ERROR:
                return BuildResult(source_hash, None, int(error_no), error_msg[:MAX_ERROR_CHARS], seconds)
            # Readers only ever see a complete library: the rename is atomic.
            os.replace(tmp_lib, lib_path)
            return BuildResult(source_hash, str(lib_path), ok, "", seconds)
        finally:
            if os.path.exists(tmp_lib):
                os.unlink(tmp_lib)


def run_compiler(command: list[str], timeout: float) -> tuple[MeasureErrorNo, str]:
    """Run a compiler: (error number, its output). On timeout its whole process group is
    killed (gcc's cc1 and nvcc's cicc/ptxas are grandchildren). The output is returned on
    success too (ptxas reports resource usage there); callers cut error text to length.

    Its own session keeps a terminal's Ctrl-C away from it (the tuner decides); the
    parent-death signal ends it if the tuner is killed (this thread waits for it).
    """
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=child_preexec_bound_to_this_thread(),
        )
    except OSError as err:
        return MeasureErrorNo.COMPILE_HOST, f"cannot run compiler {command[0]!r}: {err}"
    try:
        raw, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        return MeasureErrorNo.BUILD_TIMEOUT, f"compilation exceeded the {timeout:g} s timeout"
    output = raw.decode(errors="replace").strip()
    if proc.returncode != 0:
        return MeasureErrorNo.COMPILE_HOST, output or f"{command[0]} exited with code {proc.returncode}"
    return MeasureErrorNo.NO_ERROR, output


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
