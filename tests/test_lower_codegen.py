"""Lowering and C code generation: guards, local buffers of attached stages, name sanitizing,
real vectorization (checked in the assembly), OpenMP and unroll pragmas."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.backend import generate_source
from ansor.lower import ir
from ansor.lower.lower import lower
from ansor.measure import DEFAULT_CFLAGS
from ansor.kernel import compile_state
from ansor.te import expr as E
from ansor.te.arith import simplify
from ansor.te.printer import expr_to_str
from helpers import OPERATORS, assert_close, random_inputs, run_and_check, run_state


def add_task(m=10, n=10) -> ansor.Task:
    X = te.placeholder((m, n), name="X")
    Y = te.placeholder((m, n), name="Y")
    return ansor.Task([X, Y, te.compute((m, n), lambda i, j: X[i, j] + Y[i, j], name="Z")])


def check_add(task, s, builder):
    inputs = random_inputs(task)
    assert_close(run_state(task, s, builder, inputs), inputs[0] + inputs[1])


def gemm_relu_task() -> ansor.Task:
    A = te.placeholder((16, 24), name="A")
    B = te.placeholder((24, 20), name="B")
    k = te.reduce_axis(24, "k")
    C = te.compute((16, 20), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="gemm")
    return ansor.Task([A, B, te.compute((16, 20), lambda r, c: te.maximum(C[r, c], 0.0),
                                        name="act")])


def check_gemm_relu(task, s, builder):
    inputs = random_inputs(task)
    a, b = (x.astype(np.float64) for x in inputs)
    assert_close(run_state(task, s, builder, inputs), np.maximum(a @ b, 0.0))


def stmts(state: ansor.State, kind: type) -> list:
    return [x for x in ir.walk_stmts(lower(state).body) if isinstance(x, kind)]


def assert_well_scoped(stmt: ir.Stmt, bound: frozenset = frozenset()) -> None:
    """Every variable a statement uses is a loop variable of an enclosing loop."""
    def check(e: E.Expr, where: str):
        for node in E.walk(e):
            if isinstance(node, E.Var):
                assert id(node) in bound, f"{node.name} is used outside its loop in {where}"

    if isinstance(stmt, ir.For):
        assert_well_scoped(stmt.body, bound | {id(stmt.var)})
    elif isinstance(stmt, ir.Seq):
        for x in stmt.stmts:
            assert_well_scoped(x, bound)
    elif isinstance(stmt, ir.IfThenElse):
        check(stmt.cond, "a guard")
        assert_well_scoped(stmt.then, bound)
        if stmt.orelse is not None:
            assert_well_scoped(stmt.orelse, bound)
    elif isinstance(stmt, ir.Allocate):
        assert_well_scoped(stmt.body, bound)
    elif isinstance(stmt, ir.Store):
        for idx in stmt.indices:
            check(idx, f"a store to {stmt.buffer.name}")
        check(stmt.value, f"a store to {stmt.buffer.name}")


# ---------------------------------------------------------------------------------------------
# guards

def test_divisible_split_has_no_guard(builder):
    task = add_task(12, 10)
    s = ansor.State(task.dag)
    s.split("Z", "i", [3])
    s.split("Z", "j", [2], inner_to_outer=False)
    assert stmts(s, ir.IfThenElse) == []
    check_add(task, s, builder)


@pytest.mark.parametrize("lengths, inner_to_outer", [([3], True), ([4], False), ([2, 3], True),
                                                      ([6], True)])
def test_non_divisible_split_is_guarded(lengths, inner_to_outer, builder):
    task = add_task(10, 10)
    s = ansor.State(task.dag)
    s.split("Z", "i", lengths, inner_to_outer)
    guards = stmts(s, ir.IfThenElse)
    assert len(guards) == 1
    assert "< 10" in expr_to_str(guards[0].cond)
    assert_well_scoped(lower(s).body)
    check_add(task, s, builder)


@pytest.mark.parametrize("lengths", [[7], [5, 2], [4, 4]])
def test_non_divisible_reduce_split_is_guarded(lengths, builder):
    """The guard of a reduce split belongs inside the reduce loops, never around the init."""
    task = gemm_relu_task()
    s = ansor.State(task.dag)
    s.split("gemm", "k", lengths)
    s.split("gemm", "j", [3])
    assert stmts(s, ir.IfThenElse)
    assert_well_scoped(lower(s).body)
    check_gemm_relu(task, s, builder)


def test_guard_of_a_region_that_sticks_out(builder):
    """A padded conv computed per output row: the pad stage's region is clipped by guards."""
    op = OPERATORS["conv2d_s2"]
    task = op.task()
    s = ansor.State(task.dag)
    s.split("conv2d", "yy", [3])            # 5 rows = 2 x 3 - 1
    s.compute_at("conv2d_pad", "conv2d", "yy.1")
    assert_well_scoped(lower(s).body)
    run_and_check(op, task, s, builder)


# ---------------------------------------------------------------------------------------------
# attached stages get small local buffers

def allocations(state) -> dict[str, ir.Buffer]:
    return {a.buffer.name: a.buffer for a in stmts(state, ir.Allocate)}


def test_compute_at_allocates_the_tile_locally(builder):
    task = gemm_relu_task()
    s = ansor.State(task.dag)
    s.split("act", "r", [4])
    s.split("act", "c", [5])
    s.reorder("act", ["r.0", "c.0", "r.1", "c.1"])
    s.compute_at("gemm", "act", "c.0")
    body = lower(s).body
    (alloc,) = [x for x in ir.walk_stmts(body) if isinstance(x, ir.Allocate)]
    assert alloc.buffer.name == "gemm"
    assert alloc.buffer.shape == (4, 5) and alloc.buffer.scope == "local"
    # allocated inside the c.0 loop: one tile per iteration
    (outer,) = [f for f in ir.walk_stmts(body) if isinstance(f, ir.For) and f.var.name == "c.0"]
    assert any(x is alloc for x in ir.walk_stmts(outer.body))
    check_gemm_relu(task, s, builder)


