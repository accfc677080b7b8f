"""Low-precision element types (float16, bfloat16, int8, uint8, int16, uint16, uint32, uint64)
through te, the numpy evaluator and the compiled C: integer kernels bit-exact against numpy's
own arithmetic in the type (wrapping), float16/bfloat16 kernels against numpy/ml_dtypes
(each operation computed in float32 and rounded to the type, so + - * / are bit-exact too),
casts between every pair, a reduction's accumulation type, the dtype rules of the builders."""

from __future__ import annotations

import re
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

import ansor
from ansor import te
from ansor.costmodel.features import FEATURE_NAMES, program_features
from ansor.kernel import build
from ansor.task import Task
from ansor.te.dtypes import DTYPES, INT_DTYPES, cast_array, int_range
from ansor.te.evaluate import evaluate
from ansor.te.serialize import tensors_from_data, tensors_to_data

NEW_INTS = ("int8", "int16", "uint8", "uint16", "uint32", "uint64")
HALVES = ("float16", "bfloat16")
N = 64


def _ints(dtype: str, rng: np.random.Generator, n: int = N) -> np.ndarray:
    """Values over the whole range, with the extremes and small values among them."""
    lo, hi = int_range(dtype)
    edges = [lo, hi, 0, 1, lo + 1, hi - 1] + ([-1] if lo < 0 else [2])
    rest = rng.integers(lo, hi, n - len(edges), dtype=np.dtype(dtype), endpoint=True)
    return np.concatenate([np.array(edges, dtype=dtype), rest])


