"""ansor.measure.input_copies: a task's rotated input copies kept between its programs."""

from __future__ import annotations

import threading
import time
from multiprocessing.connection import Pipe

import numpy as np
import pytest
from helpers import built_libraries, vector_add_arrays

from ansor.measure import Builder, MeasureErrorNo, TimingPolicy, evaluate_kernel
from ansor.measure.input_copies import InputCopies
from ansor.measure.library import KernelLibrary
from ansor.measure.run import RunRequest, save_array
from ansor.measure.timing import RotatedCalls, measure_costs
from ansor.measure.worker import TaskArrays, serve

N = 1024


def packed_add(name: str, pad: int) -> str:
    """c = a + b, reading b from a packed buffer: b reversed, after `pad` unused floats."""
    return f"""
void {name}(void* arg0, void* arg1, void* arg2, void* arg3) {{
  const float* a = (const float*)arg0; const float* p = (const float*)arg3 + {pad}; float* c = (float*)arg2;
  (void)arg1;
  for (int i = 0; i < {N}; ++i) c[i] = a[i] + p[{N} - 1 - i];
}}
void {name}_prepack(void* arg0, void* arg1, void* arg2, void* arg3) {{
  const float* b = (const float*)arg1; float* p = (float*)arg3 + {pad};
  (void)arg0; (void)arg2;
  for (int i = 0; i < {N}; ++i) p[{N} - 1 - i] = b[i];
}}
long long {name}_packed_bytes(int i) {{ return i == 0 ? {(N + pad) * 4} : -1; }}
"""


SOURCES = {
    "plain": f"""
void plain(void* arg0, void* arg1, void* arg2) {{
  const float* a = (const float*)arg0; const float* b = (const float*)arg1; float* c = (float*)arg2;
  for (int i = 0; i < {N}; ++i) c[i] = a[i] + b[i];
}}
""",
    "packed": packed_add("packed", 0),
    "packed_wide": packed_add("packed_wide", 64),
    # right on its first call, then it counts its calls in its input: a program that writes into its inputs
    "writes_input": f"""
void writes_input(void* arg0, void* arg1, void* arg2) {{
  float* a = (float*)arg0; const float* b = (const float*)arg1; float* c = (float*)arg2;
  for (int i = 0; i < {N}; ++i) c[i] = a[i] + b[i];
  a[{N} - 1] += 1000.0f;
}}
""",
}


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return built_libraries(Builder(cache_dir=tmp_path_factory.mktemp("build-cache"), n_parallel=2), SOURCES)


@pytest.fixture(scope="module")
def task() -> tuple[list[np.ndarray], list[np.ndarray]]:
    return vector_add_arrays(N)


SET_BYTES = 2 * N * 4  # the inputs of one copy
#: copies spanning four sets of inputs: five copies without packed buffers, four with (3 x 12 KiB
#: do not reach 32 KiB)
COLD = TimingPolicy(warmup=1, repeat=2, min_repeat_ms=0.2, cold_bytes=4 * SET_BYTES)


def test_programs_of_one_task_reuse_the_input_copies(libs, task) -> None:
    """A task's second program is timed on the input copies its first one made, and its packed
    copies go into the arenas an earlier program allocated when they fit; both are checked."""
    inputs, expected = task
    copies = InputCopies(inputs)
    first = evaluate_kernel(libs["plain"], "plain", inputs, expected, COLD, input_copies=copies)
    assert first.error_no == MeasureErrorNo.NO_ERROR, first.error_msg
    assert (copies.made, copies.reused, copies.arenas_made) == (4, 0, 0)  # five copies: the program's own + 4
    kept = [id(array) for array in copies._inputs[0]]

    # packed: each set is 2 inputs + 1 packed buffer -> four copies, three from the cache
    for name, arenas in (("packed", 3), ("packed_wide", 6), ("packed", 6)):
        result = evaluate_kernel(libs[name], name, inputs, expected, COLD, input_copies=copies)
        assert result.error_no == MeasureErrorNo.NO_ERROR, (name, result.error_msg)
        assert copies.made == 4 and copies.arenas_made == arenas, name  # the narrow program fits the wide arenas
    assert copies.reused == 3 * 3 and [id(array) for array in copies._inputs[0]] == kept


