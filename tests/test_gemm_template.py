"""The GPU GEMM template: matrix instructions described as te computations and matched to
stages, Tensor Core (WMMA) and FMA programs found by the sketch search, compiled by nvcc for
sm_80 and sm_90 without spills, and computed right: the printed CUDA runs on the CPU through
an emulation of CUDA's threads, barriers, shared memory and WMMA fragments
(tests/cuda_emulation.h) and is compared with numpy. Speed is measured on a GPU only
(benchmarks/gpu_tensorcore.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.backend import generate_source
from ansor.costmodel.features import program_features
from ansor.lower.gemm_template import GemmKnobs, gemm_template_stage, parse_knob_text, program_of
from ansor.schedule.state import ScheduleError
from ansor.search.sketch_policy import SketchPolicy
from ansor.te.matrix_instructions import FMA_F32, WMMA_BF16, WMMA_F16, match_gemm
from cuda_emulation import emulator_available, run_emulated

SM80 = ansor.Target.cuda(arch="sm_80")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
needs_gxx = pytest.mark.skipif(not emulator_available(), reason="g++ is not installed")


def gemm(m: int, n: int, k: int, dtype: str, b_transposed: bool = False):
    A = te.placeholder((m, k), dtype, name="A")
    B = te.placeholder((n, k) if b_transposed else (k, n), dtype, name="B")
    r = te.reduce_axis(k, name="k")
    read_b = (lambda j: B[j, r]) if b_transposed else (lambda j: B[r, j])
    acc = {} if dtype == "float32" else {"dtype": "float32"}
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * read_b(j), axis=r, **acc), name="C")
    return A, B, C


def template_programs(task: ansor.Task, n: int, seed: int = 0) -> list[ansor.State]:
    """Up to `n` distinct sampled programs of the GEMM template sketch."""
    found: dict[str, ansor.State] = {}
    policy = SketchPolicy(task, seed=seed)
    for _ in range(6):
        for p in policy.sample(4 * n):
            if gemm_template_stage(p) is not None:
                found.setdefault(p.key(), p)
        if len(found) >= n:
            break
    return list(found.values())[:n]


# --- matching ---------------------------------------------------------------------------------

def test_instructions_match_the_stages_whose_body_has_their_form():
    for dtype, instruction in (("float16", WMMA_F16), ("bfloat16", WMMA_BF16), ("float32", FMA_F32)):
        for transposed in (False, True):
            match = match_gemm(gemm(64, 32, 48, dtype, transposed)[2].op, arch=80)
            assert match is not None and match.instruction is instruction
            assert (match.m, match.n, match.k, match.b_transposed) == (64, 32, 48, transposed)
    assert match_gemm(gemm(64, 32, 48, "bfloat16")[2].op, arch=75) is None  # bf16 Tensor Cores: sm_80 on
    assert match_gemm(gemm(64, 32, 40, "float16")[2].op, arch=80) is None   # k not a multiple of 16
    A, B, _ = gemm(64, 32, 48, "float16")
    r = te.reduce_axis(48, name="r")
    summed_in_half = te.compute((64, 32), lambda i, j: te.sum(te.cast(A[i, r] * B[r, j], "float32"), axis=r))
    assert match_gemm(summed_in_half.op, arch=80) is None  # products rounded to half first: another form
    squared = te.compute((64, 48), lambda i, j: te.sum(A[i, r] * A[i, r], axis=r, dtype="float32"))
    assert match_gemm(squared.op, arch=80) is None


def test_the_template_sketch_is_offered_for_cuda_matmuls_alone():
    A, B, C = gemm(128, 128, 64, "float16")
    sketches = SketchPolicy(ansor.Task([A, B, C], target=SM80), seed=0).sketches
    assert any("gemm template (wmma_m16n16k16_f16_f32)" in " ".join(s.history) for s in sketches)
    assert len(sketches) > 1  # the usual sketches stay beside it
    A, B, C = gemm(128, 128, 64, "float32")
    opencl = SketchPolicy(ansor.Task([A, B, C], target=ansor.Target.opencl()), seed=0).sketches
    assert not any("gemm template" in " ".join(s.history) for s in opencl)
    D = te.compute((128, 128), lambda i, j: C[i, j] + 1.0, name="D")  # a consumer: not the template's task
    with_bias = SketchPolicy(ansor.Task([A, B, D], target=SM80), seed=0).sketches
    assert not any("gemm template" in " ".join(s.history) for s in with_bias)


def test_knobs_that_the_instruction_cannot_compute_are_refused_by_name():
    A, B, C = gemm(128, 128, 64, "float16")
    task = ansor.Task([A, B, C], target=SM80)
    (program,) = template_programs(task, 1)
    steps = list(program.steps)
    with pytest.raises(ScheduleError, match="unknown knob"):
        parse_knob_text("s2.q3")
    sid = gemm_template_stage(program)
    from dataclasses import replace
    from ansor.schedule.steps import SplitStep
    first = next(i for i, s in enumerate(steps) if isinstance(s, SplitStep))
    steps[first] = replace(steps[first], lengths=(2, 8))  # 8 rows a warp: not a 16-row fragment
    bad = ansor.State.replay(task.dag, steps)
    with pytest.raises(ScheduleError, match="multiples of 16x16x16"):
        program_of(bad, sid)
    assert GemmKnobs(2, 2, 32, 32, 32).pragma_text() == "gemm_template$s2.p0.v1.u0.x0"


def test_template_programs_have_features_of_their_tiles():
    A, B, C = gemm(256, 256, 128, "float16")
    task = ansor.Task([A, B, C], target=SM80)
    rows = [program_features(p, target=SM80) for p in template_programs(task, 3)]
    assert all(r.shape[0] > 0 for r in rows)
    assert len({r.tobytes() for r in rows}) == 3  # different knobs, different descriptions


# --- nvcc without a GPU -------------------------------------------------------------------------

def _nvcc(path, arch: str) -> tuple[int, str]:
    done = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-o", f"{path}.{arch}.cubin",
                           str(path)], capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr


@needs_nvcc
def test_every_sampled_tensor_core_program_compiles_for_sm80_and_sm90_without_spills(tmp_path):
    shapes = [(512, 512, 256, "float16", False), (256, 384, 128, "bfloat16", True), (1024, 256, 64, "float16", True)]
    jobs = []
    for n, (m, n_, k, dtype, transposed) in enumerate(shapes):
        task = ansor.Task(list(gemm(m, n_, k, dtype, transposed)), target=SM80)
        programs = template_programs(task, 6, seed=n)
        assert len(programs) >= 4
        for p, program in enumerate(programs):
            source, _ = generate_source(program, task.target)
            assert "nvcuda::wmma::mma_sync" in source and "#include <mma.h>" in source
            path = tmp_path / f"s{n}_{p}.cu"
            path.write_text(source)
            jobs += [(path, arch) for arch in ("sm_80", "sm_90")]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda job: (job, *_nvcc(*job)), jobs))
    for (path, arch), code, report in results:
        assert code == 0, f"{path} ({arch}):\n{report}"
        spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
        assert spills and not any(spills), f"{path} ({arch}) spilled:\n{report}"


@needs_nvcc
def test_sampled_sgemm_programs_compile_with_128_bit_loads_and_double_buffers(tmp_path):
    task = ansor.Task(list(gemm(1024, 1024, 512, "float32")), target=ansor.Target.cuda(arch="sm_90"))
    programs = template_programs(task, 6)
    knobs = [program_of(p, gemm_template_stage(p)).knobs for p in programs]
    assert any(k.vector == 4 for k in knobs) and any(k.stages == 2 for k in knobs)
    for p, program in enumerate(programs):
        source, _ = generate_source(program, task.target)
        if knobs[p].vector == 4:
            assert "*(const float4*)&A[" in source
        path = tmp_path / f"sgemm{p}.cu"
        path.write_text(source)
        code, report = _nvcc(path, "sm_90")
        assert code == 0, report
        assert not any(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)), report


# --- the printed text computes the product -------------------------------------------------------

def assert_emulated_programs_match_numpy(task: ansor.Task, programs: list[ansor.State], seed: int, tmp_path) -> None:
    """Each program's CUDA text, run on the CPU (cuda_emulation.h) on random inputs, equals
    numpy's product of the task's two operands."""
    A, B = task.inputs
    transposed = match_gemm(task.outputs[0].op, arch=80).b_transposed
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(A.shape).astype(np.float32).astype(A.dtype)
    b = rng.standard_normal(B.shape).astype(np.float32).astype(B.dtype)
    b32 = b.astype(np.float32)
    expected = a.astype(np.float32) @ (b32.T if transposed else b32)
    assert programs
    for n, program in enumerate(programs):
        source, _ = generate_source(program, task.target)
        folder = tmp_path / str(n)
        folder.mkdir()
        (out,) = run_emulated(source, [a, b], folder)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4,
                                   err_msg=str(program_of(program, gemm_template_stage(program))))


@needs_gxx
@pytest.mark.parametrize("dtype,transposed,seed", [("float16", False, 0), ("bfloat16", True, 1),
                                                   ("float32", False, 2), ("float32", True, 3)])
def test_template_programs_match_numpy_when_their_cuda_text_runs_emulated(dtype, transposed, seed, tmp_path):
    task = ansor.Task(list(gemm(128, 64, 64, dtype, transposed)), target=SM80)
    assert_emulated_programs_match_numpy(task, template_programs(task, 2, seed=seed), seed, tmp_path)
