"""Random annotation helpers: tile-size factorizations and other sampled low-level choices."""

from __future__ import annotations

import functools
import random


@functools.lru_cache(maxsize=None)
def divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


@functools.lru_cache(maxsize=4096)
def factorizations(extent: int, n: int, max_innermost: int) -> tuple[tuple[int, ...], ...]:
    """Every tuple of n inner split lengths (outer to inner) whose product divides extent, the
    innermost at most max_innermost: perfect tilings only, as the sampler prefers."""
    out: list[tuple[int, ...]] = []

    def go(remaining: int, prefix: tuple[int, ...]) -> None:
        if len(prefix) == n:
            out.append(prefix)
            return
        for d in divisors(remaining):
            if len(prefix) == n - 1 and d > max_innermost:
                break
            go(remaining // d, prefix + (d,))

    go(extent, ())
    return tuple(out)


def sample_factors(extent: int, n: int, rng: random.Random, max_innermost: int = 64) -> tuple[int, ...]:
    """A uniformly drawn perfect tiling of `extent` into n inner lengths."""
    return rng.choice(factorizations(extent, n, max_innermost))
