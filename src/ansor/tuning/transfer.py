"""What a tuning job starts from: the cost model assembled from earlier records and the
pretrained model, and the programs of other targets measured first.

A fresh job should not start from a blank model: the database's other workloads on the same
target, records imported from (or tuned under) another target, and the model shipped with the
package each tell it something before this job has measured anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ansor.costmodel.model import CostModel
from ansor.records import RecordStore
from ansor.replay import replay_records
from ansor.schedule.state import State
from ansor.target import Target
from ansor.task import Task
from ansor.tuning.retarget import retarget_vector_width

__all__ = ["MIN_TRANSFER_PROGRAMS", "TRANSFER_CANDIDATES", "model_path", "shared_cost_model",
           "source_target_keys", "transfer_model", "transferred_programs"]

MIN_TRANSFER_PROGRAMS = 64     # fewer than this: not worth starting from
TRANSFER_CANDIDATES = 8        # best programs of another target measured first (transfer_from)


def model_path(db: RecordStore, target_key: str) -> Path | None:
    """Where the cost model of a database's target lives: beside the database file (none for a
    database in memory or on a server)."""
    if str(db.path) == ":memory:" or "://" in str(db.path):
        return None
    p = Path(db.path)
    return p.with_name(f"{p.stem}.{target_key}.costmodel.json")


def transfer_model(tasks: Task | Sequence[Task], db: RecordStore, seed: int | None, max_programs: int,
                   base: Any = None, from_targets: Sequence[str] = ()):
    """An XGBModel that has learned from the database's workloads other than `tasks`' on their
    target (at most `max_programs` programs, the most recent of each workload in equal shares),
    and from every workload's records on the targets `from_targets` (keys; featurized as the
    programs would run on the tasks' target), continuing from the `base` booster if given;
    None when there are fewer than MIN_TRANSFER_PROGRAMS."""
    from ansor.tuning.dataset import Dataset, load_dataset
    from ansor.costmodel.model import XGBModel

    task_list = [tasks] if isinstance(tasks, Task) else list(tasks)
    target = task_list[0].target
    own = {t.workload_key for t in task_list}
    others = [wk for wk in db.workload_keys() if wk not in own]
    data = Dataset()
    if max_programs > 0 and others:
        data = load_dataset(db, target.key, exclude_workloads=own,
                            max_per_workload=max(1, max_programs // len(others)), feature_target=target)
    for key in from_targets:
        part = load_dataset(db, key, feature_target=target, group_prefix=f"{key}/")
        data.features += part.features
        data.costs += part.costs
        data.groups += part.groups
    if len(data.costs) < MIN_TRANSFER_PROGRAMS:
        return None
    model = XGBModel(seed=seed if seed is not None else 43, base=base)
    model.set_prior(data.features, data.costs, data.groups)
    return model


def shared_cost_model(tasks: Sequence[Task], db: RecordStore, seed: int | None,
                       transfer_programs: int, pretrained: bool | None = None,
                       from_targets: Sequence[str] = ()) -> CostModel:
    """The one model of a target's tasks: from the database's other workloads (continuing from
    the pretrained model), else the model saved beside the database by the last job, else the
    pretrained model, else a fresh one."""
    from ansor.costmodel.model import XGBModel
    from ansor.costmodel.pretrained import enabled_by_default, load_pretrained

    if pretrained is None:
        pretrained = enabled_by_default()
    shipped = load_pretrained(tasks[0].target, seed if seed is not None else 43) if pretrained else None
    base = shipped.base if shipped is not None else None
    model = transfer_model(tasks, db, seed, transfer_programs, base=base, from_targets=from_targets)
    if model is not None:
        return model
    saved = model_path(db, tasks[0].target.key)
    if saved is not None and saved.exists():
        try:
            restored = XGBModel.load(saved)
            restored.base = base  # its later fits continue from the pretrained trees too
            return restored
        except (OSError, ValueError):
            pass  # an unreadable model is retrained from the records
    return shipped if shipped is not None else XGBModel(seed=seed if seed is not None else 43)


def transferred_programs(task: Task, db: RecordStore, source_key: str, k: int = TRANSFER_CANDIDATES) -> list[State]:
    """The best `k` programs of another target, each preceded by its first variant for this
    target's vector width and register count when they differ (`ansor.tuning.retarget`):
    measured first in a job that starts from that target's records."""
    source = _described_target(db, source_key)
    here = task.target
    fitted = source is not None and source.kind == here.kind == "cpu"
    more_registers, rest = divmod(here.vector_registers, source.vector_registers) if fitted else (1, 0)
    out: list[State] = []
    for _, state in replay_records(db.best(task.workload_key, source_key, k=k), task.dag):
        if fitted:
            out += retarget_vector_width(state, source.vector_unit_bytes, here.vector_unit_bytes,
                                         more_registers if rest == 0 and more_registers > 1 else 1)[:1]
        out.append(state)
    return out


def _described_target(db: RecordStore, target_key: str) -> Target | None:
    """A target as the database describes it (None when it is not, or not in a form this
    version reads)."""
    entry = db.target(target_key)
    try:
        target = Target(**(entry or {})["description"])
    except (KeyError, TypeError):
        return None
    return target if target.vector_unit_bytes > 0 else None


def source_target_keys(targets: Target | str | Sequence[Target | str], tasks: Sequence[Task]) -> list[str]:
    """The keys of `transfer_from`'s targets, none of them a task's own."""
    items = [targets] if isinstance(targets, (Target, str)) else list(targets)
    keys = [t.key if isinstance(t, Target) else str(t) for t in items]
    own = {t.target.key for t in tasks}
    if own & set(keys):
        raise ValueError(f"tune: transfer_from names the target being tuned ({', '.join(own & set(keys))})")
    return keys
