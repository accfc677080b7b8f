"""Whole models on CUDA without a GPU: `ansor.build(graph, target=Target.cuda(...))` writes one
CUDA program (every subgraph's kernels and a C driver); nvcc compiles it for sm_80 and sm_90,
and the same text runs on the CPU under the CUDA emulation headers, equal to PyTorch."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ansor
from ansor import Target
from ansor.graph.cuda_model import CudaModel, CudaModelError

torch = pytest.importorskip("torch")
from ansor.graph import from_torch  # noqa: E402

TESTS = Path(__file__).parent


class ConvReluLinear(torch.nn.Module):
    """Two convolutions of one shape (one task, two occurrences with their own weights), one
    of another, and a linear layer over the flattened map."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.a = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        x = torch.relu(self.b(torch.relu(self.a(x))))
        return self.fc(x.flatten(1))


@pytest.fixture(scope="module")
def model_and_torch(tmp_path_factory):
    torch.manual_seed(0)
    net = ConvReluLinear().eval()
    x = torch.randn(1, 3, 6, 6)
    graph = from_torch(net, (x,))
    db = str(tmp_path_factory.mktemp("cuda_model") / "empty.db")
    model = ansor.build(graph, database=db, target=Target.cuda("sm_90"), verbose=False, winograd=False)
    return model, net, x


def test_build_gives_one_cuda_program_with_a_driver(model_and_torch):
    model, _, _ = model_and_torch
    assert isinstance(model, CudaModel)
    src = model.source
    assert src.count('extern "C" int ansor_model_run(') == 1 and src.count("ansor_model_init(") == 1
    assert len(model.kernels) == 3  # stem, the two 8->8 convolutions as one task, the linear layer
    names = [launch.kernel for launch in model.launches]
    assert len(set(names)) < len(names)  # the repeated convolution launches its kernels twice
    for name in set(names):  # each kernel defined once, under its task's prefix
        assert len([ln for ln in src.splitlines() if f" {name}(" in ln and "__global__" in ln]) == 1
    assert len(model.weights) == 8  # weight and bias of four layers, uploaded once each
    # activations share planned buffers: fewer than one per value
    assert len(model.memory.sizes) < len(model.graph.types)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_whole_model_compiles_with_nvcc(model_and_torch, tmp_path, arch):
    model, _, _ = model_and_torch
    cu = tmp_path / "model.cu"
    cu.write_text(model.source)
    done = subprocess.run(["nvcc", f"-arch={arch}", "-O3", "--shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v",
                           "-o", str(tmp_path / "model.so"), str(cu), "-lcudart"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert " 0 bytes spill stores" in done.stderr and "bytes spill stores" in done.stderr
    assert all(" 0 bytes spill" in line for line in done.stderr.splitlines() if "spill stores" in line)


def _emulated_library(source: str, tmp_path: Path) -> Path:
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in ("mma.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_runtime.h"):
        (stubs / name).write_text("")
    cu = tmp_path / "model.cu"
    cu.write_text(source)
    lib = tmp_path / "model_emulated.so"
    done = subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-w", "-shared", "-fPIC",
                           "-include", str(TESTS / "cuda_emulation.h"),
                           "-include", str(TESTS / "cuda_runtime_emulation.h"), "-I", str(stubs),
                           "-x", "c++", str(cu), "-o", str(lib)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return lib


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_whole_model_runs_under_emulation_equal_to_pytorch(model_and_torch, tmp_path):
    model, net, x = model_and_torch
    model.load(_emulated_library(model.source, tmp_path))
    try:
        want = net(x).detach().numpy()
        got = model(x.numpy())
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        again = model(x.numpy() * 2)  # buffers reused: the second call sees only its own input
        np.testing.assert_allclose(again, net(x * 2).detach().numpy(), rtol=1e-4, atol=1e-5)
        assert model.check().ok
    finally:
        model.release()


def test_a_gather_is_refused_by_name(tmp_path):
    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(16, 8)

        def forward(self, ids):
            return self.emb(ids) * 2

    graph = from_torch(Lookup().eval(), (torch.tensor([[1, 2, 3]]),))
    with pytest.raises(NotImplementedError, match=r"CUDA model: subgraph .* gathers with embedding"):
        ansor.build(graph, database=str(tmp_path / "x.db"), target=Target.cuda("sm_90"), verbose=False)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_without_a_gpu_the_setup_error_is_said(model_and_torch, tmp_path):
    if Path("/dev/nvidia0").exists():
        pytest.skip("a GPU is present: the model runs")
    model, _, _ = model_and_torch
    with pytest.raises(CudaModelError, match="setting up failed"):
        model.load(model.compile(tmp_path / "model.so"))


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
def test_a_float16_model_sums_in_float32_and_runs_equal_to_pytorch(tmp_path):
    """A half model (`net.half()`): its convolutions and linear layer accumulate in float32 and
    round once (graph/half_precision.py SUMMING_OPS), as PyTorch computes them; te refuses a
    float16 running sum, so without that rule the model has no CUDA kernels at all."""
    torch.manual_seed(0)
    net = ConvReluLinear().eval().half()
    x = torch.randn(1, 3, 6, 6).half()
    model = ansor.build(from_torch(net, (x,)), database=str(tmp_path / "empty.db"), target=Target.cuda("sm_90"),
                        verbose=False, winograd=False)
    assert "__half" in model.source
    model.load(_emulated_library(model.source, tmp_path))
    try:
        got = model(x.numpy())
        assert got.dtype == np.float16
        want = net.float()(x.float()).detach().numpy()  # float32 throughout: the halves' ideal
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
        assert model.check().ok
    finally:
        model.release()
