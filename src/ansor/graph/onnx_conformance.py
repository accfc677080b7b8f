"""ONNX's own conformance cases run through `from_onnx` and `ansor.build`: pass, refused or wrong.

The `onnx` package ships the cases every runtime is held to: node cases (one operator, inputs
and expected outputs; `onnx.backend.test.case.node.collect_testcases`) and model folders under
`onnx/backend/test/data/` (`model.onnx` beside `test_data_set_*/` of protobuf tensors). Each case
ends in one of three verdicts: it passes (every output matches in shape, dtype and value), it is
refused with a reason (an error naming the operator and what is unsupported), or it is WRONG
(an output that does not match, or a crash that is not a refusal). A wrong answer is the worst
defect a model compiler can have, so the test suite runs these cases and fails on any WRONG.

`python -m ansor.graph.onnx_conformance [--filter SUBSTRING] [--models] [-o table.md]` runs them
all and prints a table per operator.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ansor.graph.verdicts import Verdict, one_line, output_mismatch, summarize

__all__ = ["Case", "Verdict", "model_cases", "node_cases", "run_case", "summarize"]

#: Cases whose expected outputs depend on a random draw or on a mode no runtime reproduces
#: bit for bit: the training-mode Dropout cases (their masks are random).
UNCHECKABLE = re.compile(r"^test_(training_dropout|dropout_.*training)")


@dataclass
class Case:
    """One conformance case: a model and its (inputs, expected outputs) pairs."""

    name: str
    model: Any                              # onnx.ModelProto
    data_sets: list[tuple[list[np.ndarray], list[np.ndarray]]]
    rtol: float = 1e-3
    atol: float = 1e-7

    @property
    def operator(self) -> str:
        """The operator the case is about: its model's first node type (``_expanded``
        cases are named by their function)."""
        nodes = self.model.graph.node
        op = nodes[0].op_type if nodes else "?"
        return f"{op} (expanded)" if self.name.endswith(("_expanded", "_expanded_ver18")) else op


def node_cases(name_filter: str | None = None) -> list[Case]:
    """ONNX's generated node cases (every operator, every opset the package knows)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators overflow casts on purpose
        cases = collect_testcases()
    out = []
    for c in cases:
        if name_filter and name_filter not in c.name:
            continue
        sets = [([_array(a) for a in ins], [_array(a) for a in outs]) for ins, outs in (c.data_sets or [])]
        out.append(Case(c.name, c.model, sets, getattr(c, "rtol", 1e-3), getattr(c, "atol", 1e-7)))
    return out


def _array(value: Any) -> Any:
    """A case's tensor as numpy (some generators store TensorProtos for exotic types); a
    sequence or map is kept as it is (the importer refuses such inputs)."""
    from onnx import TensorProto, numpy_helper

    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    try:
        return np.asarray(value)
    except ValueError:
        return value


def model_cases(kinds: Sequence[str] = ("pytorch-converted", "pytorch-operator"),
                name_filter: str | None = None) -> list[Case]:
    """The model folders shipped in the onnx package (`backend/test/data/<kind>/*`)."""
    import onnx
    from onnx import numpy_helper

    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    out = []
    for kind in kinds:
        for folder in sorted(glob.glob(os.path.join(root, kind, "*"))):
            name = os.path.basename(folder)
            if name_filter and name_filter not in name:
                continue
            path = os.path.join(folder, "model.onnx")
            if not os.path.exists(path):
                continue
            model = onnx.load(path)
            sets = []
            for data in sorted(glob.glob(os.path.join(folder, "test_data_set_*"))):
                def read(prefix: str) -> list[np.ndarray]:
                    arrays = []
                    for f in sorted(glob.glob(os.path.join(data, f"{prefix}_*.pb")),
                                    key=lambda p: int(re.findall(r"_(\d+)\.pb$", p)[0])):
                        tensor = onnx.TensorProto()
                        with open(f, "rb") as fh:
                            tensor.ParseFromString(fh.read())
                        arrays.append(numpy_helper.to_array(tensor))
                    return arrays
                sets.append((read("input"), read("output")))
            out.append(Case(f"{kind}/{name}", model, sets))
    return out


def _refusal_types() -> tuple[type, ...]:
    from ansor.graph.ir import GraphError
    from ansor.graph.ops import ShapeError
    from ansor.graph.torch_importer import UnsupportedOperatorError

    return (UnsupportedOperatorError, GraphError, ShapeError)


def run_case(case: Case, build: Callable[[Any], Callable[..., Any]] | None = None) -> Verdict:
    """The verdict of one case. `build(graph)` makes the callable that runs it (default:
    `build_model` with untuned default schedules, no records); a refusal is an error of the
    importer's refusal types raised while importing or building. An input the importer needs
    at import (a Reshape's shape given as a graph input) is given there, as a user would
    (`from_onnx(model, inputs=...)`), and the graph runs on the other inputs."""
    op = case.operator
    if UNCHECKABLE.match(case.name):
        return Verdict(case.name, op, "skipped", "random training-mode output")
    if not case.data_sets:
        return Verdict(case.name, op, "skipped", "no data set")
    for inputs, expected in case.data_sets:
        verdict = _run_data_set(case, inputs, expected, build or _default_build)
        if verdict.status != "pass":
            return verdict
    return Verdict(case.name, op, "pass")


