"""`ansor pretrain collect|train|score`: the command line of the pretraining steps.

The `ansor` command adds this parser with `add_pretrain_parser` and runs `run_pretrain`; the
progress display is the command line's to choose and is handed in, since this package draws
nothing itself. Nothing heavy is imported until a step runs, so building the parser stays
quick.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from typing import Any, Callable

from ansor.pretrain.corpus import DEFAULT_MODELS

EXAMPLES = """\
examples:
  # tune a corpus of workloads into a database (resumable: a rerun tops up what is missing)
  ansor pretrain collect --database corpus.db --trials 64 --random 40
  # leave-workloads-out evaluation, and the model that ships (into ansor/costmodel/pretrained)
  ansor pretrain train --databases corpus.db models.db --folds 5 --install
  # or: the shipped model's trees kept and more grown on another machine's corpus
  ansor pretrain train --databases corpus.db --continue-shipped --rounds 300 --install
  # the CUDA model, from the records of a lent GPU's runs (held out: one workload per fold)
  ansor pretrain train --records gpu_records.jsonl gpu_tc.jsonl --target cuda-sm_90 --folds 2 \
      --device "NVIDIA H100 80GB HBM3" --install
  # rank the records of workloads no model has seen (the suite's 300-trial databases)
  ansor pretrain score --databases tuned300/*.db --models a.model.json b.model.json
"""


def add_pretrain_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `pretrain` and its three steps to the subcommands `sub` of a parser."""
    from ansor.pretrain.train import PRETRAIN_ROUNDS

    parser = sub.add_parser(
        "pretrain", help="build the pretrained cost model: collect a corpus, train, score",
        description="Build the cost model that ships with the package: tune a corpus of workloads "
                    "(subgraphs of reference models and operators at random shapes, never the "
                    "benchmark suite's shapes), judge the model on workloads left out of its "
                    "training, train it on everything and install it; score model files on the "
                    "records of unseen workloads.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="pretrain_command", metavar="STEP", required=True)

    c = steps.add_parser("collect", help="tune the corpus into a database (a rerun tops up what is missing)",
                         description="Tune every workload of the corpus (the reference models' subgraphs and "
                                     "operators at random shapes) into a database; a workload with fewer "
                                     "records than --trials is tuned again, so a rerun resumes.")
    c.add_argument("--database", default="corpus.db", help="the corpus database (default corpus.db)")
    c.add_argument("--trials", type=int, default=64,
                   help="programs per workload; workloads with fewer records are tuned (default 64)")
    c.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="reference models whose subgraphs join the corpus, comma-separated ('' for none; "
                        f"default {','.join(DEFAULT_MODELS)}; needs the models extra)")
    c.add_argument("--random", type=int, default=40, help="operators at random shapes (default 40)")
    c.add_argument("--seed", type=int, default=0, help="seed of the random shapes and the searches (default 0)")
    c.add_argument("--quiet", action="store_true",
                   help="no progress display, a line per workload only (default: the display)")

    t = steps.add_parser("train", help="score on held-out workloads, train on all, install",
                         description="Judge the model on workloads left out of its training (folds of "
                                     "workloads), then train it on every program and write it where asked.")
    t.add_argument("--databases", nargs="+", default=[],
                   help="databases of measured corpus programs (default: none; these or --records)")
    t.add_argument("--records", nargs="+", default=[],
                   help="JSON-lines record files (`ansor export`, a lent GPU's run) read into memory "
                        "beside the databases, each named with its count in the provenance (default: none)")
    t.add_argument("--device", default=None,
                   help="the device the records were measured on, for the provenance (default: this "
                        "machine's CPU; name the GPU for GPU records)")
    t.add_argument("--target", default=None, help="target key (default: the first database's first target)")
    t.add_argument("--folds", type=int, default=5, help="workload folds for the held-out scores (1: none; default 5)")
    t.add_argument("--seed", type=int, default=0, help="seed of the folds and the models (default 0)")
    t.add_argument("--json", help="write the provenance and the per-workload scores to this file too (default: none)")
    t.add_argument("--output", help="write the trained model to this file, what `score --models` reads "
                                    "(default: none)")
    t.add_argument("--install", action="store_true",
                   help="write the model and its provenance into the package (default: not installed)")
    t.add_argument("--rounds", type=int, default=PRETRAIN_ROUNDS,
                   help=f"trees to grow (default {PRETRAIN_ROUNDS}; early stopping may grow fewer)")
    t.add_argument("--continue-shipped", action="store_true",
                   help="grow the trees on top of the model shipped in the package (default: a new model)")

    r = steps.add_parser("score", help="rank the records of unseen workloads with model files",
                         description="Pairwise ranking accuracy of model files on records of workloads none "
                                     "of them was trained on, overall and per workload.")
    r.add_argument("--databases", nargs="+", required=True,
                   help="records of workloads outside every corpus (default: none, required)")
    r.add_argument("--models", nargs="*", help="model files (default: the shipped one)")
    r.add_argument("--target", default=None, help="target key (default: the first database's first target)")
    return parser


def run_pretrain(args: argparse.Namespace, open_store: Callable[..., Any],
                 progress: Callable[..., Any] | None = None) -> int:
    """Run the step `args` names; returns the exit status. `open_store(path, create=...)` opens
    a record store (the command line's, which owns storage); `progress(total=trials)` makes a
    progress display (a `TuningCallback`) for the tuning jobs of `collect`, unless --quiet."""
    if args.pretrain_command == "collect":
        return _collect(args, open_store, progress)
    if args.pretrain_command == "train" and (args.folds < 1 or args.rounds < 1):
        raise ValueError("--folds and --rounds must be at least 1")
    with ExitStack() as stack:
        stores = [stack.enter_context(open_store(path, create=False)[0]) for path in args.databases]
        if args.pretrain_command == "train":
            from ansor.pretrain.train import train

            record_files = getattr(args, "records", [])
            if not stores and not record_files:
                raise ValueError("train: give --databases or --records")
            if record_files:
                memory = stack.enter_context(open_store(":memory:")[0])
                counts = [(path, memory.import_jsonl(path)) for path in record_files]
                stores.append(memory)
            train(stores, args.target, folds=args.folds, seed=args.seed, rounds=args.rounds,
                  continue_shipped=args.continue_shipped, install=args.install, output=args.output,
                  json_path=args.json, device=args.device,
                  record_files=counts if record_files else ())
            return 0
        from ansor.pretrain.score import score

        score(stores, args.models or (), args.target)
    return 0


def _collect(args: argparse.Namespace, open_store: Callable[..., Any], progress: Callable[..., Any] | None) -> int:
    from ansor.interrupts import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, terminate_as_interrupt
    from ansor.pretrain.collect import collect
    from ansor.pretrain.corpus import corpus_tasks

    if args.trials < 1 or args.random < 0:
        raise ValueError("--trials must be at least 1 and --random at least 0")
    models = [m for m in args.models.split(",") if m]
    try:
        tasks = corpus_tasks(models, args.random, args.seed)
    except ImportError as exc:
        raise ValueError(f"--models needs torch and transformers (pip install 'ansor[models]'), or give "
                         f"--models '' ({exc})") from None
    callbacks = [] if args.quiet or progress is None else [progress(total=args.trials)]
    store, _ = open_store(args.database)
    try:
        with terminate_as_interrupt(), store:
            collect(tasks, store, args.trials, args.seed, callbacks)
    except KeyboardInterrupt as exc:
        what = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"ansor: {what}; every program measured so far is kept in {args.database} "
              f"(the same command continues from them)", file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED
    return 0