@pytest.mark.parametrize("dtype", NEW_INTS + ("int32", "int64"))
def test_integer_arithmetic_compiles_bit_exact_with_numpy_wrapping(dtype):
    rng = np.random.default_rng(1)
    a_data, b_data = _ints(dtype, rng), _ints(dtype, rng)[::-1].copy()
    b_data[b_data == 0] = 3  # floor division and modulo by 0 are refused by the evaluator
    a = te.placeholder((N,), dtype, name="A")
    b = te.placeholder((N,), dtype, name="B")
    ops = {
        "add": (lambda i: a[i] + b[i], lambda x, y: x + y),
        "sub": (lambda i: a[i] - b[i], lambda x, y: x - y),
        "mul": (lambda i: a[i] * b[i], lambda x, y: x * y),
        "floordiv": (lambda i: a[i] // b[i], None),
        "mod": (lambda i: a[i] % b[i], None),
        "max": (lambda i: te.maximum(a[i], b[i]), np.maximum),
        "min": (lambda i: te.minimum(a[i], b[i]), np.minimum),
        "abs": (lambda i: te.abs(a[i]), lambda x, y: np.abs(x)),
        "neg": (lambda i: -a[i], lambda x, y: (0 - x).astype(dtype)),
        "less": (lambda i: te.if_then_else(a[i] < b[i], a[i], b[i] + 1), lambda x, y: np.where(x < y, x, y + 1)),
    }
    outs = [te.compute((N,), body, name=name) for name, (body, _) in ops.items()]
    got = build(Task([a, b, *outs]))(a_data, b_data)
    with np.errstate(all="ignore"):
        wide_a, wide_b = a_data.astype(object), b_data.astype(object)  # exact Python integers
        for (name, (_, ref)), out in zip(ops.items(), got):
            assert out.dtype == np.dtype(dtype), name
            if ref is None:  # Python's floor division and modulo, wrapped into the type
                exact = wide_a // wide_b if name == "floordiv" else wide_a % wide_b
                lo, hi = int_range(dtype)
                want = np.array([(v - lo) % (hi - lo + 1) + lo for v in exact], dtype=np.dtype(dtype))
            else:
                want = np.asarray(ref(a_data, b_data)).astype(dtype)
            np.testing.assert_array_equal(out, want, err_msg=f"{dtype} {name}")


@pytest.mark.parametrize("dtype", HALVES)
def test_half_float_arithmetic_rounds_after_every_operation_as_numpy(dtype):
    rng = np.random.default_rng(2)
    a_data = (rng.standard_normal(N) * 4).astype(dtype)
    b_data = (rng.standard_normal(N) + 0.1).astype(dtype)
    a_data[:4] = [np.nan, np.inf, -0.0, 65504 if dtype == "float16" else 3e38]
    a = te.placeholder((N,), dtype, name="A")
    b = te.placeholder((N,), dtype, name="B")
    exact = {  # one rounding each: bit-exact
        "add": (lambda i: a[i] + b[i], lambda x, y: x + y),
        "mul": (lambda i: a[i] * b[i] - 0.5, lambda x, y: x * y - np.asarray(0.5, dtype)),
        "div": (lambda i: a[i] / b[i], lambda x, y: x / y),
        "max": (lambda i: te.maximum(a[i], b[i]), np.maximum),
        "floor": (lambda i: te.floor(a[i] * 3), lambda x, y: np.floor(x * np.asarray(3, dtype))),
        "where": (lambda i: te.if_then_else(a[i] > b[i], a[i], b[i]), lambda x, y: np.where(x > y, x, y)),
    }
    math_ops = {  # computed in float32 and rounded once: within one unit of the type's last place
        "exp": (lambda i: te.exp(b[i]), np.exp),
        "tanh": (lambda i: te.tanh(a[i]), np.tanh),
        "sqrt": (lambda i: te.sqrt(te.abs(a[i])), lambda x: np.sqrt(np.abs(x))),
    }
    outs = [te.compute((N,), body, name=name) for name, (body, _) in {**exact, **math_ops}.items()]
    got = build(Task([a, b, *outs]))(a_data, b_data)
    expected = evaluate(outs, {a: a_data, b: b_data})
    eps = float(ml_dtypes.finfo(dtype).eps)
    with np.errstate(all="ignore"):
        for (name, (_, ref)), out, ev in zip(exact.items(), got, expected):
            want = np.asarray(ref(a_data, b_data)).astype(dtype)
            assert out.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(out.astype(np.float64), want.astype(np.float64), err_msg=name)
            np.testing.assert_array_equal(ev.astype(np.float64), want.astype(np.float64), err_msg=f"evaluate {name}")
        for (name, (_, ref)), out in zip(math_ops.items(), got[len(exact):]):
            want = ref(np.asarray(a_data if name != "exp" else b_data, np.float32))
            np.testing.assert_allclose(out.astype(np.float64), want, rtol=eps, atol=0, err_msg=name)


def _cast_sources(dtype: str, rng: np.random.Generator) -> np.ndarray:
    if dtype in INT_DTYPES:
        return _ints(dtype, rng)
    if dtype == "bool":
        return rng.random(N) < 0.5
    special = [np.nan, np.inf, -np.inf, -0.0, 0.5, 1.5, 2.5, -2.5, 127.5, -128.9, 255.9, 256.0, 40000.0,
               -40000.0, 70000.0, 3.0e9, -3.0e9, 1e19, 2.0 ** 63, -(2.0 ** 63), 2.0 ** 64,
               1 + 2 ** -8 + 2 ** -20, 1 + 2 ** -11 + 2 ** -20, 1e-40]
    rest = rng.standard_normal(N - len(special)) * 1000
    return cast_array(np.concatenate([special, rest]), dtype)  # beyond float16: inf


@pytest.mark.parametrize("source", DTYPES)
def test_cast_between_every_pair_of_types_matches_numpy_and_saturates(source):
    """Every conversion from `source`, compiled, equals `cast_array` (numpy's astype, with
    float to integer truncated and saturated, NaN to 0); where the float is in range that is
    numpy's own astype."""
    data = _cast_sources(source, np.random.default_rng(3))
    x = te.placeholder((N,), source, name="X")
    targets = [t for t in DTYPES if t not in (source, "bool")]  # a bool compute body is refused
    outs = [te.compute((N,), lambda i, t=t: te.cast(x[i], t), name=f"to_{t}") for t in targets]
    got = build(Task([x, *outs]))(data)
    for target, out in zip(targets, got):
        want = cast_array(data, target)
        assert out.dtype == want.dtype
        np.testing.assert_array_equal(_comparable(out), _comparable(want), err_msg=f"{source} -> {target}")
        if target in INT_DTYPES and source not in INT_DTYPES and source != "bool":
            lo, hi = int_range(target)
            with np.errstate(invalid="ignore"):
                inside = np.isfinite(data.astype(np.float64)) & (data.astype(np.float64) > lo - 1) & \
                    (data.astype(np.float64) < hi + 1)
                np.testing.assert_array_equal(out[inside], data[inside].astype(target))
                assert (out[data.astype(np.float64) >= 2.0 ** 64] == hi).all()
                assert (out[np.isnan(data.astype(np.float64))] == 0).all()
    np.testing.assert_array_equal(_comparable(evaluate(outs[:1], {x: data})[0]), _comparable(cast_array(data, targets[0])))


def _comparable(a: np.ndarray) -> np.ndarray:
    """Floats as float64 (numpy's NaN-aware comparison does not know bfloat16), integers as they are."""
    return a.astype(np.float64) if a.dtype.kind == "V" or a.dtype.kind == "f" else a


def _u8_s8_matmul(m: int, n: int, k_extent: int):
    A = te.placeholder((m, k_extent), "uint8", name="A")
    B = te.placeholder((k_extent, n), "int8", name="B", constant=True)
    k = te.reduce_axis(k_extent, name="k")
    C = te.compute((m, n), lambda i, j: te.sum(te.cast(A[i, k], "int16") * te.cast(B[k, j], "int16"),
                                               axis=k, dtype="int32"), name="C")
    return A, B, C


def test_u8_s8_matmul_accumulates_in_int32_bit_exact_with_numpy():
    m, n, k = 24, 40, 96
    A, B, C = _u8_s8_matmul(m, n, k)
    assert C.dtype == "int32" and "int32(int16(A[i, k]))" in repr(C.op.body)  # products widened
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    want = a.astype(np.int32) @ b.astype(np.int32)
    task = Task([A, B, C])
    np.testing.assert_array_equal(build(task)(a, b), want)
    np.testing.assert_array_equal(evaluate([C], {A: a, B: b})[0], want)
    s = ansor.State(task.dag)  # a tiled, vectorized, parallel program of the same declaration
    s.split("C", "i", [8])
    s.split("C", "j", [16])
    s.reorder("C", ["i.0", "j.0", "k", "i.1", "j.1"])
    s.annotate("C", "j.1", "vectorize")
    s.annotate("C", "i.0", "parallel")
    from ansor.kernel import compile_state
    np.testing.assert_array_equal(compile_state(task, s)(a, b), want)


def test_sum_dtype_computes_the_products_in_the_accumulation_type():
    A = te.placeholder((4, 8), "int8", name="A")
    k = te.reduce_axis(8, name="k")
    wide = te.compute((4,), lambda i: te.sum(A[i, k] * A[i, k], axis=k, dtype="int32"), name="W")
    narrow = te.compute((4,), lambda i: te.sum(A[i, k] * A[i, k], axis=k), name="N")
    a = np.full((4, 8), -100, np.int8)
    got_wide, got_narrow = build(Task([A, wide, narrow]))(a)
    np.testing.assert_array_equal(got_wide, np.full(4, 80000, np.int32))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got_narrow, (a * a).sum(axis=1, dtype=np.int8))


