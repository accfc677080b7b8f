"""PyTorch's own operator samples run through `from_torch` and `build_model`: pass, refused or wrong.

PyTorch describes every operator it tests in `torch.testing._internal.common_methods_invocations
.op_db`: an OpInfo per operator (and variant) whose `sample_inputs(device, dtype)` yields the
argument sets its own test suite runs. This module takes the OpInfos of the *core ATen operator
set* and runs each float32 CPU sample as a tiny module: its tensor arguments are the module's
inputs, every other argument a constant of the program. Each sample ends in one verdict, as in
`onnx_conformance`: it passes (every output matches PyTorch eager in shape, dtype and value), it
is refused with a reason (`UnsupportedOperatorError`, `GraphError` or `ShapeError` naming the
operator and what is unsupported), or it is WRONG (an output that does not match, or any other
exception). A wrong answer is the worst defect a model compiler can have, so the test suite runs
a subset of these samples and fails on any WRONG.

Which operators are "core". The core ATen operator set is PyTorch's Core ATen IR: the overload
packets of `torch.ops.aten` with at least one overload tagged `torch.Tag.core` (the tag
`native_functions.yaml` gives them; it is what the documented IR list is generated from). An
OpInfo stands for a core operator when its `aten_name`, or the last dotted part of its name
(for `nn.functional.*` and undotted names only: `masked.amax` is not `amax`), is such a packet,
or names one after the prefixes and suffixes ATen adds to the functional entry point
(`_softmax`, `native_layer_norm`, `max_pool2d_with_indices`), or is one of the functional
entry points listed in `ENTRY_POINTS` (`conv2d` is the core `convolution`,
`interpolate(mode="nearest")` the core `upsample_nearest2d`). Operators that take no float32
(the bitwise ones) run their int64 samples, compared exactly.

Samples that measure nothing of the importer are skipped with their reason: random or
uninitialized outputs (`empty`, `randn`), samples with `out=`, outputs that are not tensors,
and programs that `torch.export` itself cannot export (PyTorch's limit, not ours). A pass
whose graph ran (in part) as numpy fallback kernels, having no compiled form yet, is counted
as such in the table.

`python -m ansor.graph.torch_conformance [--filter SUBSTRING] [--limit-samples N] [-o table.md]`
runs them and prints the counts and a table per operator.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence


from ansor.graph.verdicts import Verdict, one_line, output_mismatch, summarize

__all__ = ["ENTRY_POINTS", "Sample", "Verdict", "core_aten_operators", "core_name", "core_opinfos",
           "markdown_table", "run_sample", "samples", "summarize"]

#: OpInfos that call a core operator through a functional entry point whose name is not the
#: operator's: (OpInfo name, variant) -> the core operator their samples reach.
ENTRY_POINTS: dict[tuple[str, str], str] = {
    ("nn.functional.conv1d", ""): "convolution",
    ("nn.functional.conv2d", ""): "convolution",
    ("nn.functional.conv3d", ""): "convolution",
    ("nn.functional.conv_transpose1d", ""): "convolution",
    ("nn.functional.conv_transpose2d", ""): "convolution",
    ("nn.functional.conv_transpose3d", ""): "convolution",
    ("nn.functional.batch_norm", ""): "_native_batch_norm_legit_no_training",
    ("nn.functional.interpolate", "nearest"): "upsample_nearest2d",
    ("nn.functional.interpolate", "bilinear"): "upsample_bilinear2d",
    ("nn.functional.upsample_nearest", ""): "upsample_nearest2d",
    ("nn.functional.upsample_bilinear", ""): "upsample_bilinear2d",
    ("nn.functional.pad", "reflect"): "reflection_pad2d",
    ("nn.functional.pad", "replicate"): "replication_pad2d",
}

#: Operators whose output is random or uninitialized memory: nothing to compare.
UNCHECKABLE = frozenset({"empty", "empty_strided", "rand", "randn", "randperm", "native_dropout",
                         "normal", "bernoulli"})

#: The float32 tolerance of a sample: kernels sum in another order than PyTorch does.
RTOL, ATOL = 1e-4, 1e-5


@dataclass
class Sample:
    """One OpInfo sample: the operator it belongs to and the call it makes."""

    operator: str          # the OpInfo name, with its variant after a dot
    core: str              # the core ATen operator it stands for
    index: int             # its position among the OpInfo's float32 samples
    fn: Callable[..., Any]
    input: Any
    args: tuple
    kwargs: dict

    @property
    def name(self) -> str:
        return f"{self.operator}[{self.index}]"


def core_aten_operators() -> frozenset[str]:
    """The overload packets of `torch.ops.aten` with an overload tagged `torch.Tag.core`."""
    import torch

    names = set()
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not hasattr(packet, "overloads"):
            continue
        if any(torch.Tag.core in getattr(packet, ov).tags for ov in packet.overloads()):
            names.add(name)
    return frozenset(names)


def core_name(opinfo: Any, core: frozenset[str]) -> str | None:
    """The core ATen operator an OpInfo stands for, or None (see the module docstring)."""
    entry = ENTRY_POINTS.get((opinfo.name, opinfo.variant_test_name))
    if entry is not None:
        return entry
    bases = [opinfo.aten_name]
    if "." not in opinfo.name or opinfo.name.startswith("nn.functional."):
        bases.append(opinfo.name.rsplit(".", 1)[-1])  # not masked.*, sparse.*, linalg.*
    for base in bases:
        for candidate in (base, f"_{base}", f"native_{base}", f"{base}_with_indices"):
            if candidate in core:
                return candidate
    return None


def core_opinfos(name_filter: str | None = None) -> list[tuple[Any, str]]:
    """(OpInfo, core operator) for every OpInfo of op_db that stands for a core operator."""
    from torch.testing._internal.common_methods_invocations import op_db

    core = core_aten_operators()
    out = []
    for opinfo in op_db:
        name = core_name(opinfo, core)
        if name is None or (name_filter and name_filter not in _label(opinfo)):
            continue
        out.append((opinfo, name))
    return out


def _label(opinfo: Any) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def samples(name_filter: str | None = None, limit: int | None = None) -> Iterator[Sample]:
    """The float32 CPU samples of the core OpInfos (at most `limit` per OpInfo), in op_db order;
    int64 samples for an operator that takes no float32 (the bitwise ones)."""
    import torch

    for opinfo, core in core_opinfos(name_filter):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # integer-only operators (bitwise_and) are checked on their int64 samples
            dtype = torch.float32 if torch.float32 in opinfo.supported_dtypes("cpu") else torch.int64
            try:
                generated = list(opinfo.sample_inputs("cpu", dtype))
            except Exception:  # an OpInfo without float32 samples on the CPU
                continue
        for i, s in enumerate(generated[:limit] if limit else generated):
            yield Sample(_label(opinfo), core, i, opinfo.op, s.input, tuple(s.args), dict(s.kwargs))


def _refusal_types() -> tuple[type, ...]:
    from ansor.graph.ir import GraphError
    from ansor.graph.ops import ShapeError
    from ansor.graph.torch_importer import UnsupportedOperatorError

    return (UnsupportedOperatorError, GraphError, ShapeError)


def _module(sample: Sample) -> tuple[Any, list[Any]]:
    """A module calling the sample's function, taking the sample's tensors as its inputs (the
    other arguments are constants of its program), and those tensors."""
    import torch
    from torch.utils import _pytree as pytree

    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    fn = sample.fn

    class Call(torch.nn.Module):
        def forward(self, *tensors):
            filled = list(leaves)
            for p, t in zip(positions, tensors):
                filled[p] = t
            x, args, kwargs = pytree.tree_unflatten(filled, spec)
            return fn(x, *args, **kwargs)

    return Call(), [leaves[p] for p in positions]


def _flat_tensors(out: Any) -> list[Any] | None:
    """The outputs as a flat list of tensors, or None when one of them is not a tensor."""
    import torch
    from torch.utils import _pytree as pytree

    leaves = pytree.tree_leaves(out)
    if not leaves or not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return None
    return leaves


def run_sample(sample: Sample, build: Callable[[Any], Callable[..., Any]] | None = None) -> Verdict:
    """The verdict of one sample. `build(graph)` makes the callable that runs it (default:
    `build_model` with untuned default schedules, no records)."""
    import torch

    def verdict(status: str, reason: str = "", fallback: bool = False) -> Verdict:
        return Verdict(sample.name, sample.operator, status, reason, fallback)

    if sample.core in UNCHECKABLE:
        return verdict("skipped", "random or uninitialized output")
    if "out" in sample.kwargs:
        return verdict("skipped", "out= argument")
    module, tensors = _module(sample)
    tensors = [t.contiguous() for t in tensors]  # the graph's inputs are values, not strides
    if any(t.requires_grad for t in tensors):
        return verdict("skipped", "requires_grad sample")
    if any(t.dtype.is_complex or t.is_sparse or t.is_quantized for t in tensors):
        return verdict("skipped", "complex, sparse or quantized input")
    try:
        with torch.no_grad():
            eager = module(*[t.clone() for t in tensors])
    except Exception as exc:
        return verdict("skipped", f"eager call fails: {type(exc).__name__}")
    expected = _flat_tensors(eager)
    if expected is None:
        return verdict("skipped", "output is not a tensor (or a tuple of tensors)")
    from ansor.graph.torch_importer import from_torch

    refusals = _refusal_types()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = from_torch(module, [t.clone() for t in tensors])
            run = (build or _default_build)(graph)
    except refusals as exc:
        return verdict("refused", one_line(exc))
    except Exception as exc:  # anything else is a crash: counted against us, never a pass
        unexportable = _export_failure(module, tensors)
        if unexportable:
            return verdict("skipped", f"torch.export cannot export it: {unexportable}")
        return verdict("wrong", f"crash while importing/building: {type(exc).__name__}: {one_line(exc)}")
    try:
        got = run(*[t.detach().contiguous().numpy() for t in tensors])
    except refusals as exc:
        return verdict("refused", one_line(exc))
    except Exception as exc:
        return verdict("wrong", f"crash while running: {type(exc).__name__}: {one_line(exc)}")
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    problem = output_mismatch(got, [e.detach().contiguous().numpy() for e in expected], RTOL, ATOL)
    if problem:
        return verdict("wrong", problem)
    steps = getattr(run, "steps", ())
    return verdict("pass", fallback=any(getattr(s, "kind", "") == "fallback" for s in steps))


def _export_failure(module: Any, tensors: Sequence[Any]) -> str:
    """Why `torch.export` cannot export the sample's module ("" when it can)."""
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.export.export(module, tuple(t.clone() for t in tensors))
    except Exception as exc:
        return f"{type(exc).__name__}: {one_line(exc)[:120]}"
    return ""


