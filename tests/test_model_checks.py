"""What compiled models and kernels refuse, and how they are checked.

- Gather ids outside their table raise IndexError in the compiled model and in the numpy
  executor, as in PyTorch and onnxruntime; negative ids follow the source framework
  (torch.embedding refuses them, tensor indexing and ONNX Gather / GatherND count them from
  the end). Valid ids give PyTorch's or onnxruntime's answer.
- `ansor.build(graph, check=True)`, `CompiledModel.check` and the torch.compile backend's
  `check` option compare with the numpy executor or PyTorch eager, and a wrong answer raises.
- One input rule for `Kernel` and `CompiledModel`: an array or tensor of another dtype than
  the declared one raises TypeError naming the input; a Python list is converted.
"""

from __future__ import annotations

import numpy as np
import pytest

import ansor
from ansor import te
from ansor.graph.compiled import CompiledModel, OutputMismatchError
from ansor.graph.reference import run_graph

torch = pytest.importorskip("torch")
nn = torch.nn


@pytest.fixture
def db(tmp_path) -> str:
    return str(tmp_path / "empty.db")


def _torch_raises(fn, *args) -> bool:
    try:
        fn(*args)
    except IndexError:
        return True
    return False


# ------------------------------------------------------------------------------ torch gathers


class Embed(nn.Module):
    """An embedding (ids straight from the input) plus a linear layer beside it."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 4)

    def forward(self, ids, x):
        return self.table(ids) * 2.0 + self.fc(x)


def test_torch_embedding_ids_outside_the_table_raise_like_pytorch(db):
    torch.manual_seed(0)
    model = Embed().eval()
    ids, x = torch.tensor([[1, 9, 0]]), torch.randn(1, 3, 4)
    graph = ansor.graph.from_torch(model, (ids, x))
    compiled = ansor.build(graph, database=db, verbose=False)
    with torch.no_grad():
        valid = torch.tensor([[9, 0, 5]])
        np.testing.assert_allclose(compiled(valid.numpy(), x.numpy()), model(valid, x).numpy(), rtol=1e-5, atol=1e-6)
        for bad, shown in (([[1, 10, 0]], "from 10 to 10"), ([[1, -1, 0]], "from -1 to -1")):
            assert _torch_raises(model, torch.tensor(bad), x)  # torch.embedding refuses negative ids too
            with pytest.raises(IndexError, match=r"embedding .*ids must lie in \[0, 10\), got 1 of 3 outside it, "
                                                 + shown) as err:
                compiled(np.array(bad), x.numpy())
            assert "\n" not in str(err.value)
            with pytest.raises(IndexError, match=r"\[0, 10\)"):
                run_graph(graph, [np.array(bad), x.numpy()])


class ComputedIds(nn.Module):
    """Ids the model computes: fused into the gather's kernel (`ids * 2 + 1`), and read from
    the output of an earlier kernel (`h.long()` after a linear layer)."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 4)

    def forward(self, ids, x):
        h = self.fc(x)
        late = (h[..., 0] * 0.0).long() + ids
        return self.table(ids * 2 + 1) + self.table(late) + h


def test_ids_the_model_computes_are_checked_before_the_kernel_that_reads_them(db):
    torch.manual_seed(1)
    model = ComputedIds().eval()
    ids, x = torch.tensor([[0, 4, 2]]), torch.randn(1, 3, 4)
    compiled = ansor.build(ansor.graph.from_torch(model, (ids, x)), database=db, verbose=False)
    checks = [c for s in compiled.steps for c in s.index_checks]
    assert len(checks) == 2 and len(compiled._segments) == 2  # the late ids split the one foreign call
    with torch.no_grad():
        np.testing.assert_allclose(compiled(ids.numpy(), x.numpy()), model(ids, x).numpy(), rtol=1e-5, atol=1e-6)
        for bad in ([[0, 5, 2]], [[0, -1, 2]]):  # 5 * 2 + 1 = 11; -1 * 2 + 1 = -1 (and -1 itself)
            assert _torch_raises(model, torch.tensor(bad), x)
            with pytest.raises(IndexError, match=r"ids must lie in \[0, 10\)"):
                compiled(np.array(bad), x.numpy())


class TensorIndex(nn.Module):
    def forward(self, x, rows):
        return x[rows] + 1.0