@pytest.mark.parametrize("dtype", HALVES)
def test_half_matmul_accumulates_in_float32_within_one_rounding(dtype):
    m, n, k_extent = 16, 24, 128
    X = te.placeholder((m, k_extent), dtype, name="X")
    W = te.placeholder((k_extent, n), dtype, name="W")
    k = te.reduce_axis(k_extent, name="k")
    acc = te.compute((m, n), lambda i, j: te.sum(X[i, k] * W[k, j], axis=k, dtype="float32"), name="acc")
    Y = te.compute((m, n), lambda i, j: te.cast(acc[i, j], dtype), name="Y")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((m, k_extent)).astype(dtype)
    w = rng.standard_normal((k_extent, n)).astype(dtype)
    want = (x.astype(np.float64) @ w.astype(np.float64))
    got = build(Task([X, W, Y]))(x, w).astype(np.float64)
    eps = float(ml_dtypes.finfo(dtype).eps)
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64))
    assert np.all(np.abs(got - want) <= eps / 2 * np.abs(want) + 1e-5 * scale)
    with pytest.raises(TypeError, match="float32"):
        te.compute((m, n), lambda i, j: te.sum(X[i, k] * W[k, j], axis=k))


def test_dtype_rules_refuse_silent_mixes_and_out_of_range_constants():
    u8 = te.placeholder((4,), "uint8", name="U")
    s8 = te.placeholder((4,), "int8", name="S")
    s32 = te.placeholder((4,), "int32", name="T")
    bf = te.placeholder((4,), "bfloat16", name="B")
    f32 = te.placeholder((4,), "float32", name="F")
    assert (s8[0] + s32[0]).dtype == "int32"  # one signedness: the wider
    assert (u8[0] + te.cast(s8[0], "uint32")).dtype == "uint32"
    for a, b in ((u8, s8), (bf, f32), (u8, f32), (s8, bf)):
        with pytest.raises(TypeError, match="te.cast"):
            a[0] + b[0]
    with pytest.raises(ValueError, match="does not fit uint8"):
        u8[0] + 256
    with pytest.raises(ValueError, match="does not fit int8"):
        te.const(-129, "int8")
    with pytest.raises(TypeError, match="float constant"):
        s8[0] * 0.5
    assert (bf[0] + 0.1).b.value == float(ml_dtypes.bfloat16(0.1))  # a constant takes the type, rounded
    with pytest.raises(TypeError, match="unsupported dtype 'float8"):
        te.placeholder((4,), "float8_e4m3fn")


