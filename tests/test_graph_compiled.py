"""Compiled models: memory planning, `ansor.build(graph)` against PyTorch eager, the numpy
fallback, the C library run from a C program, tuning a model with resume, and the
torch.compile backend (through its entry point, with a graph break).

Errors are max abs differences relative to the RMS of PyTorch eager's output.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ansor
from ansor.graph import winograd as graph_winograd
from ansor.graph.memory_plan import PlannedStep, plan_memory
from helpers import rel_err

TOLERANCE = 1e-3


# ------------------------------------------------------------------------------ memory plan


def test_memory_plan_reuses_buffers_of_dead_values_and_never_overlaps_live_ones():
    # a chain x -> a -> b -> c -> d (+ a residual read of b at the last step)
    steps = [PlannedStep(("x",), ("a",)), PlannedStep(("a",), ("b",)), PlannedStep(("b",), ("c",)),
             PlannedStep(("c", "b"), ("d",))]
    nbytes = {"x": 100, "a": 400, "b": 400, "c": 300, "d": 400}
    plan = plan_memory(steps, nbytes, ["x"], ["d"])
    live = {0: {"x", "a"}, 1: {"x", "a", "b"}, 2: {"x", "b", "c"}, 3: {"x", "b", "c", "d"}}
    for index, values in live.items():
        buffers = [plan.storage[v] for v in values]
        assert len(set(buffers)) == len(buffers), f"step {index}: two live values share a buffer"
    for name, size in nbytes.items():
        assert plan.sizes[plan.storage[name]] >= size
    assert plan.storage["c"] == plan.storage["a"]  # a is dead after step 1: c takes its buffer
    assert plan.total_bytes < plan.naive_bytes


def test_memory_plan_views_share_their_source_and_keep_it_alive():
    steps = [PlannedStep(("x",), ("a",)), PlannedStep(("a",), ("v",), alias_of="a"),
             PlannedStep(("x",), ("b",)), PlannedStep(("v", "b"), ("y",))]
    plan = plan_memory(steps, {"x": 64, "a": 64, "v": 64, "b": 64, "y": 64}, ["x"], ["y"])
    assert plan.storage["v"] == plan.storage["a"]
    assert plan.storage["b"] != plan.storage["a"]  # a lives through its view until the last step
    assert len({plan.storage[n] for n in ("x", "a", "b", "y")}) == 4


# ------------------------------------------------------------------------------ models

torch = pytest.importorskip("torch")
nn = torch.nn


class SmallNet(nn.Module):
    """conv + batch norm + relu, a residual block, a flatten (a view) and a linear layer."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = torch.relu(self.bn(self.c1(x)))
        y = torch.relu(self.c2(y) + y)
        return self.fc(torch.flatten(self.pool(y), 1))


@pytest.fixture(scope="module")
def small_net():
    torch.manual_seed(0)
    model = SmallNet().eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        want = model(x).numpy()
    return model, x, want


def test_compiled_model_matches_eager_with_numpy_and_torch_inputs(small_net, tmp_path, capfd):
    model, x, want = small_net
    graph = ansor.graph.from_torch(model, (x,))
    compiled = ansor.build(graph, database=str(tmp_path / "empty.db"))
    assert "no tuning record" in capfd.readouterr().err  # said once, with the count
    # the flatten is no kernel of its own: the linear layer reads through it (and through the
    # transpose of the channels-last pool output back to NCHW order)
    assert [s.piece.subgraph.ops[-1] for s in compiled.steps] == ["relu", "relu", "max_pool2d",
                                                                 "linear"]
    for _ in range(2):  # the buffers are reused between calls
        got = compiled(x.numpy())
        assert isinstance(got, np.ndarray) and rel_err(got, want) < TOLERANCE
    got_torch = compiled(x)
    assert isinstance(got_torch, torch.Tensor) and rel_err(got_torch.numpy(), want) < TOLERANCE
    assert compiled.memory.total_bytes <= compiled.memory.naive_bytes
    assert "distinct kernels" in compiled.summary()
    with pytest.raises(ValueError, match="expected shape"):
        compiled(np.zeros((1, 3, 4, 4), np.float32))


