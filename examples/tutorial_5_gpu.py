"""Tutorial 5: a GPU kernel, found and checked without a GPU, timed where there is one.

A fused `relu(A @ B + bias)` is declared once and scheduled for GPUs: blocks and threads,
tiles copied into shared memory by all the threads of a block, accumulators in registers,
virtual threads. No GPU is needed to search for and check such a program: OpenCL runs it on
the CPU (PoCL), which says whether it is right, not whether it is fast. The script

1. tunes the computation for `Target.opencl()` (`--trials`, default 16) and checks the best
   program against numpy (PoCL's times are printed, and say nothing about a GPU);
2. says how the winning program uses the GPU: grid and block, shared memory per block, the
   tile each thread accumulates, and the first lines of its OpenCL source;
3. builds the same schedule for `Target.cuda(arch)`: the CUDA text is written next to the
   script's output, and where nvcc is installed it is compiled (`-cubin`) and ptxas's report of
   registers, shared memory and spills is printed; calling it without a GPU raises a clear
   error, which the script shows;
4. on a machine with an NVIDIA GPU and CuPy, tunes for CUDA too (`--cuda-trials`, default 64)
   and times the best kernel against `torch.matmul` (cuBLAS) in turns on the GPU's clock.

    python examples/tutorial_5_gpu.py                      # 256 x 256 x 256, 16 trials on PoCL
    python examples/tutorial_5_gpu.py --small --trials 2   # 32 x 32 x 32 (the smoke test)
    python examples/tutorial_5_gpu.py --size 2048 --cuda-trials 300   # on an NVIDIA GPU
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import ansor
from ansor import te
from ansor.lower import ir
from ansor.measure.errors import DeviceUnavailableError


def declare(n: int, target: ansor.Target) -> ansor.Task:
    """relu(A @ B + bias): the matmul is the anchor, bias and ReLU its fused consumers."""
    A = te.placeholder((n, n), "float32", name="A")
    B = te.placeholder((n, n), "float32", name="B")
    bias = te.placeholder((n,), "float32", name="bias")
    k = te.reduce_axis(n, name="k")
    mm = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="mm")
    out = te.compute((n, n), lambda i, j: te.maximum(mm[i, j] + bias[j], 0.0), name="out")
    return ansor.Task([A, B, bias, out], name="matmul_bias_relu", target=target)


def reference(a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return np.maximum(a.astype(np.float64) @ b + bias, 0.0)


def how_it_uses_the_gpu(kernel: ansor.Kernel) -> list[str]:
    """Grid, block, shared memory and per-thread tile of each kernel, read off the lowered
    program (not assumed)."""
    from ansor.backend import lower_for
    from ansor.lower.gpu import kernels_of

    lines = []
    for k in kernels_of(lower_for(kernel.state, kernel.task.target)):
        shared = [s.buffer for s in ir.walk_stmts(k.body) if isinstance(s, ir.Allocate) and s.buffer.scope == "shared"]
        private = [s.buffer for s in ir.walk_stmts(k.body) if isinstance(s, ir.Allocate) and s.buffer.scope == "local"]
        blocks, threads = int(np.prod(k.grid)), int(np.prod(k.block))
        lines.append(f"kernel {k.name}: {blocks} blocks of {threads} threads (grid {k.grid}, block {k.block})")
        for b in shared:
            lines.append(f"  shared: {b.name} {b.shape}, {b.nbytes} bytes per block (filled by all its threads)")
        for b in private:
            lines.append(f"  registers: {b.name}, {b.size} values accumulated by each thread")
    return lines


def compile_with_nvcc(source: str, arch: str, where: Path) -> str:
    """ptxas's resource report of the CUDA text, or why there is none."""
    if shutil.which("nvcc") is None:
        return "nvcc is not installed: the CUDA text is written, not compiled"
    from ansor.measure.cuda import parse_ptxas_resources
    cu = where / "kernel.cu"
    cu.write_text(source)
    done = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-o", str(where / "kernel.cubin"),
                           str(cu)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return "nvcc failed:\n" + done.stderr
    report = parse_ptxas_resources(done.stdout + done.stderr)
    return "\n".join(f"nvcc {arch}: {name}: {r['registers']} registers, {r['shared_bytes']} bytes of shared "
                     f"memory, {r['spill_stores']} bytes spilled" for name, r in report.items())


