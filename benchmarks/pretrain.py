"""The pretrained cost model: build its corpus, measure how it ranks unseen workloads, ship it.

    # tune a corpus of workloads into a database (resumable: a rerun tops up what is missing)
    python benchmarks/pretrain.py collect --database corpus.db --trials 64 --random 40
    # leave-workloads-out evaluation, and the model that ships (into src/ansor/costmodel/pretrained)
    python benchmarks/pretrain.py train --databases corpus.db models.db --folds 5 --install
    # or: the shipped model's trees kept and more grown on another machine's corpus
    python benchmarks/pretrain.py train --databases corpus.db --continue-shipped --rounds 300 --install
    # rank the records of workloads no model has seen (the suite's 300-trial databases)
    python benchmarks/pretrain.py score --databases tuned300/*.db [--models a.model.json b.model.json]

The corpus: the fused subgraphs of ResNet-18, MobileNet-V2 and a BERT layer (as `ansor tune`
sees them), and operators of every named workload family (`ansor workloads`) at random shapes.
The suite's own shapes are never in it: they are the held-out workloads that `ansor.build` is
judged on.

`train` first scores the model on workloads it has not seen: the workloads are cut into
folds, a model is trained on all folds but one and ranks the programs of the one left out
(pairwise accuracy over pairs whose throughputs differ by more than the 5% noise margin, and
recall of the true top 10 among the predicted top 10). Beside it, a model trained only on the
workload's own records (half of them, scored on the other half) shows what tuning learns
locally. Then it trains on everything and, with --install, writes the model and its
provenance (commit, machine, workloads, programs, the scores above) into the package. With
--continue-shipped the new trees are grown on top of the shipped model's (what it learned from
another machine's corpus stays, and the provenance keeps the earlier one's under
"continued_from"); the held-out scores are then those of this corpus alone, from scratch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import ansor
from ansor.tuning.dataset import Dataset, load_dataset
from ansor.costmodel.metrics import NOISE_MARGIN, pairwise_accuracy, topk_recall
from ansor.costmodel.model import XGBModel, normalized_throughputs
from ansor.store import Database
from ansor.workloads import make_task

sys.path.insert(0, str(Path(__file__).parent))

#: Shallower trees and a slower rate than a tuning job's model (depth 10, eta 0.2): on workloads
#: left out of training they rank better (the settings compared are in BENCHMARKS.md), and the
#: file stays small.
PRETRAIN_PARAMS = {"max_depth": 6, "eta": 0.05}
PRETRAIN_ROUNDS = 600
#: The suite's shapes (benchmarks/suite.py): held out of the corpus.
HELD_OUT = {
    ("matmul", (512, 512, 512)), ("matmul", (1024, 1024, 1024)), ("batch_matmul", (12, 128, 128, 64)),
    ("conv2d", (1, 64, 56, 56, 64, 3, 3)), ("conv2d", (1, 256, 14, 14, 256, 3, 3)),
    ("conv2d", (1, 3, 224, 224, 64, 7, 7)), ("depthwise_conv2d", (1, 128, 56, 56, 3, 3)),
    ("conv2d_transpose", (1, 512, 4, 4, 256, 4, 4)), ("norm2", (1024, 1024)), ("softmax", (1536, 128)),
    ("layer_norm_gelu", (4096, 768)), ("matmul_bias_relu", (512, 512, 512)),
    ("conv2d_bias_relu", (1, 64, 56, 56, 64, 3, 3)),
}


# ----------------------------------------------------------------------------- the corpus

def random_workloads(n: int, seed: int) -> list[tuple[str, tuple, dict]]:
    """`n` distinct operators of the named workload families at random shapes (none of the
    suite's own). Sizes are drawn from wide ranges: a model learns more from many different
    workloads than from many programs of a few (BENCHMARKS.md)."""
    rng = random.Random(seed)
    pick = rng.choice

    def size(lo: int, hi: int, step: int = 16) -> int:
        return rng.randrange(lo, hi + 1, step)

    def chw() -> tuple[int, int]:
        return pick([8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256]), pick([7, 14, 28, 56])

    makers = [
        lambda: ("matmul", (size(32, 1024), size(32, 1024), size(32, 1024)), {}),
        lambda: ("dense", (pick([1, 4, 16, 32, 64, 128]), size(64, 1024), size(64, 1024)), {}),
        lambda: ("batch_matmul", (pick([2, 4, 8, 12, 16]), size(32, 256), size(32, 256), size(16, 128)), {}),
        lambda: ("matmul_bias_relu", (size(32, 512), size(64, 1024), size(64, 768)), {}),
        lambda: ("conv2d", (1, (c := chw())[0], c[1], c[1], pick([16, 32, 64, 96, 128, 256]),
                            k := pick([1, 3, 3, 5]), k), {"padding": k // 2, "stride": pick([1, 1, 2])}),
        lambda: ("conv2d_bias_relu", (1, (c := chw())[0], c[1], c[1], pick([32, 64, 128]), 3, 3), {"padding": 1}),
        lambda: ("depthwise_conv2d", (1, (c := chw())[0], c[1] * pick([1, 2]), c[1] * pick([1, 2]), 3, 3),
                 {"padding": 1, "stride": pick([1, 2])}),
        lambda: ("softmax", (size(64, 4096, 64), size(32, 1024, 32)), {}),
        lambda: ("layer_norm", (size(64, 4096, 64), size(64, 1024, 64)), {}),
        lambda: ("layer_norm_gelu", (size(64, 2048, 64), size(128, 1024, 64)), {}),
        lambda: ("max_pool2d", (1, (c := chw())[0], c[1] * 2, c[1] * 2, pick([2, 3])), {"stride": 2, "padding": 1}),
        lambda: ("norm2", (size(64, 4096, 64), size(64, 1024, 64)), {}),
        lambda: ("conv2d_transpose", (1, pick([32, 64, 128, 256, 512]), hw := pick([4, 7, 8, 14, 16]), hw,
                                      pick([16, 32, 64, 128]), k := pick([2, 3, 4]), k),
                 {"stride": 2, "padding": k // 2 - 1 + k % 2}),
        lambda: ("avg_pool2d", (1, (c := chw())[0], c[1] * 2, c[1] * 2, pick([2, 3])), {"stride": 2}),
        lambda: (pick(["gelu", "relu"]), (size(64, 4096, 64), size(64, 1024, 64)), {}),
    ]
    out, seen = [], set()
    for _ in range(100 * n):  # a draw can repeat a workload: bounded, never an endless loop
        if len(out) == n:
            break
        name, shape, opts = makers[len(out) % len(makers)]()
        if (name, shape) in HELD_OUT or (name, shape, tuple(sorted(opts.items()))) in seen:
            continue
        seen.add((name, shape, tuple(sorted(opts.items()))))
        out.append((name, shape, opts))
    return out


def model_tasks(names: list[str]) -> list[ansor.Task]:
    """The distinct tasks of the named models (`benchmarks/models.py`)."""
    from models import make_model

    from ansor.graph import from_torch
    from ansor.graph.model_tasks import extract_tasks

    tasks = []
    for name in names:
        module, inputs = make_model(name)
        tasks += extract_tasks(from_torch(module.eval(), inputs)).tasks
    return tasks


def cmd_collect(args) -> None:
    tasks = model_tasks(args.models.split(",")) if args.models else []
    tasks += [make_task(name, shape, **opts) for name, shape, opts in random_workloads(args.random, args.seed)]
    with Database(args.database) as db:
        todo = [t for t in tasks if db.count(t.workload_key, t.target.key) < args.trials]
        print(f"{len(tasks)} workloads in the corpus, {len(todo)} with fewer than {args.trials} records")
        if todo:
            # each task tuned on its own, from no other workload's records: the corpus should
            # hold what a fresh search measures, not what a model that already knows picks
            for i, task in enumerate(todo):
                print(f"[{i + 1}/{len(todo)}] {task.name} {[tuple(t.shape) for t in task.inputs]}")
                ansor.tune(task, trials=args.trials, database=db, transfer_programs=0, pretrained=False,
                           seed=args.seed + i, progress=False)


# ----------------------------------------------------------------------------- training

def load_corpus(paths: list[str], target_key: str | None) -> tuple[Dataset, str]:
    """All programs of one target in the databases, as one dataset (workloads keep their key)."""
    data = Dataset()
    for path in paths:
        with Database(path, create=False) as db:
            key = target_key or db.target_keys()[0]
            part = load_dataset(db, key)
        data.features += part.features
        data.costs += part.costs
        data.groups += part.groups
        data.skipped += part.skipped
        target_key = key
    return data, target_key


def fit(data: Dataset, idx, seed: int = 0, pretraining: bool = True, rounds: int = PRETRAIN_ROUNDS,
        base=None) -> XGBModel:
    """A model fit on the programs `idx`: with the pretrained model's settings (`rounds` more
    trees on top of the `base` booster's, if given), or with a tuning job's (`pretraining=False`)."""
    model = (XGBModel(num_warmup_sample=0, seed=seed, params=PRETRAIN_PARAMS, max_rounds=rounds, base=base)
             if pretraining else XGBModel(num_warmup_sample=0, seed=seed))
    model.update([data.features[i] for i in idx], [data.costs[i] for i in idx], [data.groups[i] for i in idx])
    return model


def ranking_scores(pred, true, groups, k: int = 10) -> dict:
    recalls = [topk_recall(pred[sel], true[sel], k)
               for g in sorted(set(groups)) if (sel := np.array([x == g for x in groups])).sum() > k]
    return {"pairwise_accuracy": pairwise_accuracy(pred, true, groups, margin=NOISE_MARGIN),
            "top10_recall": float(np.mean(recalls)) if recalls else float("nan")}


def usable_programs(data: Dataset) -> np.ndarray:
    """Which programs a model can learn from or be scored on: rows of features and a finite cost."""
    return np.array([f.shape[0] > 0 and np.isfinite(c) for f, c in zip(data.features, data.costs)], dtype=bool)


def evaluate(data: Dataset, folds: int, seed: int) -> dict:
    """Leave-workloads-out scores of the pretrained model, and of models trained on each
    held-out workload's own records, on the same test programs."""
    truth = normalized_throughputs(data.costs, data.groups)
    usable = usable_programs(data)
    workloads = sorted(set(data.groups))
    random.Random(seed).shuffle(workloads)
    rng = np.random.default_rng(seed)
    pre_pred, own_pred, test_idx, rows = [], [], [], []
    for f in range(folds):
        held = set(workloads[f::folds])
        train = [i for i in range(len(data.costs)) if usable[i] and data.groups[i] not in held]
        model = fit(data, train, seed)
        for wk in sorted(held):
            idx = np.array([i for i in range(len(data.costs)) if usable[i] and data.groups[i] == wk])
            if idx.size < 20:
                continue
            perm = rng.permutation(idx)
            own_train, test = perm[: idx.size // 2], np.sort(perm[idx.size // 2:])
            own = fit(data, own_train, seed, pretraining=False)
            p = model.predict([data.features[i] for i in test])
            o = own.predict([data.features[i] for i in test])
            pre_pred.append(p)
            own_pred.append(o)
            test_idx.append(test)
            g = [wk] * test.size
            rows.append({"workload": wk, "programs": int(idx.size),
                         "pretrained": ranking_scores(p, truth[test], g),
                         "own_records": ranking_scores(o, truth[test], g)})
        print(f"fold {f + 1}/{folds}: {len(held)} workloads held out, trained on {len(train)} programs")
    test = np.concatenate(test_idx)
    groups = [data.groups[i] for i in test]
    return {"folds": folds, "workloads": rows,
            "pretrained": ranking_scores(np.concatenate(pre_pred), truth[test], groups),
            "own_records": ranking_scores(np.concatenate(own_pred), truth[test], groups)}


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    """The CPU's name, family and model (hypervisors often report a generic name)."""
    fields = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"


def cmd_train(args) -> None:
    from ansor.costmodel.pretrained import load_pretrained, provenance, save_pretrained

    data, target_key = load_corpus(args.databases, args.target)
    n_workloads = len(set(data.groups))
    print(f"{len(data.costs)} programs of {n_workloads} workloads on {target_key} "
          f"({data.skipped} records could not be replayed)")
    scores = evaluate(data, args.folds, args.seed) if args.folds > 1 else None
    if scores is not None:
        for side in ("pretrained", "own_records"):
            s = scores[side]
            print(f"  {side:12s} pairwise accuracy beyond {round(100 * NOISE_MARGIN)}%: "
                  f"{s['pairwise_accuracy']:.3f}, top-10 recall {s['top10_recall']:.3f}")
    start = time.perf_counter()
    usable = np.flatnonzero(usable_programs(data))
    base, earlier = None, None
    if args.continue_shipped:
        shipped, earlier = load_pretrained(ansor.Target.host()), provenance()
        if shipped is None or earlier is None:
            raise SystemExit("--continue-shipped: the package has no pretrained model (and provenance) to continue")
        base = shipped.base
    model = fit(data, usable, args.seed, rounds=args.rounds, base=base)  # its booster holds base's trees too
    print(f"final model: {model.last_fit_info.get('rounds')} rounds in {time.perf_counter() - start:.1f} s")
    info = {"commit": commit(), "date": datetime.date.today().isoformat(), "machine": machine(),
            "target": target_key, "workloads": n_workloads, "programs": len(usable),
            "databases": [Path(p).name for p in args.databases], "params": PRETRAIN_PARAMS,
            "rounds": model.last_fit_info.get("rounds"), "held_out_scores": scores}
    if earlier is not None:
        info["continued_from"] = earlier
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=2) + "\n")
    if args.install:
        path = save_pretrained(model, {k: v for k, v in info.items() if k != "held_out_scores"}
                               | {"held_out_scores": None if scores is None else
                                  {k: scores[k] for k in ("folds", "pretrained", "own_records")}})
        print(f"installed {path} ({path.stat().st_size / 1e6:.1f} MB)")