def test_kernel_steps_run_as_one_foreign_call_with_the_same_result(small_net, tmp_path):
    """Every step a compiled kernel: the model runs them with one call into C
    (`measure.sequence`), which gives what calling them one by one from Python gives."""
    model, x, want = small_net
    compiled = ansor.build(ansor.graph.from_torch(model, (x,)), database=str(tmp_path / "empty.db"))
    assert compiled._run_all is not None and len(compiled._run_all) == len(compiled._runs)
    got = compiled(x.numpy())
    assert rel_err(got, want) < TOLERANCE
    out = compiled.graph.outputs[0]
    compiled._values[out][...] = 0.0
    for run in compiled._runs:  # the same buffers, the steps called one by one
        run()
    np.testing.assert_array_equal(compiled._values[out], got)


def test_a_kernel_sequence_refuses_calls_with_more_arguments_than_it_dispatches():
    from ansor.measure.sequence import MAX_ARGUMENTS, KernelSequence, sequence_source

    with pytest.raises(ValueError, match="pointer arguments"):
        KernelSequence([(1, [0] * (MAX_ARGUMENTS + 1))])
    assert f"case {MAX_ARGUMENTS}:" in sequence_source() and f"case {MAX_ARGUMENTS + 1}:" not in sequence_source()


def run_from_c(compiled, name: str, x: np.ndarray, n_out: int, tmp_path) -> np.ndarray:
    """Export `compiled` as lib`name`.so, call it twice from a small C program on `x` (its one
    float32 input) and return the `n_out` floats of its one output."""
    lib = compiled.export_library(str(tmp_path / f"{name}.so"))
    assert f"{name}_run" in (tmp_path / f"{name}.h").read_text()
    program = tmp_path / "main.c"
    program.write_text(textwrap.dedent(f"""\
        #include <stdio.h>
        #include "{name}.h"
        int main(int argc, char** argv) {{
          static float x[{x.size}], y[{n_out}];
          FILE* f = fopen(argv[1], "rb");
          if (!f || fread(x, sizeof x, 1, f) != 1) return 3;
          fclose(f);
          {name}_model* m = {name}_create();
          if (!m) return 2;
          const void* inputs[{name.upper()}_NUM_INPUTS] = {{x}};
          void* outputs[{name.upper()}_NUM_OUTPUTS] = {{y}};
          {name}_run(m, inputs, outputs);
          {name}_run(m, inputs, outputs);
          {name}_destroy(m);
          for (int i = 0; i < {n_out}; ++i) printf("%.9g\\n", y[i]);
          return 0;
        }}
        """))
    exe = tmp_path / "main"
    subprocess.run(["gcc", "-O1", str(program), f"-I{tmp_path}", lib, f"-Wl,-rpath,{tmp_path}", "-o", str(exe)],
                   check=True)
    x.astype(np.float32).tofile(tmp_path / "x.bin")
    run = subprocess.run([str(exe), str(tmp_path / "x.bin")], capture_output=True, text=True, check=True)
    return np.array([float(v) for v in run.stdout.split()], np.float32)


def test_exported_library_runs_from_c_like_the_python_callable(small_net, tmp_path):
    model, x, want = small_net
    compiled = ansor.build(ansor.graph.from_torch(model, (x,)), database=str(tmp_path / "empty.db"),
                           verbose=False)
    from_c = run_from_c(compiled, "small_net", x.numpy(), 10, tmp_path)
    assert "[1x3x8x8]" in (tmp_path / "small_net.h").read_text()
    np.testing.assert_allclose(from_c, compiled(x.numpy()).ravel(), rtol=0, atol=1e-6)
    assert rel_err(from_c.reshape(want.shape), want) < TOLERANCE


class Masked(nn.Module):
    """A comparison (a bool value, which has no te form) between two kernels."""

    def forward(self, x):
        y = x * 2.0
        return torch.where(y > 0.5, y, -y).sum(dim=1)


def test_subgraph_without_te_form_runs_on_numpy_said_once_and_cannot_be_exported(tmp_path, capfd):
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    model = Masked().eval()
    compiled = ansor.build(ansor.graph.from_torch(model, (x,)), database=str(tmp_path / "empty.db"))
    err = capfd.readouterr().err
    assert "numpy reference kernels" in err and "bool" in err
    assert any(s.kind == "fallback" for s in compiled.steps)
    assert compiled._run_all is None  # numpy steps between the kernels: called one by one
    assert rel_err(compiled(x.numpy()), model(x).numpy()) < TOLERANCE
    from ansor.graph.export import ExportError

    with pytest.raises(ExportError, match="numpy fallback"):
        compiled.export_library(str(tmp_path / "masked.so"))


