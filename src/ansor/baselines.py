"""Timing of reference implementations (numpy, PyTorch) in the same run as ansor's kernels."""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class Timing:
    median: float  # seconds per call
    spread: float  # (max - min) / median over repeats
    runs: tuple[float, ...] = ()  # seconds per call of each repeat (of each round, in turns)


def time_callable(fn: Callable[[], object], repeat: int = 5, min_repeat_s: float = 0.05) -> Timing:
    """Median seconds per call: one warm-up, then `repeat` repeats of enough calls to last
    `min_repeat_s` each."""
    fn()
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_repeat_s or number >= 1 << 20:
            break
        number *= 2
    costs = [elapsed / number]
    for _ in range(repeat - 1):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        costs.append((time.perf_counter() - t0) / number)
    med = statistics.median(costs)
    return Timing(med, (max(costs) - min(costs)) / med if med > 0 else 0.0)


def _calls_per_repeat(fn: Callable[[], object], min_repeat_s: float) -> int:
    """Calls that last at least `min_repeat_s` (after one warm-up call)."""
    fn()
    number = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - t0 >= min_repeat_s or number >= 1 << 20:
            return number
        number *= 2


def time_in_turns(fns: dict[str, Callable[[], object]], rounds: int = 7,
                  min_repeat_s: float = 0.05, pause_s: float = 0.0) -> dict[str, Timing]:
    """Median seconds per call of each callable, timed in turns (`measure_in_turns`): enough
    calls per turn to last `min_repeat_s`, counted once before the rounds. Use it for any
    verdict of one implementation against another."""
    numbers = {name: _calls_per_repeat(fn, min_repeat_s) for name, fn in fns.items()}

    def turn(fn: Callable[[], object], number: int) -> Callable[[], float]:
        def seconds_per_call() -> float:
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            return (time.perf_counter() - t0) / number

        return seconds_per_call

    return measure_in_turns({name: turn(fn, numbers[name]) for name, fn in fns.items()}, rounds, pause_s)


def measure_in_turns(measures: dict[str, Callable[[], float | None]], rounds: int = 7,
                     pause_s: float = 0.0) -> dict[str, Timing]:
    """The turns themselves: every round calls each measurement once (each returns seconds per
    call, or None for no figure), so a quiet or a busy moment of the machine falls on all of
    them alike; the median and spread of each one's figures. A measurement with no figure at
    all is left out.

    Each round starts with a different measurement, and each turn first sleeps `pause_s`: a
    runtime's thread pool goes on spinning (or its memory traffic settles) for a while after its
    work, and on few cores the turn that follows pays for it (measured for a whole model right
    after onnxruntime: BENCHMARKS.md)."""
    if rounds < 1:
        raise ValueError(f"timing in turns needs at least 1 round, got {rounds}")
    costs: dict[str, list[float]] = {name: [] for name in measures}
    names = list(measures)
    for r in range(rounds if names else 0):
        for name in names[r % len(names):] + names[:r % len(names)]:
            if pause_s > 0:
                time.sleep(pause_s)
            seconds = measures[name]()
            if seconds is not None:
                costs[name].append(seconds)
    out = {}
    for name, runs in costs.items():
        if runs:
            med = statistics.median(runs)
            out[name] = Timing(med, (max(runs) - min(runs)) / med if med > 0 else 0.0, tuple(runs))
    return out


def paired_ratio(other: Timing, base: Timing) -> float:
    """Median over rounds of other/base, each round's two turns taken together: a slow phase
    of a shared machine that lasts a round falls on both turns of it and cancels (timings from
    `time_in_turns`)."""
    return statistics.median(o / b for o, b in zip(other.runs, base.runs))


def torch_callable(fn: Callable, options: dict, inputs: Sequence[np.ndarray],
                   compiled: bool = False) -> Callable[[], object] | None:
    """A no-argument callable running PyTorch (eager, or torch.compile'd) on the inputs;
    None without torch."""
    if not torch_available():
        return None
    import torch

    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
    run = _compiled(fn, options) if compiled else (lambda *xs: fn(options, *xs))

    def call():
        with torch.no_grad():
            return run(*tensors)

    return call


def time_numpy(fn: Callable[..., np.ndarray], inputs: Sequence[np.ndarray]) -> Timing:
    return time_callable(lambda: fn(*inputs))


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


_COMPILED: dict = {}  # (fn, options) -> its torch.compile'd callable


def _compiled(fn: Callable, options: dict) -> Callable:
    """torch.compile of `fn` with `options` bound, made once per (fn, options). Dynamo keeps
    its compiled variants per code object, and every compiled callable enters through the same
    wrapper frame: after 8 variants (its recompile limit) the suite's later workloads ran
    eagerly, with only a warning. The limit is raised to the number of variants made here."""
    key = (fn, repr(sorted(options.items())))
    run = _COMPILED.get(key)
    if run is None:
        import torch
        import torch._dynamo

        config = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):  # the name changed across versions
            if hasattr(config, name):
                setattr(config, name, max(getattr(config, name), 8 + 2 * (len(_COMPILED) + 1)))
        run = _COMPILED[key] = torch.compile(functools.partial(fn, options))
    return run


def time_torch(fn: Callable, options: dict, inputs: Sequence[np.ndarray], compiled: bool = False) -> Timing | None:
    """PyTorch eager (or torch.compile when `compiled`) on the same inputs; None without torch."""
    if not torch_available():
        return None
    import torch

    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
    run = _compiled(fn, options) if compiled else (lambda *xs: fn(options, *xs))
    with torch.no_grad():
        return time_callable(lambda: run(*tensors))
