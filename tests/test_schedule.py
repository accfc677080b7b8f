"""Schedule primitives: step serialization and replay, error messages, follow_split, cache_read,
rfactor, and the workload key (three keys are pinned: they must never change across releases)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.schedule import ScheduleError, State, step_from_json, steps_from_json
from ansor.schedule.steps import STEP_KINDS, SplitStep
from helpers import OPERATORS, assert_close, random_inputs, run_and_check, run_state


def gemm_task(m=16, k=24, n=20, dtype="float32", names=("A", "B", "gemm")) -> ansor.Task:
    """C[row, col] = sum over kred of A[row, kred] * B[kred, col], with distinctive names."""
    A = te.placeholder((m, k), dtype, name=names[0])
    B = te.placeholder((k, n), dtype, name=names[1])
    kred = te.reduce_axis(k, "kred")
    C = te.compute((m, n), lambda row, col: te.sum(A[row, kred] * B[kred, col], axis=kred),
                   name=names[2])
    return ansor.Task([A, B, C])


def gemm_relu_task() -> ansor.Task:
    A = te.placeholder((16, 24), name="A")
    B = te.placeholder((24, 20), name="B")
    kred = te.reduce_axis(24, "kred")
    C = te.compute((16, 20), lambda row, col: te.sum(A[row, kred] * B[kred, col], axis=kred),
                   name="gemm")
    R = te.compute((16, 20), lambda r, c: te.maximum(C[r, c], 0.0), name="act")
    return ansor.Task([A, B, R])


def np_gemm_relu(a, b):
    return np.maximum(a @ b, 0.0)


def row_sum_task() -> ansor.Task:
    X = te.placeholder((6, 20), name="X")
    k = te.reduce_axis(20, "k")
    return ansor.Task([X, te.compute((6,), lambda i: te.sum(X[i, k] * X[i, k], axis=k),
                                     name="rowsq")])


def check_gemm_relu(task, s, builder):
    inputs = random_inputs(task)
    out = run_state(task, s, builder, inputs)
    assert_close(out, np_gemm_relu(*[a.astype(np.float64) for a in inputs]))


# ---------------------------------------------------------------------------------------------
# serialization and replay

def every_step_kind_program():
    """One program (valid, compilable) that uses every step kind at least once."""
    task = gemm_relu_task()
    s = State(task.dag)
    # stages: A, B, gemm, act
    s.cache_read("A", "local", ["gemm"])          # CHR: A, A.local, B, gemm, act
    s.cache_write("gemm", "local")                 # CHW: A, A.local, B, gemm.local, gemm, act
    s.split("act", "r", [4, 2])                    # SP (step 2): r.0=2, r.1=4, r.2=2
    s.follow_split("gemm", "row", 2, 2)            # FSP: the same tiling
    s.split("act", "c", [5, 1], inner_to_outer=False)  # SP (step 4): c.0=5, c.1=1, c.2=4
    s.follow_fused_split("gemm", "col", [2, 4], 0)  # FFSP: split by 4 * 5
    s.reorder("act", ["r.0", "c.0", "r.1", "r.2", "c.1", "c.2"])  # RE
    s.fuse("act", ["c.1", "c.2"])                  # FU
    s.annotate("act", "r.0", "parallel")           # AN
    s.pragma("act", "r.0", "auto_unroll_max_step$16")  # PR
    s.compute_at("gemm", "act", "c.0")             # CA
    s.compute_inline("gemm")                       # CI (gemm is a copy of gemm.local)
    s.compute_at("gemm.local", "act", "c.0")       # CA: now directly under the consumer
    s.compute_root("A.local")                      # CR
    s.transform_layout("A.local", 1, 2, 0)         # LA: A.local stored with kred tiled by 8
    s.interleave_layout("A.local", 0, 2)           # LI: ... and its rows in pairs, innermost
    return task, s


def test_every_step_kind_round_trips_through_json(builder):
    task, s = every_step_kind_program()
    rf_task = row_sum_task()
    rf = State(rf_task.dag)
    rf.split(1, "k", [4])
    rf.rfactor(1, "k.1", 0)                        # RF
    steps = s.steps + rf.steps
    assert {type(step).TAG for step in steps} == set(STEP_KINDS)
    for step in steps:
        text = json.dumps(step.to_json())
        back = step_from_json(json.loads(text))
        assert back == step and type(back) is type(step)
        assert back.to_json() == step.to_json()

    for t, st in ((task, s), (rf_task, rf)):
        replayed = State.replay(t.dag, steps_from_json(json.loads(json.dumps(st.steps_json()))))
        assert replayed.key() == st.key()
        assert str(replayed) == str(st)
    check_gemm_relu(task, s, builder)


def test_step_json_format_is_stable():
    """The log format (tags and field order) is read back by later releases."""
    assert SplitStep(2, 0, 16, (4, None), True).to_json() == ["SP", 2, 0, 16, [4, None], True]
    _, s = every_step_kind_program()
    assert s.steps_json()[:4] == [
        ["CHR", 0, "local", [2]],
        ["CHW", 3, "local"],
        ["SP", 5, 0, 16, [4, 2], True],
        ["FSP", 4, 0, 2, 2],
    ]


@pytest.mark.parametrize("bad", [[], ["XX", 1], ["SP", 1, 2], "SP", None, ["CI"]])
def test_malformed_step_json_raises(bad):
    with pytest.raises(ScheduleError):
        step_from_json(bad)


def test_replay_of_a_different_dag_fails_cleanly():
    """A stale record (steps of another computation) must fail with ScheduleError, which
    `ansor.build` catches to try the next record."""
    _, s = every_step_kind_program()
    other = OPERATORS["norm2"].task()
    with pytest.raises(ScheduleError):
        State.replay(other.dag, s.steps)


@pytest.mark.parametrize("bad", [["CI", None], ["PR", 2, 0, 4], ["FU", 2, 1],
                                 ["SP", 2, 0, 16, 4, True]])
def test_mistyped_step_json_raises_schedule_error(bad):
    task = gemm_relu_task()
    with pytest.raises(ScheduleError):
        State.replay(task.dag, [step_from_json(bad)])


def test_copy_is_independent():
    task = gemm_relu_task()
    s = State(task.dag)
    s.split("gemm", "row", [4])
    before = s.key()
    c = s.copy()
    c.split("gemm", "col", [5])
    c.compute_at("gemm", "act", 0)
    c.annotate("act", 0, "parallel")
    assert s.key() == before and len(s.steps) == 1
    assert c.key() != before


# ---------------------------------------------------------------------------------------------
# errors name the stage and the iterator, and leave the state unchanged

def _expect_error(s: State, action, *fragments: str) -> str:
    key, n_steps = s.key(), len(s.steps)
    with pytest.raises(ScheduleError) as info:
        action(s)
    message = str(info.value)
    for fragment in fragments:
        assert re.search(rf"\b{re.escape(fragment)}\b", message), (fragment, message)
    assert s.key() == key and len(s.steps) == n_steps, "a rejected step changed the state"
    return message


def fresh_gemm():
    return State(gemm_relu_task().dag)


def test_error_split_of_annotated_iterator():
    s = fresh_gemm()
    s.annotate("gemm", "row", "parallel")
    msg = _expect_error(s, lambda s: s.split("gemm", "row", [4]), "gemm", "row")
    assert "parallel" in msg


def test_error_fuse_of_non_consecutive_iterators_names_stage():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.fuse("gemm", ["row", "kred"]), "gemm")


def test_error_fuse_of_non_consecutive_iterators_names_iterators():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.fuse("gemm", ["row", "kred"]), "gemm", "row", "kred")


def test_error_fuse_of_spatial_and_reduce():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.fuse("gemm", ["col", "kred"]), "gemm", "col", "kred")


@pytest.mark.parametrize("annotation", ["parallel", "vectorize"])
def test_error_annotation_on_reduce_iterator(annotation):
    s = fresh_gemm()
    _expect_error(s, lambda s: s.annotate("gemm", "kred", annotation), "gemm", "kred")


def test_error_parallel_on_reduce_iterator_reads_well():
    s = fresh_gemm()
    msg = _expect_error(s, lambda s: s.annotate("gemm", "kred", "parallel"), "gemm", "kred")
    assert "paralleld" not in msg


def test_error_compute_inline_of_reduction():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.compute_inline("gemm"), "gemm")


def test_error_compute_inline_of_output():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.compute_inline("act"), "act")


def test_error_compute_at_non_consumer():
    task = OPERATORS["layer_norm"].task()
    s = State(task.dag)
    # layer_norm_var reads layer_norm_mean, not the other way round
    _expect_error(s, lambda s: s.compute_at("layer_norm_var", "layer_norm_mean", 0),
                  "layer_norm_var", "layer_norm_mean")


def test_compute_at_with_a_consumer_outside_the_loop_fails_at_lowering():
    """'half' is read by 'expo' and by 'out': computing it inside expo's loop is accepted by the
    step (it only checks that the target is a consumer) and refused by bound inference."""
    from ansor.lower.lower import lower

    s = State(OPERATORS["elementwise_chain"].task().dag)
    s.compute_at("half", "expo", 0)
    with pytest.raises(ScheduleError, match=r"'half'.*'out'"):
        lower(s)


def test_error_compute_at_of_output_and_of_itself():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.compute_at("act", "gemm", 0), "act")
    _expect_error(s, lambda s: s.compute_at("gemm", "gemm", 0), "gemm")


def test_error_unknown_pragma():
    s = fresh_gemm()
    msg = _expect_error(s, lambda s: s.pragma("gemm", "row", "unroll_everything"), "gemm", "row")
    assert "unroll_everything" in msg
    _expect_error(s, lambda s: s.pragma("gemm", "row", "auto_unroll_max_step$x"), "gemm", "row")


def test_error_unknown_annotation():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.annotate("gemm", "col", "simd"), "gemm", "col")


def test_error_bad_stage_index_and_name():
    s = fresh_gemm()
    msg = _expect_error(s, lambda s: s.split(17, 0, [2]))
    assert "17" in msg
    _expect_error(s, lambda s: s.split("no_such_stage", 0, [2]), "no_such_stage")
    _expect_error(s, lambda s: s.split(-1, 0, [2]))


def test_error_bad_iterator():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.split("gemm", "zz", [2]), "gemm", "zz")
    msg = _expect_error(s, lambda s: s.split("gemm", 5, [2]), "gemm")
    assert "5" in msg


def test_error_placeholder_and_inlined_stages_have_no_loops():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.split("A", 0, [2]), "A")
    task = OPERATORS["elementwise_chain"].task()
    s = State(task.dag)
    s.compute_inline("half")
    _expect_error(s, lambda s: s.split("half", 0, [2]), "half")


def test_error_bad_split_lengths():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.split("gemm", "row", [0]), "gemm", "row")
    _expect_error(s, lambda s: s.split("gemm", "row", []), "gemm", "row")


def test_error_reorder_not_a_permutation():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.reorder("gemm", [0, 0, 1]), "gemm")
    _expect_error(s, lambda s: s.reorder("gemm", [0, 1]), "gemm")


def test_error_cache_write_after_other_steps():
    s = fresh_gemm()
    s.split("gemm", "row", [4])
    _expect_error(s, lambda s: s.cache_write("gemm", "local"), "gemm")
    _expect_error(s, lambda s: s.cache_write("act", "texture"), "act", "texture")


def test_error_rfactor_of_spatial_iterator_and_bad_factor_axis():
    s = fresh_gemm()
    _expect_error(s, lambda s: s.rfactor("gemm", "row", 0), "gemm", "row")
    _expect_error(s, lambda s: s.rfactor("gemm", "kred", 3), "gemm", "kred")


def test_error_follow_split_of_a_non_split_step():
    s = fresh_gemm()
    s.annotate("act", 0, "parallel")
    _expect_error(s, lambda s: s.follow_split("gemm", "row", 0, 1))
    s.split("act", "c", [2, 2])
    _expect_error(s, lambda s: s.follow_split("gemm", "col", 1, 3))


# ---------------------------------------------------------------------------------------------
# follow_split, cache_read, rfactor

@pytest.mark.parametrize("n_split, extents", [(1, [1, 16]), (2, [1, 4, 4]), (3, [1, 4, 2, 2])])
def test_follow_split_tiles_like_its_source(n_split, extents, builder):
    task = gemm_relu_task()
    s = State(task.dag)
    s.split("act", "r", [4, 2, 2])                      # step 0: r -> 1 x 4 x 2 x 2
    pieces = s.follow_split("gemm", "row", 0, n_split)
    assert [p.extent for p in pieces] == extents
    s.compute_at("gemm", "act", "r.0")
    check_gemm_relu(task, s, builder)


def test_cache_read_inserts_a_copy_stage(builder):
    task = gemm_relu_task()
    s = State(task.dag)
    new = s.cache_read("B", "shared", ["gemm"])
    stage = s.stages[new]
    assert stage.name == "B.shared" and stage.scope == "shared"
    assert [st.name for st in s.stages] == ["A", "B", "B.shared", "gemm", "act"]
    assert s.infos[new].consumers == [s.stage_id("gemm")]
    s.split("gemm", "col", [5])
    s.reorder("gemm", ["col.0", "row", "kred", "col.1"])
    s.compute_at("B.shared", "gemm", "col.0")
    check_gemm_relu(task, s, builder)
    with pytest.raises(ScheduleError, match="act"):
        s.cache_read("A", "local", ["act"])  # act does not read A


def test_cache_read_with_two_readers(builder):
    op = OPERATORS["layer_norm"]
    task = op.task()
    s = State(task.dag)
    readers = [st.name for st in s.stages if st.name.startswith("layer_norm")]
    s.cache_read("X", "local", readers)
    assert sum(st.name == "X.local" for st in s.stages) == 1
    run_and_check(op, task, s, builder)


@pytest.mark.parametrize("factor_axis", [0, 1])   # before and after the spatial axis i
@pytest.mark.parametrize("split", [4, 3])        # 20 = 5 x 4; 20 = 7 x 3 - 1 (guarded)
def test_rfactor_factor_axis(factor_axis, split, builder):
    task = row_sum_task()
    s = State(task.dag)
    s.split("rowsq", "k", [split])
    rf = s.rfactor("rowsq", "k.1", factor_axis)
    rf_stage, final = s.stages[rf], s.stages[rf + 1]
    assert rf_stage.name == "rowsq.rf"
    assert rf_stage.op.shape == ((split, 6) if factor_axis == 0 else (6, split))
    assert final.name == "rowsq" and [it.kind for it in final.iters] == ["spatial", "reduce"]
    assert final.iters[1].extent == split
    s.annotate("rowsq.rf", 0, "parallel")
    s.annotate("rowsq", "i", "vectorize")
    inputs = random_inputs(task)
    out = run_state(task, s, builder, inputs)
    x = inputs[0].astype(np.float64)
    assert_close(out, (x * x).sum(axis=1))
    replayed = State.replay(task.dag, steps_from_json(json.loads(json.dumps(s.steps_json()))))
    assert replayed.key() == s.key()


def test_rfactor_after_spatial_split(builder):
    task = row_sum_task()
    s = State(task.dag)
    s.split("rowsq", "i", [4])   # 6 = 2 x 4 - 2: the split is discarded by rfactor, its guard too
    s.split("rowsq", "k", [4])
    s.rfactor("rowsq", "k.1", 0)
    inputs = random_inputs(task)
    x = inputs[0].astype(np.float64)
    assert_close(run_state(task, s, builder, inputs), (x * x).sum(axis=1))


def test_rfactor_of_a_full_reduction(builder):
    op = OPERATORS["norm2"]
    task = op.task()
    s = State(task.dag)
    s.fuse("norm2_sum_sq", ["k0", "k1"])
    s.split("norm2_sum_sq", "k0@k1", [16])            # 120 = 8 x 16 - 8: guarded
    rf = s.rfactor("norm2_sum_sq", "k0@k1.1", 1)
    s.annotate(rf, 1, "vectorize")
    s.compute_at(rf, rf + 1, 0)
    run_and_check(op, task, s, builder)


# ---------------------------------------------------------------------------------------------
# the workload key

PINNED_KEYS = {
    "matmul_64": "wk1-c7d1f6433f6df4539822140519ea9096",
    "conv2d": "wk1-5dfa5393dedaae3173a6fb6e51ea89df",
    "softmax": "wk1-c05fd3c897c38195eb29b4d3a085f0c1",
}


def pinned_workloads():
    A = te.placeholder((64, 64), name="A")
    B = te.placeholder((64, 64), name="B")
    x = te.placeholder((1, 3, 32, 32), name="data")
    w = te.placeholder((16, 3, 3, 3), name="weight")
    X = te.placeholder((8, 64), name="X")
    return {
        "matmul_64": ansor.Task([A, B, te.ops.matmul(A, B)]),
        "conv2d": ansor.Task([x, w, te.ops.conv2d(x, w, stride=1, padding=1)]),
        "softmax": ansor.Task([X, te.ops.softmax(X)]),
    }


@pytest.mark.parametrize("name", sorted(PINNED_KEYS))
def test_pinned_workload_keys_never_change(name):
    assert pinned_workloads()[name].workload_key == PINNED_KEYS[name]


def test_workload_key_ignores_names():
    a = gemm_task(names=("A", "B", "C"))
    b = gemm_task(names=("lhs", "rhs", "product"))
    assert a.workload_key == b.workload_key
    P = te.placeholder((64, 64), name="P")
    Q = te.placeholder((64, 64), name="Q")
    k = te.reduce_axis(64, "inner")
    renamed = te.compute((64, 64), lambda y, x: te.sum(P[y, k] * Q[k, x], axis=k), name="mm")
    assert ansor.Task([P, Q, renamed]).workload_key == PINNED_KEYS["matmul_64"]


def test_workload_key_depends_on_shape_dtype_and_computation():
    base = gemm_task().workload_key
    assert gemm_task(m=17).workload_key != base
    assert gemm_task(k=25).workload_key != base
    assert gemm_task(dtype="float64").workload_key != base
    A = te.placeholder((16, 24), name="A")
    B = te.placeholder((24, 20), name="B")
    k = te.reduce_axis(24, "kred")
    plus = te.compute((16, 20), lambda i, j: te.sum(A[i, k] + B[k, j], axis=k), name="gemm")
    assert ansor.Task([A, B, plus]).workload_key != base
    maxed = te.compute((16, 20), lambda i, j: te.max(A[i, k] * B[k, j], axis=k), name="gemm")
    assert ansor.Task([A, B, maxed]).workload_key != base
    # the order of the inputs is the kernel's signature
    C = te.compute((16, 20), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="gemm")
    assert ansor.Task([B, A, C]).workload_key != ansor.Task([A, B, C]).workload_key


def test_state_key_identifies_the_program():
    task = gemm_task()
    s1, s2 = State(task.dag), State(task.dag)
    for s in (s1, s2):
        s.split(2, 0, [4])
        s.reorder(2, [0, 2, 3, 1])
    assert s1.key() == s2.key()
    s2.annotate(2, 0, "parallel")
    assert s1.key() != s2.key()
    s3 = State(task.dag)
    s3.split(2, 0, [2])
    s3.reorder(2, [0, 2, 3, 1])
    assert s3.key() != s1.key()


def test_stage_analysis_follows_the_rewrites_of_each_program():
    """Programs of one structure share their stage analysis; a cache stage changes it."""
    from ansor.workloads import make_task

    dag = make_task("matmul", (16, 16, 16)).dag
    plain, cached = State(dag), State(dag)
    cached.cache_write(cached.stages[-1].name, "local")
    again = State(dag)
    again.cache_write(again.stages[-1].name, "local")
    assert len(plain.infos) == len(plain.stages) == len(cached.stages) - 1
    assert len(cached.infos) == len(cached.stages)
    assert again.infos is cached.infos
    local = cached.stage_id(cached.stages[-1].name + ".local")
    assert cached.infos[local].consumers == [len(cached.stages) - 1]
    assert State(dag).infos is plain.infos
