"""benchmarks/dynamic_lengths.py at tiny sizes: the decoder block built once over a dynamic
sequence length, served at lengths between its buckets, equal to PyTorch eager, nothing compiled
for the new lengths (correctness only; the timings of one round are not looked at)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")


@pytest.fixture()
def script(monkeypatch):
    """The script imported as a module of its folder (its `common` beside it; its dataclasses
    need the module registered), removed again after the test."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    yield importlib.import_module("dynamic_lengths")
    sys.modules.pop("dynamic_lengths", None)


def test_block_served_between_its_buckets_matches_pytorch(script, tmp_path):
    lengths = (7, 23)
    served = script.serve_lengths(width=32, heads=4, max_length=32, lengths=lengths, database=str(tmp_path / "d.db"),
                                  quick_seconds=0, rounds=1, min_repeat_s=0.0, log=lambda *a, **k: None)
    assert [b.sizes["seq"] for b in served.compiled.buckets] == [16, 32]
    assert [(r["length"], r["bucket"]) for r in served.rows] == [(7, 16), (23, 32)]
    assert all(r["error"] < script.TOLERANCE for r in served.rows)
    assert all(r["compiled_while_serving"] == 0 and r["imported_while_serving"] == 0 for r in served.rows)
    assert served.compiled_at_build > 0  # the counter sees the build's compiles
    rng = np.random.default_rng(1)
    for length in (*lengths, 1, 16, 17, 32):
        x = rng.standard_normal((1, length, 32)).astype(np.float32)
        with torch.no_grad():
            want = served.block(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(served.compiled(x), want, rtol=1e-4, atol=1e-5, err_msg=f"length {length}")


def test_the_block_is_causal(script):
    """A later position never changes an earlier one's output (the mask the padding relies on)."""
    block = script.decoder_block(16, 2)
    x = torch.randn(1, 9, 16)
    y = x.clone()
    y[0, 5:] = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(block(x)[0, :5], block(y)[0, :5])


def test_arguments_refuse_bad_values(script):
    assert script.parse_args([]).lengths == "17,64,200,511"
    for bad in (["--rounds", "0"], ["--trials-per-task", "-1"]):
        with pytest.raises(SystemExit):
            script.parse_args(bad)
    with pytest.raises(ValueError, match="must lie in 1..32"):
        script.serve_lengths(width=16, heads=2, max_length=32, lengths=(40,))
