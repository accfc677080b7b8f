"""Records back into programs: the DAG of a stored workload (its stored computation, else a named
workload's spec) and the program of a record, with one error type for everything that fails."""

from __future__ import annotations

from pathlib import Path

import pytest

import ansor
from ansor import te
from ansor.records import Record
from ansor.store import Database
from ansor.replay import ReplayError, dag_from_description, replay, replay_records, workload_dag
from ansor.schedule.state import State
from ansor.workloads import make_task


def _user_task() -> ansor.Task:
    A = te.placeholder((8, 8), name="A")
    k = te.reduce_axis(8, name="k")
    rowmax = te.compute((8,), lambda i: te.max(A[i, k], axis=k), name="rowmax")
    out = te.compute((8, 8), lambda i, j: te.exp(A[i, j] - rowmax[i]), name="out")
    return ansor.Task([A, out])


def _record(task: ansor.Task, state: State, name: str = "s", cost: float = 1e-3) -> Record:
    return Record(task.workload_key, task.target.key, state.steps_json(), name + state.key()[:20], (cost,), 0)


def _split_state(task: ansor.Task) -> State:
    state = State(task.dag)
    stage = len(task.dag.tensors) - 1
    state.split(stage, state.stages[stage].iters[1], [4])
    return state


@pytest.fixture
def db(tmp_path: Path):
    with Database(tmp_path / "r.db") as d:
        yield d


def test_a_user_computation_rebuilds_from_the_database(db: Database):
    task = _user_task()
    db.add_workload(task.workload_key, task.describe(), task.flop)
    dag = workload_dag(db, task.workload_key)
    assert dag.workload_key == task.workload_key and repr(dag) == repr(task.dag)


def test_replay_gives_the_program_of_the_steps(db: Database):
    task = _user_task()
    state = _split_state(task)
    db.add_workload(task.workload_key, task.describe(), task.flop)
    again = replay(_record(task, state), workload_dag(db, task.workload_key))
    assert again.key() == state.key()


def test_an_older_description_falls_back_to_the_named_spec():
    task = make_task("matmul", (16, 16, 16))
    old = {k: v for k, v in task.describe().items() if k != "computation"}
    assert dag_from_description(old, task.workload_key).workload_key == task.workload_key


def test_an_unusable_computation_falls_back_to_the_spec_and_says_why_when_both_fail():
    task = make_task("matmul", (16, 16, 16))
    desc = task.describe()
    desc["computation"] = dict(desc["computation"], version=99)
    assert dag_from_description(desc, task.workload_key).workload_key == task.workload_key
    desc["spec"] = dict(desc["spec"], workload="no_such_op")
    with pytest.raises(ReplayError, match="version 99.*'no_such_op' is not a named workload"):
        dag_from_description(desc)


def test_a_description_with_neither_cannot_be_rebuilt():
    with pytest.raises(ReplayError, match="neither the computation nor a named-workload spec"):
        dag_from_description({"name": "C", "outputs": [["C", [4], "float32"]]})


def test_a_rebuilt_dag_with_another_key_is_refused():
    task = make_task("matmul", (16, 16, 16))
    with pytest.raises(ReplayError, match="rebuilds with key"):
        dag_from_description(task.describe(), "wk1-" + "0" * 32)


def test_an_unregistered_workload_is_a_replay_error(db: Database):
    with pytest.raises(ReplayError, match="not registered"):
        workload_dag(db, "wk1-unknown")


def test_steps_that_do_not_replay_are_one_error_type():
    task = _user_task()
    good = _record(task, _split_state(task))
    for steps in ([["SP", 99, 0, 8, [4], 1]], [["XX", 1]], [[]], [["SP", 2, 0, 8, "four", 1]]):
        bad = Record(task.workload_key, task.target.key, steps, "bad", (1e-3,), 0)
        with pytest.raises(ReplayError, match="do not replay"):
            replay(bad, task.dag)
    other = make_task("matmul", (16, 16, 16))
    with pytest.raises(ReplayError, match="belongs to workload"):
        replay(good, other.dag)
    bad = Record(task.workload_key, task.target.key, [["XX", 1]], "bad", (1e-3,), 0)
    assert [rec for rec, _ in replay_records([bad, good, bad], task.dag)] == [good]


def test_export_and_import_carry_the_computation(tmp_path: Path, db: Database):
    task = _user_task()
    db.add_workload(task.workload_key, task.describe(), task.flop)
    db.add_records([_record(task, _split_state(task))])
    path = tmp_path / "records.jsonl"
    db.export_jsonl(path)
    with Database(tmp_path / "fresh.db") as fresh:
        fresh.import_jsonl(path)
        dag = workload_dag(fresh, task.workload_key)
        (rec,) = fresh.records()
        assert replay(rec, dag).key() == _split_state(task).key()


def test_build_takes_the_best_record_that_replays(db: Database, tmp_path: Path, monkeypatch):
    import numpy as np

    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path / "cache"))
    task = _user_task()
    state = _split_state(task)
    db.add_workload(task.workload_key, task.describe(), task.flop)
    broken = Record(task.workload_key, task.target.key, [["XX", 1]], "broken", (1e-4,), 0)
    db.add_records([broken, _record(task, state, cost=2e-3)])
    kernel = ansor.build(task, database=db)
    assert kernel.record.state_key != "broken" and kernel.state.key() == state.key()
    x = np.random.default_rng(0).standard_normal((8, 8)).astype("float32")
    expected = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(kernel(x), expected, rtol=1e-5, atol=1e-6)


def test_the_cost_model_data_set_includes_user_computations(db: Database):
    """Transfer learning and `ansor costmodel eval` read records through `load_dataset`: a user
    computation stored with its computation is in it; one stored without it is skipped."""
    from ansor.tuning.dataset import load_dataset
    from ansor.search.sketch_policy import SketchPolicy

    task = _user_task()
    states = SketchPolicy(task, seed=0).sample(6)
    records = [_record(task, st, name=str(i), cost=1e-3 * (i + 1)) for i, st in enumerate(states)]
    db.add_workload(task.workload_key, task.describe(), task.flop)
    db.add_records(records)
    data = load_dataset(db, task.target.key)
    assert data.groups == [task.workload_key] * len(states) and data.skipped == 0
    assert data.costs == pytest.approx([r.median_cost for r in records])

    A = te.placeholder((4, 4), name="A")
    unknown = ansor.Task([A, te.compute((4, 4), lambda i, j: A[j, i] * 3.0, name="T")])
    old = {k: v for k, v in unknown.describe().items() if k != "computation"}
    db.add_workload(unknown.workload_key, old, unknown.flop)
    db.add_records([Record(unknown.workload_key, unknown.target.key, [], "t", (1e-3,), 0)])
    data = load_dataset(db, task.target.key)
    assert len(data.costs) == len(states) and data.skipped == 1
