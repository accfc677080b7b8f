"""AMX tiles (tdpbusd, tdpbf16ps) for dot-product register tiles, checked on any CPU: the
programs a search samples for an AMX target are compiled with the tile instructions emulated in
plain C (`tests/amx_emulation.h`, as Intel's reference defines them) and run against numpy,
int8 bit-exact and bfloat16 within its rounding. Where the CPU has AMX itself, the same
programs also run on the real instructions."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import ansor
from ansor import te
from ansor.backend.cpu import cpu_builder
from ansor.backend.registry import generate_source
from ansor.instructions import amx_form, find_instruction
from ansor.kernel import compile_state
from ansor.measure.check import check_outputs
from ansor.search.sketch_policy import SketchPolicy
from ansor.target import Target

HERE = Path(__file__).parent
INT8_AMX = ("avx512_vnni", "amx_tile", "amx_int8")
BF16_AMX = ("avx512_bf16", "amx_tile", "amx_bf16")


def _emulating_builder(target: Target, tmp_path: Path):
    """The target's flags, with the tile instructions taken from the emulation header."""
    builder = cpu_builder(target, cache_dir=tmp_path / "amx-cache")
    builder.cflags = (*builder.cflags, "-DANSOR_AMX_EMULATION", f"-I{HERE}")
    return builder


def _matmul_task(m: int, k: int, n: int, lhs: str, rhs: str, acc: str, target: Target) -> ansor.Task:
    a = te.placeholder((m, k), lhs, name="a")
    b = te.placeholder((k, n), rhs, name="b")
    rk = te.reduce_axis(k, "k")
    c = te.compute((m, n), lambda i, j: te.sum(te.cast(a[i, rk], acc) * te.cast(b[rk, j], acc), axis=rk),
                   name="c")
    return ansor.Task([a, b, c], target=target, name="matmul")


def _sampled(task: ansor.Task, count: int = 48) -> list:
    policy = SketchPolicy(task, seed=0)
    try:
        return policy.sample(count)
    finally:
        policy.close()


def _amx_programs(task: ansor.Task, want: int = 3) -> list:
    return [s for s in _sampled(task) if "ansor_tile_dp" in generate_source(s, task.target)[0]][:want]


def test_amx_is_the_tile_form_of_the_vector_instructions():
    vnni = find_instruction(INT8_AMX, 64, "uint8", "int8", "int32")
    assert vnni.name == "vpdpbusd" and amx_form(vnni, INT8_AMX).name == "tdpbusd"
    assert amx_form(vnni, ("avx512_vnni",)) is None  # no AMX on the CPU: the vector instruction
    bf16 = find_instruction(BF16_AMX, 64, "bfloat16", "bfloat16", "float32")
    assert amx_form(bf16, BF16_AMX).name == "tdpbf16ps"
    assert find_instruction(("amx_tile", "amx_int8"), 64, "uint8", "int8", "int32") is None  # never matched alone


@pytest.mark.parametrize("shape", [(64, 256, 64), (48, 128, 96)], ids=["64x256x64", "48x128x96"])
def test_int8_amx_programs_are_bit_exact(shape, tmp_path):
    m, k, n = shape
    target = Target.cpu("avx512", 2, INT8_AMX)
    task = _matmul_task(m, k, n, "uint8", "int8", "int32", target)
    programs = _amx_programs(task)
    assert programs, "the search drew no AMX program for an AMX target"
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (m, k), dtype=np.uint8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a[0, :], b[:, 0] = 255, -128  # the extreme products
    want = a.astype(np.int32) @ b.astype(np.int32)
    builder = _emulating_builder(target, tmp_path)
    for state in programs:
        source = generate_source(state, target)[0]
        assert "ansor_amx_configure(16)" in source and "ansor_tile_stored" in source
        np.testing.assert_array_equal(compile_state(task, state, builder=builder)(a, b), want,
                                      err_msg=str(state))


def test_bf16_amx_programs_are_within_bf16_rounding(tmp_path):
    m, k, n = 32, 128, 64
    target = Target.cpu("avx512", 2, BF16_AMX)
    task = _matmul_task(m, k, n, "bfloat16", "bfloat16", "float32", target)
    programs = _amx_programs(task)
    assert programs, "the search drew no AMX program for an AMX target"
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    want = a.astype(np.float32) @ b.astype(np.float32)
    builder = _emulating_builder(target, tmp_path)
    for state in programs:
        got = compile_state(task, state, builder=builder)(a, b)
        assert check_outputs([got], [want]) is None, str(state)


