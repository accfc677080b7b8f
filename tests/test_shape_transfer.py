"""Programs of one shape replayed on another shape of the same computation: splits refitted so
every tile divides its loop, other structures refused, the result correct, and a job on a
workload with no record measuring such programs first."""

from __future__ import annotations

import pytest

import ansor
from ansor.costmodel.pretrained import shipped_programs
from ansor.database import Database
from ansor.replay import replay_records
from ansor.schedule.state import State
from ansor.search.shape_transfer import adapt_to_shapes, borrowed_programs, fitted_lengths
from ansor.workloads import make_task
from test_retarget import correct, matmul_task, tiled


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ANSOR_DB", str(tmp_path / "default.db"))


@pytest.mark.parametrize("lengths,extent,expected", [
    ((4, 16), 64, (4, 16)),     # they divide: unchanged
    ((4, 16), 56, (4, 14)),     # the innermost shrinks to a divisor, the next still fits
    ((8, 8), 12, (2, 6)),       # 8 -> 6 (the largest divisor of 12 up to 8), then 8 -> 2 (what is left)
    ((2, 32), 16, (1, 16)),     # longer than the loop: capped at it
])
def test_fitted_lengths_divide_the_new_extent_and_keep_the_inner_tile_first(lengths, extent, expected):
    got = fitted_lengths(lengths, extent)
    assert got == expected
    product = 1
    for n, original in zip(got, lengths):
        assert 1 <= n <= original
        product *= n
    assert extent % product == 0


def test_a_program_replays_on_other_shapes_with_fitted_tiles_and_stays_correct():
    program = tiled(matmul_task(32, 64, 16), inner_j=16, middle_j=2)
    other = matmul_task(24, 40, 8)
    state = adapt_to_shapes(program.steps, other.dag)
    assert state is not None
    assert state.steps[0].lengths == (4,) and state.steps[1].lengths == (2, 10)  # j: 40 = 2 x 2 x 10
    correct(other, state)


def test_programs_of_another_structure_are_not_borrowed():
    program = tiled(matmul_task(), inner_j=16)
    softmax = make_task("softmax", (64, 32))
    assert borrowed_programs(softmax.dag, [(tuple(matmul_task().dag.names), program.steps)]) == []
    # same stage names but steps that do not apply (a split of a loop the stage lacks): refused
    assert adapt_to_shapes(program.steps, softmax.dag) is None


def test_the_package_ships_programs_for_the_suite_families():
    """The held-out suite shapes are not among them, but other shapes of their operators are."""
    for name, shape in [("matmul", (512, 512, 512)), ("depthwise_conv2d", (1, 128, 56, 56, 3, 3)),
                        ("softmax", (1536, 128))]:
        task = make_task(name, shape)
        states = borrowed_programs(task.dag, shipped_programs(task.target))
        assert states and all(isinstance(s, State) for s in states)


def test_a_fresh_workload_measures_the_programs_of_its_tuned_neighbour_first(tmp_path):
    """Records of matmul 32x64x16 in the database: a job on matmul 24x40x8 (no record, the
    shipped programs left out) measures that workload's best programs, refitted, first."""
    db_path = str(tmp_path / "neighbour.db")
    ansor.tune(matmul_task(32, 64, 16), trials=8, database=db_path, progress=False, seed=0,
               confirm_best=0, pretrained=False)
    task = matmul_task(24, 40, 8)
    neighbour = matmul_task(32, 64, 16)
    with Database(db_path) as db:
        source = [s for _, s in replay_records(db.best(neighbour.workload_key, task.target.key, k=3), neighbour.dag)]
    expected = {adapt_to_shapes(s.steps, task.dag).key() for s in source}
    ansor.tune(task, trials=4, measures_per_round=4, database=db_path, progress=False, seed=0,
               confirm_best=0, pretrained=False)
    with Database(db_path) as db:
        measured = [r.state_key for r in db.records(task.workload_key, task.target.key)]
    assert expected <= set(measured[:len(expected)])
