"""Hopper's GEMM template (wgmma): which stages and targets it takes, the knobs it refuses by
name, the search reaching it, nvcc building its programs for sm_90a without spills, and the
printed text computing the product: it runs on the CPU through tests/cuda_emulation.h, whose
wgmma reads operands through the descriptors as the PTX ISA's swizzled layouts say, and is
compared with numpy. Speed and the hardware's agreement are measured on a GPU only
(benchmarks/gpu_wgmma.py, BENCHMARKS.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace

import pytest

import ansor
from ansor.backend import generate_source
from ansor.lower.gemm_template import GemmKnobs, gemm_template_stage, program_of
from ansor.measure.gpu_module import GPUModule
from ansor.schedule.state import ScheduleError
from ansor.search.annotate_gpu import gpu_hardware
from ansor.search.sketch_gemm import is_gemm_sketch, template_program
from ansor.search.sketch_policy import SketchPolicy, sketch_index, sketch_structure
from ansor.te.matrix_instructions import WGMMA_BF16, WGMMA_F16, WMMA_F16, match_gemm
from cuda_emulation import emulator_available
from test_gemm_template import assert_emulated_programs_match_numpy, gemm, template_programs

SM90 = ansor.Target.cuda(arch="sm_90")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
needs_gxx = pytest.mark.skipif(not emulator_available(), reason="g++ is not installed")


def test_wgmma_takes_16_bit_matmuls_of_64_multiples_on_compute_capability_9_alone():
    for dtype, instruction in (("float16", WGMMA_F16), ("bfloat16", WGMMA_BF16)):
        for transposed in (False, True):
            match = match_gemm(gemm(128, 192, 64, dtype, transposed)[2].op, arch=90)
            assert match.instruction is instruction and match.b_transposed is transposed
    assert match_gemm(gemm(128, 192, 64, "float16")[2].op, arch=80).instruction is WMMA_F16
    assert match_gemm(gemm(128, 192, 64, "float16")[2].op, arch=100).instruction is WMMA_F16  # no wgmma past Hopper
    assert match_gemm(gemm(128, 96, 64, "float16")[2].op, arch=90).instruction is WMMA_F16   # 96 columns
    assert match_gemm(gemm(128, 64, 64, "float32")[2].op, arch=90).instruction.kind == "fma"


def test_knobs_wgmma_cannot_compute_are_refused_by_name_and_wmma_pragmas_read_as_before():
    task = ansor.Task(list(gemm(256, 256, 128, "float16")), target=SM90)
    good = GemmKnobs(2, 1, 64, 128, 64, 4, 0, 8, 0, 0, 1, 1, 8)
    assert good.pragma_text() == "gemm_template$s4.p0.v8.u0.x0.h1.w1.g8"
    assert GemmKnobs(2, 2, 32, 32, 32).pragma_text() == "gemm_template$s2.p0.v1.u0.x0"  # no wgmma knobs
    program_of(template_program(task, good), 2)
    for bad, why in ((replace(good, tile_n=96), "one of"), (replace(good, block_k=32), "block_k must be 64"),
                     (replace(good, tile_m=128, tile_n=256), "float registers"),
                     (replace(good, stages=2, in_flight=1), "a tile to fetch ahead"),
                     (replace(good, pad=8), "swizzled, not padded")):
        state = template_program(task, bad)
        with pytest.raises(ScheduleError, match=why):
            program_of(state, gemm_template_stage(state))
    over = template_program(ansor.Task(list(gemm(512, 512, 128, "float16")), target=SM90),
                        replace(good, warps_m=2, tile_m=128, warps_n=2, tile_n=128, stages=4))
    with pytest.raises(ScheduleError, match="shared memory"):
        program_of(over, gemm_template_stage(over))
    wmma = template_program(task, GemmKnobs(2, 2, 32, 32, 32, 2, 8, 8))  # a record of the wmma template
    assert program_of(wmma, gemm_template_stage(wmma)).instruction is WMMA_F16


def test_the_search_reaches_the_template_and_knows_its_sketch():
    task = ansor.Task(list(gemm(512, 512, 256, "bfloat16", True)), target=SM90)
    policy = SketchPolicy(task, seed=0)
    programs = template_programs(task, 4)
    assert len(programs) == 4
    prefixes = [sketch_structure(s.steps) for s in policy.sketches]
    template = next(i for i, s in enumerate(policy.sketches) if is_gemm_sketch(s.steps))
    # knobs in the pragma do not hide a program's sketch: the first round measures its best
    assert all(sketch_index(p, prefixes) == template for p in programs)
    assert all(program_of(p, gemm_template_stage(p)).is_wgmma for p in programs)
    assert gpu_hardware(SM90).registers_per_block == 65536 and gpu_hardware(SM90).arch == 90


@needs_nvcc
def test_sampled_wgmma_programs_build_for_sm90a_without_spills_and_ask_for_their_shared_memory(tmp_path):
    shapes = [(1024, 1024, 512, "float16", False), (512, 768, 256, "bfloat16", True)]
    for n, (m, n_, k, dtype, transposed) in enumerate(shapes):
        task = ansor.Task(list(gemm(m, n_, k, dtype, transposed)), target=SM90)
        for p, program in enumerate(template_programs(task, 4, seed=n)):
            source, _ = generate_source(program, task.target)
            assert "wgmma.mma_async.sync.aligned" in source and "#include <mma.h>" not in source
            (launch,) = GPUModule.parse(source).kernels
            expected = program_of(program, gemm_template_stage(program)).dynamic_shared_bytes
            assert launch.shared_bytes == expected > 0
            path = tmp_path / f"w{n}_{p}.cu"
            path.write_text(source)
            done = subprocess.run(["nvcc", "-cubin", "-arch=sm_90a", "-Xptxas", "-v", "-o", f"{path}.cubin",
                                   str(path)], capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr
            spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", done.stderr)]
            assert spills and not any(spills), done.stderr
            assert "warning" not in done.stderr.lower(), done.stderr  # e.g. wgmma serialized by ptxas


def test_a_launch_plan_carries_dynamic_shared_memory():
    header = ('// ansor-launch: {"language":"cuda","kernels":[{"name":"k","grid":[4,1,1],"block":[256,1,1],'
              '"args":["A"],"shared":%s}],"buffers":[{"name":"A","shape":[4],"dtype":"float32","role":"input"}]}\n')
    assert GPUModule.parse(header % "99328").kernels[0].shared_bytes == 99328
    assert GPUModule.parse(header % "99328").kernels[0].to_json()["shared"] == 99328
    with pytest.raises(ValueError, match="shared must be a non-negative integer"):
        GPUModule.parse(header % "-1")


@needs_gxx
@pytest.mark.parametrize("dtype,transposed,seed", [("float16", False, 0), ("bfloat16", True, 1),
                                                   ("float16", True, 2), ("bfloat16", False, 3)])
def test_wgmma_programs_match_numpy_when_their_cuda_text_runs_emulated(dtype, transposed, seed, tmp_path):
    task = ansor.Task(list(gemm(128, 256, 192, dtype, transposed)), target=SM90)
    chosen = template_program(task, GemmKnobs(2, 1, 64, 256, 64, 4, 0, 8, 0, 0, 1, 1, 8))  # two warpgroups, B in 4 atoms
    assert_emulated_programs_match_numpy(task, [*template_programs(task, 2, seed=seed), chosen], seed, tmp_path)
