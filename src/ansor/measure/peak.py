"""The float32 FMA peak of a CPU target, measured on this machine.

Every core runs independent vector fused multiply-adds in registers for a moment; the best of
a few runs is kept. A clock from a data sheet overstates or understates what the cores sustain
(boost clocks), which is why it is measured. A run on a loaded machine understates it: users
of the figure treat it as a lower bound of what the cores can do (the task scheduler never
assumes a task is closer to it than its own best program shows).
"""

from __future__ import annotations

import ctypes

from ansor.target import Target

_MEASURED: dict[str, float] = {}


def _source(target: Target, accumulators: int) -> str:
    width = target.vector_unit_bytes
    body = "\n".join(f"      a{i} = a{i} * b + c;" for i in range(accumulators))
    return f"""
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


def fma_peak_flops(target: Target | None = None, seconds: float = 0.1, rounds: int = 3) -> float:
    """The float32 FMA peak of `target`'s cores (the host by default) in FLOP/s: about
    `seconds` of FMAs, the best of `rounds` runs; measured once per target and process.
    ValueError for a target that is not this machine's CPU (it cannot be measured here)."""
    from ansor.measure.build import Builder

    target = target if target is not None else Target.host()
    if target.kind != "cpu" or target.vector_unit_bytes > Target.host().vector_unit_bytes:
        raise ValueError(f"the FMA peak of {target.key} cannot be measured on this machine")
    if target.key in _MEASURED:
        return _MEASURED[target.key]
    lanes = target.vector_unit_bytes // 4
    accumulators = 16 if target.vector_registers >= 32 else 12  # with the two constants, in registers
    built = Builder().compile_one(_source(target, accumulators))
    if built.lib_path is None:
        raise RuntimeError(f"compiling the FMA peak kernel failed: {built.error_msg}")
    run = ctypes.CDLL(built.lib_path).fma_peak_seconds
    run.restype, run.argtypes = ctypes.c_double, [ctypes.c_longlong, ctypes.c_float]
    flops_per_iteration = target.num_cores * accumulators * lanes * 2
    iterations = 100_000
    while (elapsed := run(iterations, 1.0)) < seconds / 4:
        iterations *= 4
    iterations = max(1, int(iterations * seconds / max(elapsed, 1e-9)))
    best = min(run(iterations, 1.0 + r) for r in range(rounds))
    _MEASURED[target.key] = flops_per_iteration * iterations / best
    return _MEASURED[target.key]
