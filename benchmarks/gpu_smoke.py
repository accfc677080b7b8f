"""The shortest end-to-end check on a CUDA GPU: build a small matmul's untuned program and the
best of an 8-trial tuning job for `Target.cuda()`, run both, compare with numpy.

    python benchmarks/gpu_smoke.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import ansor
from ansor.workloads import make_task


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    task = make_task("matmul", (128, 128, 128), target=ansor.Target.cuda())
    db = str(Path(tempfile.mkdtemp()) / "smoke.db")
    inputs = task.random_inputs(seed=1)
    expected = task.reference_outputs(inputs)[0]
    untuned = ansor.build(task, database=db, quick_trials=0)
    error = float(np.abs(untuned(*inputs) - expected).max())
    print(f"untuned program: max error {error:.2e}; {untuned.time(*inputs) * 1e6:.1f} us", flush=True)
    ansor.tune(task, trials=8, database=db)
    best = ansor.build(task, database=db)
    error_best = float(np.abs(best(*inputs) - expected).max())
    print(f"best of 8 trials: max error {error_best:.2e}; {best.time(*inputs) * 1e6:.1f} us", flush=True)
    return 0 if max(error, error_best) < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
