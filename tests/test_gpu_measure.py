"""The GPU measurement layer on a machine without a GPU: OpenCL programs built, run and timed on
PoCL, race-checked on Oclgrind; CUDA programs compiled by nvcc with their resources read."""

from __future__ import annotations

import numpy as np
import pytest

from ansor.measure import MeasureErrorNo, TimingPolicy
from ansor.measure.cuda import CudaBuilder, CudaKernel, NoCudaDeviceError, nvcc_available, parse_ptxas_resources
from ansor.measure.gpu_module import GPUBuffer, GPUModule, KernelLaunch, launch_header
from ansor.measure.oclgrind import oclgrind_available, race_check
from ansor.measure.opencl import (DEFAULT_PLATFORM, OpenCLBuilder, OpenCLKernel, OpenCLRunner,
                                  OpenCLUnavailableError, find_device, opencl_platforms, platform_problem)

FAST = TimingPolicy(warmup=0, repeat=2, min_repeat_ms=0.0)

needs_pocl = pytest.mark.skipif(platform_problem(DEFAULT_PLATFORM) is not None,
                                reason=str(platform_problem(DEFAULT_PLATFORM)))
needs_oclgrind = pytest.mark.skipif(not oclgrind_available(),
                                    reason="Oclgrind is not installed: pip install 'ansor[opencl]'")
needs_nvcc = pytest.mark.skipif(not nvcc_available(), reason="nvcc is not on PATH")


def matmul_buffers(n: int) -> list[GPUBuffer]:
    return [GPUBuffer("A", (n, n), "float32", "input"), GPUBuffer("B", (n, n), "float32", "input"),
            GPUBuffer("C", (n, n), "float32", "output")]


def matmul_cl(n: int = 64, tile: int = 16, second_barrier: bool = True, body: str = "") -> str:
    """A tiled matmul C = A @ B with `__local` tiles: one work-group per tile of C."""
    launch = KernelLaunch("matmul", (n // tile, n // tile, 1), (tile, tile, 1), ("A", "B", "C"))
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);" if second_barrier else ""
    store = body or "C[row * N + col] = acc;"
    return launch_header("opencl", [launch], matmul_buffers(n)) + f"""\
#define N {n}
#define TILE {tile}
__kernel void matmul(__global const float* restrict A, __global const float* restrict B,
                     __global float* restrict C) {{
  __local float As[TILE][TILE];
  __local float Bs[TILE][TILE];
  int tx = get_local_id(0), ty = get_local_id(1);
  int row = get_group_id(1) * TILE + ty, col = get_group_id(0) * TILE + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < N; k0 += TILE) {{
    As[ty][tx] = A[row * N + k0 + tx];
    Bs[ty][tx] = B[(k0 + ty) * N + col];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
    {barrier}
  }}
  {store}
}}
"""


def exp_twice_cl(n: int = 1000, block: int = 64) -> str:
    """Two kernels through a temp buffer: T = exp(X), then Y = T * 2."""
    grid = ((n + block - 1) // block, 1, 1)
    kernels = [KernelLaunch("exp_k", grid, (block, 1, 1), ("X", "T")),
               KernelLaunch("twice_k", grid, (block, 1, 1), ("T", "Y"))]
    buffers = [GPUBuffer("X", (n,), "float32", "input"), GPUBuffer("Y", (n,), "float32", "output"),
               GPUBuffer("T", (n,), "float32", "temp")]
    return launch_header("opencl", kernels, buffers) + f"""\
__kernel void exp_k(__global const float* restrict X, __global float* restrict T) {{
  int i = get_global_id(0);
  if (i < {n}) T[i] = exp(X[i]);
}}
__kernel void twice_k(__global const float* restrict T, __global float* restrict Y) {{
  int i = get_global_id(0);
  if (i < {n}) Y[i] = T[i] * 2.0f;
}}
"""


def matmul_inputs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, n)).astype(np.float32),
            rng.standard_normal((n, n)).astype(np.float32))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu-build")


