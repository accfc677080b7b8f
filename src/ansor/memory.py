"""Buffers aligned to 64 bytes (one cache line, one AVX-512 vector).

numpy only promises 16-byte alignment, and where a large array lands depends on the
allocator's history, so the same kernel would be timed on differently aligned buffers from one
candidate to the next: a vector load that straddles two cache lines costs two, enough alone
to move a kernel's time well beyond the measurement noise. Every buffer ansor allocates for a kernel
(measurement inputs and outputs, a Kernel's outputs, a task's reference inputs) is aligned.
"""

from __future__ import annotations

import numpy as np

ALIGNMENT = 64


def aligned_empty(shape, dtype, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on an `alignment`-byte boundary."""
    dtype = np.dtype(dtype)
    shape = tuple(int(n) for n in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    start = (-raw.ctypes.data) % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def aligned_copy(array: np.ndarray, alignment: int = ALIGNMENT) -> np.ndarray:
    """A C-contiguous, aligned copy of `array`."""
    array = np.asarray(array)
    out = aligned_empty(array.shape, array.dtype, alignment)
    out[...] = array
    return out

