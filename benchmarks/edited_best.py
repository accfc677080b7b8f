"""Time a database's best program beside copies of it with some split factors changed, and
beside PyTorch eager, in turns: is the tuned tile the best of its neighbours, or did the search
miss one?

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/edited_best.py conv2d \
        --shape 1,3,224,224,64,7,7 --option stride=2 --option padding=3 --database DB \
        --variant "x8=3:12=14,2,4" --variant "rx_out=3:20=1;3:12=14,2,4"

A variant is NAME=EDIT[;EDIT...], each EDIT `STAGE:ITER=F1,F2,...`: the split step of stage
STAGE at iterator ITER (the numbers in the record's `SP` steps) gets the factors F1, F2, ...
Every variant's output is checked against the numpy reference; a wrong one is reported and
not timed. `--plain-stores` adds the tuned program built without transposed stores (the code
generator's write-back of tiles vectorized along a strided output axis), to measure what they
are worth.
"""

from __future__ import annotations

import argparse
import contextlib
import json

import ansor.lower.transposed_store as transposed_store
from ansor.baselines import time_in_turns, torch_available, torch_callable
from ansor.kernel import compile_state
from ansor.schedule.state import ScheduleError, State
from ansor.schedule.steps import steps_from_json
from ansor.store import open_store
from ansor.workloads import WORKLOADS, make_task, workload_options

from common import TIMING_ROUNDS, TURN_PAUSE_S


def edited(steps: list, edits: str) -> list:
    """The record's steps with the named splits' factors replaced."""
    out = [list(s) for s in steps]
    for edit in edits.split(";"):
        where, factors = edit.split("=")
        stage, it = (int(x) for x in where.split(":"))
        hits = [s for s in out if s[0] == "SP" and s[1] == stage and s[2] == it]
        if not hits:
            raise SystemExit(f"no split of stage {stage} at iterator {it} in the best program")
        hits[0][4] = [int(f) for f in factors.split(",")]
    return out


@contextlib.contextmanager
def plain_stores():
    """Code generation without transposed stores, for the ablation."""
    keep = transposed_store.plan_transposed_store
    transposed_store.plan_transposed_store = lambda *args, **kwargs: None
    try:
        yield
    finally:
        transposed_store.plan_transposed_store = keep


def _option(text: str) -> tuple[str, object]:
    key, value = text.split("=")
    return key, json.loads(value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload")
    p.add_argument("--shape", required=True, help="comma-separated, as in `ansor tune`")
    p.add_argument("--option", action="append", default=[], type=_option, help="KEY=VALUE, e.g. stride=2")
    p.add_argument("--database", required=True)
    p.add_argument("--variant", action="append", default=[], help="NAME=STAGE:ITER=F1,F2[;...]")
    p.add_argument("--plain-stores", action="store_true", help="also time the tuned program without transposed stores")
    args = p.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    opts = dict(args.option)
    task = make_task(args.workload, shape, **opts)
    db, owned = open_store(args.database)
    try:
        best = db.best(task.workload_key, task.target.key, k=1)
    finally:
        if owned:
            db.close()
    if not best:
        raise SystemExit(f"no record of {args.workload} {shape} for this machine in {args.database}")
    tuned = best[0].steps  # records hold steps in their JSON form (nested lists)
    programs = {"tuned": (tuned, False)}
    if args.plain_stores:
        programs["tuned, plain stores"] = (tuned, True)
    for spec in args.variant:
        name, edits = spec.split("=", 1)
        programs[name] = (edited(tuned, edits), False)

    inputs = task.random_inputs(seed=1)
    timers = {}
    for name, (steps, plain) in programs.items():
        try:
            with plain_stores() if plain else contextlib.nullcontext():
                kernel = compile_state(task, State.replay(task.dag, steps_from_json(steps)))
        except (ScheduleError, RuntimeError) as exc:
            print(f"{name}: not a program ({str(exc)[:120]})")
            continue
        problem = kernel.check(*inputs)
        if problem:
            print(f"{name}: wrong output, not timed ({problem})")
            continue
        timers[name] = kernel.prepared(*inputs)
    w = WORKLOADS[args.workload]
    if w.torch_fn is not None and torch_available():
        torch_fn = torch_callable(w.torch_fn, workload_options(args.workload, shape, **opts), inputs)
        if torch_fn is not None:
            timers["torch"] = torch_fn
    results = time_in_turns(timers, rounds=TIMING_ROUNDS, pause_s=TURN_PAUSE_S)
    base = results["torch"].median if "torch" in results else None
    for name, timing in results.items():
        median, lo, hi = timing.median, min(timing.runs), max(timing.runs)
        ratio = f"  {base / median:.2f}x PyTorch" if base and name != "torch" else ""
        print(f"{name:20s} {median * 1e3:8.3f} ms ({lo * 1e3:.3f}-{hi * 1e3:.3f}) "
              f"{task.flop / median / 1e9:7.1f} GF/s{ratio}")


if __name__ == "__main__":
    main()
