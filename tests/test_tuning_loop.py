"""The tuning loop as objects: rounds, several tasks together, callbacks, interrupts, budgets."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.tuning.callbacks import TuningCallback
from ansor.store import Database
from ansor.measure import MeasureErrorNo
from ansor.report import TuneProgress, error_summary
from ansor.tuning.scheduler import RoundRobinScheduler, make_scheduler


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ANSOR_DB", str(tmp_path / "default.db"))


def matmul_task(M=32, N=24, K=16):
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    k = te.reduce_axis(K, name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return ansor.Task([A, B, C])


def relu_task(n=256):
    X = te.placeholder((n, 8), "float32", name="X")
    Y = te.compute((n, 8), lambda i, j: te.maximum(X[i, j], 0.0), name="Y")
    return ansor.Task([X, Y])


class RoundLog(TuningCallback):
    def __init__(self):
        self.rounds: list[tuple[str, int]] = []
        self.phases: list[str] = []
        self.results = 0

    def on_phase(self, tuner, phase):
        self.phases.append(phase)

    def on_result(self, tuner, result):
        self.results += 1

    def on_round_end(self, tuner, results):
        self.rounds.append((tuner.task.workload_key, len(results)))


def test_several_tasks_take_rounds_in_turn_with_one_shared_model(tmp_path):
    a, b = matmul_task(), matmul_task(16, 16, 16)
    log = RoundLog()
    results = ansor.tune([a, b], trials=16, database=str(tmp_path / "m.db"), seed=0, progress=False,
                         measures_per_round=4, callbacks=[log])
    assert [r.trials for r in results] == [8, 8]
    order = [wk for wk, _ in log.rounds]
    assert order == [a.workload_key, b.workload_key] * 2  # interleaved, not one task after the other
    assert log.results == 16 and log.phases[:3] == ["searching", "compiling", "measuring"]
    with Database(str(tmp_path / "m.db")) as db:
        for task, res in zip((a, b), results):
            assert db.count(task.workload_key, task.target.key) >= 8
            assert res.best_cost == db.best(task.workload_key, task.target.key)[0].median_cost


def test_a_small_job_measures_in_growing_rounds_and_a_large_one_in_full_rounds(tmp_path):
    """In a job of at most SMALL_JOB trials the model is refitted after 4, 4, 8, ... programs, so
    that a 16-trial job does not spend its whole budget on the first blind pick."""
    from ansor.tuning.job import FIRST_ROUND, SMALL_JOB

    small, large = RoundLog(), RoundLog()
    ansor.tune(matmul_task(), trials=16, database=str(tmp_path / "s.db"), seed=0, progress=False,
               measures_per_round=16, callbacks=[small], confirm_best=0, pretrained=False)
    assert [n for _, n in small.rounds] == [FIRST_ROUND, FIRST_ROUND, 2 * FIRST_ROUND] == [4, 4, 8]
    ansor.tune(matmul_task(), trials=SMALL_JOB + 2, database=str(tmp_path / "l.db"), seed=0,
               progress=False, measures_per_round=SMALL_JOB // 2 + 1, callbacks=[large], confirm_best=0,
               pretrained=False)
    assert [n for _, n in large.rounds] == [SMALL_JOB // 2 + 1] * 2


def test_tasks_share_one_cost_model(tmp_path, monkeypatch):
    from ansor.tuning import job as tuner_mod

    seen = []
    real = tuner_mod.make_policy

    def spy(policy, task, seed, cost_model=None, params=None):
        seen.append(cost_model)
        return real(policy, task, seed, cost_model, params)

    monkeypatch.setattr(tuner_mod, "make_policy", spy)
    ansor.tune([matmul_task(), matmul_task(16, 16, 16)], trials=2, database=str(tmp_path / "s.db"),
               progress=False, measures_per_round=1, confirm_best=0)
    assert len(seen) == 2 and seen[0] is not None and seen[0] is seen[1]


def test_round_robin_skips_exhausted_tasks():
    class View:
        def __init__(self, exhausted):
            self.exhausted, self.trials, self.best_cost, self.weight = exhausted, 0, 1.0, 1.0

    views = [View(False), View(True), View(False)]
    s = RoundRobinScheduler()
    assert [s.next_task(views) for _ in range(4)] == [0, 2, 0, 2]
    assert s.next_task([View(True)]) is None
    with pytest.raises(ValueError, match="unknown task scheduler"):
        make_scheduler("no-such")


def test_an_interrupt_keeps_every_program_measured_before_it(tmp_path):
    class StopAfter(TuningCallback):
        def __init__(self, n):
            self.n, self.seen = n, 0

        def on_result(self, tuner, result):
            self.seen += 1
            if self.seen == self.n:
                raise KeyboardInterrupt

    task = matmul_task()
    path = str(tmp_path / "i.db")
    with pytest.raises(KeyboardInterrupt) as info:
        ansor.tune(task, trials=40, database=path, progress=False, measures_per_round=8,
                   callbacks=[StopAfter(11)])
    assert info.value.results[0].trials == 11
    with Database(path) as db:
        assert db.count(task.workload_key, task.target.key) == 11  # committed one by one
    # the rerun resumes: nothing measured again
    res = ansor.tune(task, trials=4, database=path, progress=False, measures_per_round=4, confirm_best=0)
    assert res.prior_records == 11 and res.trials == 4
    with Database(path) as db:
        recs = db.records(task.workload_key, task.target.key)
    assert len(recs) == 15 and len({r.state_key for r in recs}) == 15


def test_time_budget_stops_the_search(tmp_path):
    task = matmul_task()
    t0 = time.time()
    # without the pretrained model the first rounds sample at random (a model-guided round is a
    # full evolutionary search, seconds of its own, which a short budget could spend entirely);
    # 8 s leaves a loaded machine time for the job's setup and its first round
    res = ansor.tune(task, trials=100000, database=str(tmp_path / "t.db"), progress=False,
                     measures_per_round=4, time_budget=8.0, confirm_best=0, pretrained=False)
    assert 0 < res.trials < 100000
    assert time.time() - t0 < 120  # generous: it stopped because of the budget, not the trials
    with pytest.raises(ValueError, match="time_budget"):
        ansor.tune(task, trials=1, database=str(tmp_path / "t.db"), time_budget=0)


def test_a_time_budget_keeps_room_for_the_confirmation():
    """The search stops early enough for each measured task's leaders to be measured again
    within the budget: k programs at the task's mean time per program so far."""
    from types import SimpleNamespace

    from ansor.tuning.job import confirmation_seconds

    def tuner(trials: int, seconds: float):
        return SimpleNamespace(result=SimpleNamespace(trials=trials, measure_seconds=seconds))

    tuners = [tuner(10, 5.0), tuner(4, 1.0), tuner(0, 0.0)]
    assert confirmation_seconds(tuners, 4) == pytest.approx(4 * 0.5 + 4 * 0.25)
    assert confirmation_seconds(tuners, 0) == 0.0


