"""A generated GPU program as the measurement layer sees it: one source text and its launch plan.

The code generator writes the plan as the source's first line,

    // ansor-launch: {"language": ..., "kernels": [...], "buffers": [...]}

so that a built program (a .cl or .cu file in the build cache) carries everything a loader
needs: which kernels to launch in which order, with which grid and block, on which buffers.
The calling convention matches the CPU one: the caller passes the `input` buffers, then the
`output` buffers, in the order of "buffers"; `temp` buffers are the loader's own device
workspace, allocated once, with no initial contents.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np

# what `codegen.gpu` writes (the same text: tested); not imported from there, so the measurement
# worker, which loads ansor.measure alone, stays free of the compiler's modules
HEADER_PREFIX = "// ansor-launch: "
LANGUAGES = ("opencl", "cuda")
ROLES = ("input", "output", "temp")
#: dtype name -> numpy dtype; bool is one byte on the device (uint8), as numpy stores it
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
    **{name: np.dtype(name) for name in ("int8", "int16", "uint8", "uint16", "uint32", "uint64",
                                         "float16", "bfloat16")},
}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch: grid in blocks (CUDA style), block in threads, buffer names as args,
    and the dynamic shared memory the launch gives each block (bytes; "shared" in the plan)."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[str, ...]
    shared_bytes: int = 0

    @property
    def global_size(self) -> tuple[int, int, int]:
        """OpenCL's global work size: grid * block in each dimension."""
        return tuple(g * b for g, b in zip(self.grid, self.block))  # type: ignore[return-value]

    def to_json(self) -> dict[str, Any]:
        plan = {"name": self.name, "grid": list(self.grid), "block": list(self.block), "args": list(self.args)}
        return {**plan, "shared": self.shared_bytes} if self.shared_bytes else plan


