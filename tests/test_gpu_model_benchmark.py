"""benchmarks/gpu_model.py without a GPU: its arguments, and --dry-run, which builds the CUDA
model (every subgraph a kernel, one driver) and nvcc-compiles it where nvcc is installed. The
timed run needs a CUDA GPU."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import load_benchmark

pytest.importorskip("torch")


def _script():
    return load_benchmark("gpu_model")


def test_arguments_default_to_resnet18_on_sm_90_and_refuse_unknown_models():
    script = _script()
    args = script.parse_args([])
    assert (args.model, args.arch, args.trials) == ("resnet18", "sm_90", 0)
    for bad in (["--model", "vgg"], ["--rounds", "0"], ["--trials", "-1"]):
        with pytest.raises(SystemExit):
            script.parse_args(bad)


def test_dry_run_builds_and_compiles_the_cuda_model(tmp_path):
    rows = _script().main(["--dry-run", "--model", "tiny", "--out", str(tmp_path),
                           "--database", str(tmp_path / "m.db")])
    assert len(rows) == 1 and rows[0]["tasks"] >= 2 and rows[0]["launches"] >= rows[0]["tasks"]
    assert [json.loads(line) for line in (tmp_path / "gpu_model.jsonl").read_text().splitlines()] == rows
    if shutil.which("nvcc"):
        assert rows[0]["nvcc"] == "ok"
