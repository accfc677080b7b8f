"""The command line: help, a tiny real tuning job, show, export/import, clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ansor.cli import main
from ansor.records import Record
from ansor.store import Database


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ANSOR_DB", str(tmp_path / "default.db"))


def test_help_explains_the_tool():
    out = subprocess.run([sys.executable, "-m", "ansor.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for word in ("tune", "show", "workloads", "examples"):
        assert word in out.stdout


def test_tune_show_export_import(tmp_path, capsys):
    db = str(tmp_path / "cli.db")
    assert main(["tune", "matmul", "--shape", "32,32,32", "--trials", "4", "--database", db, "--quiet",
                 "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "numpy" in out and "GFLOP/s" in out
    assert main(["show", "--database", db, "--schedule"]) == 0
    out = capsys.readouterr().out
    assert "matmul 32x32x32" in out and "cpu" in out
    assert any(line.lstrip().startswith(("for ", "parallel ")) for line in out.splitlines())  # a loop nest
    jsonl = str(tmp_path / "records.jsonl")
    assert main(["export", jsonl, "--database", db]) == 0
    db2 = str(tmp_path / "other.db")
    assert main(["import", jsonl, "--database", db2]) == 0
    with Database(db) as d:
        assert len({r.state_key for r in d.records()}) == 4  # 4 trials (and their confirmations)
        n = d.count()
    assert f"imported {n} new records" in capsys.readouterr().out


def test_tune_other_operator(tmp_path, capsys):
    db = str(tmp_path / "c.db")
    assert main(["tune", "conv2d", "--shape", "1,4,8,8,4,3,3", "--padding", "1", "--trials", "3",
                 "--database", db, "--quiet", "--no-baseline"]) == 0
    assert "conv2d" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["tune", "nosuchop"], "unknown workload"),
    (["tune", "matmul", "--shape", "4,4"], "M,N,K"),
])
def test_bad_arguments_give_clear_errors(argv, words, capsys):
    assert main(argv + ["--trials", "0", "--quiet"]) == 2
    assert words in capsys.readouterr().err


def test_workloads_listing(capsys):
    assert main(["workloads"]) == 0
    out = capsys.readouterr().out
    assert "conv2d" in out and "N,C,H,W,O,KH,KW" in out


def test_costmodel_eval_reports_ranking_quality(tmp_path, capsys):
    db = str(tmp_path / "cm.db")
    for argv in (["tune", "matmul", "--shape", "32,32,32"], ["tune", "conv2d", "--shape", "1,4,8,8,4,3,3"]):
        assert main(argv + ["--trials", "16", "--database", db, "--quiet", "--no-baseline",
                            "--policy", "sketch.random", "--per-round", "16"]) == 0
    capsys.readouterr()
    assert main(["costmodel", "eval", "--database", db]) == 0
    out = capsys.readouterr().out
    assert "32 programs of 2 workloads" in out
    for word in ("pairwise_accuracy", "topk_recall", "r2"):
        assert word in out


def test_costmodel_info_says_what_the_shipped_model_learned_from(capsys):
    from ansor.costmodel.pretrained import provenance

    info = provenance()
    assert info is not None, "the package ships a pretrained CPU model"
    assert main(["costmodel", "info"]) == 0
    out = capsys.readouterr().out
    assert f"{info['programs']}" in out and info["target"] in out and "held_out_scores" in out


# ---------------------------------------------------------------- conventions


def _parsers(parser=None, prefix=("ansor",)):
    """Every (sub)command parser with its command words."""
    import argparse

    from ansor.cli import build_parser

    parser = parser or build_parser()
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, prefix + (name,))


def test_every_option_states_its_default():
    missing = []
    for words, parser in _parsers():
        for action in parser._actions:
            if not action.option_strings or action.dest in ("help", "version"):
                continue
            if "default" not in (action.help or ""):
                missing.append(f"{' '.join(words)} {action.option_strings[0]}")
    assert missing == []


def test_help_output_shows_no_doubled_percent_signs():
    for words, parser in _parsers():
        text = parser.format_help()
        assert "%%" not in text, " ".join(words)
    out = subprocess.run([sys.executable, "-m", "ansor.cli", "costmodel", "eval", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "80%" in out.stdout and "%%" not in out.stdout


@pytest.mark.parametrize("shape, words", [
    ("-4,64,64", "dimension 1 is -4"),
    ("64,,64", "field 2 is empty"),
    ("64,x,64", "'x' is not an integer"),
    ("64,0,64", "dimension 2 is 0"),
])
def test_bad_shapes_say_what_is_wrong(shape, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sketches", "matmul", "--shape", shape])
    assert exit_.value.code == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("argv, takes", [
    (["tune", "matmul", "--padding", "1", "--trials", "0", "--quiet"], "takes no options"),
    (["sketches", "matmul", "--stride", "2"], "takes no options"),
    (["sketches", "max_pool2d", "--shape", "1,2,8,8,3", "--dilation", "2"], "takes --stride, --padding"),
])
def test_an_option_the_workload_does_not_take_is_an_error(argv, takes, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "does not take --" in err and takes in err


def test_bare_command_prints_usage_to_stderr():
    out = subprocess.run([sys.executable, "-m", "ansor.cli"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "usage: ansor" in out.stderr and out.stdout == ""


@pytest.mark.parametrize("argv", [["show"], ["show", "--schedule"], ["export", "OUT"], ["costmodel", "eval"]])
def test_read_only_commands_create_nothing(argv, tmp_path, capsys):
    out_file = str(tmp_path / "out.jsonl")
    argv = [out_file if a == "OUT" else a for a in argv]
    for db in (tmp_path / "no" / "such" / "dir" / "x.db", tmp_path / "missing.db"):
        assert main(argv + ["--database", str(db)]) == 2
        err = capsys.readouterr().err
        assert str(db) in err and "no records database" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_show_with_a_missing_default_database_creates_nothing(tmp_path):
    import os

    env = dict(os.environ, ANSOR_DB=str(tmp_path / "no" / "such" / "dir" / "x.db"))
    out = subprocess.run([sys.executable, "-m", "ansor.cli", "show"], capture_output=True, text=True, env=env)
    assert out.returncode != 0 and "no records database" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_show_filters_by_readable_name_and_says_when_nothing_matches(tmp_path, capsys):
    from ansor.workloads import make_task

    db = str(tmp_path / "f.db")
    with Database(db) as d:
        for name, shape in (("matmul", (64, 32, 16)), ("softmax", (8, 32))):
            task = make_task(name, shape)
            d.add_workload(task.workload_key, task.describe(), task.flop)
            d.add_records([Record(task.workload_key, task.target.key, [], name, (1e-3, 2e-3), 0)])
    assert main(["show", "--database", db, "--workload", "MATMUL 64x32"]) == 0
    out = capsys.readouterr().out
    assert "matmul 64x32x16" in out and "softmax" not in out
    assert main(["show", "--database", db, "--workload", "conv"]) == 2  # 1 is a wrong result only
    assert f"no workload matches 'conv' (2 workloads in {db})" in capsys.readouterr().err


# ---------------------------------------------------------------- failures: one line, exit 2


def _one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ansor"), err
    assert "Traceback" not in err
    return lines[0]


def _onnx_file(path, op: str = "Relu") -> str:
    """A MatMul followed by `op` (an operator ansor imports, or one it does not) as an .onnx file."""
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((16, 8)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node(op, ["y"], ["z"])], "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


@pytest.mark.parametrize("command", ["run-model", "tune-model", "compare"])
@pytest.mark.parametrize("content", [b"hello, not a model\n", b"\x08\x96\x01\xff\xff\xff"])
def test_a_file_that_is_not_onnx_is_one_line_and_exit_2(command, content, tmp_path, capsys):
    pytest.importorskip("onnx")
    path = tmp_path / "x.onnx"
    path.write_bytes(content)
    db = tmp_path / "r.db"
    Database(str(db)).close()
    assert main([command, str(path), "--database", str(db)]) == 2
    assert "x.onnx" in _one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("command", ["tune-model", "run-model", "compare"])
def test_an_unsupported_onnx_operator_is_one_line_and_exit_2(command, tmp_path, capsys):
    path = _onnx_file(tmp_path / "m.onnx", "NonZero")
    db = tmp_path / "r.db"
    Database(str(db)).close()
    assert main([command, path, "--database", str(db), *(["--trials", "1"] if command == "tune-model" else [])]) == 2
    assert "'NonZero'" in _one_line_error(capsys.readouterr().err)


def test_unwritable_and_unreadable_paths_are_one_line_and_exit_2(tmp_path, capsys):
    db = str(tmp_path / "r.db")
    with Database(db) as d:
        d.add_records([Record("wk", "cpu", [], "s", (1e-3,), 0)])
    for target in (tmp_path / "no" / "such" / "dir" / "x.jsonl", tmp_path, "/proc/x.jsonl"):
        assert main(["export", str(target), "--database", db]) == 2
        assert str(target) in _one_line_error(capsys.readouterr().err)
    (tmp_path / "d.onnx").mkdir()
    assert main(["run-model", str(tmp_path / "d.onnx"), "--database", db]) == 2
    assert "d.onnx" in _one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("shape", ["99999999,99999999,99999999", "4000000,4000000,8"])
def test_a_shape_too_large_for_the_memory_is_one_line_and_creates_nothing(shape, tmp_path, capsys):
    db = tmp_path / "r.db"
    assert main(["tune", "matmul", "--shape", shape, "--database", str(db), "--quiet"]) == 2
    assert "out of memory" in _one_line_error(capsys.readouterr().err)
    assert not db.exists()


def _raises(exc: BaseException):
    def command(args):
        raise exc
    return command


def _anticipated():
    from google.protobuf.message import DecodeError

    from ansor.graph.ir import GraphError
    from ansor.graph.torch_importer import UnsupportedOperatorError
    from ansor.measure.build import CompilerNotFoundError
    from ansor.measure.errors import DeviceUnavailableError

    return [MemoryError("Unable to allocate 71.1 PiB for an array"), PermissionError(13, "Permission denied", "/x"),
            IsADirectoryError(21, "Is a directory", "/tmp"), DecodeError("Wire format was corrupt"),
            UnsupportedOperatorError("unsupported ONNX operator 'Hardmax'"), GraphError("value %3 has no producer"),
            ValueError("two\nlines"), OverflowError("cannot convert float infinity to integer"),
            DeviceUnavailableError("no CUDA device"), CompilerNotFoundError("no C compiler 'gcc'"),
            ModuleNotFoundError("No module named 'onnx'", name="onnx")]


@pytest.mark.parametrize("exc", _anticipated(), ids=lambda e: type(e).__name__)
def test_every_anticipated_error_is_one_line_and_exit_2(exc, monkeypatch, capsys):
    monkeypatch.setattr("ansor.cli.cmd_workloads", _raises(exc))
    assert main(["workloads"]) == 2
    assert _one_line_error(capsys.readouterr().err).startswith("ansor: error: ")


def test_a_wrong_result_is_exit_1_and_a_bug_keeps_its_traceback(monkeypatch, capsys):
    from ansor.compare import WrongResultError

    monkeypatch.setattr("ansor.cli.cmd_workloads", _raises(WrongResultError("ansor disagrees with onnxruntime")))
    assert main(["workloads"]) == 1
    assert "disagrees with onnxruntime" in _one_line_error(capsys.readouterr().err)
    monkeypatch.setattr("ansor.cli.cmd_workloads", _raises(ZeroDivisionError("a bug")))
    with pytest.raises(ZeroDivisionError):
        main(["workloads"])


# ---------------------------------------------------------------- --trials: programs this run measures


def test_tune_with_zero_trials_measures_and_records_nothing(tmp_path, capsys):
    db = str(tmp_path / "z.db")
    assert main(["tune", "matmul", "--shape", "16,16,16", "--trials", "0", "--database", db, "--quiet",
                 "--no-baseline"]) == 0
    out = capsys.readouterr().out
    assert "0 programs measured" in out and "untuned default schedule (no record)" in out
    with Database(db) as d:
        assert d.count() == 0


def test_tune_says_how_its_records_add_up_and_gives_one_best(tmp_path, capsys):
    import re

    db = str(tmp_path / "t.db")
    assert main(["tune", "matmul", "--shape", "32,32,32", "--trials", "6", "--database", db, "--quiet",
                 "--no-baseline", "--seed", "0"]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())  # table cells wrap
    with Database(db) as d:
        n = d.count()
    assert n > 6
    assert "6 programs measured in " in out
    assert f"the {n - 6} fastest measured again to confirm: {n} records added" in out
    assert "matmul 32x32x32" in out and "[32, 32]" not in out
    best = re.search(r"best in the database: ([0-9.]+) GFLOP/s", out).group(1)
    assert f"the database's best record ({best} GFLOP/s when measured)" in out
    assert main(["show", "--database", db]) == 0
    shown = capsys.readouterr().out
    assert re.search(rf"│ +{re.escape(best)} │", shown), shown


def test_tune_model_trials_are_what_this_run_measures(tmp_path, capsys):
    path = _onnx_file(tmp_path / "m.onnx")
    db = str(tmp_path / "m.db")
    keys = []
    for _ in range(2):
        assert main(["tune-model", path, "--trials", "2", "--database", db, "--quiet", "--seed", "0"]) == 0
        assert "2 programs measured" in " ".join(capsys.readouterr().out.split())
        with Database(db) as d:
            keys.append(len({r.state_key for r in d.records()}))
    assert keys == [2, 4]


def test_tune_model_and_run_model_for_fewer_cores(tmp_path, capsys, monkeypatch):
    """--cores tunes a model for a target of fewer cores (what each node of a cluster offers);
    run-model --cores builds with those records, run-model without it has none of its target."""
    from ansor.target import Target

    monkeypatch.setenv("ANSOR_MODEL_QUICK_SECONDS", "0")  # run-model gives a kernel without records no program
    path = _onnx_file(tmp_path / "m.onnx")
    db = str(tmp_path / "m.db")
    assert main(["tune-model", path, "--cores", "1", "--trials", "2", "--database", db, "--quiet", "--seed", "0"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert Target.host(num_cores=1).key in out and f"ansor run-model {path} --cores 1" in out
    with Database(db) as d:
        assert {r.target_key for r in d.records()} == {Target.host(num_cores=1).key}
    assert main(["run-model", path, "--cores", "1", "--database", db, "--rounds", "1"]) == 0
    assert "(1 tuned)" in " ".join(capsys.readouterr().out.split())
    if Target.host().num_cores > 1:
        assert main(["run-model", path, "--database", db, "--rounds", "1"]) == 0
        assert "(0 tuned)" in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------- failed commands create nothing


@pytest.mark.parametrize("argv", [
    ["import", "missing.jsonl"],
    ["import", "BAD"],      # a file that is not JSON lines: the database made for it is removed again
    ["import", "DIR"],
    ["tune", "matmul", "--shape", "8,8,8", "--transfer-from", "SELF", "--quiet"],
])
def test_a_failed_command_leaves_no_database(argv, tmp_path, capsys):
    from ansor.target import Target

    (tmp_path / "bad.jsonl").write_text("{not json\n")
    (tmp_path / "dir").mkdir()
    swap = {"BAD": str(tmp_path / "bad.jsonl"), "DIR": str(tmp_path / "dir"), "SELF": Target.host().key,
            "missing.jsonl": str(tmp_path / "missing.jsonl")}
    db = tmp_path / "new.db"
    assert main([swap.get(a, a) for a in argv] + ["--database", str(db)]) == 2
    _one_line_error(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == ["bad.jsonl", "dir"]


def test_a_gpu_target_without_its_device_creates_no_database(tmp_path, capsys):
    from ansor.measure.errors import DeviceUnavailableError
    from ansor.measure.cuda import CudaRunner

    try:
        CudaRunner().close()
        pytest.skip("this machine has a CUDA device")
    except DeviceUnavailableError:
        pass
    db = tmp_path / "g.db"
    assert main(["tune", "matmul", "--shape", "64,64,64", "--target", "cuda", "--database", str(db)]) == 2
    assert "no CUDA device" in _one_line_error(capsys.readouterr().err)
    assert not db.exists()


@pytest.mark.parametrize("argv", [
    ["sample", "matmul", "-n", "-1"], ["sample", "matmul", "-n", "0"], ["sample", "matmul", "--seed", "-1"],
    ["tune", "matmul", "--per-round", "0"], ["tune", "matmul", "--trials", "-1"], ["tune", "matmul", "--seed", "-3"],
    ["tune", "matmul", "--timeout", "0"], ["tune", "matmul", "--cores", "0"],
    ["tune", "matmul", "--transfer-programs", "-1"], ["tune-model", "m.onnx", "--trials", "-5"],
    ["run-model", "m.onnx", "--rounds", "0"], ["compare", "matmul", "--rounds", "-1"],
    ["costmodel", "eval", "--test-fraction", "1.5"], ["tune", "matmul", "--time-budget", "-2"],
])
def test_negative_and_zero_counts_are_refused_before_anything_runs(argv, tmp_path, capsys):
    db = tmp_path / "n.db"
    with pytest.raises(SystemExit) as exit_:
        main(argv + ["--database", str(db)] if argv[0] != "sample" else argv)
    assert exit_.value.code == 2
    assert "must " in _one_line_error(capsys.readouterr().err)
    assert not db.exists()


# ---------------------------------------------------------------- help


def test_every_command_has_a_help_line_and_a_description():
    import argparse

    missing = []
    for words, parser in _parsers():
        if len(words) > 1 and not parser.description:
            missing.append(" ".join(words) + " (description)")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                listed = {a.dest for a in action._choices_actions if a.help}
                missing += [f"{' '.join(words)} {name} (help)" for name in action.choices if name not in listed]
    assert missing == []


# ---------------------------------------------------------------- progress


def _fake_tuner(task, trials: int, best_cost: float):
    from types import SimpleNamespace

    from ansor.tuning.task_tuner import TuneResult

    result = TuneResult(task, best_cost=best_cost, trials=trials)
    return SimpleNamespace(task=task, result=result, policy=None, job_rounds=1, weight=1.0, best_cost=best_cost)


def test_progress_of_several_tasks_shows_the_job_total_and_no_fake_denominators():
    import io

    from rich.console import Console

    from ansor.report import TuneProgress
    from ansor.workloads import make_task

    a, b = _fake_tuner(make_task("matmul", (64, 64, 64)), 0, 1e-6), _fake_tuner(make_task("softmax", (8, 32)), 0, 1e-6)
    log = io.StringIO()
    progress = TuneProgress(total=8, stream=log)
    for t in (a, b):
        progress.on_start(t)
    a.result.trials = 3
    progress.on_round_end(a, [])
    line = log.getvalue().strip().splitlines()[-1]
    assert line.startswith("matmul 64x64x64: round 1, 3 programs measured, best so far ") and "job 3/8" in line

    live = io.StringIO()
    progress = TuneProgress(total=8, stream=live)
    progress._console = Console(file=live, force_terminal=True, color_system=None, width=200)
    progress.live = True
    for t in (a, b):
        t.result.trials = 0
        progress.on_start(t)
    progress.on_phase(a, "searching")
    a.result.trials = 4
    progress.on_result(a, None)
    a.result.best_cost = 2e-6  # the leaders measured again: the job's best is their pooled median
    progress.on_end(a)
    progress.on_end(b)
    text = live.getvalue()
    assert "all 2 tasks" in text and "4/8" in text and "4 programs" in text and "/?" not in text
    assert "done" in text and "best 262.1 GFLOP/s" in text  # the final best, not the search's 524.3


# ---------------------------------------------------------------- one path for checked, timed comparisons


def test_run_model_checks_against_onnxruntime_too(tmp_path, monkeypatch, capsys):
    pytest.importorskip("onnxruntime")
    import numpy as np

    path = _onnx_file(tmp_path / "m.onnx")
    db = str(tmp_path / "e.db")
    Database(db).close()
    assert main(["run-model", path, "--database", db, "--rounds", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "checked against the numpy reference executor and onnxruntime" in out and "onnxruntime" in out

    def wrong_onnxruntime(model_path, inputs, notes):
        notes["onnxruntime"] = "a runtime that answers wrongly"
        return lambda: [np.ones((4, 8), "float32") * 7]

    monkeypatch.setattr("ansor.compare._onnxruntime_call", wrong_onnxruntime)
    assert main(["run-model", path, "--database", db, "--rounds", "1"]) == 1
    err = capsys.readouterr().err  # after the build's warning that the kernel is untuned
    failures = [line for line in err.splitlines() if line.startswith("ansor: wrong result: ")]
    assert len(failures) == 1 and "disagrees with onnxruntime" in failures[0] and "Traceback" not in err


def test_an_emulated_gpu_comparison_shows_no_speedups(capsys):
    from ansor.compare import Comparison, Entry, emulation_note
    from ansor.report import console
    from ansor.target import Target

    note = emulation_note(Target.opencl("pocl-cpu"))
    assert note == "PoCL: correctness only, not a speed figure"
    assert emulation_note(Target.cuda("sm_90")) == "" and emulation_note(Target.host()) == ""
    result = Comparison("matmul 64x64x64 on opencl-pocl-cpu", 2 * 64 ** 3,
                        [Entry("ansor", 1e-3, 0.1), Entry("numpy", 1e-5, 0.1)], correctness_only=note)
    console.print(result.table())
    out = capsys.readouterr().out
    assert "speedup" not in out and note in " ".join(out.split())
    assert result.lines() == [note]
