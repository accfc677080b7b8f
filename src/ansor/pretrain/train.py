"""Train the pretrained model: first judge it on workloads it has not seen, then fit it on
the whole corpus and write it (into the package, or a file) with its provenance.

The held-out judgement: the corpus's workloads are cut into folds, a model is trained on all
folds but one and ranks the programs of the one left out (pairwise accuracy over pairs whose
throughputs differ by more than the noise margin, and recall of the true top 10 among the
predicted top 10). Beside it, a model trained only on half of each held-out workload's own
records, scored on the other half, shows what tuning learns locally.
"""

from __future__ import annotations

import datetime
import json
import platform
import random
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ansor.costmodel.metrics import NOISE_MARGIN, pairwise_accuracy, topk_recall
from ansor.costmodel.model import XGBModel, normalized_throughputs
from ansor.pretrain.corpus import load_corpus, usable_programs
from ansor.records import RecordStore
from ansor.target import Target
from ansor.tuning.dataset import Dataset

#: Shallower trees and a slower rate than a tuning job's model (depth 10, eta 0.2): on workloads
#: left out of training they rank better (the settings compared are in BENCHMARKS.md), and the
#: file stays small.
PRETRAIN_PARAMS = {"max_depth": 6, "eta": 0.05}
PRETRAIN_ROUNDS = 600
#: A held-out workload with fewer usable programs is not scored: half of them train its own
#: model and half are ranked, and a few programs give no ranking worth the name.
MIN_SCORED_PROGRAMS = 20


def fit(data: Dataset, idx: Sequence[int], seed: int = 0, pretraining: bool = True,
        rounds: int = PRETRAIN_ROUNDS, base: Any = None) -> XGBModel:
    """A model fit on the programs `idx`: with the pretrained model's settings (`rounds` more
    trees on top of the `base` booster's, if given), or with a tuning job's (`pretraining=False`)."""
    model = (XGBModel(num_warmup_sample=0, seed=seed, params=PRETRAIN_PARAMS, max_rounds=rounds, base=base)
             if pretraining else XGBModel(num_warmup_sample=0, seed=seed))
    model.update([data.features[i] for i in idx], [data.costs[i] for i in idx], [data.groups[i] for i in idx])
    return model


def ranking_scores(pred: np.ndarray, true: np.ndarray, groups: Sequence[str], k: int = 10) -> dict[str, float]:
    """Pairwise accuracy beyond the noise margin (pairs of one group) and the mean top-k
    recall of the groups with more than k programs."""
    recalls = [topk_recall(pred[sel], true[sel], k)
               for g in sorted(set(groups)) if (sel := np.array([x == g for x in groups])).sum() > k]
    return {"pairwise_accuracy": pairwise_accuracy(pred, true, groups, margin=NOISE_MARGIN),
            "top10_recall": float(np.mean(recalls)) if recalls else float("nan")}


def held_out_scores(data: Dataset, folds: int, seed: int, log: Callable[[str], None] = print,
                    min_programs: int = MIN_SCORED_PROGRAMS) -> dict[str, Any] | None:
    """Leave-workloads-out scores of the pretraining settings, and of models trained on each
    held-out workload's own records, on the same test programs: overall, and per workload of
    at least `min_programs` usable programs (None when there is no such workload)."""
    truth = normalized_throughputs(data.costs, data.groups)
    usable = usable_programs(data)
    workloads = sorted(set(data.groups))
    random.Random(seed).shuffle(workloads)
    rng = np.random.default_rng(seed)
    pre_pred, own_pred, test_idx, rows = [], [], [], []
    for f in range(folds):
        held = set(workloads[f::folds])
        train = [i for i in range(len(data.costs)) if usable[i] and data.groups[i] not in held]
        if not train:
            log(f"fold {f + 1}/{folds}: no usable program outside the {len(held)} held-out workloads; skipped")
            continue
        model = fit(data, train, seed)
        for wk in sorted(held):
            idx = np.array([i for i in range(len(data.costs)) if usable[i] and data.groups[i] == wk])
            if idx.size < min_programs:
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
        log(f"fold {f + 1}/{folds}: {len(held)} workloads held out, trained on {len(train)} programs")
    if not test_idx:
        log(f"no held-out workload has {min_programs} usable programs: no held-out scores")
        return None
    test = np.concatenate(test_idx)
    groups = [data.groups[i] for i in test]
    return {"folds": folds, "workloads": rows,
            "pretrained": ranking_scores(np.concatenate(pre_pred), truth[test], groups),
            "own_records": ranking_scores(np.concatenate(own_pred), truth[test], groups)}


def target_kind(target_key: str) -> str:
    """The kind of target a key names (`cpu-...`, `cuda-sm_90`, `opencl-...`): which shipped
    model file its records train."""
    kind = target_key.split("-", 1)[0]
    if kind not in ("cpu", "cuda", "opencl"):
        raise ValueError(f"target key {target_key!r} names no known target kind (cpu, cuda, opencl)")
    return kind


def _kind_target(kind: str) -> Target:
    return Target.cuda() if kind == "cuda" else Target.opencl()