def test_every_rotated_copy_computes_the_right_answer(libs, task) -> None:
    """Each copy the calls cycle through (the cached inputs, the packed buffers copied into a
    reused arena) gives the reference output, program after program."""
    inputs, expected = task
    copies = InputCopies(inputs)
    for name in ("packed_wide", "packed", "plain", "packed"):
        with KernelLibrary(libs[name], name) as kernel:
            buffers = [a.copy() for a in inputs] + [np.zeros(N, np.float32)] + kernel.packed_buffers()
            kernel.prepack(buffers)
            rotation = RotatedCalls(kernel, buffers, COLD.cold_bytes, n_inputs=2, input_copies=copies)
            assert rotation.input_copies is copies and rotation.copies == (5 if name == "plain" else 4)
            for call in rotation._calls:
                buffers[2][:] = 0.0
                call()
                np.testing.assert_array_equal(buffers[2], expected[0])
            assert len(measure_costs(kernel, buffers, COLD, n_inputs=2, input_copies=copies)) == COLD.repeat
    assert copies.made == 4


def test_a_program_that_writes_its_inputs_drops_the_copies(libs, task) -> None:
    """The next program must not be timed on inputs an earlier one changed: they are made again."""
    inputs, expected = task
    copies = InputCopies(inputs)
    assert evaluate_kernel(libs["plain"], "plain", inputs, expected, COLD, input_copies=copies).error_no == 0
    assert copies.made == 4 and copies.nbytes > 0
    result = evaluate_kernel(libs["writes_input"], "writes_input", inputs, expected, COLD, input_copies=copies)
    assert result.error_no == MeasureErrorNo.NO_ERROR, result.error_msg  # its check ran on its first call
    assert copies.nbytes == 0
    assert evaluate_kernel(libs["plain"], "plain", inputs, expected, COLD, input_copies=copies).error_no == 0
    assert copies.made == 8
    assert all(np.array_equal(c, o) for cached in copies._inputs for c, o in zip(cached, inputs))


def test_copies_of_other_inputs_are_refused(libs, task) -> None:
    inputs, expected = task
    other = InputCopies([inputs[0] + 1.0, inputs[1]])
    with pytest.raises(ValueError, match="other inputs"):
        evaluate_kernel(libs["plain"], "plain", inputs, expected, COLD, input_copies=other)
    assert not InputCopies(inputs[:1]).fits(inputs)


def _request(tmp_path, key: str, arrays, lib: str, name: str) -> RunRequest:
    inputs, expected = arrays
    paths = [save_array(str(tmp_path / f"{key}-{kind}{i}"), array)
             for kind, group in (("in", inputs), ("out", expected)) for i, array in enumerate(group)]
    return RunRequest(key, tuple(paths[:len(inputs)]), tuple(paths[len(inputs):]), lib, name, COLD, None, None)


def test_the_worker_keeps_one_tasks_copies_and_frees_them(libs, task, tmp_path) -> None:
    """In the worker, the programs of one task share its copies; a new task frees them, and so
    does a wait for the next run longer than the idle time."""
    parent, child = Pipe(duplex=True)
    arrays = TaskArrays()
    thread = threading.Thread(target=serve, args=(child, arrays, 0.5), daemon=True)
    thread.start()
    try:
        assert parent.recv() == "ready"
        for name in ("plain", "packed"):
            parent.send(_request(tmp_path, "one", task, libs[name], name))
            assert parent.recv().error_no == MeasureErrorNo.NO_ERROR
        first = arrays.copies
        assert first is not None and (first.made, first.reused) == (4, 3) and first.nbytes > 0

        other = ([task[0][0] * 2, task[0][1]], [task[0][0] * 2 + task[0][1]])
        parent.send(_request(tmp_path, "two", other, libs["plain"], "plain"))
        assert parent.recv().error_no == MeasureErrorNo.NO_ERROR
        assert first.nbytes == 0 and arrays.copies is not first and arrays.copies.made == 4

        deadline = time.monotonic() + 30.0
        while arrays.holds_copies() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not arrays.holds_copies()  # idle: freed
        parent.send(_request(tmp_path, "two", other, libs["plain"], "plain"))
        assert parent.recv().error_no == MeasureErrorNo.NO_ERROR and arrays.copies.made == 8
    finally:
        parent.send(None)
        thread.join(timeout=10.0)
        parent.close()
        child.close()
    assert not thread.is_alive()
