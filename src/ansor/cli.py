"""The `ansor` command line: tune named workloads, look at records, compare with numpy/PyTorch."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys


DESCRIPTION = """\
ansor finds fast CPU kernels for tensor computations by search: it generates candidate
programs (tilings, loop orders, parallel/vector/unroll choices), compiles and times each one,
checks every result against numpy, and keeps the measurements in a database so `build` can
reuse the best kernel later.

examples:
  ansor tune matmul --shape 1024,1024,1024 --trials 64
  ansor tune conv2d --shape 1,64,56,56,64,3,3 --padding 1 --trials 100
  ansor workloads                     list the named workloads and their --shape
  ansor show                          best record per workload in the database
  ansor show --schedule               ... with the best program's loop nest
  ansor tune-model resnet18.onnx --trials 2000    tune a whole model's fused subgraphs together
  ansor run-model resnet18.onnx       run it with the tuned kernels, check it, time it
"""


DATABASE_HELP = "records database (default: $ANSOR_DB, else ansor.db in the user cache directory)"


def _shape(text: str) -> tuple[int, ...]:
    fields = text.split(",") if "," in text else text.split("x")  # 64,64,64 or 64x64x64
    dims = []
    for pos, field in enumerate(fields, start=1):
        field = field.strip()
        if not field:
            raise argparse.ArgumentTypeError(f"--shape {text!r}: field {pos} is empty; give comma-separated "
                                             f"positive integers, e.g. 64,64,64")
        try:
            n = int(field)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--shape {text!r}: {field!r} is not an integer") from None
        if n <= 0:
            raise argparse.ArgumentTypeError(f"--shape {text!r}: dimension {pos} is {n}; dimensions must be "
                                             f"positive")
        dims.append(n)
    return tuple(dims)


def build_parser() -> argparse.ArgumentParser:
    """The parser of the `ansor` command and its subcommands (the documentation's command-line
    reference is generated from it)."""
    from ansor.tuning.options import TuneOptions

    parser = argparse.ArgumentParser(prog="ansor", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    tune = sub.add_parser("tune", help="search for a fast kernel of a named workload",
                          description="Tune a named workload, then compare the best kernel with numpy "
                                      "(and PyTorch when installed), measured in the same run.")
    _workload_args(tune)
    tune.add_argument("--trials", type=int, default=64,
                      help="programs to measure in this run, on top of those already in the database "
                           "(default 64)")
    tune.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                      help="stop searching after this many seconds even if --trials are not reached "
                           "(default: no limit)")
    tune.add_argument("--database", help=DATABASE_HELP)
    tune.add_argument("--seed", type=int, default=None,
                      help="random seed of the search (default: none, a different search each run)")
    tune.add_argument("--policy", default="sketch.xgb",
                      help="search policy: sketch.xgb (the default: evolution guided by the learned cost "
                           "model), sketch.random (random sampling of the sketches) or basic")
    tune.add_argument("--timeout", type=float, default=10.0,
                      help="seconds before a kernel counts as hung (default 10)")
    tune.add_argument("--per-round", type=int, default=64, help="programs measured per round (default 64)")
    tune.add_argument("--transfer-programs", type=int, default=TuneOptions.transfer_programs,
                      help="measured programs of the database's other workloads the cost model starts "
                           f"from; 0: learn from this workload alone (default {TuneOptions.transfer_programs})")
    tune.add_argument("--isa", choices=["avx512", "avx2", "generic"], default=None,
                      help="tune for this CPU's instruction set restricted to ISA (default: all it has)")
    tune.add_argument("--cores", type=int, default=None,
                      help="tune for this many of the CPU's cores (default: all of them)")
    tune.add_argument("--transfer-from", action="append", default=[], metavar="TARGET_KEY",
                      help="start from the records of another target in the database, e.g. "
                           "cpu-x86_64-avx2-2c (repeatable; default: none)")
    tune.add_argument("--no-pretrained", action="store_true",
                      help="the cost model starts without the package's pretrained model (default: with "
                           "it, unless ANSOR_PRETRAINED=0)")
    tune.add_argument("--no-baseline", action="store_true",
                      help="skip the numpy/PyTorch comparison (default: compare)")
    tune.add_argument("--quiet", action="store_true", help="no progress bar (default: show it)")
    tune.add_argument("--plot", metavar="PNG",
                      help="save the tuning curve (best GFLOP/s vs trials) here (default: no plot)")

    show = sub.add_parser("show", help="records in the database: best per workload and target",
                          description="The best program of each workload and target in a database: the "
                                      "median of its runs, their spread and the number of records.")
    show.add_argument("--database", help=DATABASE_HELP)
    show.add_argument("--workload", metavar="TEXT",
                      help="only workloads whose name contains TEXT (case-insensitive, e.g. 'matmul 1024') "
                           "or whose key starts with it (default: all)")
    show.add_argument("--schedule", action="store_true",
                      help="also print each best program's loop nest (default: off)")

    tm = sub.add_parser("tune-model", help="tune the fused subgraphs of an ONNX model together",
                        description="Import an ONNX model, cut it into fused subgraphs and tune their distinct "
                                    "tasks under the task scheduler with one cost model. A rerun with the same "
                                    "database resumes: records already there count against --trials.")
    tm.add_argument("model", help="an .onnx file with static input shapes")
    tm.add_argument("--trials", type=int, default=1000,
                    help="programs to measure for the whole model, records already in the database "
                         "included (default 1000)")
    tm.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                    help="stop searching after this many seconds (default: no limit)")
    tm.add_argument("--scheduler", default="gradient", choices=["gradient", "round-robin"],
                    help="which task gets the next round (default gradient: where the model's estimated "
                         "latency drops most)")
    tm.add_argument("--database", help=DATABASE_HELP)
    tm.add_argument("--seed", type=int, default=None, help="random seed of the search (default: none)")
    tm.add_argument("--timeout", type=float, default=10.0, help="seconds before a kernel counts as hung (default 10)")
    tm.add_argument("--quiet", action="store_true", help="no progress display (default: show it)")
    tm.add_argument("--no-winograd", action="store_true",
                    help="keep 3x3 convolutions direct (default: Winograd form over large images; "
                         "run-model must be told the same)")

    rm = sub.add_parser("run-model", help="run an ONNX model with its tuned kernels, checked and timed",
                        description="Build an ONNX model with the best records of the database (untuned "
                                    "default schedules for the rest), run it on random inputs, check the "
                                    "output against the numpy reference executor, and time it in turns with "
                                    "onnxruntime when installed.")
    rm.add_argument("model", help="an .onnx file with static input shapes")
    rm.add_argument("--database", help=DATABASE_HELP)
    rm.add_argument("--rounds", type=int, default=7, help="timing rounds, in turns with onnxruntime (default 7)")
    rm.add_argument("--profile", action="store_true", help="also print the time of every subgraph (default: off)")
    rm.add_argument("--no-winograd", action="store_true",
                    help="keep 3x3 convolutions direct, as tune-model --no-winograd tuned them (default: "
                         "Winograd form over large images)")

    cp = sub.add_parser("compare", help="ansor beside numpy, PyTorch and onnxruntime: one table, timed in turns",
                        description="Build a named workload's best program (a quick search first when the "
                                    "database has none) or an ONNX model with its database's records, check "
                                    "the output against the reference, and time it in turns with numpy, PyTorch "
                                    "eager, torch.compile and onnxruntime (models) in one process: median times, "
                                    "spreads, GFLOP/s and ansor's speedup. A baseline that is not installed is "
                                    "skipped with a note.")
    cp.add_argument("what", metavar="WORKLOAD|MODEL.onnx",
                    help="a workload name (see `ansor workloads`) or an .onnx model file")
    cp.add_argument("--shape", type=_shape,
                    help="the workload's dimensions, e.g. 1024,1024,1024 (default: the workload's default shape)")
    cp.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                    help="element type of a workload (default float32)")
    for opt in WORKLOAD_OPTIONS:
        cp.add_argument(f"--{opt}", type=int, default=None,
                        help=f"{opt} of the workloads that take it (default: the workload's own)")
    cp.add_argument("--database", help=DATABASE_HELP)
    cp.add_argument("--rounds", type=int, default=7, help="timing rounds, every one timing each implementation "
                                                          "once (default 7)")
    cp.add_argument("--skip", action="append", default=[], metavar="BASELINE",
                    choices=["numpy", "torch", "torch.compile", "onnxruntime"],
                    help="leave out a baseline: numpy, torch, torch.compile or onnxruntime (repeatable; "
                         "default: none)")
    cp.add_argument("-o", "--output", metavar="PNG", help="save a bar chart of the times here (default: no chart)")

    sub.add_parser("workloads", help="list the named workloads and the meaning of --shape")

    sk = sub.add_parser("sketches", help="print every sketch (high-level structure) of a workload",
                        description="Derive the sketches of a workload and print each as a loop nest "
                                    "with the rules that produced it ('?' marks undecided tile sizes).")
    _workload_args(sk)
    sa = sub.add_parser("sample", help="print randomly annotated complete programs and their C")
    _workload_args(sa)
    sa.add_argument("-n", type=int, default=3, help="how many programs (default 3)")
    sa.add_argument("--seed", type=int, default=0, help="random seed of the sampling (default 0)")
    sa.add_argument("--no-source", action="store_true", help="loop nests only, no C (default: print the C)")

    viz = sub.add_parser("viz", help="why the best kernel of a workload is fast: its tiles and its roofline",
                         description="Explain the best record of a workload: the tiles of its loop nest drawn to "
                                     "scale against the caches, the bytes they move, and the kernel's place on the "
                                     "roofline of this machine (its FMA peak and memory bandwidth, measured once "
                                     "and cached). Prints the explanation; -o also draws it.")
    _workload_args(viz)
    viz.add_argument("--database", help=DATABASE_HELP)
    viz.add_argument("-o", "--output", metavar="FILE",
                     help="draw the picture here: a .png or .svg file (default: the text only)")
    viz.add_argument("--isa", choices=["avx512", "avx2", "generic"], default=None,
                     help="the record of a run tuned with `ansor tune --isa` (default: all the CPU has)")
    viz.add_argument("--cores", type=int, default=None,
                     help="the record of a run tuned with `ansor tune --cores` (default: all the cores)")
    viz.add_argument("--remeasure", action="store_true",
                     help="measure this machine's peak FLOP/s and bandwidths again and replace the saved ones "
                          "(default: measured once, then read back)")

    cm = sub.add_parser("costmodel", help="cost-model quality on the records of a database")
    cm_sub = cm.add_subparsers(dest="cm_command", metavar="ACTION")
    ev = cm_sub.add_parser("eval", help="train on a split of the records, report ranking quality on the rest",
                           description="Replays every record of the database for this machine's target, "
                                       "extracts program features, trains the XGBoost cost model on 80% of "
                                       "the programs and reports pairwise ranking accuracy, top-k recall and "
                                       "R^2 on the held-out 20%.")
    cm_sub.add_parser("info", help="what the pretrained model shipped in the package was trained on")
    ev.add_argument("--database", help=DATABASE_HELP)
    ev.add_argument("--test-fraction", type=float, default=0.2,
                    help="share of the programs held out for scoring (default 0.2)")
    ev.add_argument("--seed", type=int, default=0, help="random seed of the split and the model (default 0)")

    exp = sub.add_parser("export", help="write records as JSON lines")
    exp.add_argument("path", help="the JSON-lines file to write (replaced if it exists)")
    exp.add_argument("--database", help=DATABASE_HELP)
    imp = sub.add_parser("import", help="read records from JSON lines (skipping ones already present)")
    imp.add_argument("path", help="a JSON-lines file written by `ansor export`")
    imp.add_argument("--database", help=DATABASE_HELP + "; created if missing")
    from ansor.pretrain.command import add_pretrain_parser

    add_pretrain_parser(sub)
    return parser


WORKLOAD_OPTIONS = ("stride", "padding", "dilation", "groups")


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", help="a workload name (see `ansor workloads`)")
    p.add_argument("--shape", type=_shape,
                   help="the workload's dimensions, e.g. 1024,1024,1024 (default: the workload's default "
                        "shape, see `ansor workloads`)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                   help="element type (default float32)")
    for opt in WORKLOAD_OPTIONS:
        p.add_argument(f"--{opt}", type=int, default=None,
                       help=f"{opt} of the workloads that take it (default: the workload's own, see "
                            f"`ansor workloads`)")
    p.add_argument("--target", choices=["cpu", "cuda", "opencl"], default="cpu",
                   help="the hardware: this CPU, an NVIDIA GPU (CUDA) or an OpenCL device (default cpu)")
    p.add_argument("--arch", default="sm_90",
                   help="CUDA compute capability of --target cuda (default sm_90)")
    p.add_argument("--device", default="pocl-cpu",
                   help="OpenCL device of --target opencl: pocl-cpu runs GPU programs on this CPU through "
                        "PoCL, to check them without a GPU (default pocl-cpu)")


def _target_from_args(args):
    import ansor

    isa, cores = getattr(args, "isa", None), getattr(args, "cores", None)  # (tune and viz take them)
    if args.target == "cuda":
        target = ansor.Target.cuda(args.arch)
    elif args.target == "opencl":
        target = ansor.Target.opencl(args.device)
    else:
        return ansor.Target.host(isa=isa, num_cores=cores)
    if isa is not None or cores is not None:
        raise ValueError("--isa and --cores describe a CPU target; this one is " + target.key)
    return target


def _task_from_args(args):
    from ansor.workloads import make_task

    opts = {k: getattr(args, k) for k in WORKLOAD_OPTIONS}
    return make_task(args.workload, args.shape, args.dtype, target=_target_from_args(args), **opts)


def _version() -> str:
    from ansor import __version__

    return f"ansor {__version__}"


def main(argv: list[str] | None = None) -> int:
    """Run the `ansor` command on `argv` (default: the process's arguments); returns the exit
    status: 0 on success, 1 for a wrong result, 2 for bad input, 130 after Ctrl-C (143 after
    SIGTERM while tuning)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C outside tuning (start-up, a read-only command): no traceback
        print("ansor: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(_joined_negative_shapes(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_usage(sys.stderr)
        print("ansor: error: give a command; `ansor --help` lists them", file=sys.stderr)
        return 2
    from ansor.store import DatabaseError
    from ansor.measure.errors import DeviceUnavailableError
    from ansor.schedule.state import ScheduleError

    commands = {"tune": cmd_tune, "show": cmd_show, "workloads": cmd_workloads, "sketches": cmd_sketches,
                "sample": cmd_sample, "costmodel": cmd_costmodel, "export": cmd_export, "import": cmd_import,
                "tune-model": cmd_tune_model, "run-model": cmd_run_model, "viz": cmd_viz}
    commands["compare"] = cmd_compare
    commands["pretrain"] = cmd_pretrain
    try:
        return commands[args.command](args)
    except (KeyError, ValueError, TypeError, DatabaseError, ScheduleError, FileNotFoundError,
            DeviceUnavailableError) as exc:
        # bad input from the command line or a bad file: a one-line message, not a traceback
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"ansor: error: {message}", file=sys.stderr)
        return 2


def _joined_negative_shapes(argv: list[str]) -> list[str]:
    """`--shape -4,64,64` as `--shape=-4,64,64`: argparse would take the value for an option
    and answer "expected one argument" instead of saying what is wrong with the shape."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--shape" and i + 1 < len(argv) and argv[i + 1][:1] == "-" and argv[i + 1][1:2].isdigit():
            out.append(f"--shape={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def cmd_workloads(args) -> int:
    from rich.table import Table

    from ansor.report import console
    from ansor.workloads import WORKLOADS

    table = Table(title="named workloads")
    table.add_column("name")
    table.add_column("--shape")
    table.add_column("default shape")
    table.add_column("options")
    for w in WORKLOADS.values():
        opts = ", ".join(f"--{k} {v}" for k, v in w.options.items())
        table.add_row(w.name, w.shape_help, ",".join(map(str, w.default_shape)), opts)
    console.print(table)
    return 0


def cmd_sketches(args) -> int:
    import time

    from ansor.report import console
    from ansor.search.sketch_policy import SketchPolicy

    task = _task_from_args(args)
    t0 = time.perf_counter()
    policy = SketchPolicy(task, seed=0)
    ms = (time.perf_counter() - t0) * 1e3
    console.print(f"[bold]{task.name}[/] {task.workload_key}: {len(policy.sketches)} sketches "
                  f"(derived in {ms:.1f} ms)")
    for i, sketch in enumerate(policy.sketches):
        history = ", ".join(sketch.history) or "no rule changed the program"
        console.print(f"\n[bold cyan]sketch #{i}[/]  rules: {history}")
        console.print(str(sketch.state), markup=False, highlight=False)
    return 0


def cmd_sample(args) -> int:
    from ansor.backend import generate_source
    from ansor.lower.lower import schedule_text
    from ansor.report import console
    from ansor.search.sketch_policy import SketchPolicy

    task = _task_from_args(args)
    policy = SketchPolicy(task, seed=args.seed)
    for i, state in enumerate(policy.sample(args.n)):
        console.print(f"\n[bold cyan]program #{i}[/] ({len(state.steps)} steps)")
        console.print(schedule_text(state), markup=False, highlight=False)
        if not args.no_source:
            source, _ = generate_source(state, task.target, f"{task.name}_kernel")
            body = source[source.index("\nvoid "):] if "\nvoid " in source else source.split("\n", 1)[1]
            console.print(body, markup=False, highlight=False)
    return 0


def cmd_viz(args) -> int:
    """The best record of a workload explained: printed, and drawn with -o."""
    import ansor
    from ansor.store import open_store
    from ansor.replay import replay_records
    from ansor.report import console
    from ansor.viz import visualize

    task = _task_from_args(args)
    if args.output is not None and not args.output.lower().endswith((".png", ".svg")):
        raise ValueError(f"-o {args.output}: the picture is written as PNG or SVG; give a .png or .svg file")
    db_path = args.database or str(ansor.default_database_path())
    with open_store(db_path, create=False)[0] as db:
        found = next(iter(replay_records(db.best(task.workload_key, task.target.key, k=5), task.dag)), None)
    if found is None:
        shape = ",".join(map(str, args.shape)) if args.shape else None
        again = f"ansor tune {args.workload}" + (f" --shape {shape}" if shape else "") + \
            (f" --database {args.database}" if args.database else "")
        print(f"ansor: no record of {args.workload} {list(task.outputs[0].shape)} on {task.target.key} in "
              f"{db_path}; tune it first: {again}", file=sys.stderr)
        return 1
    record, _ = found
    view = visualize(record, task=task, path=args.output, remeasure=args.remeasure,
                     on_measure=lambda message: print(f"ansor: {message}", file=sys.stderr),
                     on_warning=lambda message: print(f"ansor: warning: {message}", file=sys.stderr))
    console.print(view.text, markup=False, highlight=False, soft_wrap=True)
    if args.output:
        console.print(f"picture saved to {args.output}")
    return 0


def cmd_tune(args) -> int:
    import ansor
    from ansor.interrupts import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, terminate_as_interrupt
    from ansor.report import console

    task = _task_from_args(args)
    if args.trials < 0:
        raise ValueError("--trials must be >= 0")
    if args.time_budget is not None and args.time_budget <= 0:
        raise ValueError("--time-budget must be a positive number of seconds")
    db_path = args.database or str(ansor.default_database_path())
    console.print(f"[bold]ansor[/] tuning [cyan]{args.workload}[/] {list(task.outputs[0].shape)} "
                  f"({task.flop / 1e9:.3f} GFLOP) on {task.target.key}; records: {db_path}")
    result = None
    try:
        with terminate_as_interrupt():
            result = ansor.tune(task, trials=args.trials, database=db_path, seed=args.seed, policy=args.policy,
                                timeout=args.timeout, measures_per_round=args.per_round, progress=not args.quiet,
                                transfer_programs=args.transfer_programs, time_budget=args.time_budget,
                                pretrained=False if args.no_pretrained else None, transfer_from=args.transfer_from)
            return _tune_report(args, task, result, db_path)
    except KeyboardInterrupt as exc:
        partial = getattr(exc, "results", None)
        measured = result.trials if result is not None else (partial[0].trials if partial else 0)
        what = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"ansor: {what}; the {measured} programs this run measured are kept in {db_path} "
              f"(the same command continues from them)", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def _tune_report(args, task, result, db_path: str) -> int:
    """After tuning: the best kernel built from the database, checked, and timed in turns
    against numpy and PyTorch."""
    import ansor
    from ansor.baselines import time_in_turns, torch_callable
    from ansor.report import best_text, comparison_table, console, error_summary
    from ansor.workloads import WORKLOADS, workload_options

    errors = f"; {error_summary(result.error_counts, args.timeout)}" if result.errors else ""
    console.print(f"measured {result.trials} programs in {result.seconds:.1f} s{errors}: search "
                  f"{result.search_seconds:.1f} s, measurement {result.measure_seconds:.1f} s, cost model "
                  f"{result.model_seconds:.1f} s")
    if result.best_cost < math.inf:
        console.print(f"best in the database: {best_text(result)}")
    if args.plot and result.curve:
        from ansor.report import plot_curves

        plot_curves({args.policy: result.curve}, args.plot, f"{args.workload} {list(task.outputs[0].shape)}")
        console.print(f"tuning curve saved to {args.plot}")
    kernel = ansor.build(task, database=db_path)
    inputs = task.random_inputs(seed=1)
    problem = kernel.check(*inputs)
    if problem:
        console.print(f"[red]the built kernel disagrees with the reference: {problem}[/]")
        return 1
    fns = {"ansor": kernel.prepared(*inputs)}
    notes = {"ansor": "checked against numpy reference"
             + (f"; {', '.join(kernel.constant_inputs)} packed ahead of the calls" if kernel.packs_ahead else "")}
    if kernel.packs_ahead:
        fns["ansor, packing in every call"] = kernel.prepared(*inputs, include_prepack=True)
        notes["ansor, packing in every call"] = "kernel(...) without bind()"
    w = WORKLOADS[args.workload]
    if not args.no_baseline:
        if w.numpy_fn is not None:
            fns["numpy"] = lambda: w.numpy_fn(*inputs)
        if w.torch_fn is not None:
            opts = {k: getattr(args, k) for k in ("stride", "padding", "dilation", "groups")}
            torch_fn = torch_callable(w.torch_fn, workload_options(args.workload, args.shape, **opts), inputs)
            if torch_fn is not None:
                fns["PyTorch eager"] = torch_fn
    rounds = 7
    timings = time_in_turns(fns, rounds=rounds)
    rows = [(name, t.median, "; ".join(filter(None, [notes.get(name, ""), f"spread {t.spread:.0%}"])))
            for name, t in timings.items()]
    console.print(comparison_table(f"{args.workload} {list(task.outputs[0].shape)}, timed in turns "
                                   f"({rounds} rounds, medians)", task.flop, rows))
    if args.trials and result.best_cost == math.inf:
        console.print("[yellow]no program ran successfully; the kernel above is the untuned default[/]")
    return 0


def _load_model(path: str):
    from ansor.graph import from_onnx

    if not path.endswith(".onnx"):
        raise ValueError(f"{path}: give an .onnx file (PyTorch models: ansor.graph.from_torch in Python)")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    return from_onnx(path)


def cmd_tune_model(args) -> int:
    import ansor
    from ansor.graph.model_tasks import extract_tasks
    from ansor.graph.model_tuning import estimated_latency, tune_model
    from ansor.interrupts import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, terminate_as_interrupt
    from ansor.report import TuneProgress, console, format_seconds
    from ansor.store import open_store

    if args.trials < 0:
        raise ValueError("--trials must be >= 0")
    if args.time_budget is not None and args.time_budget <= 0:
        raise ValueError("--time-budget must be a positive number of seconds")
    model = extract_tasks(_load_model(args.model), winograd=not args.no_winograd)
    db_path = args.database or str(ansor.default_database_path())
    console.print(f"[bold]ansor[/] tuning [cyan]{args.model}[/]: {len(model.pieces)} subgraphs, "
                  f"{len(model.tasks)} distinct tasks, {len(model.fallbacks)} on numpy fallback; "
                  f"scheduler {args.scheduler}; records: {db_path}")
    progress = [] if args.quiet else [TuneProgress(timeout=args.timeout)]
    try:
        with terminate_as_interrupt(), open_store(db_path)[0] as store:
            results = tune_model(model, store, args.trials, scheduler=args.scheduler, seed=args.seed,
                                 timeout=args.timeout, time_budget=args.time_budget, callbacks=progress,
                                 notify=lambda line: print(f"ansor: {line}", file=sys.stderr))
    except KeyboardInterrupt as exc:
        measured = sum(r.trials for r in getattr(exc, "results", None) or [])
        what = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"ansor: {what}; the {measured} programs this run measured are kept in {db_path} "
              f"(the same command continues from them)", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    total = estimated_latency(model, results)
    console.print(f"measured {sum(r.trials for r in results)} programs; estimated model latency "
                  f"{format_seconds(total) if math.isfinite(total) else 'unknown (a task has no program)'}; "
                  f"`ansor run-model {args.model}` runs it")
    return 0


def cmd_run_model(args) -> int:
    import numpy as np

    import ansor
    from ansor.baselines import time_in_turns
    from ansor.store import open_store
    from ansor.graph.reference import run_graph
    from ansor.report import comparison_table, console

    graph = _load_model(args.model)
    db_path = args.database or str(ansor.default_database_path())
    with open_store(db_path, create=False)[0] as db:
        compiled = ansor.build(graph, database=db, winograd=not args.no_winograd)
    console.print(compiled.summary())
    rng = np.random.default_rng(0)
    inputs = [_random_input(rng, graph.types[name]) for name in graph.inputs]
    got = compiled(*inputs)
    got = list(got) if isinstance(got, tuple) else [got]
    for k, (g, w) in enumerate(zip(got, run_graph(graph, inputs))):
        rms = float(np.sqrt(np.mean(np.square(w.astype(np.float64))))) or 1.0
        err = float(np.max(np.abs(g.astype(np.float64) - w))) / rms if w.size else 0.0
        if err > 1e-3:
            console.print(f"[red]output {k} disagrees with the reference executor: max error {err:.2e} of its RMS[/]")
            return 1
    fns = {"ansor": lambda: compiled(*inputs)}
    try:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = os.cpu_count() or 1
        session = onnxruntime.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
        feed = {i.name: x for i, x in zip(session.get_inputs(), inputs)}
        fns["onnxruntime"] = lambda: session.run(None, feed)
    except ImportError:
        pass
    timings = time_in_turns(fns, rounds=args.rounds)
    rows = [(name, t.median, f"spread {t.spread:.0%}") for name, t in timings.items()]
    console.print(comparison_table(f"{args.model}, checked against the reference executor; timed in turns "
                                   f"({args.rounds} rounds, medians)", 0, rows))
    if args.profile:
        for name, kind, seconds in compiled.profile(*inputs):
            console.print(f"{seconds * 1e3:9.3f} ms  {kind:8s} {name}")
    return 0


def cmd_compare(args) -> int:
    """A workload or an ONNX model beside numpy/PyTorch/onnxruntime: checked, timed in turns,
    printed as one table (and drawn with -o); exit 1 when ansor's output is wrong."""
    import ansor
    from ansor.compare import WrongResultError, compare_model, compare_workload
    from ansor.report import console

    if args.rounds < 1:
        raise ValueError("--rounds must be at least 1")
    db_path = args.database or str(ansor.default_database_path())
    skip = set(args.skip)
    try:
        if args.what.endswith(".onnx"):
            given = [f"--{k}" for k in ("shape", *WORKLOAD_OPTIONS) if getattr(args, k) is not None]
            if given:
                raise ValueError(f"{', '.join(given)} describe a named workload; a model's shapes are in its file")
            result = compare_model(args.what, database=db_path, rounds=args.rounds, skip=skip)
        else:
            options = {k: getattr(args, k) for k in WORKLOAD_OPTIONS}
            result = compare_workload(args.what, args.shape, args.dtype, options, database=db_path,
                                      rounds=args.rounds, skip=skip)
    except WrongResultError as exc:
        console.print(f"[red]{exc}[/]")
        return 1
    console.print(result.table())
    console.print(f"{result.checked}; records: {db_path}")
    for line in result.lines():
        console.print(line, markup=False, highlight=False)
    if args.output:
        result.save_chart(args.output)
        console.print(f"bar chart saved to {args.output}")
    return 0


def _random_input(rng, t):
    import numpy as np

    if np.dtype(t.dtype).kind in "iu":
        return rng.integers(0, 2, size=t.shape).astype(t.dtype)  # token ids and masks: small valid values
    if t.dtype == "bool":
        return rng.random(t.shape) < 0.5
    return rng.standard_normal(t.shape).astype(t.dtype)


def cmd_show(args) -> int:
    import ansor
    from ansor.store import open_store
    from ansor.report import console, summary_table
    from ansor.workloads import workload_label

    path = args.database or str(ansor.default_database_path())
    with open_store(path, create=False)[0] as db:
        summary = db.summary()
        rows = [r for r in summary if not args.workload or _matches(args.workload, r)]
        if not rows:
            if args.workload:
                n = len({r["workload_key"] for r in summary})
                print(f"ansor: no workload matches {args.workload!r} ({n} workload{'' if n == 1 else 's'} "
                      f"in {path})", file=sys.stderr)
                return 1
            console.print(f"no records in {path}")
            return 0
        console.print(summary_table(rows))
        if args.schedule:
            for r in rows:
                best = db.best(r["workload_key"], r["target_key"])
                if best:
                    console.print(f"\n[bold]{workload_label(r['workload'])}[/] ({r['workload_key']}) on "
                                  f"{r['target_key']}: {len(best[0].steps)} steps")
                    console.print(_schedule_text(db, best[0]), markup=False, highlight=False)
    return 0


def _matches(text: str, row: dict) -> bool:
    """A workload filter: part of the readable name (any case) or the start of the key."""
    from ansor.workloads import workload_label

    return row["workload_key"].startswith(text) or text.lower() in workload_label(row["workload"]).lower()


def _schedule_text(db, record) -> str:
    """A record's loop nest; its raw steps, with the reason, when it cannot be replayed."""
    from ansor.lower.lower import schedule_text
    from ansor.replay import ReplayError, replay, workload_dag

    try:
        return schedule_text(replay(record, workload_dag(db, record.workload_key)))
    except ReplayError as exc:
        steps = "\n".join(f"  {step}" for step in record.steps)
        return f"(no loop nest: {exc}; its steps:)\n{steps}"


def cmd_costmodel(args) -> int:
    import ansor
    from ansor.tuning.dataset import load_dataset
    from ansor.costmodel.metrics import evaluate_split
    from ansor.store import open_store
    from ansor.report import console

    if args.cm_command == "info":
        from ansor.costmodel.pretrained import model_file, provenance

        info = provenance()
        if info is None:
            console.print("no pretrained model in this installation")
            return 1
        console.print(f"pretrained model {model_file()}:")
        for key, value in info.items():
            console.print(f"  {key:16s} {json.dumps(value) if isinstance(value, (dict, list)) else value}")
        return 0
    if args.cm_command != "eval":
        raise ValueError("usage: ansor costmodel eval [--database PATH] | ansor costmodel info")
    path = args.database or str(ansor.default_database_path())
    with open_store(path, create=False)[0] as db:
        data = load_dataset(db, ansor.Target.host().key)
    if len(data.costs) < 10:
        raise ValueError(f"{path} holds only {len(data.costs)} replayable programs for this target "
                         f"({data.skipped} records could not be replayed); the evaluation needs 10, tune first")
    metrics = evaluate_split(data.features, data.costs, data.groups, test_fraction=args.test_fraction,
                             seed=args.seed)
    console.print(f"{len(data.costs)} programs of {len(set(data.groups))} workloads from {path} "
                  f"({data.skipped} records could not be replayed)")
    for key, value in metrics.items():
        console.print(f"  {key:30s} {value:.3f}" if isinstance(value, float) else f"  {key:30s} {value}")
    return 0


def cmd_export(args) -> int:
    import ansor
    from ansor.store import open_store

    with open_store(args.database or ansor.default_database_path(), create=False)[0] as db:
        n = db.export_jsonl(args.path)
    print(f"exported {n} records to {args.path}")
    return 0


def cmd_import(args) -> int:
    import ansor
    from ansor.store import open_store

    with open_store(args.database or ansor.default_database_path())[0] as db:
        n = db.import_jsonl(args.path)
    print(f"imported {n} new records from {args.path}")
    return 0


def cmd_pretrain(args) -> int:
    from ansor.pretrain.command import run_pretrain
    from ansor.report import TuneProgress

    return run_pretrain(args, progress=TuneProgress)


if __name__ == "__main__":
    sys.exit(main())
