"""ansor.measure: building C sources, checking and timing kernels in an isolated worker."""

from __future__ import annotations

import math
import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import built_libraries, vector_add_arrays

from ansor.measure import (
    DEFAULT_CFLAGS,
    Builder,
    CompilerNotFoundError,
    MeasureErrorNo,
    Runner,
    RunResult,
    TimingPolicy,
    aligned_copy,
    aligned_empty,
    check_compiler,
    check_outputs,
    default_cache_dir,
    default_compiler,
    time_function,
)
from ansor.measure.check import default_tolerances
from ansor.measure.library import KernelLibrary
from ansor.measure.timing import RotatedCalls, measure_costs

N = 1024
FAST = TimingPolicy(warmup=1, repeat=3, min_repeat_ms=2.0)

TIMER = r"""
#include <time.h>
double {name}_timed(long long number, void* arg0, void* arg1, void* arg2) {{
  struct timespec start, end;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (long long n = 0; n < number; ++n) {name}(arg0, arg1, arg2);
  clock_gettime(CLOCK_MONOTONIC, &end);
  return (double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec);
}}
"""


def binary_kernel(name: str, body: str, ctype: str = "float", timed: bool = True) -> str:
    """A kernel `name(a, b, c)` over N elements whose loop body is `body`."""
    source = f"""
void {name}(void* arg0, void* arg1, void* arg2) {{
  const {ctype}* restrict a = ({ctype}*)arg0;
  const {ctype}* restrict b = ({ctype}*)arg1;
  {ctype}* restrict c = ({ctype}*)arg2;
  #pragma omp parallel for
  for (int i = 0; i < {N}; ++i) {{ {body} }}
}}
"""
    return source + (TIMER.format(name=name) if timed else "")


ADD = binary_kernel("add", "c[i] = a[i] + b[i];")
ADD_UNTIMED = binary_kernel("add", "c[i] = a[i] + b[i];", timed=False)
WRONG = binary_kernel("add", "c[i] = a[i] + b[i] + (i == 77 ? 1.0f : 0.0f);")
NO_WRITE = binary_kernel("add", "(void)a; (void)b; (void)c;")
# right only when all three buffers start on a 64-byte boundary
ALIGNED_ONLY = binary_kernel(
    "add", "c[i] = a[i] + b[i] + ((((unsigned long)a | (unsigned long)b | (unsigned long)c) % 64) ? 1.0f : 0.0f);")
INT_ADD = binary_kernel("add", "c[i] = a[i] + b[i];", ctype="int")
SEGFAULT = """
void add(void* arg0, void* arg1, void* arg2) { volatile float* p = 0; *p = 1.0f; }
"""
ABORT = """
#include <stdlib.h>
void add(void* arg0, void* arg1, void* arg2) { abort(); }
"""
HANG = """
void add(void* arg0, void* arg1, void* arg2) { volatile int spin = 1; while (spin) {} }
"""
SYNTAX_ERROR = "void add(void* arg0, void* arg1, void* arg2) { this is not C; }\n"


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    return Builder(cache_dir=tmp_path_factory.mktemp("build-cache"), n_parallel=2)


@pytest.fixture(scope="module")
def libs(builder: Builder) -> dict[str, str]:
    """Every test kernel, built once in one parallel batch."""
    sources = {
        "add": ADD, "add_untimed": ADD_UNTIMED, "wrong": WRONG, "no_write": NO_WRITE, "aligned_only": ALIGNED_ONLY,
        "int_add": INT_ADD, "segfault": SEGFAULT, "abort": ABORT, "hang": HANG,
    }
    return built_libraries(builder, sources)


@pytest.fixture(scope="module")
def float_task() -> tuple[list[np.ndarray], list[np.ndarray]]:
    return vector_add_arrays(N)


@pytest.fixture(scope="module")
def runner(float_task) -> Runner:
    inputs, expected = float_task
    # long enough that a busy machine's slow worker start never reads as a hang; the hang test
    # still waits only this long
    with Runner(timeout=6.0, timing=FAST) as runner:
        runner.set_task(inputs, expected)
        yield runner


def assert_ok(result: RunResult, policy: TimingPolicy = FAST) -> None:
    assert result.error_no == MeasureErrorNo.NO_ERROR, result.error_msg
    assert len(result.costs) == policy.repeat
    assert all(cost > 0 for cost in result.costs)
    assert 0 < result.median < math.inf
    assert result.spread >= 0