@pytest.mark.parametrize("op_name, at, shape", [
    ("conv2d_s1", "yy", (1, 3, 3, 12)),   # 3 input rows (a 3x3 window), every padded column
    ("conv2d_s2", "xx", (1, 3, 3, 3)),    # one output pixel reads a 3x3 window per channel
])
def test_compute_at_pad_into_conv(op_name, at, shape, builder):
    op = OPERATORS[op_name]
    task = op.task()
    s = ansor.State(task.dag)
    s.compute_at("conv2d_pad", "conv2d", at)
    buf = allocations(s)["conv2d_pad"]
    assert buf.shape == shape and buf.scope == "local"
    run_and_check(op, task, s, builder)


def guarded_selects(stmt: ir.Stmt) -> int:
    """How many stores of `stmt` hold a select (a bounds check) in their value."""
    return sum(1 for x in ir.walk_stmts(stmt) if isinstance(x, ir.Store)
               and any(isinstance(n, E.Select) for n in E.walk(x.value)))


@pytest.mark.parametrize("lengths, at", [
    ([4], "xx.0"),      # tiles of 4 columns: the first and last touch the padding
    ([5], "xx.0"),      # 9 = 5 + 4: a partial last tile, guarded by an if
    ([3], "xx.1"),      # a 3x3 window per output pixel
    ([9], "xx.1"),
])
def test_padded_copy_runs_unguarded_inside_the_image(lengths, at, builder):
    """The pad's bounds check is unswitched: the copy runs without it where the whole nest is
    inside the image, with it at the border, and the output matches numpy either way."""
    from ansor.backend import lower_for

    op = OPERATORS["depthwise_conv2d"]
    task = op.task()
    s = ansor.State(task.dag)
    s.split("depthwise_conv2d", "xx", lengths)
    s.compute_at("depthwise_conv2d_pad", "depthwise_conv2d", at)
    func = lower_for(s, task.target)
    switched = [x for x in ir.walk_stmts(func.body) if isinstance(x, ir.Unswitched)]
    assert switched
    for node in switched:
        assert guarded_selects(node.fast) == 0 and guarded_selects(node.slow) > 0
    run_and_check(op, task, s, builder)


def test_cache_write_buffer_is_the_tile(builder):
    task = gemm_relu_task()
    s = ansor.State(task.dag)
    cache = s.cache_write("gemm", "local")
    s.split("gemm", "i", [2])
    s.split("gemm", "j", [4])
    s.reorder("gemm", ["i.0", "j.0", "i.1", "j.1"])
    s.compute_at(cache, "gemm", "j.0")
    buf = allocations(s)["gemm.local"]
    assert buf.shape == (2, 4) and buf.scope == "local"
    check_gemm_relu(task, s, builder)


@pytest.mark.parametrize("tile, physical", [(5, (4, 24, 5)), (6, (4, 24, 6))])  # 20 = 4 x 5
def test_transform_layout_stores_the_tiled_copy(tile, physical, builder):
    task = gemm_relu_task()
    s = ansor.State(task.dag)
    s.cache_read("B", "global", ["gemm"])
    s.split("gemm", "j", [tile])                          # step 1
    s.reorder("gemm", ["i", "j.0", "k", "j.1"])
    s.transform_layout("B.global", 1, 1, 0)               # dimension 1 (j) tiled by `tile`
    assert allocations(s)["B.global"].shape == physical
    assert_well_scoped(lower(s).body)
    check_gemm_relu(task, s, builder)


# ---------------------------------------------------------------------------------------------
# user names never reach the C compiler unsanitized

SAFE_NAMES = [("my tensor;drop", "for", "3x"), ("int", "main", "number"), ("x", "x", "x_1"),
              ("", "ansor_max_f32", "Ünïcode out"), ("a" * 200, "kernel", "restrict")]


@pytest.mark.parametrize("names", SAFE_NAMES, ids=lambda n: "|".join(n)[:40])
def test_user_names_are_sanitized(names, builder):
    X = te.placeholder((8, 12), name=names[0])
    Y = te.placeholder((8, 12), name=names[1])
    k = te.reduce_axis(12, "red;uce")
    S = te.compute((8,), lambda i: te.sum(X[i, k] * Y[i, k], axis=k), name="s um")
    Z = te.compute((8, 12), lambda i, j: te.exp(X[i, j]) - S[i], name=names[2])
    task = ansor.Task([X, Y, Z])
    s = ansor.State(task.dag)
    s.split(Z, 1, [5])
    s.annotate(Z, 0, "parallel")
    kernel = compile_state(task, s, builder=builder)
    try:
        for raw in set(names) | {"red;uce", "s um"}:
            if re.search(r"\W", raw, re.ASCII):
                assert raw not in kernel.source
        signature = re.search(rf"void {kernel.func_name}\((.*)\)", kernel.source).group(1)
        params = re.findall(r"restrict (\w+)", signature)
        assert len(set(params)) == 3
        for p in params:
            assert re.fullmatch(r"[A-Za-z_]\w*", p, re.ASCII)
            assert p not in ("for", "int", "main", "restrict")
        x, y = random_inputs(task)
        out = kernel(x, y)
        assert_close(out, np.exp(x) - (x.astype(np.float64) * y).sum(axis=1, keepdims=True))
        kernel._lib.timed([x, y, out], 1)  # the timing entry point also compiles and runs
    finally:
        kernel.close()


RUN_IN_SUBPROCESS = textwrap.dedent("""
    import sys
    import numpy as np
    import ansor
    from ansor import te
    from ansor.kernel import compile_state
    from ansor.measure import Builder

    name, where, cache = sys.argv[1:]
    X = te.placeholder((8, 12), name=name if where == "input" else "X")
    k = te.reduce_axis(12, name if where == "axis" else "k")
    S = te.compute((8,), lambda i: te.sum(te.exp(X[i, k]), axis=k), name="S")
    Z = te.compute((8, 12), lambda i, j: te.exp(X[i, j]) / S[i], name="Z")
    task = ansor.Task([X, Z])
    kernel = compile_state(task, ansor.State(task.dag), builder=Builder(cache_dir=cache))
    x = np.random.default_rng(0).uniform(-1, 1, (8, 12)).astype("float32")
    out = kernel(x)
    e = np.exp(x.astype(np.float64))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-6)
    kernel._lib.timed([x, out], 1)
    print("ok")
""")