# ---- the launch plan -----------------------------------------------------------------------


def test_header_round_trips_and_names_roles():
    source = exp_twice_cl(100, 32)
    module = GPUModule.parse(source)
    assert module.language == "opencl" and module.source == source
    assert [k.name for k in module.kernels] == ["exp_k", "twice_k"]
    assert module.kernels[0].grid == (4, 1, 1) and module.kernels[0].global_size == (128, 1, 1)
    assert [b.name for b in module.inputs] == ["X"]
    assert [b.name for b in module.outputs] == ["Y"]
    assert [b.name for b in module.temps] == ["T"]
    assert module.temps[0].nbytes == 400
    assert launch_header(module.language, module.kernels, module.buffers) == source.split("\n")[0] + "\n"


@pytest.mark.parametrize("source, message", [
    ("__kernel void f() {}\n", "first line must start with"),
    ("// ansor-launch: {oops\n", "damaged ansor-launch header"),
    ('// ansor-launch: {"language": "metal", "kernels": [], "buffers": []}\n', "language must be"),
    (('// ansor-launch: {"language": "cuda", "kernels": [{"name": "k", "grid": [1, 1], "block": [1, 1, 1],'
      ' "args": []}], "buffers": []}\n'), "grid must be 3 positive integers"),
    (('// ansor-launch: {"language": "cuda", "kernels": [{"name": "k", "grid": [1, 1, 1], "block": [1, 1, 1],'
      ' "args": ["Z"]}], "buffers": []}\n'), "args name no buffer: Z"),
    (('// ansor-launch: {"language": "cuda", "kernels": [{"name": "k", "grid": [1, 1, 1], "block": [1, 1, 1],'
      ' "args": []}], "buffers": [{"name": "A", "shape": [2], "dtype": "complex64", "role": "input"}]}\n'),
     "dtype must be one of"),
])
def test_damaged_header_is_a_clear_error(source, message):
    with pytest.raises(ValueError, match=message):
        GPUModule.parse(source)


def test_missing_platform_names_what_is_installed():
    try:
        find_device("No Such Platform")
    except OpenCLUnavailableError as err:  # without pyopencl: that it is missing, and the fix
        assert "ansor[opencl]" in str(err)
        if opencl_platforms():
            assert "No Such Platform" in str(err) and repr(opencl_platforms()[0]) in str(err)
    else:
        pytest.fail("an unknown platform was found")


# ---- OpenCL on PoCL ------------------------------------------------------------------------


@needs_pocl
def test_tiled_matmul_builds_runs_and_times(cache_dir):
    source = matmul_cl(64, 16)
    builder = OpenCLBuilder(cache_dir=cache_dir)
    result = builder.compile_one(source)
    assert result.error_no == MeasureErrorNo.NO_ERROR, result.error_msg
    assert result.lib_path.endswith(".cl")
    again = builder.compile_one(source)
    assert again.lib_path == result.lib_path and again.compile_seconds == 0.0  # cached

    a, b = matmul_inputs(64)
    c = np.full((64, 64), np.nan, np.float32)
    with OpenCLKernel(result.lib_path, "matmul") as kernel:
        kernel(a, b, c)  # written in place
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
        costs = kernel.time(a, b, c, number=2, repeat=2)
        assert len(costs) == 2 and all(cost > 0 for cost in costs)
        with pytest.raises(ValueError, match="expected shape"):
            kernel(a, b, np.empty((64, 32), np.float32))


@needs_pocl
def test_two_kernels_through_a_temp_buffer():
    x = np.linspace(-2, 2, 1000, dtype=np.float32)
    y = np.zeros(1000, np.float32)
    with OpenCLKernel(exp_twice_cl(1000)) as kernel:  # source text works as well as a path
        kernel([x, y])  # KernelLibrary's form: one list of buffers
        np.testing.assert_allclose(y, np.exp(x) * 2, rtol=1e-5)
        assert kernel.timed([x, y], 3) > 0


