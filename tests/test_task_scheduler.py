"""The gradient task scheduler: warm-up, the gradient estimate, dead tasks, failures, seeds,
and a real multi-task job driven by it."""

from __future__ import annotations

import math

import pytest

import ansor
from ansor import te
from ansor.tuning.callbacks import TuningCallback
from ansor.store import Database
from ansor.tuning.scheduler import GradientScheduler, make_scheduler, weighted_latency

INF = math.inf


class FakeTask:
    """A TaskView whose best cost after round r is `curve[r]` (the last value repeats)."""

    def __init__(self, curve, weight=1.0, flop=1e6, exhausted_after=None):
        self.curve = list(curve)
        self.weight = weight
        self.flop = flop
        self.exhausted_after = exhausted_after
        self.cost_history: list[float] = []
        self.exhausted = exhausted_after == 0

    @property
    def rounds(self):
        return len(self.cost_history)

    @property
    def trials(self):
        return self.rounds

    @property
    def best_cost(self):
        return self.cost_history[-1] if self.cost_history else INF

    def round(self):
        self.cost_history.append(self.curve[min(self.rounds, len(self.curve) - 1)])
        if self.exhausted_after is not None and self.rounds >= self.exhausted_after:
            self.exhausted = True


def with_history(history, weight=1.0, flop=1e6):
    task = FakeTask(history, weight=weight, flop=flop)
    for _ in history:
        task.round()
    return task


def run(scheduler, tasks, rounds):
    """The tuning loop's protocol with fake tasks; the indices picked, None included."""
    order = []
    for _ in range(rounds):
        index = scheduler.next_task(tasks)
        order.append(index)
        if index is None:
            break
        tasks[index].round()
        scheduler.on_round_end(index, tasks)
    return order


def test_every_task_gets_one_warm_up_round_first_in_order():
    tasks = [FakeTask([1.0]), FakeTask([5.0], weight=10.0), FakeTask([2.0])]
    order = run(GradientScheduler(eps=0.5, seed=3), tasks, 3)
    assert order == [0, 1, 2]


def test_the_heavier_task_by_weight_times_latency_runs_next():
    light = with_history([1.0], weight=1.0)
    heavy = with_history([1.0], weight=3.0)
    slow = with_history([2.0], weight=1.0)
    s = GradientScheduler(eps=0.0)
    assert s.next_task([light, heavy]) == 1
    assert s.next_task([light, slow]) == 1  # same weight, twice the latency to win back


def test_the_task_whose_latency_drops_fastest_runs_next():
    flat = with_history([1.0, 1.0, 1.0, 1.0])
    dropping = with_history([8.0, 4.0, 2.0, 1.0])
    s = GradientScheduler(eps=0.0)
    # backward (1 - 8) / 3, forward -1/4: 0.2 * -7/3 + 0.8 * -1/4
    assert s.gradient(1, [flat, dropping]) == pytest.approx(0.2 * (-7 / 3) + 0.8 * (-0.25))
    assert s.gradient(0, [flat, dropping]) == pytest.approx(0.8 * (-0.25))
    assert s.next_task([flat, dropping]) == 1


def test_a_slow_member_of_a_similarity_group_gets_the_optimistic_forward_guess():
    fast = with_history([1e-3] * 4, flop=1e9)
    slow = with_history([4e-3] * 4, flop=1e9)
    grouped = GradientScheduler(eps=0.0, tags=["matmul", "matmul"])
    # g_next = min(4e-3 - 4e-3 / 4, 2 * 1e9 / (1e9 / 1e-3)) = 2e-3
    assert grouped.gradient(1, [fast, slow]) == pytest.approx(0.8 * (2e-3 - 4e-3))
    ungrouped = GradientScheduler(eps=0.0)
    assert ungrouped.gradient(1, [fast, slow]) == pytest.approx(0.8 * (3e-3 - 4e-3))
    other_bucket = with_history([4e-3] * 4, flop=1e12)  # same tag, far more FLOPs: not similar
    assert grouped.gradient(1, [fast, other_bucket]) == pytest.approx(0.8 * (3e-3 - 4e-3))


def test_a_task_far_behind_its_group_after_many_rounds_leaves_it():
    fast = with_history([1e-3], flop=1e9)
    slow = with_history([1e-2] * 7, flop=1e9)
    s = GradientScheduler(eps=0.0, tags=["t", "t"])
    before = s.gradient(1, [fast, slow])
    s.on_round_end(1, [fast, slow])
    assert s.gradient(1, [fast, slow]) > before  # only its own 1/t guess is left
    assert s.gradient(1, [fast, slow]) == pytest.approx(0.8 * (-1e-2 / 7))


def test_exhausted_tasks_are_never_picked_and_none_ends_the_job():
    tasks = [FakeTask([1.0], exhausted_after=2), FakeTask([5.0], exhausted_after=0),
             FakeTask([2.0], exhausted_after=3)]
    order = run(GradientScheduler(eps=0.5, seed=0), tasks, 20)
    assert order[-1] is None and 1 not in order
    assert order[:-1].count(0) == 2 and order[:-1].count(2) == 3


def test_early_stopped_tasks_are_never_picked():
    improving = FakeTask([9.0 - r for r in range(9)] + [0.5])
    stalled = FakeTask([4.0])  # never improves after its first round
    s = GradientScheduler(eps=0.5, early_stopping=2, seed=1)
    order = run(s, [improving, stalled], 30)
    assert order.count(1) <= 3  # warm-up, then at most two rounds without improvement
    assert order[-1] is None and s.stopped(stalled) and s.stopped(improving)
    assert GradientScheduler(early_stopping=None).stopped(stalled) is False