def cmd_score(args) -> None:
    """How model files rank the records of workloads none of them was trained on (e.g. the
    suite's 300-trial databases): pairwise accuracy beyond the noise margin, overall and per
    workload."""
    from ansor.costmodel.pretrained import model_file
    from ansor.workloads import workload_label

    data, target_key = load_corpus(args.databases, args.target)
    usable = np.flatnonzero(usable_programs(data))
    truth = normalized_throughputs(data.costs, data.groups)[usable]
    groups = np.array([data.groups[i] for i in usable])
    labels = {}
    for path in args.databases:
        with Database(path) as db:
            labels |= {k: workload_label((db.workload(k) or {}).get("description")) for k in db.workload_keys()}
    print(f"{usable.size} programs of {len(set(groups))} workloads on {target_key}")
    for path in args.models or [str(model_file("cpu"))]:
        pred = np.asarray(XGBModel.load(path).predict([data.features[i] for i in usable]))
        per = {labels.get(g, g): pairwise_accuracy(pred[groups == g], truth[groups == g], margin=NOISE_MARGIN)
               for g in sorted(set(groups))}
        overall = pairwise_accuracy(pred, truth, list(groups), margin=NOISE_MARGIN)
        print(f"{path}: pairwise accuracy beyond {round(100 * NOISE_MARGIN)}% {overall:.3f}; "
              + ", ".join(f"{k} {v:.3f}" for k, v in per.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="tune the corpus into a database")
    c.add_argument("--database", default="corpus.db")
    c.add_argument("--trials", type=int, default=64, help="programs per workload (default 64)")
    c.add_argument("--models", default="resnet18,mobilenet_v2,bert_layer",
                   help="models whose subgraphs join the corpus ('' for none)")
    c.add_argument("--random", type=int, default=40, help="operators at random shapes (default 40)")
    c.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train", help="evaluate on held-out workloads, train, install")
    t.add_argument("--databases", nargs="+", required=True)
    t.add_argument("--target", default=None, help="target key (default: each database's first)")
    t.add_argument("--folds", type=int, default=5, help="workload folds for the held-out scores (1: none)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--json", help="write the provenance and scores here too")
    t.add_argument("--install", action="store_true", help="write the model into the package")
    t.add_argument("--rounds", type=int, default=PRETRAIN_ROUNDS,
                   help=f"trees to grow (default {PRETRAIN_ROUNDS}; early stopping may grow fewer)")
    t.add_argument("--continue-shipped", action="store_true",
                   help="grow the trees on top of the model shipped in the package")
    r = sub.add_parser("score", help="rank the records of unseen workloads with model files")
    r.add_argument("--databases", nargs="+", required=True, help="records of workloads outside every corpus")
    r.add_argument("--models", nargs="*", help="model files (default: the shipped one)")
    r.add_argument("--target", default=None, help="target key (default: each database's first)")
    args = parser.parse_args()
    {"collect": cmd_collect, "train": cmd_train, "score": cmd_score}[args.command](args)


if __name__ == "__main__":
    main()