def _run_data_set(case: Case, inputs: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                  build: Callable[[Any], Callable[..., Any]]) -> Verdict:
    from ansor.graph.onnx_importer import StaticInputRequired, from_onnx

    op = case.operator
    refusals = _refusal_types()
    names = [vi.name for vi in case.model.graph.input
             if vi.name not in {t.name for t in case.model.graph.initializer}]
    given = dict(zip(names, inputs))
    bound: dict[str, np.ndarray] = {}
    try:
        while True:
            try:
                graph = from_onnx(case.model, inputs=bound)
                break
            except StaticInputRequired as exc:
                if exc.input_name in bound or exc.input_name not in given:
                    raise
                bound[exc.input_name] = given[exc.input_name]
        run = build(graph)
    except refusals as exc:
        return Verdict(case.name, op, "refused", one_line(exc))
    except Exception as exc:  # anything else is a crash: counted against us, never a pass
        return Verdict(case.name, op, "wrong", f"crash while importing/building: {type(exc).__name__}: {one_line(exc)}")
    try:
        got = run(*[value for name, value in given.items()
                    if name not in bound and not (isinstance(value, np.ndarray) and value.size == 0)])
    except refusals as exc:
        return Verdict(case.name, op, "refused", one_line(exc))
    except Exception as exc:
        return Verdict(case.name, op, "wrong", f"crash while running: {type(exc).__name__}: {one_line(exc)}")
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    # float32 kernels sum in another order than the reference: a few ulps more than the
    # case's own tolerance, never more than 1e-4 relative
    problem = output_mismatch(got, expected, max(case.rtol, 1e-4), max(case.atol, 1e-5))
    if problem:
        return Verdict(case.name, op, "wrong", problem)
    return Verdict(case.name, op, "pass")


def _default_build(graph: Any) -> Callable[..., Any]:
    from ansor.graph.compiled import build_model

    return build_model(graph, None, verbose=False)  # no store: every task's default schedule


def float32_only(case: Case) -> bool:
    """Whether the case computes in float32: every tensor is an array, every floating one is
    float32 (integer indices and shapes beside them are allowed), and there is one."""
    arrays = [a for ins, outs in case.data_sets for a in (*ins, *outs)]
    if not arrays or not all(isinstance(a, np.ndarray) for a in arrays):
        return False
    floats = [a for a in arrays if a.dtype.kind == "f"]
    return bool(floats) and all(a.dtype == np.float32 for a in floats)


def markdown_table(verdicts: Sequence[Verdict]) -> str:
    rows = ["| operator | pass | refused | wrong | skipped | first reason |", "|---|---|---|---|---|---|"]
    reasons: dict[str, str] = {}
    for v in verdicts:
        if v.status in ("wrong", "refused") and v.operator not in reasons:
            reasons[v.operator] = v.reason.replace("|", "/")[:120]
    for op, c in sorted(summarize(verdicts).items()):
        rows.append(f"| {op} | {c['pass']} | {c['refused']} | {c['wrong']} | {c['skipped']} | {reasons.get(op, '')} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--filter", help="only cases whose name contains this")
    parser.add_argument("--models", action="store_true", help="the shipped model folders instead of the node cases")
    parser.add_argument("--float32", action="store_true", help="only cases whose tensors are all float32")
    parser.add_argument("-o", "--output", help="write the per-operator table (markdown) here")
    parser.add_argument("--show", choices=("wrong", "refused", "all"), default="wrong",
                        help="which verdicts to list one per line")
    args = parser.parse_args(argv)
    cases = model_cases(name_filter=args.filter) if args.models else node_cases(args.filter)
    if args.float32:
        cases = [c for c in cases if float32_only(c)]
    verdicts = []
    start = time.time()
    for i, case in enumerate(cases):
        v = run_case(case)
        verdicts.append(v)
        if args.show == "all" or v.status == args.show:
            print(f"{v.status:8s} {v.case}: {v.reason}", flush=True)
        if sys.stderr.isatty():
            print(f"\r{i + 1}/{len(cases)}", end="", file=sys.stderr, flush=True)
    counts = Counter(v.status for v in verdicts)
    checked = len(verdicts) - counts["skipped"]
    print(f"\n{len(verdicts)} cases in {time.time() - start:.0f} s: {counts['pass']} pass "
          f"({counts['pass'] / max(1, checked):.1%} of {checked} checked), {counts['refused']} refused, "
          f"{counts['wrong']} WRONG, {counts['skipped']} skipped")
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(markdown_table(verdicts) + "\n")
    return 1 if counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
