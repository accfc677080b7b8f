"""Learned cost models that rank candidate programs by predicted throughput.

A program is described by a float matrix with one row per stored buffer (see
``ansor.costmodel.features``); models here only consume such matrices, so they
can be trained on features produced by any extractor with a fixed row width.

``XGBModel`` follows the reference auto-scheduler model:

* labels are *normalized throughputs*: per group (workload + target), the best
  cost in the group divided by the program's cost, so tasks with very different
  absolute run times share one scale in ``(0, 1]``; failed programs get 0;
* every row of a program inherits the program's label, and the program's score
  is the **sum** of its rows' predictions ("pack-sum"), which lets a program with
  more stages accumulate more predicted cost terms;
* trees are fit with a custom objective: weighted squared error on the pack-sum,
  with the label itself as weight so that fast programs (the ones the search
  cares about) are fit more accurately than slow ones.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ansor.measure.errors import FAILED_COST

__all__ = [
    "CostModel",
    "RandomModel",
    "XGBModel",
    "FAILED_COST",
    "FOREIGN_FAILURE_COST",
    "WEIGHT_FLOOR",
    "is_failed_cost",
    "normalized_throughputs",
]

#: Costs at or above this also mark a failed build/run: logs written by other tools (TVM's
#: among them) record a failure as a cost of 1e10 seconds rather than as ansor's FAILED_COST.
FOREIGN_FAILURE_COST = 1e9

#: Minimum sample weight of a program. Weights are the labels themselves (fast programs
#: matter most), so without a floor failed programs (label 0) would carry no information.
#: The reference's near-zero floor also lets the model ignore most slow programs, whose order
#: still guides the search away from them; this floor ranks programs better for the same
#: top-10 recall (BENCHMARKS.md).
WEIGHT_FLOOR = 0.3

_SAVE_FORMAT = "ansor.costmodel.XGBModel"
_SAVE_VERSION = 1


# --------------------------------------------------------------------------- helpers


def is_failed_cost(cost: float) -> bool:
    """True for costs that stand for a failed build or run."""
    return not (math.isfinite(cost) and 0.0 < cost < FOREIGN_FAILURE_COST)


def normalized_throughputs(costs: Sequence[float], groups: Sequence[str]) -> np.ndarray:
    """Per-group normalized throughput ``min_cost_in_group / cost`` (failed programs → 0).

    Normalizing per group puts tasks whose absolute run times differ by orders of
    magnitude onto one ``(0, 1]`` scale, so one model can learn from all of them.
    """
    c = np.asarray(costs, dtype=np.float64).reshape(-1)
    if len(groups) != c.size:
        raise ValueError(f"got {c.size} costs but {len(groups)} groups")
    ok = np.isfinite(c) & (c > 0.0) & (c < FOREIGN_FAILURE_COST)
    _, gid = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    best = np.full(gid.max() + 1 if gid.size else 0, np.inf)
    np.minimum.at(best, gid[ok], c[ok])
    y = np.zeros_like(c)
    y[ok] = best[gid[ok]] / c[ok]
    return y


def _as_matrix(f: np.ndarray, n_features: int | None) -> np.ndarray:
    """One program's features as a 2-D float32 matrix (an empty input becomes 0 rows)."""
    a = np.asarray(f, dtype=np.float32)
    if a.size == 0:
        return a.reshape(0, n_features if n_features is not None else (a.shape[-1] if a.ndim == 2 else 0))
    if a.ndim == 1:
        a = a.reshape(1, -1)
    if a.ndim != 2:
        raise ValueError(f"program features must be 2-D (rows, features), got shape {a.shape}")
    if n_features is not None and a.shape[1] != n_features:
        raise ValueError(f"expected {n_features} features per row, got {a.shape[1]}")
    return a


