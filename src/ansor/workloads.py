"""Named workloads: the operators of `te.ops` with a shape, for the CLI and benchmarks.

Each entry builds the tensors of a Task from a shape tuple and options, and may give numpy and
PyTorch implementations that the CLI times in the same run as a baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ansor.te import ops, placeholder
from ansor.te.tensor import Tensor


@dataclass(frozen=True)
class Workload:
    """A named workload: how to declare it from a shape, and the baselines it is timed against."""

    name: str
    shape_help: str          # what the numbers of --shape mean
    default_shape: tuple[int, ...]
    make: Callable[..., list[Tensor]]                # (shape, dtype, **options) -> inputs + [output]
    numpy_fn: Callable[..., np.ndarray] | None = None
    torch_fn: Callable[..., object] | None = None     # (options incl. "shape", *torch tensors)
    options: dict = field(default_factory=dict)       # option name -> default


def _conv_opts(o: dict) -> dict:
    return {"stride": o.get("stride", 1), "padding": o.get("padding", 0), "dilation": o.get("dilation", 1)}


def _matmul(shape, dtype, **_):
    M, N, K = shape
    A = placeholder((M, K), dtype, "A")
    B = placeholder((K, N), dtype, "B")
    return [A, B, ops.matmul(A, B)]


def _batch_matmul(shape, dtype, **_):
    b, M, N, K = shape
    A = placeholder((b, M, K), dtype, "A")
    B = placeholder((b, K, N), dtype, "B")
    return [A, B, ops.batch_matmul(A, B)]


def _matmul_bias_relu(shape, dtype, **_):
    M, N, K = shape
    A = placeholder((M, K), dtype, "A")
    B = placeholder((K, N), dtype, "B")
    bias = placeholder((N,), dtype, "bias")
    mm = ops.matmul(A, B)
    return [A, B, bias, ops.relu(ops.bias_add(mm, bias, axis=1))]


def _dense(shape, dtype, **_):
    M, N, K = shape
    X = placeholder((M, K), dtype, "X")
    W = placeholder((N, K), dtype, "W")
    bias = placeholder((N,), dtype, "bias")
    return [X, W, bias, ops.dense(X, W, bias)]


def _conv2d(shape, dtype, bias_relu: bool = False, **o):
    n, c, h, w, co, kh, kw = shape
    groups = int(o.get("groups", 1))
    data = placeholder((n, c, h, w), dtype, "data")
    weight = placeholder((co, c // groups, kh, kw), dtype, "weight", constant=True)
    out = ops.conv2d(data, weight, groups=groups, **_conv_opts(o))
    if not bias_relu:
        return [data, weight, out]
    bias = placeholder((co,), dtype, "bias")
    return [data, weight, bias, ops.relu(ops.bias_add(out, bias, axis=1))]


def _depthwise(shape, dtype, **o):
    n, c, h, w, kh, kw = shape
    data = placeholder((n, c, h, w), dtype, "data")
    weight = placeholder((c, 1, kh, kw), dtype, "weight", constant=True)
    return [data, weight, ops.depthwise_conv2d(data, weight, **_conv_opts(o))]


def _conv2d_transpose(shape, dtype, **o):
    n, ci, h, w, co, kh, kw = shape
    data = placeholder((n, ci, h, w), dtype, "data")
    weight = placeholder((ci, co, kh, kw), dtype, "weight", constant=True)
    return [data, weight, ops.conv2d_transpose(data, weight, stride=o.get("stride", 1),
                                               padding=o.get("padding", 0))]


def _pool(kind: str):
    def make(shape, dtype, **o):
        n, c, h, w, k = shape
        data = placeholder((n, c, h, w), dtype, "data")
        fn = ops.max_pool2d if kind == "max" else ops.avg_pool2d
        return [data, fn(data, k, stride=o.get("stride"), padding=o.get("padding", 0))]
    return make


def _unary(fn):
    def make(shape, dtype, **_):
        X = placeholder(tuple(shape), dtype, "X")
        return [X, fn(X)]
    return make


def _layer_norm(shape, dtype, gelu: bool = False, **_):
    rows, cols = shape
    X = placeholder((rows, cols), dtype, "X")
    gamma = placeholder((cols,), dtype, "gamma")
    beta = placeholder((cols,), dtype, "beta")
    out = ops.layer_norm(X, gamma, beta)
    return [X, gamma, beta, ops.gelu(out) if gelu else out]


def _np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _np_layer_norm(x, g, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b


def _torch_conv(bias_relu: bool):
    def run(o, data, weight, bias=None):
        import torch.nn.functional as F

        y = F.conv2d(data, weight, stride=o.get("stride", 1), padding=o.get("padding", 0),
                     dilation=o.get("dilation", 1), groups=int(o.get("groups", 1)))
        return F.relu(y + bias.view(1, -1, 1, 1)) if bias_relu else y
    return run


def _torch_layer_norm(gelu: bool):
    def run(o, x, g, b):
        import torch.nn.functional as F

        y = F.layer_norm(x, (x.shape[-1],), g, b, 1e-5)
        return F.gelu(y) if gelu else y
    return run


def _torch():
    import torch
    import torch.nn.functional as F

    return torch, F


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("matmul", "M,N,K", (512, 512, 512), _matmul, lambda a, b: a @ b, lambda o, a, b: a @ b),
    Workload("batch_matmul", "B,M,N,K", (12, 128, 128, 64), _batch_matmul, np.matmul,
             lambda o, a, b: _torch()[0].bmm(a, b)),
    Workload("matmul_bias_relu", "M,N,K", (512, 512, 512), _matmul_bias_relu,
             lambda a, b, c: np.maximum(a @ b + c, 0), lambda o, a, b, c: _torch()[0].relu(a @ b + c)),
    Workload("dense", "M,N,K", (128, 512, 512), _dense, lambda x, w, b: x @ w.T + b,
             lambda o, x, w, b: _torch()[1].linear(x, w, b)),
    Workload("conv2d", "N,C,H,W,O,KH,KW", (1, 64, 56, 56, 64, 3, 3), _conv2d, None, _torch_conv(False),
             {"stride": 1, "padding": 1, "dilation": 1, "groups": 1}),
    Workload("conv2d_bias_relu", "N,C,H,W,O,KH,KW", (1, 64, 56, 56, 64, 3, 3),
             lambda s, d, **o: _conv2d(s, d, bias_relu=True, **o), None, _torch_conv(True),
             {"stride": 1, "padding": 1, "dilation": 1, "groups": 1}),
    Workload("depthwise_conv2d", "N,C,H,W,KH,KW", (1, 128, 56, 56, 3, 3), _depthwise, None,
             lambda o, x, w: _torch()[1].conv2d(x, w, stride=o["stride"], padding=o["padding"],
                                                dilation=o["dilation"], groups=x.shape[1]),
             {"stride": 1, "padding": 1, "dilation": 1}),
    Workload("conv2d_transpose", "N,CI,H,W,CO,KH,KW", (1, 512, 4, 4, 256, 4, 4), _conv2d_transpose, None,
             lambda o, x, w: _torch()[1].conv_transpose2d(x, w, stride=o["stride"], padding=o["padding"]),
             {"stride": 2, "padding": 1}),
    Workload("max_pool2d", "N,C,H,W,K", (1, 64, 112, 112, 3), _pool("max"), None,
             lambda o, x: _torch()[1].max_pool2d(x, o["shape"][4], o.get("stride"), o["padding"]),
             {"stride": 2, "padding": 1}),
    Workload("avg_pool2d", "N,C,H,W,K", (1, 64, 56, 56, 2), _pool("avg"), None, None, {"stride": 2, "padding": 0}),
    Workload("relu", "dims...", (1024, 1024), _unary(ops.relu), lambda x: np.maximum(x, 0),
             lambda o, x: _torch()[0].relu(x)),
    Workload("gelu", "dims...", (1024, 1024), _unary(ops.gelu), None, lambda o, x: _torch()[1].gelu(x)),
    Workload("softmax", "rows,cols", (1536, 128), _unary(ops.softmax), _np_softmax,
             lambda o, x: _torch()[0].softmax(x, -1)),
    Workload("layer_norm", "rows,cols", (4096, 768), _layer_norm, _np_layer_norm, _torch_layer_norm(False)),
    Workload("layer_norm_gelu", "rows,cols", (4096, 768), lambda s, d, **o: _layer_norm(s, d, gelu=True),
             None, _torch_layer_norm(True)),
    Workload("norm2", "M,N", (1024, 1024), _unary(ops.norm2), lambda x: np.array([np.linalg.norm(x)], x.dtype),
             lambda o, x: _torch()[0].linalg.vector_norm(x).reshape(1)),
]}


def make_task_tensors(name: str, shape: Sequence[int] | None = None, dtype: str = "float32",
                      **options) -> list[Tensor]:
    """Inputs then output of a named workload; unknown names list the known ones."""
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}")
    w = WORKLOADS[name]
    shape = tuple(shape) if shape else w.default_shape
    n_expected = len(w.shape_help.split(","))
    if "..." not in w.shape_help and len(shape) != n_expected:
        raise ValueError(f"workload {name!r} takes --shape {w.shape_help} ({n_expected} numbers), got {list(shape)}")
    check_options(name, options)
    opts = {**w.options, **{k: v for k, v in options.items() if v is not None}}
    return w.make(shape, dtype, **opts)


def check_options(name: str, options: dict) -> None:
    """Refuse options a workload does not take (given, not None), naming those it takes: a
    silently ignored --padding would tune another computation than the one asked for."""
    w = WORKLOADS[name]
    given = sorted(k for k, v in options.items() if v is not None and k not in w.options)
    if given:
        takes = ", ".join(f"--{k}" for k in w.options) if w.options else "no options"
        raise ValueError(f"workload {name!r} does not take {', '.join('--' + k for k in given)}; "
                         f"it takes {takes}")


def workload_options(name: str, shape: Sequence[int] | None = None, **options) -> dict:
    """The options a workload runs with (defaults filled in), plus its shape."""
    w = WORKLOADS[name]
    opts = {**w.options, **{k: v for k, v in options.items() if v is not None}}
    opts["shape"] = tuple(shape) if shape else w.default_shape
    return opts


def make_task(name: str, shape: Sequence[int] | None = None, dtype: str = "float32", target=None, **options):
    """A Task of a named workload; its description records how to rebuild it."""
    from ansor.task import Task

    w = WORKLOADS.get(name)
    tensors = make_task_tensors(name, shape, dtype, **options)
    used = {k: v for k, v in options.items() if v is not None}
    spec = {"workload": name, "shape": list(shape or w.default_shape), "dtype": dtype, "options": used}
    return Task(tensors, target=target, name=name, spec=spec)


def dag_from_description(description: dict):
    """Rebuild the ComputeDAG of a stored named-workload description from its spec, or None
    when it is not a named workload of this registry. The spec comes from a file: anything
    malformed is a ValueError."""
    from ansor.dag import ComputeDAG

    spec = (description or {}).get("spec")
    if not isinstance(spec, dict) or spec.get("workload") not in WORKLOADS:
        return None
    w = WORKLOADS[spec["workload"]]
    shape, options = spec.get("shape"), spec.get("options", {})
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                              for n in shape):
        raise ValueError(f"spec of {w.name!r}: shape must be positive integers, got {shape!r}")
    if not isinstance(options, dict):
        raise ValueError(f"spec of {w.name!r}: options must be an object, got {options!r}")
    # options the workload does not take were ignored when the records were made
    options = {k: v for k, v in options.items() if k in w.options}
    tensors = make_task_tensors(w.name, shape, spec.get("dtype", "float32"), **options)
    return ComputeDAG(tensors)


def workload_label(description: dict | None) -> str:
    """A readable name of a stored workload: a named workload's name and shape (with the
    options that differ from its defaults, e.g. `conv2d 1x64x56x56x64x3x3 stride=2`), else the
    computation's outputs with their shapes (`C 512x512`)."""
    desc = description if isinstance(description, dict) else {}
    spec = desc.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("workload"), str):
        name = spec["workload"]
        parts = [name, _dims(spec.get("shape"))]
        defaults = WORKLOADS[name].options if name in WORKLOADS else {}
        options = spec.get("options") if isinstance(spec.get("options"), dict) else {}
        parts += [f"{k}={v}" for k, v in options.items() if v is not None and defaults.get(k) != v]
        if spec.get("dtype", "float32") != "float32":
            parts.append(str(spec["dtype"]))
        return " ".join(p for p in parts if p)
    outputs = desc.get("outputs")
    if isinstance(outputs, list) and outputs:
        labels = []
        for out in outputs:
            if isinstance(out, list) and len(out) >= 2:
                labels.append(f"{out[0]} {_dims(out[1])}".strip())
        if labels:
            return ", ".join(labels)
    name = desc.get("name")
    return name if isinstance(name, str) else "?"


def task_label(task) -> str:
    """The label of a task in tuning output: `workload_label` of a named workload (its name
    and full shape, as `ansor show` prints it), else the task's name and output shape."""
    return workload_label({"spec": task.spec}) if isinstance(task.spec, dict) else task.label


def _dims(shape) -> str:
    if not isinstance(shape, list):
        return ""
    return "x".join(str(n) for n in shape) if shape else "scalar"
