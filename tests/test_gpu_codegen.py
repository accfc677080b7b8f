"""GPU programs without a GPU: lowering (kernels, shared memory, barriers, limits), the CUDA and
OpenCL printers, the GPU sketch rules and annotation. OpenCL programs run on PoCL (the CPU)
and are compared with numpy; the CPU backend runs the same schedules as a second oracle; CUDA
sources are compiled by nvcc where it is installed."""

from __future__ import annotations

import random
import re
import shutil
import subprocess

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.backend import backend_for, generate_source, lower_for
from ansor.costmodel.features import program_features
from ansor.lower import ir
from ansor.te import expr as E
from ansor.lower.gpu import GPUScheduleError, kernels_of
from ansor.search.annotate_gpu import GPUHardware, annotate_gpu
from ansor.search.params import SearchParams
from ansor.search.sketch_policy import SketchPolicy
from helpers import OPERATORS, assert_close, random_inputs, run_state

OPENCL = ansor.Target.opencl()


def _pocl_problem() -> str | None:
    try:
        from ansor.measure.opencl import platform_problem
        return platform_problem("Portable Computing Language")
    except Exception as exc:  # noqa: BLE001 - pyopencl missing or no ICD: the tests that run skip
        return f"pyopencl is not usable ({exc}): pip install 'ansor[opencl]'"


def _pocl_available() -> bool:
    return _pocl_problem() is None


needs_pocl = pytest.mark.skipif(not _pocl_available(), reason=str(_pocl_problem()))


