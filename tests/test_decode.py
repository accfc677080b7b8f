"""Token-by-token decoding: GPT-2's decode step with its key/value caches written in place."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from ansor.graph.ir import Graph
from ansor.graph.kv_cache import KVCacheError, state_inputs
from ansor.graph.memory_plan import InPlaceError, PlannedStep, plan_memory
from ansor.graph.reference import run_graph

MAX_LENGTH = 48
PROMPT = 5
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def gpt2():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    # weights larger than GPT-2's initializer: greedy tokens of the default one repeat one token
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128,
                                  initializer_range=0.3, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


@pytest.fixture(scope="module")
def decoder(gpt2):
    from ansor.graph.compiled import build_model
    from ansor.graph.decode import gpt2_decode_step

    return build_model(gpt2_decode_step(gpt2, MAX_LENGTH), None, verbose=False, check=True)


def test_greedy_tokens_equal_pytorch_and_caches_hold_its_keys(gpt2, decoder):
    import torch

    from ansor.graph.decode import greedy_generate

    prompt = np.random.default_rng(1).integers(0, 256, PROMPT).tolist()
    with torch.no_grad():
        expected = gpt2.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 use_cache=True, pad_token_id=0, eos_token_id=None)[0, PROMPT:].tolist()
    assert len(set(expected)) > 8  # a sequence that tests something
    got = greedy_generate(decoder, prompt, NEW_TOKENS)
    assert got == expected
    # the caches hold PyTorch's keys and values of every position fed, zeros past them
    fed = prompt + got[:-1]
    with torch.no_grad():
        past = gpt2(torch.tensor([fed]), use_cache=True).past_key_values
    for layer in range(2):
        keys, values = (t.numpy() for t in _layer_cache(past, layer))
        n = len(fed)
        np.testing.assert_allclose(decoder.state[f"past_key_{layer}"][:, :, :n], keys, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(decoder.state[f"past_value_{layer}"][:, :, :n], values, rtol=1e-4, atol=1e-5)
        assert not decoder.state[f"past_key_{layer}"][:, :, n:].any()


def test_caches_are_written_in_place_without_per_token_allocation(decoder):
    from ansor.graph.decode import greedy_generate

    addresses = {name: buffer.ctypes.data for name, buffer in decoder.state.items()}
    cache_bytes = next(iter(decoder.state.values())).nbytes
    assert len(addresses) == 4
    assert not any(s.kind == "fallback" for s in decoder.steps)
    assert [s.kind for s in decoder.steps].count("cache_write") == 4
    greedy_generate(decoder, [1, 2], 2)  # warm
    tracemalloc.start()
    greedy_generate(decoder, [3, 4, 5], MAX_LENGTH - 2)  # every position of the caches
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < cache_bytes, f"{peak} bytes allocated at the peak of a generation, a cache is {cache_bytes}"
    assert {name: buffer.ctypes.data for name, buffer in decoder.state.items()} == addresses
    # the steps' write targets are the state buffers themselves
    for step in decoder.steps:
        if step.kind == "cache_write":
            assert step.run.buffers[0].ctypes.data in addresses.values()


def test_generation_past_the_caches_is_refused(decoder):
    from ansor.graph.decode import greedy_generate

    with pytest.raises(ValueError, match="cache positions"):
        greedy_generate(decoder, [1] * 10, MAX_LENGTH)


def test_a_position_outside_the_cache_raises_before_any_write(decoder):
    with pytest.raises(IndexError, match="cache_write"):
        decoder(np.array([[1]], dtype=np.int64), np.array([MAX_LENGTH], dtype=np.int64))


def test_a_token_id_outside_the_vocabulary_raises(decoder):
    with pytest.raises(IndexError, match="embedding"):
        decoder(np.array([[256]], dtype=np.int64), np.array([0], dtype=np.int64))


def test_the_position_is_scanned_once_per_call(decoder):
    """Four cache writes read the one position under the same bound: one scan serves them."""
    checks = [c for checks, _, _ in decoder._segments for c in checks]
    assert [c.node.op for c in checks].count("cache_write") == 1
    assert sorted(c.node.op for c in checks) == ["cache_write", "embedding", "embedding"]


def test_decode_step_kernels_run_on_the_calling_thread(decoder):
    """Each kernel of a decoding step takes microseconds: none opens a parallel region (waking
    a second thread costs more, and on a busy machine a scheduler slice), and every projection
    reads its weight rows as vectors (the matrix-vector program)."""
    kernels = [s.kernel for s in decoder.steps if s.kind == "kernel"]
    assert not [k.task.label for k in kernels if "omp parallel" in k.source]
    linears = [k for k in kernels if k.task.label.startswith("linear")]
    assert len(linears) >= 9  # four a layer at least (the projections of q, k and v may be merged) and the LM head
    assert all(any(st.origin == "rfactor" for st in k.state.stages) for k in linears)


def test_a_large_attention_keeps_its_parallel_loop():
    import ansor
    from ansor import te
    from ansor.kernel import build
    from ansor.lower.attention import MIN_PARALLEL_MACS
    from ansor.te.attention import attention

    def source(heads: int, length: int) -> str:
        q, k, v = (te.placeholder((1, heads, length, 64), "float32", name=n) for n in "qkv")
        return build(ansor.Task([q, k, v, attention(q, k, v)])).source  # no records: the default program

    assert 1 * 8 * 128 * 128 * 128 >= MIN_PARALLEL_MACS
    assert "omp parallel" in source(8, 128)
    assert "omp parallel" not in source(2, 16)


@pytest.mark.parametrize("rows, parallel", [(512, False), (8192, True)])
def test_parallel_loops_of_kernels_of_little_work_run_serially(rows, parallel):
    """A program the search made parallel (the LM head's rows): below MIN_PARALLEL_ITERATIONS
    its loops run on the calling thread, its result unchanged."""
    from ansor.kernel import build
    from ansor.lower.small_parallel import MIN_PARALLEL_ITERATIONS
    from ansor.schedule.state import State

    task = _matvec_task(rows, 256)
    state = State(task.dag)
    state.parallel("z", state.stages[-1].iters[2].name)
    assert (rows * 256 >= MIN_PARALLEL_ITERATIONS) == parallel
    kernel = build(task, state=state)
    assert ("omp parallel" in kernel.source) == parallel
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 1, 256)).astype(np.float32)
    w = rng.standard_normal((rows, 256)).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    np.testing.assert_allclose(kernel(x, w, b).reshape(-1), w @ x.reshape(-1) + b, rtol=1e-4, atol=1e-4)


def _matvec_task(rows: int, depth: int, transposed: bool = False, isa: str | None = None):
    import ansor
    from ansor import te

    x = te.placeholder((1, 1, depth), "float32", name="x")
    w = te.placeholder((depth, rows) if transposed else (rows, depth), "float32", name="w", constant=True)
    b = te.placeholder((rows,), "float32", name="b", constant=True)
    k = te.reduce_axis(depth, name="k")
    y = te.compute((1, 1, rows), lambda i, j, n: te.sum(x[i, j, k] * (w[k, n] if transposed else w[n, k]), axis=k),
                   name="y")
    z = te.compute((1, 1, rows), lambda i, j, n: y[i, j, n] + b[n], name="z")
    target = ansor.Target.host(isa=isa) if isa else ansor.Target.host()
    return ansor.Task([x, w, b, z], target=target)


@pytest.mark.parametrize("rows, depth, isa", [(36, 48, None), (200, 64, "avx2"), (7, 32, None)])
def test_matrix_vector_default_program_reads_rows_as_vectors(rows, depth, isa):
    from ansor.kernel import build
    from ansor.search.basic import default_schedule

    task = _matvec_task(rows, depth, isa=isa)
    state = default_schedule(task)
    assert [st.origin for st in state.stages].count("rfactor") == 1
    assert not any(it.annotation == "parallel" for st in state.stages for it in st.iters)
    kernel = build(task, state=state)
    if task.target.isa == "avx512":  # the accumulators of a row block in vector registers
        assert "register tile" in kernel.source
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((1, 1, depth)).astype(np.float32)
    w = rng.standard_normal((rows, depth)).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    np.testing.assert_allclose(kernel(x, w, b).reshape(-1), w @ x.reshape(-1) + b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, depth, transposed", [(36, 40, False), (36, 48, True)])
def test_other_reductions_keep_the_plain_default_program(rows, depth, transposed):
    """A reduction not a multiple of the vector lanes, or a matrix read across its rows."""
    from ansor.kernel import build
    from ansor.search.basic import default_schedule

    task = _matvec_task(rows, depth, transposed)
    state = default_schedule(task)
    assert not any(st.origin == "rfactor" for st in state.stages)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, depth)).astype(np.float32)
    w = rng.standard_normal((depth, rows) if transposed else (rows, depth)).astype(np.float32)
    b = rng.standard_normal(rows).astype(np.float32)
    want = (x.reshape(-1) @ w if transposed else w @ x.reshape(-1)) + b
    np.testing.assert_allclose(build(task, state=state)(x, w, b).reshape(-1), want, rtol=1e-5, atol=1e-5)


def test_torch_compile_of_a_loop_passing_past_key_values_is_refused_by_name(gpt2, tmp_path, monkeypatch):
    """A decode loop traced with dynamic shapes grows its caches by concat: refused in one line
    that names the way that serves it, never run padded."""
    import torch

    from ansor.graph.decode import GrowingCacheError

    monkeypatch.setenv("ANSOR_DB", str(tmp_path / "ansor.db"))
    torch._dynamo.reset()
    fast = torch.compile(gpt2, backend="ansor", dynamic=True, options={"max_size": 16, "verbose": False})
    try:
        with torch.no_grad():
            past = gpt2(torch.tensor([[1, 2, 3]]), use_cache=True).past_key_values
            with pytest.raises(GrowingCacheError, match="gpt2_decode_step") as refused:
                fast(torch.tensor([[4]]), past_key_values=past, use_cache=True)
    finally:
        torch._dynamo.reset()
    assert "\n" not in str(refused.value) and "concat" in str(refused.value)


def _small_cache_graph() -> tuple[Graph, str]:
    g = Graph()
    cache = g.add_input("cache", (1, 2, 8, 4), "float32")
    rows = g.add_input("rows", (1, 2, 1, 4), "float32")
    position = g.add_input("position", (1,), "int64")
    written = g.add_node("cache_write", [cache, rows, position])
    g.outputs = [g.add_node("sum", [written], {"axes": (2,)})]
    return g, written


def test_cache_write_meaning_in_the_numpy_executor():
    g, _ = _small_cache_graph()
    cache = np.random.default_rng(0).standard_normal((1, 2, 8, 4)).astype(np.float32)
    rows = np.ones((1, 2, 1, 4), np.float32)
    expected = cache.copy()
    expected[:, :, 3] = 1
    (got,) = run_graph(g, [cache, rows, np.array([3])])
    np.testing.assert_allclose(got, expected.sum(axis=2), rtol=1e-6)
    with pytest.raises(IndexError):
        run_graph(g, [cache, rows, np.array([8])])


def test_a_cache_read_besides_its_write_is_refused():
    g, written = _small_cache_graph()
    assert state_inputs(g) == {"cache": written}
    g.outputs.append(g.add_node("sum", ["cache"], {"axes": (2,)}))
    with pytest.raises(KVCacheError, match="read elsewhere"):
        state_inputs(g)


def test_the_planner_refuses_a_read_of_an_overwritten_value():
    steps = [PlannedStep(("cache", "rows", "pos"), ("written",), alias_of="cache", in_place=True),
             PlannedStep(("written",), ("out",))]
    nbytes = {"cache": 64, "rows": 8, "pos": 8, "written": 64, "out": 8}
    plan = plan_memory(steps, nbytes, ["cache", "rows", "pos"], ["out"])
    assert plan.storage["written"] == plan.storage["cache"]  # in place: one buffer
    with pytest.raises(InPlaceError, match="cache"):
        plan_memory([*steps, PlannedStep(("cache",), ("late",))], {**nbytes, "late": 8},
                    ["cache", "rows", "pos"], ["out", "late"])


def _layer_cache(past, layer: int):
    """(keys, values) of one layer, from a transformers cache object or the legacy tuples."""
    if hasattr(past, "layers"):
        return past.layers[layer].keys, past.layers[layer].values
    if hasattr(past, "key_cache"):
        return past.key_cache[layer], past.value_cache[layer]
    return past[layer]
