"""Per-store program features: layout, hand-checked values, and properties on sampled programs."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ansor
from ansor.costmodel.features import (
    FEATURE_COUNT, FEATURE_NAMES, extract_feature_rows, extract_features, features_for_states,
    program_features,
)
from ansor.lower import ir
from ansor.lower.lower import lower
from ansor.search.sketch_policy import SketchPolicy
from ansor.te import expr as E
from ansor.workloads import make_task_tensors
from helpers import tiled_matmul

COL = {name: i for i, name in enumerate(FEATURE_NAMES)}


def slog(x: float) -> float:
    return math.copysign(math.log2(abs(x) + 1), x)


def buffer_slots(row: np.ndarray) -> list[dict[str, float]]:
    """The five per-buffer groups of a row, as field -> value."""
    fields = [n[3:] for n in FEATURE_NAMES if n.startswith("B0.")]
    return [{f: float(row[COL[f"B{k}.{f}"]]) for f in fields} for k in range(5)]


def slot_of(row: np.ndarray, acc_type: str) -> dict[str, float]:
    found = [s for s in buffer_slots(row) if s[f"acc_type.{acc_type}"] == 1.0]
    assert len(found) == 1, f"expected one {acc_type} buffer, found {len(found)}"
    return found[0]


def vector_add(n_outer: int = 128, lanes: int = 8) -> ir.PrimFunc:
    """C[i] = A[i] + B[i] with i split into (n_outer, lanes) and the inner loop vectorized."""
    n = n_outer * lanes
    a, b, c = (ir.Buffer(name, (n,), "float32", role=role)
               for name, role in (("A", "input"), ("B", "input"), ("C", "output")))
    i0, i1 = E.Var("i0"), E.Var("i1")
    idx = i0 * lanes + i1
    store = ir.Store(c, (idx,), ir.BufferLoad(a, (idx,)) + ir.BufferLoad(b, (idx,)))
    body = ir.For(i0, n_outer, "serial", ir.For(i1, lanes, "vectorized", store))
    return ir.PrimFunc("add", [a, b, c], body)


def transpose(n: int = 64) -> ir.PrimFunc:
    """C[i, j] = A[j, i]: the read walks A with stride n in the innermost loop."""
    a = ir.Buffer("A", (n, n), "float32", role="input")
    c = ir.Buffer("C", (n, n), "float32", role="output")
    i, j = E.Var("i"), E.Var("j")
    body = ir.For(i, n, "serial", ir.For(j, n, "serial", ir.Store(c, (i, j), ir.BufferLoad(a, (j, i)))))
    return ir.PrimFunc("transpose", [a, c], body)


def matmul_task(m: int = 64, n: int = 64, k: int = 64) -> ansor.Task:
    return ansor.Task(make_task_tensors("matmul", (m, n, k)), name="matmul")


@pytest.fixture(scope="module")
def sampled() -> dict[str, list]:
    out = {}
    for name, shape in (("matmul", (64, 64, 64)), ("conv2d", (1, 16, 14, 14, 16, 3, 3)),
                        ("softmax", (64, 128))):
        task = ansor.Task(make_task_tensors(name, shape), name=name)
        out[name] = SketchPolicy(task, seed=0).sample(30)
    return out


# --- layout -----------------------------------------------------------------------------------

def test_feature_names_layout():
    assert FEATURE_COUNT == 164 == len(FEATURE_NAMES) == len(set(FEATURE_NAMES))
    assert FEATURE_NAMES[:3] == ("float_mad", "float_addsub", "float_mul")
    assert FEATURE_NAMES[14:16] == ("bool_op", "select_op")
    assert FEATURE_NAMES[16] == "vec_num" and FEATURE_NAMES[26] == "vec_type.kPosMixed"
    assert FEATURE_NAMES[49] == "is_gpu" and FEATURE_NAMES[56] == "vthread_len"
    assert FEATURE_NAMES[57] == "B0.acc_type.kRead" and FEATURE_NAMES[57 + 90 - 1] == "B4.stride"
    assert FEATURE_NAMES[147] == "arith_intensity_curve_0"
    assert FEATURE_NAMES[157:161] == ("alloc_size", "alloc_prod", "alloc_outer_prod", "alloc_inner_prod")
    assert FEATURE_NAMES[161:] == ("outer_prod", "num_loops", "auto_unroll_max_step")


def test_shape_and_dtype():
    x = extract_features(vector_add())
    assert x.shape == (1, FEATURE_COUNT) and x.dtype == np.float32


# --- a hand-checkable program -----------------------------------------------------------------

def test_vector_add_values():
    names, x = extract_feature_rows(vector_add(128, 8))
    assert names == ["C"]
    row = x[0]
    assert row[COL["float_addsub"]] == pytest.approx(slog(1024))
    assert row[COL["float_mul"]] == 0 and row[COL["float_mad"]] == 0
    # the shared index i0*8 + i1 is one mul and one add per load
    assert row[COL["int_mul"]] == pytest.approx(slog(2 * 1024))
    assert row[COL["vec_num"]] == pytest.approx(slog(1))
    assert row[COL["vec_len"]] == pytest.approx(slog(8))
    assert row[COL["vec_prod"]] == pytest.approx(slog(8))
    assert row[COL["vec_type.kPosMixed"]] == 1 and row[COL["vec_type.kPosNone"]] == 0
    assert row[COL["unroll_num"]] == 0 and row[COL["unroll_type.kPosNone"]] == 1
    assert row[COL["parallel_num"]] == 0 and row[COL["is_gpu"]] == 0
    assert row[COL["outer_prod"]] == pytest.approx(slog(1024))
    assert row[COL["num_loops"]] == pytest.approx(slog(2))
    slots = buffer_slots(row)
    assert [s["acc_type.kWrite"] for s in slots[:3]] == [1, 0, 0]  # ties keep C, A, B order
    assert all(s == {k: 0.0 for k in s} for s in slots[3:])
    for s in slots[:3]:
        assert s["bytes"] == pytest.approx(slog(4096))
        assert s["unique_bytes"] == pytest.approx(slog(4096))
        assert s["lines"] == pytest.approx(slog(1024 * 4 / 64))
        assert s["unique_lines"] == pytest.approx(slog(4096 / 64))
        assert s["stride"] == pytest.approx(slog(1))
        assert s["reuse_type.kNoReuse"] == 1
        assert s["bytes_d_reuse_ct"] == pytest.approx(slog(2 * 4096))
    assert row[COL["arith_intensity_curve_9"]] == pytest.approx(slog(1024 / (3 * 4096)), rel=1e-5)


def test_transposed_read_has_large_stride():
    row = extract_features(transpose(64))[0]
    write, read = slot_of(row, "kWrite"), slot_of(row, "kRead")
    assert write["stride"] == pytest.approx(slog(1))
    assert read["stride"] == pytest.approx(slog(64))
    assert read["lines"] == pytest.approx(slog(64 * 64))  # every access is a new line
    assert write["lines"] == pytest.approx(slog(64 * 64 * 4 / 64))
    # the sort puts the buffer with more cache lines first
    assert row[COL["B0.acc_type.kRead"]] == 1


def test_loop_reuse():
    """y[i] = sum_k x[k] * w[i, k]: x is re-read for every i with distance K iterations."""
    n, k = 32, 16
    x = ir.Buffer("x", (k,), "float32", role="input")
    w = ir.Buffer("w", (n, k), "float32", role="input")
    y = ir.Buffer("y", (n,), "float32", role="output")
    i, r = E.Var("i"), E.Var("r")
    update = ir.Store(y, (i,), ir.BufferLoad(y, (i,)) + ir.BufferLoad(x, (r,)) * ir.BufferLoad(w, (i, r)))
    body = ir.For(i, n, "parallel", ir.seq([ir.Store(y, (i,), E.Const(0.0, "float32")),
                                             ir.For(r, k, "serial", update)]))
    row = extract_features(ir.PrimFunc("gemv", [x, w, y], body))[0]
    out = slot_of(row, "kReadWrite")
    assert out["reuse_type.kLoopMultipleRead"] == 1
    assert out["reuse_ct"] == pytest.approx(slog(k))
    assert out["reuse_dis_iter"] == pytest.approx(slog(1))
    reads = [s for s in buffer_slots(row) if s["acc_type.kRead"] == 1]
    vec = next(s for s in reads if s["unique_bytes"] == pytest.approx(slog(k * 4)))
    assert vec["reuse_type.kLoopMultipleRead"] == 1
    assert vec["reuse_ct"] == pytest.approx(slog(n))
    assert vec["reuse_dis_iter"] == pytest.approx(slog(k))
    assert row[COL["parallel_num"]] == pytest.approx(slog(1))
    assert row[COL["parallel_len"]] == pytest.approx(slog(n))
    assert row[COL["parallel_type.kPosMixed"]] == 1


def test_serial_reuse_of_two_reads_in_one_statement():
    n = 64
    a = ir.Buffer("A", (n + 1,), "float32", role="input")
    c = ir.Buffer("C", (n,), "float32", role="output")
    i = E.Var("i")
    store = ir.Store(c, (i,), ir.BufferLoad(a, (i,)) + ir.BufferLoad(a, (i + 1,)))
    row = extract_features(ir.PrimFunc("stencil", [a, c], ir.For(i, n, "serial", store)))[0]
    read = slot_of(row, "kRead")
    assert read["reuse_type.kSerialMultipleReadWrite"] == 1
    assert read["reuse_ct"] == pytest.approx(slog(1))
    assert read["unique_bytes"] == pytest.approx(slog((n + 1) * 4))


def test_gpu_bindings():
    task = matmul_task(64, 64, 64)
    s = ansor.State(task.dag)
    i, j, k = [it.name for it in s.stages[-1].iters]
    io, ii = s.split("matmul", i, [8])
    jo, ji = s.split("matmul", j, [16])
    s.reorder("matmul", [io, jo, ii, ji, k])
    s.annotate("matmul", io, "blockIdx.x")
    s.annotate("matmul", jo, "vthread")
    s.annotate("matmul", ii, "threadIdx.x")
    row = program_features(s)[0]
    assert row[COL["is_gpu"]] == 1
    assert row[COL["blockIdx_x_len"]] == pytest.approx(slog(8))
    assert row[COL["threadIdx_x_len"]] == pytest.approx(slog(8))
    assert row[COL["vthread_len"]] == pytest.approx(slog(4))
    assert row[COL["blockIdx_y_len"]] == pytest.approx(slog(1))
    assert row[COL["parallel_num"]] == 0
    assert row[COL["outer_prod"]] == pytest.approx(slog(64 ** 3))


# --- lowered programs -------------------------------------------------------------------------

def test_matmul_op_counts():
    m, n, k = 16, 32, 8
    names, x = extract_feature_rows(lower(ansor.State(matmul_task(m, n, k).dag)))
    assert names == ["matmul"]
    row = x[0]
    assert row[COL["float_mul"]] == pytest.approx(slog(m * n * k))
    assert row[COL["float_addsub"]] == pytest.approx(slog(m * n * k))
    assert row[COL["outer_prod"]] == pytest.approx(slog(m * n * k))  # the update wins
    assert row[COL["num_loops"]] == pytest.approx(slog(3))


def test_matmul_sketches_count_every_multiply_once(sampled):
    expected = slog(64 ** 3)
    for x in features_for_states(sampled["matmul"]):
        with_mul = x[x[:, COL["float_mul"]] > 0]
        assert len(with_mul) == 1
        assert with_mul[0, COL["float_mul"]] == pytest.approx(expected)
        assert with_mul[0, COL["float_addsub"]] >= expected - 1e-4


def test_parallel_annotation_appears(monkeypatch):
    from ansor.lower import small_parallel

    monkeypatch.setattr(small_parallel, "MIN_PARALLEL_ITERATIONS", 0)  # a kernel this small runs serially otherwise
    task = matmul_task(32, 32, 32)
    plain = ansor.State(task.dag)
    par = ansor.State(task.dag)
    par.parallel("matmul", par.stages[-1].iters[0].name)
    row0, row1 = program_features(plain)[0], program_features(par)[0]
    assert row0[COL["parallel_num"]] == 0 and row0[COL["parallel_type.kPosNone"]] == 1
    assert row1[COL["parallel_num"]] == pytest.approx(slog(1))
    assert row1[COL["parallel_prod"]] == pytest.approx(slog(32))
    assert row1[COL["parallel_type.kPosMixed"]] == 1


def test_tile_sizes_change_features():
    task = matmul_task(64, 64, 64)

    def tiled(factor: int) -> np.ndarray:
        s = ansor.State(task.dag)
        i, j, k = [it.name for it in s.stages[-1].iters]
        io, ii = s.split("matmul", i, [factor])
        jo, ji = s.split("matmul", j, [factor])
        s.reorder("matmul", [io, jo, k, ii, ji])
        return program_features(s)

    a, b = tiled(4), tiled(16)
    assert a.shape == b.shape
    assert not np.array_equal(a, b)


def test_allocation_features(sampled):
    """A cache_write buffer's row carries its allocation size."""
    checked = 0
    for state in sampled["matmul"]:
        func = lower(state)
        allocs = {s.buffer.name: s.buffer for s in ir.walk_stmts(func.body) if isinstance(s, ir.Allocate)}
        names, x = extract_feature_rows(func)
        for name, row in zip(names, x):
            if name in allocs:
                assert row[COL["alloc_size"]] == pytest.approx(slog(allocs[name].nbytes))
                checked += 1
            else:
                assert not row[COL["alloc_size"]:COL["alloc_inner_prod"] + 1].any()
    assert checked > 0


