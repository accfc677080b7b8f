"""The cost model that ships with the package: trained on programs measured on this project's
machines, so that a workload nobody has tuned still gets a model-ranked program.

The model file holds xgboost trees over the 164 program features (the `XGBModel` save
format); beside it a provenance file says what it was trained on (commit, machines, number
of workloads and programs), how it ranked programs of workloads left out of its training, and
the model's fingerprint (`ansor.costmodel.fingerprint`). A model whose fingerprint does not
match under the installed xgboost and feature extractor is not used: a wrong ranking is worse
than none. `ansor pretrain` (the `ansor.pretrain` package) builds both files from databases of measured programs;
`python -m ansor.costmodel.pretrained --write-fingerprint` rewrites the fingerprint of the
model file as it is (after a deliberate upgrade of xgboost, checked some other way).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from ansor.costmodel.features import FEATURE_COUNT
from ansor.costmodel.fingerprint import fingerprint, mismatch
from ansor.costmodel.model import XGBModel
from ansor.target import Target

PRETRAINED_DIR = Path(__file__).parent / "pretrained"
#: Set to 0 to start every cost model without the shipped one (the default is on).
ENV_SWITCH = "ANSOR_PRETRAINED"
#: The provenance key of the model's fingerprint.
FINGERPRINT_KEY = "fingerprint"


class PretrainedModelWarning(UserWarning):
    """The shipped model is not used, or is used on a machine unlike the ones it learned on."""


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
    """A fresh XGBModel whose fits continue from the shipped trees of `target`'s kind; None
    when the package has no model for it, or one that fails to load or to reproduce its
    fingerprint (then with a PretrainedModelWarning)."""
    path = model_file(target.kind)
    try:
        stat = path.stat()
    except OSError:
        return None
    prov = provenance_file(target.kind)
    try:
        prov_stat = prov.stat()
        prov_version = (prov_stat.st_mtime_ns, prov_stat.st_size)
    except OSError:
        prov_version = None
    base = _shipped_booster(str(path), stat.st_mtime_ns, stat.st_size, str(prov), prov_version)
    if base is None:
        return None
    _warn_if_unlike_training_machines(target, provenance(target.kind))
    model = XGBModel(seed=seed, base=base)
    model.n_features = FEATURE_COUNT
    return model


@lru_cache(maxsize=4)
def _shipped_booster(path: str, mtime_ns: int, size: int, prov_path: str,
                     prov_version: tuple[int, int] | None) -> Any:
    """The trees of a model file, parsed and checked against its fingerprint once per process
    and version of the files (a few MB of JSON: every tuning job and quick build starts from
    them), so each reason not to use them is said once. Fits continue from a copy
    (`xgb.train(xgb_model=...)` leaves the base as it is), so one booster serves them all."""
    import xgboost as xgb

    def refuse(reason: str) -> None:
        warnings.warn(f"pretrained cost model {path} not used (xgboost {xgb.__version__}): {reason}; "
                      f"tuning starts without it", PretrainedModelWarning, stacklevel=4)

    try:
        shipped = XGBModel.load(path)
    except Exception as exc:  # noqa: BLE001  (whatever the damage: said, and tuning goes on)
        return refuse(f"the file does not load ({type(exc).__name__}: {exc})")
    if shipped.booster is None or shipped.n_features != FEATURE_COUNT:
        return refuse(f"it holds no trees over {FEATURE_COUNT} features (n_features={shipped.n_features})")
    try:
        info = json.loads(Path(prov_path).read_text())
    except (OSError, ValueError) as exc:
        return refuse(f"its provenance {prov_path} does not load ({type(exc).__name__})")
    reason = mismatch(shipped.booster, info.get(FINGERPRINT_KEY) if isinstance(info, dict) else None)
    if reason is not None:
        return refuse(reason)
    return shipped.booster


_TARGET_KEY = re.compile(r"cpu-(?P<arch>.+)-(?P<isa>[^-]+)-(?P<cores>\d+)c")
_warned_targets: set[str] = set()


def training_targets(info: dict[str, Any] | None) -> list[str]:
    """The target keys a model learned on: its own corpus's, then those it was continued from."""
    keys = []
    while isinstance(info, dict):
        if isinstance(info.get("target"), str):
            keys.append(info["target"])
        info = info.get("continued_from")
    return keys