# -- building -----------------------------------------------------------------------------------


def test_default_flags_ask_for_wide_vectors_and_openmp() -> None:
    assert "-mprefer-vector-width=512" in DEFAULT_CFLAGS and "-fopenmp" in DEFAULT_CFLAGS


def test_compile_error_reports_gcc_message(builder: Builder) -> None:
    result = builder.compile_one(SYNTAX_ERROR)
    assert result.error_no == MeasureErrorNo.COMPILE_HOST
    assert result.lib_path is None
    assert "error" in result.error_msg and len(result.error_msg) <= 2000
    assert not list(builder.cache_dir.glob(f"{result.source_hash}*.so"))


def test_build_cache_reuses_library(tmp_path) -> None:
    first = Builder(cache_dir=tmp_path).compile_one(ADD)
    again = Builder(cache_dir=tmp_path).compile_one(ADD)
    assert first.error_no == again.error_no == MeasureErrorNo.NO_ERROR
    assert first.compile_seconds > 0
    assert again.compile_seconds == 0
    assert again.lib_path == first.lib_path and again.source_hash == first.source_hash
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")], "temporary files left"


def test_cache_key_includes_flags(tmp_path) -> None:
    plain = Builder(cache_dir=tmp_path, cflags=("-O1", "-fPIC", "-shared"))
    assert plain.source_hash(ADD) != Builder(cache_dir=tmp_path).source_hash(ADD)


def test_parallel_build_keeps_order_and_compiles_duplicates_once(tmp_path) -> None:
    sources = [binary_kernel(f"k{i}", f"c[i] = a[i] * {i}.0f + b[i];") for i in range(4)]
    batch = [sources[0], sources[1], SYNTAX_ERROR, sources[2], sources[0], sources[3]]
    results = Builder(cache_dir=tmp_path, n_parallel=2).build(batch)
    assert [r.error_no for r in results] == [0, 0, MeasureErrorNo.COMPILE_HOST, 0, 0, 0]
    assert results[0] == results[4]  # the same source is one build
    paths = [r.lib_path for r in results if r.lib_path]
    assert len(set(paths)) == 4 and all(os.path.exists(p) for p in paths)
    assert len(list(tmp_path.glob("*.so"))) == 4


def test_build_timeout(tmp_path) -> None:
    slow_compiler = tmp_path / "slow-cc"
    slow_compiler.write_text("#!/bin/sh\nsleep 30\n")
    slow_compiler.chmod(slow_compiler.stat().st_mode | stat.S_IEXEC)
    builder = Builder(cache_dir=tmp_path / "cache", timeout=0.5, compiler=str(slow_compiler))
    start = time.monotonic()
    result = builder.compile_one(ADD)
    assert result.error_no == MeasureErrorNo.BUILD_TIMEOUT and result.lib_path is None
    assert time.monotonic() - start < 10


def test_missing_compiler(tmp_path) -> None:
    result = Builder(cache_dir=tmp_path, compiler="no-such-compiler-xyz").compile_one(ADD)
    assert result.error_no == MeasureErrorNo.COMPILE_HOST and "no-such-compiler" in result.error_msg


def test_check_compiler_names_a_missing_compiler_from_cc(monkeypatch, tmp_path) -> None:
    missing = str(tmp_path / "no-such-cc")
    monkeypatch.setenv("CC", missing)
    with pytest.raises(CompilerNotFoundError) as info:
        check_compiler()
    message = str(info.value)
    assert missing in message and "$CC" in message and "install" in message and "\n" not in message
    with pytest.raises(CompilerNotFoundError, match="no-such-compiler-xyz"):
        check_compiler("no-such-compiler-xyz")