def test_finite_and_in_layout(sampled):
    one_hot = np.array(["_type.k" in n or n == "is_gpu" for n in FEATURE_NAMES])
    for states in sampled.values():
        for x in features_for_states(states):
            assert x.ndim == 2 and x.shape[1] == FEATURE_COUNT and x.shape[0] >= 1
            assert np.isfinite(x).all()
            assert set(np.unique(x[:, one_hot])) <= {0.0, 1.0}
            for prefix in ("B0.acc_type.", "B0.reuse_type.", "vec_type.", "parallel_type."):
                cols = [COL[n] for n in FEATURE_NAMES if n.startswith(prefix)]
                assert (x[:, cols].sum(axis=1) == 1).all()


def test_deterministic(sampled):
    """Features are those of the program as it runs on the target (by default this machine):
    lowered, with its backend's passes."""
    from ansor.backend import lower_for

    host = ansor.Target.host()
    for states in sampled.values():
        for state in states[:10]:
            a = extract_features(lower_for(state, host))
            b = extract_features(lower_for(state, host))
            assert np.array_equal(a, b)
            c = program_features(ansor.State.replay(state.dag, state.steps))
            assert np.array_equal(a, c)


def test_features_for_states_memo(sampled):
    states = sampled["softmax"][:5]
    out = features_for_states(states + states)
    assert len(out) == 10
    for first, again in zip(out[:5], out[5:]):
        assert first is again


