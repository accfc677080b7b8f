"""`torch.compile(model, backend="ansor")`: PyTorch's graphs run as compiled ansor models.

TorchDynamo cuts a model's Python into FX graphs (several when the code has graph breaks) and
hands each one to this backend with example inputs. The backend imports the graph
(`from_torch`), builds it with the records of the database (`ansor.build`: tuned kernels where
records exist, default schedules elsewhere), and returns a function PyTorch calls instead of the
graph. Whatever cannot be taken (an operator without a mapping, a dtype without a kernel) runs
in PyTorch, said once, so a model always computes what it computed before.

Weights: Dynamo passes a module's parameters and buffers as graph inputs. They are bound into
the compiled model as constants (so their layouts are packed once); a call with a different
weight tensor, or one changed in place since, runs the graph in PyTorch instead. Calls that need
gradients (grad mode on and an input requiring them) also run in PyTorch: the compiled kernels
compute values only, so inference should run under `torch.no_grad()` or `torch.inference_mode()`.

Options (`torch.compile(m, backend="ansor", options={...})`): `database` (path or Database;
default: the default database), `trials` (tune the graph's tasks first with this many
measurements; default 0), `verbose` (say what runs where; default True), `winograd` (False
keeps 3x3 convolutions direct; default True, see `ansor.graph.winograd`), `check` (run each
compiled graph once on Dynamo's example inputs and compare it with the eager graph under the
tolerance of `CompiledModel.check`; a mismatch raises `OutputMismatchError` naming the first
output out of tolerance instead of running a wrong answer or hiding it behind PyTorch; default
False).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

_WEIGHT_MARKERS = ("_parameters_", "_buffers_")


def ansor_backend(gm: Any, example_inputs: Sequence[Any], options: dict | None = None) -> Callable:
    """The TorchDynamo backend: a callable standing for `gm` (see the module docstring)."""
    import torch

    opts = dict(options or {})
    database = opts.pop("database", None)
    trials = int(opts.pop("trials", 0))
    verbose = bool(opts.pop("verbose", True))
    winograd = bool(opts.pop("winograd", True))
    check = bool(opts.pop("check", False))
    if opts:
        raise TypeError(f"ansor backend: unknown options {', '.join(sorted(opts))} "
                        f"(known: check, database, trials, verbose, winograd)")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    weight_positions = [i for i, (node, x) in enumerate(zip(placeholders, example_inputs))
                        if isinstance(x, torch.nn.Parameter) or any(m in node.name for m in _WEIGHT_MARKERS)]
    activation_positions = [i for i in range(len(example_inputs)) if i not in set(weight_positions)]
    try:
        compiled = _compile(gm, example_inputs, weight_positions, activation_positions, database, trials, verbose,
                            winograd)
    except Exception as err:  # anything the importer or builder cannot take runs in PyTorch
        if verbose:
            print(f"ansor: a graph of {len(gm.graph.nodes)} nodes runs in PyTorch: {err}", file=sys.stderr)
        return gm.forward
    if check:
        _check_against_eager(gm, compiled, example_inputs, activation_positions, verbose)
    weights = [example_inputs[i] for i in weight_positions]
    versions = [w._version for w in weights]
    told = set()

    def run(*args: Any):
        reason = None
        if any(args[i] is not w or w._version != v for i, w, v in zip(weight_positions, weights, versions)):
            reason = "its weights changed since compilation"
        elif torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            reason = "the call needs gradients (use torch.no_grad() for the compiled kernels)"
        if reason is not None:
            if verbose and reason not in told:
                told.add(reason)
                print(f"ansor: a compiled graph runs in PyTorch: {reason}", file=sys.stderr)
            return gm(*args)
        out = compiled(*[args[i] for i in activation_positions])
        return tuple(out) if isinstance(out, tuple) else (out,)

    return run


def _compile(gm: Any, example_inputs: Sequence[Any], weight_positions: list[int],
             activation_positions: list[int], database: Any, trials: int, verbose: bool, winograd: bool):
    import torch

    from ansor.api import build, tune
    from ansor.graph.torch_importer import from_torch

    if any(not isinstance(example_inputs[i], torch.Tensor) for i in activation_positions):
        raise TypeError("a graph input is not a tensor (symbolic sizes or Python values)")
    module = _bound_weights_module(gm, example_inputs, weight_positions)
    graph = from_torch(module, tuple(example_inputs[i].detach() for i in activation_positions))
    if trials > 0:
        tune(graph, trials=trials, database=database, progress=verbose, winograd=winograd)
    return build(graph, database=database, verbose=verbose, winograd=winograd)


def _check_against_eager(gm: Any, compiled: Any, example_inputs: Sequence[Any], activation_positions: list[int],
                         verbose: bool) -> None:
    """Compare the compiled graph with the eager one on the example inputs (outside the
    fallback's `except`: a wrong answer is an error, not a reason to run quietly in PyTorch)."""
    import torch

    from ansor.graph.compiled import OutputMismatchError, compare_outputs

    with torch.no_grad():
        want = gm(*example_inputs)
        got = compiled(*[example_inputs[i].detach() for i in activation_positions])
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    got = list(got) if isinstance(got, tuple) else [got]
    as_numpy = [g.numpy() if isinstance(g, torch.Tensor) else g for g in got]
    report = compare_outputs(compiled, as_numpy, [w.detach().cpu().numpy() for w in want])
    if not report.ok:
        raise OutputMismatchError(f"ansor backend: a compiled graph disagrees with PyTorch eager on the example "
                                  f"inputs: {report.first_mismatch}", report)
    if verbose:
        print(f"ansor: a compiled graph matches PyTorch eager on the example inputs "
              f"(max abs error {max((o.max_abs_error for o in report.outputs), default=0.0):.2g})",
              file=sys.stderr)


def _bound_weights_module(gm: Any, example_inputs: Sequence[Any], weight_positions: list[int]):
    """`gm` as a module taking the activations only, the weights held as its buffers (so that
    torch.export sees them as the constants of the model)."""
    import torch

    class BoundWeights(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gm = gm
            for k, i in enumerate(weight_positions):
                self.register_buffer(f"w{k}", example_inputs[i].detach())

        def forward(self, *activations: Any):
            given = iter(activations)
            weights = {i: getattr(self, f"w{k}") for k, i in enumerate(weight_positions)}
            out = self.gm(*[weights[i] if i in weights else next(given) for i in range(len(example_inputs))])
            return tuple(out) if isinstance(out, (tuple, list)) else out

    return BoundWeights()
