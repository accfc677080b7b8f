"""The cost model that ships with the package: trained on programs measured on this project's
machines, so that a workload nobody has tuned still gets a model-ranked program.

The model file holds xgboost trees over the 164 program features (the `XGBModel` save
format); beside it a provenance file says what it was trained on (commit, machines, number
of workloads and programs) and how it ranked programs of workloads left out of its training.
`benchmarks/pretrain.py` builds both from databases of measured programs.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from ansor.costmodel.features import FEATURE_COUNT
from ansor.costmodel.model import XGBModel
from ansor.target import Target

PRETRAINED_DIR = Path(__file__).parent / "pretrained"
#: Set to 0 to start every cost model without the shipped one (the default is on).
ENV_SWITCH = "ANSOR_PRETRAINED"


def enabled_by_default() -> bool:
    """Whether tuning starts from the shipped model when the caller does not say."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def model_file(kind: str = "cpu") -> Path:
    return PRETRAINED_DIR / f"{kind}.model.json"


def provenance_file(kind: str = "cpu") -> Path:
    return PRETRAINED_DIR / f"{kind}.provenance.json"


def provenance(kind: str = "cpu") -> dict[str, Any] | None:
    """What the shipped model of a target kind was trained on, or None without one."""
    try:
        return json.loads(provenance_file(kind).read_text())
    except (OSError, ValueError):
        return None


def load_pretrained(target: Target, seed: int = 43) -> XGBModel | None:
    """A fresh XGBModel whose fits continue from the shipped trees of `target`'s kind (None
    when the package has no model for it, or one for other features)."""
    path = model_file(target.kind)
    try:
        stat = path.stat()
    except OSError:
        return None
    base = _shipped_booster(str(path), stat.st_mtime_ns, stat.st_size)
    if base is None:
        return None
    model = XGBModel(seed=seed, base=base)
    model.n_features = FEATURE_COUNT
    return model


@lru_cache(maxsize=4)
def _shipped_booster(path: str, mtime_ns: int, size: int) -> Any:
    """The trees of a model file, parsed once per process and version of the file (a few MB of
    JSON: every tuning job and quick build starts from them). Fits continue from a copy
    (`xgb.train(xgb_model=...)` leaves the base as it is), so one booster serves them all."""
    try:
        shipped = XGBModel.load(path)
    except (OSError, ValueError, KeyError):
        return None
    if shipped.booster is None or shipped.n_features != FEATURE_COUNT:
        return None
    return shipped.booster


def save_pretrained(model: XGBModel, info: dict[str, Any], kind: str = "cpu") -> Path:
    """Write a trained model and its provenance into the package."""
    path = model_file(kind)
    model.save(path)
    provenance_file(kind).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return path
