"""ansor: an auto-scheduler for tensor programs, after the Ansor paper (OSDI 2020).

Declare a computation with `ansor.te`, wrap it in a `Task`, `tune` it, and `build` the best
program found as a callable `Kernel`; or import a model (`ansor.graph.from_torch`, `from_onnx`),
`tune` its fused subgraphs together and `build` it as a callable `CompiledModel`.

The names below are imported on first use, so that `import ansor.cli` (the command line) starts
quickly and a Ctrl-C during start-up finds the command's own handler already in place.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
"""The package version (as in pyproject.toml); `ansor --version` prints it."""

#: public name -> (module, attribute); attribute None: the module itself
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "te": ("ansor.te", None),
    "ComputeDAG": ("ansor.dag", "ComputeDAG"),
    "Database": ("ansor.store", "Database"),
    "Record": ("ansor.records", "Record"),
    "RecordStore": ("ansor.records", "RecordStore"),
    "default_database_path": ("ansor.store", "default_database_path"),
    "Kernel": ("ansor.kernel", "Kernel"),
    "build": ("ansor.api", "build"),
    "ScheduleError": ("ansor.schedule", "ScheduleError"),
    "State": ("ansor.schedule", "State"),
    "Target": ("ansor.target", "Target"),
    "Task": ("ansor.task", "Task"),
    "TuneOptions": ("ansor.tuning.options", "TuneOptions"),
    "TuneResult": ("ansor.tuning.task_tuner", "TuneResult"),
    "tune": ("ansor.api", "tune"),
    "visualize": ("ansor.api", "visualize"),
    "graph": ("ansor.graph", None),
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ansor' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