def untrained_scores(data: Dataset, scores: dict[str, Any]) -> dict[str, float]:
    """The held-out programs ranked by the model a job has without a pretrained one (an
    XGBModel before its first fit scores at random): the floor the held-out scores are read
    against."""
    truth = normalized_throughputs(data.costs, data.groups)
    usable = usable_programs(data)
    held = {row["workload"] for row in scores["workloads"]}
    idx = np.array([i for i in range(len(data.costs)) if usable[i] and data.groups[i] in held])
    pred = XGBModel(seed=0).predict([data.features[i] for i in idx])  # untrusted: random scores
    return ranking_scores(np.asarray(pred, dtype=float), truth[idx], [data.groups[i] for i in idx])


def commit() -> str:
    """The source tree's commit (short hash), or "unknown" outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    """The CPU's name, family and model (hypervisors often report a generic name, so the
    family and model are what tell two machines apart)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"


def train(databases: Sequence[RecordStore], target_key: str | None = None, folds: int = 5, seed: int = 0,
          rounds: int = PRETRAIN_ROUNDS, continue_shipped: bool = False, install: bool = False,
          output: str | None = None, json_path: str | None = None, device: str | None = None,
          record_files: Sequence[tuple[str, int]] = (),
          log: Callable[[str], None] = print) -> tuple[XGBModel, dict[str, Any]]:
    """Score the settings on held-out workloads (`folds` > 1), fit a model on every usable
    program of the databases, and write it where asked; returns the model and its provenance.

    Args:
        databases: Record stores of measured corpus programs (only read).
        target_key: The target whose records are used (default: the first database's first).
        folds: Workload folds of the held-out scores; 1 for none.
        seed: Seed of the folds, the test halves and the models.
        rounds: Trees to grow (early stopping may grow fewer).
        continue_shipped: Grow the trees on top of the package's model: what it learned from
            another machine's corpus stays, and the provenance keeps the earlier one's under
            "continued_from" (the held-out scores are this corpus's alone, from scratch).
        install: Write the model and its provenance into the package.
        output: Write the model file here as well (`XGBModel.load` reads it).
        json_path: Write the provenance, with the per-workload held-out scores, here.
        device: Where the programs were measured (default: this machine's CPU): the GPU's
            name for GPU records, which were measured elsewhere.
        record_files: (file, records read) of JSON-lines files among the databases, named in
            the provenance.
        log: Gets the progress lines.

    Raises:
        ValueError: `continue_shipped` without a shipped model, or no usable program.
    """
    from ansor.costmodel.pretrained import load_pretrained, provenance, save_pretrained

    data, target = load_corpus(databases, target_key)
    n_workloads = len(set(data.groups))
    log(f"{len(data.costs)} programs of {n_workloads} workloads on {target} "
        f"({data.skipped} records could not be replayed)")
    usable = np.flatnonzero(usable_programs(data))
    if usable.size == 0:
        raise ValueError("the databases hold no usable program (measured, with features) of " + target)
    scores = held_out_scores(data, folds, seed, log) if folds > 1 else None
    if scores is not None:
        for side in ("pretrained", "own_records"):
            s = scores[side]
            log(f"  {side:12s} pairwise accuracy beyond {round(100 * NOISE_MARGIN)}%: "
                f"{s['pairwise_accuracy']:.3f}, top-10 recall {s['top10_recall']:.3f}")
    start = time.perf_counter()
    base, earlier = None, None
    kind = target_kind(target)
    if continue_shipped:
        shipped, earlier = load_pretrained(Target.host() if kind == "cpu" else _kind_target(kind)), provenance(kind)
        if shipped is None or earlier is None:
            raise ValueError("--continue-shipped: the package has no pretrained model (and provenance) to continue")
        base = shipped.base
    model = fit(data, usable, seed, rounds=rounds, base=base)  # its booster holds base's trees too
    log(f"final model: {model.last_fit_info.get('rounds')} rounds in {time.perf_counter() - start:.1f} s")
    info: dict[str, Any] = {
        "commit": commit(), "date": datetime.date.today().isoformat(), "machine": device or machine(),
        "target": target, "workloads": n_workloads, "programs": int(usable.size),
        "databases": [Path(str(store.path)).name for store in databases if str(store.path) != ":memory:"],
        "params": PRETRAIN_PARAMS, "rounds": model.last_fit_info.get("rounds"), "held_out_scores": scores}
    if record_files:
        info["record_files"] = [{"file": Path(path).name, "records": count} for path, count in record_files]
    if scores is not None and kind != "cpu":
        info["held_out_scores"]["untrained"] = untrained_scores(data, scores)
    if earlier is not None:
        info["continued_from"] = earlier
    if json_path:
        Path(json_path).write_text(json.dumps(info, indent=2) + "\n")
    if output:
        model.save(output)
        log(f"wrote {output} ({Path(output).stat().st_size / 1e6:.1f} MB)")
    if install:
        summary = None if scores is None else {k: v for k, v in scores.items() if k != "workloads"}
        if scores is not None and kind != "cpu":  # a few workloads: each one's held-out scores are the evidence
            summary["workloads"] = scores["workloads"]
        path = save_pretrained(model, info | {"held_out_scores": summary}, kind)
        log(f"installed {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return model, info
