"""Backends: chosen by the target's kind, each with its capabilities, lowering passes and printer."""

from __future__ import annotations

import shlex
import subprocess

import numpy as np
import pytest

import ansor
from ansor import backend as backends
from ansor.backend import Backend, Capabilities, backend_for, lower_for
from ansor.backend import generate_source
from ansor.kernel import compile_state
from ansor.lower import ir
from ansor.lower.lower import lower
from helpers import assert_close, random_inputs, tiled_matmul

AVX2 = ansor.Target("cpu", "avx2", 2, 32, 64)


def test_the_cpu_backend_reads_its_capabilities_off_the_target():
    cpu = backend_for(AVX2)
    assert cpu.kind == "cpu" and cpu.language == "c"
    caps = cpu.capabilities(AVX2)
    assert (caps.vector_bytes, caps.vector_registers, caps.parallel_loops) == (32, 16, True)
    assert not caps.has_shared_memory and not caps.thread_binding
    avx512 = cpu.capabilities(ansor.Target("cpu", "avx512", 2, 64, 64))
    assert (avx512.vector_bytes, avx512.vector_registers) == (64, 32)


def test_a_kind_without_a_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="no backend for target kind 'vulkan'; available: cpu, cuda, opencl"):
        generate_source(ansor.State(tiled_matmul()[0].dag), ansor.Target("vulkan"))


def test_a_registered_backend_serves_its_kind(monkeypatch):
    """generate_source goes through the registry: a new kind needs a Backend, not a branch."""
    seen = []

    def printer(func: ir.PrimFunc, caps: Capabilities) -> tuple[str, str]:
        seen.append(caps)
        return f"/* {func.name}: {sum(isinstance(x, ir.Store) for x in ir.walk_stmts(func.body))} stores */", func.name

    def mark(func: ir.PrimFunc, caps: Capabilities) -> ir.PrimFunc:
        return ir.PrimFunc(func.name + "_marked", func.params, func.body, func.attrs)

    toy = Backend("toy", "text", lambda t: Capabilities(vector_bytes=t.vector_unit_bytes), (mark,), printer,
                  builder=object, loader=object, runner=object)
    monkeypatch.setitem(backends._BACKENDS, "toy", toy)
    target = ansor.Target("toy", "none", 1, 8)
    source, entry = generate_source(ansor.State(tiled_matmul()[0].dag), target, "k")
    assert (source, entry) == ("/* k_marked: 2 stores */", "k_marked")
    assert seen == [Capabilities(vector_bytes=8)]


def test_a_build_that_spilled_registers_is_printed_again_until_one_builds(monkeypatch):
    """Backend.build: a program whose build spilled registers is printed by the refit printers
    in turn and keeps the first source that builds; other failures and unlowerable programs are
    reported as they are, never raised."""
    from ansor.measure.build import BuildResult

    spill = {"kernel": {"registers": 255, "spill_stores": 84, "spill_loads": 84}}

    class Builder:
        def __init__(self):
            self.batches: list[list[str]] = []

        def build(self, sources):  # the builder protocol: any iterable, None for an unlowered program
            sources = list(sources)
            self.batches.append([s for s in sources if s is not None])
            return [None if s is None else
                    BuildResult(s, f"/lib/{s}" if s.startswith("small") or s == "fine" else None,
                                0 if s.startswith("small") or s == "fine" else 1,
                                "syntax error" if s == "broken" else "register spill", 0.0,
                                None if s == "broken" else spill) for s in sources]

    def printer(name):
        return lambda func, caps: (name if func.name != "k_plain" else "fine", func.name)

    def lowering_fails(func, caps):
        if func.name == "k_bad":
            raise RuntimeError("over the limits")
        return func

    builder = Builder()
    toy = Backend("toy", "text", lambda t: Capabilities(), (lowering_fails,), printer("big"), builder=object,
                  loader=object, runner=object, refit_printers=(printer("mid"), printer("small")))
    monkeypatch.setitem(backends._BACKENDS, "toy", toy)
    state = ansor.State(tiled_matmul()[0].dag)
    target = ansor.Target("toy", "none", 1, 8)
    built = backends.build_programs([state] * 3, target, ["k_big", "k_plain", "k_bad"], builder)
    assert [p.source for p in built] == ["small", "fine", None]
    assert built[0].ok and built[0].entry == "k_big" and built[1].ok
    assert not built[2].ok and built[2].message == "RuntimeError: over the limits"
    assert builder.batches == [["big", "fine"], ["mid"], ["small"]]  # only the spilled one again
    # a failure that is not a spill is not printed again; past the last printer the spill stays
    builder.batches.clear()
    toy2 = Backend("toy", "text", lambda t: Capabilities(), (), printer("broken"), builder=object,
                   loader=object, runner=object, refit_printers=(printer("big"),))
    monkeypatch.setitem(backends._BACKENDS, "toy", toy2)
    broken = backends.build_programs([state] * 2, target, "k", builder)
    assert builder.batches == [["broken", "broken"]] and broken[0].message == "syntax error"
    monkeypatch.setitem(backends._BACKENDS, "toy", Backend(
        "toy", "text", lambda t: Capabilities(), (), printer("big"), builder=object, loader=object,
        runner=object, refit_printers=(printer("mid"),)))
    (spilled,) = backends.build_programs([state], target, "k", builder)
    assert spilled.source == "mid" and not spilled.ok and spilled.message == "register spill"