def _pack(
    features: Sequence[np.ndarray], n_features: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int | None]:
    """Stack programs into one row matrix.

    Returns ``(rows, pack_ids, valid, n_features)``: ``pack_ids[r]`` is the program of
    row ``r`` and ``valid[p]`` tells whether program ``p`` has usable features. A
    program with no rows, or only all-zero rows, is what a failed feature extraction
    produces; its rows are dropped.
    """
    mats = []
    for f in features:
        m = _as_matrix(f, n_features)
        if n_features is None and m.shape[0] > 0:
            n_features = m.shape[1]
        mats.append(m)
    width = n_features if n_features is not None else 0
    mats = [m if m.shape[0] else m.reshape(0, width) for m in mats]
    n_rows = np.fromiter((m.shape[0] for m in mats), dtype=np.int64, count=len(mats))
    if n_rows.sum() == 0:
        return np.zeros((0, width), np.float32), np.zeros(0, np.int64), np.zeros(len(mats), bool), n_features
    rows = np.concatenate(mats, axis=0)
    pack_ids = np.repeat(np.arange(len(mats), dtype=np.int64), n_rows)
    nonzero = rows.any(axis=1)
    valid = np.bincount(pack_ids, weights=nonzero, minlength=len(mats)) > 0
    keep = valid[pack_ids]
    if not keep.all():
        rows, pack_ids = rows[keep], pack_ids[keep]
    return rows, pack_ids, valid, n_features


def _pack_sum(row_preds: np.ndarray, pack_ids: np.ndarray, n_programs: int) -> np.ndarray:
    """Program score = sum of its rows' predictions."""
    return np.bincount(pack_ids, weights=row_preds, minlength=n_programs)


# --------------------------------------------------------------------------- models


class CostModel(ABC):
    """Scores programs so that a higher score means a faster program."""

    @abstractmethod
    def update(self, features: Sequence[np.ndarray], costs: Sequence[float], groups: Sequence[str]) -> None:
        """Add measured programs (``features[i]``: ``(n_rows_i, F)``; ``costs[i]``: seconds;
        ``groups[i]``: task key that throughputs are normalized within)."""

    @abstractmethod
    def predict(self, features: Sequence[np.ndarray]) -> np.ndarray:
        """One score per program; higher = faster."""

    @property
    def trusted(self) -> bool:
        """Whether the scores carry information. An untrusted model (still warming up) scores
        at random, and the search then samples instead of evolving on noise."""
        return True

    @property
    def num_prior(self) -> int:
        """Programs of other tasks the model started from (see `set_prior`)."""
        return 0

    @property
    def pretrained(self) -> bool:
        """Whether the model starts from trees trained elsewhere (the package's model)."""
        return False

    def set_prior(self, features: Sequence[np.ndarray], costs: Sequence[float], groups: Sequence[str]) -> None:
        """Learn from measured programs of other tasks before this job's own. Default: ignore
        them (a model that cannot transfer)."""

    def save(self, path: str | os.PathLike) -> None:
        """Write the model to `path` so a later job starts from it. Default: nothing to keep."""


class RandomModel(CostModel):
    """Uniform random scores in ``[0, 1)``: the no-model ablation and a warm-up stand-in.

    Features are ignored entirely, so callers may pass placeholders instead of
    extracting them.
    """

    def __init__(self, seed: int = 43) -> None:
        self._rng = np.random.default_rng(seed)

    def update(self, features: Sequence[np.ndarray], costs: Sequence[float], groups: Sequence[str]) -> None:
        if not (len(features) == len(costs) == len(groups)):
            raise ValueError("features, costs and groups must have the same length")

    def predict(self, features: Sequence[np.ndarray]) -> np.ndarray:
        return self._rng.uniform(0.0, 1.0, len(features))


