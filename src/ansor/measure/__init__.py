"""Measurement: compile C source text, then check and time kernels on numpy buffers.

`Builder` turns sources into cached shared libraries; `Runner` checks each library's outputs
against a reference and times it in an isolated worker process. Failures are results with a
`MeasureErrorNo`, never exceptions.
"""

from .build import (
    DEFAULT_CFLAGS,
    Builder,
    BuildResult,
    CompilerNotFoundError,
    check_compiler,
    default_cache_dir,
    default_compiler,
)
from .check import check_outputs, default_tolerances
from .errors import MeasureErrorNo
from .library import KernelLibrary
from ansor.memory import aligned_copy, aligned_empty
from .run import FAILED_COST, Runner, RunResult, evaluate_kernel, time_function
from .timing import TimingPolicy

__all__ = [
    "DEFAULT_CFLAGS",
    "FAILED_COST",
    "BuildResult",
    "Builder",
    "CompilerNotFoundError",
    "KernelLibrary",
    "MeasureErrorNo",
    "RunResult",
    "Runner",
    "TimingPolicy",
    "aligned_copy",
    "aligned_empty",
    "check_compiler",
    "check_outputs",
    "default_cache_dir",
    "default_compiler",
    "default_tolerances",
    "evaluate_kernel",
    "time_function",
]
