"""`ansor compare` and `ansor.compare`: one checked table, timed in turns; missing or failing
baselines are notes, a wrong ansor result stops the comparison. Nothing here asserts a timing."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from ansor.cli import main
from ansor.compare import WrongResultError, compare_calls, compare_model, torch_calls

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ANSOR_DB", str(tmp_path / "default.db"))


def assert_png(path) -> None:
    """A real PNG: its signature, and matplotlib reads it as an image with pixels."""
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    pixels = matplotlib.image.imread(str(path))
    assert pixels.ndim == 3 and pixels.shape[0] > 50 and pixels.shape[1] > 50


def test_cli_compares_a_tuned_matmul_and_draws_the_chart(tmp_path, capsys):
    db, png = str(tmp_path / "mm.db"), tmp_path / "chart.png"
    assert main(["tune", "matmul", "--shape", "32,32,32", "--trials", "2", "--database", db, "--quiet",
                 "--no-baseline", "--seed", "0"]) == 0
    capsys.readouterr()
    assert main(["compare", "matmul", "--shape", "32,32,32", "--database", db, "--rounds", "2",
                 "--skip", "torch.compile", "-o", str(png)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert any(line.split("│")[1].strip() == "ansor" for line in rows)
    assert any(line.split("│")[1].strip() == "numpy" for line in rows)
    assert "the database's best record" in out and "GFLOP/s" in out
    assert "ansor vs numpy: ansor " in out
    assert "timed in turns (2 rounds, medians)" in out
    assert_png(png)


def test_cli_refuses_workload_options_for_a_model_and_unknown_workloads(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    assert main(["compare", str(model), "--shape", "4,4"]) == 2
    assert "--shape" in capsys.readouterr().err
    assert main(["compare", "nosuchop"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "missing.onnx")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_wrong_ansor_result_stops_before_timing():
    ref = [np.ones((4, 4), "float32")]
    with pytest.raises(WrongResultError, match="disagrees with the reference"):
        compare_calls("t", 0, lambda: np.zeros((4, 4), "float32"), ref, {"numpy": lambda: ref[0]})


def test_missing_failing_and_wrong_baselines_are_notes_not_crashes():
    ref = [np.arange(16, dtype="float32").reshape(4, 4)]

    def fails():
        raise RuntimeError("no kernel for this shape")

    result = compare_calls("t", 128.0, lambda: ref[0].copy(), ref,
                           {"absent": None, "fails": fails, "wrong": lambda: ref[0] + 1, "good": lambda: ref[0] * 1},
                           {"absent": "not installed"}, skipped=["earlier: left out"], rounds=2, min_repeat_s=0.001)
    assert [e.name for e in result.entries] == ["ansor", "good"]
    text = "\n".join(result.skipped)
    assert "absent: not installed" in text
    assert "fails: failed (RuntimeError: no kernel for this shape)" in text
    assert "wrong: its output disagrees" in text
    assert "earlier: left out" in text
    assert result.gflops(result.ansor) > 0 and result.speedup(result.entry("good")) > 0
    lines = result.lines()
    assert lines[0].startswith("ansor vs good: ansor ") and any(l.startswith("skipped absent") for l in lines)


def test_without_torch_the_pytorch_rows_are_skipped_with_a_note(monkeypatch):
    monkeypatch.setattr("ansor.compare.torch_available", lambda: False)
    calls, notes = torch_calls(lambda x: x, [np.zeros(3, "float32")])
    assert calls == {"PyTorch eager": None, "torch.compile": None}
    assert "torch is not installed" in notes["PyTorch eager"]
    assert torch_calls(lambda x: x, [], skip=("torch", "torch.compile")) == ({}, {})


def _tiny_onnx(path) -> str:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((16, 8)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def test_compare_model_runs_the_file_with_onnxruntime_and_creates_no_database(tmp_path):
    pytest.importorskip("onnxruntime")
    path = _tiny_onnx(tmp_path / "tiny.onnx")
    db = tmp_path / "missing.db"
    result = compare_model(path, database=str(db), rounds=2)
    assert [e.name for e in result.entries] == ["ansor", "numpy", "onnxruntime"]
    assert "no database" in result.ansor.note and "0 of 1 kernels tuned" in result.ansor.note
    assert any("holds no PyTorch module" in s for s in result.skipped)
    assert result.flop > 0
    assert not db.exists()


def test_compare_model_without_onnxruntime_says_so(tmp_path, monkeypatch):
    path = _tiny_onnx(tmp_path / "tiny.onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    result = compare_model(path, database=str(tmp_path / "missing.db"), rounds=2, skip=("numpy",))
    assert [e.name for e in result.entries] == ["ansor"]
    assert any(s.startswith("onnxruntime: onnxruntime is not installed") for s in result.skipped)


def test_unknown_baselines_to_skip_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown baseline 'tvm'"):
        compare_model(str(tmp_path / "x.onnx"), skip=("tvm",))



def test_timing_in_turns_keeps_each_round_and_pairs_them():
    """Each round's turn is kept; the paired ratio takes a round's two turns together, so a
    round that slows both alike cancels (here the other costs 2x in every round, though the
    rounds' own speeds differ 4x)."""
    from ansor.baselines import Timing, paired_ratio, time_in_turns
    turns = time_in_turns({"a": lambda: None, "b": lambda: None}, rounds=3, min_repeat_s=0.0)
    assert len(turns["a"].runs) == len(turns["b"].runs) == 3
    base = Timing(2.0, 3.0 / 2.0, (1.0, 2.0, 4.0))
    other = Timing(4.0, 6.0 / 4.0, (2.0, 4.0, 8.0))
    assert paired_ratio(other, base) == 2.0 and paired_ratio(base, other) == 0.5


def test_measurements_taken_in_turns_rotate_and_drop_missing_figures():
    """`measure_in_turns` is the one implementation of turns (the suite's timers use it): each
    round starts with the next measurement, a None figure is no figure, and no figure at all
    leaves the measurement out."""
    from ansor.baselines import measure_in_turns

    order: list[str] = []
    figures = {"a": iter([1.0, 3.0, 2.0]), "b": iter([None, 4.0, None])}

    def measure(name):
        def take():
            order.append(name)
            return next(figures[name])
        return take

    turns = measure_in_turns({"a": measure("a"), "b": measure("b"), "c": lambda: None}, rounds=3)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert turns["a"].median == 2.0 and turns["a"].runs == (1.0, 3.0, 2.0) and turns["b"].runs == (4.0,)
    assert "c" not in turns
    with pytest.raises(ValueError, match="at least 1 round"):
        measure_in_turns({"a": lambda: 1.0}, rounds=0)
