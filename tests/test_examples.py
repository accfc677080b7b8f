"""The example scripts run from a fresh checkout at tiny budgets (smoke runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ansor

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_tutorial_3_transfer_runs_and_draws_its_curves(tmp_path):
    host = ansor.Target.host()
    if host.num_cores < 2:
        pytest.skip("target A is this machine on one core: needs two")
    png = tmp_path / "transfer.png"
    out = subprocess.run([sys.executable, str(EXAMPLES / "tutorial_3_transfer.py"), "--shape", "64,64,64",
                          "--trials", "6", "--from-isa", host.isa, "--from-cores", "1", "--plot", str(png)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "trials to reach 95% of the from-scratch best" in out.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
