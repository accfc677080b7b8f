"""Trials per second of one tuning job measured on a local Ray cluster of 2 nodes against 1 node.

    python benchmarks/cluster.py --trials 128 --rounds 3 --json cluster.jsonl

Each round starts a fresh local cluster of one node, then of two (the order alternates between
rounds, so that a change in the machine's load falls on both), each node a `ray start --block`
process with one CPU, and runs the same job on it: the workload for `Target.host(num_cores=1)`
from a fresh database and a fresh build cache (a second job must not find the first one's
compiled programs), with the package's defaults otherwise. On a machine of two cores each node
then measures on a core of its own while the search runs in this process between rounds.
Prints each job's trials per second (whole `tune` call: connecting, starting the actors,
searching, measuring), the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from common import git_commit, machine_name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """`nodes` Ray nodes on this machine (one CPU each), stopped on exit; `env` is given to
    the nodes, and so to their measuring actors."""

    def __init__(self, nodes: int, env: dict[str, str]):
        self.nodes, self.env = nodes, env
        self.folder = tempfile.mkdtemp(prefix="ansor-bench-ray-", dir="/tmp")  # short: socket paths
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []

    def _start(self, *args: str) -> None:
        log = open(os.path.join(self.folder, f"node{len(self.processes)}.log"), "w")
        options = ["--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats",
                   f"--temp-dir={self.folder}", "--node-ip-address=127.0.0.1", "--block"]
        self.processes.append(subprocess.Popen(["ray", "start", *args, *options], stdout=log, stderr=subprocess.STDOUT,
                                               env={**os.environ, **self.env}, start_new_session=True))

    def _alive(self) -> int:
        import ray

        try:
            ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False)
            return sum(n["Alive"] for n in ray.nodes())
        except Exception:  # noqa: BLE001 - not up yet
            return 0
        finally:
            ray.shutdown()

    def _wait_for(self, nodes: int) -> None:
        for _ in range(90):
            if self._alive() >= nodes:
                return
            time.sleep(1)
        raise RuntimeError(f"the local cluster did not reach {nodes} nodes; logs in {self.folder}")

    def __enter__(self) -> LocalCluster:
        self._start("--head", f"--port={self.port}", "--include-dashboard=false",
                    f"--ray-client-server-port={_free_port()}")
        self._wait_for(1)
        for _ in range(self.nodes - 1):
            self._start(f"--address={self.address}")
        self._wait_for(self.nodes)
        return self

    def __exit__(self, *exc) -> None:
        for process in reversed(self.processes):
            process.terminate()  # `ray start --block` stops its node's processes
        for process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def one_job(args, nodes: int, seed: int) -> dict:
    import ansor
    from ansor.workloads import make_task

    task = make_task(args.workload, tuple(args.shape), target=ansor.Target.host(num_cores=1))
    scratch = tempfile.mkdtemp(prefix="ansor-bench-")
    try:
        with LocalCluster(nodes, {"ANSOR_CACHE_DIR": os.path.join(scratch, "cache")}) as cluster:
            start = time.perf_counter()
            result = ansor.tune(task, trials=args.trials, database=os.path.join(scratch, "records.db"),
                                cluster=cluster.address, seed=seed, progress=False)
            seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"nodes": nodes, "trials": result.trials, "seconds": seconds, "trials_per_second": result.trials / seconds,
            "search_seconds": result.search_seconds, "measure_seconds": result.measure_seconds,
            "best_gflops": result.best_gflops, "errors": result.errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="matmul")
    parser.add_argument("--shape", type=lambda s: [int(x) for x in s.split(",")], default=[256, 256, 256])
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="append the results here as JSON lines")
    args = parser.parse_args()
    runs = []
    for round_index in range(args.rounds):
        order = (1, 2) if round_index % 2 == 0 else (2, 1)
        for nodes in order:
            run = one_job(args, nodes, seed=round_index)
            runs.append(run)
            print(f"round {round_index + 1}, {nodes} node{'s' if nodes > 1 else ''}: {run['trials']} trials in "
                  f"{run['seconds']:.1f} s = {run['trials_per_second']:.2f} trials/s (search {run['search_seconds']:.1f} s, "
                  f"measurement {run['measure_seconds']:.1f} s; best {run['best_gflops']:.1f} GFLOP/s, "
                  f"{run['errors']} errors)", flush=True)
    one = statistics.median(r["trials_per_second"] for r in runs if r["nodes"] == 1)
    two = statistics.median(r["trials_per_second"] for r in runs if r["nodes"] == 2)
    print(f"median trials/s: 1 node {one:.2f}, 2 nodes {two:.2f}: {two / one:.2f}x "
          f"({args.workload} {'x'.join(map(str, args.shape))}, Target.host(num_cores=1), {args.trials} trials, "
          f"{machine_name()})")
    if args.json:
        with open(args.json, "a") as f:
            for run in runs:
                f.write(json.dumps({**run, "workload": args.workload, "shape": args.shape, "machine": machine_name(),
                                    "commit": git_commit(), "argv": sys.argv[1:]}) + "\n")


if __name__ == "__main__":
    main()