def test_kernel_checks_input_dtypes_and_returns_the_declared_ones():
    x = te.placeholder((8,), "bfloat16", name="X")
    y = te.compute((8,), lambda i: x[i] * 2, name="Y")
    kernel = build(Task([x, y]))
    with pytest.raises(TypeError, match="bfloat16"):
        kernel(np.ones(8, np.float32))
    out = kernel(np.arange(8).astype(ml_dtypes.bfloat16))
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out.astype(np.float32), np.arange(8) * 2.0)


def test_declarations_of_every_type_round_trip_through_serialization():
    inputs = [te.placeholder((4,), dtype, name=f"P_{dtype}") for dtype in DTYPES]
    tensors = inputs + [te.compute((4,), lambda i, p=p: te.cast(p[i], "float32") * 0.1, name=f"C_{p.dtype}")
                        for p in inputs]
    again = tensors_from_data(tensors_to_data(tensors))
    assert [t.dtype for t in again] == [t.dtype for t in tensors]
    assert Task(tensors).workload_key == Task(again).workload_key


def test_features_count_the_bytes_of_the_element_type():
    def bytes_moved(dtype: str) -> float:  # the features are log2(1 + bytes)
        x = te.placeholder((256, 256), dtype, name="X")
        y = te.compute((256, 256), lambda i, j: x[j, i], name="Y")
        rows = program_features(ansor.State(Task([x, y]).dag))
        return float(sum(rows[0][k] for k, name in enumerate(FEATURE_NAMES) if name.endswith(".bytes")))

    # two buffers, each log2 one lower per halving of the element
    assert bytes_moved("bfloat16") == pytest.approx(bytes_moved("float32") - 2, abs=1e-3)
    assert bytes_moved("float32") == pytest.approx(bytes_moved("float64") - 2, abs=1e-3)
    assert bytes_moved("int8") == pytest.approx(bytes_moved("float32") - 4, abs=1e-3)


def test_gpu_printers_refuse_half_floats_by_name_and_print_narrow_integers():
    for dtype, ok in (("bfloat16", False), ("int8", True)):
        x = te.placeholder((64,), dtype, name="X")
        y = te.compute((64,), lambda i: x[i] + x[i], name="Y")
        task = Task([x, y], target=ansor.Target.cuda(arch="sm_90"))
        if ok:
            assert "signed char" in ansor.kernel.build(task).source
        else:  # CUDA has them (tests/test_cuda_half_types.py); OpenCL refuses them by name
            assert "__nv_bfloat16" in ansor.kernel.build(task).source
            with pytest.raises((TypeError, RuntimeError), match="opencl kernels of bfloat16 are not supported"):
                ansor.kernel.build(Task([x, y], target=ansor.Target.opencl()))


# --- dot-product instructions (VNNI vpdpbusd, AVX512-BF16 vdpbf16ps) found by the sketch rule ---

