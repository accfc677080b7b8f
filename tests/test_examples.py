"""The example scripts run from a fresh checkout at tiny budgets (smoke runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ansor

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_tutorial_3_transfer_runs_and_draws_its_curves(tmp_path):
    host = ansor.Target.host()
    if host.num_cores < 2:
        pytest.skip("target A is this machine on one core: needs two")
    png = tmp_path / "transfer.png"
    out = subprocess.run([sys.executable, str(EXAMPLES / "tutorial_3_transfer.py"), "--small", "--trials", "6",
                          "--from-isa", host.isa, "--from-cores", "1", "--plot", str(png)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "matmul [64, 64, 64] on target A" in out.stdout
    assert "trials to reach 95% of the from-scratch best" in out.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(script: str, *args: str, cwd) -> str:
    """Run an example at a tiny budget; its stdout (the test fails with its output otherwise)."""
    out = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                         timeout=600, cwd=cwd)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _assert_png(path) -> None:
    """A real image: the PNG signature, and matplotlib reads pixels from it."""
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    pixels = matplotlib.image.imread(str(path))
    assert pixels.ndim == 3 and pixels.shape[0] > 50 and pixels.shape[1] > 50


def test_tutorial_1_matmul_compares_with_numpy_and_pytorch_and_draws_its_curve(tmp_path):
    png = tmp_path / "matmul.png"
    out = _run("tutorial_1_matmul.py", "--small", "--trials", "2", "--rounds", "2", "--plot", str(png), cwd=tmp_path)
    assert "matmul 64x64x64" in out and "tuned: 2 programs measured" in out
    assert "ansor vs numpy: ansor " in out
    if "torch is not installed" not in out:
        assert "ansor vs PyTorch eager: ansor " in out
        assert "ansor vs torch.compile: ansor " in out or "skipped torch.compile" in out
    assert "the winning program (its loop nest):" in out and "C[i, j]" in out
    assert f"tuning curve saved to {png}" in out
    _assert_png(png)


def test_tutorial_2_conv2d_reads_five_winning_structures(tmp_path):
    out = _run("tutorial_2_conv2d.py", "--small", "--trials", "2", "--rounds", "2", cwd=tmp_path)
    for label in ("early 3x3", "late 3x3", "1x1", "depthwise 3x3", "stem 7x7/2"):
        assert f"\n{label}" in out and f"- {label} (" in out  # its timing line and its sentence
    for fact in ("tiling", "packed layout", "vector", "register tile", "fused stages", "parallel"):
        assert fact in out
    assert "ff " in out and "rc " in out  # split lengths of the output-channel and reduction axes
    assert "different winning structures: " in out and " of 5 shapes" in out


def test_tutorial_4_custom_fuses_layer_norm_and_gelu_and_draws_the_chart(tmp_path):
    png = tmp_path / "custom.png"
    out = _run("tutorial_4_custom.py", "--small", "--trials", "2", "--rounds", "2", "--plot", str(png),
               cwd=tmp_path)
    assert "LayerNorm+GELU 32x64: 4 stages declared" in out
    if "torch is not installed" not in out:
        assert "ansor vs PyTorch eager: ansor " in out
    assert "skipped Triton (hand-written): " in out or "ansor vs Triton (hand-written)" in out
    assert "norm: inlined" in out and "loop nest" in out
    assert f"bar chart saved to {png}" in out
    _assert_png(png)


def test_compare_tools_compares_a_workload_and_a_model(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")  # the torch.export-based ONNX exporter
    out = _run("compare_tools.py", "--small", "--trials", "2", "--rounds", "2", "--skip", "torch.compile",
               "--charts", str(tmp_path), cwd=tmp_path)  # torch.compile: tutorials 1 and 4
    assert "ansor vs numpy: ansor " in out and "ansor vs PyTorch eager: ansor " in out
    assert "small_cnn.onnx" in out
    assert "ansor vs onnxruntime: ansor " in out or "skipped onnxruntime" in out
    for name in ("compare_matmul.png", "compare_model.png"):
        _assert_png(tmp_path / name)


def test_tutorial_5_gpu_checks_an_opencl_kernel_and_prints_its_cuda_form(tmp_path):
    from ansor.measure.opencl import platform_problem
    try:
        problem = platform_problem("Portable Computing Language")
    except Exception:  # noqa: BLE001 - pyopencl missing
        problem = "pyopencl is not installed (pip install 'ansor[opencl]')"
    if problem:
        pytest.skip(problem)
    out = _run("tutorial_5_gpu.py", "--small", "--trials", "2", "--out", str(tmp_path / "cuda"), cwd=tmp_path)
    assert "best OpenCL program: max error against numpy" in out
    assert "blocks of" in out and "shared: A.shared" in out and "values accumulated by each thread" in out
    assert "__kernel" in out
    source = (tmp_path / "cuda" / "kernel.cu").read_text()
    assert '__global__' in source and "__syncthreads();" in source
    if shutil.which("nvcc"):
        assert "registers" in out and "bytes of shared memory" in out


def test_tutorial_5_gpu_without_pyopencl_says_what_to_install(tmp_path):
    """Without the OpenCL extra: one line naming the install, exit status 2, no traceback."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "pyopencl.py").write_text(  # shadows an installed pyopencl: importing it fails as if absent
        "raise ModuleNotFoundError(\"No module named 'pyopencl'\", name='pyopencl')\n")
    path = os.pathsep.join(filter(None, [str(hidden), os.environ.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, str(EXAMPLES / "tutorial_5_gpu.py"), "--small", "--trials", "2"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": path})
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'ansor[opencl]'" in lines[0] and "pyopencl" in lines[0], out.stderr
