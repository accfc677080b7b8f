"""What the benchmark scripts share: the suite's workloads, how a run is timed in turns and
labelled, and the checked build of a database's best kernel.

Every script imports it as `from common import ...`: `python benchmarks/x.py` puts this folder
first on `sys.path`, so no script patches the path or reaches into another script.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import ansor

#: The benchmark suite: (label, workload name, shape, options). The pretrained cost model's
#: corpus never holds these shapes (`ansor.pretrain.corpus.HELD_OUT`), so the suite judges it
#: on workloads it has not seen.
SUITE = [
    ("matmul 512", "matmul", (512, 512, 512), {}),
    ("matmul 1024", "matmul", (1024, 1024, 1024), {}),
    ("batch_matmul 12x128x64@64x128", "batch_matmul", (12, 128, 128, 64), {}),
    ("conv2d 64x56x56 3x3", "conv2d", (1, 64, 56, 56, 64, 3, 3), {"padding": 1}),
    ("conv2d 256x14x14 3x3", "conv2d", (1, 256, 14, 14, 256, 3, 3), {"padding": 1}),
    ("conv2d stem 7x7 s2", "conv2d", (1, 3, 224, 224, 64, 7, 7), {"stride": 2, "padding": 3}),
    ("depthwise 128x56x56 3x3", "depthwise_conv2d", (1, 128, 56, 56, 3, 3), {"padding": 1}),
    ("conv2d_transpose 512x4x4 k4 s2", "conv2d_transpose", (1, 512, 4, 4, 256, 4, 4), {"stride": 2, "padding": 1}),
    ("norm2 1024x1024", "norm2", (1024, 1024), {}),
    ("softmax 1536x128", "softmax", (1536, 128), {}),
    ("layer_norm+gelu 4096x768", "layer_norm_gelu", (4096, 768), {}),
    ("matmul 512 +bias+relu", "matmul_bias_relu", (512, 512, 512), {}),
    ("conv2d+bias+relu 64x56x56", "conv2d_bias_relu", (1, 64, 56, 56, 64, 3, 3), {"padding": 1}),
]

TIMING_ROUNDS = 5    # each side is timed in turn this many times; medians are kept
TURN_PAUSE_S = 0.2   # before each turn: thread pools (OpenBLAS, PyTorch's OpenMP) spin for a while
                     # after their work, and on two cores the next side would pay for it


def git_commit() -> str:
    """The checkout's commit (short hash) for a run's header line, "unknown" outside git."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_name() -> str:
    """The CPU's model name, family and core count (as `lscpu` says), for a result's label."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown"
    name = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    family = re.search(r"^cpu family\s*:\s*(\d+)$", text, re.M)
    cores = len(re.findall(r"^processor\s*:", text, re.M))
    return (f"{name.group(1).strip() if name else 'unknown CPU'} (family "
            f"{family.group(1) if family else '?'}), {cores} cores")


def build_checked(task: ansor.Task, database: str, label: str) -> tuple[ansor.Kernel, list]:
    """The database's best kernel of the task and the inputs it was checked on against the
    reference: a wrong kernel stops the benchmark rather than being timed."""
    kernel = ansor.build(task, database=database)
    inputs = task.random_inputs(seed=1)
    problem = kernel.check(*inputs)
    if problem:
        raise AssertionError(f"{label}: built kernel is wrong: {problem}")
    return kernel, inputs


def trials_to_reach(curve: list[tuple[int, float]], gflops: float) -> int | None:
    """The first trial at which a tuning curve (trial, best GFLOP/s so far) reaches `gflops`,
    or None if it never does."""
    return next((t for t, g in curve if g >= gflops), None)


def fma_peak(seconds: float = 0.3, rounds: int = 5) -> float:
    """The float32 FMA peak of the host's cores in GFLOP/s, measured: every core runs
    independent vector FMAs in registers for about `seconds`, the best of `rounds` runs is
    kept. A clock taken from a data sheet overstates or understates what the cores sustain
    (boost clocks); a run on a loaded machine understates it, so measure it quiet."""
    import ctypes

    from ansor.measure import Builder

    target = ansor.Target.host()
    width = target.vector_unit_bytes
    lanes = width // 4
    accumulators = 16 if target.vector_registers >= 32 else 12  # with the two constants, in registers
    body = "\n".join(f"      a{i} = a{i} * b + c;" for i in range(accumulators))
    source = f"""
#include <omp.h>
typedef float vec __attribute__((vector_size({width})));
double fma_peak_seconds(long long iterations, float seed) {{
  double start = omp_get_wtime();
  #pragma omp parallel num_threads({target.num_cores})
  {{
    vec b = {{0}}, c = {{0}};
    b += 1.0f - 1e-7f; c += seed;
    {' '.join(f'vec a{i} = c + {i}.0f;' for i in range(accumulators))}
    for (long long i = 0; i < iterations; ++i) {{
{body}
    }}
    volatile vec sink[{accumulators}];  /* every accumulator whole: no lane of the loop is dead */
    {' '.join(f'sink[{i}] = a{i};' for i in range(accumulators))}
  }}
  return omp_get_wtime() - start;
}}
"""
    built = Builder().compile_one(source)
    if built.lib_path is None:
        raise RuntimeError(f"compiling the FMA peak kernel failed: {built.error_msg}")
    run = ctypes.CDLL(built.lib_path).fma_peak_seconds
    run.restype, run.argtypes = ctypes.c_double, [ctypes.c_longlong, ctypes.c_float]
    flops_per_iteration = target.num_cores * accumulators * lanes * 2
    iterations = 1_000_000
    while (elapsed := run(iterations, 1.0)) < seconds / 4:
        iterations *= 4
    iterations = int(iterations * seconds / elapsed)
    return max(flops_per_iteration * iterations / run(iterations, 1.0) for _ in range(rounds)) / 1e9
