"""benchmarks/gpu_tensorcore.py without a GPU: its arguments, and --dry-run's sampled template
programs (compiled by nvcc where it is installed). The timed run needs a CUDA GPU."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import load_benchmark



def _script():
    return load_benchmark("gpu_tensorcore")


def test_arguments_default_to_the_4096_cube_and_refuse_unknown_types():
    script = _script()
    args = script.parse_args([])
    assert (args.size, args.dtypes, args.arch) == (4096, ["float16", "float32"], "sm_90")
    assert script.parse_args(["--dtypes", "bfloat16, float32", "--trials", "9"]).dtypes == ["bfloat16", "float32"]
    for bad in (["--dtypes", "float64"], ["--size", "100"], ["--trials", "0"]):
        with pytest.raises(SystemExit):
            script.parse_args(bad)


def test_dry_run_samples_template_programs_and_writes_json_lines(tmp_path):
    rows = _script().main(["--dry-run", "--size", "512", "--programs", "2", "--dtypes", "float16,float32",
                           "--out", str(tmp_path)])
    assert {r["dtype"] for r in rows} == {"float16", "float32"} and len(rows) == 4
    # sm_90 (the default): Hopper's warpgroup products for 16-bit operands, FMA for float32
    assert all(r["program"].startswith(("wgmma_m64nNk16_f16_f32", "fma_f32")) for r in rows)
    written = [json.loads(line) for line in (tmp_path / "gpu_tensorcore.jsonl").read_text().splitlines()]
    assert written == rows
    if shutil.which("nvcc"):
        assert all(r["nvcc"] == "ok" for r in rows), rows
