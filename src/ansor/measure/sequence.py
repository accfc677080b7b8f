"""Many kernel calls in one foreign call: a compiled model's steps run from C.

Each step of a compiled model is a kernel called on fixed buffers. From Python every call
costs a ctypes dispatch, more with many pointer arguments; a network of many small kernels
pays a visible share of its run for that alone (BENCHMARKS.md). `KernelSequence` takes the steps' entry points and pointers once and runs them
all with one ctypes call into a small C function that calls each entry point in turn.

The entry points of generated kernels take only pointers (`measure.library`), so each is
called through a function type of the same number of `void*` parameters: on the C calling
conventions of the CPUs we target, pointer parameters are passed the same whatever they
point to.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from functools import lru_cache

#: The most pointer arguments one call may take (a kernel's inputs, outputs and packed buffers).
MAX_ARGUMENTS = 64
ENTRY = "ansor_run_sequence"


def sequence_source(max_arguments: int = MAX_ARGUMENTS) -> str:
    """C source of `int ansor_run_sequence(n, fns, nargs, args)`: calls fns[i](args[i][0..]) in
    order; returns 0, or i + 1 when call i has more arguments than `max_arguments` (none run)."""
    lines = ["/* ansor: run a list of kernel calls (all parameters are pointers) */",
             f"int {ENTRY}(int n, void* const* fns, const int* nargs, void* const* const* args) {{",
             "  for (int i = 0; i < n; ++i)",
             f"    if (nargs[i] < 0 || nargs[i] > {max_arguments}) return i + 1;",
             "  for (int i = 0; i < n; ++i) {",
             "    void* const* a = args[i];",
             "    switch (nargs[i]) {"]
    for k in range(max_arguments + 1):
        params = ", ".join(["void*"] * k) or "void"
        values = ", ".join(f"a[{j}]" for j in range(k))
        lines.append(f"      case {k}: ((void (*)({params}))fns[i])({values}); break;")
    lines += ["    }", "  }", "  return 0;", "}", ""]
    return "\n".join(lines)


@lru_cache(maxsize=1)
def _runner() -> Callable:
    """The compiled sequence function (built once per process, cached on disk by the Builder)."""
    from .build import Builder  # relative: the measurement worker loads this package without its __init__
    from .errors import MeasureErrorNo

    built = Builder().compile_one(sequence_source())
    if built.error_no != MeasureErrorNo.NO_ERROR or built.lib_path is None:
        raise RuntimeError(f"compiling the kernel sequencer failed: {built.error_msg}")
    lib = ctypes.CDLL(built.lib_path)
    fn = getattr(lib, ENTRY)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.library = lib  # keep the library loaded as long as the function is
    return fn


class KernelSequence:
    """Calls (entry point address, pointer arguments) in order, with one foreign call.

    The caller keeps the memory the pointers point into alive (and the libraries loaded)."""

    def __init__(self, calls: Sequence[tuple[int, Sequence[int]]]):
        if any(len(args) > MAX_ARGUMENTS for _, args in calls):
            raise ValueError(f"a kernel call takes more than {MAX_ARGUMENTS} pointer arguments")
        n = len(calls)
        self._fns = (ctypes.c_void_p * n)(*(address for address, _ in calls))
        self._nargs = (ctypes.c_int * n)(*(len(args) for _, args in calls))
        self._arg_arrays = [(ctypes.c_void_p * max(len(args), 1))(*args) for _, args in calls]
        self._args = (ctypes.POINTER(ctypes.c_void_p) * n)(
            *(ctypes.cast(a, ctypes.POINTER(ctypes.c_void_p)) for a in self._arg_arrays))
        self._run = _runner()
        self._argv = (ctypes.c_int(n), ctypes.cast(self._fns, ctypes.c_void_p),
                      ctypes.cast(self._nargs, ctypes.c_void_p), ctypes.cast(self._args, ctypes.c_void_p))

    def __len__(self) -> int:
        return len(self._nargs)

    def __call__(self) -> None:
        failed = self._run(*self._argv)
        if failed:
            raise RuntimeError(f"kernel sequence: call {failed - 1} has an unsupported number of arguments")

    def run_slice(self, start: int, count: int) -> None:
        """Calls `start` .. `start + count - 1` only (one foreign call): a timed repeat need not
        be a whole number of rounds of the sequence."""
        n = len(self._nargs)
        if not (0 <= start and count >= 0 and start + count <= n):
            raise ValueError(f"kernel sequence: calls {start}..{start + count - 1} out of 0..{n - 1}")
        if count == 0:
            return
        pointer = ctypes.sizeof(ctypes.c_void_p)
        failed = self._run(ctypes.c_int(count), ctypes.c_void_p(ctypes.addressof(self._fns) + start * pointer),
                           ctypes.c_void_p(ctypes.addressof(self._nargs) + start * ctypes.sizeof(ctypes.c_int)),
                           ctypes.c_void_p(ctypes.addressof(self._args) + start * pointer))
        if failed:
            raise RuntimeError(f"kernel sequence: call {start + failed - 1} has an unsupported number of arguments")