def test_tuned_model_uses_its_records_and_a_rerun_resumes(tmp_path, capfd):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU()).eval()
    x = torch.randn(4, 32)
    graph = ansor.graph.from_torch(model, (x,))
    db = str(tmp_path / "tuned.db")
    results = ansor.tune(graph, trials=16, database=db, seed=0, progress=False)
    assert len(results) == 1 and results[0].trials == 16 and results[0].best_cost < float("inf")
    again = ansor.tune(graph, trials=16, database=db, seed=0, progress=True, count_existing=True)
    assert again[0].trials == 0  # as a whole-model budget, the first run's records spend it
    assert "0 of 16 trials left" in capfd.readouterr().err
    more = ansor.tune(graph, trials=4, database=db, seed=1, progress=True)
    assert more[0].trials == 4 and "this run measures 4 more" in capfd.readouterr().err
    keys = [r.state_key for r in ansor.Database(db).records()]
    assert len(set(keys)) >= 20  # resumed: nothing measured again as if new
    compiled = ansor.build(graph, database=db)
    assert all(k.record is not None for k in compiled.kernels.values())
    with torch.no_grad():
        assert rel_err(compiled(x.numpy()), model(x).numpy()) < TOLERANCE


class WithGraphBreak(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        y = torch.relu(self.conv(x)).mean((2, 3))
        print("", end="")  # a graph break: Dynamo hands the backend two graphs
        return self.fc(y)


def test_torch_compile_backend_by_entry_point_is_correct_under_graph_breaks(tmp_path, capfd):
    torch.manual_seed(2)
    model = WithGraphBreak().eval()
    x = torch.randn(2, 3, 8, 8)
    torch._dynamo.reset()
    fast = torch.compile(model, backend="ansor", options={"database": str(tmp_path / "empty.db")})
    with torch.no_grad():
        want = model(x)
        got = fast(x)
    assert rel_err(got.numpy(), want.numpy()) < TOLERANCE
    err = capfd.readouterr().err
    assert err.count("no tuning record") == 2  # both graphs were compiled by ansor
    with torch.no_grad():
        model.fc.weight.mul_(2)  # weights changed in place: the graph runs in PyTorch
        want2 = model(x)
        assert rel_err(fast(x).numpy(), want2.numpy()) < TOLERANCE
    assert "weights changed" in capfd.readouterr().err
    torch._dynamo.reset()


def conv_relu_onnx(tmp_path, channels: int, size: int):
    """An ONNX file of a 3x3 conv2d (channels -> 4) + ReLU over a size x size image."""
    pytest.importorskip("onnx")
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.ReLU()).eval()
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (torch.randn(1, channels, size, size),), str(path), dynamo=True)
    return path


def test_cli_tune_model_then_run_model_on_an_onnx_file(tmp_path):
    path = conv_relu_onnx(tmp_path, 3, 8)
    db = str(tmp_path / "cli.db")
    cli = [sys.executable, "-m", "ansor.cli"]
    tuned = subprocess.run([*cli, "tune-model", str(path), "--trials", "8", "--database", db, "--seed", "0",
                            "--quiet"], capture_output=True, text=True)
    assert tuned.returncode == 0, tuned.stderr
    assert "estimated model latency" in tuned.stdout
    ran = subprocess.run([*cli, "run-model", str(path), "--database", db, "--rounds", "2"],
                         capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    # 8 trials in rounds of 4: the scheduler's warm-up round reaches both subgraphs
    assert "2 distinct kernels (2 tuned)" in ran.stdout and "ansor" in ran.stdout
    missing = subprocess.run([*cli, "run-model", str(tmp_path / "nope.onnx")], capture_output=True, text=True)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_cli_run_model_keeps_convolutions_direct_when_told(tmp_path):
    """A 3x3 convolution over 24x24 (36 tiles) runs in Winograd form unless --no-winograd."""
    path = conv_relu_onnx(tmp_path, 4, 24)
    ansor.Database(str(tmp_path / "empty.db")).close()  # run-model reads an existing database
    cli = [sys.executable, "-m", "ansor.cli", "run-model", str(path), "--database", str(tmp_path / "empty.db"),
           "--rounds", "1"]
    summaries = []
    for flags in ([], ["--no-winograd"]):
        ran = subprocess.run([*cli, *flags], capture_output=True, text=True)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        summaries.append(ran.stdout)
    assert "winograd_output" in summaries[0] and "winograd" not in summaries[1]


def _small_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100, max_position_embeddings=32)
    torch.manual_seed(4)
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()

    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    ids = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(1, 16, dtype=torch.int64)
    mask[0, 12:] = 0
    return Hidden().eval(), (ids, mask)