def test_compiler_comes_from_cc_else_gcc(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("CC", raising=False)
    assert default_compiler() == "gcc" and Builder(cache_dir=tmp_path).compiler == "gcc"
    assert os.path.basename(check_compiler()).startswith("gcc")
    # CC may carry words, as in make: a wrapper or extra flags
    monkeypatch.setenv("CC", "gcc -DADDEND=2.0f")
    builder = Builder(cache_dir=tmp_path)
    assert builder.compiler == "gcc -DADDEND=2.0f" and check_compiler() == check_compiler("gcc")
    result = builder.compile_one(binary_kernel("add", "c[i] = a[i] + b[i] + ADDEND;"))
    assert result.error_no == MeasureErrorNo.NO_ERROR, result.error_msg


def test_default_cache_dir(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "build"
    monkeypatch.delenv("ANSOR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "ansor" / "build"


# -- running ------------------------------------------------------------------------------------


def test_correct_kernel_with_and_without_c_timer(runner: Runner, libs) -> None:
    assert_ok(runner.run(libs["add"], "add"))
    assert_ok(runner.run(libs["add_untimed"], "add"))


def test_wrong_answer(runner: Runner, libs) -> None:
    result = runner.run(libs["wrong"], "add")
    assert result.error_no == MeasureErrorNo.WRONG_ANSWER
    assert "output 0 mismatch" in result.error_msg and "(77,)" in result.error_msg
    assert result.costs == () and result.median == math.inf


def test_kernel_that_writes_nothing_is_wrong(runner: Runner, libs) -> None:
    result = runner.run(libs["no_write"], "add")
    assert result.error_no == MeasureErrorNo.WRONG_ANSWER, result.error_msg


def test_segfault_then_recovery(runner: Runner, libs) -> None:
    result = runner.run(libs["segfault"], "add")
    assert result.error_no == MeasureErrorNo.RUNTIME_DEVICE
    assert "SIGSEGV" in result.error_msg
    assert_ok(runner.run(libs["add"], "add"))


def test_abort_then_recovery(runner: Runner, libs) -> None:
    result = runner.run(libs["abort"], "add")
    assert result.error_no == MeasureErrorNo.RUNTIME_DEVICE and "SIGABRT" in result.error_msg
    assert_ok(runner.run(libs["add"], "add"))


def test_hang_times_out_then_recovery(runner: Runner, libs) -> None:
    pid = runner.worker_pid
    start = time.monotonic()
    result = runner.run(libs["hang"], "add")
    assert result.error_no == MeasureErrorNo.RUN_TIMEOUT
    assert time.monotonic() - start < runner.timeout + 5
    assert pid is None or not _alive(pid)
    assert_ok(runner.run(libs["add"], "add"))


def test_missing_symbol_keeps_worker(runner: Runner, libs) -> None:
    assert_ok(runner.run(libs["add"], "add"))
    pid = runner.worker_pid
    result = runner.run(libs["add"], "no_such_function")
    assert result.error_no == MeasureErrorNo.RUNTIME_DEVICE
    assert "no_such_function" in result.error_msg
    assert runner.worker_pid == pid


def test_unloadable_library(runner: Runner, tmp_path) -> None:
    bogus = tmp_path / "bogus.so"
    bogus.write_text("not a library")
    result = runner.run(str(bogus), "add")
    assert result.error_no == MeasureErrorNo.COMPILE_DEVICE


def test_candidates_run_on_64_byte_aligned_buffers(libs) -> None:
    rng = np.random.default_rng(1)
    raw = rng.standard_normal(2 * N + 16, dtype=np.float32)
    a, b = raw[1:N + 1], raw[N + 3:2 * N + 3]  # deliberately misaligned views
    assert a.ctypes.data % 64 and b.ctypes.data % 64
    with Runner(timing=FAST) as runner:
        runner.set_task([a, b], [a + b])
        assert_ok(runner.run(libs["aligned_only"], "add"))


@pytest.mark.parametrize("shape,dtype", [((3,), "float32"), ((7, 5), "float64"), ((0,), "int32"), ((2, 3, 4), "int8")])
def test_aligned_buffers(shape, dtype) -> None:
    for _ in range(5):  # the allocator's history must not matter
        x = aligned_empty(shape, dtype)
        assert x.shape == shape and x.dtype == np.dtype(dtype) and x.flags.c_contiguous
        assert x.ctypes.data % 64 == 0 or x.size == 0
    src = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    y = aligned_copy(src)
    assert y.ctypes.data % 64 == 0 and y.flags.c_contiguous and np.array_equal(y, src)


def test_run_many(runner: Runner, libs) -> None:
    results = runner.run_many([(libs["add"], "add"), (libs["wrong"], "add"), (libs["add"], "add")])
    assert [r.error_no for r in results] == [0, MeasureErrorNo.WRONG_ANSWER, 0]


def test_new_task_and_integer_outputs(libs) -> None:
    a = np.arange(N, dtype=np.int32)
    b = np.full(N, 7, dtype=np.int32)
    with Runner(timing=FAST) as runner:
        runner.set_task([a, b], [a + b])
        assert_ok(runner.run(libs["int_add"], "add"))
        assert runner.run(libs["no_write"], "add").error_no == MeasureErrorNo.WRONG_ANSWER
        runner.set_task([a, b], [a + b + 1])
        result = runner.run(libs["int_add"], "add")
        assert result.error_no == MeasureErrorNo.WRONG_ANSWER and "exact" in result.error_msg


def test_flush_cache_policy(float_task, libs) -> None:
    inputs, expected = float_task
    with Runner(timing=TimingPolicy(repeat=4, flush_cache=True)) as runner:
        runner.set_task(inputs, expected)
        result = runner.run(libs["add"], "add")
    assert result.error_no == MeasureErrorNo.NO_ERROR and len(result.costs) == 4


#: A kernel that counts its calls in its first input (a[0] += 1): which copy each call used.
COUNT_CALLS = """
void add(void* arg0, void* arg1, void* arg2) { ((float*)arg0)[0] += 1.0f; (void)arg1; (void)arg2; }
"""


def test_cold_inputs_cycle_through_copies(builder: Builder, float_task) -> None:
    """With cold_bytes, consecutive calls run on different copies of the inputs, each copy
    called in turn, and the copies span at least cold_bytes."""
    [built] = builder.build([COUNT_CALLS])
    assert built.error_no == MeasureErrorNo.NO_ERROR, built.error_msg
    inputs, expected = float_task
    a = np.zeros_like(inputs[0])
    with KernelLibrary(built.lib_path, "add") as kernel:
        buffers = [a, inputs[1], np.zeros_like(expected[0])]
        rotation = RotatedCalls(kernel, buffers, cold_bytes=3 * (a.nbytes + inputs[1].nbytes), n_inputs=2)
        assert rotation.copies == 4 and rotation.nbytes >= 3 * (a.nbytes + inputs[1].nbytes)
        rotation.timed(buffers, 8)  # two rounds of the four copies
        counts = [call.buffers[0][0] for call in rotation._calls]
        assert counts == [2.0, 2.0, 2.0, 2.0]
        rotation.timed(buffers, 3)  # a repeat is not rounded up to whole rounds of copies
        rotation.timed(buffers, 4)  # and the next one goes on from the copy where it stopped
        rotation(buffers)           # a warm-up call is one call
        assert [call.buffers[0][0] for call in rotation._calls] == [4.0, 4.0, 4.0, 4.0]
        costs = measure_costs(kernel, buffers, TimingPolicy(repeat=2, min_repeat_ms=1.0, cold_bytes=1 << 20),
                              n_inputs=2)
        assert len(costs) == 2 and all(c > 0 for c in costs)


def test_cold_policy_still_checks_the_answer(float_task, libs) -> None:
    with Runner(timing=TimingPolicy(repeat=2, min_repeat_ms=1.0, cold_bytes=1 << 20)) as runner:
        runner.set_task(*float_task)
        assert runner.run(libs["add"], "add").error_no == MeasureErrorNo.NO_ERROR
        assert runner.run(libs["wrong"], "add").error_no == MeasureErrorNo.WRONG_ANSWER


#: One timed call, sized by nothing: the repeat count cannot be cut by `max_seconds` however
#: slow a loaded machine makes the call (for tests of the worker, not of timing).
ONE_CALL = TimingPolicy(warmup=0, repeat=1, min_repeat_ms=0.0)


def test_close_leaves_no_process(float_task, libs) -> None:
    runner = Runner(timing=ONE_CALL)
    with pytest.raises(RuntimeError):
        runner.run(libs["add"], "add")  # no task yet
    runner.set_task(*float_task)
    assert_ok(runner.run(libs["add"], "add"), ONE_CALL)  # ran in the worker, checked against numpy
    pid = runner.worker_pid
    runner.close()
    assert runner.worker_pid is None and not _alive(pid)


def test_close_stops_the_worker_even_while_a_forked_process_holds_the_pipe(float_task, libs) -> None:
    """A process forked after the worker started (the search's workers are) holds a copy of the
    pipe's parent end, so closing it sends the worker no end of file: close asks it to stop, and
    it exits by itself rather than being killed."""
    import os
    import signal

    runner = Runner(timing=ONE_CALL)
    runner.set_task(*float_task)
    assert_ok(runner.run(libs["add"], "add"), ONE_CALL)
    process = runner._process
    holder = os.fork()
    if holder == 0:  # the copy of every descriptor stays open while this child sleeps
        signal.pause()
        os._exit(0)
    try:
        runner.close()
        assert process.returncode == 0  # exited on its own; a killed worker has -SIGKILL
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)

def test_time_function_in_process(float_task, libs) -> None:
    inputs, expected = float_task
    out = np.zeros_like(expected[0])
    result = time_function(libs["add"], "add", inputs, [out], FAST)
    assert_ok(result)
    np.testing.assert_allclose(out, expected[0])


class _ClockedKernel:
    """A stand-in kernel whose calls take a fixed simulated time; records each probe's count."""

    def __init__(self, seconds_per_call: float):
        self.seconds_per_call = seconds_per_call
        self.probes: list[int] = []

    def timed(self, buffers, number: int) -> float:
        self.probes.append(number)
        return number * self.seconds_per_call


@pytest.mark.parametrize("per_call", [2e-7, 1e-4, 0.01, 0.03, 0.2])
def test_repeat_count_is_sized_from_the_probe(per_call) -> None:
    """Probes stop at the first count whose repeat reaches min_repeat_ms, and reach it in a
    few probes (not one doubling at a time), without overshooting it far."""
    from ansor.measure.timing import choose_number

    policy = TimingPolicy(min_repeat_ms=50.0)
    kernel = _ClockedKernel(per_call)
    number, first = choose_number(kernel, [], policy)
    assert number == kernel.probes[-1]
    assert number * per_call >= 0.05 and first == pytest.approx(per_call)
    assert len(kernel.probes) <= 2 if per_call >= 1e-4 else len(kernel.probes) <= 3
    assert number == 1 or number * per_call <= 0.05 * 2.5
    assert all(b > a for a, b in zip(kernel.probes, kernel.probes[1:]))


def test_a_program_far_slower_than_the_cutoff_is_timed_once() -> None:
    from ansor.measure.timing import measure_costs

    class Kernel(_ClockedKernel):
        def __call__(self, buffers) -> None:
            pass

    policy = TimingPolicy(min_repeat_ms=50.0, repeat=3, one_repeat_above=0.005)
    assert len(measure_costs(Kernel(0.01), [], policy, warmed_up=True)) == 1
    assert len(measure_costs(Kernel(0.001), [], policy, warmed_up=True)) == 3
    off = TimingPolicy(min_repeat_ms=50.0, repeat=3)
    assert len(measure_costs(Kernel(0.01), [], off, warmed_up=True)) == 3


def test_a_probe_far_past_the_cutoff_ends_the_timing() -> None:
    """A first call already CLEARLY_SLOWER x the cutoff is the only call: nothing is sized to
    min_repeat_ms for a program that cannot be picked."""
    from ansor.measure.timing import CLEARLY_SLOWER, measure_costs

    class Kernel(_ClockedKernel):
        def __call__(self, buffers) -> None:
            pass

    policy = TimingPolicy(min_repeat_ms=50.0, repeat=3, one_repeat_above=0.001)
    slow = Kernel(0.001 * CLEARLY_SLOWER * 1.5)
    assert len(measure_costs(slow, [], policy, warmed_up=True)) == 1 and slow.probes == [1]
    near = Kernel(0.001 * 1.5)  # slower than the cutoff, not clearly: one repeat, sized as usual
    assert len(measure_costs(near, [], policy, warmed_up=True)) == 1 and len(near.probes) == 2


def test_run_result_properties() -> None:
    result = RunResult((1.0, 3.0, 2.0), 0, "", 0.1)
    assert result.median == 2.0 and result.spread == 1.0
    assert RunResult((1.0,), 0, "", 0.1).spread == 0.0
    assert RunResult((), int(MeasureErrorNo.RUN_TIMEOUT), "timeout", 2.0).median == math.inf


def test_worker_exits_when_its_parent_is_killed(float_task, libs, tmp_path) -> None:
    np.save(tmp_path / "a.npy", float_task[0][0])
    np.save(tmp_path / "b.npy", float_task[0][1])
    script = f"""
import sys, numpy as np
from ansor.measure import Runner, TimingPolicy
a, b = np.load({str(tmp_path / "a.npy")!r}), np.load({str(tmp_path / "b.npy")!r})
runner = Runner(timeout=60, timing=TimingPolicy(min_repeat_ms=1))
runner.set_task([a, b], [a + b])
assert runner.run({libs["add"]!r}, "add").error_no == 0
print(runner.worker_pid, flush=True)
runner.run({libs["hang"]!r}, "add")
"""
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    worker_pid = int(parent.stdout.readline())
    time.sleep(0.3)  # let the worker enter the endless kernel
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    orphaned = _alive(worker_pid)
    if orphaned:
        os.kill(worker_pid, signal.SIGKILL)
    assert not orphaned


def _alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (exited, not yet reaped by its new parent) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- checking outputs ---------------------------------------------------------------------------


def test_check_float32_tolerance() -> None:
    expected = np.linspace(-100, 100, 64, dtype=np.float32).reshape(8, 8)
    rtol, atol = default_tolerances(expected)
    assert rtol == 1e-4 and atol == pytest.approx(1e-3)
    assert check_outputs([expected * (1 + 5e-5)], [expected]) is None
    bad = expected.copy()
    bad[4, 7] += 3.25
    message = check_outputs([bad], [expected])
    assert message is not None
    assert message.startswith("output 0 mismatch: max abs err 3.25 at index (4, 7)")
    assert check_outputs([bad], [expected], atol=4.0) is None


def test_check_float64_is_tighter() -> None:
    expected = np.ones(10)
    assert check_outputs([expected + 1e-6], [expected]) is not None
    assert check_outputs([expected + 1e-13], [expected]) is None


def test_check_nan_and_inf() -> None:
    expected = np.ones(5, dtype=np.float32)
    got = expected.copy()
    got[2] = np.nan
    assert "index (2,)" in check_outputs([got], [expected])
    got[2] = np.inf
    assert check_outputs([got], [expected]) is not None
    special = np.array([np.inf, np.nan, 1.0], dtype=np.float32)
    assert check_outputs([special.copy()], [special]) is None
    assert check_outputs([np.array([-np.inf, np.nan, 1.0], np.float32)], [special]) is not None


def test_check_finds_a_mismatch_in_any_chunk_of_a_large_output() -> None:
    """Large outputs are compared a chunk at a time: the last element and a NaN in a middle
    chunk are found, and a special value matched by the output passes in any chunk."""
    from ansor.measure.check import CHECK_CHUNK
    expected = np.linspace(-1, 1, 3 * CHECK_CHUNK + 5, dtype=np.float32)
    got = expected.copy()
    got[-1] += 1.0
    assert f"index ({expected.size - 1},)" in check_outputs([got], [expected])
    got = expected.copy()
    got[CHECK_CHUNK + 3] = np.nan
    assert f"index ({CHECK_CHUNK + 3},)" in check_outputs([got], [expected])
    special = expected.copy()
    special[2 * CHECK_CHUNK] = np.inf
    assert check_outputs([special.copy()], [special]) is None


def test_check_integers_exact() -> None:
    expected = np.arange(12, dtype=np.int64).reshape(3, 4)
    assert check_outputs([expected.copy()], [expected]) is None
    off_by_one = expected.copy()
    off_by_one[1, 2] += 1
    assert "index (1, 2)" in check_outputs([off_by_one], [expected])
    assert check_outputs([off_by_one], [expected], rtol=1.0, atol=10.0) is not None


def test_check_structure_mismatches() -> None:
    a = np.zeros((2, 3), np.float32)
    assert "outputs" in check_outputs([a, a], [a])
    assert "shape" in check_outputs([a.T.copy()], [a])
    assert "dtype" in check_outputs([a.astype(np.float64)], [a])


def test_a_worker_whose_parent_stopped_listening_ends_quietly():
    from multiprocessing import Pipe

    from ansor.measure.worker import serve

    parent_end, worker_end = Pipe()
    parent_end.close()  # the tuner was interrupted while this worker started
    serve(worker_end)  # returns instead of raising BrokenPipeError (a traceback in the terminal)


def test_long_reductions_are_checked_with_room_for_their_rounding():
    """A float32 sum of a million values one after another is ~2e-4 off; a short one keeps the
    default tolerance, and a wrong program stays far outside either."""
    import ansor
    from ansor import te
    from ansor.measure.check import reduction_rtol
    X = te.placeholder((1024, 1024), name="X")
    assert ansor.Task([X, te.ops.norm2(X)]).longest_reduction == 1024 * 1024
    assert ansor.Task([X, te.ops.softmax(X)]).longest_reduction == 1024
    assert reduction_rtol("float32", 1024) == 1e-4
    assert 5e-4 < reduction_rtol("float32", 1 << 20) < 2e-3
    assert reduction_rtol("int32", 1 << 20) == 0.0