def test_unlowerable_program_has_no_rows():
    task = matmul_task(32, 32, 32)
    s = ansor.State(task.dag)
    s.split("matmul", s.stages[-1].iters[0].name, [None])  # length left undecided
    x = program_features(s)
    assert x.shape == (0, FEATURE_COUNT)
    assert features_for_states([s])[0].shape == (0, FEATURE_COUNT)


# ---------------------------------------------------------------------------------------------
# the program as it runs: register tiles and transposed stores of the CPU's lowering passes

AVX2 = ansor.Target("cpu", "avx2", 2, 32, 64)
AVX512 = ansor.Target("cpu", "avx512", 2, 64, 64)
UNROLL_COLUMNS = {COL[n] for n in FEATURE_NAMES if n.startswith("unroll_")}


def tiled_matmul_state() -> ansor.State:
    """matmul with a 4 x 16 cache-write tile: k outermost in the tile, j vectorized."""
    return tiled_matmul()[1]


def test_a_register_tile_counts_its_rows_as_unrolled():
    """The rows loop of the tile is unrolled into vector statements: the accumulator's row
    differs from the plain loops' only in the unroll columns (one loop of 4); other rows match."""
    from ansor.backend import lower_for

    s = tiled_matmul_state()
    func = lower_for(s, AVX2)
    assert any(isinstance(x, ir.RegisterTile) for x in ir.walk_stmts(func.body))
    plain_names, plain = extract_feature_rows(lower(s))
    names, tiled = extract_feature_rows(func)
    assert names == plain_names
    for name, a, b in zip(names, plain, tiled):
        differ = set(np.flatnonzero(a != b))
        if name == "matmul.local":
            assert differ and differ <= UNROLL_COLUMNS
            assert b[COL["unroll_num"]] == pytest.approx(slog(1)) and b[COL["unroll_prod"]] == pytest.approx(slog(4))
            assert a[COL["unroll_num"]] == 0
        else:
            assert not differ, name
    assert np.array_equal(program_features(s, target=AVX2), tiled)