from ansor.backend.cpu import cpu_builder  # noqa: E402
from ansor.backend.registry import generate_source  # noqa: E402
from ansor.kernel import compile_state  # noqa: E402
from ansor.search.sketch_policy import SketchPolicy  # noqa: E402
from ansor.target import DOT_PRODUCT_FEATURES, Target  # noqa: E402

VNNI_512 = Target.cpu("avx512", 2, ("avx512_vnni",))
BF16_512 = Target.cpu("avx512", 2, ("avx512_bf16",))
VNNI_256 = Target.cpu("avx2", 2, ("avx_vnni",))
HOST = Target.host()


def _gemm(dtype_a: str, dtype_b: str, acc: str, n: int = 64):
    a = te.placeholder((n, n), dtype_a, name="A")
    b = te.placeholder((n, n), dtype_b, name="B", constant=True)
    k = te.reduce_axis(n, name="k")
    c = te.compute((n, n), lambda i, j: te.sum(te.cast(a[i, k], acc) * te.cast(b[k, j], acc), axis=k), name="C")
    return [a, b, c]


def _programs(target: Target, tensors, intrinsic: str, count: int = 2, seed: int = 0):
    """Sampled programs of the task whose C uses `intrinsic` (up to `count`), and one that
    does not (a sample whose tile is not whole vectors keeps the widening loop)."""
    task = Task(tensors, target=target)
    policy = SketchPolicy(task, seed=seed)
    using, widening = [], []
    for state in policy.sample(48):
        source, _ = generate_source(state, target)
        (using if intrinsic in source else widening).append((state, source))
    policy.close()
    return task, using[:count], widening[:1]


def _has(feature: str) -> bool:
    return feature in HOST.dot_products


def test_target_knows_its_dot_product_instructions_without_changing_its_key():
    flags = open("/proc/cpuinfo").read() if __import__("os").path.exists("/proc/cpuinfo") else ""
    for feature in DOT_PRODUCT_FEATURES:
        if feature in HOST.dot_products:
            assert feature in flags
    bare = Target.host(dot_products=())
    assert bare.key == HOST.key  # records of float32 programs are still found
    assert bare.dot_products == () and all(f.startswith("-mno-") for f in bare.instruction_flags)
    assert "-mavx512vnni" in VNNI_512.instruction_flags and "-mno-avx512bf16" in VNNI_512.instruction_flags
    assert VNNI_256.instruction_flags == ("-mavxvnni",)
    assert Target(**{**VNNI_512.describe(), "dot_products": ["avx512_vnni"]}) == VNNI_512  # from JSON
    with pytest.raises(ValueError, match="unknown dot-product"):
        Target.cpu("avx512", 1, ("avx512_vnni", "neon_dot"))
    with pytest.raises(ValueError, match="need AVX-512"):
        Target.cpu("avx2", 1, ("avx512_vnni",))
    missing = [f for f in DOT_PRODUCT_FEATURES if f not in HOST.dot_products and HOST.isa == "avx512"]
    if missing:
        with pytest.raises(ValueError, match="has no"):
            Target.host(dot_products=(missing[0],))


def test_sketch_rule_matches_int8_and_bf16_sums_only_where_the_target_has_the_instruction():
    def rules(target, tensors):
        policy = SketchPolicy(Task(tensors, target=target), seed=0)
        try:
            return [" ".join(s.history) for s in policy.sketches]
        finally:
            policy.close()

    int8 = _gemm("uint8", "int8", "int32")
    assert all("vpdpbusd" in h for h in rules(VNNI_512, int8))
    assert all("vpdpbusd" in h for h in rules(VNNI_256, int8))
    assert not any("dot_product" in h for h in rules(BF16_512, int8))
    assert not any("dot_product" in h for h in rules(Target.cpu("avx512", 2), int8))
    assert not any("dot_product" in h for h in rules(VNNI_512, _gemm("int8", "int8", "int32")))  # s8 x s8
    assert all("vdpbf16ps" in h for h in rules(BF16_512, _gemm("bfloat16", "bfloat16", "float32")))


