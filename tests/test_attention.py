"""Fused attention (te.attention, lower/attention.py) against numpy, and the graph rewrites that
find it and simplify models around it, against PyTorch."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.graph import rewrites
from ansor.graph.ir import Graph
from ansor.graph.reference import random_inputs, run_graph
from ansor.kernel import compile_state
from ansor.schedule.state import State
from ansor.schedule.steps import SplitStep
from ansor.search.params import SearchParams
from ansor.search.template import annotate_template, template_sketch
from ansor.te.attention import attention


def numpy_attention(q, k, v, mask=None, lengths=None, scale=None, causal=False):
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1).astype(np.float64), np.repeat(v, group, axis=1).astype(np.float64)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale
    lq, lk = s.shape[-2:]
    if mask is not None:
        s = s + mask
    if lengths is not None:
        s = np.where(np.arange(lk) < lengths[:, None, None, None], s, -np.inf)
    if causal:
        s = np.where(np.tril(np.ones((lq, lk), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True) @ v).astype(np.float32)


def _programs(task: ansor.Task, n: int, seed: int) -> list[State]:
    """The default program and `n` drawn by the template's annotation."""
    sketch = template_sketch(State(task.dag), len(task.dag.tensors) - 1)
    rng = random.Random(seed)
    drawn = [annotate_template(sketch.steps, task.dag, rng, SearchParams(), 16) for _ in range(n)]
    return [State(task.dag)] + drawn


