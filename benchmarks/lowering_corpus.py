"""A corpus of programs for changes to lowering, features or code generation: same output, less time?

    python benchmarks/lowering_corpus.py make --databases DB [DB ...] --out corpus.pkl
    python benchmarks/lowering_corpus.py check --corpus corpus.pkl
    python benchmarks/lowering_corpus.py time --corpus corpus.pkl --repeat 3

`make` replays up to `--per-database` measured programs of each database, adds children of
each (the mutations a search applies most), and stores every program's steps with its features
and a hash of its generated C. `check` recomputes both with the code as it is now and counts the
programs that differ: a speedup of lowering or feature extraction should leave that count at 0.
`time` prints the per-program cost of replay + lowering + features (process time, so another
job on the machine disturbs it less).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import random
import time

import numpy as np

from ansor.codegen.c import generate_c
from ansor.costmodel.features import program_features
from ansor.database import Database
from ansor.lower.lower import lower
from ansor.schedule.state import State
from ansor.schedule.steps import steps_from_json
from ansor.search.evolution import MUTATIONS
from ansor.search.params import search_params
from ansor.workloads import dag_from_description

CHILD_RULES = ("tile_size", "tile_size", "parallel", "auto_unroll", "compute_location")


def _c_hash(state: State) -> str:
    src = generate_c(lower(state), 32, 16)
    src = src[0] if isinstance(src, tuple) else src
    return hashlib.sha256(src.encode()).hexdigest()


def make(databases: list[str], per_database: int, seed: int) -> list[tuple]:
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
                    state = State.replay(dag, steps_from_json(r.steps))
                    programs.append((desc, state))
                    for rule in CHILD_RULES:
                        child = MUTATIONS[rule](state, rng, params)
                        if child is not None:
                            programs.append((desc, child))
        db.close()
    return [(desc, tuple(st.steps), program_features(st), _c_hash(st)) for desc, st in programs]


def _replayed(corpus: list[tuple]):
    dags: dict[str, object] = {}
    for desc, steps, feats, c_hash in corpus:
        dag = dags.setdefault(str(desc), dag_from_description(desc))
        yield dag, steps, feats, c_hash


def check(corpus: list[tuple]) -> int:
    differ = 0
    for dag, steps, feats, c_hash in _replayed(corpus):
        state = State.replay(dag, steps)
        now = program_features(state)
        if now.shape != feats.shape or not np.array_equal(now, feats) or _c_hash(state) != c_hash:
            differ += 1
    return differ


def time_per_program(corpus: list[tuple]) -> float:
    programs = [(dag, steps) for dag, steps, _, _ in _replayed(corpus)]
    start = time.process_time()
    for dag, steps in programs:
        program_features(State.replay(dag, steps))
    return (time.process_time() - start) / len(programs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=("make", "check", "time"))
    p.add_argument("--databases", nargs="*", default=[], help="databases whose records seed the corpus")
    p.add_argument("--per-database", type=int, default=30, help="measured programs taken from each")
    p.add_argument("--corpus", "--out", dest="corpus", default="corpus.pkl")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.mode == "make":
        if not args.databases:
            p.error("make needs --databases")
        missing = [d for d in args.databases if not os.path.exists(d)]
        if missing:
            p.error(f"no such database: {', '.join(missing)}")
        corpus = make(args.databases, args.per_database, args.seed)
        with open(args.corpus, "wb") as f:
            pickle.dump(corpus, f)
        print(f"{len(corpus)} programs -> {args.corpus}")
        return
    with open(args.corpus, "rb") as f:
        corpus = pickle.load(f)
    if args.mode == "check":
        print(f"{len(corpus)} programs, {check(corpus)} with different features or C")
    else:
        costs = [time_per_program(corpus) * 1e3 for _ in range(args.repeat)]
        print(f"{len(corpus)} programs; ms per program (replay + lowering + features): "
              + " ".join(f"{c:.3f}" for c in costs))


if __name__ == "__main__":
    main()