@pytest.mark.parametrize("target,dtypes,intrinsic", [
    (VNNI_512, ("uint8", "int8", "int32"), "_mm512_dpbusd_epi32"),
    (VNNI_256, ("uint8", "int8", "int32"), "_mm256_dpbusd_avx_epi32"),
    (BF16_512, ("bfloat16", "bfloat16", "float32"), "_mm512_dpbf16_ps"),
])
def test_dot_product_programs_compile_for_their_target_on_any_x86_cpu(target, dtypes, intrinsic):
    """Compiled (never run) with the target's flags: the check holds on CPUs without the
    instruction too."""
    _, using, _ = _programs(target, _gemm(*dtypes), intrinsic)
    assert using, f"no sampled program used {intrinsic}"
    builder = cpu_builder(target)
    for result in builder.build([source for _, source in using]):
        assert result.error_no == 0, result.error_msg


@pytest.mark.parametrize("feature,isa", [("avx512_vnni", "avx512"), ("avx_vnni", "avx2"), (None, None)])
def test_uint8_int8_gemm_is_bit_exact_against_numpy_int32(feature, isa):
    """With the instruction where this CPU has it; on any CPU the widening loop (a target
    restricted to no dot-product instruction) gives the same int32 results."""
    if feature is not None and not _has(feature):
        feature = None  # this CPU lacks it: the widening loop is what runs here
    target = Target.host(isa=isa, dot_products=(feature,) if feature else ()) if isa and feature else \
        Target.host(dot_products=())
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (64, 64), dtype=np.uint8)
    b = rng.integers(-128, 128, (64, 64), dtype=np.int8)
    a[0, :], b[:, 0] = 255, -128  # the extreme products
    want = a.astype(np.int32) @ b.astype(np.int32)
    intrinsic = "dpbusd"
    task, using, widening = _programs(target, _gemm("uint8", "int8", "int32"), intrinsic)
    assert bool(using) == (feature is not None)
    for state, _ in using + widening:
        np.testing.assert_array_equal(compile_state(task, state)(a, b), want)


def test_bf16_gemm_within_one_bf16_rounding_of_the_float32_reference():
    feature = "avx512_bf16" if _has("avx512_bf16") else None
    target = Target.host(dot_products=(feature,) if feature else ())
    rng = np.random.default_rng(4)
    a = rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    want = a32.astype(np.float64) @ b32.astype(np.float64)
    bound = 2.0 ** -8 * (np.abs(a32) @ np.abs(b32))  # one bfloat16 rounding of the magnitudes' sum
    task, using, widening = _programs(target, _gemm("bfloat16", "bfloat16", "float32"), "dpbf16")
    assert bool(using) == (feature is not None)
    for state, _ in using + widening:
        got = compile_state(task, state)(a, b)
        assert got.dtype == np.float32
        assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("out_dtype,zero", [("uint8", 0.0), ("int8", -128.0)])
def test_requantization_to_8_bits_compiles_to_vector_conversions(out_dtype, zero):
    """A quantized layer's epilogue (int32 to float, scale, round, zero point, clamp, the
    saturating cast) runs as vector code for uint8 as for int8 outputs: gcc left the uint8
    form scalar once, most of a requantized uint8 layer's time. Checked in the compiled
    library (a packed float-to-int conversion), and its values against numpy."""
    if shutil.which("objdump") is None or HOST.isa not in ("avx2", "avx512"):
        pytest.skip("needs objdump and an x86 vector ISA")
    acc = te.placeholder((64, 256), "int32", name="acc")
    scale = te.placeholder((256,), "float32", name="scale")
    lo, hi = int_range(out_dtype)
    out = te.compute((64, 256), lambda i, j: te.cast(te.minimum(te.maximum(
        te.round(te.cast(acc[i, j], "float32") * scale[j]) + zero, float(lo)), float(hi)), out_dtype), name="q")
    kernel = build(Task([acc, scale, out]))
    rng = np.random.default_rng(6)
    a = rng.integers(-20000, 20000, (64, 256), dtype=np.int32)
    s = rng.uniform(0.001, 0.02, 256).astype(np.float32)
    want = np.clip(np.rint(a.astype(np.float32) * s) + np.float32(zero), lo, hi).astype(out_dtype)
    np.testing.assert_array_equal(kernel(a, s), want)
    disassembly = subprocess.run(["objdump", "-d", "--no-show-raw-insn", kernel.lib_path], capture_output=True,
                                 text=True, check=True).stdout
    assert re.search(r"vcvttps2u?dq\s+%[yz]mm", disassembly), "the saturating cast was compiled as scalar code"
