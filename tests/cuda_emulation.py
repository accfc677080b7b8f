"""Runs a generated CUDA program on the CPU (`cuda_emulation.h`, compiled by g++): a check of
the text's arithmetic and indexing where there is no GPU, against numpy. It says nothing of
speed, and runs a block's threads truly concurrently only as far as the CPU does."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from ansor.measure.gpu_module import GPUModule

HEADER = Path(__file__).with_name("cuda_emulation.h")


def emulator_available() -> bool:
    return shutil.which("g++") is not None


def run_emulated(source: str, inputs: list[np.ndarray], tmp_path: Path) -> list[np.ndarray]:
    """The outputs of `source`'s kernels run in launch order on `inputs` (bfloat16 as its bits)."""
    module = GPUModule.parse(source)
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in ("mma.h", "cuda_fp16.h", "cuda_bf16.h"):
        (stubs / name).write_text("")
    buffers = {b.name: b for b in module.buffers}
    arrays = {}
    for buf, array in zip(module.inputs, inputs):
        arrays[buf.name] = np.ascontiguousarray(array)
    for b in module.buffers:
        if b.name not in arrays:
            arrays[b.name] = np.zeros(b.shape, b.np_dtype)
    names = list(buffers)
    lines = ["#include <cstdio>", "#include <fstream>", "#include <iterator>",
             "struct emu_ptr { void* p; template <class T> operator T*() const { return (T*)p; } };",
             "int main(int argc, char** argv) {",
             f"  std::vector<std::vector<char>> data({len(names)});",
             f"  for (int i = 0; i < {len(names)}; ++i) {{ std::ifstream f(argv[i + 1], std::ios::binary); "
             "data[i].assign(std::istreambuf_iterator<char>(f), {}); }"]
    for k in module.kernels:
        args = ", ".join(f"emu_ptr{{data[{names.index(a)}].data()}}" for a in k.args)
        lines.append(f"  emu_launch([&] {{ {k.name}({args}); }}, emu_dim3{{{k.grid[0]}, {k.grid[1]}, 1}}, "
                     f"{k.block[0] * k.block[1] * k.block[2]});")
    lines += [f"  for (int i = 0; i < {len(names)}; ++i) {{ std::ofstream f(argv[i + 1], std::ios::binary); "
              "f.write(data[i].data(), data[i].size()); }", "  return 0;", "}"]
    program = tmp_path / "emulated.cpp"
    program.write_text(source + "\n" + "\n".join(lines) + "\n")
    binary = tmp_path / "emulated"
    done = subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-w", "-include", str(HEADER), "-I", str(stubs),
                           "-o", str(binary), str(program)], capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    paths = []
    for name in names:
        path = tmp_path / f"{name}.bin"
        path.write_bytes(arrays[name].tobytes())
        paths.append(str(path))
    subprocess.run([str(binary), *paths], check=True, timeout=600)
    return [np.frombuffer(Path(paths[names.index(b.name)]).read_bytes(), b.np_dtype).reshape(b.shape)
            for b in module.outputs]