def _default_build(graph: Any) -> Callable[..., Any]:
    from ansor.graph.compiled import build_model

    return build_model(graph, None, verbose=False)  # no store: every task's default schedule


_LOCATION = re.compile(r""" at node '[^']*', in module '[^']*'(, File "[^"]*", line \d+, in \w+: [^:]*)?""")


def short_reason(reason: str) -> str:
    """A verdict's reason without the location of the node in the sample's module (the
    same in every sample: the line that calls the operator)."""
    return _LOCATION.sub("", reason)


def markdown_table(verdicts: Sequence[Verdict]) -> str:
    """The per-operator table: counts, and the first reason of a refusal (or a wrong answer)."""
    rows = ["| operator | pass | of which numpy | refused | wrong | skipped | first reason |",
            "|---|---|---|---|---|---|---|"]
    reasons: dict[str, str] = {}
    for v in verdicts:
        if v.status == "wrong" or (v.status == "refused" and v.operator not in reasons):
            reasons[v.operator] = short_reason(v.reason).replace("|", "/")[:160]
    for op, c in sorted(summarize(verdicts).items()):
        rows.append(f"| {op} | {c['pass']} | {c['fallback']} | {c['refused']} | {c['wrong']} | "
                    f"{c['skipped']} | {reasons.get(op, '')} |")
    return "\n".join(rows)


