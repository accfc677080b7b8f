"""Race and memory checking of generated OpenCL programs on Oclgrind, the OpenCL simulator.

PoCL runs a program with a missing barrier, a barrier under a divergent branch or a `__local`
overrun and still gets the right answer; Oclgrind reports each with its source line. It is
slow (seconds per small launch): check small sizes. Oclgrind reads its settings from the
environment when its platform is first used, and exits 0 whatever it finds, so each check runs
in a fresh Python process and the log it writes is the verdict.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ansor.process_lifetime import child_preexec_bound_to_this_thread

from .gpu_module import GPUModule
from .opencl import opencl_platforms

OCLGRIND_PLATFORM = "Oclgrind"
MAX_ERRORS = 3  # Oclgrind's report of one race repeats for many addresses; a few say enough

# Runs the program once in the fresh process, importing ansor.measure without the package
# __init__ files (as the measurement worker does): only numpy and pyopencl are needed.
_RUN_ONCE = """\
import sys, types
package_dir, work_dir, n_inputs = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name, path in (("ansor", package_dir), ("ansor.measure", package_dir + "/measure")):
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module
import numpy as np
from ansor.measure.opencl import OpenCLKernel
kernel = OpenCLKernel(work_dir + "/program.cl", platform=sys.argv[4])
inputs = [np.load(f"{work_dir}/input{i}.npy", allow_pickle=False) for i in range(n_inputs)]
outputs = [np.zeros(b.shape, b.np_dtype) for b in kernel.module.outputs]
kernel(*inputs, *outputs)
kernel.close()
"""


def oclgrind_available() -> bool:
    """Whether pyopencl sees the Oclgrind platform (`pip install 'ansor[opencl]'` brings it)."""
    return OCLGRIND_PLATFORM in opencl_platforms()


def race_check(source: str, inputs: Sequence[np.ndarray], timeout: float = 120) -> str:
    """Oclgrind's log of one run of the OpenCL program on `inputs` ('' = clean): data races,
    work-group divergence at barriers, out-of-bounds accesses, with source lines.

    A run that fails without a report (the program does not build, say) raises RuntimeError;
    one that outlasts `timeout` seconds raises TimeoutError unless it has reported already.
    """
    module = GPUModule.parse(source)
    if module.language != "opencl":
        raise ValueError(f"Oclgrind runs OpenCL programs, not {module.language}")
    module.check_arguments([*inputs, *(np.zeros(b.shape, b.np_dtype) for b in module.outputs)])
    package_dir = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory(prefix="ansor-oclgrind-") as work_dir:
        Path(work_dir, "program.cl").write_text(source)
        for index, array in enumerate(inputs):
            np.save(os.path.join(work_dir, f"input{index}.npy"), np.ascontiguousarray(array),
                    allow_pickle=False)
        log_path = os.path.join(work_dir, "oclgrind.log")
        # built from source every time: a program from pyopencl's binary cache has no source
        # text for Oclgrind to quote beside the line numbers
        env = dict(os.environ, OCLGRIND_DATA_RACES="1", OCLGRIND_LOG=log_path,
                   OCLGRIND_MAX_ERRORS=str(MAX_ERRORS), PYOPENCL_NO_CACHE="1")
        command = [sys.executable, "-c", _RUN_ONCE, package_dir, work_dir, str(len(inputs)),
                   OCLGRIND_PLATFORM]
        try:
            proc = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=timeout,
                                  preexec_fn=child_preexec_bound_to_this_thread())
        except subprocess.TimeoutExpired:
            log = _read(log_path)
            if log:
                return log + f"\n(the Oclgrind run was stopped after {timeout:g} s)\n"
            raise TimeoutError(f"the Oclgrind run exceeded {timeout:g} s without a report; "
                               f"try smaller sizes") from None
        log = _read(log_path)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip()[-2000:]
            if log:
                return log + f"\n(the run then failed with exit code {proc.returncode}: {tail})\n"
            raise RuntimeError(f"the Oclgrind run failed (exit code {proc.returncode}):\n{tail}")
        return log


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return ""