def test_cpu_lowering_makes_register_tiles_only_where_vectors_fit():
    _, s = tiled_matmul()
    tiles = [x for x in ir.walk_stmts(lower_for(s, AVX2).body) if isinstance(x, ir.RegisterTile)]
    assert len(tiles) == 1 and tiles[0].lanes == 8 and tiles[0].kept == 1
    assert len(tiles[0].updates) == 4 * 2  # rows x vector chunks
    narrow = ansor.Target("cpu", "generic", 2, 8, 64)  # no vector unit worth a tile
    assert not any(isinstance(x, ir.RegisterTile) for x in ir.walk_stmts(lower_for(s, narrow).body))


def test_the_cpu_passes_leave_a_fitted_function_as_it_is():
    """Running the passes again finds nothing new: generate_c may be given a fitted function."""
    _, s = tiled_matmul()
    cpu = backend_for(AVX2)
    fitted = cpu.run_passes(lower(s), AVX2)
    assert cpu.run_passes(fitted, AVX2) is fitted


def test_a_kernel_built_through_the_backend_runs_its_register_tile(builder):
    task, s = tiled_matmul()
    if backend_for(task.target).capabilities(task.target).vector_bytes < 32:
        pytest.skip("the host has no 8-lane vectors for a 16-column tile")
    kernel = compile_state(task, s, builder=builder)
    try:
        assert "/* register tile: matmul_local in " in kernel.source
        inputs = random_inputs(task)
        a, b = (x.astype(np.float64) for x in inputs)
        assert_close(kernel(*inputs), a @ b)
    finally:
        kernel.close()


def test_a_restricted_host_target_stands_for_a_smaller_machine(tmp_path, monkeypatch):
    """An AVX2, one-core target on this machine: its own records key, code for its ISA only
    and parallel loops on one thread, with the same results."""
    from ansor.lower import small_parallel

    monkeypatch.setattr(small_parallel, "MIN_PARALLEL_ITERATIONS", 0)  # a kernel this small runs serially otherwise
    host = ansor.Target.host()
    small = ansor.Target.host(isa="avx2" if host.isa != "generic" else "generic", num_cores=1)
    assert small.num_cores == 1 and small.key != host.key
    if host.isa == "generic":
        pytest.skip("this CPU has no AVX2 to restrict to")
    assert (small.vector_unit_bytes, small.compile_flags) == (32, ("-mno-avx512f",))
    with pytest.raises(ValueError, match="num_cores"):
        ansor.Target.host(num_cores=0)
    with pytest.raises(ValueError, match="unknown CPU ISA"):
        ansor.Target.host(isa="avx1024")
    task, state = tiled_matmul()
    state.annotate("matmul", "i.0", "parallel")
    task.target = small
    source, _ = generate_source(state, small)
    assert "num_threads(1)" in source
    kernel = compile_state(task, state)
    inputs = random_inputs(task, 0)
    assert_close(kernel(*inputs), inputs[0].astype(np.float64) @ inputs[1], "avx2 1c")
    builder = backend_for(small).builder(small)
    assert "-mno-avx512f" in builder.cflags
    asm = tmp_path / "k.s"
    (tmp_path / "k.c").write_text(source)
    flags = [f for f in builder.cflags if f not in ("-shared", "-fPIC")]
    subprocess.run([*shlex.split(builder.compiler), *flags, "-S", "-o", str(asm), str(tmp_path / "k.c")],
                   check=True, capture_output=True)
    assert "%zmm" not in asm.read_text() and "%ymm" in asm.read_text()
