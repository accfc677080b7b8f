"""Comparing ansor with numpy, PyTorch, torch.compile and onnxruntime, from Python.

`ansor compare` on the command line prints one table for a named workload or an ONNX file;
`ansor.compare` does the same from Python, and takes what a file cannot hold: the PyTorch
module a model came from, so that PyTorch eager and torch.compile run beside ansor and
onnxruntime on the same inputs. Every implementation's output is checked against the reference
before anything is timed, and the timing takes turns in this one process.

1. a named workload (a 256^3 matmul): tuned briefly, then `compare_workload`;
2. a small convolutional network written in PyTorch: exported to ONNX, imported with
   `ansor.graph.from_onnx`, its fused subgraphs tuned together, then `compare_model` with the
   module, so the table has ansor, numpy (the reference executor), onnxruntime, PyTorch eager
   and torch.compile;
each table is saved as a bar chart.

    python examples/compare_tools.py                         # 48 trials each
    python examples/compare_tools.py --trials 400 --database compare.db
    python examples/compare_tools.py --small --trials 2      # tiny shapes (the smoke test)

The command line does the same for a file: `ansor compare model.onnx --database compare.db -o
chart.png`, and for a workload `ansor compare matmul --shape 256,256,256 -o chart.png`.
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
from contextlib import redirect_stdout

import ansor
from ansor.compare import BASELINES, compare_model, compare_workload
from ansor.report import console
from ansor.workloads import make_task


def small_cnn(channels: int):
    """conv 3x3 + ReLU, conv 3x3 stride 2 + ReLU, global average, linear: random weights, fixed."""
    import torch

    torch.manual_seed(0)

    class SmallCNN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(3, channels, 3, padding=1)
            self.conv2 = torch.nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1)
            self.fc = torch.nn.Linear(2 * channels, 10)

        def forward(self, x):
            x = torch.relu(self.conv1(x))
            x = torch.relu(self.conv2(x))
            return self.fc(x.mean(dim=(2, 3)))

    return SmallCNN().eval()


def export_onnx(module, example, path: str) -> str:
    """The module as an ONNX file (the exporter's progress lines kept out of the output)."""
    import torch

    with redirect_stdout(io.StringIO()):
        torch.onnx.export(module, (example,), path, dynamo=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=48,
                        help="programs to measure for the matmul, and for the model (default 48)")
    parser.add_argument("--database", default=None,
                        help="records database (default: a temporary file, removed at the end)")
    parser.add_argument("--small", action="store_true", help="tiny shapes, for a quick check (default: off)")
    parser.add_argument("--charts", default=".", help="folder for the two bar charts (default: .)")
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds (default 7)")
    parser.add_argument("--skip", action="append", default=[], choices=BASELINES,
                        help="leave out a baseline (repeatable; default: none)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the search (default 0)")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        raise SystemExit("this example exports a PyTorch model: pip install -e '.[models]'") from None
    os.makedirs(args.charts, exist_ok=True)
    size = 32 if args.small else 256
    channels, image = (4, 8) if args.small else (32, 56)
    with tempfile.TemporaryDirectory() as tmp:
        db = args.database or os.path.join(tmp, "compare.db")
        print(f"records: {db}")

        # 1. a named workload
        shape = (size, size, size)
        task = make_task("matmul", shape)
        ansor.tune(task, trials=args.trials, database=db, seed=args.seed, progress=False)
        result = compare_workload("matmul", shape, database=db, rounds=args.rounds, skip=args.skip)
        console.print(result.table())
        for line in result.lines():
            print(line)
        chart = result.save_chart(os.path.join(args.charts, "compare_matmul.png"))
        print(f"bar chart saved to {chart}\n")

        # 2. a model: from PyTorch to ONNX, tuned, compared with the module and the file
        module = small_cnn(channels)
        example = torch.randn(1, 3, image, image)
        path = export_onnx(module, example, os.path.join(tmp, "small_cnn.onnx"))
        graph = ansor.graph.from_onnx(path)
        ansor.tune(graph, trials=args.trials, database=db, seed=args.seed, progress=False)
        result = compare_model(path, database=db, rounds=args.rounds, skip=args.skip, module=module)
        console.print(result.table())
        for line in result.lines():
            print(line)
        chart = result.save_chart(os.path.join(args.charts, "compare_model.png"))
        print(f"bar chart saved to {chart}")


if __name__ == "__main__":
    main()
