"""Running compiled kernels: checked against reference outputs, timed, and isolated from the tuner.

`evaluate_kernel` is the whole measurement protocol in the calling process. `Runner` applies the
same protocol inside a long-lived worker process, so a kernel that crashes or hangs becomes an
error record instead of taking the tuner down.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from pathlib import Path
from typing import Any

import numpy as np

from .check import BFLOAT16, check_outputs, unwritten_like
from .errors import FAILED_COST, MeasureErrorNo
from .input_copies import InputCopies
from .library import KernelLibrary
from ansor.memory import aligned_copy
from .timing import TimingPolicy, measure_costs

WORKER_START_TIMEOUT = 60.0


@dataclass(frozen=True)
class RunResult:
    """The measured seconds per call (one per repeat), or why there are none."""

    costs: tuple[float, ...]
    error_no: int
    error_msg: str
    run_seconds: float

    @property
    def median(self) -> float:
        """Median cost in seconds; FAILED_COST when the run failed."""
        if self.error_no != MeasureErrorNo.NO_ERROR or not self.costs:
            return FAILED_COST
        return statistics.median(self.costs)

    @property
    def spread(self) -> float:
        """(max - min) / median of the costs: how noisy the measurement was."""
        if len(self.costs) < 2 or self.error_no != MeasureErrorNo.NO_ERROR:
            return 0.0
        median = statistics.median(self.costs)
        return (max(self.costs) - min(self.costs)) / median if median > 0 else 0.0


def _failure(error_no: MeasureErrorNo, message: str, start: float) -> RunResult:
    return RunResult((), int(error_no), message, time.perf_counter() - start)


def evaluate_kernel(
    lib_path: str,
    func_name: str,
    inputs: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    timing: TimingPolicy = TimingPolicy(),
    rtol: float | None = None,
    atol: float | None = None,
    loader: Callable[[str, str], Any] = KernelLibrary,
    input_copies: InputCopies | None = None,
) -> RunResult:
    """Load a kernel, run it once, check its outputs against `expected`, then time it.

    Outputs are fresh buffers that differ from `expected` everywhere, so a kernel that writes
    nothing is caught; inputs are copied so that a kernel writing into them cannot spoil the next
    candidate's check. All are 64-byte aligned, so every candidate is timed on equally aligned
    data. Every failure is returned as a result, never raised. `loader` opens the built program
    (a GPU loader follows KernelLibrary's interface: call, timed, prepack, packed_buffers, close).
    `input_copies`: copies of these `inputs` kept between programs of one task, for a policy
    with `cold_bytes` to cycle through (`measure_costs`).
    """
    if input_copies is not None and not input_copies.holds(inputs):
        raise ValueError("evaluate_kernel: input_copies were made from other inputs than these")
    start = time.perf_counter()
    try:
        kernel = loader(lib_path, func_name)
    except AttributeError as err:
        return _failure(MeasureErrorNo.RUNTIME_DEVICE, f"missing symbol: {err}", start)
    except OSError as err:
        return _failure(MeasureErrorNo.COMPILE_DEVICE, f"cannot load library: {err}", start)
    except Exception as err:  # noqa: BLE001 - e.g. a device program that does not build or load
        return _failure(MeasureErrorNo.COMPILE_DEVICE, f"cannot load kernel: {type(err).__name__}: {err}",
                        start)
    try:
        outputs = [aligned_copy(unwritten_like(np.asarray(array))) for array in expected]
        buffers = [aligned_copy(array) for array in inputs] + outputs + kernel.packed_buffers()
        kernel.prepack(buffers)  # once: constant inputs are packed ahead of the timed calls
        kernel(buffers)
        mismatch = check_outputs(outputs, expected, rtol, atol)
        if mismatch is not None:
            return _failure(MeasureErrorNo.WRONG_ANSWER, mismatch, start)
        costs = measure_costs(kernel, buffers, timing, warmed_up=True, n_inputs=len(inputs),
                              input_copies=input_copies)
    except Exception as err:  # noqa: BLE001 - every failure becomes a record
        return _failure(MeasureErrorNo.RUNTIME_DEVICE, f"{type(err).__name__}: {err}", start)
    finally:
        kernel.close()
    return RunResult(costs, int(MeasureErrorNo.NO_ERROR), "", time.perf_counter() - start)


def time_function(
    lib_path: str,
    func_name: str,
    inputs: Sequence[np.ndarray],
    outputs: Sequence[np.ndarray],
    timing: TimingPolicy = TimingPolicy(),
    loader: Callable[[str, str], Any] = KernelLibrary,
) -> RunResult:
    """Time a kernel in this process on the caller's buffers, without a check; errors raise.
    Constant inputs are packed once, before the timed calls (as during tuning). `loader` opens
    the built program (a GPU backend's loader for its programs)."""
    start = time.perf_counter()
    with loader(lib_path, func_name) as kernel:
        buffers = [*inputs, *outputs, *kernel.packed_buffers()]
        kernel.prepack(buffers)
        costs = measure_costs(kernel, buffers, timing, n_inputs=len(inputs))
    return RunResult(costs, int(MeasureErrorNo.NO_ERROR), "", time.perf_counter() - start)


@dataclass(frozen=True)
class RunRequest:
    """What the worker needs for one run; arrays travel as .npy paths, loaded once per task."""

    task_key: str
    input_paths: tuple[str, ...]
    expected_paths: tuple[str, ...]
    lib_path: str
    func_name: str
    timing: TimingPolicy
    rtol: float | None
    atol: float | None
    loader: Callable[[str, str], Any] | None = None  # picklable; None: KernelLibrary


# The worker imports ansor.measure without running the package __init__ files, which may pull
# in the whole tuner; measurement needs only numpy, this subpackage and ansor.process_lifetime.
_WORKER_BOOTSTRAP = """\
import sys, types
package_dir = sys.argv[1]
for name, path in (("ansor", package_dir), ("ansor.measure", package_dir + "/measure")):
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
from ansor.measure.worker import main
main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1")
"""


def _death_message(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"worker died with {name}"
    if returncode is None:
        return "worker closed its connection"
    return f"worker exited with code {returncode}"


class Runner:
    """Measures kernels one at a time in an isolated, long-lived worker process.

    A crash (segfault, abort) or a run longer than `timeout` seconds is reported as an error and
    the worker is replaced before the next run. Not thread-safe: measurements are serialized on
    purpose, since concurrent kernels would disturb each other's timing. `loader` (picklable,
    sent to the worker) opens a built program; None: a C library (`KernelLibrary`).
    """

    def __init__(
        self,
        timeout: float = 10.0,
        timing: TimingPolicy = TimingPolicy(),
        rtol: float | None = None,
        atol: float | None = None,
        loader: Callable[[str, str], Any] | None = None,
    ) -> None:
        self.timeout = timeout
        self.timing = timing
        self.rtol = rtol
        self.atol = atol
        self.loader = loader
        self._process: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._task_dir: tempfile.TemporaryDirectory | None = None
        self._task: tuple[str, tuple[str, ...], tuple[str, ...]] | None = None

    @property
    def worker_pid(self) -> int | None:
        """Process id of the current worker, None before the first run or after close()."""
        return self._process.pid if self._process is not None else None

    def set_task(self, inputs: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> None:
        """Fix the input arrays and reference outputs that every following run uses."""
        input_arrays = [np.ascontiguousarray(array) for array in inputs]
        expected_arrays = [np.ascontiguousarray(array) for array in expected]
        for array in expected_arrays:
            unwritten_like(array)  # refuse dtypes that cannot be checked, here rather than later
        task_dir = tempfile.TemporaryDirectory(prefix="ansor-task-")
        input_paths = self._save(task_dir.name, "input", input_arrays)
        expected_paths = self._save(task_dir.name, "expected", expected_arrays)
        self._drop_task()
        self._task_dir = task_dir
        self._task = (uuid.uuid4().hex, input_paths, expected_paths)

    @staticmethod
    def _save(directory: str, stem: str, arrays: list[np.ndarray]) -> tuple[str, ...]:
        paths = []
        for index, array in enumerate(arrays):
            paths.append(save_array(os.path.join(directory, f"{stem}{index}"), array))
        return tuple(paths)

    def run(self, lib_path: str, func_name: str, timing: TimingPolicy | None = None) -> RunResult:
        """Check and time one kernel on the current task's arrays (with `timing` instead of
        the runner's policy when given)."""
        if self._task is None:
            raise RuntimeError("Runner.set_task() must be called before run()")
        task_key, input_paths, expected_paths = self._task
        request = RunRequest(
            task_key, input_paths, expected_paths, os.path.abspath(lib_path), func_name,
            timing or self.timing, self.rtol, self.atol, self.loader,
        )
        conn = self._ensure_worker()
        start = time.perf_counter()
        try:
            try:
                conn.send(request)
            except OSError:  # the worker died between runs: replace it once
                self._stop_worker()
                conn = self._ensure_worker()
                start = time.perf_counter()
                conn.send(request)
            if not conn.poll(self.timeout):
                self._stop_worker(kill=True)
                message = f"run exceeded the {self.timeout:g} s timeout"
                return _failure(MeasureErrorNo.RUN_TIMEOUT, message, start)
            try:
                return conn.recv()
            except (EOFError, OSError):
                returncode = self._stop_worker()
                return _failure(MeasureErrorNo.RUNTIME_DEVICE, _death_message(returncode), start)
        except BaseException:
            # Interrupted mid-run (e.g. Ctrl-C): a late answer must not be read as the next one.
            self._stop_worker(kill=True)
            raise

    def run_many(self, items: Iterable[tuple[str, str]]) -> list[RunResult]:
        """Run (lib_path, func_name) pairs one after another."""
        return [self.run(lib_path, func_name) for lib_path, func_name in items]

    def _ensure_worker(self) -> Connection:
        if self._process is not None and self._process.poll() is None and self._conn is not None:
            return self._conn
        self._stop_worker()
        parent_conn, child_conn = Pipe(duplex=True)
        package_dir = str(Path(__file__).resolve().parent.parent)
        # the worker's parent-death signal follows this thread, so it must know which one it is
        from_main_thread = threading.current_thread() is threading.main_thread()
        command = [sys.executable, "-c", _WORKER_BOOTSTRAP, package_dir, str(child_conn.fileno()),
                   str(os.getpid()), "1" if from_main_thread else "0"]
        try:
            # its own session: a terminal's Ctrl-C, sent to the foreground process group, must
            # not reach it even while it starts (the tuner decides how to stop)
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, pass_fds=(child_conn.fileno(),),
                start_new_session=True,
            )
        except BaseException:
            parent_conn.close()
            raise
        finally:
            child_conn.close()
        self._process, self._conn = process, parent_conn
        try:
            ready = parent_conn.poll(WORKER_START_TIMEOUT) and parent_conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            returncode = self._stop_worker(kill=True)
            raise RuntimeError(f"measurement worker failed to start: {_death_message(returncode)}")
        return parent_conn

    def _stop_worker(self, kill: bool = False) -> int | None:
        """Stop the worker (a None request asks it to exit; kill if it does not) and reap it.
        Closing the pipe alone would not end it while a process forked meanwhile holds a copy
        of this end: each close then waited out the timeout (a second per task of a model)."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            if not kill:
                try:
                    conn.send(None)
                except OSError:  # the worker is gone already
                    pass
            conn.close()
        if process is None:
            return None
        if kill:
            process.kill()
        try:
            return process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    def _drop_task(self) -> None:
        self._task = None
        if self._task_dir is not None:
            self._task_dir.cleanup()
            self._task_dir = None

    def close(self) -> None:
        """Stop the worker and delete the task's files."""
        self._stop_worker()
        self._drop_task()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown may have torn modules down
            pass


#: a file of this suffix holds the bits of a bfloat16 array as uint16 (np.save would write its
#: ml_dtypes type as raw two-byte records, read back as no number type at all)
_BFLOAT16_SUFFIX = ".bfloat16.npy"


def save_array(stem: str, array: np.ndarray) -> str:
    """Save `array` to `stem` plus a suffix that keeps its dtype; returns the path."""
    if array.dtype == BFLOAT16:
        np.save(stem + _BFLOAT16_SUFFIX, array.view(np.uint16), allow_pickle=False)
        return stem + _BFLOAT16_SUFFIX
    np.save(stem + ".npy", array, allow_pickle=False)
    return stem + ".npy"


def load_array(path: str) -> np.ndarray:
    """An array saved by `save_array`, with its dtype."""
    array = np.load(path, allow_pickle=False)
    return array.view(BFLOAT16) if path.endswith(_BFLOAT16_SUFFIX) else array
