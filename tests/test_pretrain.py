"""The pretraining steps end to end on a corpus small enough for a test: collect (and collect
again, which must find nothing missing), held-out scores, train a model file, score it."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from ansor.cli import main
from ansor.costmodel.model import XGBModel
from ansor.pretrain.collect import collect
from ansor.pretrain.corpus import HELD_OUT, load_corpus, random_workloads, usable_programs
from ansor.pretrain.train import held_out_scores
from ansor.store import open_store
from ansor.workloads import WORKLOADS, make_task

TRIALS = 6  # programs per workload: a few rounds of a small job, seconds each


def test_random_workloads_are_reproducible_distinct_and_never_the_suites():
    drawn = random_workloads(45, seed=3)
    assert drawn == random_workloads(45, seed=3)
    assert drawn != random_workloads(45, seed=4)
    assert len(drawn) == 45
    idents = {(name, shape, tuple(sorted(opts.items()))) for name, shape, opts in drawn}
    assert len(idents) == len(drawn)
    assert not {(name, shape) for name, shape, _ in drawn} & HELD_OUT
    families = {name for name, _, _ in drawn}
    assert families <= set(WORKLOADS)
    assert {"matmul", "conv2d", "depthwise_conv2d", "conv2d_transpose", "softmax", "avg_pool2d"} <= families


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A corpus database of two small workloads, its tasks, and the lines its collection logged."""
    path = str(tmp_path_factory.mktemp("pretrain") / "corpus.db")
    tasks = [make_task("matmul", (32, 64, 32)), make_task("softmax", (64, 128))]
    lines: list[str] = []
    store, _ = open_store(path)
    with store:
        tuned = collect(tasks, store, trials=TRIALS, seed=0, log=lines.append)
        counts = [store.count(t.workload_key, t.target.key) for t in tasks]
    assert tuned == 2 and min(counts) >= TRIALS
    return path, tasks, lines


def test_collect_resumes_with_nothing_missing(corpus):
    path, tasks, lines = corpus
    assert lines[0] == f"2 workloads in the corpus, 2 with fewer than {TRIALS} records"
    again: list[str] = []
    store, _ = open_store(path)
    with store:
        before = store.count()
        assert collect(tasks, store, trials=TRIALS, log=again.append) == 0
        assert store.count() == before
    assert again == [f"2 workloads in the corpus, 0 with fewer than {TRIALS} records"]


def test_held_out_scores_rank_each_workload_with_a_model_of_the_other(corpus):
    path, tasks, _ = corpus
    data, _ = _corpus(path)
    scores = held_out_scores(data, folds=2, seed=0, log=lambda line: None, min_programs=4)
    assert {row["workload"] for row in scores["workloads"]} == {t.workload_key for t in tasks}
    for side in ("pretrained", "own_records"):
        assert 0.0 <= scores[side]["pairwise_accuracy"] <= 1.0
    assert held_out_scores(data, folds=2, seed=0, log=lambda line: None, min_programs=100) is None


def test_train_then_score_a_model_file(corpus, tmp_path, capsys):
    path, _, _ = corpus
    model_path, info_path = tmp_path / "corpus.model.json", tmp_path / "provenance.json"
    assert main(["pretrain", "train", "--databases", path, "--folds", "2", "--rounds", "40",
                 "--output", str(model_path), "--json", str(info_path)]) == 0
    info = json.loads(info_path.read_text())
    assert info["workloads"] == 2 and info["programs"] >= TRIALS
    assert info["held_out_scores"] is None  # too few programs per workload to score
    assert 0 < info["rounds"] <= 40

    model = XGBModel.load(model_path)
    data, _ = _corpus(path)
    usable = np.flatnonzero(usable_programs(data))
    pred = model.predict([data.features[i] for i in usable])
    assert pred.shape == (usable.size,) and np.isfinite(pred).all() and np.ptp(pred) > 0

    capsys.readouterr()
    assert main(["pretrain", "score", "--databases", path, "--models", str(model_path)]) == 0
    out = capsys.readouterr().out
    match = re.search(rf"{re.escape(str(model_path))}: pairwise accuracy beyond 5% ([0-9.]+);", out)
    assert match, out
    assert 0.0 <= float(match.group(1)) <= 1.0
    assert "matmul 32x64x32" in out and "softmax 64x128" in out


def test_train_refuses_a_database_without_records(tmp_path, capsys):
    empty = tmp_path / "empty.db"
    open_store(str(empty))[0].close()
    assert main(["pretrain", "train", "--databases", str(empty), "--folds", "1"]) == 2
    assert "holds no records" in capsys.readouterr().err


def _corpus(path):
    store, _ = open_store(path, create=False)
    with store:
        return load_corpus([store])