@needs_pocl
def test_builder_reports_compile_errors_and_plan_mismatches(cache_dir):
    builder = OpenCLBuilder(cache_dir=cache_dir)
    broken = matmul_cl(32, 16, body="C[row * N + col] = ;")
    not_planned = matmul_cl(32, 16).replace("__kernel void matmul(", "__kernel void other(")
    bad_header = "__kernel void f(__global float* A) { A[0] = 1.0f; }\n"
    results = builder.build([broken, not_planned, bad_header])
    assert [r.error_no for r in results] == [MeasureErrorNo.COMPILE_HOST] * 3
    assert all(r.lib_path is None for r in results)
    assert "expected expression" in results[0].error_msg
    assert "names kernel 'matmul'" in results[1].error_msg and "other" in results[1].error_msg
    assert "first line" in results[2].error_msg


@needs_pocl
def test_runner_checks_times_and_isolates(cache_dir, tmp_path):
    n = 32
    a, b = matmul_inputs(n, seed=1)
    builder = OpenCLBuilder(cache_dir=cache_dir)
    sources = [
        matmul_cl(n, 16),
        matmul_cl(n, 16, body="C[row * N + col] = acc + 1.0f;"),  # wrong answer
        matmul_cl(n, 16, body="C[row * N + col + (1L << 40)] = acc;"),  # writes far out of bounds
        matmul_cl(n, 16, body="if (acc == 12345.0f) C[0] = acc;"),  # writes (almost) nothing
    ]
    good, wrong, wild, lazy = builder.build(sources)
    assert all(r.error_no == MeasureErrorNo.NO_ERROR for r in (good, wrong, wild, lazy))
    unbuildable = tmp_path / "broken.cl"
    unbuildable.write_text(matmul_cl(n, 16, body="C[0] = ;"))
    with OpenCLRunner(timeout=30.0, timing=FAST) as runner:
        runner.set_task([a, b], [a @ b])
        ok = runner.run(good.lib_path, "matmul")
        assert ok.error_no == MeasureErrorNo.NO_ERROR, ok.error_msg
        assert len(ok.costs) == 2 and ok.median > 0
        # right after a correct run, whose results the device memory may still hold
        unwritten = runner.run(lazy.lib_path, "matmul")
        assert unwritten.error_no == MeasureErrorNo.WRONG_ANSWER and "non-finite" in unwritten.error_msg
        bad = runner.run(wrong.lib_path, "matmul")
        assert bad.error_no == MeasureErrorNo.WRONG_ANSWER and "mismatch" in bad.error_msg
        crashed = runner.run(wild.lib_path, "matmul")
        assert crashed.error_no == MeasureErrorNo.RUNTIME_DEVICE, crashed
        assert "SIGSEGV" in crashed.error_msg or "SIGBUS" in crashed.error_msg
        not_built = runner.run(str(unbuildable), "matmul")
        assert not_built.error_no == MeasureErrorNo.COMPILE_DEVICE and "expected expression" in not_built.error_msg
        after = runner.run_many([(good.lib_path, "matmul")])  # a fresh worker took over
        assert after[0].error_no == MeasureErrorNo.NO_ERROR


# ---- Oclgrind ------------------------------------------------------------------------------


@needs_oclgrind
def test_oclgrind_passes_the_clean_matmul_and_finds_the_missing_barrier():
    a, b = matmul_inputs(16, seed=2)
    assert race_check(matmul_cl(16, 8), [a, b]) == ""
    log = race_check(matmul_cl(16, 8, second_barrier=False), [a, b])
    assert "data race" in log
    assert "As[ty][tx]" in log  # the source line of the racing store
    out_of_bounds = race_check(matmul_cl(16, 8, body="C[row * N + col + 1] = acc;"), [a, b])
    assert "Invalid write" in out_of_bounds


# ---- CUDA: compile-checks with nvcc ------------------------------------------------------------