@pytest.mark.parametrize("door", ["from_torch", "from_onnx", "torch.compile"])
def test_a_bert_layer_compiled_through_every_door_matches_eager(door, tmp_path):
    model, inputs = _small_bert()
    with torch.no_grad():
        want = model(*inputs).numpy()
    db = str(tmp_path / "empty.db")
    if door == "torch.compile":
        torch._dynamo.reset()
        with torch.no_grad():
            got = torch.compile(model, backend="ansor", options={"database": db, "verbose": False,
                                                                  "check": True})(*inputs)
        torch._dynamo.reset()
        assert rel_err(got.numpy(), want) < TOLERANCE
        return
    if door == "from_torch":
        graph = ansor.graph.from_torch(model, inputs)
    else:
        pytest.importorskip("onnx")
        path = tmp_path / "bert.onnx"
        torch.onnx.export(model, inputs, str(path), dynamo=True)
        graph = ansor.graph.from_onnx(str(path))
    compiled = ansor.build(graph, database=db, verbose=False, check=True)  # random ids and masks too
    assert sum(s.kind == "kernel" for s in compiled.steps) > 5
    assert rel_err(compiled(*[x.numpy() for x in inputs]), want) < TOLERANCE
    assert compiled.check(*[x.numpy() for x in inputs]).ok


class WinogradNet(nn.Module):
    """Two 3x3 convolutions over an 18x18 image (25 4x4 tiles, the last ones overhanging), with
    batch norm, a residual add and a global pool around them."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.fc = nn.Linear(8, 10)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        y = torch.relu(self.bn(self.c1(x)))
        y = torch.relu(self.c2(y) + y)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


@pytest.mark.parametrize("door", ["from_torch", "from_onnx", "torch.compile"])
def test_a_cnn_with_winograd_convolutions_compiled_through_every_door_matches_eager(door, tmp_path, monkeypatch):
    monkeypatch.setattr(graph_winograd, "MIN_TILES", 16)  # a small image: 25 tiles
    torch.manual_seed(1)
    model, x = WinogradNet().eval(), torch.randn(1, 3, 18, 18)
    with torch.no_grad():
        want = model(x).numpy()
    db = str(tmp_path / "empty.db")
    if door == "torch.compile":
        for winograd in (True, False):
            torch._dynamo.reset()
            with torch.no_grad():
                got = torch.compile(model, backend="ansor",
                                    options={"database": db, "verbose": False, "winograd": winograd})(x)
            assert rel_err(got.numpy(), want) < TOLERANCE
        torch._dynamo.reset()
        return
    if door == "from_torch":
        graph = ansor.graph.from_torch(model, (x,))
    else:
        pytest.importorskip("onnx")
        path = tmp_path / "cnn.onnx"
        torch.onnx.export(model, (x,), str(path), dynamo=True)
        graph = ansor.graph.from_onnx(str(path))
    compiled = ansor.build(graph, database=db, verbose=False, check=True)
    assert [n.op for n in compiled.graph.nodes].count("winograd_output") == 2
    assert rel_err(compiled(x.numpy()), want) < TOLERANCE
    if door == "from_torch":  # the transformed weights travel into the C library too
        from_c = run_from_c(compiled, "winograd_net", x.numpy(), 10, tmp_path)
        np.testing.assert_allclose(from_c, compiled(x.numpy()).ravel(), rtol=0, atol=1e-6)


def test_a_model_without_records_gets_chosen_programs_and_a_second_build_searches_nothing(tmp_path):
    """The first build of a model measures programs for its tasks (default schedules among
    them), records them and uses them; the second build finds them and measures nothing."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).eval()
    x = torch.randn(1, 3, 8, 8)
    graph = ansor.graph.from_torch(model, (x,))
    db = str(tmp_path / "fresh.db")
    first = ansor.build(graph, database=db, quick_seconds=8, verbose=False)
    assert all(k.record is not None for k in first.kernels.values())
    with torch.no_grad():
        assert rel_err(first(x.numpy()), model(x).numpy()) < TOLERANCE
    recorded = len(ansor.Database(db).records())
    assert recorded >= len(first.kernels)
    second = ansor.build(graph, database=db, quick_seconds=8, verbose=False)
    assert len(ansor.Database(db).records()) == recorded
    assert [k.record for k in second.kernels.values()] == [k.record for k in first.kernels.values()]
    untouched = ansor.build(graph, database=str(tmp_path / "other.db"), quick_seconds=0, verbose=False)
    assert all(k.record is None for k in untouched.kernels.values())


