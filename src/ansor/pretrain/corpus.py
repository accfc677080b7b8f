"""The pretraining corpus: which workloads the shipped model learns from, and their records
read back as one data set.

The corpus is the fused subgraphs of reference models (`models.make_model`, as `ansor tune`
sees them) and operators of every named workload family (`ansor workloads`) at random shapes.
The benchmark suite's own shapes (`HELD_OUT`) are never in it: they are the held-out
workloads that `ansor.build` and the shipped model are judged on.
"""

from __future__ import annotations

import random
from typing import Sequence

import numpy as np

from ansor.records import RecordStore
from ansor.target import Target
from ansor.task import Task
from ansor.tuning.dataset import Dataset, load_dataset
from ansor.workloads import make_task

#: Reference models whose subgraphs join the corpus by default.
DEFAULT_MODELS = ("resnet18", "mobilenet_v2", "bert_layer")

#: The benchmark suite's shapes (benchmarks/suite.py), as (workload, shape): held out of the
#: corpus so that the suite measures the model on workloads it has never seen.
HELD_OUT = frozenset({
    ("matmul", (512, 512, 512)), ("matmul", (1024, 1024, 1024)), ("batch_matmul", (12, 128, 128, 64)),
    ("conv2d", (1, 64, 56, 56, 64, 3, 3)), ("conv2d", (1, 256, 14, 14, 256, 3, 3)),
    ("conv2d", (1, 3, 224, 224, 64, 7, 7)), ("depthwise_conv2d", (1, 128, 56, 56, 3, 3)),
    ("conv2d_transpose", (1, 512, 4, 4, 256, 4, 4)), ("norm2", (1024, 1024)), ("softmax", (1536, 128)),
    ("layer_norm_gelu", (4096, 768)), ("matmul_bias_relu", (512, 512, 512)),
    ("conv2d_bias_relu", (1, 64, 56, 56, 64, 3, 3)),
})

Workload = tuple[str, tuple[int, ...], dict]
"""A named workload at one shape: (name, shape, options such as stride and padding)."""


def random_workloads(n: int, seed: int) -> list[Workload]:
    """`n` distinct operators of the named workload families at random shapes (none held
    out), the families taken in turn. Sizes are drawn from wide ranges: a model learns more
    from many different workloads than from many programs of a few (BENCHMARKS.md). Fewer
    than `n` come back only if the draws keep repeating (bounded, never an endless loop)."""
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
    out: list[Workload] = []
    seen: set[tuple] = set()
    for _ in range(100 * n):
        if len(out) == n:
            break
        name, shape, opts = makers[len(out) % len(makers)]()
        ident = (name, shape, tuple(sorted(opts.items())))
        if (name, shape) in HELD_OUT or ident in seen:
            continue
        seen.add(ident)
        out.append((name, shape, opts))
    return out


def model_tasks(names: Sequence[str]) -> list[Task]:
    """The distinct tasks of the named reference models, as a model's tuning job sees them."""
    from ansor.graph import from_torch
    from ansor.graph.model_tasks import extract_tasks
    from ansor.pretrain.models import make_model

    tasks: list[Task] = []
    for name in names:
        module, inputs = make_model(name)
        tasks += extract_tasks(from_torch(module.eval(), inputs)).tasks
    return tasks


def corpus_tasks(models: Sequence[str] = DEFAULT_MODELS, random_count: int = 40, seed: int = 0) -> list[Task]:
    """Every task of the corpus: the models' subgraphs, then `random_count` random operators."""
    tasks = model_tasks(models) if models else []
    return tasks + [make_task(name, shape, **opts) for name, shape, opts in random_workloads(random_count, seed)]


def load_corpus(stores: Sequence[RecordStore], target_key: str | None = None) -> tuple[Dataset, str]:
    """All programs of one target in the record stores as one data set (programs keep their
    workload key as group), and that target's key: `target_key`, else the first store's first
    target.

    Raises:
        ValueError: No store was given, or the first one holds no target.
    """
    if not stores:
        raise ValueError("give at least one database")
    data = Dataset()
    for store in stores:
        if target_key is None:
            keys = store.target_keys()
            if not keys:
                raise ValueError(f"{store.path} holds no records")
            target_key = keys[0]
        part = load_dataset(store, target_key, feature_target=gpu_target(store, target_key))
        data.features += part.features
        data.costs += part.costs
        data.groups += part.groups
        data.skipped += part.skipped
    return data, target_key


def gpu_target(store: RecordStore, target_key: str) -> Target | None:
    """The GPU target a store describes under `target_key`, whose programs are featurized as
    they run there (as a GPU tuning job featurizes them); None for a CPU target, whose
    programs keep the features of this machine's CPU, as the CPU model was always trained."""
    entry = store.target(target_key) or {}
    try:
        target = Target(**entry["description"])
    except (KeyError, TypeError):
        if target_key.startswith(("cuda", "opencl")):
            raise ValueError(f"{store.path} does not describe the GPU target {target_key}: its programs "
                             f"cannot be featurized as they run there") from None
        return None
    return None if target.kind == "cpu" else target


def usable_programs(data: Dataset) -> np.ndarray:
    """Which programs a model can learn from or be scored on: rows of features and a finite
    cost (a failed program has neither a time nor, often, a lowered nest)."""
    return np.array([f.shape[0] > 0 and np.isfinite(c) for f, c in zip(data.features, data.costs)], dtype=bool)
