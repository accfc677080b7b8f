"""Convolutions tuned in NCHW and in NHWC with the same budget, beside PyTorch.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/layouts.py --trials 64
    python benchmarks/layouts.py --trials 64 --only dw_s2_144x56 conv3x3_64x56

Each shape (layers of MobileNet-V2 and ResNet-18, batch 1) is declared in both layouts and
tuned from scratch into its own database (fresh each run, pretrained model off: the shipped model
has seen NCHW programs only); the two best kernels and PyTorch's conv2d (NCHW) are then timed
in turns in this process. This is the measurement behind the channels-last graph pass
(`ansor.graph.layout`).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import ansor
from ansor.baselines import time_in_turns
from ansor.te import ops, placeholder

#: name -> (input channels, height = width, output channels, kernel, stride, depthwise)
SHAPES = {
    "dw_s2_144x56": (144, 56, 144, 3, 2, True),
    "dw_s2_96x112": (96, 112, 96, 3, 2, True),
    "dw_s1_32x112": (32, 112, 32, 3, 1, True),
    "conv3x3_64x56": (64, 56, 64, 3, 1, False),
    "conv3x3_s2_64x56": (64, 56, 128, 3, 2, False),
    "conv1x1_144x56": (144, 56, 24, 1, 1, False),
    "conv1x1_24x56": (24, 56, 144, 1, 1, False),
    "stem7x7_s2": (3, 224, 64, 7, 2, False),
}


def declare(name: str, layout: str) -> ansor.Task:
    ci, hw, co, k, stride, depthwise = SHAPES[name]
    nchw = layout == "NCHW"
    data = placeholder((1, ci, hw, hw) if nchw else (1, hw, hw, ci), "float32", "data")
    if depthwise:
        weight = placeholder((co, 1, k, k) if nchw else (k, k, 1, co), "float32", "weight")
        out = ops.depthwise_conv2d(data, weight, stride, k // 2, layout=layout)
    else:
        weight = placeholder((co, ci, k, k) if nchw else (k, k, ci, co), "float32", "weight")
        out = ops.conv2d(data, weight, stride, k // 2, layout=layout)
    return ansor.Task([data, weight, out], name=f"{name}_{layout}")


def torch_conv(name: str):
    """PyTorch's conv2d on the NCHW shape, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    ci, hw, co, k, stride, depthwise = SHAPES[name]
    x = torch.randn(1, ci, hw, hw)
    w = torch.randn(co, 1 if depthwise else ci, k, k)
    groups = ci if depthwise else 1

    def run():
        with torch.no_grad():
            torch.nn.functional.conv2d(x, w, stride=stride, padding=k // 2, groups=groups)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--only", nargs="*", choices=sorted(SHAPES), default=None)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("ANSOR_PRETRAINED", "0")
    print(f"{'shape':18s} {'NCHW':>18s} {'NHWC':>18s} {'NHWC/NCHW':>10s} {'PyTorch':>10s}")
    for name in args.only or SHAPES:
        kernels, fns = {}, {}
        with tempfile.TemporaryDirectory() as tmp:
            for layout in ("NCHW", "NHWC"):
                task = declare(name, layout)
                ansor.tune(task, trials=args.trials, database=os.path.join(tmp, f"{layout}.db"),
                           seed=0, progress=False)
                kernel = ansor.build(task, database=os.path.join(tmp, f"{layout}.db"))
                inputs = task.random_inputs(seed=1)
                got, want = kernel(*inputs), task.reference_outputs(inputs)[0]
                if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                    raise SystemExit(f"{task.name}: the kernel disagrees with numpy")
                kernels[layout], fns[layout] = task, kernel.prepared(*inputs)
        reference = torch_conv(name)
        if reference is not None:
            fns["PyTorch"] = reference
        times = time_in_turns(fns, args.rounds, pause_s=0.05)
        flop = kernels["NCHW"].flop
        row = [f"{times[k].median * 1e6:8.1f} us {flop / times[k].median / 1e9:5.0f} GF"
               for k in ("NCHW", "NHWC")]
        torch_ratio = (f"{times['PyTorch'].median / times['NHWC'].median:9.2f}x"
                       if "PyTorch" in times else "         -")
        print(f"{name:18s} {row[0]:>18s} {row[1]:>18s} "
              f"{times['NCHW'].median / times['NHWC'].median:9.2f}x {torch_ratio}", flush=True)


if __name__ == "__main__":
    main()
