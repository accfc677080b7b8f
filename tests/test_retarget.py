"""Programs of one CPU adapted to another's vector width (transfer between targets)."""

from __future__ import annotations

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.store import Database
from ansor.kernel import compile_state
from ansor.measure import check_outputs
from ansor.schedule.state import State
from ansor.tuning.retarget import retarget_vector_width, vectorized_splits
from ansor.tuning.transfer import transferred_programs


def matmul_task(M=32, N=64, K=16, target=None):
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    k = te.reduce_axis(K, name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return ansor.Task([A, B, C], target=target)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ANSOR_DB", str(tmp_path / "default.db"))


def tiled(task, inner_j: int, middle_j: int = 2) -> State:
    """i split in two, j in three with its innermost piece vectorized, k outside j's pieces."""
    st = State(task.dag)
    i0, i1 = st.split("C", "i", [4])
    j0, j1, j2 = st.split("C", "j", [middle_j, inner_j])
    st.reorder("C", [i0, j0, "k", i1, j1, j2])
    st.vectorize("C", j2)
    return st


def vector_extents(state: State) -> list[int]:
    return [it.extent for s in state.stages for it in s.iters if it.annotation == "vectorize"]


def correct(task, state) -> None:
    kernel = compile_state(task, state)
    inputs = task.random_inputs(seed=3)
    out = kernel(*inputs)
    assert check_outputs([out], task.reference_outputs(inputs)) is None


def test_a_program_for_avx2_is_widened_for_avx512_and_stays_correct():
    task = matmul_task()
    avx2 = tiled(task, inner_j=8)
    assert vectorized_splits(avx2) == [(1, 2, 4)]  # step 1, the piece of lengths[1], floats
    variants = retarget_vector_width(avx2, 32, 64)
    assert variants, "a vectorized split of 8 floats has a 16-float variant"
    # first: the vectorized piece doubled, the factor taken from the loop outside the split
    assert vector_extents(variants[0]) == [16]
    assert variants[0].steps[1].lengths == (2, 16)
    # then the same tile reshaped: the factor taken from the other level of the split
    assert any(v.steps[1].lengths == (1, 16) for v in variants[1:])
    for state in (avx2, *variants):
        correct(task, state)


def test_with_twice_the_registers_the_row_tile_nearest_the_vector_grows_too():
    A = te.placeholder((4, 32, 16), "float32", name="A")
    B = te.placeholder((4, 16, 64), "float32", name="B")
    k = te.reduce_axis(16, name="k")
    C = te.compute((4, 32, 64), lambda b, i, j: te.sum(A[b, i, k] * B[b, k, j], axis=k), name="C")
    task = ansor.Task([A, B, C])
    st = State(task.dag)
    b0, b1 = st.split("C", "b", [2])
    i0, i1 = st.split("C", "i", [4])
    j0, j1, j2 = st.split("C", "j", [2, 8])
    st.reorder("C", [b0, i0, j0, "k", b1, i1, j1, j2])
    st.vectorize("C", j2)
    variants = retarget_vector_width(st, 32, 64, register_ratio=2)
    # first: j's vector widened, and i's rows doubled (i.1 sits nearer j.2 than b.1 does)
    assert [step.lengths for step in variants[0].steps[:3]] == [(2,), (8,), (2, 16)]
    assert [step.lengths for step in variants[1].steps[:3]] == [(4,), (4,), (2, 16)]
    assert vector_extents(variants[2]) == [16] and variants[2].steps[1].lengths == (4,)  # widened only
    for state in variants[:3]:
        correct(task, state)


def test_narrowing_halves_the_vectorized_loop_and_nothing_changes_for_equal_widths():
    task = matmul_task()
    avx512 = tiled(task, inner_j=16, middle_j=1)
    narrowed = retarget_vector_width(avx512, 64, 32)
    assert vector_extents(narrowed[0]) == [8]
    correct(task, narrowed[0])
    assert retarget_vector_width(avx512, 64, 64) == []
    # a length that does not divide: no variant rather than a fractional tile
    assert retarget_vector_width(tiled(task, inner_j=3), 64, 32) == []


def test_no_variant_makes_a_ragged_tile_or_widens_a_piece_shorter_than_a_vector():
    # 56 columns in tiles of 8: widened to 16 the last tile would be half outside the loop
    assert retarget_vector_width(tiled(matmul_task(N=56), inner_j=8, middle_j=7), 32, 64) == []
    # a vectorized piece of 2 floats does not fill an AVX2 vector: its width was not the point
    assert retarget_vector_width(tiled(matmul_task(), inner_j=2), 32, 64) == []


def test_a_program_without_vectorized_splits_has_no_variant():
    task = matmul_task()
    st = State(task.dag)
    st.split("C", "j", [8])
    assert vectorized_splits(st) == []
    assert retarget_vector_width(st, 32, 64) == []


def test_transfer_from_avx2_measures_the_widened_program_before_the_original(tmp_path):
    host = ansor.Target.host()
    if host.isa != "avx512":
        pytest.skip("needs an AVX-512 machine to restrict to AVX2")
    avx2 = ansor.Target.host(isa="avx2")
    db_path = str(tmp_path / "two_targets.db")
    ansor.tune(matmul_task(target=avx2), trials=6, database=db_path, progress=False, seed=0, confirm_best=0)
    task = matmul_task()
    with Database(db_path) as db:
        programs = transferred_programs(task, db, avx2.key, k=3)
        originals = [r.state_key for r in db.best(task.workload_key, avx2.key, k=3)]
    keys = [p.key() for p in programs]
    assert [k for k in keys if k in originals] == originals  # every original, in order
    for i, key in enumerate(keys):
        if key not in originals:  # a variant comes right before its original
            assert keys[i + 1] in originals
            assert sum(vector_extents(programs[i])) > sum(vector_extents(programs[i + 1]))
    correct(task, programs[0])
