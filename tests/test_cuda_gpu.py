"""CUDA kernels on a real GPU: matmuls built with nvcc, run through CuPy and compared with numpy,
and a short tuning job on the GPU whose best record builds a correct kernel.

Without a GPU these tests are skipped with the reason (no `nvidia-smi`, or it lists no GPU; no
CuPy that reaches the GPU; no nvcc): the CUDA printer and builder are checked without a GPU in
test_gpu_codegen.py, and the same schedules run on PoCL there.
"""

from __future__ import annotations

import shutil
import subprocess
from functools import cache

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.search.sketch_policy import SketchPolicy

from helpers import assert_close, random_inputs


@cache
def _missing_gpu() -> str | None:
    """Why CUDA kernels cannot run here, or None when they can."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU here (nvidia-smi is not installed)"
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed ({exc})"
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        return "nvidia-smi lists no GPU"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as exc:  # noqa: BLE001 - no CuPy, or a CuPy that cannot reach the driver
        return f"CuPy cannot reach the GPU ({type(exc).__name__}: {exc}); pip install 'ansor[cuda]'"
    if shutil.which("nvcc") is None:
        return "nvcc is not installed (CUDA programs are built with it)"
    return None


pytestmark = pytest.mark.skipif(_missing_gpu() is not None, reason=_missing_gpu() or "")


def gpu_target() -> ansor.Target:
    """The CUDA target of the GPU present (its compute capability, as CuPy reports it)."""
    import cupy

    return ansor.Target.cuda(f"sm_{cupy.cuda.Device(0).compute_capability}")


def matmul_task(n: int, m: int, k: int) -> ansor.Task:
    A = te.placeholder((n, k), name="A")
    B = te.placeholder((k, m), name="B")
    return ansor.Task([A, B, te.ops.matmul(A, B)], target=gpu_target(), name=f"matmul_{n}x{m}x{k}")


@pytest.mark.parametrize("shape", [(128, 96, 64), (60, 52, 36)])  # tiles that divide, and ragged edges
def test_cuda_matmuls_run_on_the_gpu_and_match_numpy(shape, tmp_path):
    task = matmul_task(*shape)
    a, b = random_inputs(task)
    expected = a.astype(np.float64) @ b
    db = str(tmp_path / "none.db")
    default = ansor.build(task, database=db, quick_trials=0)  # the untuned default schedule
    assert '__global__' in default.source
    assert_close(default(a, b), expected, "default schedule")
    for i, program in enumerate(SketchPolicy(task, seed=0).sample(3)):  # shared tiles, threads, vthreads
        kernel = ansor.build(task, database=db, state=program)
        assert_close(kernel(a, b), expected, f"sampled program {i}:\n{program}")


def test_a_short_cuda_tuning_job_keeps_a_correct_best(tmp_path):
    task = matmul_task(128, 128, 128)
    db = str(tmp_path / "cuda.db")
    result = ansor.tune(task, trials=8, database=db, seed=0, progress=False)
    assert result.trials == 8 and np.isfinite(result.best_cost)
    kernel = ansor.build(task, database=db)
    assert kernel.record is not None and kernel.record.ok
    assert kernel.record.target_key == task.target.key
    a, b = random_inputs(task)
    assert_close(kernel(a, b), a.astype(np.float64) @ b, f"best record:\n{kernel.schedule}")
