"""CUDA kernels of float16 and bfloat16 values: printed with cuda_fp16.h / cuda_bf16.h types,
computed in float and rounded after every operation (as numpy and the CPU backend compute
them), and compiled by nvcc for sm_80 and sm_90 without a GPU. OpenCL refuses them by name."""

from __future__ import annotations

import shutil
import subprocess

import pytest

import ansor
from ansor import te
from ansor.backend import generate_source
from ansor.search.sketch_policy import SketchPolicy

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


def _half_matmul_epilogue(dtype: str, target: ansor.Target) -> ansor.Task:
    """A matmul of `dtype` operands accumulated in float32, then an elementwise stage in `dtype`."""
    A = te.placeholder((64, 32), dtype, name="A")
    B = te.placeholder((32, 64), dtype, name="B")
    k = te.reduce_axis(32, name="k")
    C = te.compute((64, 64), lambda i, j: te.sum(te.cast(A[i, k], "float32") * te.cast(B[k, j], "float32"),
                                                 axis=k), name="C")
    D = te.compute((64, 64), lambda i, j: te.cast(te.tanh(C[i, j]), dtype) * A[i, j % 32] + te.const(0.5, dtype),
                   name="D")
    return ansor.Task([A, B, D], target=target)


def _nvcc(source: str, arch: str, tmp_path) -> str:
    path = tmp_path / f"k_{arch}.cu"
    path.write_text(source)
    done = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-o", str(tmp_path / "k.cubin"),
                           str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + source
    return done.stderr


@pytest.mark.parametrize("dtype,ctype,widen", [("float16", "__half", "__half2float"),
                                               ("bfloat16", "__nv_bfloat16", "__bfloat162float")])
def test_cuda_prints_half_floats_with_the_cuda_types_and_rounds_every_operation(dtype, ctype, widen):
    task = _half_matmul_epilogue(dtype, ansor.Target.cuda(arch="sm_80"))
    (program,) = SketchPolicy(task, seed=0).sample(1)
    source, _ = generate_source(program, task.target)
    assert "#include <cuda_fp16.h>" in source and "#include <cuda_bf16.h>" in source
    assert f"const {ctype}* __restrict__ A" in source and f"{ctype}* __restrict__ D" in source
    assert widen in source
    narrow = "__float2half_rn" if dtype == "float16" else "__float2bfloat16_rn"
    # the tanh, the product and the sum are each rounded to the type before the store narrows
    assert source.count(narrow) >= 3


def test_float32_kernels_include_no_half_headers():
    A = te.placeholder((64,), "float32", name="A")
    task = ansor.Task([A, te.compute((64,), lambda i: A[i] * 2.0, name="B")], target=ansor.Target.cuda())
    (program,) = SketchPolicy(task, seed=0).sample(1)
    assert "cuda_fp16.h" not in generate_source(program, task.target)[0]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_opencl_refuses_half_floats_by_name(dtype):
    task = _half_matmul_epilogue(dtype, ansor.Target.opencl())
    (program,) = SketchPolicy(task, seed=0).sample(1)
    with pytest.raises(TypeError, match=f"opencl kernels of {dtype} are not supported"):
        generate_source(program, task.target)


@needs_nvcc
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sampled_half_float_programs_compile_for_sm80_and_sm90_without_spills(dtype, tmp_path):
    task = _half_matmul_epilogue(dtype, ansor.Target.cuda(arch="sm_80"))
    for program in SketchPolicy(task, seed=1).sample(3):
        source, _ = generate_source(program, task.target)
        for arch in ("sm_80", "sm_90"):
            report = _nvcc(source, arch, tmp_path)
            assert "0 bytes spill stores, 0 bytes spill loads" in report
            assert "bytes spill stores" not in report.replace("0 bytes spill stores", "")
