"""The whole flow: declare, tune, build, call; faults and bad input along the way."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import ansor
from ansor import backend as backends
from ansor.backend import backend_for
from ansor.tuning.options import TuneOptions
from ansor import te
from ansor.store import Database, DatabaseError
from ansor.measure import MeasureErrorNo, TimingPolicy
from ansor.search.basic import RandomSearchPolicy, default_schedule


def matmul_task(M=32, N=24, K=16):
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    k = te.reduce_axis(K, name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return ansor.Task([A, B, C])


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ANSOR_DB", str(tmp_path / "default.db"))


def test_design_example_runs_as_written(tmp_path):
    task = matmul_task(64, 48, 32)
    db = str(tmp_path / "ansor.db")
    result = ansor.tune(task, trials=8, database=db, seed=0, progress=False)
    assert result.trials == 8
    assert result.best_cost < float("inf") and result.best_gflops > 0
    assert [t for t, _ in result.curve] == list(range(1, 9))
    phases = (result.search_seconds, result.measure_seconds, result.model_seconds)
    assert result.search_seconds > 0 and result.measure_seconds > 0 and result.model_seconds >= 0
    assert sum(phases) <= result.seconds
    kernel = ansor.build(task, database=db)
    a = np.random.rand(64, 32).astype("float32")
    b = np.random.rand(32, 48).astype("float32")
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert "void" in kernel.source and "#pragma omp" in kernel.source
    assert "C[" in kernel.schedule
    assert kernel.record is not None and kernel.record.ok


def test_build_without_records_can_use_the_default_schedule(tmp_path):
    task = matmul_task()
    kernel = ansor.build(task, database=str(tmp_path / "empty.db"), quick_trials=0)
    a = np.random.rand(32, 16).astype("float32")
    b = np.random.rand(16, 24).astype("float32")
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
    assert kernel.record is None
    with Database(str(tmp_path / "empty.db")) as db:
        assert db.count() == 0  # nothing measured


def test_kernel_check_allows_a_long_sum_its_rounding_and_nothing_more(tmp_path, monkeypatch):
    """The untuned norm2 of a million values sums them one after another: ~2e-4 off numpy,
    outside float32's default tolerance but inside the one every measured program passes, so
    `Kernel.check` (used by the CLI and benchmarks) does not call it wrong; a real error is."""
    from ansor.measure import check_outputs
    from ansor.workloads import make_task

    task = make_task("norm2", (1024, 1024))
    kernel = ansor.build(task, database=str(tmp_path / "empty.db"), quick_trials=0)
    inputs = task.random_inputs(seed=1)
    assert check_outputs([kernel(*inputs)], task.reference_outputs(inputs)) is not None
    assert kernel.check(*inputs) is None
    assert kernel.check() is None  # the task's own random inputs
    reference = task.reference_outputs
    monkeypatch.setattr(task, "reference_outputs", lambda xs: [r * 1.01 for r in reference(xs)])
    assert "mismatch" in kernel.check(*inputs)


def test_build_without_records_measures_a_few_model_ranked_programs(tmp_path, monkeypatch):
    """A workload nobody tuned: a quick search (ranked by the shipped model) measures a few
    programs, records them, and the kernel is the fastest of them; the next build finds the
    records and measures nothing."""
    monkeypatch.setenv("ANSOR_PRETRAINED", "1")
    task = matmul_task()
    db_path = str(tmp_path / "fresh.db")
    kernel = ansor.build(task, database=db_path, quick_trials=4)
    a = np.random.rand(32, 16).astype("float32")
    b = np.random.rand(16, 24).astype("float32")
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
    with Database(db_path) as db:
        assert 1 <= db.count(task.workload_key, task.target.key) <= 4
        best = db.best(task.workload_key, task.target.key)[0]
        measured = {r.state_key for r in db.records(task.workload_key, task.target.key)}
    assert default_schedule(task).key() in measured  # never slower than the default schedule
    assert kernel.record is not None and kernel.record.steps == best.steps
    again = ansor.build(task, database=db_path, quick_trials=4)
    with Database(db_path) as db:
        assert db.count(task.workload_key, task.target.key) == db.count()  # one workload, no new runs
        assert db.count() <= 4
    assert again.record.steps == best.steps


def test_a_quick_build_whose_time_runs_out_measures_less_and_still_builds_correct(tmp_path):
    """The quick search stops starting rounds at `quick_seconds`: fewer programs than asked are
    measured, and the kernel (the default schedule when nothing was) is still right."""
    task = matmul_task()
    db_path = str(tmp_path / "short.db")
    kernel = ansor.build(task, database=db_path, quick_trials=16, quick_seconds=1e-6)
    a = np.random.rand(32, 16).astype("float32")
    b = np.random.rand(16, 24).astype("float32")
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
    with Database(db_path) as db:
        assert db.count(task.workload_key, task.target.key) < 16


def test_resumed_run_does_not_remeasure(tmp_path):
    task = matmul_task()
    db_path = str(tmp_path / "r.db")
    ansor.tune(task, trials=6, database=db_path, seed=1, progress=False)
    ansor.tune(task, trials=6, database=db_path, seed=1, progress=False)
    with Database(db_path) as db:
        recs = db.records(task.workload_key, task.target.key)
    assert len({r.state_key for r in recs}) == 12  # the search never measures a program twice
    assert len(recs) <= 12 + 2 * TuneOptions.confirm_best  # the leaders, confirmed per job


def test_the_leaders_are_measured_again_and_the_best_pools_their_runs(tmp_path):
    task = matmul_task()
    db_path = str(tmp_path / "c.db")
    res = ansor.tune(task, trials=8, database=db_path, seed=2, progress=False, confirm_best=3)
    with Database(db_path) as db:
        recs = db.records(task.workload_key, task.target.key)
        best = db.best(task.workload_key, task.target.key)[0]
    assert res.trials == 8 and len(recs) == 8 + 3
    again = [r.state_key for r in recs[8:]]
    firsts = sorted((r for r in recs[:8] if r.ok), key=lambda r: r.median_cost)
    assert set(again) == {r.state_key for r in firsts[:3]}
    pooled = [c for r in recs if r.state_key == best.state_key for c in r.costs]
    assert sorted(best.costs) == sorted(pooled)
    assert res.best_cost == best.median_cost


def test_out_argument_and_multiple_calls(tmp_path):
    task = matmul_task()
    kernel = ansor.build(task, database=str(tmp_path / "x.db"))
    a = np.random.rand(32, 16).astype("float32")
    b = np.random.rand(16, 24).astype("float32")
    out = np.empty((32, 24), "float32")
    assert kernel(a, b).ctypes.data % 64 == 0  # outputs ansor allocates are cache-line aligned
    res = kernel(a, b, out=out)
    assert res is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("args, exc, words", [
    (lambda a, b: (a,), TypeError, "takes 2 inputs"),
    (lambda a, b: (a, b, b), TypeError, "takes 2 inputs"),
    (lambda a, b: (a.astype("float64"), b), TypeError, "'A'"),
    (lambda a, b: (a, b[:8]), ValueError, "'B'"),
    (lambda a, b: (a, b.astype("float64")), TypeError, "'B'"),
])
def test_kernel_rejects_bad_arguments(tmp_path, args, exc, words):
    task = matmul_task()
    kernel = ansor.build(task, database=str(tmp_path / "x.db"))
    a = np.random.rand(32, 16).astype("float32")
    b = np.random.rand(16, 24).astype("float32")
    with pytest.raises(exc, match=words):
        kernel(*args(a, b))


def test_corrupt_or_foreign_database_is_a_clear_error(tmp_path):
    import sqlite3

    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"definitely not sqlite" * 100)
    with pytest.raises(DatabaseError):
        ansor.tune(matmul_task(), trials=1, database=str(corrupt), progress=False)
    foreign = tmp_path / "foreign.db"
    con = sqlite3.connect(foreign)
    con.execute("create table songs (title text)")
    con.commit()
    con.close()
    with pytest.raises(DatabaseError):
        ansor.build(matmul_task(), database=str(foreign))


SEGFAULT_C = """
void kernel(const float* A, const float* B, float* C) { volatile float* p = 0; *p = 1.0f; }
"""
HANG_C = """
void kernel(const float* A, const float* B, float* C) { volatile int x = 1; while (x) {} }
"""
WRONG_C = """
void kernel(const float* A, const float* B, float* C) {
  for (int i = 0; i < 32 * 24; ++i) C[i] = 1.0f;
}
"""
BROKEN_C = "void kernel( {"


def test_faults_become_error_records_and_tuning_finishes(tmp_path, monkeypatch):
    """A kernel that segfaults, hangs, computes a wrong answer or does not compile is a record
    with an error code; the job goes on and the database holds every record."""
    task = matmul_task()
    cpu = backend_for(task.target)
    faults = {1: SEGFAULT_C, 2: HANG_C, 3: WRONG_C, 4: BROKEN_C}
    calls = {"n": 0}

    def faulty_source(func, caps):
        calls["n"] += 1
        if calls["n"] in faults:
            return faults[calls["n"]], "kernel"
        return cpu.printer(func, caps)

    monkeypatch.setitem(backends._BACKENDS, "cpu", dataclasses.replace(cpu, printer=faulty_source))
    db_path = str(tmp_path / "faults.db")
    result = ansor.tune(task, trials=7, database=db_path, seed=3, timeout=5.0, progress=False,
                        measures_per_round=7, timing=TimingPolicy(min_repeat_ms=5.0))
    assert result.trials == 7
    with Database(db_path) as db:
        recs = db.records(task.workload_key, task.target.key)
    codes = [r.error_no for r in recs]
    assert result.errors == 4, [(r.error_no, r.error_msg) for r in recs]
    assert codes[:4] == [MeasureErrorNo.RUNTIME_DEVICE, MeasureErrorNo.RUN_TIMEOUT,
                         MeasureErrorNo.WRONG_ANSWER, MeasureErrorNo.COMPILE_HOST]
    assert codes[4:] == [0] * (len(codes) - 4) and len(codes) == 7 + 3  # three ok, all confirmed
    assert "SIGSEGV" in recs[0].error_msg
    # a wrong kernel is never the best
    best = ansor.build(task, database=db_path)
    assert best.record.error_no == 0


def test_unlowerable_program_is_an_instantiation_error(tmp_path, monkeypatch):
    def broken(func, caps):
        raise ansor.ScheduleError("stage 'C': cannot lower this program")

    task = matmul_task()
    cpu = backend_for(task.target)
    monkeypatch.setitem(backends._BACKENDS, "cpu", dataclasses.replace(cpu, passes=(broken,)))
    result = ansor.tune(task, trials=2, database=str(tmp_path / "i.db"), seed=0, progress=False)
    assert result.errors == 2
    with Database(str(tmp_path / "i.db")) as db:
        assert {r.error_no for r in db.records()} == {MeasureErrorNo.INSTANTIATION_ERROR}


def test_custom_policy_object_is_accepted(tmp_path):
    task = matmul_task()
    policy = RandomSearchPolicy(task, seed=5)
    res = ansor.tune(task, trials=3, database=str(tmp_path / "p.db"), policy=policy, progress=False)
    assert res.trials == 3


def test_misdeclared_compute_is_rejected_at_declaration():
    A = te.placeholder((4, 5), name="A")
    with pytest.raises(IndexError, match="'A'.*dimension 1"):
        te.compute((4, 6), lambda i, j: A[i, j])
    with pytest.raises(IndexError, match="'A' has 2 dimensions"):
        te.compute((4,), lambda i: A[i])
    k = te.reduce_axis(5, name="k")
    with pytest.raises(ValueError, match="whole body"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k) + 1.0)
    with pytest.raises(TypeError, match="dtype"):
        te.placeholder((3,), "complex64")
    with pytest.raises(ValueError, match="dimension 0"):
        te.placeholder((0, 3))


def test_programs_far_slower_than_the_best_get_one_repeat(tmp_path):
    from ansor.tuning.measurer import ONE_REPEAT_FACTOR, ProgramMeasurer
    from ansor.schedule.state import State
    from ansor.workloads import make_task

    task = make_task("matmul", (16, 16, 16))
    m = ProgramMeasurer(task, timing=TimingPolicy(min_repeat_ms=1.0, repeat=3))
    try:
        assert m._timing() is None  # no best yet: every program gets all its repeats
        seen = []
        (result,) = m.measure([State(task.dag)], on_result=seen.append)
        assert seen == [result]  # each result is handed over as soon as it is measured
        assert result.ok and len(result.record.costs) == 3
        assert m.best_cost == pytest.approx(result.cost)
        assert m._timing().one_repeat_above == pytest.approx(ONE_REPEAT_FACTOR * result.cost)
    finally:
        m.close()
    again = ProgramMeasurer(task, best_cost=result.cost)  # a resumed run starts from the database's best
    off = ProgramMeasurer(task, best_cost=result.cost, one_repeat_factor=0)
    try:
        assert again._timing().one_repeat_above == pytest.approx(ONE_REPEAT_FACTOR * result.cost)
        assert off._timing().one_repeat_above == 0
    finally:
        again.close()
        off.close()


def test_a_search_times_with_shorter_repeats_and_a_confirmation_with_the_full_policy():
    from ansor.tuning.measurer import SEARCH_REPEAT_MS, ProgramMeasurer
    from ansor.schedule.state import State
    from ansor.workloads import make_task

    task = make_task("matmul", (16, 16, 16))
    m = ProgramMeasurer(task, timing=TimingPolicy(min_repeat_ms=4 * SEARCH_REPEAT_MS, repeat=2))
    short = ProgramMeasurer(task, timing=TimingPolicy(min_repeat_ms=1.0, repeat=2))
    try:
        assert m._timing().min_repeat_ms == SEARCH_REPEAT_MS
        assert m._timing(full=True) is None
        assert short._timing() is None  # a policy already shorter is kept as it is
        policies = []
        run = m.runner.run
        m.runner.run = lambda lib, entry, timing=None: policies.append(timing or m.runner.timing) or run(lib, entry, timing)
        searched, confirmed = (m.measure([State(task.dag)], full_timing=full)[0] for full in (False, True))
        assert searched.ok and confirmed.ok
        assert [p.min_repeat_ms for p in policies] == [SEARCH_REPEAT_MS, 4 * SEARCH_REPEAT_MS]
    finally:
        m.close()
        short.close()


def test_a_resumed_tune_starts_the_measurer_from_the_database_best(tmp_path, monkeypatch):
    from ansor.tuning import job as tuner_mod

    task = matmul_task()
    db = str(tmp_path / "b.db")
    ansor.tune(task, trials=4, database=db, progress=False, confirm_best=0)
    with Database(db) as d:
        best = d.best(task.workload_key, task.target.key)[0].median_cost
    starts = []
    real = tuner_mod.ProgramMeasurer

    def spy(*args, **kwargs):
        starts.append(kwargs.get("best_cost"))
        return real(*args, **kwargs)

    monkeypatch.setattr(tuner_mod, "ProgramMeasurer", spy)
    ansor.tune(task, trials=1, database=db, progress=False, confirm_best=0)
    assert starts == [best]


def test_transfer_from_another_target_measures_its_best_programs_first(tmp_path):
    """Tuning for this machine from the records of the same machine restricted to one core:
    the other target's best programs are the first measured here, and both targets' records
    stay apart in the database."""
    host = ansor.Target.host()
    if host.num_cores < 2:
        pytest.skip("needs two cores to restrict to one")
    db_path = str(tmp_path / "two_targets.db")
    one_core = ansor.Target.host(num_cores=1)
    source = matmul_task()
    ansor.tune(source, trials=8, target=one_core, database=db_path, progress=False, seed=0, confirm_best=0)
    with Database(db_path) as db:
        best_there = [r.state_key for r in db.best(source.workload_key, one_core.key, k=3)]
    task = matmul_task()
    ansor.tune(task, trials=4, database=db_path, progress=False, seed=1, confirm_best=0,
               transfer_from=one_core)
    with Database(db_path) as db:
        here = db.records(task.workload_key, host.key)
        assert len(here) == 4 and len(db.records(task.workload_key, one_core.key)) == 8
    assert [r.state_key for r in here[:3]] == best_there
    with pytest.raises(ValueError, match="names the target being tuned"):
        ansor.tune(task, trials=1, database=db_path, progress=False, transfer_from=host.key)
