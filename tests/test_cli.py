"""The command line: help, a tiny real tuning job, show, export/import, clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ansor.cli import main
from ansor.database import Database


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
    assert "numpy" in out and "ansor (best record)" in out and "GFLOP/s" in out
    assert main(["show", "--database", db, "--schedule"]) == 0
    out = capsys.readouterr().out
    assert "matmul" in out and "cpu" in out
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
