"""A compiled kernel library opened with ctypes and called on numpy buffers.

Calling convention of a generated library:
    void   <func>(void* arg0, void* arg1, ...)                    inputs first, then outputs
    double <func>_timed(long long number, void* arg0, ...)        optional: total seconds of
                                                                   `number` calls, timed in C
    void   <func>_prepack(void* arg0, ...)                        optional: fills the packed
                                                                   buffers (the last arguments)
    long long <func>_packed_bytes(int i)                          their sizes; -1 past the last
"""

from __future__ import annotations

import _ctypes
import ctypes
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from ansor.memory import aligned_empty

_openmp_pinned = False


def _pin_openmp_runtime() -> None:
    """Keep libgomp loaded for the life of the process.

    Closing the last library that uses OpenMP would otherwise unload libgomp while its idle
    thread pool still runs inside it.
    """
    global _openmp_pinned
    if _openmp_pinned:
        return
    _openmp_pinned = True
    try:
        ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass


def buffer_pointers(buffers: Sequence[np.ndarray]) -> list[ctypes.c_void_p]:
    """Raw pointers of C-contiguous numpy arrays, in order; other arrays are refused."""
    pointers = []
    for index, array in enumerate(buffers):
        if not isinstance(array, np.ndarray):
            raise TypeError(f"argument {index} is {type(array).__name__}, not a numpy array")
        if not array.flags.c_contiguous:
            raise ValueError(f"argument {index} is not C-contiguous")
        pointers.append(ctypes.c_void_p(array.ctypes.data))
    return pointers


class KernelLibrary:
    """One kernel entry point (and its optional C timer) from a shared library."""

    def __init__(self, lib_path: str | os.PathLike, func_name: str) -> None:
        _pin_openmp_runtime()
        self.lib_path = os.path.abspath(lib_path)
        self.func_name = func_name
        self._lib: ctypes.CDLL | None = ctypes.CDLL(self.lib_path, mode=ctypes.RTLD_LOCAL)
        try:
            self._func = getattr(self._lib, func_name)
            self._func.restype = None
            self._timer = getattr(self._lib, f"{func_name}_timed", None)
            if self._timer is not None:
                self._timer.restype = ctypes.c_double
            self._prepack = getattr(self._lib, f"{func_name}_prepack", None)
            self.packed_nbytes: tuple[int, ...] = ()
            if self._prepack is not None:
                self._prepack.restype = None
                sizes = getattr(self._lib, f"{func_name}_packed_bytes")
                sizes.restype, sizes.argtypes = ctypes.c_longlong, [ctypes.c_int]
                found = []
                while (n := sizes(len(found))) >= 0:
                    found.append(int(n))
                self.packed_nbytes = tuple(found)
        except BaseException:
            self.close()
            raise

    def int_global(self, name: str) -> ctypes.c_int | None:
        """The library's global `int name` (reads and writes go to the library's own copy),
        or None when it defines none."""
        try:
            return ctypes.c_int.in_dll(self._lib, name)
        except ValueError:
            return None

    @property
    def has_timer(self) -> bool:
        """Whether the library times itself in C (more precise for sub-microsecond kernels)."""
        return self._timer is not None

    def __call__(self, buffers: Sequence[np.ndarray]) -> None:
        """Run the kernel once on `buffers` (inputs, outputs, then packed buffers if any)."""
        self._func(*buffer_pointers(buffers))

    def fixed_call(self, buffers: Sequence[np.ndarray]) -> Callable[[], None]:
        """A zero-argument call on `buffers`, their pointers taken once: the cheapest way to run
        the kernel again and again on the same memory from Python. The call holds the buffers,
        so the memory its pointers point into lives as long as it does; its `address` and
        `pointers` let `measure.sequence` run it from C."""
        func, pointers, kept = self._func, tuple(buffer_pointers(buffers)), list(buffers)

        def call() -> None:
            func(*pointers)

        call.buffers = kept  # the memory the pointers point into lives as long as the call
        # for `measure.sequence`, which runs many such calls from C
        call.address = ctypes.cast(func, ctypes.c_void_p).value
        call.pointers = tuple(p.value or 0 for p in pointers)
        return call

    def packed_buffers(self) -> list[np.ndarray]:
        """Fresh aligned buffers for the packed parameters (none for most kernels)."""
        return [aligned_empty((n,), np.uint8) for n in self.packed_nbytes]

    def prepack(self, buffers: Sequence[np.ndarray]) -> None:
        """Fill the packed buffers from the constant inputs (same `buffers` as a call); a no-op
        for kernels without packed parameters."""
        if self._prepack is not None:
            self._prepack(*buffer_pointers(buffers))

    def timed(self, buffers: Sequence[np.ndarray], number: int) -> float:
        """Total seconds of `number` back-to-back calls."""
        pointers = buffer_pointers(buffers)
        if self._timer is not None:
            return float(self._timer(ctypes.c_longlong(number), *pointers))
        func = self._func
        start = time.perf_counter()
        for _ in range(number):
            func(*pointers)
        return time.perf_counter() - start

    def close(self) -> None:
        """Unload the library, so a long-lived process does not accumulate thousands of them."""
        if self._lib is None:
            return
        handle = self._lib._handle
        self._lib = None
        self._func = self._timer = self._prepack = None
        _ctypes.dlclose(handle)

    def __enter__(self) -> KernelLibrary:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
