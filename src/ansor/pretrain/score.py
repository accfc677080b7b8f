"""How model files rank the records of workloads none of them was trained on (the benchmark
suite's databases, say): pairwise accuracy beyond the noise margin, over all the programs and
per workload. This is the figure to compare before shipping a new model."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ansor.costmodel.metrics import NOISE_MARGIN, pairwise_accuracy
from ansor.costmodel.model import XGBModel, normalized_throughputs
from ansor.pretrain.corpus import load_corpus, usable_programs
from ansor.records import RecordStore
from ansor.workloads import workload_label


def score(databases: Sequence[RecordStore], models: Sequence[str] = (), target_key: str | None = None,
          log: Callable[[str], None] = print) -> dict[str, dict[str, float]]:
    """Rank the usable programs of the databases with each model file (default: the shipped
    model of the target's kind); returns, per model file, the pairwise accuracy overall ("all") and per workload
    (by its readable label).

    Raises:
        ValueError: The databases hold no usable program of the target.
    """
    from ansor.costmodel.pretrained import model_file

    data, target = load_corpus(databases, target_key)
    usable = np.flatnonzero(usable_programs(data))
    if usable.size == 0:
        raise ValueError("the databases hold no usable program (measured, with features) of " + target)
    truth = normalized_throughputs(data.costs, data.groups)[usable]
    groups = np.array([data.groups[i] for i in usable])
    labels: dict[str, str] = {}
    for store in databases:
        labels |= {k: workload_label((store.workload(k) or {}).get("description")) for k in store.workload_keys()}
    log(f"{usable.size} programs of {len(set(groups))} workloads on {target}")
    margin = f"{round(100 * NOISE_MARGIN)}%"
    results: dict[str, dict[str, float]] = {}
    from ansor.pretrain.train import target_kind

    for path in models or [str(model_file(target_kind(target)))]:  # the shipped model of the target's kind
        pred = np.asarray(XGBModel.load(path).predict([data.features[i] for i in usable]))
        per = {labels.get(g, g): pairwise_accuracy(pred[groups == g], truth[groups == g], margin=NOISE_MARGIN)
               for g in sorted(set(groups))}
        overall = pairwise_accuracy(pred, truth, list(groups), margin=NOISE_MARGIN)
        results[str(path)] = {"all": overall, **per}
        log(f"{path}: pairwise accuracy beyond {margin} {overall:.3f}; "
            + ", ".join(f"{k} {v:.3f}" for k, v in per.items()))
    return results
