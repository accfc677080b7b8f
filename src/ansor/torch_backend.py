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

Dynamic sizes (`torch.compile(model, backend="ansor", dynamic=True)`): a graph whose shapes hold
symbols is built as a `graph.bucketed.BucketedModel` (see `graph.dynamic`): every symbol is a
dimension with buckets up to `max_size` (option; else the symbol's own finite bound), all
compiled at once, so a call of a new size within the maximum compiles nothing; `buckets`
(option) gives the bucket sizes. A size past the maximum raises ValueError.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

_WEIGHT_MARKERS = ("_parameters_", "_buffers_")


def ansor_backend(gm: Any, example_inputs: Sequence[Any], options: dict | None = None) -> Callable:
    """The TorchDynamo backend: a callable standing for `gm` (see the module docstring)."""
    import torch

    opts = dict(options or {})
    max_size = opts.pop("max_size", None)
    buckets = opts.pop("buckets", None)
    database = opts.pop("database", None)
    trials = int(opts.pop("trials", 0))
    verbose = bool(opts.pop("verbose", True))
    winograd = bool(opts.pop("winograd", True))
    check = bool(opts.pop("check", False))
    if opts:
        raise TypeError(f"ansor backend: unknown options {', '.join(sorted(opts))} "
                        f"(known: buckets, check, database, max_size, trials, verbose, winograd)")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    weight_positions = [i for i, (node, x) in enumerate(zip(placeholders, example_inputs))
                        if isinstance(x, torch.nn.Parameter) or any(m in node.name for m in _WEIGHT_MARKERS)]
    activation_positions = [i for i in range(len(example_inputs)) if i not in set(weight_positions)]
    try:
        symbolic = _symbolic_dims(placeholders)
        if symbolic:  # torch.compile(dynamic=True): the SymInt arguments are sizes, not inputs
            scalars = _scalar_positions(placeholders, example_inputs)
            activation_positions = [i for i in activation_positions
                                    if isinstance(example_inputs[i], torch.Tensor) and i not in scalars]
            compiled = _compile_dynamic(_with_scalars_fixed(gm, placeholders, scalars), example_inputs, placeholders, symbolic, weight_positions,
                                        activation_positions, max_size, buckets, database, trials, verbose, winograd)
            check = False  # the eager check runs on one size; BucketedModel's buckets are checked by their tests
        else:
            compiled = _compile(gm, example_inputs, weight_positions, activation_positions, database, trials,
                                verbose, winograd)
    except Exception as err:  # anything the importer or builder cannot take runs in PyTorch
        if verbose:
            print(f"ansor: a graph of {len(gm.graph.nodes)} nodes runs in PyTorch: {err}", file=sys.stderr)
        return gm.forward
    if check:
        _check_against_eager(gm, compiled, example_inputs, activation_positions, verbose)
    weights = [example_inputs[i] for i in weight_positions]
    versions = [w._version for w in weights]
    fixed = scalars if symbolic else {}
    told = set()

    def run(*args: Any):
        reason = None
        if any(args[i] is not w or w._version != v for i, w, v in zip(weight_positions, weights, versions)):
            reason = "its weights changed since compilation"
        elif any(args[i].item() != value for i, value in fixed.items()):
            reason = "a scalar it was compiled with changed"
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


def _symbolic_dims(placeholders: Sequence[Any]) -> dict[str, tuple[int, Any]]:
    """The symbols in the placeholders' example shapes (torch.compile(dynamic=True)): each
    symbol's name -> (its upper bound, its SymInt), for symbols that are a plain dimension."""
    import torch

    found: dict[str, tuple[int, Any]] = {}
    for node in placeholders:
        value = node.meta.get("example_value")
        dims = list(value.shape) if isinstance(value, torch.Tensor) else [value] if isinstance(value, torch.SymInt) else []
        for d in dims:
            if isinstance(d, torch.SymInt):
                expr = d.node.expr
                if expr.is_number:
                    continue
                if not expr.is_Symbol:
                    raise TypeError(f"a graph size is the expression {expr}, not one symbolic dimension")
                bound = d.node.shape_env.var_to_range.get(expr)
                upper = bound.upper if bound is not None else None
                finite = upper is not None and bool(getattr(upper, "is_finite", False)) and upper < (1 << 31)
                found[str(expr)] = (int(upper) if finite else 0, d)
    return found


def _scalar_positions(placeholders: Sequence[Any], example_inputs: Sequence[Any]) -> dict[int, float]:
    """Python numbers that Dynamo passes as 0-d tensors under dynamic=True (a module's eps or
    dropout rate, read back with .item()): position -> value, fixed at compilation."""
    import torch

    found = {}
    for i, (node, x) in enumerate(zip(placeholders, example_inputs)):
        users = list(node.users)
        if (isinstance(x, torch.Tensor) and x.ndim == 0 and users
                and all(u.op == "call_method" and u.target == "item" for u in users)):
            found[i] = x.item()
    return found


def _with_scalars_fixed(gm: Any, placeholders: Sequence[Any], scalars: dict[int, float]) -> Any:
    """`gm` run node by node with each `.item()` of a scalar input answered by its value, so
    that a static export sees a number instead of a data-dependent symbol."""
    import torch

    if not scalars:
        return gm
    values = {item: value for i, value in scalars.items() for item in placeholders[i].users}

    class FixedScalars(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            return values[n] if n in values else super().run_node(n)

    def run(*args: Any) -> Any:
        return FixedScalars(gm).run(*args)

    return run


def _compile_dynamic(gm: Any, example_inputs: Sequence[Any], placeholders: Sequence[Any], symbolic: dict,
                     weight_positions: list[int], activation_positions: list[int], max_size: Any, buckets: Any,
                     database: Any, trials: int, verbose: bool, winograd: bool):
    """A graph over symbolic sizes as a `BucketedModel`: each bucket is the FX graph run at
    that size (its SymInt arguments given the bucket's value) and imported statically. The
    maximum is `max_size` (options), else the symbol's own finite bound."""
    import torch

    from ansor.api import build, tune
    from ansor.graph.decode import refuse_growing_cache
    from ansor.graph.dynamic import DynamicDim, DynamicGraph
    from ansor.graph.padding import PaddingError
    from ansor.graph.torch_importer import from_torch

    dims = {}
    for name, (upper, _) in symbolic.items():
        declared = int(max_size) if max_size is not None else upper
        if declared <= 0:
            raise TypeError(f"symbolic size {name} has no maximum: give options={{'max_size': N}}")
        dims[name] = DynamicDim(name, declared, 1, tuple(buckets or ()))
    axes: dict[int, dict[int, str]] = {}
    for k, i in enumerate(activation_positions):
        value = placeholders[i].meta.get("example_value")
        for axis, d in enumerate(value.shape):
            if isinstance(d, torch.SymInt) and not d.node.expr.is_number:
                axes.setdefault(k, {})[axis] = str(d.node.expr)
    symbol_of = {i: str(placeholders[i].meta["example_value"].node.expr)
                 for i, x in enumerate(example_inputs) if not isinstance(x, torch.Tensor)}

    def make(sizes: dict[str, int]):
        args = list(example_inputs)
        for i, symbol in symbol_of.items():
            args[i] = sizes[symbol]
        for k, i in enumerate(activation_positions):
            shape = list(args[i].shape)
            for axis, symbol in axes.get(k, {}).items():
                shape[axis] = sizes[symbol]
            args[i] = torch.zeros(shape, dtype=args[i].dtype)
        module = _bound_weights_module(gm, args, [i for i in range(len(args)) if i not in activation_positions])
        return from_torch(module, tuple(args[i].detach() for i in activation_positions))

    graph = DynamicGraph(dims, axes, make)
    built: list[Any] = []

    def run(*activations: Any):
        # Built at the first call, outside Dynamo's compilation: an export inside it carries
        # the frame's symbolic guards into the static graph of each bucket.
        if not built:
            if trials > 0:
                tune(graph, trials=trials, database=database, progress=verbose, winograd=winograd)
            try:
                built.append(build(graph, database=database, verbose=verbose, winograd=winograd))
            except PaddingError as err:  # a decode loop's growing cache: refused by name, with the way that serves it
                raise refuse_growing_cache(err) from None
        return built[0](*activations)

    return run


def _check_against_eager(gm: Any, compiled: Any, example_inputs: Sequence[Any], activation_positions: list[int],
                         verbose: bool) -> None:
    """Compare the compiled graph with the eager one on the example inputs (outside the
    fallback's `except`: a wrong answer is an error, not a reason to run quietly in PyTorch)."""
    import torch

    from ansor.graph.compiled import OutputMismatchError, compare_outputs
    from ansor.torch_arrays import tensor_to_numpy

    with torch.no_grad():
        want = gm(*example_inputs)
        got = compiled(*[example_inputs[i].detach() for i in activation_positions])
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    got = list(got) if isinstance(got, tuple) else [got]
    as_numpy = [tensor_to_numpy(g) if isinstance(g, torch.Tensor) else g for g in got]
    report = compare_outputs(compiled, as_numpy, [tensor_to_numpy(w) for w in want])
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
            self.fixed = {i: example_inputs[i] for i in weight_positions
                          if not isinstance(example_inputs[i], torch.Tensor)}  # sizes of a bucket
            for k, i in enumerate(weight_positions):
                if i not in self.fixed:
                    self.register_buffer(f"w{k}", example_inputs[i].detach())

        def forward(self, *activations: Any):
            given = iter(activations)
            weights = {i: self.fixed[i] if i in self.fixed else getattr(self, f"w{k}")
                       for k, i in enumerate(weight_positions)}
            out = self.gm(*[weights[i] if i in weights else next(given) for i in range(len(example_inputs))])
            return tuple(out) if isinstance(out, (tuple, list)) else out

    return BoundWeights()