def test_tasks_without_a_working_program_go_first_and_break_no_arithmetic():
    ok = with_history([1.0, 0.5, 0.25, 0.2])
    failing = with_history([INF, INF])
    s = GradientScheduler(eps=0.0)
    assert s.next_task([ok, failing]) == 1
    heavy_failing = with_history([INF, INF], weight=5.0)
    assert s.next_task([ok, failing, heavy_failing]) == 2
    recovered = with_history([INF, INF, INF, 2.0])  # the window reaches back to a failure
    assert math.isfinite(s.gradient(0, [recovered])) and s.gradient(0, [recovered]) < 0
    grouped = GradientScheduler(eps=0.0, tags=["t", "t"])
    assert grouped.gradient(0, [ok, failing]) == pytest.approx(0.2 * (0.2 - 1.0) / 3 + 0.8 * (-0.2 / 4))
    assert weighted_latency([ok, failing]) == INF
    assert weighted_latency([ok, with_history([0.5], weight=2.0)]) == pytest.approx(0.2 + 1.0)


def test_the_same_seed_picks_the_same_tasks():
    def order(seed):
        tasks = [FakeTask([3.0, 2.0, 1.5]), FakeTask([1.0]), FakeTask([2.0, 1.0], weight=2.0)]
        return run(GradientScheduler(eps=0.5, seed=seed), tasks, 40)

    assert order(7) == order(7)
    assert order(7) != order(8)


def test_bad_parameters_are_refused():
    for kwargs in ({"alpha": 1.5}, {"beta": 0}, {"backward_window": 0}, {"eps": -0.1}, {"early_stopping": 0}):
        with pytest.raises(ValueError, match="GradientScheduler"):
            GradientScheduler(**kwargs)
    with pytest.raises(ValueError, match="tags"):
        GradientScheduler(tags=["a"]).next_task([FakeTask([1.0]), FakeTask([1.0])])
    assert isinstance(make_scheduler("gradient", seed=0), GradientScheduler)


# --- a real job --------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ANSOR_DB", str(tmp_path / "default.db"))


def matmul_task(M, N, K):
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    k = te.reduce_axis(K, name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return ansor.Task([A, B, C])


class Rounds(TuningCallback):
    def __init__(self):
        self.seen: list[tuple[str, float, int, int]] = []
        self.earlier: dict[str, int] = {}  # rounds of earlier jobs each task counted

    def on_round_end(self, tuner, results):
        self.seen.append((tuner.task.workload_key, tuner.weight, tuner.rounds, len(tuner.cost_history)))

    def on_end(self, tuner):
        self.earlier[tuner.task.workload_key] = tuner.earlier_rounds


def test_a_multi_task_job_runs_under_the_gradient_scheduler(tmp_path):
    t1, t2 = matmul_task(16, 16, 8), matmul_task(8, 24, 8)
    log = Rounds()
    db_path = str(tmp_path / "g.db")
    results = ansor.tune([t1, t2], trials=8, measures_per_round=2, scheduler="gradient", progress=False,
                         database=db_path, seed=0, confirm_best=0, task_weights=[1.0, 3.0], callbacks=[log])
    assert sum(r.trials for r in results) == 8 and all(r.trials >= 2 for r in results)
    assert [wk for wk, *_ in log.seen[:2]] == [t1.workload_key, t2.workload_key]  # warm-up in order
    assert {wk: w for wk, w, *_ in log.seen} == {t1.workload_key: 1.0, t2.workload_key: 3.0}
    assert all(rounds == history for _, _, rounds, history in log.seen)
    with Database(db_path) as db:
        for task, res in zip((t1, t2), results):
            assert db.count(task.workload_key, task.target.key) >= 2
            assert res.best_cost < math.inf
    with pytest.raises(ValueError, match="task_weights"):
        ansor.tune([t1, t2], trials=0, database=db_path, progress=False, task_weights=[1.0])


def test_a_resumed_job_warms_up_only_the_tasks_without_records(tmp_path):
    """Rerun on the same database with a new task: the tasks tuned before count their rounds
    and are not warmed up again; the new one is warmed up first."""
    t1, t2, t3 = matmul_task(16, 16, 8), matmul_task(8, 24, 8), matmul_task(8, 8, 16)
    db_path = str(tmp_path / "g.db")
    ansor.tune([t1, t2], trials=8, measures_per_round=2, scheduler="gradient", progress=False,
               database=db_path, seed=0, confirm_best=0)
    with Database(db_path) as db:  # the gradient may have split the 8 trials unevenly
        earlier_rounds = {t.workload_key: math.ceil(db.count(t.workload_key, t.target.key) / 2)
                          for t in (t1, t2)}
    assert all(n >= 1 for n in earlier_rounds.values())
    log = Rounds()
    ansor.tune([t1, t2, t3], trials=4, measures_per_round=2, scheduler="gradient", progress=False,
               database=db_path, seed=0, confirm_best=0, callbacks=[log])
    assert log.seen[0][0] == t3.workload_key and log.seen[0][2] == 1  # the only warm-up round
    for wk, n in earlier_rounds.items():  # a task tuned before counts its records' rounds
        assert log.earlier[wk] == n
    assert log.earlier[t3.workload_key] == 0
    assert all(rounds == history for _, _, rounds, history in log.seen)
