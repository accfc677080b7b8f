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
    assert main(["show", "--database", db, "--workload", "conv"]) == 1
    assert f"no workload matches 'conv' (2 workloads in {db})" in capsys.readouterr().err
