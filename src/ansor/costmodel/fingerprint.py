"""A trained booster's fingerprint: what it predicts for fixed probe rows, and which feature
schema it was trained on.

A model file outlives the library that wrote it. Another xgboost may load the same trees and
still predict differently (a `base_score` read another way adds a constant to every row, and
the pack-sum then ranks programs with more buffers higher), and a change to the feature extractor
(columns added, reordered, renamed) leaves old trees splitting on the wrong columns. Both
pass silently through loading. Storing the predictions for a few fixed rows, and a hash of
the feature names in order, beside the model lets a loader see either at once.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from ansor.costmodel.features import FEATURE_COUNT, FEATURE_NAMES

#: Rows in the probe; the first is all zeros (what the trees give an empty row).
PROBE_ROWS = 16
#: Predictions may differ this much (relative) between builds of one xgboost version and
#: thread counts; a real change of meaning (a shifted bias, a misread tree) is far larger.
PROBE_RTOL = 1e-5
PROBE_ATOL = 1e-6

def feature_schema_hash(names: tuple[str, ...] = FEATURE_NAMES) -> str:
    """A hash of the feature names in column order (their count included)."""
    text = f"{len(names)}\n" + "\n".join(names)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A fixed integer hash (splitmix64), so the probe never depends on numpy's generators."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def probe_rows(n: int = PROBE_ROWS, width: int = FEATURE_COUNT) -> np.ndarray:
    """`n` fixed feature rows: about a third of the entries zero (real rows are sparse), the
    rest spread over [1, 24] like the extractor's log2(1 + x) values; row 0 is all zeros."""
    cell = np.arange(n * width, dtype=np.uint64).reshape(n, width)
    u_zero = (_splitmix64(cell * np.uint64(2)) >> np.uint64(11)).astype(np.float64) / 2.0**53
    u_size = (_splitmix64(cell * np.uint64(2) + np.uint64(1)) >> np.uint64(11)).astype(np.float64) / 2.0**53
    rows = np.where(u_zero < 0.35, 0.0, np.log2(1.0 + np.exp2(24.0 * u_size)))
    rows[0] = 0.0
    return rows.astype(np.float32)


def row_predictions(booster: Any, rows: np.ndarray) -> np.ndarray:
    """Per-row predictions, as `XGBModel.predict` takes them before summing per program."""
    return np.asarray(booster.inplace_predict(rows, validate_features=False), dtype=np.float64)


def fingerprint(booster: Any) -> dict[str, Any]:
    """What to store beside a model so a later load can tell it still means the same."""
    import xgboost as xgb

    rows = probe_rows()
    return {
        "xgboost": xgb.__version__,
        "feature_schema": feature_schema_hash(),
        "feature_count": FEATURE_COUNT,
        "probe_rows": int(rows.shape[0]),
        "probe_predictions": [float(p) for p in row_predictions(booster, rows)],
    }


def mismatch(booster: Any, stored: dict[str, Any] | None) -> str | None:
    """Why `booster` no longer matches its stored fingerprint, or None when it does."""
    import xgboost as xgb

    if not isinstance(stored, dict):
        return "its provenance holds no fingerprint (probe predictions, feature schema)"
    schema = stored.get("feature_schema")
    if schema != feature_schema_hash():
        return (f"it was trained on another feature schema ({schema}) than this version of ansor "
                f"extracts ({feature_schema_hash()}, {FEATURE_COUNT} features)")
    try:
        expected = np.asarray(stored["probe_predictions"], dtype=np.float64)
        rows = probe_rows(int(stored["probe_rows"]))
    except (KeyError, TypeError, ValueError):
        return "its provenance holds no readable probe predictions"
    got = row_predictions(booster, rows)
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=PROBE_RTOL, atol=PROBE_ATOL):
        worst = float(np.max(np.abs(got - expected))) if got.shape == expected.shape else float("nan")
        return (f"xgboost {xgb.__version__} predicts its probe rows differently from xgboost "
                f"{stored.get('xgboost', '?')} that wrote them (largest difference {worst:.3g})")
    return None
