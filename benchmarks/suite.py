"""The benchmark suite: tune each workload and print ansor beside numpy (GEMM) and PyTorch eager
and torch.compile, all measured in the same run: each side is timed in turns, 5 rounds, and the
median is kept (the spread of ansor's rounds is printed in parentheses).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/suite.py \\
        --trials-matmul 1000 --trials 300 --json results.json --curve matmul1024.png

`--compare sketch.random` also tunes every workload with random sampling of the same space at the
same budget and prints the per-workload and geometric-mean speedup of the full tuner over it.
`--only NAME ...` runs a subset; budgets can be scaled down with the two --trials options.
Convolution weights are constant inputs: where the tuned program copies them into a tiled
layout, that copy runs once, ahead of the timed calls (as in inference); the time with the copy
in every call is printed beside it in brackets.
`--reuse --databases DIR` tunes nothing: it builds the best program of each database an earlier
run left in DIR (compiled by the code as it is now) and times it against the baselines, with the
tuning curves rebuilt from the records, to refresh a table without tuning again.
`--transfer-from DIR` gives the full tuner's database, before it tunes a workload, the records of
every *other* workload found in DIR's databases, so its cost model starts from them (leave one
workload out: a workload never learns from its own earlier records).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time

import ansor
from ansor.baselines import measure_in_turns, time_numpy, time_torch, torch_available
from ansor.store import open_store
from ansor.workloads import WORKLOADS, make_task, workload_options

from common import SUITE, TIMING_ROUNDS, TURN_PAUSE_S, build_checked, git_commit, trials_to_reach


def copy_other_workloads(task, source_dir: str, db_path: str) -> int:
    """Copy into db_path the records of every workload but the task's, from the databases in
    source_dir; returns how many records were copied. A workload with the task's spec under
    another key (declared before its weights were constant) is the task too, and is skipped."""
    from ansor.store import Database

    copied = 0
    seen: set[tuple] = set()  # a database that received copies holds them too: copy each record once
    with Database(db_path) as dst:
        for fname in sorted(os.listdir(source_dir)):
            if not fname.endswith(".db") or os.path.abspath(os.path.join(source_dir, fname)) == os.path.abspath(db_path):
                continue
            with Database(os.path.join(source_dir, fname)) as src:
                for wk in src.workload_keys():
                    info = src.workload(wk)
                    if wk == task.workload_key or info is None or info["description"].get("spec") == task.spec:
                        continue
                    fresh = []
                    for rec in src.records(wk, task.target.key):
                        ident = (rec.workload_key, rec.state_key, rec.costs, rec.error_no)
                        if ident not in seen:
                            seen.add(ident)
                            fresh.append(rec)
                    dst.add_workload(wk, info["description"], info["flop"])
                    copied += dst.add_records(fresh)
    return copied


def tune_and_build(name, shape, opts, trials, policy, seed, db_dir=None, transfer_from=None, reuse=False):
    """Tune (or with `reuse`, take the database's earlier records) and build the best kernel.
    Returns (task, inputs, kernel, TuneResult or None when reused, wall seconds, curve)."""
    task = make_task(name, shape, **opts)
    if db_dir:
        os.makedirs(db_dir, exist_ok=True)
        db = os.path.join(db_dir, f"{name}-{'x'.join(map(str, shape))}-{policy}-seed{seed}.db")
    else:
        db = os.path.join(tempfile.mkdtemp(), "suite.db")
    t0 = time.time()
    if reuse:
        if not os.path.exists(db):
            raise SystemExit(f"--reuse: no database {db}")
        res, curve = None, curve_from_database(task, db, trials)
    else:
        if transfer_from and policy == "sketch.xgb":
            print(f"{name}: {copy_other_workloads(task, transfer_from, db)} records of other workloads "
                  f"from {transfer_from}", flush=True)
        res = ansor.tune(task, trials=trials, database=db, seed=seed, policy=policy)
        curve = res.curve
    kernel, inputs = build_checked(task, db, name)
    return task, inputs, kernel, res, time.time() - t0, curve


def curve_from_database(task, db: str, trials: int) -> list:
    """(trial, best GFLOP/s so far) over the first `trials` records of the task, in the order
    they were measured (what `TuneResult.curve` held for the run that wrote them)."""
    database, owned = open_store(db)
    try:
        records = database.records(task.workload_key, task.target.key)[:trials]
    finally:
        if owned:
            database.close()
    best, curve = 0.0, []
    for i, rec in enumerate(records, 1):
        if rec.costs:
            best = max(best, task.flop / rec.median_cost / 1e9)
        curve.append((i, best))
    return curve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials-matmul", type=int, default=1000)
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--policy", default="sketch.xgb")
    p.add_argument("--compare", default=None, help="a second policy to tune with at the same budget")
    p.add_argument("--only", nargs="*", default=None, help="labels or workload names to run")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow to warm up)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--databases", default=None, help="keep each tuning run's records in this folder")
    p.add_argument("--curve", default=None, help="PNG of the matmul 1024 tuning curves")
    p.add_argument("--transfer-from", default=None,
                   help="folder of databases whose other workloads' records the full tuner starts from")
    p.add_argument("--reuse", action="store_true",
                   help="no tuning: build the best of each database already in --databases (an earlier "
                        "run's) and time it against the baselines; curves are rebuilt from the records")
    args = p.parse_args()
    if args.reuse and not args.databases:
        p.error("--reuse needs --databases")
    print(f"# ansor suite; {platform.machine()} {os.cpu_count()} cores; commit {git_commit()}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}; policy {args.policy}"
          + (f" vs {args.compare}" if args.compare else ""))
    results = []
    for label, name, shape, opts in SUITE:
        if args.only and label not in args.only and name not in args.only:
            continue
        trials = args.trials_matmul if name == "matmul" else args.trials
        task, inputs, kernel, res, wall, curve = tune_and_build(name, shape, opts, trials, args.policy, args.seed,
                                                                  args.databases, args.transfer_from, args.reuse)
        row = {"label": label, "workload": name, "shape": list(shape), "trials": trials, "flop": task.flop,
               "curve": curve, "reused": args.reuse}
        if res is not None:
            row.update(tune_wall_s=wall, search_s=res.search_seconds, measure_s=res.measure_seconds,
                       model_s=res.model_seconds)
        timers = {"ansor_s": lambda k=kernel: k.time(*inputs)}
        if kernel.packs_ahead:  # constant weights packed once; also time packing them in every call
            timers["ansor_pack_each_call_s"] = lambda k=kernel: k.time(*inputs, include_prepack=True)
        if args.compare:
            _, _, kernel2, res2, _, curve2 = tune_and_build(name, shape, opts, trials, args.compare, args.seed,
                                                            args.databases, reuse=args.reuse)
            row["compare_curve"] = curve2
            # two readings of "the other policy's final best": the highest single measurement of
            # its run (can be a lucky outlier), and its best after the end-of-job re-measurement
            # (the database's best, its runs pooled)
            row["trials_to_compare_best"] = trials_to_reach(curve, max((g for _, g in curve2), default=0.0))
            confirmed = res2.best_gflops if res2 is not None else task.flop / kernel2.record.median_cost / 1e9
            row["trials_to_compare_confirmed_best"] = trials_to_reach(curve, confirmed)
            timers["compare_s"] = lambda k=kernel2: k.time(*inputs)
        w = WORKLOADS[name]
        if w.numpy_fn is not None and name in ("matmul", "batch_matmul", "matmul_bias_relu"):
            timers["numpy_s"] = lambda: time_numpy(w.numpy_fn, inputs).median
        if w.torch_fn is not None and torch_available():
            o = workload_options(name, shape, **opts)
            timers["torch_s"] = lambda: time_torch(w.torch_fn, o, inputs).median
            if not args.no_compile:
                try:
                    time_torch(w.torch_fn, o, inputs, compiled=True)  # compile once, outside the turns
                    timers["torch_compile_s"] = lambda: time_torch(w.torch_fn, o, inputs, compiled=True).median
                except Exception as exc:  # torch.compile needs a working toolchain
                    row["torch_compile_error"] = str(exc)[:200]
        # each timer returns its own seconds per call; the rounds take turns (thread pools spin on)
        for key, timing in measure_in_turns(timers, rounds=TIMING_ROUNDS, pause_s=TURN_PAUSE_S).items():
            row[key] = timing.median
            row[key.removesuffix("_s") + "_spread_s"] = [min(timing.runs), max(timing.runs)]
        results.append(row)
        _print_row(row, args.compare)
    if args.compare and results:
        ratios = [r["compare_s"] / r["ansor_s"] for r in results]
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"geometric-mean speedup of {args.policy} over {args.compare}: {gm:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.curve:
        mm = next((r for r in results if r["label"] == "matmul 1024"), None)
        if mm:
            from ansor.report import plot_curves

            curves = {args.policy: mm["curve"]}
            if "compare_curve" in mm:
                curves[args.compare] = mm["compare_curve"]
            plot_curves(curves, args.curve, "matmul 1024^3: best GFLOP/s vs trials")


def _print_row(row: dict, compare: str | None) -> None:
    flop = row["flop"]

    def cell(key):
        s = row.get(key)
        return f"{s * 1e3:8.3f} ms {flop / s / 1e9:7.1f} GF/s" if s else " " * 24

    lo, hi = row["ansor_spread_s"]
    line = f"{row['label']:32s} ansor {cell('ansor_s')} ({lo * 1e3:.3f}-{hi * 1e3:.3f})"
    if row.get("ansor_pack_each_call_s"):
        line += f" [packing weights in every call {cell('ansor_pack_each_call_s')}]"
    for key, name in (("numpy_s", "numpy"), ("torch_s", "torch"), ("torch_compile_s", "compile")):
        if row.get(key):
            line += f" | {name} {cell(key)} ratio {row[key] / row['ansor_s']:.2f}x"
    if compare and row.get("compare_s"):
        line += f" | {compare} {cell('compare_s')} speedup {row['compare_s'] / row['ansor_s']:.2f}x"
        line += (f"; passed {compare}'s final best (during tuning) at trial {row['trials_to_compare_best']}"
                 f" of {row['trials']} (its confirmed best at trial {row['trials_to_compare_confirmed_best']})")
    print(line, flush=True)


if __name__ == "__main__":
    main()
