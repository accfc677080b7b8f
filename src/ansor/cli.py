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


DATABASE_HELP = ("records database: a file (SQLite) or a postgresql:// URL (default: $ANSOR_DB, else ansor.db "
                 "in the user cache directory)")

CLUSTER_HELP = ("build and time the programs on a Ray cluster's nodes (the search stays here): auto, "
                "ray://HOST:PORT or HOST:PORT (default: on this machine; needs pip install 'ansor[cluster]')")

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


def _at_least(minimum: int):
    """An argparse type: an integer of at least `minimum` (a count of trials, rounds or
    programs, a seed), refused while parsing, before anything is opened or created."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {n}")
        return n

    return parse


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _fraction(text: str) -> float:
    """An argparse type: a share strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie strictly between 0 and 1, got {text}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, like every other failure of the command (the usage
    is one --help away); exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (`{self.prog} --help` shows the usage)\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser of the `ansor` command and its subcommands (the documentation's command-line
    reference is generated from it)."""
    from ansor.tuning.options import TuneOptions

    parser = _Parser(prog="ansor", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    tune = sub.add_parser("tune", help="search for a fast kernel of a named workload",
                          description="Tune a named workload, then compare the best kernel with numpy "
                                      "(and PyTorch when installed), measured in the same run.")
    _workload_args(tune)
    tune.add_argument("--trials", type=_at_least(0), default=64,
                      help="programs this run measures, never one the database already holds; the 4 "
                           "fastest are then measured once more to confirm the best (default 64)")
    tune.add_argument("--time-budget", type=_seconds, default=None, metavar="SECONDS",
                      help="stop searching after this many seconds even if --trials are not reached "
                           "(default: no limit)")
    tune.add_argument("--database", help=DATABASE_HELP)
    tune.add_argument("--seed", type=_at_least(0), default=None,
                      help="random seed of the search (default: none, a different search each run)")
    tune.add_argument("--policy", default="sketch.xgb",
                      help="search policy: sketch.xgb (the default: evolution guided by the learned cost "
                           "model), sketch.random (random sampling of the sketches) or basic")
    tune.add_argument("--timeout", type=_seconds, default=10.0,
                      help="seconds before a kernel counts as hung (default 10)")
    tune.add_argument("--per-round", type=_at_least(1), default=64,
                      help="programs measured per round (default 64)")
    tune.add_argument("--transfer-programs", type=_at_least(0), default=TuneOptions.transfer_programs,
                      help="measured programs of the database's other workloads the cost model starts "
                           f"from; 0: learn from this workload alone (default {TuneOptions.transfer_programs})")
    tune.add_argument("--isa", choices=["avx512", "avx2", "generic"], default=None,
                      help="tune for this CPU's instruction set restricted to ISA (default: all it has)")
    tune.add_argument("--cores", type=_at_least(1), default=None,
                      help="tune for this many of the CPU's cores (default: all of them)")
    tune.add_argument("--transfer-from", action="append", default=[], metavar="TARGET_KEY",
                      help="start from the records of another target in the database, e.g. "
                           "cpu-x86_64-avx2-2c (repeatable; default: none)")
    tune.add_argument("--no-pretrained", action="store_true",
                      help="the cost model starts without the package's pretrained model (default: with "
                           "it, unless ANSOR_PRETRAINED=0)")
    tune.add_argument("--no-baseline", action="store_true",
                      help="skip the numpy/PyTorch comparison (default: compare)")
    tune.add_argument("--cluster", metavar="ADDRESS", default=None, help=CLUSTER_HELP)
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

    tm = sub.add_parser("tune-model", help="tune the fused subgraphs of an ONNX or PyTorch model together",
                        description="Import a model (an ONNX file, or a PyTorch model from a Python file or "
                                    "module), cut it into fused subgraphs and tune their distinct "
                                    "tasks under the task scheduler with one cost model. A rerun with the same "
                                    "database resumes: programs already there are never measured again, and "
                                    "--trials more are measured.")
    tm.add_argument("model", help="an .onnx file with static input shapes, or a PyTorch model: a Python file "
                                  "or module, FILE.py[:NAME] or pkg.mod[:NAME], whose NAME (default model) is a "
                                  "function returning (module, example_inputs) or an nn.Module beside "
                                  "example_inputs")
    tm.add_argument("--trials", type=_at_least(0), default=None,
                    help="programs this run measures across the model's tasks, never one the database "
                         "already holds (default 1000; with --time-budget alone, as many as the time allows)")
    tm.add_argument("--time-budget", type=_seconds, default=None, metavar="SECONDS",
                    help="stop searching after this many seconds (default: no limit)")
    tm.add_argument("--scheduler", default="gradient", choices=["gradient", "round-robin"],
                    help="which task gets the next round (default gradient: where the model's estimated "
                         "latency drops most)")
    tm.add_argument("--database", help=DATABASE_HELP)
    tm.add_argument("--seed", type=_at_least(0), default=None, help="random seed of the search (default: none)")
    tm.add_argument("--timeout", type=_seconds, default=10.0,
                    help="seconds before a kernel counts as hung (default 10)")
    tm.add_argument("--cluster", metavar="ADDRESS", default=None, help=CLUSTER_HELP)
    tm.add_argument("--isa", choices=["avx512", "avx2", "generic"], default=None,
                    help="tune for this CPU's instruction set restricted to ISA (default: all it has)")
    tm.add_argument("--cores", type=_at_least(1), default=None,
                    help="tune for this many of the CPU's cores, e.g. what each node of --cluster offers "
                         "(default: all of them)")
    tm.add_argument("--quiet", action="store_true", help="no progress display (default: show it)")
    tm.add_argument("--no-winograd", action="store_true",
                    help="keep 3x3 convolutions direct (default: Winograd form over large images; "
                         "run-model must be told the same)")

    rm = sub.add_parser("run-model", help="run an ONNX model with its tuned kernels, checked and timed",
                        description="Build an ONNX model with the best records of the database (untuned "
                                    "default schedules for the rest), run it on random inputs, check the "
                                    "output against the numpy reference executor and onnxruntime (when "
                                    "installed), and time it in turns with onnxruntime. Exit status 1 when "
                                    "the output disagrees with either.")
    rm.add_argument("model", help="an .onnx file with static input shapes")
    rm.add_argument("--database", help=DATABASE_HELP)
    rm.add_argument("--rounds", type=_at_least(1), default=7,
                    help="timing rounds, in turns with onnxruntime (default 7)")
    rm.add_argument("--profile", action="store_true", help="also print the time of every subgraph (default: off)")
    rm.add_argument("--no-winograd", action="store_true",
                    help="keep 3x3 convolutions direct, as tune-model --no-winograd tuned them (default: "
                         "Winograd form over large images)")
    rm.add_argument("--isa", choices=["avx512", "avx2", "generic"], default=None,
                    help="the records of a model tuned with `ansor tune-model --isa` (default: all the CPU has)")
    rm.add_argument("--cores", type=_at_least(1), default=None,
                    help="the records of a model tuned with `ansor tune-model --cores` (default: all the cores)")

    cp = sub.add_parser("compare", help="ansor beside numpy, PyTorch and onnxruntime: one table, timed in turns",
                        description="Build a named workload's best program (a quick search first when the "
                                    "database has none) or an ONNX model with its database's records, check "
                                    "the output against the reference, and time it in turns with numpy, PyTorch "
                                    "eager, torch.compile and onnxruntime (models) in one process: median times, "
                                    "spreads, GFLOP/s and ansor's speedup. A baseline that is not installed is "
                                    "skipped with a note.")
    cp.add_argument("what", metavar="WORKLOAD|MODEL.onnx|MODEL.py",
                    help="a workload name (see `ansor workloads`), an .onnx model file, or with --dtype "
                         "bfloat16 a PyTorch model (a Python file or module, as run-model takes)")
    cp.add_argument("--shape", type=_shape,
                    help="the workload's dimensions, e.g. 1024,1024,1024 (default: the workload's default shape)")
    cp.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16"],
                    help="element type of a workload (default float32); bfloat16: a PyTorch model run in "
                         "bf16 beside PyTorch eager in bf16 and float32")
    for opt in WORKLOAD_OPTIONS:
        cp.add_argument(f"--{opt}", type=int, default=None,
                        help=f"{opt} of the workloads that take it (default: the workload's own)")
    cp.add_argument("--database", help=DATABASE_HELP)
    cp.add_argument("--rounds", type=_at_least(1), default=7, help="timing rounds, every one timing each implementation "
                                                          "once (default 7)")
    cp.add_argument("--skip", action="append", default=[], metavar="BASELINE",
                    choices=["numpy", "torch", "torch.compile", "onnxruntime"],
                    help="leave out a baseline: numpy, torch, torch.compile or onnxruntime (repeatable; "
                         "default: none)")
    cp.add_argument("-o", "--output", metavar="PNG", help="save a bar chart of the times here (default: no chart)")

    sub.add_parser("workloads", help="list the named workloads and the meaning of --shape",
                   description="The named workloads that tune, sketches, sample, compare and viz take: "
                               "what the numbers of --shape mean, the default shape and the options "
                               "(stride, padding, ...) each one accepts.")

    sk = sub.add_parser("sketches", help="print every sketch (high-level structure) of a workload",
                        description="Derive the sketches of a workload and print each as a loop nest "
                                    "with the rules that produced it ('?' marks undecided tile sizes).")
    _workload_args(sk)
    sa = sub.add_parser("sample", help="print randomly annotated complete programs and their C",
                        description="Derive the sketches of a workload, fill in their tile sizes, compute "
                                    "locations, parallel, vector and unroll choices at random, and print each "
                                    "program as a loop nest and as the C the compiler gets. Nothing is "
                                    "compiled, measured or recorded.")
    _workload_args(sa)
    sa.add_argument("-n", type=_at_least(1), default=3, help="how many programs (default 3)")
    sa.add_argument("--seed", type=_at_least(0), default=0, help="random seed of the sampling (default 0)")
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

    cm = sub.add_parser("costmodel", help="cost-model quality on the records of a database",
                        description="The learned cost model: `eval` scores how well it ranks the programs "
                                    "of a database, `info` says what the pretrained model shipped in the "
                                    "package was trained on.")
    cm_sub = cm.add_subparsers(dest="cm_command", metavar="ACTION")
    ev = cm_sub.add_parser("eval", help="train on a split of the records, report ranking quality on the rest",
                           description="Replays every record of the database for this machine's target, "
                                       "extracts program features, trains the XGBoost cost model on 80% of "
                                       "the programs and reports pairwise ranking accuracy, top-k recall and "
                                       "R^2 on the held-out 20%.")
    cm_sub.add_parser("info", help="what the pretrained model shipped in the package was trained on",
                      description="The provenance of the pretrained cost model shipped in the package: its "
                                  "file, the machine and target it was trained on, its programs and "
                                  "workloads, and its scores on held-out workloads.")
    ev.add_argument("--database", help=DATABASE_HELP)
    ev.add_argument("--test-fraction", type=_fraction, default=0.2,
                    help="share of the programs held out for scoring (default 0.2)")
    ev.add_argument("--seed", type=_at_least(0), default=0,
                    help="random seed of the split and the model (default 0)")

    exp = sub.add_parser("export", help="write records as JSON lines",
                         description="Write every record of a database, with the workloads and targets they "
                                     "belong to, as JSON lines: one self-contained file another machine "
                                     "can `ansor import`. The database is only read.")
    exp.add_argument("path", help="the JSON-lines file to write (replaced if it exists)")
    exp.add_argument("--database", help=DATABASE_HELP)
    imp = sub.add_parser("import", help="read records from JSON lines (skipping ones already present)",
                         description="Add the records of a JSON-lines file written by `ansor export` to a "
                                     "database (created if missing), skipping records it already holds. A "
                                     "file that cannot be read creates nothing.")
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


#: Exit status of a wrong result: ansor's output disagrees with a reference.
EXIT_WRONG_RESULT = 1
#: Exit status of every other failure: bad input, a file that cannot be read or written, a
#: missing device, compiler or optional package, too little memory.
EXIT_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    """Run the `ansor` command on `argv` (default: the process's arguments); returns the exit
    status: 0 on success, 1 for a wrong result, 2 for any other failure, 130 after Ctrl-C (143
    after SIGTERM while tuning). A failure is one line on stderr, never a traceback."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C outside tuning (start-up, a read-only command): no traceback
        print("ansor: interrupted", file=sys.stderr)
        return 130
    except _wrong_result_errors() as exc:
        print(f"ansor: wrong result: {_one_line(exc)}", file=sys.stderr)
        return EXIT_WRONG_RESULT
    except _anticipated_errors() as exc:
        print(f"ansor: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


def _wrong_result_errors() -> tuple[type[BaseException], ...]:
    from ansor.compare import WrongResultError

    return (WrongResultError,)


def _anticipated_errors() -> tuple[type[BaseException], ...]:
    """What a command fails with when its input, its files or this machine do not allow it (a
    bug is none of these, and keeps its traceback)."""
    from ansor.compare import onnx_errors
    from ansor.graph.torch_importer import UnsupportedOperatorError
    from ansor.measure.build import CompilerNotFoundError
    from ansor.measure.errors import DeviceUnavailableError
    from ansor.store import DatabaseError
    from ansor.tuning.cluster import ClusterError

    # ValueError covers ScheduleError, GraphError, ShapeError and ReplayError; OSError every
    # file that cannot be read or written; MemoryError numpy's arrays too large to allocate
    return (ValueError, KeyError, TypeError, OverflowError, OSError, MemoryError, ImportError, DatabaseError,
            DeviceUnavailableError, CompilerNotFoundError, UnsupportedOperatorError, ClusterError, *onnx_errors())


def _one_line(exc: BaseException) -> str:
    """An error as one line: what failed and why, at most MAX_ERROR_CHARS characters."""
    if isinstance(exc, KeyError) and exc.args:
        text = str(exc.args[0])
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}"
    elif isinstance(exc, MemoryError):
        text = f"out of memory: {exc}" if str(exc) else "out of memory"
    elif isinstance(exc, ImportError) and exc.name:
        text = f"{exc}: an optional package is missing (see the optional extras in README.md)"
    else:
        text = str(exc) or type(exc).__name__
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."


MAX_ERROR_CHARS = 600


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(_joined_negative_shapes(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_usage(sys.stderr)
        print("ansor: error: give a command; `ansor --help` lists them", file=sys.stderr)
        return 2
    commands = {"tune": cmd_tune, "show": cmd_show, "workloads": cmd_workloads, "sketches": cmd_sketches,
                "sample": cmd_sample, "costmodel": cmd_costmodel, "export": cmd_export, "import": cmd_import,
                "tune-model": cmd_tune_model, "run-model": cmd_run_model, "viz": cmd_viz}
    commands["compare"] = cmd_compare
    commands["pretrain"] = cmd_pretrain
    database = None
    if args.command in _CREATING:
        import ansor

        database = args.database or str(ansor.default_database_path())
    return _leaving_no_empty_database(commands[args.command], args, database)


#: The commands that create their database when it is missing.
_CREATING = ("tune", "tune-model", "import", "compare")


def _leaving_no_empty_database(command, args, database: str | None) -> int:
    """`command(args)`; when it fails and the database it created holds no record, the database
    and the cost-model files written beside it are removed: a failed command leaves nothing."""
    if database is None or database == ":memory:" or os.path.exists(database):
        return command(args)
    before = set(_costmodel_files(database))
    status = EXIT_ERROR
    try:
        status = command(args)
        return status
    finally:
        if status != 0:
            _remove_if_empty(database, before)


def _costmodel_files(database: str) -> list[str]:
    import glob

    stem, _ = os.path.splitext(database)
    return glob.glob(glob.escape(stem) + ".*.costmodel.json")


def _remove_if_empty(database: str, keep: set[str]) -> None:
    from ansor.store import open_store

    if not os.path.exists(database):
        return
    try:
        with open_store(database, create=False)[0] as store:
            if store.count():
                return
    except Exception:  # noqa: BLE001 - not a database this command can read: not its to remove
        return
    for path in [database, *(database + suffix for suffix in ("-wal", "-shm", "-journal")),
                 *(p for p in _costmodel_files(database) if p not in keep)]:
        if os.path.exists(path):
            os.remove(path)


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
        return 2
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
    from ansor.store import open_store
    from ansor.tuning.options import TuneOptions
    from ansor.workloads import task_label

    task = _task_from_args(args)
    options = TuneOptions(trials=args.trials, time_budget=args.time_budget, timeout=args.timeout, seed=args.seed,
                          policy=args.policy, measures_per_round=args.per_round,
                          transfer_programs=args.transfer_programs, pretrained=False if args.no_pretrained else None,
                          transfer_from=tuple(args.transfer_from), cluster=args.cluster)
    _check_runnable(task, args)
    db_path = args.database or str(ansor.default_database_path())
    console.print(f"[bold]ansor[/] tuning [cyan]{task_label(task)}[/] ({task.flop / 1e9:.3f} GFLOP) on "
                  f"{task.target.key}; records: {db_path}")
    result = None
    with open_store(db_path)[0] as store:
        before = store.count(task.workload_key, task.target.key)
        try:
            with terminate_as_interrupt():
                result = ansor.tune(task, database=store, options=options, progress=not args.quiet)
                return _tune_report(args, task, result, store, before)
        except KeyboardInterrupt as exc:
            partial = getattr(exc, "results", None)
            measured = result.trials if result is not None else (partial[0].trials if partial else 0)
            what = "terminated" if isinstance(exc, Terminated) else "interrupted"
            print(f"ansor: {what}; the {measured} programs this run measured are kept in {db_path} "
                  f"(the same command continues from them)", file=sys.stderr)
            return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def _check_runnable(task, args) -> None:
    """Refuse, before any database is created, a tuning job this machine cannot run: a GPU
    target without its device, no C compiler, or buffers larger than the memory."""
    import numpy as np

    from ansor.backend import backend_for
    from ansor.measure import check_compiler
    from ansor.report import format_bytes
    from ansor.workloads import task_label

    if task.target.is_gpu:
        backend_for(task.target).runner(timeout=args.timeout).close()  # no device: DeviceUnavailableError
    if args.trials:
        check_compiler()
    need = sum(math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in (*task.inputs, *task.outputs))
    have = _physical_memory()
    if have and need > have:
        raise MemoryError(f"the inputs and outputs of {task_label(task)} take {format_bytes(need)}; this "
                          f"machine has {format_bytes(have)}")


def _physical_memory() -> int:
    """Bytes of memory of this machine; 0 when it cannot tell."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 0


def _tune_report(args, task, result, store, records_before: int) -> int:
    """After tuning: the numbers of the run (programs measured, the leaders measured again),
    the best as `ansor show` gives it, then the best kernel built from the database, checked,
    and timed in turns against numpy and PyTorch (`compare.compare_task`)."""
    from ansor.compare import BASELINES, compare_task
    from ansor.report import best_text, console, error_summary
    from ansor.workloads import task_label

    errors = f"; {error_summary(result.error_counts, args.timeout)}" if result.errors else ""
    added = store.count(task.workload_key, task.target.key) - records_before
    again = added - result.trials
    confirmed = f"; the {again} fastest measured again to confirm: {added} records added" if again > 0 else ""
    console.print(f"{result.trials} programs measured in {result.seconds:.1f} s (search {result.search_seconds:.1f} s, "
                  f"measurement {result.measure_seconds:.1f} s, cost model {result.model_seconds:.1f} s){errors}"
                  f"{confirmed}")
    if result.best_cost < math.inf:
        console.print(f"best in the database: {best_text(result)}")
    if args.plot and result.curve:
        from ansor.report import plot_curves

        plot_curves({args.policy: result.curve}, args.plot, task_label(task))
        console.print(f"tuning curve saved to {args.plot}")
    skip = set(BASELINES) if args.no_baseline else {"torch.compile", "onnxruntime"}
    comparison = compare_task(task, store, rounds=7, skip=skip, quick_trials=0)
    console.print(comparison.table())
    console.print(comparison.checked)
    for line in comparison.lines():
        console.print(line, markup=False, highlight=False)
    if args.trials and result.best_cost == math.inf:
        console.print("[yellow]no program ran successfully; the kernel above is the untuned default[/]")
    return 0


def cmd_tune_model(args) -> int:
    import ansor
    from ansor.compare import load_model
    from ansor.graph.model_tasks import extract_tasks
    from ansor.graph.model_tuning import estimated_latency, resume_message, spent_trials, tune_model
    from ansor.interrupts import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, terminate_as_interrupt
    from ansor.measure import check_compiler
    from ansor.report import TuneProgress, console, format_seconds
    from ansor.store import open_store

    target = ansor.Target.host(isa=args.isa, num_cores=args.cores)
    model = extract_tasks(load_model(args.model), target, winograd=not args.no_winograd)
    if args.trials is None and args.time_budget is None:
        args.trials = 1000
    if args.trials != 0:
        check_compiler()
    db_path = args.database or str(ansor.default_database_path())
    console.print(f"[bold]ansor[/] tuning [cyan]{args.model}[/]: {len(model.pieces)} subgraphs, "
                  f"{len(model.tasks)} distinct tasks, {len(model.fallbacks)} on numpy fallback; "
                  f"scheduler {args.scheduler}; on {target.key}; records: {db_path}")
    progress = [] if args.quiet else [TuneProgress(total=args.trials or 0, timeout=args.timeout)]
    try:
        with terminate_as_interrupt(), open_store(db_path)[0] as store:
            before = spent_trials(model, store)
            if before:
                print(f"ansor: resuming: {resume_message(model, before, args.trials)}", file=sys.stderr)
            results = tune_model(model, store, args.trials, scheduler=args.scheduler, seed=args.seed,
                                 timeout=args.timeout, time_budget=args.time_budget, callbacks=progress,
                                 cluster=args.cluster)
            added = spent_trials(model, store) - before
    except KeyboardInterrupt as exc:
        measured = sum(r.trials for r in getattr(exc, "results", None) or [])
        what = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"ansor: {what}; the {measured} programs this run measured are kept in {db_path} "
              f"(the same command continues from them)", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    total = estimated_latency(model, results)
    measured = sum(r.trials for r in results)
    confirmed = f"; the leaders measured again to confirm: {added} records added" if added > measured else ""
    console.print(f"{measured} programs measured{confirmed}; estimated model latency "
                  f"{format_seconds(total) if math.isfinite(total) else 'unknown (a task has no program)'}; "
                  f"`ansor run-model {args.model}{_target_flags(args)}` runs it")
    return 0


def _target_flags(args) -> str:
    """The --isa and --cores a command was given, to repeat in the command it suggests."""
    return "".join(f" --{name} {getattr(args, name)}" for name in ("isa", "cores") if getattr(args, name) is not None)


def cmd_run_model(args) -> int:
    """An ONNX model built with its records, checked against the numpy executor and onnxruntime,
    timed in turns with onnxruntime (`compare.compare_compiled`); exit 1 when the output is wrong."""
    import ansor
    from ansor.compare import compare_compiled, load_model, model_inputs
    from ansor.report import console
    from ansor.store import open_store

    if not str(args.model).endswith(".onnx"):
        raise ValueError(f"{args.model}: run-model takes an .onnx file (it checks against onnxruntime); a "
                         f"PyTorch model runs through ansor.build or torch.compile(backend='ansor')")
    graph = load_model(args.model)
    db_path = args.database or str(ansor.default_database_path())
    with open_store(db_path)[0] as db:  # writable: kernels without records get chosen programs, kept here
        compiled = ansor.build(graph, database=db, winograd=not args.no_winograd,
                               target=ansor.Target.host(isa=args.isa, num_cores=args.cores))
    console.print(compiled.summary())
    result = compare_compiled(args.model, graph, compiled, rounds=args.rounds,
                              skip=("numpy", "torch", "torch.compile"))
    console.print(result.table())
    console.print(result.checked)
    for line in result.lines():
        console.print(line, markup=False, highlight=False)
    if args.profile:
        for name, kind, seconds in compiled.profile(*model_inputs(graph)):
            console.print(f"{seconds * 1e3:9.3f} ms  {kind:8s} {name}")
    return 0


def cmd_compare(args) -> int:
    """A workload or an ONNX model beside numpy/PyTorch/onnxruntime: checked, timed in turns,
    printed as one table (and drawn with -o); exit 1 when ansor's output is wrong."""
    import ansor
    from ansor.compare import compare_model, compare_workload
    from ansor.report import console

    db_path = args.database or str(ansor.default_database_path())
    skip = set(args.skip)
    if args.dtype == "bfloat16":
        result = _compare_bf16(args, db_path, skip)
    elif args.what.endswith(".onnx"):
        given = [f"--{k}" for k in ("shape", *WORKLOAD_OPTIONS) if getattr(args, k) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} describe a named workload; a model's shapes are in its file")
        result = compare_model(args.what, database=db_path, rounds=args.rounds, skip=skip)
    else:
        options = {k: getattr(args, k) for k in WORKLOAD_OPTIONS}
        result = compare_workload(args.what, args.shape, args.dtype, options, database=db_path,
                                  rounds=args.rounds, skip=skip)
    console.print(result.table())
    console.print(f"{result.checked}; records: {db_path}")
    for line in result.lines():
        console.print(line, markup=False, highlight=False)
    if args.output:
        result.save_chart(args.output)
        console.print(f"bar chart saved to {args.output}")
    return 0


def _compare_bf16(args, db_path: str, skip: set):
    """`ansor compare MODEL --dtype bfloat16`: the PyTorch model named by MODEL in bf16."""
    from ansor.compare import compare_bf16_model, torch_model_and_inputs

    if args.what.endswith(".onnx"):
        raise ValueError("--dtype bfloat16 takes a PyTorch model (a Python file or module), not an .onnx file")
    module, inputs = torch_model_and_inputs(args.what)
    return compare_bf16_model(module, inputs, database=db_path, rounds=args.rounds, skip=skip, name=args.what)


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
                return EXIT_ERROR
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
            print("ansor: error: no pretrained model in this installation", file=sys.stderr)
            return EXIT_ERROR
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

    if os.path.isdir(args.path):
        raise IsADirectoryError(f"{args.path}: a directory, not a JSON-lines file")
    with open(args.path, "rb"):  # a missing or unreadable file fails here, before a database is created
        pass
    with open_store(args.database or ansor.default_database_path())[0] as db:
        n = db.import_jsonl(args.path)
    print(f"imported {n} new records from {args.path}")
    return 0


def cmd_pretrain(args) -> int:
    from ansor.pretrain.command import run_pretrain
    from ansor.report import TuneProgress
    from ansor.store import open_store

    return run_pretrain(args, open_store, progress=TuneProgress)


if __name__ == "__main__":
    sys.exit(main())