def test_amx_programs_compile_with_the_real_instructions(tmp_path):
    """What an AMX machine would build: the same sources through immintrin.h's tile
    intrinsics with the target's -mamx-* flags (compiled only; this CPU may not run them)."""
    target = Target.cpu("avx512", 2, ("avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"))
    sources = [generate_source(s, target)[0]
               for s in _amx_programs(_matmul_task(64, 256, 64, "uint8", "int8", "int32", target), 2)]
    sources += [generate_source(s, target)[0]
                for s in _amx_programs(_matmul_task(32, 128, 32, "bfloat16", "bfloat16", "float32", target), 2)]
    assert len(sources) == 4
    assert "-mamx-int8" in cpu_builder(target).cflags and "-mamx-bf16" in cpu_builder(target).cflags
    for result in cpu_builder(target, cache_dir=tmp_path / "real").build(sources):
        assert result.lib_path is not None, result.error_msg


def test_a_target_without_amx_keeps_the_vector_instruction():
    target = Target.cpu("avx512", 2, ("avx512_vnni",))
    task = _matmul_task(64, 256, 64, "uint8", "int8", "int32", target)
    sources = [generate_source(s, target)[0] for s in _sampled(task, 16)]
    assert not any("ansor_tile" in src for src in sources)
    assert any("_mm512_dpbusd_epi32" in src for src in sources)


@pytest.mark.skipif("avx512_vnni" not in Target.host().dot_products, reason="this CPU has no AVX512-VNNI")
def test_an_amx_target_keeps_vectors_where_a_tile_is_not_an_amx_shape(tmp_path):
    """Register tiles of other shapes on the same AMX target stay vpdpbusd vectors (run here
    where the CPU has them), and every program of the sample is bit-exact."""
    target = Target.cpu("avx512", 2, INT8_AMX)
    task = _matmul_task(64, 256, 64, "uint8", "int8", "int32", target)
    states = _sampled(task, 24)
    sources = [generate_source(s, target)[0] for s in states]
    vectors = [s for s, src in zip(states, sources) if "_mm512_dpbusd_epi32" in src and "ansor_tile_dp" not in src]
    assert vectors and any("ansor_tile_dp" in src for src in sources)
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, (64, 256), dtype=np.uint8)
    b = rng.integers(-128, 128, (256, 64), dtype=np.int8)
    builder = _emulating_builder(target, tmp_path)
    for state in states[:8] + vectors[:2]:
        np.testing.assert_array_equal(compile_state(task, state, builder=builder)(a, b),
                                      a.astype(np.int32) @ b.astype(np.int32), err_msg=str(state))


@pytest.mark.skipif("amx_int8" not in Target.host().dot_products, reason="this CPU has no AMX")
def test_int8_amx_programs_on_this_cpu():
    target = Target.host()
    task = _matmul_task(64, 256, 64, "uint8", "int8", "int32", target)
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, (64, 256), dtype=np.uint8)
    b = rng.integers(-128, 128, (256, 64), dtype=np.int8)
    for state in _amx_programs(task):
        np.testing.assert_array_equal(compile_state(task, state)(a, b), a.astype(np.int32) @ b.astype(np.int32))


@pytest.mark.parametrize("shape,kernel,channels_out,stride,pads", [
    ((1, 6, 32, 64), (3, 3), 32, (1, 1), (1, 1, 1, 1)),
    ((2, 4, 16, 128), (1, 1), 16, (1, 1), (0, 0, 0, 0)),
], ids=["3x3", "1x1"])
def test_int8_nhwc_convolutions_as_amx_tiles_are_bit_exact(shape, kernel, channels_out, stride, pads, tmp_path):
    """A convolution's rows are output pixels along a row of the image and its reduction the
    input channels of each window position: the tiles read the padded input's copy."""
    from test_int8_convolutions import _conv_task, _numpy_conv_nhwc

    target = Target.cpu("avx512", 2, INT8_AMX)
    task = _conv_task(target, shape, kernel, channels_out, stride, pads, 131)
    programs = _amx_programs(task, 2)
    assert programs, "the search drew no AMX program for an AMX target"
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, shape, dtype=np.uint8)
    w = rng.integers(-128, 128, (*kernel, shape[3], channels_out), dtype=np.int8)
    want = _numpy_conv_nhwc(x, w, stride, pads, 131)
    builder = _emulating_builder(target, tmp_path)
    for state in programs:
        np.testing.assert_array_equal(compile_state(task, state, builder=builder)(x, w), want, err_msg=str(state))