def test_a_budget_smaller_than_a_round_per_task_still_covers_every_task(tmp_path):
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8), nn.Tanh()).eval()
    graph = ansor.graph.from_torch(model, (torch.randn(2, 16),))
    db = str(tmp_path / "small.db")
    results = ansor.tune(graph, trials=4, database=db, seed=0, progress=False)
    assert len(results) >= 2 and sum(r.trials for r in results) <= 4 + 4  # the lap, then no more
    assert all(r.trials >= 1 and r.best_cost < float("inf") for r in results)


def test_a_time_budget_without_trials_measures_as_many_as_the_time_allows(tmp_path):
    """`tune(graph, time_budget=...)` is bounded by the time alone (not by the 1000 trials a
    graph's job defaults to); `tune_model(trials=None)` without a budget is refused."""
    from ansor.graph.model_tuning import UNLIMITED_TRIALS, tune_model

    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).eval()
    graph = ansor.graph.from_torch(model, (torch.randn(2, 16),))
    db = str(tmp_path / "budget.db")
    results = ansor.tune(graph, database=db, seed=0, progress=False, time_budget=4.0)
    assert 0 < sum(r.trials for r in results) < UNLIMITED_TRIALS
    assert all(r.best_cost < float("inf") for r in results)
    with ansor.Database(db) as store, pytest.raises(ValueError, match="trials, a time_budget"):
        tune_model(graph, store, trials=None)


def test_cli_tunes_a_pytorch_model_given_as_a_python_file(tmp_path):
    """`ansor tune-model model.py[:NAME]`: the file's function returns (module, inputs); the
    records it leaves build the same model in Python, equal to PyTorch."""
    source = tmp_path / "tiny_model.py"
    source.write_text(
        "import torch\n"
        "def build():\n"
        "    torch.manual_seed(5)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU()), (torch.randn(3, 12),)\n")
    db = str(tmp_path / "py.db")
    cli = [sys.executable, "-m", "ansor.cli", "tune-model"]
    tuned = subprocess.run([*cli, f"{source}:build", "--trials", "4", "--database", db, "--seed", "0", "--quiet"],
                           capture_output=True, text=True)
    assert tuned.returncode == 0, tuned.stderr
    assert "estimated model latency" in tuned.stdout
    from ansor.compare import load_torch_model

    graph = load_torch_model(f"{source}:build")
    compiled = ansor.build(graph, database=db, verbose=False)
    assert all(k.record is not None for k in compiled.kernels.values())
    torch.manual_seed(5)
    module, (x,) = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU()), (torch.randn(3, 12),)
    with torch.no_grad():
        assert rel_err(compiled(x.numpy()), module(x).numpy()) < TOLERANCE
    wrong = subprocess.run([*cli, f"{source}:nothing", "--database", db], capture_output=True, text=True)
    assert wrong.returncode == 2 and "defines no 'nothing'" in wrong.stderr and len(wrong.stderr.splitlines()) == 1


def test_a_graph_tunes_from_an_options_object_too(tmp_path):
    torch.manual_seed(6)
    graph = ansor.graph.from_torch(nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval(), (torch.randn(2, 8),))
    results = ansor.tune(graph, options=ansor.TuneOptions(trials=3, seed=0), database=str(tmp_path / "o.db"),
                         progress=False)
    assert [r.trials for r in results] == [3]
