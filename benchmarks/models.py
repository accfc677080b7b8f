"""Whole models at batch 1: ansor beside PyTorch eager, torch.compile and onnxruntime.

    python benchmarks/models.py --models resnet18 --trials-per-task 150 --database models.db
    python benchmarks/models.py --models resnet18,mobilenet_v2,bert_layer --database models.db

Each model (random weights from a `transformers` config) is imported with `from_torch`, tuned
with the task scheduler when `--trials-per-task` > 0 (a rerun on the same database resumes),
built with the database's records, checked against PyTorch eager (max error relative to the
output's RMS), and timed in turns with the other runtimes in the same process (several rounds,
medians and spreads; each turn after a pause of half a second, so no runtime pays for the
thread pool of the one before). onnxruntime gets a session with as many intra-op threads as cores.
`--profile` prints each subgraph's time, the table to read when a model misses its bar.
`--curve FILE.json` appends the tuning curve (estimated model latency after each round).

`--minutes 0,1,5,10,20` draws the time-to-quality curve instead: the model built at once from a
fresh database (the quick build), then tuned from another fresh database with `tune_model`'s
time budget in steps, built and timed in turns against onnxruntime and PyTorch eager after 1, 5,
10 and 20 minutes of tuning in all; each point also gives the tuner's estimate of the model's
latency (the weighted sum of its kernels' best times) beside the measured one.

Low-precision rows (the title names the machine and the dot-product instructions it has):

    python benchmarks/models.py --models resnet18,bert_layer --dtype bfloat16 --trials-per-task 150
    python benchmarks/models.py --models resnet18 --int8 [--activations int8] --trials-per-task 150

`--dtype bfloat16` runs each model converted with `.to(torch.bfloat16)` through ansor (tuned and
built as above) beside PyTorch eager in bf16, and both in float32 (ansor's float32 build from
the same database); ansor's bf16 output is checked first to be within bf16 roundings
(`compare.BF16_MODEL_TOLERANCE` of the RMS) of PyTorch's bf16 output. `--int8` exports each model
to ONNX and quantizes it with `onnxruntime.quantization.quantize_static` (QDQ, per-channel int8
weights, calibrated on random inputs), then builds that file with ansor beside onnxruntime's
session on the same file and ansor's float32 build; on `--check-inputs` random inputs every
output must be within one quantization step of onnxruntime's (the elements one step away,
rounding ties, are counted) and the top-1 classes are compared. A model the importer cannot
run quantized is refused by name and the run goes on. The ratios are paired per round.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings

import numpy as np

from ansor.pretrain.models import MODEL_NAMES, make_model

warnings.filterwarnings("ignore", category=FutureWarning)


class CurveLogger:
    """After every round: trials so far and the model's estimated latency (sum of weight x best
    latency over tasks; infinite until every task has a program). A `RoundCallback` calls it."""

    def __init__(self, weights_by_task: dict[int, float]):
        self.weights = weights_by_task
        self.best: dict[int, float] = {}
        self.trials: dict[int, int] = {}
        self.points: list[tuple[int, float]] = []

    def __call__(self, result) -> None:
        key = id(result.task)
        self.best[key] = result.best_cost
        self.trials[key] = result.trials
        total = sum(w * self.best.get(k, math.inf) for k, w in self.weights.items())
        self.points.append((sum(self.trials.values()), total))


def export_onnx(module, inputs) -> str:
    import torch

    path = os.path.join(tempfile.mkdtemp(prefix="ansor-models-"), "model.onnx")
    with open(os.devnull, "w") as devnull:
        stdout, sys.stdout = sys.stdout, devnull
        try:
            torch.onnx.export(module, inputs, path, dynamo=True)
        finally:
            sys.stdout = stdout
    return path


def onnxruntime_profile(path: str, inputs, runs: int = 20) -> list[tuple[str, tuple[int, int], float]]:
    """(ONNX op type, (output elements, weight elements), median seconds) of every node
    onnxruntime ran, in its execution order."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(os.path.dirname(path), "ort-profile")
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    for _ in range(runs):
        session.run(None, feed)
    with open(session.end_profiling()) as f:
        events = json.load(f)
    durations: dict[str, list[float]] = {}
    about: dict[str, tuple[str, tuple[int, int]]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            durations.setdefault(name, []).append(e["dur"] * 1e-6)
            about[name] = (e["args"].get("op_name", "?"), _signature(e["args"]))
    return [(*about[n], statistics.median(d)) for n, d in durations.items()]


def _signature(args: dict) -> tuple[int, int]:
    """(output elements, elements of the second input: the weights of a Conv or Gemm)."""
    def numel(entry) -> int:
        shape = next(iter(entry.values())) if isinstance(entry, dict) and entry else []
        return math.prod(shape)

    outs, ins = args.get("output_type_shape") or [{}], args.get("input_type_shape") or []
    return numel(outs[0]), numel(ins[1]) if len(ins) > 1 else 0


def step_signature(step) -> tuple[int, int]:
    """Our step's (output elements, elements of its largest constant), to pair with onnxruntime's."""
    graph = step.piece.subgraph.graph
    out = math.prod(graph.types[step.piece.subgraph.outputs[0]].shape)
    return out, max((c.size for c in step.constants), default=0)


def per_layer_table(steps, signatures, ort_nodes) -> None:
    """Convolution and matmul-like subgraphs beside the onnxruntime node of the same output and
    weight sizes (the first unpaired one in execution order); then the rest in totals."""
    heavy = {"Conv", "FusedConv", "Gemm", "MatMul", "FusedMatMul"}
    theirs = [(op, sig, t) for op, sig, t in ort_nodes if op in heavy]
    used: set[int] = set()
    paired_ours = paired_theirs = 0.0
    print("  per layer, ansor vs onnxruntime (paired by output and weight sizes; ratio above 1: ansor slower):")
    for (label, kind, t), sig in zip(steps, signatures):
        match = next((i for i, (_, s, _) in enumerate(theirs) if i not in used and s == sig and sig[1] > 0), None)
        if match is None:
            continue
        used.add(match)
        op, _, u = theirs[match]
        paired_ours += t
        paired_theirs += u
        print(f"    {t * 1e3:8.3f} ms  {u * 1e3:8.3f} ms  {t / u:5.2f}  {label} | {op}")
    print(f"    paired: ansor {paired_ours * 1e3:.3f} ms, onnxruntime {paired_theirs * 1e3:.3f} ms")
    rest_ours = sum(t for _, _, t in steps) - paired_ours
    rest_theirs = sum(t for _, _, t in ort_nodes) - paired_theirs
    print(f"    the rest: ansor {rest_ours * 1e3:.3f} ms, onnxruntime {rest_theirs * 1e3:.3f} ms")


def onnxruntime_session(module, inputs):
    try:
        import onnxruntime
    except ImportError:
        return None
    path = export_onnx(module, inputs)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    return lambda: session.run(None, feed)


def tune_and_build(label: str, graph, args, log_curve: bool = False):
    """The graph's tasks tuned with `--trials-per-task` trials each into `--database` (a rerun
    resumes), then built with its records (the quick build for tasks without any): (tasks, the
    compiled model, build seconds, the tuning curve or None)."""
    import ansor
    from ansor.graph.model_tasks import extract_tasks
    from ansor.graph.model_tuning import tune_model
    from ansor.report import TuneProgress
    from ansor.store import open_store
    from ansor.tuning.callbacks import RoundCallback
    from ansor.tuning.quick import model_quick_seconds

    tasks = extract_tasks(graph, winograd=not args.no_winograd)
    print(f"== {label}: {len(tasks.pieces)} subgraphs, {len(tasks.tasks)} distinct tasks, "
          f"{len(tasks.fallbacks)} on numpy fallback", flush=True)
    curve = None
    if args.trials_per_task > 0:
        curve = CurveLogger({id(t): w for t, w in zip(tasks.tasks, tasks.weights)}) if log_curve else None
        trials = args.trials_per_task * len(tasks.tasks)
        start = time.time()
        callbacks = ([RoundCallback(curve)] if curve is not None else []) + ([] if args.quiet else [TuneProgress()])
        per_round = {} if args.per_round is None else {"measures_per_round": args.per_round}
        with open_store(args.database)[0] as store:
            tune_model(tasks, store, trials, scheduler=args.scheduler, seed=args.seed,
                       time_budget=args.time_budget, callbacks=callbacks, **per_round)
        print(f"tuned {label} in {time.time() - start:.0f} s", flush=True)
    start = time.time()
    compiled = ansor.build(graph, database=args.database, winograd=not args.no_winograd,
                           quick_seconds=args.quick_seconds)
    build_seconds = time.time() - start
    print(compiled.summary(), flush=True)
    limit = args.quick_seconds if args.quick_seconds is not None else model_quick_seconds()
    print(f"built {label} in {build_seconds:.0f} s (tasks without records chose programs for up to {limit:g} s)",
          flush=True)
    return tasks, compiled, build_seconds, curve


def print_turns(turns: dict, base: str) -> dict:
    """Each side's median, spread, ratio and paired ratio to `base` (above 1: `base` faster);
    the figures of a JSON row."""
    from ansor.baselines import paired_ratio

    for impl, t in turns.items():
        print(f"  {impl:22s} {t.median * 1e3:9.2f} ms  spread {t.spread:4.0%}  ratio "
              f"{t.median / turns[base].median:5.2f}  paired {paired_ratio(t, turns[base]):5.2f}")
    return {"timings_ms": {k: t.median * 1e3 for k, t in turns.items()},
            "paired_ratios": {k: paired_ratio(t, turns[base]) for k, t in turns.items()},
            "spreads": {k: t.spread for k, t in turns.items()}}


def bench(name: str, args) -> dict:
    import torch

    import ansor
    from ansor.baselines import time_in_turns

    module, inputs = make_model(name)
    module = module.eval()
    graph = ansor.graph.from_torch(module, inputs)
    tasks, compiled, build_seconds, curve = tune_and_build(name, graph, args, log_curve=True)
    x = [t.numpy() for t in inputs]
    with torch.no_grad():
        want = module(*inputs).numpy()
    got = compiled(*x)
    err = float(np.max(np.abs(got - want)) / (np.sqrt(np.mean(want.astype(np.float64) ** 2)) or 1.0))
    fns = {"ansor": lambda: compiled(*x)}

    def eager():
        with torch.no_grad():
            module(*inputs)

    fns["PyTorch eager"] = eager
    if not args.no_inductor:
        compiled_torch = torch.compile(module)
        with torch.no_grad():
            compiled_torch(*inputs)

        def inductor():
            with torch.no_grad():
                compiled_torch(*inputs)

        fns["torch.compile"] = inductor
    ort = onnxruntime_session(module, inputs)
    if ort is not None:
        fns["onnxruntime"] = ort
    turns = time_in_turns(fns, args.rounds, min_repeat_s=0.3, pause_s=0.5)
    print(f"{name}: ansor max error {err:.1e} of the output RMS; timed in turns, {args.rounds} rounds "
          f"(ratio = other / ansor, above 1: ansor faster; paired: the median of each round's ratio)")
    figures = print_turns(turns, "ansor")
    steps = compiled.profile(*x)
    kernels_ms = sum(seconds for _, _, seconds in steps) * 1e3
    print(f"  the steps called one by one from Python (medians): {kernels_ms:.2f} ms; a whole call (one "
          f"foreign call for all kernels, copies in and out) differs by {turns['ansor'].median * 1e3 - kernels_ms:+.3f} ms")
    if args.profile:
        print("  per subgraph (median of 20 calls):")
        for label, kind, seconds in steps:
            print(f"    {seconds * 1e3:8.3f} ms  {kind:8s} {label}")
        if ort is not None:
            per_layer_table(steps, [step_signature(s) for s in compiled.steps],
                            onnxruntime_profile(export_onnx(module, inputs), inputs))
    row = {"model": name, "error": err, **figures, "tasks": len(tasks.tasks), "steps_ms": kernels_ms,
           "tuned": sum(1 for k in compiled.kernels.values() if k.record is not None),
           "build_seconds": build_seconds, "quick_seconds": args.quick_seconds}
    if curve is not None:
        row["curve"] = curve.points
        row["scheduler"] = args.scheduler
        row["trials_per_task"] = args.trials_per_task
        row["per_round"] = args.per_round
    return row


def low_precision_title(name: str, kind: str) -> str:
    """The heading of a low-precision row: the machine and the dot-product instructions ansor's
    kernels may use on it (none: the widening loops)."""
    import ansor
    from common import machine_name

    target = ansor.Target.host()
    return (f"== {name} {kind} on {machine_name()}; target {target.key}, dot products "
            f"{', '.join(target.dot_products) or 'none'}")


def bench_bf16(name: str, args) -> dict:
    """The model in bfloat16 (`.to(torch.bfloat16)`): ansor's bf16 build checked against PyTorch
    eager in bf16 (within bf16 roundings of its RMS) and ansor's float32 build against PyTorch in
    float32, then the four timed in turns."""
    import copy

    import torch

    import ansor
    from ansor.baselines import time_in_turns
    from ansor.compare import BF16_MODEL_TOLERANCE, bf16_model_check, model_check
    from ansor.torch_arrays import tensor_to_numpy

    print(low_precision_title(name, "bfloat16"), flush=True)
    module, inputs = make_model(name)
    module = module.eval()
    module16 = copy.deepcopy(module).to(torch.bfloat16)  # .to() converts in place: a copy
    inputs16 = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    _, bf16, build16, _ = tune_and_build(f"{name} bf16", ansor.graph.from_torch(module16, inputs16), args)
    _, f32, build32, _ = tune_and_build(f"{name} float32", ansor.graph.from_torch(module, inputs), args)
    x16, x32 = [tensor_to_numpy(t) for t in inputs16], [t.numpy() for t in inputs]
    with torch.no_grad():
        want16, want32 = tensor_to_numpy(module16(*inputs16)), module(*inputs).numpy()
    for label, problem in (("bf16 against PyTorch eager bf16", bf16_model_check([bf16(*x16)], [want16])),
                           ("float32 against PyTorch eager float32", model_check([f32(*x32)], [want32]))):
        if problem:
            raise AssertionError(f"{name}: ansor {label}: {problem}")
    wide = want16.astype(np.float64)
    err = float(np.max(np.abs(np.asarray(bf16(*x16), np.float64) - wide)) / (np.sqrt(np.mean(wide ** 2)) or 1.0))

    def eager(model, xs):
        def call():
            with torch.no_grad():
                model(*xs)
        return call

    fns = {"ansor bf16": lambda: bf16(*x16), "PyTorch eager bf16": eager(module16, inputs16),
           "ansor float32": lambda: f32(*x32), "PyTorch eager float32": eager(module, inputs)}
    turns = time_in_turns(fns, args.rounds, min_repeat_s=0.3, pause_s=0.5)
    print(f"{name} bf16: ansor within {err:.1e} of PyTorch bf16's output RMS (tolerance {BF16_MODEL_TOLERANCE:g}); "
          f"timed in turns, {args.rounds} rounds (ratio = other / ansor bf16, above 1: ansor bf16 faster)")
    figures = print_turns(turns, "ansor bf16")
    return {"model": name, "dtype": "bfloat16", "error": err, **figures, "build_seconds": build16 + build32,
            "tuned": sum(1 for k in bf16.kernels.values() if k.record is not None),
            "trials_per_task": args.trials_per_task, "quick_seconds": args.quick_seconds}


def quantize_onnx(module, inputs, activations: str, folder: str) -> str:
    """The model exported to ONNX and quantized by `onnxruntime.quantization.quantize_static`
    (QDQ, per-channel int8 weights, `activations` uint8 or int8, calibrated on 8 random inputs
    of the example's shape): the path of the quantized file."""
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    float_path, path = os.path.join(folder, "float.onnx"), os.path.join(folder, f"qdq_{activations}.onnx")
    names = [f"input{i}" for i in range(len(inputs))]
    with open(os.devnull, "w") as devnull:
        stdout, sys.stdout = sys.stdout, devnull
        try:
            torch.onnx.export(module, inputs, float_path, input_names=names, opset_version=17, dynamo=False)
        finally:
            sys.stdout = stdout

    class RandomInputs(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(1)
            self.batches = iter([{n: rng.standard_normal(tuple(x.shape)).astype(np.float32)
                                  for n, x in zip(names, inputs)} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(float_path, path, RandomInputs(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    return path


def bench_int8(name: str, args) -> dict:
    """The model quantized by onnxruntime (`quantize_onnx`): ansor's build of the quantized file
    beside onnxruntime's session on the same file and ansor's float32 build of the model; on
    `--check-inputs` random inputs every output within one quantization step of onnxruntime's
    (the ones a step away counted) and top-1 compared, then the three timed in turns."""
    import onnxruntime

    import ansor
    from ansor.baselines import time_in_turns
    from ansor.graph.quantized_outputs import one_step_check, quantized_output_steps, step_differences
    from ansor.graph.torch_importer import UnsupportedOperatorError

    print(low_precision_title(name, f"int8 (QDQ, {args.activations} activations, per-channel int8 weights)"),
          flush=True)
    module, inputs = make_model(name)
    module = module.eval()
    path = quantize_onnx(module, inputs, args.activations, tempfile.mkdtemp(prefix="ansor-models-int8-"))
    try:
        graph8 = ansor.graph.from_onnx(path)
        _, int8, build8, _ = tune_and_build(f"{name} int8", graph8, args)
    except UnsupportedOperatorError as exc:
        print(f"{name} int8: refused: {exc}", flush=True)
        return {"model": name, "dtype": "int8", "refused": str(exc)}
    integer = [k for k in int8.kernels.values() if "_integer" in k.task.name]
    print(f"  integer kernels: {len(integer)}, {sum('dpbusd' in k.source for k in integer)} of them with vpdpbusd",
          flush=True)
    _, f32, build32, _ = tune_and_build(f"{name} float32", ansor.graph.from_torch(module, inputs), args)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    steps = quantized_output_steps(path)
    check = one_step_check(steps, lambda got, want: None)  # outputs without a step: top-1 alone
    if steps[0] is None:
        print(f"{name} int8: the output is no DequantizeLinear's: compared by top-1 alone", flush=True)
    rng = np.random.default_rng(2)
    differing = elements = rows = top1_equal = 0
    for _ in range(args.check_inputs):
        xs = [rng.standard_normal(tuple(x.shape)).astype(np.float32) for x in inputs]
        got, want = np.asarray(int8(*xs)), session.run(None, dict(zip(names, xs)))[0]
        problem = check([got], [want])
        if problem:
            raise AssertionError(f"{name}: ansor int8 against onnxruntime int8: {problem}")
        if steps[0] is not None:
            found = step_differences(got, want, steps[0])
            differing, elements = differing + found.differing, elements + found.size
        rows += math.prod(want.shape[:-1])
        top1_equal += int(np.count_nonzero(got.argmax(-1) == want.argmax(-1)))
    print(f"{name} int8: top-1 (argmax of the last axis) equal to onnxruntime's on {top1_equal} of {rows} rows "
          f"over {args.check_inputs} random inputs; {differing} of {elements} output elements one quantization "
          f"step away (rounding ties), none further", flush=True)
    x32 = [t.numpy() for t in inputs]
    feed = dict(zip(names, x32))
    fns = {"ansor int8": lambda: int8(*x32), "onnxruntime int8": lambda: session.run(None, feed),
           "ansor float32": lambda: f32(*x32)}
    turns = time_in_turns(fns, args.rounds, min_repeat_s=0.3, pause_s=0.5)
    print(f"{name} int8: timed in turns, {args.rounds} rounds (ratio = other / ansor int8, above 1: ansor int8 faster; "
          f"onnxruntime with {options.intra_op_num_threads} intra-op threads)")
    figures = print_turns(turns, "ansor int8")
    return {"model": name, "dtype": "int8", "activations": args.activations, "top1_equal": top1_equal,
            "top1_rows": rows, "one_step_differing": differing, "output_elements": elements, **figures,
            "build_seconds": build8 + build32, "tuned": sum(1 for k in int8.kernels.values() if k.record is not None),
            "integer_kernels": len(integer), "trials_per_task": args.trials_per_task,
            "quick_seconds": args.quick_seconds}


def timed_point(name: str, graph, module, inputs, database: str, args, quick_seconds: float) -> dict:
    """Build the model from `database`, check it against PyTorch, time it in turns with
    onnxruntime and PyTorch eager; the row of one point of the time-to-quality curve."""
    import torch

    import ansor
    from ansor.baselines import paired_ratio, time_in_turns

    start = time.time()
    compiled = ansor.build(graph, database=database, winograd=not args.no_winograd, quick_seconds=quick_seconds)
    build_seconds = time.time() - start
    x = [t.numpy() for t in inputs]
    with torch.no_grad():
        want = module(*inputs).numpy()
    got = compiled(*x)
    err = float(np.max(np.abs(got - want)) / (np.sqrt(np.mean(want.astype(np.float64) ** 2)) or 1.0))

    def eager():
        with torch.no_grad():
            module(*inputs)

    fns = {"ansor": lambda: compiled(*x), "PyTorch eager": eager}
    ort = onnxruntime_session(module, inputs)
    if ort is not None:
        fns["onnxruntime"] = ort
    turns = time_in_turns(fns, args.rounds, min_repeat_s=0.3, pause_s=0.5)
    estimate = sum(compiled.tasks.weights[i] * k.record.median_cost
                   for key, i in compiled.tasks.task_index.items() for k in [compiled.kernels[key]]
                   if k.record is not None)
    untuned = sum(1 for k in compiled.kernels.values() if k.record is None)
    return {"model": name, "error": err, "build_seconds": build_seconds, "untuned": untuned,
            "estimated_ms": estimate * 1e3 if not untuned else None,
            "timings_ms": {k: t.median * 1e3 for k, t in turns.items()},
            "spreads": {k: t.spread for k, t in turns.items()},
            "paired_ratios": {k: paired_ratio(t, turns["ansor"]) for k, t in turns.items()}}


def time_to_quality(name: str, args) -> list[dict]:
    """The rows of the time-to-quality curve (see the module) of one model."""
    import ansor
    from ansor.graph.model_tasks import extract_tasks
    from ansor.graph.model_tuning import tune_model
    from ansor.store import open_store

    module, inputs = make_model(name)
    module = module.eval()
    graph = ansor.graph.from_torch(module, inputs)
    model = extract_tasks(graph, winograd=not args.no_winograd)
    folder = tempfile.mkdtemp(prefix="ansor-curve-")
    rows = []
    minutes = sorted(float(m) for m in args.minutes.split(","))
    done = 0.0
    for m in minutes:
        if m == 0:  # the quick build of a fresh database: a model at once
            row = timed_point(name, graph, module, inputs, os.path.join(folder, "quick.db"), args, args.quick_seconds)
        else:
            database = os.path.join(folder, "tuned.db")
            start = time.time()
            with open_store(database)[0] as store:
                results = tune_model(model, store, None, time_budget=(m - done) * 60.0, seed=args.seed)
            done = m
            row = timed_point(name, graph, module, inputs, database, args, 0.0)
            row["tuning_seconds"] = time.time() - start
            row["trials"] = sum(r.trials for r in results)
        row["minutes"] = m
        times = row["timings_ms"]
        estimate = f"{row['estimated_ms']:.2f} ms" if row["estimated_ms"] is not None else "-"
        print(f"{name} after {m:g} min: ansor {times['ansor']:.2f} ms (estimate {estimate}), "
              + ", ".join(f"{k} {v:.2f} ms ({row['paired_ratios'][k]:.2f}x)" for k, v in times.items() if k != "ansor")
              + f"; {row['untuned']} kernels untuned, built in {row['build_seconds']:.0f} s, "
              f"max error {row['error']:.1e}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18,mobilenet_v2,bert_layer",
                        help=f"comma-separated, of {', '.join(MODEL_NAMES)}")
    parser.add_argument("--database", default="models.db")
    parser.add_argument("--trials-per-task", type=int, default=0,
                        help="tune first: this many trials times the number of distinct tasks (default 0)")
    parser.add_argument("--scheduler", default="gradient", choices=["gradient", "round-robin"])
    parser.add_argument("--quick-seconds", type=float, default=None,
                        help="the build's time for choosing programs of tasks without records (default: "
                             "ansor's, 0: untuned default schedules)")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds of tuning per model")
    parser.add_argument("--per-round", type=int, default=None,
                        help="programs per round (default: tune_model's, min(64, trials per task))")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-inductor", action="store_true", help="skip torch.compile (slow to compile)")
    parser.add_argument("--no-winograd", action="store_true",
                        help="keep 3x3 convolutions direct (see ansor.graph.winograd)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--json", help="append each model's row to this JSON-lines file")
    parser.add_argument("--minutes", help="the time-to-quality curve at these minutes of tuning (e.g. 0,1,5,10,20)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="bfloat16: each model in bf16 beside PyTorch eager in bf16 and both in float32")
    parser.add_argument("--int8", action="store_true",
                        help="each model quantized by onnxruntime's quantize_static (QDQ) beside onnxruntime's "
                             "session on the same file and ansor's float32 build")
    parser.add_argument("--activations", choices=["uint8", "int8"], default="uint8",
                        help="--int8: the quantized activations' type (default uint8)")
    parser.add_argument("--check-inputs", type=int, default=10,
                        help="--int8: random inputs on which outputs and top-1 are compared with onnxruntime")
    args = parser.parse_args()
    unknown = set(args.models.split(",")) - set(MODEL_NAMES)
    if unknown:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}; known: {', '.join(MODEL_NAMES)}")
    if sum([bool(args.minutes), args.dtype != "float32", args.int8]) > 1:
        parser.error("--minutes, --dtype bfloat16 and --int8 are separate runs: give one of them")
    if (args.dtype != "float32" or args.int8) and args.profile:
        parser.error("--profile tables the float32 rows only")
    for name in args.models.split(","):
        if args.minutes:
            rows = time_to_quality(name, args)
        elif args.dtype == "bfloat16":
            rows = [bench_bf16(name, args)]
        elif args.int8:
            rows = [bench_int8(name, args)]
        else:
            rows = [bench(name, args)]
        if args.json:
            with open(args.json, "a") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