def transposing_state(op: str) -> ansor.State:
    """out[c, x] = A[x, c] (or 2 A[x, c]) in tiles of 4 columns x 32 channels, vectorized along
    the channels: contiguous in the columns, strided by 24 in the vector axis."""
    from ansor import te

    A = te.placeholder((24, 64), name="A")
    if op == "copy":
        out = te.compute((64, 24), lambda c, x: A[x, c], name="out")
    else:
        out = te.compute((64, 24), lambda c, x: A[x, c] * 2.0, name="out")
    s = ansor.State(ansor.Task([A, out]).dag)
    s.split("out", "c", [32])
    s.split("out", "x", [4])
    s.reorder("out", ["c.0", "x.0", "x.1", "c.1"])
    s.annotate("out", "c.1", "vectorize")
    return s


@pytest.mark.parametrize("op", ["copy", "scale"])
def test_a_transposed_store_is_described_as_it_runs(op):
    """The write runs vectorized along the contiguous columns (stride 1, 4 lanes) instead of
    the channels (stride 24, 32 lanes); a value that is not a plain load is computed into a
    staging buffer first, which gets its own row with the value's float operations."""
    from ansor.backend import lower_for

    s = transposing_state(op)
    func = lower_for(s, AVX512)
    assert any(isinstance(x, ir.TransposedStore) for x in ir.walk_stmts(func.body))
    _, plain = extract_feature_rows(lower(s))
    names, rows = extract_feature_rows(func)
    assert names == (["out"] if op == "copy" else ["out_tr", "out"])
    write = rows[names.index("out")]
    assert slot_of(plain[0], "kWrite")["stride"] == pytest.approx(slog(24)) and plain[0][COL["vec_len"]] == pytest.approx(slog(32))
    assert slot_of(write, "kWrite")["stride"] == pytest.approx(slog(1)) and write[COL["vec_len"]] == pytest.approx(slog(4))
    if op == "scale":
        staged = rows[names.index("out_tr")]
        assert staged[COL["float_mul"]] == plain[0][COL["float_mul"]] > 0
        assert staged[COL["alloc_size"]] == pytest.approx(slog(4 * 32 * 4))
        assert write[COL["float_mul"]] == 0