@pytest.mark.parametrize("name, where", [
    ("t0", "input"), ("r", "input"), ("expf", "input"), ("int32_t", "input"), ("true", "input"),
    ("INFINITY", "input"), ("NAN", "input"), ("NULL", "input"), ("clock_gettime", "input"),
    ("asm", "input"), ("expf", "axis"), ("INFINITY", "axis"),
])
def test_names_of_the_generated_code_are_reserved(name, where, tmp_path):
    """Run in a child process: some of these kernels crash when called."""
    run_named_kernel_in_subprocess(name, where, tmp_path)


@pytest.mark.parametrize("name", ["linux", "unix", "M_PI", "INT32_MAX", "EXIT_SUCCESS", "RAND_MAX",
                                  "CLOCKS_PER_SEC", "FP_NAN", "HUGE_VALL", "__linux__"])
def test_macro_names_of_the_headers_are_not_used(name, tmp_path):
    run_named_kernel_in_subprocess(name, "input", tmp_path)


def run_named_kernel_in_subprocess(name: str, where: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", RUN_IN_SUBPROCESS, name, where, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_index_term_order_does_not_depend_on_object_addresses():
    def simplified(lower_address_name: str) -> str:
        first, second = E.Var("?"), E.Var("?")
        low, high = sorted((first, second), key=id)
        low.name = lower_address_name
        high.name = "q" if lower_address_name == "p" else "p"
        p, q = (low, high) if low.name == "p" else (high, low)
        return expr_to_str(simplify((p % 2) * 120 + q % 20))

    assert simplified("p") == simplified("q")


# ---------------------------------------------------------------------------------------------
# vectorization is real: gcc emits wide vector instructions for the annotated loop

def vector_register() -> str:
    isa = ansor.Target.host().isa
    if isa == "avx512":
        return "zmm"
    if isa == "avx2":
        return "ymm"
    pytest.skip(f"host ISA {isa!r} has no wide float vectors to check for")


def compile_to_assembly(source: str, tmp_path: Path) -> tuple[str, str, Path]:
    """(assembly, gcc's vectorization report, C path), with the flags the Builder uses."""
    c_path = tmp_path / "kernel.c"
    c_path.write_text(source)
    flags = [f for f in DEFAULT_CFLAGS if f not in ("-shared", "-fPIC")]
    asm = tmp_path / "kernel.s"
    proc = subprocess.run(["gcc", *flags, "-S", "-fopt-info-vec-optimized", "-o", str(asm),
                           str(c_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return asm.read_text(), proc.stderr, c_path


def simd_statement_lines(source: str) -> list[int]:
    """1-based line numbers of the statements inside `#pragma omp simd` loops."""
    lines = source.splitlines()
    return [i + 3 for i, line in enumerate(lines) if line.strip() == "#pragma omp simd"]


def assert_loop_vectorized(source: str, report: str, c_path: Path, source_line: int) -> None:
    assert re.search(rf"{re.escape(c_path.name)}:{source_line}:\d+: optimized: loop vectorized "
                     rf"using (32|64) byte vectors", report), (source_line, report)


def test_vectorized_elementwise_loop_uses_vector_instructions(builder, tmp_path):
    reg = vector_register()
    task = add_task(64, 64)
    s = ansor.State(task.dag)
    s.split("Z", "j", [16])
    s.annotate("Z", "j.1", "vectorize")
    source, _ = generate_source(s, task.target, "vadd")
    assert source.count("#pragma omp simd") == 1
    asm, report, c_path = compile_to_assembly(source, tmp_path)
    for line in simd_statement_lines(source):
        assert_loop_vectorized(source, report, c_path, line)
    assert re.search(rf"\tvaddps\t.*%{reg}", asm), "no packed add on wide vector registers"
    check_add(task, s, builder)


def test_vectorized_matmul_inner_loop_uses_fma_on_vectors(builder, tmp_path):
    reg = vector_register()
    A = te.placeholder((64, 64), name="A")
    B = te.placeholder((64, 64), name="B")
    task = ansor.Task([A, B, te.ops.matmul(A, B)])
    s = ansor.State(task.dag)
    s.split("matmul", "j", [16])
    s.reorder("matmul", ["i", "j.0", "k", "j.1"])
    s.annotate("matmul", "j.1", "vectorize")
    source, _ = generate_source(s, task.target, "vmm")
    asm, report, c_path = compile_to_assembly(source, tmp_path)
    update_line = [n for n in simd_statement_lines(source) if "A[" in source.splitlines()[n - 1]]
    assert len(update_line) == 1
    assert_loop_vectorized(source, report, c_path, update_line[0])
    assert re.search(rf"\tvfmadd\d+ps\t.*%{reg}", asm), "no packed FMA on wide vector registers"
    inputs = random_inputs(task)
    a, b = (x.astype(np.float64) for x in inputs)
    assert_close(run_state(task, s, builder, inputs), a @ b)


def test_vectorize_of_a_loop_with_inner_loops_is_not_simd(builder):
    task = gemm_relu_task()
    s = ansor.State(task.dag)
    s.annotate("gemm", "j", "vectorize")   # the k loop is inside
    source, _ = generate_source(s, task.target)
    assert "#pragma omp simd" not in source
    check_gemm_relu(task, s, builder)


# ---------------------------------------------------------------------------------------------
# float32 exp, erf, tanh, log go to the prelude's vectorizable versions: accurate over the whole
# range (special values included) and really vectorized

FLT_MIN = float(np.finfo(np.float32).tiny)


def unary_kernel_output(fn, x: np.ndarray, builder) -> tuple[np.ndarray, str]:
    """Y[i] = fn(X[i]) with the i loop split by 16 and the inner loop vectorized (omp simd)."""
    n = len(x)
    x = np.concatenate([x, np.ones(-n % 16, x.dtype)])
    X = te.placeholder(x.shape, str(x.dtype), name="X")
    task = ansor.Task([X, te.compute(x.shape, lambda i: fn(X[i]), name="Y")])
    s = ansor.State(task.dag)
    s.split("Y", "i", [16])
    s.annotate("Y", "i.1", "vectorize")
    kernel = compile_state(task, s, builder=builder)
    try:
        assert kernel.source.count("#pragma omp simd") == 1
        return kernel(x)[:n], kernel.source
    finally:
        kernel.close()


def kernel_body(source: str) -> str:
    """The generated function, without the prelude."""
    return source[source.index("\nvoid "):]


def f32(*values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def ulp_error(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """|actual - expected| in units of the float32 spacing at `expected` (a float64 array)."""
    return np.abs(actual - expected) / np.spacing(np.abs(expected).astype(np.float32))


def gelu_erf(x):
    return 0.5 * x * (1.0 + te.erf(x * 0.70710678))


def np_erf(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(v) for v in x.astype(np.float64)])


def test_float32_exp_is_accurate_over_the_whole_range(builder):
    x = np.concatenate([np.linspace(-100.0, 88.7, 60_000, dtype=np.float32),
                        f32(-np.inf, np.inf, np.nan, 0.0, -0.0, 1e-30, -87.3, -87.34, 88.72, 88.73,
                            -103.9, -104.0, -1e30, 1e30)])
    y, source = unary_kernel_output(te.exp, x, builder)
    assert "ansor_expf(" in kernel_body(source)
    with np.errstate(over="ignore"):
        ref = np.exp(x.astype(np.float64))
    normal = (ref >= FLT_MIN) & (ref <= np.finfo(np.float32).max)
    assert normal.sum() > 50_000
    assert ulp_error(y[normal], ref[normal]).max() <= 2.0      # measured 1.02 over every float
    assert np.all(y[ref < FLT_MIN] == 0.0)                     # denormal results flush to zero
    assert np.all(np.isposinf(y[ref > np.finfo(np.float32).max]))
    neg_inf, pos_inf, nan, zero, neg_zero, tiny_arg = y[-14:-8]
    assert neg_inf == 0.0 and pos_inf == np.inf and np.isnan(nan)
    assert zero == neg_zero == tiny_arg == 1.0
    assert y[-2] == 0.0 and y[-1] == np.inf                    # -1e30, 1e30


def test_float32_log_is_accurate_over_the_whole_range(builder):
    x = np.concatenate([np.exp(np.linspace(-103.0, 88.7, 60_000)).astype(np.float32),
                        f32(1.0, 2.0, 0.5, FLT_MIN, 1e-40, 1e-45, np.finfo(np.float32).max)])
    y, source = unary_kernel_output(te.log, x, builder)
    assert "ansor_logf(" in kernel_body(source)
    ref = np.log(x.astype(np.float64))
    ok = x > 0
    assert ulp_error(y[ok], ref[ok]).max() <= 1.5              # measured 0.83 over every float
    y, _ = unary_kernel_output(te.log, f32(0.0, -0.0, -1.0, -np.inf, np.inf, np.nan, -1e-40), builder)
    assert y[0] == y[1] == -np.inf and y[4] == np.inf
    assert np.isnan(y[[2, 3, 5, 6]]).all()


@pytest.mark.parametrize("name", ["erf", "tanh"])
def test_float32_erf_and_tanh_are_accurate(name, builder):
    fn, ref_fn = {"erf": (te.erf, np_erf), "tanh": (te.tanh, np.tanh)}[name]
    x = np.concatenate([np.linspace(-10.0, 10.0, 40_001, dtype=np.float32),
                        np.linspace(-1e-3, 1e-3, 2001, dtype=np.float32),
                        f32(1e-30, -1e-30, 100.0, -100.0, 1e30, -1e30, 3.9, 7.9)])
    y, source = unary_kernel_output(fn, x, builder)
    assert f"ansor_{name}f(" in kernel_body(source)
    ref = ref_fn(x.astype(np.float64))
    err = np.abs(y - ref)
    assert err.max() <= 1e-6                                    # measured 4.4e-7 over every float
    small = (np.abs(x) <= 1e-3) & (x != 0)
    assert (err[small] / np.abs(ref[small])).max() <= 1e-6     # relative accuracy near zero
    assert np.array_equal(y[:40_001], -y[40_000::-1])          # odd
    y, _ = unary_kernel_output(fn, f32(np.inf, -np.inf, np.nan, 0.0, -0.0), builder)
    assert y[0] == 1.0 and y[1] == -1.0 and np.isnan(y[2])
    assert y[3] == 0.0 and not np.signbit(y[3]) and y[4] == 0.0 and np.signbit(y[4])


def test_float32_gelu_and_sigmoid_are_accurate(builder):
    x = np.concatenate([np.linspace(-10.0, 10.0, 40_001, dtype=np.float32), f32(np.inf, np.nan)])
    x64 = x.astype(np.float64)
    y, _ = unary_kernel_output(gelu_erf, x, builder)
    ref = 0.5 * x64[:-2] * (1.0 + np_erf(x64[:-2] / math.sqrt(2.0)))
    assert (np.abs(y[:-2] - ref) / np.maximum(1.0, np.abs(ref))).max() <= 3e-6
    assert y[-2] == np.inf and np.isnan(y[-1])

    x = np.concatenate([np.linspace(-100.0, 100.0, 40_001, dtype=np.float32),
                        f32(-np.inf, np.inf, np.nan)])
    y, source = unary_kernel_output(te.sigmoid, x, builder)
    assert "ansor_expf(" in kernel_body(source)
    with np.errstate(over="ignore"):
        ref = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    ok = ref >= 1e-37
    assert (np.abs(y[ok] - ref[ok]) / ref[ok]).max() <= 1e-6
    assert np.all(y[ref < 1e-37] <= 1e-37)
    assert y[-3] == 0.0 and y[-2] == 1.0 and np.isnan(y[-1])


def test_float64_math_stays_on_libm(builder):
    x = np.linspace(-5.0, 5.0, 64)
    for fn, ref_fn, name in [(te.exp, np.exp, "exp"), (te.erf, np_erf, "erf"),
                             (te.tanh, np.tanh, "tanh"), (te.log, np.log, "log")]:
        arg = np.abs(x) + 0.1 if name == "log" else x
        y, source = unary_kernel_output(fn, arg, builder)
        body = kernel_body(source)
        assert re.search(rf"\b{name}\(", body) and "ansor_" not in body.split("_timed")[0]
        np.testing.assert_allclose(y, ref_fn(arg), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", ["exp", "erf", "tanh", "log", "sigmoid", "gelu", "softmax_exp"])
def test_float32_math_in_simd_loops_is_vectorized(name, tmp_path):
    reg = vector_register()
    X = te.placeholder((64, 64), name="X")
    if name == "softmax_exp":                                   # exp(x - max) of a softmax row
        k = te.reduce_axis(64, "k")
        M = te.compute((64,), lambda i: te.max(X[i, k], axis=k), name="M")
        Y = te.compute((64, 64), lambda i, j: te.exp(X[i, j] - M[i]), name="Y")
    else:
        fn = gelu_erf if name == "gelu" else getattr(te, name)
        Y = te.compute((64, 64), lambda i, j: fn(X[i, j]), name="Y")
    task = ansor.Task([X, Y])
    s = ansor.State(task.dag)
    s.annotate("Y", "j", "vectorize")
    source, _ = generate_source(s, task.target, "vmath")
    lines = simd_statement_lines(source)
    assert len(lines) == 1 and "ansor_" in source.splitlines()[lines[0] - 1]
    asm, report, c_path = compile_to_assembly(source, tmp_path)
    assert_loop_vectorized(source, report, c_path, lines[0])
    assert not re.search(r"\tcall\t\w*(exp|erf|tanh|log)f", asm), "a scalar libm call is left"
    assert re.search(rf"\tvfmadd\d+ps\t.*%{reg}", asm), "no packed FMA on wide vector registers"


# ---------------------------------------------------------------------------------------------
# the prelude holds only what the kernel uses

def prelude_definitions(source: str) -> set[str]:
    """Names the text ahead of the first function defines: helper functions, typedefs, macros."""
    prelude = source[:source.index("\nvoid ")]
    names = set(re.findall(r"^(?:static inline \w+|ANSOR_VECMATH) (ansor_\w+)\(", prelude, re.M))
    names |= set(re.findall(r"^typedef .*?\b(ansor_\w+)\b(?: __attribute__|;)", prelude, re.M))
    return names | set(re.findall(r"^#define (ANSOR_\w+)", prelude, re.M))


def test_a_plain_matmul_has_no_helpers_in_its_prelude(builder):
    """Tiled, vectorized and parallel, a matmul calls no helper: the file starts with the
    includes and goes on with the kernel."""
    A = te.placeholder((32, 48), name="A")
    B = te.placeholder((48, 64), name="B")
    task = ansor.Task([A, B, te.ops.matmul(A, B)])
    s = ansor.State(task.dag)
    s.split("matmul", "j", [16])
    s.reorder("matmul", ["i", "j.0", "k", "j.1"])
    s.annotate("matmul", "i", "parallel")
    s.annotate("matmul", "j.1", "vectorize")
    source, _ = generate_source(s, task.target, "mm")
    assert prelude_definitions(source) == set()
    assert source[:source.index("\nvoid ")].strip().splitlines() == [
        "#include <math.h>", "#include <stdbool.h>", "#include <stdint.h>", "#include <stdlib.h>",
        "#include <time.h>"]
    inputs = random_inputs(task)
    a, b = (x.astype(np.float64) for x in inputs)
    assert_close(run_state(task, s, builder, inputs), a @ b)


def test_the_prelude_defines_the_helpers_a_kernel_calls_and_what_they_need(builder):
    """exp, erf, tanh, log, max and a floor division of possibly negative integers: each
    helper once, with the pieces it depends on (the bits union, the vecmath macro), nothing
    else; the kernel compiles and matches numpy."""
    X = te.placeholder((8, 16), "float32", name="X")
    N = te.placeholder((8, 16), "int32", name="N")
    Y = te.compute((8, 16), lambda i, j: te.exp(X[i, j]) + te.erf(X[i, j]) + te.tanh(X[i, j])
                   + te.log(te.abs(X[i, j]) + 1.0) + te.maximum(X[i, j], 0.25)
                   + te.cast(N[i, j] // 3, "float32"), name="Y")
    task = ansor.Task([X, N, Y])
    s = ansor.State(task.dag)
    source, _ = generate_source(s, task.target, "mix")
    assert prelude_definitions(source) == {"ANSOR_VECMATH", "ansor_bits", "ansor_expf", "ansor_erff",
                                           "ansor_tanhf", "ansor_logf", "ansor_max_f32", "ansor_floordiv_i32"}
    rng = np.random.default_rng(0)
    x = rng.uniform(-3.0, 3.0, (8, 16)).astype(np.float32)
    n = rng.integers(-50, 50, (8, 16)).astype(np.int32)
    x64 = x.astype(np.float64)
    expected = (np.exp(x64) + np.vectorize(math.erf)(x64) + np.tanh(x64) + np.log(np.abs(x64) + 1.0)
                + np.maximum(x64, 0.25) + n // 3)
    assert_close(run_state(task, s, builder, [x, n]), expected)


@pytest.mark.parametrize("fn, defined", [
    (te.tanh, {"ANSOR_VECMATH", "ansor_tanhf"}),
    (te.erf, {"ANSOR_VECMATH", "ansor_erff"}),
    (te.log, {"ANSOR_VECMATH", "ansor_bits", "ansor_logf"}),
    (te.sigmoid, {"ANSOR_VECMATH", "ansor_bits", "ansor_expf"}),
    (lambda x: te.minimum(x, 1.0), {"ansor_min_f32"}),
])
def test_each_helper_comes_with_exactly_its_dependencies(fn, defined):
    X = te.placeholder((16,), name="X")
    task = ansor.Task([X, te.compute((16,), lambda i: fn(X[i]), name="Y")])
    source, _ = generate_source(ansor.State(task.dag), task.target)
    assert prelude_definitions(source) == defined


def test_register_tiles_and_transposed_stores_bring_their_vector_types():
    """Each vector width a kernel uses is typedef'd, and the pin and shuffle macros appear
    only with the code that calls them."""
    from ansor.backend.cpu import generate_c

    _, s = register_tile_state(4, 16)
    tiled = prelude_definitions(generate_c(lower(s, "mm"), 32, 16)[0])
    assert {"ansor_f32x8", "ANSOR_PIN32"} <= tiled and "ANSOR_SHUFFLE" not in tiled
    assert not any(n.startswith(("ansor_f32x4", "ansor_f32x16", "ansor_i32x")) for n in tiled)
    _, s = transposing_state(4, 32, "copy")
    transposed = prelude_definitions(generate_c(lower(s, "tr"), 64, 16)[0])
    assert {"ansor_f32x16", "ansor_i32x16", "ANSOR_SHUFFLE"} <= transposed
    assert not any(n.startswith("ANSOR_PIN") for n in transposed)


# ---------------------------------------------------------------------------------------------
# parallel and unroll pragmas

def line_before_loop(source: str, var: str) -> str:
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"\s*for \(int32_t {re.escape(var)} = 0;", line):
            return lines[i - 1].strip()
    raise AssertionError(f"no loop over {var}")


def test_parallel_loop_gets_an_openmp_pragma(builder, monkeypatch):
    from ansor.lower import small_parallel

    monkeypatch.setattr(small_parallel, "MIN_PARALLEL_ITERATIONS", 0)  # a kernel this small runs serially otherwise
    task = gemm_relu_task()
    s = ansor.State(task.dag)
    s.fuse("gemm", ["i", "j"])
    s.annotate("gemm", "i@j", "parallel")
    s.split("act", "r", [4])
    s.annotate("act", "r.0", "parallel")
    s.annotate("act", "r.1", "parallel")  # nested: one parallel region is enough
    source, _ = generate_source(s, task.target)
    pragma = f"#pragma omp parallel for num_threads({task.target.num_cores})"  # the target's cores
    assert line_before_loop(source, "i_j") == pragma
    assert line_before_loop(source, "r_0") == pragma
    assert source.count("#pragma omp parallel for") == 2
    check_gemm_relu(task, s, builder)


def test_unrolled_loop_gets_a_gcc_unroll_pragma(builder):
    task = gemm_relu_task()
    s = ansor.State(task.dag)
    s.split("gemm", "k", [6])
    s.annotate("gemm", "k.1", "unroll")
    s.annotate("act", "c", "unroll")
    source, _ = generate_source(s, task.target)
    assert line_before_loop(source, "k_1") == "#pragma GCC unroll 6"
    assert line_before_loop(source, "c") == "#pragma GCC unroll 20"
    assert line_before_loop(source, "r") != "#pragma GCC unroll 16"
    kinds = {f.var.name: f.kind for f in stmts(s, ir.For)}
    assert kinds["k.1"] == kinds["c"] == "unrolled" and kinds["r"] == "serial"
    check_gemm_relu(task, s, builder)


@pytest.mark.parametrize("max_step, unrolled", [
    (0, set()),
    (4, {"j.1"}),                       # j.1 (4); its init twin too
    (16, {"j.1", "k.1"}),               # k.1 x j.1 = 12 <= 16, k.1 alone 3
    (64, {"j.1", "k.1"}),               # k.0 (8) x 12 = 96 > 64
    (512, {"j.1", "k.1", "k.0", "j.0"}),  # j.0 (5) x 96 = 480; i (16) x 480 is too many
])
def test_auto_unroll_marks_small_inner_loops(max_step, unrolled, builder):
    task = gemm_relu_task()
    s = ansor.State(task.dag)
    s.split("gemm", "j", [4])
    s.split("gemm", "k", [3])
    s.reorder("gemm", ["i", "j.0", "k.0", "k.1", "j.1"])
    s.pragma("gemm", "i", f"auto_unroll_max_step${max_step}")
    gemm_loops = [f for f in stmts(s, ir.For) if f.var.name in ("i", "j.0", "k.0", "k.1", "j.1")]
    marked = {f.var.name for f in gemm_loops if f.unroll_hint}
    assert marked == unrolled
    source, _ = generate_source(s, task.target)
    for f in gemm_loops:
        pragma = line_before_loop(source, f.var.name.replace(".", "_"))
        assert (pragma == f"#pragma GCC unroll {f.extent}") == f.unroll_hint, (f.var.name, pragma)
    check_gemm_relu(task, s, builder)


def test_private_buffer_stores_the_vectorized_dimension_last():
    """A convolution tile vectorized over output channels keeps its accumulators channel-
    innermost: the private buffer's last dimension is the channel, and results stay right."""
    from ansor.kernel import compile_state
    from ansor.lower import ir
    from ansor.lower.lower import inferred_extents, lower
    from ansor.search.sketch_policy import SketchPolicy
    from ansor.workloads import make_task

    task = make_task("conv2d", (1, 8, 10, 10, 32, 3, 3), padding=1)
    policy = SketchPolicy(task, seed=2)
    policy.sketches = [s for s in policy.sketches if "fused at level 2, axis 1 innermost" in " ".join(s.history)]
    assert policy.sketches
    inputs = task.random_inputs(0)
    expected = task.reference_outputs(inputs)[0]
    checked = 0
    for state in policy.sample(8):
        local = next(s for s in state.stages if s.name.endswith(".local"))
        runs = inferred_extents(state)[local.name]
        channel_tile = math.prod(e for it, e in zip(local.iters, runs) if it.name.startswith("ff"))
        bufs = [n.buffer for n in ir.walk_stmts(lower(state).body)
                if isinstance(n, ir.Allocate) and n.buffer.name == local.name]
        assert len(bufs) == 1 and bufs[0].shape[-1] == channel_tile
        np.testing.assert_allclose(compile_state(task, state)(*inputs), expected, rtol=1e-4, atol=1e-4)
        checked += 1
        if checked == 3:
            break
    assert checked == 3


# ---------------------------------------------------------------------------------------------
# register tiles

def register_tile_state(rows: int, cols: int, k: int = 40) -> tuple[ansor.Task, ansor.State]:
    """matmul with a cache-write tile of rows x cols computed at the output's tile loop, the
    reduction outermost in the tile and the columns vectorized."""
    A = te.placeholder((32, k), name="A")
    B = te.placeholder((k, 64), name="B")
    task = ansor.Task([A, B, te.ops.matmul(A, B)])
    s = ansor.State(task.dag)
    cache = s.cache_write("matmul", "local")
    s.split("matmul", "i", [rows])
    s.split("matmul", "j", [cols])
    s.reorder("matmul", ["i.0", "j.0", "i.1", "j.1"])
    s.compute_at(cache, "matmul", "j.0")
    s.reorder("matmul.local", ["k", "i", "j"])
    s.annotate("matmul.local", "j", "vectorize")
    return task, s


@pytest.mark.parametrize("vector_bytes, cols", [(16, 8), (32, 16)])
def test_small_accumulator_becomes_a_register_tile(vector_bytes, cols, tmp_path):
    """A 4-row accumulator of two vectors per row: one variable per accumulator vector, loaded before the
    reduction loop and stored after it; each B vector loaded once per k and pinned; the
    program still matches numpy (compiled from the generated text, run through ctypes)."""
    from ansor.backend.cpu import generate_c
    from ansor.measure import Builder, MeasureErrorNo
    from ansor.measure.run import evaluate_kernel
    from ansor.measure import TimingPolicy

    task, s = register_tile_state(4, cols)
    source, fname = generate_c(lower(s, "mm"), vector_bytes, 16)
    lanes = vector_bytes // 4
    assert "/* register tile: matmul_local in 8 " in source
    tile = source[source.index("/* register tile"):]
    assert tile.count(f"ansor_f32x{lanes} vec") == 2  # the B vectors, shared by the 4 rows
    assert tile.count(f"ANSOR_PIN{vector_bytes}(") == 2
    assert tile.count("matmul_local_r0 = matmul_local_r0 + ") == 1
    body = tile[tile.index("for (int32_t k"):]
    assert "matmul_local[" not in body.split("*(ansor_f32x")[0]  # no accumulator memory inside the k loop
    build = Builder(cache_dir=tmp_path).build([source])[0]
    assert build.error_no == MeasureErrorNo.NO_ERROR, build.error_msg
    inputs = task.random_inputs(seed=0)
    r = evaluate_kernel(build.lib_path, fname, inputs, task.reference_outputs(inputs),
                        timing=TimingPolicy(warmup=0, repeat=1, min_repeat_ms=0.0))
    assert r.error_no == MeasureErrorNo.NO_ERROR, r.error_msg


@pytest.mark.parametrize("rows, cols, why", [(16, 64, "64 accumulator vectors do not fit 16 registers"),
                                             (4, 4, "4 columns are less than one 8-lane vector")])
def test_accumulators_that_do_not_fit_keep_the_plain_loops(rows, cols, why, builder):
    from ansor.backend.cpu import generate_c

    task, s = register_tile_state(rows, cols)
    source, _ = generate_c(lower(s, "mm"), 32, 16)
    assert "/* register tile:" not in source, why
    inputs = random_inputs(task)
    a, b = (x.astype(np.float64) for x in inputs)
    assert_close(run_state(task, s, builder, inputs), a @ b)


def test_reduction_loops_between_the_tile_rows_are_unrolled_in_the_tile(builder):
    """k split in two with the inner part inside the rows: the outer k stays a C loop, the
    inner k and the rows are unrolled into the tile (each statement updates its row)."""
    from ansor.backend.cpu import generate_c

    task, s = register_tile_state(2, 16)
    s.split("matmul.local", "k", [2])
    s.reorder("matmul.local", ["k.0", "i", "k.1", "j"])
    source, _ = generate_c(lower(s, "mm"), 32, 16)
    tile = source[source.index("/* register tile"):]
    inside = tile[tile.index("for (int32_t k_0"):tile.index("*(ansor_f32x8*)&matmul_local[0] =")]
    assert inside.count("for (int32_t") == 1  # only k.0 is a C loop
    assert tile.count("matmul_local_r0 = matmul_local_r0 + ") == 2  # k.1 = 0, 1
    inputs = random_inputs(task)
    a, b = (x.astype(np.float64) for x in inputs)
    assert_close(run_state(task, s, builder, inputs), a @ b)


def test_a_row_loop_between_reduction_loops_tiles_each_block_of_rows(builder):
    """SSRSRS tiling with a middle spatial level: k.0, then rows i.0, then k.1, then rows i.1
    and the vector. The loops down to i.0 stay outside the tile; each of their iterations
    loads the block of rows i.0 updates into variables, runs k.1 over it and stores it back
    (so a B vector loaded in k.1 is reused across i.0 from the L1 cache)."""
    from ansor.backend.cpu import generate_c

    task, s = register_tile_state(8, 16)
    s.split("matmul.local", "k", [4])
    s.split("matmul.local", "i", [2])
    s.reorder("matmul.local", ["k.0", "i.0", "k.1", "i.1", "j"])
    source, _ = generate_c(lower(s, "mm"), 32, 16)
    assert "/* register tile: matmul_local in 4 ansor_f32x8 variables" in source  # 2 rows x 2 vectors
    tile = source[source.index("/* register tile"):]
    loads = tile[:tile.index("for (int32_t k_1")]
    assert re.search(r"\*\(ansor_f32x8\*\)&matmul_local\[\(i_0\w* \* 32\) \+ 16\]", loads)  # the block of this i.0
    assert "matmul_local[" not in tile[tile.index("for (int32_t k_1"):].split("*(ansor_f32x8*)&matmul_local")[0]
    inputs = random_inputs(task)
    a, b = (x.astype(np.float64) for x in inputs)
    assert_close(run_state(task, s, builder, inputs), a @ b)


def test_auto_unroll_stops_before_it_copies_a_vector_loop_too_often(builder):
    """auto_unroll_max_step 512 marks k.1 (8) and the rows (8) around an 8-lane vector loop;
    unrolling both would make 64 copies of the `omp simd` loop, which gcc vectorizes one by
    one (minutes of compile for a few hundred copies), so only the rows get the pragma."""
    from ansor.backend.cpu import generate_c
    from ansor.codegen.cpu import MAX_UNROLLED_VECTOR_LOOPS

    task, s = register_tile_state(8, 8)
    s.split("matmul.local", "k", [8])
    s.reorder("matmul.local", ["k.0", "k.1", "i", "j"])
    s.pragma("matmul.local", "k.0", "auto_unroll_max_step$512")
    func = lower(s, "mm")
    hinted = [f.var.name for f in ir.walk_stmts(func.body) if isinstance(f, ir.For) and f.unroll_hint]
    assert "k.1" in hinted and "i" in hinted and 8 * 8 > MAX_UNROLLED_VECTOR_LOOPS
    lines = generate_c(func)[0].splitlines()
    before = {line.strip(): lines[n - 1].strip() for n, line in enumerate(lines) if "for (int32_t" in line}
    assert not before["for (int32_t k_1 = 0; k_1 < 8; ++k_1) {"].startswith("#pragma GCC unroll")
    assert before["for (int32_t i = 0; i < 8; ++i) {"] == "#pragma GCC unroll 8"
    inputs = random_inputs(task)
    a, b = (x.astype(np.float64) for x in inputs)
    assert_close(run_state(task, s, builder, inputs), a @ b)


# ---------------------------------------------------------------------------------------------
# transposed stores

@pytest.mark.parametrize("group, lanes", [(g, n) for n in (4, 8, 16) for g in (2, 4, 8, 16) if g <= n])
def test_interleave_rounds_transpose_the_vectors(group, lanes):
    """Following the shuffles lane by lane: final vector j holds, in groups of `group`
    lanes, every input vector's lane f in input order, for f = j*lanes/group ... ."""
    from ansor.codegen.cpu import interleave_rounds

    rounds, contents = interleave_rounds(group, lanes)
    assert len(rounds) == group.bit_length() - 1
    vectors = [[(v, lane) for lane in range(lanes)] for v in range(group)]
    for shuffles in rounds:
        vectors = [[(vectors[left] + vectors[right])[i] for i in idx] for left, right, idx in shuffles]
    assert vectors == contents
    per_vector = lanes // group
    for j, held in enumerate(contents):
        for g in range(per_vector):
            f = j * per_vector + g
            assert held[g * group:(g + 1) * group] == [(v, f) for v in range(group)]


def transposing_state(cols: int, channels: int, op: str) -> tuple[ansor.Task, ansor.State]:
    """out[c, x] from A[x, c] (a copy, or scaled and clamped at zero), with a tile of `cols`
    columns by `channels` channels vectorized along the channels: the stored index is
    contiguous in the columns and strided (by 24) in the vector axis."""
    A = te.placeholder((24, 64), name="A")
    if op == "copy":
        out = te.compute((64, 24), lambda c, x: A[x, c], name="out")
    else:
        out = te.compute((64, 24), lambda c, x: te.maximum(A[x, c] * 2.0, 0.0), name="out")
    task = ansor.Task([A, out])
    s = ansor.State(task.dag)
    s.split("out", "c", [channels])
    s.split("out", "x", [cols])
    s.reorder("out", ["c.0", "x.0", "x.1", "c.1"])
    s.annotate("out", "c.1", "vectorize")
    return task, s


@pytest.mark.parametrize("vector_bytes, cols, channels, op", [
    (64, 4, 32, "copy"), (64, 8, 16, "copy"), (32, 2, 8, "copy"), (16, 4, 16, "copy"),
    (64, 4, 16, "scale_relu"), (32, 8, 32, "scale_relu"), (64, 6, 16, "copy"),
])
def test_a_tile_strided_in_its_vector_axis_is_stored_transposed(vector_bytes, cols, channels, op, tmp_path):
    """The write is transposed in registers and stored in runs of contiguous columns (one
    store per channel, not one per element); the output matches numpy. 6 columns go in
    groups of 2; a value that is not a plain load is staged in a contiguous buffer first."""
    from ansor.backend.cpu import generate_c
    from ansor.measure import Builder, MeasureErrorNo, TimingPolicy
    from ansor.measure.run import evaluate_kernel

    task, s = transposing_state(cols, channels, op)
    source, fname = generate_c(lower(s, "tr"), vector_bytes, 16)
    assert "/* transposed store: out is contiguous along x_1" in source
    lanes = min(vector_bytes // 4, channels)
    group = 2 if cols == 6 else min(cols, lanes)
    stores = source.count("__builtin_memcpy(&out[") + source.count(f"*(ansor_f32x{lanes}*)&out[")
    assert stores == (cols // group) * lanes  # one store per channel of a block and column group
    assert ("out_tr[" in source) == (op != "copy")
    build = Builder(cache_dir=tmp_path).build([source])[0]
    assert build.error_no == MeasureErrorNo.NO_ERROR, build.error_msg
    inputs = random_inputs(task)
    expected = inputs[0].T.copy() if op == "copy" else np.maximum(inputs[0].T * 2.0, 0.0)
    r = evaluate_kernel(build.lib_path, fname, inputs, [expected],
                        timing=TimingPolicy(warmup=0, repeat=1, min_repeat_ms=0.0))
    assert r.error_no == MeasureErrorNo.NO_ERROR, r.error_msg


def test_a_tile_contiguous_in_its_vector_axis_keeps_the_plain_loops():
    """Vectorized along the columns (contiguous in the output) there is nothing to transpose."""
    from ansor.backend.cpu import generate_c

    A = te.placeholder((24, 64), name="A")
    task = ansor.Task([A, te.compute((64, 24), lambda c, x: A[x, c], name="out")])
    s = ansor.State(task.dag)
    s.split("out", "x", [8])
    s.annotate("out", "x.1", "vectorize")
    source, _ = generate_c(lower(s, "tr"), 64, 16)
    assert "/* transposed store:" not in source