def test_errors_are_explained_in_words():
    text = error_summary(Counter({MeasureErrorNo.RUN_TIMEOUT: 1, MeasureErrorNo.COMPILE_HOST: 2}), timeout=10)
    assert text == "2 programs failed to compile, 1 program timed out (10 s)"
    assert error_summary(Counter({MeasureErrorNo.WRONG_ANSWER: 1})) == "1 program computed a wrong answer"


def test_progress_without_a_terminal_prints_a_line_per_round(tmp_path):
    import io

    stream = io.StringIO()
    task = matmul_task()
    ansor.tune(task, trials=6, database=str(tmp_path / "p.db"), progress=False, measures_per_round=3,
               callbacks=[TuneProgress(total=6, stream=stream)], confirm_best=0, pretrained=False)
    lines = [line for line in stream.getvalue().splitlines() if line.strip()]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{task.name} 32x24: round 1, 3 programs measured, best ")
    assert "GFLOP/s" in lines[1]


def _wait_for_records(path: str, n: int, proc: subprocess.Popen, limit_s: float = 120) -> int:
    t0 = time.time()
    while time.time() - t0 < limit_s:
        if proc.poll() is not None:
            raise AssertionError(f"tuner exited early: {proc.communicate()}")
        if os.path.exists(path):
            try:
                with sqlite3.connect(path, timeout=5) as conn:
                    count = conn.execute("SELECT count(*) FROM records").fetchone()[0]
                if count >= n:
                    return count
            except sqlite3.Error:
                pass
        time.sleep(0.2)
    raise AssertionError("no records appeared")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_cli_stops_cleanly_on_a_signal_and_resumes(tmp_path, sig, code):
    db = str(tmp_path / "cli.db")
    cmd = [sys.executable, "-m", "ansor.cli", "tune", "matmul", "--shape", "48,48,48", "--trials", "5000",
           "--per-round", "8", "--database", db, "--no-baseline"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        seen = _wait_for_records(db, 3, proc)
        os.killpg(proc.pid, sig)  # like a Ctrl-C in a terminal: the whole process group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, (out, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    message = [line for line in err.splitlines() if line.startswith("ansor: ")]
    assert len(message) == 1 and "kept in" in message[0], err
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        kept = conn.execute("SELECT count(*) FROM records").fetchone()[0]
    assert kept >= seen
    again = subprocess.run(cmd[:7] + ["--trials", "1", "--per-round", "1", "--database", db, "--no-baseline"],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"resuming: {kept} records of this workload" in again.stderr


def test_built_kernel_of_a_multi_task_job_is_correct(tmp_path):
    task = relu_task()
    ansor.tune([task, matmul_task()], trials=4, database=str(tmp_path / "k.db"), progress=False,
               measures_per_round=2)
    x = np.random.randn(256, 8).astype("float32")
    np.testing.assert_array_equal(ansor.build(task, database=str(tmp_path / "k.db"))(x), np.maximum(x, 0))


def test_cli_interrupted_while_it_starts_its_workers_prints_no_traceback(tmp_path):
    db = str(tmp_path / "early.db")
    cmd = [sys.executable, "-m", "ansor.cli", "tune", "matmul", "--shape", "48,48,48", "--trials", "5000",
           "--database", db, "--no-baseline"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        header = proc.stdout.readline()  # printed just before tuning starts its workers
        assert header.startswith("ansor tuning"), header
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err + out, err
    assert [line for line in err.splitlines() if line.startswith("ansor: ")], err


def test_a_multi_task_job_ends_with_a_table_of_its_tasks(tmp_path):
    import io

    stream = io.StringIO()
    a, b = matmul_task(), matmul_task(16, 16, 16)
    ansor.tune([a, b], trials=4, database=str(tmp_path / "tt.db"), progress=False, measures_per_round=2,
               task_weights=[1, 3], callbacks=[TuneProgress(stream=stream)], confirm_best=0)
    text = stream.getvalue()
    assert "estimated total" in text and "share" in text
    rows = [line for line in text.splitlines() if line.startswith("│ C ")]
    assert len(rows) == 2 and "│      3 │" in rows[1], text