@dataclass(frozen=True)
class GPUBuffer:
    """One buffer of the program: its shape, element type and role (input, output or temp)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.np_dtype.itemsize

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "role": self.role}


LaunchLike = KernelLaunch | Mapping[str, Any]
BufferLike = GPUBuffer | Mapping[str, Any]


@dataclass(frozen=True)
class GPUModule:
    """A whole GPU program: its source (header line included) and its launch plan."""

    language: str
    source: str
    kernels: tuple[KernelLaunch, ...]
    buffers: tuple[GPUBuffer, ...]

    @classmethod
    def parse(cls, source: str) -> GPUModule:
        """Read the launch plan from the source's first line; ValueError says what is wrong."""
        first_line = source.split("\n", 1)[0].rstrip("\r")
        if not first_line.startswith(HEADER_PREFIX):
            shown = first_line if len(first_line) <= 80 else first_line[:77] + "..."
            raise ValueError(f"not a generated GPU program: its first line must start with "
                             f"{HEADER_PREFIX.strip()!r}, found {shown!r}")
        try:
            plan = json.loads(first_line[len(HEADER_PREFIX):])
        except json.JSONDecodeError as err:
            raise ValueError(f"damaged ansor-launch header: {err}") from None
        if not isinstance(plan, dict):
            raise ValueError("damaged ansor-launch header: expected a JSON object")
        language, kernels, buffers = _check_plan(plan.get("language"), plan.get("kernels"),
                                                 plan.get("buffers"))
        return cls(language, source, kernels, buffers)

    @property
    def inputs(self) -> tuple[GPUBuffer, ...]:
        return tuple(b for b in self.buffers if b.role == "input")

    @property
    def outputs(self) -> tuple[GPUBuffer, ...]:
        return tuple(b for b in self.buffers if b.role == "output")

    @property
    def temps(self) -> tuple[GPUBuffer, ...]:
        return tuple(b for b in self.buffers if b.role == "temp")

    @property
    def parameters(self) -> tuple[GPUBuffer, ...]:
        """The buffers a call passes, in calling order: inputs, then outputs."""
        return self.inputs + self.outputs

    def check_arguments(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The call's arrays, checked against the plan (count, dtype, shape; outputs C-contiguous,
        since results are written into them); inputs made contiguous where needed."""
        params = self.parameters
        if len(arrays) != len(params):
            names = ", ".join(b.name for b in params)
            raise TypeError(f"the program takes {len(params)} arrays ({names}), got {len(arrays)}")
        checked = []
        for buffer, array in zip(params, arrays):
            if not isinstance(array, np.ndarray):
                raise TypeError(f"{buffer.role} {buffer.name!r}: expected a numpy array, "
                                f"got {type(array).__name__}")
            if array.dtype != buffer.np_dtype:
                raise TypeError(f"{buffer.role} {buffer.name!r}: expected dtype {buffer.dtype}, "
                                f"got {array.dtype}")
            if tuple(array.shape) != buffer.shape:
                raise ValueError(f"{buffer.role} {buffer.name!r}: expected shape {buffer.shape}, "
                                 f"got {tuple(array.shape)}")
            if buffer.role == "output":
                if not array.flags.c_contiguous or not array.flags.writeable:
                    raise ValueError(f"output {buffer.name!r} must be a writeable C-contiguous array")
            else:
                array = np.ascontiguousarray(array)
            checked.append(array)
        return checked


def launch_header(language: str, kernels: Sequence[LaunchLike], buffers: Sequence[BufferLike]) -> str:
    """The header line (newline included) that starts a generated program; the plan is checked
    here, so a printer bug shows where it is made rather than when the program is loaded."""
    plan_kernels = [k.to_json() if isinstance(k, KernelLaunch) else dict(k) for k in kernels]
    plan_buffers = [b.to_json() if isinstance(b, GPUBuffer) else dict(b) for b in buffers]
    _check_plan(language, plan_kernels, plan_buffers)
    plan = {"language": language, "kernels": plan_kernels, "buffers": plan_buffers}
    return HEADER_PREFIX + json.dumps(plan, separators=(", ", ": ")) + "\n"


def _check_plan(language: Any, kernels: Any, buffers: Any
                ) -> tuple[str, tuple[KernelLaunch, ...], tuple[GPUBuffer, ...]]:
    if language not in LANGUAGES:
        raise ValueError(f"ansor-launch header: language must be one of {', '.join(LANGUAGES)}, "
                         f"got {language!r}")
    if not isinstance(buffers, list):
        raise ValueError("ansor-launch header: 'buffers' must be a list")
    if not isinstance(kernels, list) or not kernels:
        raise ValueError("ansor-launch header: 'kernels' must be a non-empty list")
    parsed_buffers = tuple(_buffer(entry, index) for index, entry in enumerate(buffers))
    names = [b.name for b in parsed_buffers]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"ansor-launch header: buffer names repeat: {', '.join(duplicates)}")
    parsed_kernels = tuple(_kernel(entry, index, set(names)) for index, entry in enumerate(kernels))
    return language, parsed_kernels, parsed_buffers


def _buffer(entry: Any, index: int) -> GPUBuffer:
    where = f"ansor-launch header: buffer {index}"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be an object")
    name, shape, dtype, role = (entry.get(k) for k in ("name", "shape", "dtype", "role"))
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ValueError(f"{where}: name must be an identifier, got {name!r}")
    if not isinstance(shape, (list, tuple)) or not all(_is_int(d) and d >= 0 for d in shape):
        raise ValueError(f"{where} ({name}): shape must be a list of non-negative integers, got {shape!r}")
    if dtype not in DTYPES:
        raise ValueError(f"{where} ({name}): dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if role not in ROLES:
        raise ValueError(f"{where} ({name}): role must be one of {', '.join(ROLES)}, got {role!r}")
    return GPUBuffer(name, tuple(int(d) for d in shape), dtype, role)


def _kernel(entry: Any, index: int, buffer_names: set[str]) -> KernelLaunch:
    where = f"ansor-launch header: kernel {index}"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be an object")
    name, grid, block, args = (entry.get(k) for k in ("name", "grid", "block", "args"))
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise ValueError(f"{where}: name must be an identifier, got {name!r}")
    for label, dims in (("grid", grid), ("block", block)):
        if not isinstance(dims, (list, tuple)) or len(dims) != 3 or not all(_is_int(d) and d >= 1 for d in dims):
            raise ValueError(f"{where} ({name}): {label} must be 3 positive integers, got {dims!r}")
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args):
        raise ValueError(f"{where} ({name}): args must be a list of buffer names, got {args!r}")
    unknown = [a for a in args if a not in buffer_names]
    if unknown:
        raise ValueError(f"{where} ({name}): args name no buffer: {', '.join(unknown)}")
    shared = entry.get("shared", 0)
    if not _is_int(shared) or shared < 0:
        raise ValueError(f"{where} ({name}): shared must be a non-negative integer of bytes, got {shared!r}")
    return KernelLaunch(name, tuple(int(d) for d in grid), tuple(int(d) for d in block),  # type: ignore[arg-type]
                        tuple(args), shared)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class DeviceKernel:
    """What a GPU program's loader shares with the CPU's `KernelLibrary` interface, so the
    worker, `measure_costs` and `Kernel` call every backend's kernels alike. A subclass
    provides `__call__(*arrays)`, `timed(buffers, number)` (device clock) and `close()`."""

    packed_nbytes: tuple[int, ...] = ()  # no packed parameters: prepacking is a CPU layout matter
    has_timer = True  # timed on the device's clock, not by the caller's
    _current: tuple = ()  # the host arrays whose values the device buffers hold now

    def _copy_in(self, checked: list[np.ndarray]) -> None:
        """Copy the checked `(*inputs, *outputs)` into the device buffers (the subclass's API)."""
        raise NotImplementedError

    def _upload(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Check `(*inputs, *outputs)` (or one list of them, KernelLibrary's form) against the
        launch plan and copy them to the device; returns them checked."""
        if len(arrays) == 1 and isinstance(arrays[0], (list, tuple)):
            arrays = arrays[0]
        checked = self.module.check_arguments(arrays)
        self._copy_in(checked)
        self._current = tuple(arrays)
        return checked

    def _upload_for_timing(self, arrays: Sequence[np.ndarray]) -> None:
        """Timed runs need the data on the device, not a new copy for every repeat: the very
        arrays of the last upload are not copied again (a generated kernel's time does not
        depend on the values). Copying 3 x 64 MB for each probe and repeat of a 4096^2 matmul
        took longer than timing it."""
        if len(arrays) == 1 and isinstance(arrays[0], (list, tuple)):
            arrays = arrays[0]
        if len(arrays) != len(self._current) or any(a is not b for a, b in zip(arrays, self._current)):
            self._upload(arrays)

    def time(self, *arrays: np.ndarray, number: int = 1, repeat: int = 3) -> list[float]:
        """Seconds per run, one value per repeat of `number` runs, after one untimed run (a
        first launch may include the device compiler's work)."""
        self.timed(arrays, 1)
        return [self.timed(arrays, number) / number for _ in range(repeat)]

    def packed_buffers(self) -> list[np.ndarray]:
        return []

    def prepack(self, buffers: Sequence[np.ndarray]) -> None:
        """Nothing to pack (KernelLibrary's interface)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
