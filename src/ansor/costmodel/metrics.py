"""How well a cost model ranks programs: the measures a tuner cares about (does it order
pairs of programs right, does it find the fastest ones), and a train/test split that reports
them for an `XGBModel` on measured programs.

Kept apart from the models: the search never scores its own rankings, while the CLI, the
pretraining and the benchmarks do.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ansor.costmodel.model import XGBModel, _pack, normalized_throughputs

__all__ = [
    "NOISE_MARGIN",
    "pairwise_accuracy",
    "topk_recall",
    "r2_score",
    "evaluate_split",
]


def pairwise_accuracy(pred: Sequence[float], true: Sequence[float], groups: Sequence[str] | None = None,
                      margin: float = 0.0) -> float:
    """Fraction of program pairs whose order the prediction gets right.

    Pairs tied in ``true`` are ignored; pairs tied in ``pred`` count as half right,
    so a constant predictor scores 0.5 like a random one. With ``groups``, only
    pairs from the same group are compared. With ``margin``, only pairs whose true
    values differ by more than that fraction are (``0.05``: the faster is more than
    5% faster): a tuner's records crowd near the best, where the order of two
    programs within the measurement noise is itself a coin flip. Returns NaN when
    there is no pair.
    """
    right, total = _ordered_pairs(pred, true, groups, margin)
    return right / total if total else float("nan")


def _ordered_pairs(pred: Sequence[float], true: Sequence[float], groups: Sequence[str] | None,
                   margin: float) -> tuple[float, int]:
    """(pairs ordered right by ``pred``, ties half, and pairs counted) over the same-group
    pairs whose faster member is more than ``margin`` faster in ``true``."""
    p = np.asarray(pred, dtype=np.float64).reshape(-1)
    t = np.asarray(true, dtype=np.float64).reshape(-1)
    if p.size != t.size:
        raise ValueError("pred and true must have the same length")
    g = None
    if groups is not None:
        _, g = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    right = 0.0
    total = 0
    block = max(1, 4_000_000 // max(1, p.size))  # bounds the pair matrices to ~4M entries
    for s in range(0, p.size, block):
        ti, pi = t[s : s + block, None], p[s : s + block, None]
        mask = ti > t[None, :] * (1.0 + margin)  # each untied pair once: i is the truly faster one
        if g is not None:
            mask &= g[s : s + block, None] == g[None, :]
        total += int(mask.sum())
        right += float((mask & (pi > p[None, :])).sum()) + 0.5 * float((mask & (pi == p[None, :])).sum())
    return right, total


#: Relative difference below which two measured programs count as equally fast when
#: judging a model's ranking: repeated measurements of one program spread by less than this
#: (BENCHMARKS.md), so a closer pair's true order is itself a coin flip.
NOISE_MARGIN = 0.05


def _share_of_close_pairs(true: Sequence[float], groups: Sequence[str], margin: float) -> float:
    """Share of the untied same-group pairs whose true values differ by at most ``margin``."""
    _, untied = _ordered_pairs(true, true, groups, 0.0)
    _, apart = _ordered_pairs(true, true, groups, margin)
    return 1.0 - apart / untied if untied else float("nan")


def topk_recall(pred: Sequence[float], true: Sequence[float], k: int) -> float:
    """``|true top-k ∩ predicted top-k| / k``: does the model find the fastest programs?

    ``k`` is clipped to the number of programs; ties are broken by position.
    """
    p = np.asarray(pred, dtype=np.float64).reshape(-1)
    t = np.asarray(true, dtype=np.float64).reshape(-1)
    if p.size != t.size:
        raise ValueError("pred and true must have the same length")
    k = min(int(k), p.size)
    if k <= 0:
        return float("nan")
    top_p = np.argsort(-p, kind="stable")[:k]
    top_t = np.argsort(-t, kind="stable")[:k]
    return np.intersect1d(top_p, top_t).size / k


def r2_score(pred: Sequence[float], true: Sequence[float]) -> float:
    """Coefficient of determination of ``pred`` against ``true``.

    A constant ``true`` gives 1.0 for a perfect prediction and 0.0 otherwise.
    """
    p = np.asarray(pred, dtype=np.float64).reshape(-1)
    t = np.asarray(true, dtype=np.float64).reshape(-1)
    if p.size != t.size:
        raise ValueError("pred and true must have the same length")
    if t.size == 0:
        return float("nan")
    ss_res = float(np.sum(np.square(t - p)))
    ss_tot = float(np.sum(np.square(t - t.mean())))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def evaluate_split(
    features: Sequence[np.ndarray],
    costs: Sequence[float],
    groups: Sequence[str],
    test_fraction: float = 0.2,
    seed: int = 0,
    k: int = 10,
    model_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Train an :class:`XGBModel` on a random part of the programs and score the rest.

    Truth is the normalized throughput over the whole data set. Programs without
    usable features are left out (the model cannot score them). Pairwise accuracy
    and top-k recall are taken within groups, since only programs of the same task
    compete with each other; top-k recall is averaged over groups with more than
    ``k`` held-out programs; R² is over all held-out programs.
    """
    if not (len(features) == len(costs) == len(groups)):
        raise ValueError("features, costs and groups must have the same length")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError("test_fraction must be in (0, 1)")
    y = normalized_throughputs(costs, groups)
    _, _, valid, _ = _pack(features, None)
    idx = np.flatnonzero(valid)
    perm = np.random.default_rng(seed).permutation(idx)
    n_test = max(1, int(round(test_fraction * perm.size)))
    if perm.size - n_test < 1:
        raise ValueError("need at least two programs with usable features")
    test, train = np.sort(perm[:n_test]), np.sort(perm[n_test:])

    kwargs = {"num_warmup_sample": 0, "seed": seed, **(model_kwargs or {})}
    model = XGBModel(**kwargs)
    start = time.perf_counter()
    model.update([features[i] for i in train], [costs[i] for i in train], [groups[i] for i in train])
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    pred = model.predict([features[i] for i in test])
    predict_seconds = time.perf_counter() - start

    true = y[test]
    test_groups = [str(groups[i]) for i in test]
    recalls = []
    for g in sorted(set(test_groups)):
        sel = np.array([tg == g for tg in test_groups])
        if sel.sum() > k:
            recalls.append(topk_recall(pred[sel], true[sel], k))
    return {
        "n_train": int(train.size),
        "n_test": int(test.size),
        "n_groups": len(set(str(g) for g in groups)),
        "n_unusable": int(valid.size - idx.size),
        "pairwise_accuracy": pairwise_accuracy(pred, true, test_groups),
        f"pairwise_accuracy_beyond_{round(100 * NOISE_MARGIN)}pct": pairwise_accuracy(pred, true, test_groups,
                                                                                  margin=NOISE_MARGIN),
        f"pairs_within_{round(100 * NOISE_MARGIN)}pct": _share_of_close_pairs(true, test_groups, NOISE_MARGIN),
        "topk_recall": float(np.mean(recalls)) if recalls else float("nan"),
        "k": int(k),
        "r2": r2_score(pred, true),
        "rounds": model.last_fit_info.get("rounds", 0),
        "train_seconds": train_seconds,
        "predict_seconds": predict_seconds,
    }
