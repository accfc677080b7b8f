"""The timing protocol: warm-up, `number` calls per repeat sized to a minimum duration, repeats.

Each repeat's cost is its elapsed time divided by `number`; the caller keeps the median and the
spread, so one noisy repeat on a shared machine does not decide a search.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .library import KernelLibrary

FLUSH_BYTES = 32 * 1024 * 1024  # larger than the last-level cache of the CPUs we target


@dataclass(frozen=True)
class TimingPolicy:
    """How a kernel is timed.

    `number` is the starting count of calls per repeat; it grows (sized from the probe's own
    per-call time, at least doubling) until one repeat lasts at least `min_repeat_ms` (capped
    at `max_number`). With `flush_cache`, a 32 MiB buffer is
    overwritten before every call and each call is timed alone (number = 1), which measures
    the kernel with cold caches.
    """

    warmup: int = 1
    repeat: int = 3
    min_repeat_ms: float = 50.0
    number: int = 1
    max_number: int = 10**6
    flush_cache: bool = False
    max_seconds: float = 2.0  # stop adding repeats once this much time went into timing
    one_repeat_above: float = 0.0  # seconds per call past which the first repeat is the only one
                                   # (0: off); a search sets it to a multiple of its best time:
                                   # a program that much slower is never picked, and one repeat
                                   # already tells the model how slow it is

    def __post_init__(self) -> None:
        if self.repeat < 1 or self.number < 1 or self.max_number < 1 or self.warmup < 0:
            raise ValueError(f"invalid timing policy: {self}")


_flush_buffer: np.ndarray | None = None


def flush_cpu_cache() -> None:
    """Evict the kernel's data from the CPU caches by writing over a large scratch buffer."""
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = np.zeros(FLUSH_BYTES // 8, dtype=np.float64)
    _flush_buffer += 1.0


def measure_costs(
    kernel: KernelLibrary, buffers: Sequence[np.ndarray], policy: TimingPolicy, warmed_up: bool = False
) -> tuple[float, ...]:
    """Seconds per call, one value per repeat, following `policy`; `warmed_up` says the caller
    has just run the kernel (e.g. to check it), which then serves as the warm-up."""
    if policy.flush_cache:
        for _ in range(policy.warmup):
            flush_cpu_cache()
            kernel.timed(buffers, 1)
        costs = []
        for _ in range(policy.repeat):
            flush_cpu_cache()
            costs.append(kernel.timed(buffers, 1))
        return tuple(costs)

    for _ in range(policy.warmup if not warmed_up else 0):
        kernel(buffers)
    number, first = choose_number(kernel, buffers, policy)
    if first is not None and 0 < policy.one_repeat_above < first:
        return (first,)
    costs = [] if first is None else [first]
    while len(costs) < policy.repeat:
        if costs and sum(costs) * number >= policy.max_seconds:
            break  # a very slow kernel: its first repeats already tell the story
        costs.append(kernel.timed(buffers, number) / number)
    return tuple(costs)


def choose_number(
    kernel: KernelLibrary, buffers: Sequence[np.ndarray], policy: TimingPolicy
) -> tuple[int, float | None]:
    """Calls per repeat: enough for a repeat to last `min_repeat_ms`.

    Each probe that falls short sizes the next from its own per-call time (with a margin, so
    timer noise seldom forces one more probe) instead of doubling blindly: a 10 ms kernel is
    probed with 1 call and then 6, not 1, 2, 4 and 8, which halves the time a search spends
    timing middling programs. Also returns the per-call cost of the probe that qualified, so
    a slow kernel (one call already long enough) is not run again just to be timed: it counts
    as the first repeat.
    """
    min_seconds = policy.min_repeat_ms / 1000.0
    number = min(policy.number, policy.max_number)
    if min_seconds <= 0:
        return number, None
    while True:
        elapsed = kernel.timed(buffers, number)
        if elapsed >= min_seconds or number >= policy.max_number:
            return number, elapsed / number
        predicted = int(PROBE_MARGIN * min_seconds * number / elapsed) + 1 if elapsed > 0 else 0
        number = min(max(number * 2, predicted), policy.max_number)


PROBE_MARGIN = 1.2  # a sized repeat aims this far over min_repeat_ms
