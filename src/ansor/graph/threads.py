"""Keeping numpy's BLAS threads out of the way of ansor's OpenMP kernels.

On a machine with few cores, two thread pools that run in turns slow each other down: after its
work each pool's idle workers spin for a while before they sleep, on the cores the other pool
needs next (OpenBLAS spins far longer than libgomp). The compiled model's numpy fallback steps
run between OpenMP kernels, so they run with the BLAS limited to the calling thread, which leaves
no BLAS worker spinning. PyTorch shares ansor's OpenMP runtime (one libgomp per process), so it
needs nothing of the kind. `benchmarks/interleaved.py` measures the effect.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator


@lru_cache(maxsize=1)
def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()  # finding the loaded libraries once: it walks the process's modules


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Within the block, BLAS libraries loaded in the process (numpy's OpenBLAS, MKL) run on the
    calling thread only; their previous thread counts come back after it."""
    with _controller().limit(limits=1, user_api="blas"):
        yield
