"""Symbolic dimensions served by buckets: outputs equal to PyTorch's at random lengths from 1 to
the maximum, nothing imported or compiled for a new length, padding refused where it would
change the result."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ansor  # noqa: E402
from ansor.graph import bucketed  # noqa: E402
from ansor.graph.padding import PaddingError  # noqa: E402

MAX = 64
BUCKETS = {"seq": (16, 32, MAX)}


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids, use_cache=False).logits


class Hidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids).last_hidden_state


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=MAX,
                                  bos_token_id=0, eos_token_id=0)
    return Logits(transformers.GPT2LMHeadModel(cfg).eval())


def _lengths(seed: int = 0, count: int = 5) -> list[int]:
    rng = np.random.default_rng(seed)
    return [1, MAX, 16, 17] + [int(x) for x in rng.integers(2, MAX, count)]


@pytest.fixture(scope="module")
def gpt2_model(tmp_path_factory):
    model = _gpt2()
    seq = torch.export.Dim("seq", max=MAX)
    graph = ansor.graph.from_torch(model, (torch.zeros(1, 8, dtype=torch.long),), dynamic_shapes={"ids": {1: seq}},
                                   buckets=BUCKETS)
    db = tmp_path_factory.mktemp("dyn") / "ansor.db"
    return model, graph, ansor.build(graph, database=str(db), quick_seconds=0, verbose=False)


def test_gpt2_matches_pytorch_at_random_lengths(gpt2_model):
    model, graph, compiled = gpt2_model
    assert [b.sizes["seq"] for b in compiled.buckets] == [16, 32, 64]
    for length in _lengths():
        ids = torch.randint(0, 50, (1, length))
        with torch.no_grad():
            want = model(ids).numpy()
        got = compiled(ids.numpy())
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"length {length}")
    # the row-wise kernels skip the padded rows; a bucket's model called on its own still
    # computes them all
    assert all(bucket_kernels for bucket_kernels in compiled.skipping)
    assert compiled.models[1].check().ok


def test_new_lengths_import_and_compile_nothing(gpt2_model, monkeypatch):
    model, graph, compiled = gpt2_model

    def refuse(*args, **kwargs):
        raise AssertionError("compiled or imported again for a new length")

    for target in ("ansor.kernel.build_many", "ansor.graph.bucketed.build_many", "ansor.graph.compiled.build_many",
                   "torch.export.export"):
        monkeypatch.setattr(target, refuse)
    for length in (3, 29, 47, 63):
        ids = torch.randint(0, 50, (1, length))
        with torch.no_grad():
            want = model(ids).numpy()
        np.testing.assert_allclose(compiled(ids), want, rtol=1e-4, atol=1e-4)


def test_past_the_maximum_is_refused(gpt2_model):
    _, graph, compiled = gpt2_model
    with pytest.raises(ValueError, match=r"seq = 65 is outside the declared range 1\.\.64"):
        compiled(np.zeros((1, MAX + 1), dtype=np.int64))
    assert "serves seq 17..32" in compiled.summary()


def test_a_wrong_dtype_or_static_extent_is_refused_by_name(gpt2_model):
    _, _, compiled = gpt2_model
    with pytest.raises(TypeError, match="expected dtype int64, got int32"):
        compiled(np.zeros((1, 5), dtype=np.int32))
    with pytest.raises(ValueError, match=r"expected shape \(1, 5\), got \(2, 5\)"):
        compiled(np.zeros((2, 5), dtype=np.int64))


def test_task_names_say_which_lengths_they_serve(gpt2_model):
    _, _, compiled = gpt2_model
    names = {t.name for b in compiled.buckets for t in b.tasks.tasks}
    assert any(n.endswith("_seq17to32") for n in names) and any(n.endswith("_seq1to16") for n in names)


def test_bert_gets_the_lengths_mask():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                  vocab_size=50, max_position_embeddings=MAX)
    model = Hidden(transformers.BertModel(cfg, add_pooling_layer=False).eval())
    seq = torch.export.Dim("seq", max=MAX)
    graph = ansor.graph.from_torch(model, (torch.zeros(1, 8, dtype=torch.long),), dynamic_shapes=({1: seq},),
                                   buckets={"seq": (32, MAX)})
    compiled = ansor.build(graph, database=None, quick_seconds=0, verbose=False)
    assert all(b.plan.lengths_inputs == {"seq": "lengths_seq"} for b in compiled.buckets)
    for length in (1, 9, 32, 33, 50):
        ids = torch.randint(0, 50, (1, length))
        with torch.no_grad():
            want = model(ids).numpy()
        np.testing.assert_allclose(compiled(ids.numpy()), want, rtol=1e-4, atol=1e-4, err_msg=f"length {length}")


def test_a_reduction_over_the_sequence_is_refused():
    class MeanPool(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.proj(x).mean(dim=1)

    seq = torch.export.Dim("seq", max=32)
    graph = ansor.graph.from_torch(MeanPool().eval(), (torch.randn(2, 5, 8),), dynamic_shapes=({1: seq},))
    with pytest.raises(PaddingError, match="mean .*reduces over padded axis 1"):
        bucketed.bucket_tasks(graph)


def test_batch_and_sequence_both_dynamic():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)
            self.out = torch.nn.Linear(16, 16)

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(x).reshape(b, n, 3, 2, 8).permute(2, 0, 3, 1, 4)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return self.out(y.transpose(1, 2).reshape(b, n, 16))

    torch.manual_seed(0)
    model = Block().eval()
    dims = ({0: torch.export.Dim("batch", max=4), 1: torch.export.Dim("seq", max=40)},)
    graph = ansor.graph.from_torch(model, (torch.randn(2, 5, 16),), dynamic_shapes=dims,
                                   buckets={"batch": (2, 4), "seq": (20, 40)})
    compiled = ansor.build(graph, database=None, quick_seconds=0, verbose=False)
    for b, n in ((1, 1), (3, 7), (4, 40), (2, 21)):
        x = torch.randn(b, n, 16)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(compiled(x.numpy()), want, rtol=1e-4, atol=1e-5, err_msg=f"{b}x{n}")


def test_tuning_a_dynamic_graph_measures_its_buckets(tmp_path):
    """`ansor.tune` of a dynamic graph: every bucket's tasks in one job, weighted alike, and
    the programs it measures run (they once all failed in the timing setup)."""
    from ansor.store import open_store

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            return torch.relu(self.fc(x)) + x

    torch.manual_seed(0)
    model = Block().eval()
    graph = ansor.graph.from_torch(model, (torch.randn(1, 5, 16),), dynamic_shapes=({1: torch.export.Dim("seq", max=32)},),
                                   buckets={"seq": (16, 32)})
    db = str(tmp_path / "dyn.db")
    ansor.tune(graph, database=db, trials=16, progress=False)
    with open_store(db)[0] as store:
        records = [r for key in store.workload_keys() for r in store.records(key)]
    assert records and all(r.error_no == 0 for r in records), {r.error_msg for r in records if r.error_no}
    compiled = ansor.build(graph, database=db, quick_seconds=0, verbose=False)
    x = torch.randn(1, 20, 16)
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x.numpy()), model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_onnx_dim_param():
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "seq", 8])], [numpy_helper.from_array(w, "w")]),
        opset_imports=[helper.make_opsetid("", 17)])
    graph = ansor.graph.from_onnx(model, max_sizes={"seq": 48})
    assert graph.dims["seq"].buckets == (16, 32, 48)
    compiled = ansor.build(graph, database=None, quick_seconds=0, verbose=False)
    for n in (1, 16, 30, 48):
        x = rng.standard_normal((2, n, 8)).astype(np.float32)
        r = np.maximum(x @ w, 0)
        want = np.exp(r - r.max(-1, keepdims=True))
        want /= want.sum(-1, keepdims=True)
        np.testing.assert_allclose(compiled(x), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="give its maximum"):
        ansor.graph.from_onnx(model, max_sizes={"other": 4})


def test_torch_compile_dynamic_builds_once(monkeypatch, tmp_path):
    builds = []
    original = bucketed.build_many
    monkeypatch.setattr(bucketed, "build_many", lambda *a, **k: builds.append(1) or original(*a, **k))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, x):
            return self.norm(torch.relu(self.proj(x))) * 2

    torch.manual_seed(0)
    model = Net().eval()
    torch._dynamo.reset()
    fast = torch.compile(model, backend="ansor", dynamic=True,
                         options={"max_size": 64, "database": str(tmp_path / "a.db"), "verbose": False})
    with torch.no_grad():
        for n in (5, 7, 40, 64, 2):
            x = torch.randn(1, n, 8)
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)
    assert len(builds) == 1