def run_opencl(source: str, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> list[np.ndarray]:
    from ansor.measure.opencl import OpenCLKernel
    with OpenCLKernel(source) as kernel:
        kernel(*inputs, *outputs)
    return outputs


def gpu_matmul(n: int = 64, m: int = 64, k: int = 64, lengths=(2, 2, 4), k_tile: int = 8,
               target: ansor.Target = OPENCL) -> tuple[ansor.Task, ansor.State]:
    """A hand-written GPU schedule of a matmul in the shape the sketch rules make: a local
    accumulator per thread, A and B tiles in shared memory filled cooperatively."""
    A = te.placeholder((n, k), name="A")
    B = te.placeholder((k, m), name="B")
    task = ansor.Task([A, B, te.ops.matmul(A, B)], target=target)
    s = ansor.State(task.dag)
    local = s.stages[s.cache_write("matmul", "local")].name
    a_sh = s.stages[s.cache_read("A", "shared", [local])].name
    b_sh = s.stages[s.cache_read("B", "shared", [local])].name
    i = s.split("matmul", "i", list(lengths))
    j = s.split("matmul", "j", list(lengths))
    s.reorder("matmul", [p for pair in zip(i, j) for p in pair])
    for level, kind in enumerate(("blockIdx.x", "vthread", "threadIdx.x")):
        s.annotate("matmul", s.fuse("matmul", [i[level], j[level]]), kind)
    s.compute_at(local, "matmul", s.stages[s.stage_id("matmul")].iters[2].name)
    ko, ki = [x.name for x in s.split(local, "k", [k_tile])]
    s.reorder(local, [ko, ki, "i", "j"])
    threads = lengths[1] * lengths[1]
    for copy in (a_sh, b_sh):
        s.compute_at(copy, local, ko)
        fused = s.fuse(copy, [it.name for it in s.stage(copy).iters])
        _, inner = s.split(copy, fused, [threads])
        s.annotate(copy, inner, "threadIdx.x")
    return task, s


def test_gpu_targets_name_their_device_and_limits():
    cuda = ansor.Target.cuda("sm_80")
    assert cuda.key == "cuda-sm_80" and cuda.is_gpu and cuda.warp_size == 32
    assert ansor.Target.opencl().key == "opencl-pocl-cpu"
    assert ansor.Target.opencl("NVIDIA H100").key == "opencl-nvidia-h100"
    assert not ansor.Target.host().is_gpu
    with pytest.raises(ValueError, match="sm_90"):
        ansor.Target.cuda("hopper")


def test_a_matmul_lowers_to_one_kernel_with_block_tiles_in_shared_memory():
    task, s = gpu_matmul()
    func = lower_for(s, task.target)
    (kernel,) = kernels_of(func)
    assert kernel.grid == (16, 1, 1) and kernel.block == (4, 1, 1)
    shared = [x.buffer for x in ir.walk_stmts(kernel.body) if isinstance(x, ir.Allocate) and x.buffer.scope == "shared"]
    # the block's 16 rows (2 virtual threads x 2 threads x 4 values) by the 8-long reduction tile
    assert sorted(b.shape for b in shared) == [(8, 16), (16, 8)]
    assert isinstance(kernel.body, ir.Allocate) and kernel.body.buffer.scope == "shared"  # at the top
    barriers = [x for x in ir.walk_stmts(kernel.body) if isinstance(x, ir.Barrier)]
    assert len(barriers) == 2  # before the fills (the last step's readers) and after them


def test_printed_sources_carry_their_launch_and_show_the_tiles():
    task, s = gpu_matmul()
    cl_source, entry = generate_source(s, task.target)
    from ansor.measure.gpu_module import GPUModule, KernelLaunch
    module = GPUModule.parse(cl_source)
    assert module.language == "opencl"
    assert module.kernels == (KernelLaunch(entry, (16, 1, 1), (4, 1, 1), ("A", "B", "matmul")),)
    assert [b.role for b in module.buffers] == ["input", "input", "output"]
    assert "__local float A_shared[128] __attribute__((aligned(16)));" in cl_source and "barrier(CLK_LOCAL_MEM_FENCE);" in cl_source
    assert "reqd_work_group_size(4, 1, 1)" in cl_source and "get_local_id(0)" in cl_source
    cuda_task, cuda_state = gpu_matmul(target=ansor.Target.cuda())
    cu_source, _ = generate_source(cuda_state, cuda_task.target)
    assert "__shared__ __align__(16) float A_shared[128];" in cu_source and "__syncthreads();" in cu_source
    assert '__launch_bounds__(4, 1)' in cu_source and "threadIdx.x" in cu_source


@needs_pocl
@pytest.mark.parametrize("shape", [(64, 64, 64), (60, 52, 36)])
def test_a_hand_written_gpu_matmul_matches_numpy_on_pocl(shape):
    n, m, k = shape
    task, s = gpu_matmul(n, m, k, lengths=(2, 4, 2), k_tile=6)  # 60 = 8*7 + 4: partial tiles
    a, b = random_inputs(task)
    (out,) = run_opencl(generate_source(s, task.target)[0], [a, b], [np.zeros((n, m), np.float32)])
    assert_close(out, a.astype(np.float64) @ b)


def test_the_cpu_backend_runs_a_gpu_schedule_as_a_second_oracle(builder):
    """Loops bound to threads run serially on the CPU; a shared tile covers the block there too."""
    task, s = gpu_matmul(24, 20, 12, lengths=(1, 2, 3), k_tile=4)
    cpu_task = ansor.Task(task.dag.io_tensors, target=ansor.Target.host())
    a, b = random_inputs(cpu_task)
    assert_close(run_state(cpu_task, s, builder, [a, b]), a.astype(np.float64) @ b)


def test_a_check_on_the_thread_index_never_wraps_a_barrier():
    """With 60 rows in tiles of 8, threads past the edge skip their stores, yet still fill
    shared memory and reach every barrier."""
    task, s = gpu_matmul(60, 64, 32, lengths=(2, 4, 1), k_tile=8)
    (kernel,) = kernels_of(lower_for(s, task.target))

    def check(stmt, guarded):
        if isinstance(stmt, ir.Barrier):
            assert not guarded, "a barrier under a thread-dependent check"
        if isinstance(stmt, ir.IfThenElse):
            guarded = guarded or any(v.name.startswith("i.") for v in te.expr.free_vars(stmt.cond))
        for child in ([stmt.body] if hasattr(stmt, "body") else []) + (list(stmt.stmts) if isinstance(stmt, ir.Seq) else []) \
                + ([stmt.then] if isinstance(stmt, ir.IfThenElse) else []):
            check(child, guarded)

    check(kernel.body, False)


def test_the_verifier_rejects_what_the_target_cannot_run():
    task, s = gpu_matmul(lengths=(2, 16, 1))  # 256 threads
    small = ansor.Target.opencl(max_threads=128)
    with pytest.raises(GPUScheduleError, match="256 threads per block, over the target's 128"):
        lower_for(s, small)
    assert program_features(s, target=small).shape[0] == 0  # no features: ranked last
    assert program_features(s, target=OPENCL).shape[0] > 0
    tiny_shared = ansor.Target.opencl(shared_memory=256)
    with pytest.raises(GPUScheduleError, match="shared memory"):
        lower_for(gpu_matmul()[1], tiny_shared)
    A = te.placeholder((8, 8), name="A")
    plain = ansor.Task([A, te.ops.relu(A)], target=OPENCL)
    with pytest.raises(GPUScheduleError, match="must be bound to blockIdx"):
        lower_for(ansor.State(plain.dag), OPENCL)


def test_gpu_sketches_copy_tiled_inputs_to_shared_memory():
    task = ansor.Task(OPERATORS["matmul"].make(), target=OPENCL)
    (sketch,) = SketchPolicy(task, seed=0).sketches
    assert sketch.history == ["add_cache_write(matmul)", "multi_level_tiling_with_fusion(matmul.local, fused at level 3)",
                              "add_cache_read_shared(B)", "add_cache_read_shared(A)"]


def test_gpu_annotation_keeps_blocks_within_the_limits():
    task = ansor.Task(OPERATORS["matmul"].make(), target=OPENCL)
    policy = SketchPolicy(task, seed=0)
    hw = GPUHardware(max_threads=64, max_vthread=2, warp_size=8, max_thread_tile=16)
    rng = random.Random(0)
    made = [annotate_gpu(policy.sketches[0].steps, task.dag, rng, SearchParams(), hw) for _ in range(30)]
    made = [p for p in made if p is not None]
    assert len(made) >= 20
    for program in made:
        (kernel,) = kernels_of(lower_for(program, ansor.Target.opencl(max_threads=64)))
        assert 8 <= kernel.threads <= 64


GPU_CASES = ["matmul", "matmul_bias_relu", "batch_matmul", "conv2d_s2", "depthwise_conv2d", "softmax",
             "layer_norm", "norm2", "max_pool2d", "elementwise_chain"]


@needs_pocl
@pytest.mark.parametrize("name", GPU_CASES)
def test_sampled_gpu_programs_match_numpy_on_pocl(name):
    op = OPERATORS[name]
    task = ansor.Task(op.make(), target=OPENCL)
    programs = SketchPolicy(task, seed=3).sample(3)
    assert programs
    inputs = random_inputs(task)
    expected = op.reference(*[x.astype(np.float64) for x in inputs])
    for program in programs:
        source, _ = generate_source(program, task.target)
        (out,) = run_opencl(source, inputs, [np.zeros(task.outputs[0].shape, np.float32)])
        assert_close(out, expected, f"{name}\n{program}")


def test_sampled_gpu_programs_have_gpu_features():
    task = ansor.Task(OPERATORS["conv2d_s1"].make(), target=OPENCL)
    program = SketchPolicy(task, seed=1).sample(1)[0]
    from ansor.costmodel.features import FEATURE_NAMES
    rows = program_features(program, target=OPENCL)
    assert rows.shape[0] > 0 and rows[0][FEATURE_NAMES.index("is_gpu")] == 1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_generated_cuda_compiles_with_nvcc(tmp_path):
    task = ansor.Task(OPERATORS["conv2d_s1"].make(), target=ansor.Target.cuda())
    sources = [generate_source(p, task.target)[0] for p in SketchPolicy(task, seed=4).sample(2)]
    sources.append(generate_source(gpu_matmul(target=ansor.Target.cuda())[1], ansor.Target.cuda())[0])
    for n, source in enumerate(sources):
        path = tmp_path / f"k{n}.cu"
        path.write_text(source)
        done = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-Xptxas", "-v", "-o", str(tmp_path / f"k{n}.cubin"),
                               str(path)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr + source
        assert "bytes spill" not in done.stderr or "0 bytes spill stores" in done.stderr


@needs_pocl
def test_a_long_cooperative_fetch_is_unrolled_eight_steps_at_a_time():
    """nvcc unrolls a long fetch loop whole and hoists every step's address and padding tests:
    a 28-70 step fetch alone took 255 registers and spilled. The printer caps such loops; the
    compute loops and short fetches stay as the schedule says."""
    from ansor.codegen.gpu import FETCH_UNROLL, LONG_FETCH
    task, state = gpu_matmul(lengths=(2, 2, 4), k_tile=8, target=OPENCL)  # 4 threads fetch 32 x 4 values
    source, _ = generate_source(state, task.target)
    lines = source.splitlines()
    capped = [lines[n + 1] for n, line in enumerate(lines) if line.strip() == f"#pragma unroll {FETCH_UNROLL}"]
    assert len(capped) == 2 and all("ax0_ax1" in line and "< 32;" in line for line in capped), source
    short_task, short_state = gpu_matmul(lengths=(2, 4, 2), k_tile=8, target=OPENCL)  # 16 threads: 8 steps
    short_source, _ = generate_source(short_state, short_task.target)
    assert f"#pragma unroll {FETCH_UNROLL}" not in short_source and LONG_FETCH >= 8
    inputs = random_inputs(task)
    (out,) = run_opencl(source, inputs, [np.zeros((64, 64), np.float32)])
    assert_close(out, inputs[0].astype(np.float64) @ inputs[1], source)


def _loops_and_pragmas(source: str) -> dict[str, str]:
    """Each loop variable of a printed kernel -> the unroll pragma above its loop ('' if none)."""
    lines = source.splitlines()
    loops = {}
    for n, line in enumerate(lines):
        m = re.match(r"\s*for \(int (\w+) = 0;", line)
        if m:
            above = lines[n - 1].strip()
            loops[m.group(1)] = above if above.startswith("#pragma unroll") else ""
    return loops


def test_loops_that_index_registers_are_unrolled_and_unroll_nests_count_the_copies_around_them():
    """A loop indexing a thread's accumulator is always unrolled (else the accumulator lives in
    local memory); a nest that the schedule's auto-unroll pragma unrolls is counted with the
    copies that the unrolled register loops around it make, and kept rolled past
    MAX_UNROLLED_STATEMENTS; inside such copies a loop the schedule left rolled stays rolled
    (such nests took 255 registers and spilled)."""
    from ansor.codegen.gpu import MAX_UNROLLED_STATEMENTS

    def printed(k_tile: int, register_loop_outside: bool, max_step: int = 0) -> tuple[str, ansor.Task]:
        task, s = gpu_matmul(n=64, m=64, k=256, lengths=(2, 2, 4), k_tile=k_tile, target=OPENCL)
        local = next(st.name for st in s.stages if st.name.endswith("local"))
        ko, ki, i, j = [it.name for it in s.stage(local).iters[:4]]
        if register_loop_outside:
            s.reorder(local, [ko, i, ki, j])
        if max_step:
            s.pragma(local, ko, f"auto_unroll_max_step${max_step}")
        return generate_source(s, task.target)[0], task

    plain, _ = printed(64, register_loop_outside=False)
    loops = _loops_and_pragmas(plain)
    registers = {v for v in loops if re.search(rf"matmul_local\[[^\]]*\b{v}\b", plain)}
    assert registers and all(loops[v] == "#pragma unroll" for v in registers), plain
    assert loops["k_1"] == ""  # the schedule asked for no unrolling: nvcc decides
    assert _loops_and_pragmas(printed(64, True)[0])["k_1"] == "#pragma unroll 1"  # inside 4 copies
    # the k_1 nest (k_1, j and the 4 virtual threads) is 16 x 16 statements, in 4 copies of
    # the register loop i, or 64 x 16
    assert 4 * 16 * 16 <= MAX_UNROLLED_STATEMENTS < 4 * 64 * 16
    assert _loops_and_pragmas(printed(16, True, max_step=1024)[0])["k_1"] == "#pragma unroll"
    capped, task = printed(64, True, max_step=1024)
    assert _loops_and_pragmas(capped)["k_1"] == "#pragma unroll 1", capped
    assert _loops_and_pragmas(capped)["j_3"] == "#pragma unroll"
    if _pocl_available():
        inputs = random_inputs(task)
        (out,) = run_opencl(capped, inputs, [np.zeros((64, 64), np.float32)])
        assert_close(out, inputs[0].astype(np.float64) @ inputs[1], capped)


# a conv2d_transpose program drawn for the suite (seed 1) whose 512-statement unrolled nest took
# all 255 registers and spilled 84 bytes under nvcc 13 (sm_90)
_SPILLING_TRANSPOSE = [
    ["CHW", 3, "local"], ["SP", 3, 0, 1, [1, 1, 1, 1], True], ["SP", 3, 5, 4, [1, 4, 1, 1], True],
    ["SP", 3, 10, 2, [1, 2, 1, 1], True], ["SP", 3, 15, 4, [1, 1, 1, 1], True],
    ["SP", 3, 20, 2, [1, 1, 1, 2], True], ["SP", 3, 25, 256, [8, 4, 1, 1], True],
    ["SP", 3, 30, 512, [2, 4], True], ["SP", 3, 33, 2, [1, 2], True], ["SP", 3, 36, 2, [2, 1], True],
    ["RE", 3, [0, 5, 10, 15, 20, 25, 1, 6, 11, 16, 21, 26, 2, 7, 12, 17, 22, 27, 30, 33, 36, 31, 34, 37,
               3, 8, 13, 18, 23, 28, 32, 35, 38, 4, 9, 14, 19, 24, 29]],
    ["FSP", 4, 0, 1, 3], ["FSP", 4, 4, 2, 3], ["FSP", 4, 8, 3, 3], ["FSP", 4, 12, 4, 3], ["FSP", 4, 16, 5, 3],
    ["FSP", 4, 20, 6, 3],
    ["RE", 4, [0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23]],
    ["CA", 3, 4, 17], ["CHR", 2, "shared", [3]], ["CA", 3, 4, 20], ["CHR", 1, "shared", [4]], ["CA", 2, 5, 20],
    ["CI", 1], ["FU", 6, [0, 1, 2, 3, 4, 5]], ["AN", 6, 0, "blockIdx.x"], ["FU", 6, [1, 2, 3, 4, 5, 6]],
    ["AN", 6, 1, "vthread"], ["FU", 6, [2, 3, 4, 5, 6, 7]], ["AN", 6, 2, "threadIdx.x"], ["FU", 7, [0, 1, 2, 3]],
    ["SP", 7, 0, 16384, [32], True], ["AN", 7, 0, "blockIdx.x"], ["AN", 7, 1, "threadIdx.x"],
    ["FU", 2, [0, 1, 2, 3]], ["FFSP", 2, 0, [1, 2, 3, 4, 5, 6], 1, True], ["AN", 2, 1, "threadIdx.x"],
    ["FU", 4, [0, 1, 2, 3]], ["FFSP", 4, 0, [1, 2, 3, 4, 5, 6], 1, True], ["AN", 4, 1, "threadIdx.x"],
    ["PR", 5, 0, "auto_unroll_max_step$64"]]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_a_program_that_spills_is_built_from_a_reprint_with_shorter_unrolled_nests(tmp_path):
    """The CUDA backend's build prints a program that spilled again with shorter unrolled nests
    (`refit_printers`): the source kept (what a Kernel carries) compiles with no spill."""
    from ansor.backend import build_programs
    from ansor.measure.cuda import CudaBuilder
    from ansor.schedule.steps import steps_from_json
    from ansor.workloads import make_task

    task = make_task("conv2d_transpose", (1, 512, 4, 4, 256, 4, 4), target=ansor.Target.cuda(), stride=2, padding=1)
    state = ansor.State.replay(task.dag, steps_from_json(_SPILLING_TRANSPOSE))
    builder = CudaBuilder("sm_90", cache_dir=tmp_path)
    first, _ = generate_source(state, task.target)
    (program,) = build_programs([state], task.target, builder=builder)
    assert program.ok, program.message
    assert not any(u["spill_stores"] or u["spill_loads"] for u in program.build.resources.values())
    if builder.compile_one(first).error_no:  # nvcc spilled the first print (nvcc 13 does)
        assert program.source != first and "#pragma unroll 1" in program.source
    else:
        assert program.source == first


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_neighbouring_shared_memory_reads_become_vector_loads(tmp_path):
    """Shared arrays are declared 16-byte aligned, so nvcc can read a thread's 4 neighbouring
    values of a tile in one 128-bit load (without it, every read of the best sgemm found on an
    H200 was a scalar load: 320 per 1024 multiply-adds)."""
    import re
    task, state = gpu_matmul(target=ansor.Target.cuda())
    path = tmp_path / "matmul.cu"
    path.write_text(generate_source(state, task.target)[0])
    done = subprocess.run(["nvcc", "-ptx", "-arch=sm_90", "-o", str(tmp_path / "matmul.ptx"), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ptx = (tmp_path / "matmul.ptx").read_text()
    assert re.search(r"ld\.shared\.v4\.f32", ptx), "no 128-bit shared-memory load"


@needs_pocl
def test_virtual_threads_share_one_fill_and_match_numpy():
    """Four virtual threads are injected: the tile copies into shared memory run once per
    reduction step (not once per virtual thread), the accumulators of all four sub-tiles are
    one private array, and the result is right on PoCL and race-free under Oclgrind."""
    task, state = gpu_matmul(n=32, m=32, k=16, lengths=(2, 2, 2), k_tile=8)  # vthread 2 x 2 = 4
    func = lower_for(state, task.target)
    assert not any(isinstance(s, ir.For) and s.kind == "vthread" for s in ir.walk_stmts(func.body))
    fills = [s for s in ir.walk_stmts(func.body) if isinstance(s, ir.Store) and s.buffer.scope == "shared"]
    assert len(fills) == 2  # A's and B's copies, once each
    local = [s.buffer for s in ir.walk_stmts(func.body) if isinstance(s, ir.Allocate) and s.buffer.scope == "local"]
    assert [b.shape[0] for b in local] == [4]  # one slice per virtual thread
    source, _ = generate_source(state, task.target)
    assert "one after another" not in source
    inputs = random_inputs(task)
    (out,) = run_opencl(source, inputs, [np.zeros((32, 32), np.float32)])
    assert_close(out, inputs[0].astype(np.float64) @ inputs[1], source)
    if _oclgrind_available():
        from ansor.measure.oclgrind import race_check
        assert race_check(source, inputs) == ""


def test_a_virtual_thread_loop_that_is_not_independent_stays_serial():
    """A statement every virtual thread runs alike that is not a pure copy (here an update of
    a global buffer that does not depend on the virtual thread) keeps the loop serial."""
    from ansor.lower.virtual_threads import inject_virtual_threads
    vt, i = E.Var("vt", "int32"), E.Var("i", "int32")
    out = ir.Buffer("out", (4,), "float32", role="output")
    total = ir.Buffer("total", (1,), "float32", role="output")
    body = ir.Seq([
        ir.Store(out, (vt,), E.Const(1.0, "float32")),
        ir.Store(total, (E.Const(0, "int32"),), ir.BufferLoad(total, (E.Const(0, "int32"),)) + E.Const(1.0, "float32")),
    ])
    loop = ir.For(vt, 4, "vthread", body)
    assert inject_virtual_threads(loop).kind == "vthread"
    independent = ir.For(vt, 4, "vthread", ir.For(i, 2, "serial", ir.Store(out, (vt,), E.Const(1.0, "float32"))))
    injected = inject_virtual_threads(independent)
    assert injected.kind == "serial" and injected.body.kind == "unrolled" and injected.body.var is vt


def test_the_printer_writes_the_header_the_runners_read():
    from ansor.codegen.gpu import LAUNCH_PREFIX
    from ansor.measure.gpu_module import HEADER_PREFIX, GPUModule
    assert LAUNCH_PREFIX == HEADER_PREFIX
    task, s = gpu_matmul()
    module = GPUModule.parse(generate_source(s, task.target)[0])
    assert [b.role for b in module.buffers] == ["input", "input", "output"] and len(module.kernels) == 1


def _oclgrind_available() -> bool:
    try:
        from ansor.measure.oclgrind import oclgrind_available
        return oclgrind_available()
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(not _oclgrind_available(), reason="Oclgrind is not installed (pip install 'ansor[opencl]')")
@pytest.mark.parametrize("name", ["matmul", "conv2d_s1", "batch_matmul"])
def test_sampled_gpu_programs_are_free_of_races_under_oclgrind(name):
    """PoCL hides a missing barrier; Oclgrind reports races, barrier divergence and
    out-of-bounds accesses of the generated shared-memory fills."""
    from ansor.measure.oclgrind import race_check
    task = ansor.Task(OPERATORS[name].make(), target=OPENCL)
    inputs = random_inputs(task)
    for program in SketchPolicy(task, seed=5).sample(2):
        assert race_check(generate_source(program, task.target)[0], inputs) == "", str(program)


@needs_pocl
def test_tuning_for_opencl_measures_on_pocl_and_builds_the_best(tmp_path):
    """The whole loop on a GPU target: GPU sketches, the verifier, OpenCL builds, runs checked
    against numpy in the worker, records under the device's key, a kernel built from them."""
    A = te.placeholder((40, 24), name="A")
    B = te.placeholder((24, 36), name="B")
    task = ansor.Task([A, B, te.ops.matmul(A, B)], target=OPENCL, name="mm_opencl")
    db = str(tmp_path / "gpu.db")
    result = ansor.tune(task, trials=6, database=db, measures_per_round=3, seed=0, progress=False)
    assert result.trials == 6 and result.best_cost < float("inf")
    assert ansor.Database(db).count(task.workload_key, "opencl-pocl-cpu") >= 6  # (+ the best confirmed)
    kernel = ansor.build(task, database=db)
    a, b = random_inputs(task)
    assert_close(kernel(a, b), a.astype(np.float64) @ b)
    assert "__kernel" in kernel.source
    assert kernel.time(a, b) > 0  # on the device's clock, through the backend's loader


def test_untuned_gpu_programs_bind_every_stage(tmp_path):
    from ansor.search.basic import default_schedule
    task = ansor.Task(OPERATORS["layer_norm"].make(), target=OPENCL)
    kernels = kernels_of(lower_for(default_schedule(task), OPENCL))
    assert kernels and all(k.grid[0] >= 1 and k.block[0] >= 1 for k in kernels)


def test_the_cli_targets_gpus(tmp_path, capsys):
    from ansor.cli import main
    assert main(["sample", "matmul", "--shape", "32,32,32", "--target", "cuda", "-n", "1"]) == 0
    assert "__global__" in capsys.readouterr().out
    assert main(["tune", "matmul", "--shape", "32,32,32", "--target", "opencl", "--isa", "avx2",
                 "--database", str(tmp_path / "x.db")]) == 2
    assert "--isa and --cores describe a CPU target" in capsys.readouterr().err


def _row_task(name: str, rows: int, cols: int) -> ansor.Task:
    X = te.placeholder((rows, cols), name="X")
    out = te.ops.softmax(X) if name == "softmax" else te.ops.norm2(X)
    return ansor.Task([X, out], target=OPENCL)


def test_a_reduction_longer_than_a_warp_is_shared_by_the_threads_of_a_block():
    task = _row_task("softmax", 6, 70)
    policy = SketchPolicy(task, seed=0)
    uses = sorted([h.split("(")[0] for h in sketch.history].count("cross_thread_reduction") for sketch in policy.sketches)
    assert uses == [0, 1, 1, 2]  # max, sum: each shared by threads or not
    both = next(sk for sk in policy.sketches if sum("cross_thread" in h for h in sk.history) == 2)
    program = annotate_gpu(both.steps, task.dag, random.Random(0), policy.params, policy.hardware)
    kernels = kernels_of(lower_for(program, OPENCL))
    reducing = [k for k in kernels if any(isinstance(s, ir.Allocate) and s.buffer.name.endswith("_red")
                                          for s in ir.walk_stmts(k.body))]
    assert len(reducing) == 2
    for k in reducing:  # a block per row, a power-of-two block below twice the row
        assert k.grid == (6, 1, 1) and k.block[0] in (32, 64, 128)
    with pytest.raises(ansor.ScheduleError, match="cannot be bound to blockIdx.x"):
        s = ansor.State(task.dag)
        s.annotate("softmax_max", "k", "blockIdx.x")


@needs_pocl
@pytest.mark.parametrize("name,shape", [("softmax", (6, 70)), ("norm2", (12, 20))])
def test_cross_thread_reductions_match_numpy_on_pocl_and_the_cpu(name, shape, builder):
    task = _row_task(name, *shape)
    (x,) = random_inputs(task)
    expected = OPERATORS[name].reference(x.astype(np.float64))
    cpu_task = ansor.Task(task.dag.io_tensors, target=ansor.Target.host())
    for program in SketchPolicy(task, seed=1).sample(2):
        (out,) = run_opencl(generate_source(program, task.target)[0], [x], [np.zeros(expected.shape, np.float32)])
        assert_close(out, expected, str(program))
        assert_close(run_state(cpu_task, program, builder, [x]), expected)  # threads run serially there


@pytest.mark.skipif(not _oclgrind_available(), reason="Oclgrind is not installed (pip install 'ansor[opencl]')")
def test_cross_thread_reductions_are_free_of_races_under_oclgrind():
    from ansor.measure.oclgrind import race_check
    task = _row_task("softmax", 3, 45)
    (x,) = random_inputs(task)
    program = SketchPolicy(task, seed=2).sample(1)[0]
    assert race_check(generate_source(program, task.target)[0], [x]) == ""


def _held_out(target: ansor.Target) -> ansor.Task:
    """A computation no suite, corpus or test declares: squares of exp-scaled rows, summed."""
    X = te.placeholder((24, 70), name="X")
    g = te.placeholder((70,), name="g")
    m = te.compute((24, 70), lambda i, j: te.exp(X[i, j] * g[j]) * X[i, j], name="scaled")
    k = te.reduce_axis((0, 70), name="k")
    return ansor.Task([X, g, te.compute((24,), lambda i: te.sum(m[i, k] * m[i, k], axis=k), name="sumsq")],
                      target=target, name="held_out")


def _held_out_reference(x, g):
    m = np.exp(x * g) * x
    return (m * m).sum(axis=1)


@needs_pocl
def test_a_held_out_computation_tunes_for_opencl_in_16_trials_and_builds_correct(tmp_path):
    task = _held_out(OPENCL)
    db = str(tmp_path / "held_out.db")
    result = ansor.tune(task, trials=16, database=db, measures_per_round=8, seed=0, progress=False)
    assert result.trials == 16 and result.best_cost < float("inf")
    x, g = random_inputs(task)
    assert_close(ansor.build(task, database=db)(x, g), _held_out_reference(x.astype(np.float64), g))


def test_a_cuda_kernel_builds_without_a_gpu_and_says_why_it_cannot_run(tmp_path):
    from ansor.measure.errors import DeviceUnavailableError
    task = _held_out(ansor.Target.cuda(arch="sm_90"))
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed: the kernel may run here")
    except ImportError:
        pass
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    with pytest.warns(UserWarning, match="no quick search"):
        kernel = ansor.build(task, database=str(tmp_path / "cuda.db"))
    assert 'extern "C" __global__' in kernel.source
    path = tmp_path / "kernel.cu"
    path.write_text(kernel.source)
    done = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-o", str(tmp_path / "k.cubin"), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        kernel(*random_inputs(task))


@pytest.mark.skipif(not _oclgrind_available(), reason="Oclgrind is not installed (pip install 'ansor[opencl]')")
def test_a_barrier_taken_out_of_a_generated_kernel_is_caught_by_oclgrind():
    """The race check is not vacuous on our own kernels: PoCL would still answer right."""
    from ansor.measure.oclgrind import race_check
    task, s = gpu_matmul(16, 16, 16, lengths=(1, 4, 2), k_tile=8)
    lines = generate_source(s, task.target)[0].split("\n")
    barriers = [i for i, line in enumerate(lines) if "barrier(" in line]
    assert len(barriers) == 2
    del lines[barriers[1]]  # the one between the fills and the reads
    log = race_check("\n".join(lines), random_inputs(task))
    assert "data race" in log