def _with_knobs(task: ansor.Task, query_tile: int, query_rows: int, chunk: int, key_tile: int,
                key_rows: int) -> State:
    """The program with the given knobs (the product of a split is its tile, the inner length its
    register block), whether or not the annotation would draw them."""
    sketch = template_sketch(State(task.dag), len(task.dag.tensors) - 1)
    lengths = [(query_tile // query_rows, query_rows), (chunk,), (key_tile // key_rows, key_rows)]
    steps = [SplitStep(s.stage_id, s.iter_id, s.extent, lengths[n], s.inner_to_outer)
             for n, s in enumerate(sketch.steps)]
    return State.replay(task.dag, steps)


CASES = [  # batch, heads, kv heads, Lq, Lk, D, mask, causal
    (1, 2, 2, 1, 1, 16, "none", False),
    (2, 2, 2, 7, 13, 16, "additive", False),
    (1, 4, 2, 17, 17, 32, "none", True),          # grouped-query, causal
    (2, 4, 1, 5, 33, 16, "lengths", False),       # one K/V head for four query heads
    (1, 2, 2, 33, 33, 64, "lengths", True),
    (1, 3, 3, 64, 64, 16, "additive", True),
    (1, 1, 1, 2, 70, 8, "none", False),
]


def _case(b, h, hkv, lq, lk, d, mask, causal, dv=None, heads_last=False):
    """(task, input arrays, numpy's output) of one attention case; with `heads_last` the output
    is [B, Lq, H, Dv]."""
    q = te.placeholder((b, h, lq, d), name="q")
    k = te.placeholder((b, hkv, lk, d), name="k")
    v = te.placeholder((b, hkv, lk, dv or d), name="v")
    extra, args = None, {}
    if mask == "additive":
        extra = te.placeholder((1, h, lq, lk), name="m")
        args["mask"] = extra
    if mask == "padding":  # a [batch, 1, 1, keys] mask, as BERT's, broadcast over heads and queries
        extra = te.placeholder((b, 1, 1, lk), name="m")
        args["mask"] = extra
    if mask == "lengths":
        extra = te.placeholder((b,), "int32", name="n")
        args["lengths"] = extra
    out = attention(q, k, v, causal=causal, heads_last=heads_last, **args)
    task = ansor.Task([q, k, v] + ([extra] if extra is not None else []) + [out])
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in (q, k, v)]
    ref_args = {}
    if mask in ("additive", "padding"):
        arrays.append(rng.standard_normal(extra.shape).astype(np.float32))
        ref_args["mask"] = arrays[-1]
    if mask == "lengths":
        arrays.append(rng.integers(1, lk + 1, b).astype(np.int32))
        ref_args["lengths"] = arrays[-1]
    expected = numpy_attention(*arrays[:3], causal=causal, **ref_args)
    return task, arrays, expected.transpose(0, 2, 1, 3) if heads_last else expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_attention_kernel_matches_numpy(case):
    task, arrays, expected = _case(*case)
    np.testing.assert_allclose(task.reference_outputs(arrays)[0], expected, rtol=1e-4, atol=1e-5)
    for state in _programs(task, 2, seed=len(CASES) * case[3] + case[4]):
        kernel = compile_state(task, state)
        np.testing.assert_allclose(kernel(*arrays), expected, rtol=1e-4, atol=1e-5,
                                   err_msg=f"knobs {state.steps}")


KNOB_CASES = [  # (case as in CASES, value columns), (query tile, its rows, chunk, key tile, its rows)
    # tiles that do not divide the sequence: a ragged last query tile, a shorter last key tile
    (((1, 2, 2, 50, 45, 32, "none", False), 48), (48, 6, 16, 32, 8)),
    # blocks that do not divide their tile (query rows 5 of 32: remainder block of 2; key rows
    # 7 of 28: none) and query tiles that are not a multiple of the vector lanes
    (((1, 2, 1, 37, 40, 16, "additive", True), 32), (35, 5, 32, 28, 7)),
    (((2, 4, 2, 23, 64, 64, "lengths", True), 64), (16, 16, 64, 64, 64)),
    # one query tile wider than a register block can hold (plain loops), a padding mask
    (((2, 3, 3, 19, 30, 16, "padding", False), 16), (19, 19, 16, 30, 30)),
    (((1, 1, 1, 1, 77, 64, "none", True), 64), (1, 1, 64, 16, 4)),  # a single query (decoding)
]


@pytest.mark.parametrize("case,knobs", KNOB_CASES, ids=lambda c: "-".join(map(str, c)))
def test_attention_knobs_with_remainders_match_numpy(case, knobs):
    shape, dv = case
    task, arrays, expected = _case(*shape, dv=dv)
    state = _with_knobs(task, *knobs)
    kernel = compile_state(task, state)
    np.testing.assert_allclose(kernel(*arrays), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case,knobs", [KNOB_CASES[0], KNOB_CASES[2]], ids=lambda c: "-".join(map(str, c)))
def test_attention_writing_heads_last_matches_numpy(case, knobs):
    """The [B, Lq, H, Dv] output (what the projection after merging heads reads), a ragged query
    tile among them; the drawn programs too."""
    shape, dv = case
    task, arrays, expected = _case(*shape, dv=dv, heads_last=True)
    assert task.dag.outputs[0].shape == (shape[0], shape[3], shape[1], dv)
    np.testing.assert_allclose(task.reference_outputs(arrays)[0], expected, rtol=1e-4, atol=1e-5)
    for state in [_with_knobs(task, *knobs)] + _programs(task, 2, seed=shape[3]):
        np.testing.assert_allclose(compile_state(task, state)(*arrays), expected, rtol=1e-4, atol=1e-5,
                                   err_msg=f"knobs {state.steps}")


def test_attention_products_run_as_register_tiles():
    """On a CPU with 32 registers of 16 floats both products of a tile keep their accumulator
    blocks in registers: the scores (keys x queries over the head dimension) and the weighted
    sum (queries x value columns over the keys); knobs whose blocks do not fit run as loops."""
    from ansor.backend.cpu import generate_c
    from ansor.lower.lower import lower

    q, k, v = (te.placeholder((1, 2, 96, 64), name=n) for n in "qkv")
    task = ansor.Task([q, k, v, attention(q, k, v)])
    source, _ = generate_c(lower(_with_knobs(task, 48, 6, 64, 64, 8)), vector_bytes=64, vector_registers=32)
    assert "register tile: scores_t in 24 " in source and "register tile: tile_out in 24 " in source
    source, _ = generate_c(lower(_with_knobs(task, 48, 12, 64, 64, 16)), vector_bytes=64, vector_registers=32)
    assert "register tile" not in source
    # one query (decoding): each score a dot product, as partial sums over the head dimension
    q1 = te.placeholder((1, 2, 1, 64), name="q")
    task = ansor.Task([q1, k, v, attention(q1, k, v)])
    source, _ = generate_c(lower(_with_knobs(task, 1, 1, 64, 64, 8)), vector_bytes=64, vector_registers=32)
    assert "register tile: partial in 8 " in source and "register tile: tile_out in 4 " in source


def test_attention_program_never_stores_the_score_matrix():
    q, k, v = (te.placeholder((1, 2, 128, 32), name=n) for n in "qkv")
    task = ansor.Task([q, k, v, attention(q, k, v)])
    from ansor.lower import ir
    from ansor.lower.lower import lower

    func = lower(State(task.dag))
    local = [s.buffer for s in ir.walk_stmts(func.body) if isinstance(s, ir.Allocate)]
    assert max(b.size for b in local) < 128 * 128
    assert {b.name for b in func.params} == {"q", "k", "v", task.outputs[0].name}


def test_attention_tunes_records_and_replays(tmp_path):
    q, k, v = (te.placeholder((1, 2, 24, 16), name=n) for n in "qkv")
    out = attention(q, k, v, causal=True)
    task = ansor.Task([q, k, v, out])
    assert task.workload_key != ansor.Task([q, k, v, attention(q, k, v, causal=True, template=False)]).workload_key
    db = str(tmp_path / "a.db")
    result = ansor.tune(task, trials=8, database=db, progress=False)
    assert result.best_cost < float("inf")
    kernel = ansor.build(task, database=db)
    assert kernel.record is not None
    arrays = task.random_inputs()
    np.testing.assert_allclose(kernel(*arrays), numpy_attention(*arrays, causal=True), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- graphs


def _torch_graph(module, *inputs):
    torch = pytest.importorskip("torch")
    from ansor.graph import from_torch

    with torch.no_grad():
        expected = module(*inputs)
    return from_torch(module, inputs), expected.numpy()


def _attention_nodes(graph: Graph) -> list:
    from ansor.graph.model_tasks import extract_tasks

    return [n for n in extract_tasks(graph).graph.nodes if n.op == "attention"]


def _check_model(graph: Graph, expected: np.ndarray, *inputs, tmp_path) -> None:
    model = ansor.build(graph, database=str(tmp_path / "m.db"), quick_seconds=0, verbose=False)
    np.testing.assert_allclose(model(*(x.numpy() for x in inputs)), expected, rtol=1e-4, atol=1e-5)


def test_bert_layer_attention_fused_and_projections_merged(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=64, num_attention_heads=4, intermediate_size=128)
    layer = transformers.models.bert.modeling_bert.BertLayer(cfg).eval()

    class Layer(torch.nn.Module):
        def forward(self, x):
            return layer(x)[0] if isinstance(layer(x), tuple) else layer(x)

    x = torch.randn(2, 13, 64)
    graph, expected = _torch_graph(Layer().eval(), x)
    report = rewrites.rewrite(graph)
    assert any(a.startswith("fuse_attention") for a in report.applied)
    assert "merge_shared_input_projections x3" in report.applied
    assert "attention_heads_last x1" in report.applied  # the output projection reads a plain matrix
    fused = [n for n in report.graph.nodes if n.op == "attention"]
    assert len(fused) == 1 and fused[0].attrs["heads_last"]
    assert all(n.op != "permute" for n in report.graph.consumers()[fused[0].output])
    assert len(_attention_nodes(graph)) == 1
    _check_model(graph, expected, x, tmp_path=tmp_path)


def test_gpt2_causal_attention_fused(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32)).eval()

    class Decoder(torch.nn.Module):
        def forward(self, ids):
            return gpt2(input_ids=ids, use_cache=False).last_hidden_state

    ids = torch.randint(0, 100, (1, 19))
    graph, expected = _torch_graph(Decoder().eval(), ids)
    fused = _attention_nodes(graph)
    assert len(fused) == 2 and all(n.attrs["causal"] and n.attrs["mask"] == "none" for n in fused)
    _check_model(graph, expected, ids, tmp_path=tmp_path)


def test_sdpa_with_grouped_heads_and_bool_mask(tmp_path):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    class Attend(torch.nn.Module):
        def forward(self, q, k, v, keep):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    q, k, v = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 11, 16), torch.randn(1, 2, 11, 16)
    keep = torch.rand(9, 11) < 0.7
    keep[:, 0] = True
    graph, expected = _torch_graph(Attend(), q, k, v, keep)
    assert [n.attrs["mask"] for n in _attention_nodes(graph)] == ["additive"]
    _check_model(graph, expected, q, k, v, keep, tmp_path=tmp_path)


# ----------------------------------------------------------------------------- each rewrite


def _graph_with(build) -> Graph:
    g = Graph()
    x = g.add_input("x", (2, 3, 8), "float32")
    g.outputs = [build(g, x)]
    g.validate()
    return g


def _same_outputs(a: Graph, b: Graph) -> None:
    inputs = random_inputs(a, 1)
    for x, y in zip(run_graph(a, inputs), run_graph(b, inputs)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_transpose_pairs_cancel():
    def build(g, x):
        t = g.add_node("permute", [x], {"axes": (0, 2, 1)})
        t = g.add_node("permute", [t], {"axes": (0, 2, 1)})
        return g.add_node("relu", [t])

    g = _graph_with(build)
    new, count = rewrites.fold_transpose_pairs(g)
    assert count >= 1 and [n.op for n in new.nodes] == ["relu"]
    _same_outputs(g, new)
    report = rewrites.rewrite(g)
    assert "fold_transpose_pairs x2" in report.applied and [n.op for n in report.graph.nodes] == ["relu"]


def test_reshape_chain_and_scalar_chain_fold():
    def build(g, x):
        t = g.add_node("reshape", [x], {"shape": (6, 8)})
        t = g.add_node("reshape", [t], {"shape": (2, 24)})
        t = g.add_node("mul", [t, g.add_constant(np.float32(2.0))])
        t = g.add_node("div", [t, g.add_constant(np.float32(4.0))])
        t = g.add_node("add", [t, g.add_constant(np.float32(1.0))])
        return g.add_node("sub", [t, g.add_constant(np.float32(3.0))])

    g = _graph_with(build)
    report = rewrites.rewrite(g)
    assert "fold_reshape_chains x1" in report.applied and "fold_scalar_chains x2" in report.applied
    assert [n.op for n in report.graph.nodes] == ["reshape", "mul", "add"]
    _same_outputs(g, report.graph)


def test_projections_sharing_an_input_merge_and_a_costlier_rewrite_is_refused():
    rng = np.random.default_rng(0)

    def build(g, x):
        outs = [g.add_node("linear", [x, g.add_constant(rng.standard_normal((8, 8), dtype=np.float32)),
                                      g.add_constant(rng.standard_normal(8, dtype=np.float32))]) for _ in range(3)]
        t = g.add_node("add", [outs[0], outs[1]])
        return g.add_node("add", [t, outs[2]])

    g = _graph_with(build)
    new, count = rewrites.merge_shared_input_projections(g)
    assert count == 3 and [n.op for n in new.nodes].count("linear") == 1
    _same_outputs(g, new)
    # merged, the three outputs are slices of one product read by separate adds: copies that
    # the estimate charges more than the two reads of x saved, so the rewrite is not kept
    report = rewrites.rewrite(g)
    assert "merge_shared_input_projections" in report.rejected