def time_against_cublas(kernel: ansor.Kernel, inputs: list[np.ndarray], rounds: int = 7) -> str:
    """ansor's kernel and torch.matmul + bias + relu (cuBLAS, TF32 off), in turns, GPU clock."""
    try:
        import torch
    except ImportError:
        return "torch is not installed: no cuBLAS baseline"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU: no cuBLAS baseline"
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b, bias = (torch.from_numpy(x).cuda() for x in inputs)

    def torch_time() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.relu(a @ b + bias)
        start.record()
        for _ in range(10):
            torch.relu(a @ b + bias)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / 10

    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(kernel.time(*inputs))
        theirs.append(torch_time())
    o, t = statistics.median(ours), statistics.median(theirs)
    return f"ansor {o * 1e3:.3f} ms, PyTorch (cuBLAS) {t * 1e3:.3f} ms: ansor at {t / o:.2f}x cuBLAS's speed"


def require_opencl() -> None:
    """Where OpenCL cannot run GPU programs here (no pyopencl, no PoCL), say in one line what to
    install and exit with status 2, rather than fail with a traceback in the middle of tuning."""
    from ansor.measure.opencl import OpenCLUnavailableError, find_device

    try:
        find_device()
    except OpenCLUnavailableError as err:
        print(f"tutorial_5_gpu.py runs GPU programs on this CPU through OpenCL, which is missing: {err}",
              file=sys.stderr)
        raise SystemExit(2) from None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=256, help="n of the n x n x n matmul")
    p.add_argument("--small", action="store_true", help="n = 32 (the smoke test)")
    p.add_argument("--trials", type=int, default=16, help="OpenCL (PoCL) trials")
    p.add_argument("--cuda-trials", type=int, default=64, help="CUDA trials, where there is a GPU")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--database", default=None, help="records (default: a temporary file)")
    p.add_argument("--out", default=None, help="folder for the CUDA text (default: a temporary one)")
    args = p.parse_args()
    require_opencl()
    n = 32 if args.small else args.size
    db = args.database or str(Path(tempfile.mkdtemp()) / "gpu.db")
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="ansor-gpu-"))
    out_dir.mkdir(parents=True, exist_ok=True)

    # 1. tune for OpenCL; on a machine without a GPU it runs on PoCL (the CPU)
    task = declare(n, ansor.Target.opencl())
    print(f"relu(A @ B + bias), {n} x {n} x {n}, target {task.target.key}")
    ansor.tune(task, trials=args.trials, database=db)
    kernel = ansor.build(task, database=db)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32),
              rng.standard_normal(n, dtype=np.float32)]
    got = kernel(*inputs)
    error = float(np.max(np.abs(got - reference(*inputs))))
    print(f"best OpenCL program: max error against numpy {error:.1e}; {kernel.time(*inputs) * 1e3:.3f} ms "
          f"on {task.target.isa} (a CPU running GPU code: right or wrong, not fast or slow)")
    if error > 1e-3 * max(1.0, n ** 0.5):
        raise SystemExit("the kernel disagrees with numpy")

    # 2. how the program uses the GPU
    print("\nhow the winning program uses a GPU:")
    for line in how_it_uses_the_gpu(kernel):
        print("  " + line)
    print("\nthe first lines of its OpenCL kernel:")
    lines = kernel.source.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("/*"))  # the launch comment
    print("\n".join("  " + line for line in lines[first:first + 14]))

    # 3. the same schedule for CUDA
    cuda_task = declare(n, ansor.Target.cuda(args.arch))
    cuda_kernel = ansor.build(cuda_task, state=ansor.State.replay(cuda_task.dag, kernel.state.steps))
    (out_dir / "kernel.cu").write_text(cuda_kernel.source)
    print(f"\nthe same schedule as CUDA for {args.arch}: {out_dir / 'kernel.cu'}")
    print(compile_with_nvcc(cuda_kernel.source, args.arch, out_dir))
    try:
        result = cuda_kernel(*inputs)
    except DeviceUnavailableError as err:
        print(f"calling it here: {err}")
        return
    print(f"on the GPU: max error against numpy {float(np.max(np.abs(result - reference(*inputs)))):.1e}")

    # 4. a GPU is here: tune for it and compare with cuBLAS
    if args.cuda_trials > 0:
        ansor.tune(cuda_task, trials=args.cuda_trials, database=db)
        best = ansor.build(cuda_task, database=db)
        print(f"after {args.cuda_trials} CUDA trials: " + time_against_cublas(best, inputs))
        print("\n".join("  " + line for line in how_it_uses_the_gpu(best)))


if __name__ == "__main__":
    main()