def test_torch_tensor_indexing_takes_negative_indices_and_refuses_out_of_range(db):
    x, rows = torch.randn(5, 3), torch.tensor([0, 4, 2])
    model = TensorIndex().eval()
    compiled = ansor.build(ansor.graph.from_torch(model, (x, rows)), database=db, verbose=False)
    valid = torch.tensor([-5, -1, 4])
    np.testing.assert_allclose(compiled(x.numpy(), valid.numpy()), model(x, valid).numpy(), rtol=1e-6)
    for bad in ([0, 5, 1], [0, -6, 1]):
        assert _torch_raises(model, x, torch.tensor(bad))
        with pytest.raises(IndexError, match=r"index .*index 0 must lie in \[-5, 5\)"):
            compiled(x.numpy(), np.array(bad))


# ------------------------------------------------------------------------------ ONNX gathers


def _onnx_gathers():
    """An ONNX model: Gather of a [10, 4] table by the `ids` input (times 2), and GatherND of
    the `x` input by the `nd` input."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["g"], axis=0),
             helper.make_node("Mul", ["g", "two"], ["y"]),
             helper.make_node("GatherND", ["x", "nd"], ["z"])]
    graph = helper.make_graph(
        nodes, "gathers",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 6, 3]),
         helper.make_tensor_value_info("nd", TensorProto.INT64, [4, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 3])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array(2, np.float32), "two")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_onnx_gather_counts_negative_ids_from_the_end_and_refuses_out_of_range_like_onnxruntime(db):
    ort = pytest.importorskip("onnxruntime")
    model = _onnx_gathers()
    session = ort.InferenceSession(model.SerializeToString())
    graph = ansor.graph.from_onnx(model)
    compiled = ansor.build(graph, database=db, verbose=False)
    x = np.random.default_rng(1).standard_normal((5, 6, 3)).astype(np.float32)
    ids = np.array([[0, 9, -1], [-10, 3, 4]])
    nd = np.array([[0, 0], [4, 5], [-5, -6], [-1, 2]])
    want = session.run(None, {"ids": ids, "x": x, "nd": nd})
    for got, expected in zip(compiled(ids, x, nd), want):
        np.testing.assert_array_equal(got, expected)
    cases = [(np.array([[0, 10, 1], [1, 3, 4]]), nd, r"ids must lie in \[-10, 10\)"),
             (np.array([[0, 9, -11], [1, 3, 4]]), nd, r"ids must lie in \[-10, 10\)"),
             (ids, np.array([[0, 6], [4, 5], [1, 1], [1, 2]]), r"index 1 must lie in \[-6, 6\)"),
             (ids, np.array([[0, 0], [-6, 5], [1, 1], [1, 2]]), r"index 0 must lie in \[-5, 5\)")]
    for bad_ids, bad_nd, message in cases:
        with pytest.raises(Exception, match="out of data bounds|invalid index"):
            session.run(None, {"ids": bad_ids, "x": x, "nd": bad_nd})
        with pytest.raises(IndexError, match=message):
            compiled(bad_ids, x, bad_nd)
        with pytest.raises(IndexError, match=message):
            run_graph(graph, [bad_ids, x, bad_nd])


# ------------------------------------------------------------------------------ checks


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def _net():
    torch.manual_seed(2)
    return Net().eval(), torch.randn(2, 3, 8, 8)


def test_build_with_check_compares_with_the_reference_and_a_corrupted_model_fails_its_check(db, capfd):
    model, x = _net()
    graph = ansor.graph.from_torch(model, (x,))
    compiled = ansor.build(graph, database=db, check=True)
    assert "matches the numpy reference on random inputs" in capfd.readouterr().err
    report = compiled.check(x.numpy())
    assert report.ok and report.first_mismatch is None and report.rtol is not None
    with torch.no_grad():
        want = model(x).numpy()
    assert report.outputs[0].max_abs_error == pytest.approx(np.abs(compiled(x.numpy()) - want).max(), abs=1e-5)
    # a weight of the last kernel changed behind the model's back: the check must see it
    last = [s for s in compiled.steps if s.kind == "kernel"][-1]
    for constant in last.constants:
        constant += 0.5
    report = compiled.check()
    assert not report.ok
    assert report.first_mismatch.startswith(f"output 0 (%{graph.outputs[0]}): max abs error")
    assert "mismatch" in str(report)


def test_build_with_check_raises_naming_the_output_when_the_reference_disagrees(db, monkeypatch):
    model, x = _net()
    graph = ansor.graph.from_torch(model, (x,))
    import ansor.graph.compiled as compiled_module

    def shifted(g, inputs):
        return [y + 1.0 for y in run_graph(g, inputs)]

    monkeypatch.setattr(compiled_module, "run_graph", shifted)
    with pytest.raises(OutputMismatchError, match=r"output 0 .*max abs error 1(\.0+)?, max rel error") as err:
        ansor.build(graph, database=db, verbose=False, check=True)
    assert err.value.report is not None and not err.value.report.ok


def test_build_of_a_task_with_check(db, monkeypatch):
    a = te.placeholder((16,), "float32", name="a")
    b = te.compute((16,), lambda i: a[i] * 3.0, name="b")
    kernel = ansor.build(ansor.Task([a, b]), database=db, quick_trials=0, check=True)
    x = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(kernel(x), x * 3.0)
    monkeypatch.setattr(ansor.Kernel, "check", lambda self, *args, **kw: "output 0 mismatch: wrong")
    with pytest.raises(OutputMismatchError, match="disagrees with the numpy reference"):
        ansor.build(ansor.Task([a, b]), database=db, quick_trials=0, check=True)


def test_torch_compile_backend_checks_against_eager_when_asked(db, capfd, monkeypatch):
    model, x = _net()
    torch._dynamo.reset()
    fast = torch.compile(model, backend="ansor", options={"database": db, "check": True})
    with torch.no_grad():
        np.testing.assert_allclose(fast(x).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-5)
    assert "matches PyTorch eager on the example inputs" in capfd.readouterr().err
    # a compiled model that computes something else: the check raises instead of running it
    import ansor.api

    real_build = ansor.api.build

    def corrupted(*args, **kwargs):
        built = real_build(*args, **kwargs)
        for step in built.steps:
            for constant in step.constants:
                constant *= -1.0
        return built

    monkeypatch.setattr(ansor.api, "build", corrupted)  # the backend builds through the front door
    torch._dynamo.reset()
    fast = torch.compile(model, backend="ansor", options={"database": db, "check": True, "verbose": False})
    with torch.no_grad(), pytest.raises(Exception, match="disagrees with PyTorch eager") as err:
        fast(x)
    # Dynamo wraps a backend's exception (BackendCompilerFailed) and keeps it
    assert isinstance(getattr(err.value, "inner_exception", err.value), OutputMismatchError)
    torch._dynamo.reset()


# ------------------------------------------------------------------------------ input dtypes


def test_kernel_refuses_another_dtype_and_converts_lists(db):
    a = te.placeholder((4,), "float32", name="a")
    n = te.placeholder((4,), "int64", name="n")
    out = te.compute((4,), lambda i: a[i] * te.cast(n[i], "float32"), name="out")
    kernel = ansor.build(ansor.Task([a, n, out]), database=db, quick_trials=0)
    x, k = np.array([0.5, 1.5, -2.0, 3.0], np.float32), np.array([1, 2, 3, 4], np.int64)
    np.testing.assert_array_equal(kernel(x, k), x * k)
    with pytest.raises(TypeError, match="input 'a': expected dtype float32, got float64"):
        kernel(x.astype(np.float64), k)
    with pytest.raises(TypeError, match="input 'n': expected dtype int64, got int32"):
        kernel(x, k.astype(np.int32))
    with pytest.raises(TypeError, match="input 'a': expected dtype float32, got torch.float64"):
        kernel(torch.from_numpy(x.astype(np.float64)), k)
    np.testing.assert_array_equal(kernel(torch.from_numpy(x), torch.from_numpy(k)), x * k)
    np.testing.assert_array_equal(kernel([0.5, 1.5, -2.0, 3.0], [1, 2, 3, 4]), x * k)
    with pytest.raises(TypeError, match="input 'n': expected dtype int64, got a list of float64"):
        kernel(x, [1.0, 2.5, 3.0, 4.0])
    with pytest.raises(ValueError, match="input 'a': expected shape"):
        kernel([1.0, 2.0], k)


def test_compiled_model_refuses_another_dtype_and_converts_lists(db):
    torch.manual_seed(3)
    model = Embed().eval()
    ids, x = torch.tensor([[1, 9, 0]]), torch.randn(1, 3, 4)
    compiled: CompiledModel = ansor.build(ansor.graph.from_torch(model, (ids, x)), database=db, verbose=False)
    with torch.no_grad():
        want = model(ids, x).numpy()
    with pytest.raises(TypeError, match="input 'x': expected dtype float32, got float64"):
        compiled(ids.numpy(), x.numpy().astype(np.float64))
    with pytest.raises(TypeError, match="input 'ids': expected dtype int64, got int32"):
        compiled(ids.numpy().astype(np.int32), x.numpy())
    with pytest.raises(TypeError, match="input 'x': expected dtype float32, got torch.float64"):
        compiled(ids, x.double())
    np.testing.assert_allclose(compiled(ids, x).numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(compiled([[1, 9, 0]], x.numpy().tolist()), want, rtol=1e-5, atol=1e-6)