def matmul_cu(n: int = 64, tile: int = 16, body: str = "C[row * N + col] = acc;") -> str:
    launch = KernelLaunch("matmul", (n // tile, n // tile, 1), (tile, tile, 1), ("A", "B", "C"))
    return launch_header("cuda", [launch], matmul_buffers(n)) + f"""\
#define N {n}
#define TILE {tile}
extern "C" __global__ void matmul(const float* __restrict__ A, const float* __restrict__ B,
                                  float* __restrict__ C) {{
  __shared__ float As[TILE][TILE];
  __shared__ float Bs[TILE][TILE];
  int tx = threadIdx.x, ty = threadIdx.y;
  int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < N; k0 += TILE) {{
    As[ty][tx] = A[row * N + k0 + tx];
    Bs[ty][tx] = B[(k0 + ty) * N + col];
    __syncthreads();
    for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }}
  {body}
}}
"""


SPILLING_CU = launch_header(
    "cuda", [KernelLaunch("acc64", (1, 1, 1), (256, 1, 1), ("A", "C"))],
    [GPUBuffer("A", (65536,), "float32", "input"), GPUBuffer("C", (16384,), "float32", "output")],
) + """\
extern "C" __global__ void acc64(const float* __restrict__ A, float* __restrict__ C) {
  float acc[64];
  #pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  for (int k = 0; k < 256; ++k) {
    float a = A[k * blockDim.x + threadIdx.x];
    #pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] += a * A[i * 256 + k];
  }
  #pragma unroll
  for (int i = 0; i < 64; ++i) C[i * blockDim.x + threadIdx.x] = acc[i];
}
"""


@needs_nvcc
def test_nvcc_builds_a_matmul_and_reports_its_resources(cache_dir):
    builder = CudaBuilder(arch="sm_90", cache_dir=cache_dir)
    result = builder.compile_one(matmul_cu())
    assert result.error_no == MeasureErrorNo.NO_ERROR, result.error_msg
    assert result.lib_path.endswith(".cubin")
    usage = result.resources["matmul"]
    assert usage["registers"] > 0
    assert usage["shared_bytes"] == 2 * 16 * 16 * 4
    assert usage["barriers"] == 1 and usage["spill_stores"] == 0
    again = builder.compile_one(matmul_cu())
    assert again.lib_path == result.lib_path and again.resources == result.resources


@needs_nvcc
def test_nvcc_errors_and_spills_are_build_errors(cache_dir):
    builder = CudaBuilder(arch="90", cache_dir=cache_dir, flags=("-maxrregcount=32",))
    syntax, missing, spilling = builder.build([
        matmul_cu(body="C[row * N + col] = ;"),
        matmul_cu().replace("void matmul(", "void other("),
        SPILLING_CU,
    ])
    assert syntax.error_no == MeasureErrorNo.COMPILE_HOST and syntax.lib_path is None
    assert "error: expected an expression" in syntax.error_msg
    assert missing.error_no == MeasureErrorNo.COMPILE_HOST and "lacks: matmul" in missing.error_msg
    assert spilling.error_no == MeasureErrorNo.COMPILE_HOST and spilling.lib_path is None
    assert "register spill in acc64" in spilling.error_msg
    assert spilling.resources["acc64"]["spill_stores"] > 0


def test_ptxas_report_parsing():
    report = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'mm' for 'sm_90'
ptxas info    : Function properties for mm
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 3072 bytes smem, 400 bytes cmem[0]
"""
    assert parse_ptxas_resources(report) == {"mm": {
        "registers": 96, "barriers": 1, "shared_bytes": 3072, "constant_bytes": 400,
        "stack_bytes": 8, "spill_stores": 4, "spill_loads": 12}}


def test_cuda_kernel_without_a_device_says_so(tmp_path):
    try:
        import cupy
        has_device = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, or no driver
        has_device = False
    if has_device:
        pytest.skip("a CUDA device is present")
    with pytest.raises(NoCudaDeviceError, match="no CUDA device"):
        CudaKernel(tmp_path / "missing.cubin", "matmul")
