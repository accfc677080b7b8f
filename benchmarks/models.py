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
        callbacks = ([RoundCallback(curve)] if curve else []) + ([] if args.quiet else [TuneProgress()])
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
    args = parser.parse_args()
    unknown = set(args.models.split(",")) - set(MODEL_NAMES)
    if unknown:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}; known: {', '.join(MODEL_NAMES)}")
    for name in args.models.split(","):
        rows = time_to_quality(name, args) if args.minutes else [bench(name, args)]
        if args.json:
            with open(args.json, "a") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
