"""The `ansor` command line: tune named workloads, look at records, compare with numpy/PyTorch."""

from __future__ import annotations

import argparse
import math
import sys

from ansor.tuner import TUNE_DEFAULTS

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
"""


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape takes comma-separated integers, got {text!r}") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"--shape needs positive integers, got {text!r}")
    return dims


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ansor", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    tune = sub.add_parser("tune", help="search for a fast kernel of a named workload",
                          description="Tune a named workload, then compare the best kernel with numpy "
                                      "(and PyTorch when installed), measured in the same run.")
    tune.add_argument("workload", help="a workload name (see `ansor workloads`)")
    tune.add_argument("--shape", type=_shape, help="the workload's dimensions, e.g. 1024,1024,1024")
    tune.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    tune.add_argument("--trials", type=int, default=64, help="programs to measure (default 64)")
    tune.add_argument("--database", help="records database (default: $ANSOR_DB or the user cache)")
    tune.add_argument("--seed", type=int, default=None, help="random seed of the search")
    tune.add_argument("--policy", default="sketch.xgb",
                      help="search policy: sketch.xgb (default: evolution guided by the learned cost "
                           "model), sketch.random (random sampling of the sketches) or basic")
    tune.add_argument("--timeout", type=float, default=10.0, help="seconds before a kernel counts as hung")
    tune.add_argument("--per-round", type=int, default=64, help="programs measured per round")
    tune.add_argument("--transfer-programs", type=int, default=TUNE_DEFAULTS["transfer_programs"],
                      help="measured programs of the database's other workloads the cost model starts "
                           "from (0: learn from this workload alone)")
    tune.add_argument("--stride", type=int, default=None)
    tune.add_argument("--padding", type=int, default=None)
    tune.add_argument("--dilation", type=int, default=None)
    tune.add_argument("--groups", type=int, default=None)
    tune.add_argument("--no-baseline", action="store_true", help="skip the numpy/PyTorch comparison")
    tune.add_argument("--quiet", action="store_true", help="no progress bar")
    tune.add_argument("--plot", metavar="PNG", help="save the tuning curve (best GFLOP/s vs trials) here")

    show = sub.add_parser("show", help="records in the database: best per workload and target")
    show.add_argument("--database", help="records database (default: $ANSOR_DB or the user cache)")
    show.add_argument("--workload", help="only workload keys starting with this")
    show.add_argument("--schedule", action="store_true", help="print the best program's loop nest")

    sub.add_parser("workloads", help="list the named workloads and the meaning of --shape")

    sk = sub.add_parser("sketches", help="print every sketch (high-level structure) of a workload",
                        description="Derive the sketches of a workload and print each as a loop nest "
                                    "with the rules that produced it ('?' marks undecided tile sizes).")
    _workload_args(sk)
    sa = sub.add_parser("sample", help="print randomly annotated complete programs and their C")
    _workload_args(sa)
    sa.add_argument("-n", type=int, default=3, help="how many programs (default 3)")
    sa.add_argument("--seed", type=int, default=0)
    sa.add_argument("--no-source", action="store_true", help="loop nests only, no C")

    cm = sub.add_parser("costmodel", help="cost-model quality on the records of a database")
    cm_sub = cm.add_subparsers(dest="cm_command", metavar="ACTION")
    ev = cm_sub.add_parser("eval", help="train on a split of the records, report ranking quality on the rest",
                           description="Replays every record of the database for this machine's target, "
                                       "extracts program features, trains the XGBoost cost model on 80%% of "
                                       "the programs and reports pairwise ranking accuracy, top-k recall and "
                                       "R^2 on the held-out 20%%.")
    ev.add_argument("--database", help="records database (default: $ANSOR_DB or the user cache)")
    ev.add_argument("--test-fraction", type=float, default=0.2)
    ev.add_argument("--seed", type=int, default=0)

    exp = sub.add_parser("export", help="write records as JSON lines")
    exp.add_argument("path")
    exp.add_argument("--database")
    imp = sub.add_parser("import", help="read records from JSON lines (skipping ones already present)")
    imp.add_argument("path")
    imp.add_argument("--database")
    return parser


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", help="a workload name (see `ansor workloads`)")
    p.add_argument("--shape", type=_shape, help="the workload's dimensions")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    for opt in ("stride", "padding", "dilation", "groups"):
        p.add_argument(f"--{opt}", type=int, default=None)


def _task_from_args(args):
    from ansor.workloads import make_task

    opts = {k: getattr(args, k) for k in ("stride", "padding", "dilation", "groups")}
    return make_task(args.workload, args.shape, args.dtype, **opts)


def _version() -> str:
    from ansor import __version__

    return f"ansor {__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    from ansor.database import DatabaseError
    from ansor.schedule.state import ScheduleError

    commands = {"tune": cmd_tune, "show": cmd_show, "workloads": cmd_workloads, "sketches": cmd_sketches,
                "sample": cmd_sample, "costmodel": cmd_costmodel, "export": cmd_export, "import": cmd_import}
    try:
        return commands[args.command](args)
    except (KeyError, ValueError, TypeError, DatabaseError, ScheduleError, FileNotFoundError) as exc:
        # bad input from the command line or a bad file: a one-line message, not a traceback
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"ansor: error: {message}", file=sys.stderr)
        return 2


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
    from ansor.codegen import generate_source
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
            body = source[source.index("\nvoid "):]
            console.print(body, markup=False, highlight=False)
    return 0


def cmd_tune(args) -> int:
    import ansor
    from ansor.baselines import time_numpy, time_torch
    from ansor.report import comparison_table, console
    from ansor.workloads import WORKLOADS, workload_options

    opts = {k: getattr(args, k) for k in ("stride", "padding", "dilation", "groups")}
    task = _task_from_args(args)
    if args.trials < 0:
        raise ValueError("--trials must be >= 0")
    db_path = args.database or str(ansor.default_database_path())
    console.print(f"[bold]ansor[/] tuning [cyan]{args.workload}[/] {list(task.outputs[0].shape)} "
                  f"({task.flop / 1e9:.3f} GFLOP) on {task.target.key}; records: {db_path}")
    result = ansor.tune(task, trials=args.trials, database=db_path, seed=args.seed, policy=args.policy,
                        timeout=args.timeout, measures_per_round=args.per_round, progress=not args.quiet,
                        transfer_programs=args.transfer_programs)
    console.print(f"measured {result.trials} programs in {result.seconds:.1f} s "
                  f"({result.errors} errors): search {result.search_seconds:.1f} s, measurement "
                  f"{result.measure_seconds:.1f} s, cost model {result.model_seconds:.1f} s")
    if args.plot and result.curve:
        from ansor.report import plot_curves

        plot_curves({args.policy: result.curve}, args.plot, f"{args.workload} {list(task.outputs[0].shape)}")
        console.print(f"tuning curve saved to {args.plot}")
    kernel = ansor.build(task, database=db_path)
    inputs = task.random_inputs(seed=1)
    out = kernel(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    from ansor.measure import check_outputs

    problem = check_outputs(list(outs), task.reference_outputs(inputs))
    if problem:
        console.print(f"[red]the built kernel disagrees with the reference: {problem}[/]")
        return 1
    rows = [("ansor (best record)", kernel.time(*inputs), "checked against numpy reference"
             + (f"; {', '.join(kernel.constant_inputs)} packed ahead of the calls" if kernel.packs_ahead else ""))]
    if kernel.packs_ahead:
        rows.append(("ansor, packing in every call", kernel.time(*inputs, include_prepack=True), "kernel(...) without bind()"))
    w = WORKLOADS[args.workload]
    if not args.no_baseline:
        if w.numpy_fn is not None:
            t = time_numpy(w.numpy_fn, inputs)
            rows.append(("numpy", t.median, f"spread {t.spread:.0%}"))
        if w.torch_fn is not None:
            t = time_torch(w.torch_fn, workload_options(args.workload, args.shape, **opts), inputs)
            if t is not None:
                rows.append(("PyTorch eager", t.median, f"spread {t.spread:.0%}"))
    console.print(comparison_table(f"{args.workload} {list(task.outputs[0].shape)}", task.flop, rows))
    if args.trials and result.best_cost == math.inf:
        console.print("[yellow]no program ran successfully; the kernel above is the untuned default[/]")
    return 0


def cmd_show(args) -> int:
    import ansor
    from ansor.database import Database
    from ansor.report import console, summary_table

    path = args.database or str(ansor.default_database_path())
    with Database(path) as db:
        rows = [r for r in db.summary() if not args.workload or r["workload_key"].startswith(args.workload)]
        if not rows:
            console.print(f"no records in {path}")
            return 0
        console.print(summary_table(rows))
        if args.schedule:
            for r in rows:
                best = db.best(r["workload_key"], r["target_key"])
                if best:
                    console.print(f"\n[bold]{r['workload_key']}[/] on {r['target_key']}: "
                                  f"{len(best[0].steps)} steps")
                    console.print(_replay_text(r, best[0]), markup=False, highlight=False)
    return 0


def _replay_text(row: dict, record) -> str:
    """The best program's loop nest when its workload can be rebuilt (named workloads), else
    its steps."""
    from ansor.lower.lower import schedule_text
    from ansor.schedule.state import ScheduleError, State
    from ansor.schedule.steps import steps_from_json
    from ansor.workloads import dag_from_description

    dag = dag_from_description(row.get("workload") or {})
    if dag is not None and dag.workload_key == row["workload_key"]:
        try:
            return schedule_text(State.replay(dag, steps_from_json(record.steps)))
        except ScheduleError:
            pass
    return "\n".join(f"  {step}" for step in record.steps)


def cmd_costmodel(args) -> int:
    import ansor
    from ansor.costmodel.dataset import load_dataset
    from ansor.costmodel.model import evaluate_split
    from ansor.database import Database
    from ansor.report import console

    if args.cm_command != "eval":
        raise ValueError("usage: ansor costmodel eval [--database PATH]")
    path = args.database or str(ansor.default_database_path())
    with Database(path) as db:
        data = load_dataset(db, ansor.Target.host().key)
    if len(data.costs) < 10:
        raise ValueError(f"{path} holds only {len(data.costs)} replayable records for this target; tune first")
    metrics = evaluate_split(data.features, data.costs, data.groups, test_fraction=args.test_fraction,
                             seed=args.seed)
    console.print(f"{len(data.costs)} programs of {len(set(data.groups))} workloads from {path} "
                  f"({data.skipped} records could not be replayed)")
    for key, value in metrics.items():
        console.print(f"  {key:30s} {value:.3f}" if isinstance(value, float) else f"  {key:30s} {value}")
    return 0


def cmd_export(args) -> int:
    import ansor
    from ansor.database import Database

    with Database(args.database or ansor.default_database_path()) as db:
        n = db.export_jsonl(args.path)
    print(f"exported {n} records to {args.path}")
    return 0


def cmd_import(args) -> int:
    import ansor
    from ansor.database import Database

    with Database(args.database or ansor.default_database_path()) as db:
        n = db.import_jsonl(args.path)
    print(f"imported {n} new records from {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