def _warn_if_unlike_training_machines(target: Target, info: dict[str, Any] | None) -> None:
    """Say once per target when no training machine had its ISA and core count: the model
    still starts the search, but its first rankings are less to be trusted there."""
    seen = [m.groupdict() for m in map(_TARGET_KEY.fullmatch, training_targets(info)) if m]
    if target.kind != "cpu" or not seen or target.key in _warned_targets:
        return
    if any(s["isa"] == target.isa and int(s["cores"]) == target.num_cores for s in seen):
        return
    _warned_targets.add(target.key)
    trained_on = ", ".join(training_targets(info))
    warnings.warn(f"the pretrained cost model learned on {trained_on}; this target is {target.key} "
                  f"(another ISA or core count): its rankings count for less until this task's own "
                  f"measurements retrain it", PretrainedModelWarning, stacklevel=3)


def _without_fingerprints(info: dict[str, Any]) -> dict[str, Any]:
    """`info` less the fingerprints of the models it was continued from (they describe trees
    that no longer exist on their own)."""
    out = {k: v for k, v in info.items() if k != FINGERPRINT_KEY}
    if isinstance(out.get("continued_from"), dict):
        out["continued_from"] = _without_fingerprints(out["continued_from"])
    return out


def save_pretrained(model: XGBModel, info: dict[str, Any], kind: str = "cpu") -> Path:
    """Write a trained model and its provenance, with the model's fingerprint, into the
    package."""
    if model.booster is None:
        raise ValueError("the model has no trees to ship")
    path = model_file(kind)
    model.save(path)
    _write_provenance(_without_fingerprints(info) | {FINGERPRINT_KEY: fingerprint(model.booster)}, kind)
    return path


def write_fingerprint(kind: str = "cpu") -> dict[str, Any]:
    """Store the fingerprint of the model file as it is now into its provenance (after a
    deliberate change of xgboost or of the features); returns it."""
    model = XGBModel.load(model_file(kind))
    if model.booster is None:
        raise ValueError(f"{model_file(kind)} holds no trees")
    info = provenance(kind) or {}
    info[FINGERPRINT_KEY] = fingerprint(model.booster)
    _write_provenance(info, kind)
    return info[FINGERPRINT_KEY]


def _write_provenance(info: dict[str, Any], kind: str) -> None:
    provenance_file(kind).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    """`python -m ansor.costmodel.pretrained [--write-fingerprint] [--kind cpu]`: check the
    shipped model against its fingerprint, or store a new one."""
    parser = argparse.ArgumentParser(prog="python -m ansor.costmodel.pretrained", description=main.__doc__)
    parser.add_argument("--kind", default="cpu", help="target kind of the model (default: cpu)")
    parser.add_argument("--write-fingerprint", action="store_true",
                        help="store the model's probe predictions and feature schema in its provenance")
    args = parser.parse_args(argv)
    if args.write_fingerprint:
        fp = write_fingerprint(args.kind)
        print(f"{provenance_file(args.kind)}: fingerprint of xgboost {fp['xgboost']}, "
              f"{fp['probe_rows']} probe rows, feature schema {fp['feature_schema']}")
        return 0
    model = XGBModel.load(model_file(args.kind))
    info = provenance(args.kind)
    reason = mismatch(model.booster, info.get(FINGERPRINT_KEY) if info else None)
    print(f"{model_file(args.kind)}: {'matches its fingerprint' if reason is None else reason}")
    return 0 if reason is None else 1


if __name__ == "__main__":
    sys.exit(main())
