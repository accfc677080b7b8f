"""`ansor compare MODEL --dtype bfloat16` and `compare.compare_bf16_model`: a PyTorch model in bf16
checked against PyTorch eager in bf16 before anything is timed (what is compared, not how fast)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ansor.cli import main  # noqa: E402
from ansor.compare import BF16_MODEL_TOLERANCE, bf16_model_check, compare_bf16_model  # noqa: E402

MODEL_FILE = '''
import torch
class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(64, 128), torch.nn.Linear(128, 32)
    def forward(self, x):
        return torch.softmax(self.fc2(torch.relu(self.fc1(x))), -1)
torch.manual_seed(0)
model = MLP()
example_inputs = (torch.randn(8, 64),)
'''


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16))


def test_compare_bf16_model_checks_against_pytorch_bf16_and_keeps_the_module(tmp_path):
    module = _mlp()
    result = compare_bf16_model(module, (torch.randn(4, 64),), database=str(tmp_path / "r.db"), rounds=1)
    assert [e.name for e in result.entries] == ["ansor bf16", "PyTorch eager float32", "PyTorch eager bf16"]
    assert "PyTorch eager in bf16" in result.checked and "bfloat16" in result.title
    assert all(p.dtype == torch.float32 for p in module.parameters())  # converted copies, not the module
    skipped = compare_bf16_model(module, (torch.randn(4, 64),), database=str(tmp_path / "r.db"), rounds=1,
                                 skip={"torch"})
    assert [e.name for e in skipped.entries] == ["ansor bf16", "PyTorch eager bf16"]


def test_bf16_model_check_refuses_what_is_off_by_more_than_bf16_roundings():
    rng = np.random.default_rng(0)
    want = rng.standard_normal((4, 16)).astype(np.float32)
    assert bf16_model_check([want * (1 + 2.0 ** -8)], [want]) is None
    wrong = want.copy()
    wrong[0, 0] += 4 * BF16_MODEL_TOLERANCE * float(np.sqrt(np.mean(want ** 2)))
    assert "tolerance" in bf16_model_check([wrong], [want])
    assert "shape" in bf16_model_check([want[:2]], [want])


def test_cli_compare_runs_a_pytorch_model_in_bf16(tmp_path, capsys):
    path = tmp_path / "mlp.py"
    path.write_text(MODEL_FILE)
    code = main(["compare", str(path), "--dtype", "bfloat16", "--rounds", "1", "--database",
                 str(tmp_path / "r.db")])
    out = capsys.readouterr().out
    assert code == 0
    assert "ansor bf16" in out and "PyTorch eager bf16" in out and "checked against PyTorch eager in bf16" in out
    code = main(["compare", str(tmp_path / "m.onnx"), "--dtype", "bfloat16", "--database", str(tmp_path / "r.db")])
    captured = capsys.readouterr()
    assert code != 0 and "takes a PyTorch model" in captured.out + captured.err
