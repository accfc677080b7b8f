"""A corpus of programs for changes to lowering, features or code generation: same output, less time?

    python benchmarks/lowering_corpus.py make --databases DB [DB ...] --out corpus.pkl
    python benchmarks/lowering_corpus.py make --workloads matmul conv2d:1,3,224,224,64,7,7:stride=2 --out corpus.pkl
    python benchmarks/lowering_corpus.py check --corpus corpus.pkl [--show 3]
    python benchmarks/lowering_corpus.py time --corpus corpus.pkl --repeat 3

`make` replays up to `--per-database` measured programs of each database, and draws
`--per-workload` random programs of each named workload (`name[:shape[:option=value,...]]`, no
database needed), adds children of each (the mutations a search applies most), and stores every
program's steps with its features and its generated C (for an AVX2 CPU, so the corpus does not
depend on the machine that makes it). `check` recomputes both with the code as it is now and
counts the programs whose features differ (and how many of those the CPU's lowering passes
rewrite: register tiles, transposed stores), whose C differs, and whose C differs after its
prelude (the helpers and type definitions ahead of the first function): a speedup of lowering,
features or code generation should leave these at 0. `--show N` prints the first lines that
differ for N programs. `time` prints the per-program cost of replay + lowering + features, and
of lowering + code generation (process time, so another job on the machine disturbs it less).
"""

from __future__ import annotations

import argparse
import difflib
import os
import pickle
import random
import time
import zlib

import numpy as np

from ansor.backend import backend_for
from ansor.backend import generate_source
from ansor.costmodel.features import program_features
from ansor.store import Database
from ansor.lower.lower import lower
from ansor.schedule.state import State
from ansor.schedule.steps import steps_from_json
from ansor.search.evolution import MUTATIONS
from ansor.search.params import SearchParams, search_params
from ansor.target import Target
from ansor.workloads import dag_from_description, make_task

CHILD_RULES = ("tile_size", "tile_size", "parallel", "auto_unroll", "compute_location")
CORPUS_TARGET = Target("cpu", "avx2", 2, 32, 64)  # the C of every corpus is generated for this CPU
DEFAULT_WORKLOADS = (
    "matmul", "matmul:1024,1024,1024", "batch_matmul", "matmul_bias_relu", "dense",
    "conv2d", "conv2d:1,3,224,224,64,7,7:stride=2,padding=3", "conv2d_bias_relu", "depthwise_conv2d",
    "conv2d_transpose", "max_pool2d", "avg_pool2d", "relu", "gelu", "softmax", "layer_norm",
    "layer_norm_gelu", "norm2",
)


def features(state: State) -> np.ndarray:
    return program_features(state, target=CORPUS_TARGET)


def source(state: State) -> str:
    """The generated C, or the error of a program that cannot be lowered (mutations may make one)."""
    try:
        return generate_source(state, CORPUS_TARGET, "kernel")[0]
    except Exception as e:  # noqa: BLE001 - the error text is compared like the source
        return f"error: {type(e).__name__}: {e}"


def split_prelude(text: str) -> tuple[str, str]:
    """(prelude, functions): the text before the first function definition, and the rest."""
    at = text.find("\nvoid ")
    return (text, "") if at < 0 else (text[:at], text[at:])


def _parse_workload(spec: str) -> tuple[str, tuple[int, ...] | None, dict]:
    parts = spec.split(":")
    shape = tuple(int(x) for x in parts[1].split(",")) if len(parts) > 1 and parts[1] else None
    options = {}
    for item in parts[2].split(",") if len(parts) > 2 else ():
        key, value = item.split("=")
        options[key] = int(value)
    return parts[0], shape, options


def _with_children(desc: dict, state: State, rng: random.Random, params: SearchParams) -> list[tuple[dict, State]]:
    out = [(desc, state)]
    for rule in CHILD_RULES:
        child = MUTATIONS[rule](state, rng, params)
        if child is not None:
            out.append((desc, child))
    return out


def make(databases: list[str], per_database: int, workloads: list[str], per_workload: int,
         seed: int) -> list[tuple]:
    from ansor.search.sketch_policy import SketchPolicy

    rng = random.Random(seed)
    params = search_params()
    programs = []
    for path in databases:
        db = Database(path)
        for wk in db.workload_keys():
            desc = db.workload(wk)["description"]
            dag = dag_from_description(desc)
            for tk in db.target_keys():
                records = [r for r in db.records(wk, tk) if r.ok]
                for r in rng.sample(records, min(per_database, len(records))):
                    programs += _with_children(desc, State.replay(dag, steps_from_json(r.steps)), rng, params)
        db.close()
    for spec in workloads:
        name, shape, options = _parse_workload(spec)
        task = make_task(name, shape, target=CORPUS_TARGET, **options)
        policy = SketchPolicy(task, seed=rng.randrange(1 << 30))
        for state in policy.sample(per_workload):
            programs += _with_children(task.describe(), state, rng, params)
    return [(desc, tuple(st.steps), features(st), zlib.compress(source(st).encode()))
            for desc, st in programs]