#: A fit that continues a base (the pretrained trees) on a task's first few programs grows at
#: most one new tree per this many programs. Uncapped, a fit on 4-16 programs (depth 10, eta 0.2,
#: rounds until the training error stops falling) learns to separate those few noisy timings
#: and reorders every other candidate; capped, the base's ranking stays in charge until the
#: task's own records can teach something (16-trial jobs measured with and without the cap:
#: BENCHMARKS.md).
PROGRAMS_PER_NEW_TREE = 4
#: From this many of the task's own programs (one full measured batch) on, fits are not capped.
CAPPED_FIT_PROGRAMS = 64


class XGBModel(CostModel):
    """Gradient-boosted trees on per-row features with a pack-sum objective.

    Training data accumulate across :meth:`update` calls and the booster is refit
    from scratch on all of them each time (with ``adaptive_training``, refitting is
    skipped until the data grew by at least 20 % since the last fit). Until
    ``num_warmup_sample`` programs have been seen, :meth:`predict` returns random
    scores, since a model fit on a handful of programs ranks worse than chance would
    explore. The default is one measured batch (64): the reference waits for 100, which
    with batches of 64 leaves the first two batches random, and a model fit on the first
    64 already ranks far better than chance (a 300-trial run then has 236 guided trials,
    not 172). A model restored with :meth:`load` is trusted at once and kept until
    ``num_warmup_sample`` new programs allow a local refit.

    :meth:`set_prior` adds measured programs of *other* tasks: they are part of every fit,
    so the model ranks the new task's programs from its first batch on (throughputs are
    normalized per task, and what makes a loop nest fast transfers between tasks).

    `base` is a booster trained elsewhere (the pretrained model of the package): it scores
    programs before any fit, and every fit continues boosting from it, so the new trees learn
    what the base gets wrong on this task's (and the prior's) programs rather than starting
    over. No warm-up is needed with a base.
    """

    def __init__(
        self,
        num_warmup_sample: int = 64,
        seed: int = 43,
        params: dict | None = None,
        max_rounds: int = 10000,
        early_stopping_rounds: int = 50,
        n_threads: int | None = None,
        *,
        adaptive_training: bool = False,
        weight_floor: float = WEIGHT_FLOOR,
        base: Any = None,
    ) -> None:
        import xgboost  # noqa: F401  (fail at construction, not at the first fit)

        self.num_warmup_sample = int(num_warmup_sample)
        self.seed = int(seed)
        self.max_rounds = int(max_rounds)
        self.early_stopping_rounds = int(early_stopping_rounds)
        self.adaptive_training = bool(adaptive_training)
        self.weight_floor = float(weight_floor)
        self.n_threads = int(n_threads) if n_threads else max(1, (os.cpu_count() or 2) // 2)
        self.user_params: dict[str, Any] = dict(params or {})
        self.params: dict[str, Any] = {
            "max_depth": 10,
            "gamma": 0.001,
            "min_child_weight": 0,
            "eta": 0.2,
            # Rows are summed per program, so a per-row bias would scale with the row count.
            "base_score": 0.0,
            "disable_default_eval_metric": 1,
            "verbosity": 0,
            "nthread": self.n_threads,
            "seed": self.seed,
            **self.user_params,
        }
        self.booster: Any = None  # xgboost.Booster once fit or loaded
        self.base: Any = base     # xgboost.Booster every fit continues from (or None)
        self.n_features: int | None = None
        self.loaded = False
        self.last_fit_info: dict[str, Any] = {}
        self._rng = np.random.default_rng(self.seed)
        self._features: list[np.ndarray] = []
        self._costs: list[float] = []
        self._groups: list[str] = []
        self._prior: tuple[list[np.ndarray], list[float], list[str]] = ([], [], [])
        self._last_train_size = 0

    # ------------------------------------------------------------------ training

    @property
    def num_records(self) -> int:
        """Programs seen through :meth:`update`."""
        return len(self._costs)

    @property
    def num_prior(self) -> int:
        """Programs of other tasks given to :meth:`set_prior`."""
        return len(self._prior[1])

    @property
    def pretrained(self) -> bool:
        return self.base is not None

    def set_prior(self, features: Sequence[np.ndarray], costs: Sequence[float], groups: Sequence[str]) -> None:
        """Learn from measured programs of other tasks (groups name their tasks), now and in
        every later fit. No warm-up is needed after this."""
        if not (len(features) == len(costs) == len(groups)):
            raise ValueError("features, costs and groups must have the same length")
        mats = []
        for f in features:
            m = _as_matrix(f, self.n_features)
            if self.n_features is None and m.shape[0] > 0:
                self.n_features = m.shape[1]
            mats.append(m)
        self._prior = (mats, [float(c) for c in costs], [str(g) for g in groups])
        if self.num_prior:
            self._fit()

    def update(self, features: Sequence[np.ndarray], costs: Sequence[float], groups: Sequence[str]) -> None:
        if not (len(features) == len(costs) == len(groups)):
            raise ValueError("features, costs and groups must have the same length")
        for f in features:
            m = _as_matrix(f, self.n_features)
            if self.n_features is None and m.shape[0] > 0:
                self.n_features = m.shape[1]
            self._features.append(m)
        self._costs.extend(float(c) for c in costs)
        self._groups.extend(str(g) for g in groups)

        n = self.num_records
        if (n < self.num_warmup_sample or n == 0) and not self.num_prior and self.base is None:
            return  # predictions stay random (or come from a loaded model) until past warm-up
        grew = n - self._last_train_size
        if self.adaptive_training and self.booster is not None and grew < self._last_train_size / 5:
            return
        self._fit()

    def _new_rounds_allowed(self) -> int:
        """Boosting rounds the next fit may add: `max_rounds`, except while a fit continuing the
        base sees only a few programs of the task alone (see PROGRAMS_PER_NEW_TREE)."""
        if self.base is not None and not self.num_prior and self.num_records < CAPPED_FIT_PROGRAMS:
            return min(self.max_rounds, max(1, self.num_records // PROGRAMS_PER_NEW_TREE))
        return self.max_rounds

    def _fit(self) -> None:
        """Refit the booster from scratch on all accumulated programs."""
        import xgboost as xgb

        start = time.perf_counter()
        prior_f, prior_c, prior_g = self._prior
        labels = normalized_throughputs(prior_c + self._costs, prior_g + self._groups)
        rows, pack_ids, valid, self.n_features = _pack(prior_f + self._features, self.n_features)
        self._last_train_size = self.num_records
        if rows.shape[0] == 0:
            return
        # Renumber the programs that have rows so pack ids are dense.
        kept = np.flatnonzero(valid)
        remap = np.full(valid.size, -1, np.int64)
        remap[kept] = np.arange(kept.size)
        pack_ids = remap[pack_ids]
        y = labels[kept]
        n_programs = kept.size
        w = np.maximum(y, self.weight_floor)
        row_y = y[pack_ids]
        row_w = w[pack_ids]

        def objective(preds: np.ndarray, _: Any) -> tuple[np.ndarray, np.ndarray]:
            sums = _pack_sum(preds, pack_ids, n_programs)
            return (sums[pack_ids] - row_y) * row_w, row_w

        def metric(preds: np.ndarray, _: Any) -> tuple[str, float]:
            sums = _pack_sum(preds, pack_ids, n_programs)
            return "p-rmse", float(np.sqrt(np.mean(np.square(sums - y))))

        base_rounds = self.base.num_boosted_rounds() if self.base is not None else 0
        dtrain = xgb.DMatrix(rows, label=row_y, weight=row_w, nthread=self.n_threads)
        history: dict[str, Any] = {}
        booster = xgb.train(
            self.params,
            dtrain,
            num_boost_round=self._new_rounds_allowed(),
            obj=objective,
            custom_metric=metric,
            evals=[(dtrain, "tr")],
            early_stopping_rounds=self.early_stopping_rounds,
            evals_result=history,
            verbose_eval=False,
            xgb_model=self.base,
        )
        best = getattr(booster, "best_iteration", None)  # counts the base's rounds too
        if best is not None and best + 1 < booster.num_boosted_rounds():
            booster = booster[: best + 1]  # drop the rounds that did not improve tr-p-rmse
        self.booster = booster
        self.loaded = False
        rmse = history.get("tr", {}).get("p-rmse", [])  # this fit's rounds only
        new_best = best - base_rounds if best is not None else -1
        self.last_fit_info = {
            "programs": int(n_programs),
            "rows": int(rows.shape[0]),
            "rounds": int(booster.num_boosted_rounds()),
            "train_p_rmse": float(rmse[new_best]) if -len(rmse) <= new_best < len(rmse) else float("nan"),
            "seconds": time.perf_counter() - start,
        }

    # ------------------------------------------------------------------ inference

    @property
    def trusted(self) -> bool:
        """Whether predictions come from a trained booster (else they are random: warm-up)."""
        if self.booster is None:
            return self.base is not None
        return bool(self.loaded or self.num_prior or self.base is not None
                    or self.num_records >= self.num_warmup_sample)

    def predict(self, features: Sequence[np.ndarray]) -> np.ndarray:
        n = len(features)
        rows, pack_ids, valid, _ = _pack(features, self.n_features)
        if self.trusted:
            scores = np.zeros(n, dtype=np.float64)
            if rows.shape[0]:
                booster = self.booster if self.booster is not None else self.base
                raw = booster.inplace_predict(rows, validate_features=False)
                scores = _pack_sum(np.asarray(raw, dtype=np.float64), pack_ids, n)
        else:
            scores = self._rng.uniform(0.0, 1.0, n)
        scores[~valid] = -np.inf
        return scores

    # ------------------------------------------------------------------ persistence

    def save(self, path: str | os.PathLike) -> None:
        """Write the booster (xgboost's JSON model format) and metadata into one JSON file."""
        import xgboost as xgb

        meta = {
            "format": _SAVE_FORMAT,
            "version": _SAVE_VERSION,
            "xgboost_version": xgb.__version__,
            "num_warmup_sample": self.num_warmup_sample,
            "seed": self.seed,
            "params": self.user_params,
            "max_rounds": self.max_rounds,
            "early_stopping_rounds": self.early_stopping_rounds,
            "adaptive_training": self.adaptive_training,
            "weight_floor": self.weight_floor,
            "n_features": self.n_features,
            "num_records": self.num_records,
            "booster": None if self.booster is None else bytes(self.booster.save_raw("json")).decode("utf-8"),
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(meta, fh)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike, n_threads: int | None = None) -> XGBModel:
        """Restore a model written by :meth:`save`; its booster is used for prediction at once."""
        import xgboost as xgb

        with open(path, encoding="utf-8") as fh:
            meta = json.load(fh)
        if meta.get("format") != _SAVE_FORMAT:
            raise ValueError(f"{path}: not an ansor XGBModel file")
        if int(meta.get("version", 0)) > _SAVE_VERSION:
            raise ValueError(f"{path}: model file version {meta['version']} is newer than supported")
        model = cls(
            num_warmup_sample=meta["num_warmup_sample"],
            seed=meta["seed"],
            params=meta.get("params") or None,
            max_rounds=meta["max_rounds"],
            early_stopping_rounds=meta["early_stopping_rounds"],
            n_threads=n_threads,
            adaptive_training=meta.get("adaptive_training", False),
            weight_floor=meta.get("weight_floor", WEIGHT_FLOOR),
        )
        model.n_features = meta.get("n_features")
        if meta.get("booster") is not None:
            booster = xgb.Booster(params={"nthread": model.n_threads})
            booster.load_model(bytearray(meta["booster"].encode("utf-8")))
            booster.set_param({"nthread": model.n_threads})
            model.booster = booster
            model.loaded = True
        return model
