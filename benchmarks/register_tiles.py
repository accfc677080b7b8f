"""What register tiles do to recorded programs: each compiled with and without them, timed in turns.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/register_tiles.py \\
        --database DB --workload matmul --shape 1024,1024,1024 --top 200 --limit 6

Takes the best `--top` records of the workload in the database, keeps those where the C
generator writes a register tile (lower/register_tile.py), at most `--limit` of them, and
times each program compiled both ways (3 rounds, the order alternating), with numpy beside it
for GEMMs. Prints GFLOP/s and the speed ratio with/without, and the tile's shape.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

from ansor.backend.cpu import generate_c
from ansor.lower.lower import lower
from ansor.measure import Builder, MeasureErrorNo, TimingPolicy
from ansor.measure.run import evaluate_kernel
from ansor.schedule.state import State
from ansor.schedule.steps import steps_from_json
from ansor.store import open_store
from ansor.workloads import make_task


def _numpy_time(task, inputs, rounds: int = 15) -> float | None:
    if task.dag.outputs[0].op.name != "matmul":
        return None
    a, b = inputs
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database", required=True)
    p.add_argument("--workload", default="matmul")
    p.add_argument("--shape", default="1024,1024,1024")
    p.add_argument("--option", action="append", default=[], metavar="NAME=INT",
                   help="workload option, e.g. padding=1 (repeatable)")
    p.add_argument("--top", type=int, default=200, help="best records to look through")
    p.add_argument("--limit", type=int, default=6, help="programs to time")
    args = p.parse_args()
    opts = {k: int(v) for k, v in (o.split("=", 1) for o in args.option)}
    task = make_task(args.workload, tuple(int(x) for x in args.shape.split(",")), **opts)
    target = task.target
    with open_store(args.database, create=False)[0] as db:
        records = db.best(task.workload_key, target.key, k=args.top)
    print(f"# {args.workload} {args.shape} on {target.key}; {len(records)} records; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    inputs = task.random_inputs(0)
    expected = task.reference_outputs(inputs)
    timing = TimingPolicy(warmup=1, repeat=3, min_repeat_ms=30)
    shown = 0
    for rank, rec in enumerate(records):
        if shown == args.limit:
            break
        func = lower(State.replay(task.dag, steps_from_json(rec.steps)), "kernel")
        tiled, fname = generate_c(func, target.vector_unit_bytes, target.vector_registers)
        shape = re.search(r"/\* register tile: \w+ in (\d+) (\w+) variables", tiled)
        if shape is None:
            continue
        plain, _ = generate_c(func)
        builds = dict(zip(("plain", "tiled"), Builder().build([plain, tiled])))
        costs: dict[str, list[float]] = {"plain": [], "tiled": []}
        for r in range(3):
            for tag in (("plain", "tiled") if r % 2 == 0 else ("tiled", "plain")):
                res = evaluate_kernel(builds[tag].lib_path, fname, inputs, expected, timing=timing)
                if res.error_no != MeasureErrorNo.NO_ERROR:
                    raise SystemExit(f"rank {rank} ({tag}): {res.error_msg}")
                costs[tag].append(statistics.median(res.costs))
        plain_s, tiled_s = (statistics.median(costs[t]) for t in ("plain", "tiled"))
        np_s = _numpy_time(task, inputs)
        baseline = f"  numpy {task.flop / np_s / 1e9:6.1f}" if np_s else ""
        print(f"rank {rank:3d}, {shape.group(1):>2} x {shape.group(2)}: without {task.flop / plain_s / 1e9:6.1f} "
              f"with {task.flop / tiled_s / 1e9:6.1f} GFLOP/s  ratio {plain_s / tiled_s:.2f}{baseline}")
        shown += 1
    if shown == 0:
        print("no recorded program of this workload gets a register tile on this target")


if __name__ == "__main__":
    main()