def _replayed(corpus: list[tuple]):
    dags: dict[str, object] = {}
    for desc, steps, feats, source_z in corpus:
        dag = dags.setdefault(str(desc), dag_from_description(desc))
        yield dag, steps, feats, zlib.decompress(source_z).decode()


def _fitted(state: State) -> bool:
    """Whether the CPU's lowering passes rewrote part of the program (register tiles,
    transposed stores): its features may differ from those of the plain loops."""
    try:
        func = lower(state)
        return backend_for(CORPUS_TARGET).run_passes(func, CORPUS_TARGET) is not func
    except Exception:  # noqa: BLE001 - a program that cannot be lowered has no passes either
        return False


def check(corpus: list[tuple], show: int = 0) -> dict[str, int]:
    counts = {"programs": 0, "features differ": 0, "of which fitted by a pass": 0, "programs fitted by a pass": 0,
              "C differs": 0, "C after the prelude differs": 0}
    preludes: set[str] = set()
    for dag, steps, feats, old in _replayed(corpus):
        state = State.replay(dag, steps)
        now, text = features(state), source(state)
        fitted = _fitted(state)
        differ = now.shape != feats.shape or not np.array_equal(now, feats)
        counts["programs"] += 1
        counts["features differ"] += differ
        counts["of which fitted by a pass"] += differ and fitted
        counts["programs fitted by a pass"] += fitted
        counts["C differs"] += text != old
        old_prelude, old_body = split_prelude(old)
        prelude, body = split_prelude(text)
        preludes.add(prelude)
        if body != old_body:
            counts["C after the prelude differs"] += 1
            if show > 0:
                show -= 1
                diff = difflib.unified_diff(old_body.splitlines(), body.splitlines(), "before", "now", lineterm="")
                print("\n".join(list(diff)[:40]) + "\n")
    counts["distinct preludes now"] = len(preludes)
    return counts


def time_per_program(corpus: list[tuple]) -> tuple[float, float]:
    """Process seconds per program: (replay + lowering + features, lowering + code generation)."""
    programs = [(dag, steps) for dag, steps, _, _ in _replayed(corpus)]
    start = time.process_time()
    states = []
    for dag, steps in programs:
        state = State.replay(dag, steps)
        features(state)
        states.append(state)
    mid = time.process_time()
    for state in states:
        source(state)
    end = time.process_time()
    return (mid - start) / len(programs), (end - mid) / len(programs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("make", "check", "time"))
    p.add_argument("--databases", nargs="*", default=[], help="databases whose records seed the corpus")
    p.add_argument("--per-database", type=int, default=30, help="measured programs taken from each")
    p.add_argument("--workloads", nargs="*", default=None,
                   help=f"named workloads whose random programs seed the corpus (default with no "
                        f"--databases: {' '.join(DEFAULT_WORKLOADS)})")
    p.add_argument("--per-workload", type=int, default=40, help="random programs drawn for each")
    p.add_argument("--corpus", "--out", dest="corpus", default="corpus.pkl")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--show", type=int, default=0, help="check: print the differences of this many programs")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.mode == "make":
        missing = [d for d in args.databases if not os.path.exists(d)]
        if missing:
            p.error(f"no such database: {', '.join(missing)}")
        workloads = args.workloads
        if workloads is None:
            workloads = [] if args.databases else list(DEFAULT_WORKLOADS)
        corpus = make(args.databases, args.per_database, workloads, args.per_workload, args.seed)
        with open(args.corpus, "wb") as f:
            pickle.dump(corpus, f)
        print(f"{len(corpus)} programs -> {args.corpus}")
        return
    with open(args.corpus, "rb") as f:
        corpus = pickle.load(f)
    if args.mode == "check":
        print(", ".join(f"{k}: {v}" for k, v in check(corpus, args.show).items()))
    else:
        costs = [time_per_program(corpus) for _ in range(args.repeat)]
        print(f"{len(corpus)} programs; ms per program, replay + lowering + features: "
              + " ".join(f"{a * 1e3:.3f}" for a, _ in costs)
              + "; lowering + code generation: " + " ".join(f"{b * 1e3:.3f}" for _, b in costs))


if __name__ == "__main__":
    main()