def counts_line(verdicts: Sequence[Verdict]) -> str:
    """One line: how many samples passed (and the share of the checked ones), were refused,
    WRONG or skipped."""
    counts = Counter(v.status for v in verdicts)
    checked = len(verdicts) - counts["skipped"]
    fallback = sum(1 for v in verdicts if v.status == "pass" and v.fallback)
    return (f"{len(verdicts)} samples: {counts['pass']} pass ({counts['pass'] / max(1, checked):.1%} "
            f"of {checked} checked; {fallback} of them with numpy kernels), {counts['refused']} "
            f"refused, {counts['wrong']} WRONG, {counts['skipped']} skipped")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--filter", help="only OpInfos whose name (name.variant) contains this")
    parser.add_argument("--limit-samples", type=int, default=None, metavar="N",
                        help="at most N samples per OpInfo")
    parser.add_argument("-o", "--output", help="write the per-operator table (markdown) here")
    parser.add_argument("--show", choices=("wrong", "refused", "all"), default="wrong",
                        help="which verdicts to list one per line")
    args = parser.parse_args(argv)
    verdicts = []
    start = time.time()
    for sample in samples(args.filter, args.limit_samples):
        v = run_sample(sample)
        verdicts.append(v)
        if args.show == "all" or v.status == args.show or v.status == "wrong":
            print(f"{v.status:8s} {v.case}: {v.reason}", flush=True)
    print(f"\n{counts_line(verdicts)} ({time.time() - start:.0f} s)")
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(markdown_table(verdicts) + "\n")
    return 1 if any(v.status == "wrong" for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
