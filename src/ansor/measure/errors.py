"""Error codes of a measurement: a failed candidate is a record, not an exception."""

from __future__ import annotations

import enum
import math

#: The cost of a failed program, everywhere: a run result, a record's median, the tuner's best
#: before any success. Infinite, so that no failure ever compares as fast.
FAILED_COST = math.inf


class MeasureErrorNo(enum.IntEnum):
    """Why a measurement failed; the values match TVM's auto_scheduler so logs stay comparable."""

    NO_ERROR = 0
    INSTANTIATION_ERROR = 1
    COMPILE_HOST = 2
    COMPILE_DEVICE = 3
    RUNTIME_DEVICE = 4
    WRONG_ANSWER = 5
    BUILD_TIMEOUT = 6
    RUN_TIMEOUT = 7
    UNKNOWN_ERROR = 8


class DeviceUnavailableError(RuntimeError):
    """The target's device or its runtime is missing here (no GPU, no OpenCL platform): its
    programs can be generated and built, not run."""
