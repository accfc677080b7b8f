"""How good was each measured batch? Per batch of a tuning run's records: the best and the median
GFLOP/s, and how many programs passed a threshold. Where the best-so-far curve only shows luck,
this shows whether the search (the cost model) proposes good programs as a rule.

    python benchmarks/batch_quality.py --database run.db [--per-round 64] [--threshold 150]

Records are taken in the order they were measured; re-measurements of programs already seen
(the tuner confirms its leaders at the end of a job) are left out.
"""

from __future__ import annotations

import argparse
import statistics

from ansor.store import Database


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database", required=True)
    p.add_argument("--per-round", type=int, default=64)
    p.add_argument("--threshold", type=float, default=None, help="count programs above this GFLOP/s")
    args = p.parse_args()
    with Database(args.database) as db:
        for wk in db.workload_keys():
            flop = (db.workload(wk) or {}).get("flop") or 0.0
            for tk in db.target_keys():
                seen: set[str] = set()
                gflops = []
                for rec in db.records(wk, tk):
                    if rec.state_key in seen:
                        continue
                    seen.add(rec.state_key)
                    gflops.append(flop / rec.median_cost / 1e9 if rec.ok and flop else 0.0)
                if not gflops:
                    continue
                print(f"{wk} on {tk}: {len(gflops)} programs")
                for start in range(0, len(gflops), args.per_round):
                    batch = gflops[start:start + args.per_round]
                    line = (f"  trials {start + 1:5d}-{start + len(batch):5d}: best {max(batch):7.1f}  "
                            f"median {statistics.median(batch):7.1f} GFLOP/s")
                    if args.threshold is not None:
                        line += f"  above {args.threshold:g}: {sum(g > args.threshold for g in batch)}"
                    print(line)


if __name__ == "__main__":
    main()
