"""The timing protocol: warm-up, `number` calls per repeat sized to a minimum duration, repeats.

Each repeat's cost is its elapsed time divided by `number`; the caller keeps the median and the
spread, so one noisy repeat on a shared machine does not decide a search.

A kernel called again and again on the same buffers finds its inputs in the caches, which it
does not inside a model: between two calls of one layer, every other layer's weights and
activations pass through them. With `cold_bytes` the calls cycle through copies of the inputs
(and of the packed weights) until that many bytes separate two uses of one copy, as the rest of
the model does (TVM flushes the cache before each call for the same reason; cycling keeps the
back-to-back timing and its precision for short kernels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import time

import numpy as np

from .input_copies import InputCopies
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
    cold_bytes: int = 0  # > 0: calls cycle through copies of the inputs spanning this many bytes
                         # (a model's data between two calls of one of its kernels; see the module)
    max_seconds: float = 2.0  # stop adding repeats once this much time went into timing
    one_repeat_above: float = 0.0  # seconds per call past which the first repeat is the only one
                                   # (0: off); a search sets it to a multiple of its best time:
                                   # a program that much slower is never picked, and one repeat
                                   # already tells the model how slow it is

    def __post_init__(self) -> None:
        if self.repeat < 1 or self.number < 1 or self.max_number < 1 or self.warmup < 0 or self.cold_bytes < 0:
            raise ValueError(f"invalid timing policy: {self}")


_flush_buffer: np.ndarray | None = None


def flush_cpu_cache() -> None:
    """Evict the kernel's data from the CPU caches by writing over a large scratch buffer."""
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = np.zeros(FLUSH_BYTES // 8, dtype=np.float64)
    _flush_buffer += 1.0


def measure_costs(
    kernel: KernelLibrary, buffers: Sequence[np.ndarray], policy: TimingPolicy, warmed_up: bool = False,
    n_inputs: int | None = None, input_copies: InputCopies | None = None,
) -> tuple[float, ...]:
    """Seconds per call, one value per repeat, following `policy`; `warmed_up` says the caller
    has just run the kernel (e.g. to check it), which then serves as the warm-up. `n_inputs`:
    how many of `buffers` are inputs (the rest are outputs, then packed buffers); the inputs
    and packed buffers are what `policy.cold_bytes` cycles through (None: every buffer but the
    last). `input_copies`: the task's input copies kept from its earlier programs, to cycle
    through instead of new ones (dropped if this kernel writes into its inputs)."""
    if policy.cold_bytes > 0 and hasattr(kernel, "fixed_call"):
        rotation = RotatedCalls(kernel, buffers, policy.cold_bytes, n_inputs, input_copies)  # type: ignore[arg-type]
        try:
            return measure_costs(rotation, [], replace(policy, cold_bytes=0, number=1), warmed_up=False)
        finally:
            if rotation.input_copies is not None:
                rotation.input_copies.keep_if_unchanged(buffers[:rotation.n_inputs])
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
        if 0 < policy.one_repeat_above * CLEARLY_SLOWER < elapsed / number:
            return number, elapsed / number  # far slower than what it must beat: no need to size a repeat
        predicted = int(PROBE_MARGIN * min_seconds * number / elapsed) + 1 if elapsed > 0 else 0
        number = min(max(number * 2, predicted), policy.max_number)


PROBE_MARGIN = 1.2  # a sized repeat aims this far over min_repeat_ms
#: A probe this many times past `one_repeat_above` ends the timing at once: even a first call's
#: cold caches and page faults do not make a program that much slower than it is.
CLEARLY_SLOWER = 2.0


#: At most this many copies of a kernel's inputs are cycled through (a tiny kernel's copies
#: then span less than `cold_bytes`, which its data would not fill in a model either).
MAX_COPIES = 256


class RotatedCalls:
    """A kernel called on the next of several copies of its inputs and packed buffers each
    time, the copies taken in turn (`number` counts calls, not rounds of copies).

    Looks like a `KernelLibrary` to `measure_costs`: `timed(buffers, number)` runs exactly
    `number` calls from C (`measure.sequence`, one foreign call per stretch of copies), going
    on from the copy where the last call stopped, and `__call__` runs one call. A repeat is
    never rounded up to whole rounds: a slow kernel with many copies would otherwise spend a
    whole round (tens of calls) on every probe and repeat. The outputs are shared by every
    copy, as a model's planned buffer is. The first copy is `buffers` itself; the others come
    from `input_copies` when it holds this task's inputs (`InputCopies`: kept between the
    task's programs), else they are made here."""

    def __init__(self, kernel: KernelLibrary, buffers: Sequence[np.ndarray], cold_bytes: int,
                 n_inputs: int | None = None, input_copies: InputCopies | None = None) -> None:
        from ansor.memory import aligned_copy
        from .sequence import KernelSequence

        n_in = len(buffers) - 1 if n_inputs is None else n_inputs
        packed_from = n_in + (len(buffers) - n_in - len(kernel.packed_nbytes))
        rotated = [i for i in range(len(buffers)) if i < n_in or i >= packed_from]
        set_bytes = max(1, sum(buffers[i].nbytes for i in rotated))
        self.copies = max(2, min(MAX_COPIES, -(-cold_bytes // set_bytes) + 1))
        self.n_inputs = n_in
        if input_copies is not None and not input_copies.fits(buffers[:n_in]):
            input_copies = None  # not this task's inputs: copies of its own, as without a cache
        self.input_copies = input_copies
        sets = [list(buffers)]
        if input_copies is not None:
            sets += input_copies.rotated_sets(buffers, n_in, packed_from, self.copies - 1)
        else:
            for _ in range(self.copies - 1):
                copy = list(buffers)
                for i in rotated:
                    copy[i] = aligned_copy(buffers[i])
                sets.append(copy)
        calls = [kernel.fixed_call(s) for s in sets]  # each holds its buffers alive
        self._calls = calls
        self._sequence = KernelSequence([(c.address, c.pointers) for c in calls])
        self._next = 0  # the copy the next call uses
        self.nbytes = set_bytes * self.copies

    def _run(self, number: int) -> None:
        left = number
        while left > 0:
            count = min(left, self.copies - self._next)
            self._sequence.run_slice(self._next, count)
            self._next = (self._next + count) % self.copies
            left -= count

    def __call__(self, buffers: Sequence[np.ndarray]) -> None:
        self._run(1)

    def timed(self, buffers: Sequence[np.ndarray], number: int) -> float:
        """Seconds of `number` calls, each on the next copy."""
        start = time.perf_counter()
        self._run(number)
        return time.perf_counter() - start
