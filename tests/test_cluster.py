"""Measurement on a Ray cluster (ansor.tuning.cluster), on real local clusters: the two nodes
that .ci/ray.sh starts (ANSOR_TEST_RAY_ADDRESS), and, for the test that kills a node, a
two-node cluster of the test's own, so the shared one stays whole."""

from __future__ import annotations

import io
import logging
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import ansor
from ansor.cli import main
from ansor.report import TuneProgress
from ansor.store import open_store
from ansor.tuning.callbacks import TuningCallback
from ansor.tuning.cluster import ClusterError, check_address
from ansor.tuning.measurer import PHASE_COMPILING
from ansor.workloads import make_task

ADDRESS = os.environ.get("ANSOR_TEST_RAY_ADDRESS")


def _needs_ray():
    return pytest.importorskip("ray")


def _needs_cluster() -> str:
    _needs_ray()
    if not ADDRESS:
        pytest.skip("no Ray cluster: ANSOR_TEST_RAY_ADDRESS is not set (.ci/ray.sh starts one)")
    return ADDRESS


def _task(n: int = 64):
    return make_task("matmul", (n, n, n), target=ansor.Target.host(num_cores=1))


def _check_built(task, db) -> None:
    """The database's best program, built here, computes the matmul numpy computes."""
    kernel = ansor.build(task, database=db, quick_trials=0)
    a, b = (np.random.default_rng(i).standard_normal((64, 64)).astype("float32") for i in (1, 2))
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_addresses_are_checked_before_anything_connects():
    for good in ("auto", "ray://head:10001", "ray://10.0.0.1", "10.0.0.1:6379", "head.example:6379"):
        assert check_address(good) == good
    for bad in ("", "head", "http://head:6379", "ray://", "head:port"):
        with pytest.raises(ValueError, match="cluster address"):
            check_address(bad)
    with pytest.raises(ValueError, match="cluster address"):
        ansor.TuneOptions(cluster="nowhere")


def test_missing_ray_is_one_line_naming_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    with pytest.raises(ClusterError, match=r"pip install 'ansor\[cluster\]'") as info:
        ansor.tune(_task(), trials=4, database=str(tmp_path / "r.db"), cluster="127.0.0.1:1", progress=False)
    assert "\n" not in str(info.value)


def test_a_task_tuned_across_two_nodes(tmp_path):
    address = _needs_cluster()
    task, db = _task(), str(tmp_path / "records.db")
    shown = io.StringIO()
    result = ansor.tune(task, trials=12, database=db, cluster=address, policy="sketch.random", seed=3,
                        confirm_best=2, progress=False, callbacks=[TuneProgress(total=12, stream=shown)])
    assert result.trials == 12 and not result.errors
    with open_store(db)[0] as store:
        records = store.records(task.workload_key, task.target.key)
    assert len(records) == 12 + 2  # the two leaders measured again
    nodes = {r.node for r in records}
    assert len(nodes) == 2 and "" not in nodes  # both nodes measured, and the records say which
    assert all(r.ok for r in records)
    assert len({r.state_key for r in records}) == 12
    assert "by node: " in shown.getvalue() and all(node in shown.getvalue() for node in nodes)
    _check_built(task, db)


def test_a_target_no_node_offers_fails_at_once(tmp_path):
    address = _needs_cluster()
    here = ansor.Target.host()
    four_cores = ansor.Target("cpu", here.isa, 4, here.vector_unit_bytes, 64)  # the nodes have 1 CPU each
    task, db = make_task("matmul", (64, 64, 64), target=four_cores), str(tmp_path / "records.db")
    with pytest.raises(ClusterError) as info:
        ansor.tune(task, trials=8, database=db, cluster=address, progress=False)
    message = str(info.value)
    assert four_cores.key in message and "nodes offer" in message and "up to 1 core" in message
    with open_store(db)[0] as store:
        assert store.count(task.workload_key, task.target.key) == 0


# --- a node killed with kill -9 while it measures -----------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live process."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                out.append((int(entry), int(fields[1]), int(fields[2])))
    return out


def _tree(root: int) -> set[int]:
    """The process and all its descendants (a Ray node: raylet, agents and workers, whichever
    session each runs in)."""
    children: dict[int, list[int]] = {}
    for pid, parent, _ in _processes():
        children.setdefault(parent, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo += children.get(pid, [])
    return tree


@pytest.fixture
def own_cluster(tmp_path_factory):
    """A head and a second node, one CPU each, each `ray start --block` in its own process group."""
    ray = _needs_ray()
    folder = tmp_path_factory.mktemp("ray")  # the nodes' output
    short = f"/tmp/ansor-test-ray-{os.getpid()}"  # Ray's socket paths must stay short
    os.makedirs(short, exist_ok=True)
    port = _free_port()
    common = ["--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats", f"--temp-dir={short}",
              "--node-ip-address=127.0.0.1", "--block"]
    started = []

    def start(*args):
        log = open(folder / f"node{len(started)}.log", "w")
        started.append(subprocess.Popen(["ray", "start", *args, *common], stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True))

    def nodes_alive() -> int:
        ray.init(address=f"127.0.0.1:{port}", logging_level=logging.ERROR, log_to_driver=False)
        try:
            return sum(n["Alive"] for n in ray.nodes())
        finally:
            ray.shutdown()

    try:
        start("--head", f"--port={port}", "--include-dashboard=false", f"--ray-client-server-port={_free_port()}")
        for want in (1, 2):
            for _ in range(60):
                try:
                    if nodes_alive() >= want:
                        break
                except Exception:  # noqa: BLE001 - not up yet
                    pass
                time.sleep(1)
            else:
                pytest.fail(f"the test's Ray cluster did not reach {want} node(s); logs in {folder}")
            if want == 1:
                start(f"--address=127.0.0.1:{port}")
        yield f"127.0.0.1:{port}", started[1]
    finally:
        for process in reversed(started):
            if process.poll() is None:
                process.terminate()  # `ray start --block` stops its node's processes
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        subprocess.run(["rm", "-rf", short], check=False)


class KillNodeMidRun(TuningCallback):
    """kill -9 of every process of the second node, once it has measured a program and a few
    programs are in: what a machine that dies does to its work."""

    def __init__(self, node_process: subprocess.Popen):
        self.node_process = node_process
        self.victim = None        # the node's name in the records
        self.killed_at = 0.0
        self.session = None
        self.tree: set[int] = set()  # the node's processes when it was killed
        self.seen = 0

    def on_result(self, tuner, result) -> None:
        self.seen += 1
        if self.victim is not None or self.seen < 4:
            return
        import ray

        head = next(n for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"])
        if result.record.node and not result.record.node.endswith(head["NodeID"][:6]):
            self.victim, self.session = result.record.node, tuner.measurer.session
            self.killed_at = time.time()
            self.tree = _tree(self.node_process.pid)
            for pid in self.tree:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.node_process.wait()


def test_a_node_killed_mid_run_loses_nothing(own_cluster, tmp_path):
    address, second_node = own_cluster
    task, db = _task(), str(tmp_path / "records.db")
    killer = KillNodeMidRun(second_node)
    result = ansor.tune(task, trials=16, database=db, cluster=address, policy="sketch.random", seed=5,
                        confirm_best=0, progress=False, callbacks=[killer])
    assert killer.victim is not None, "the second node never measured a program"
    assert any(line.startswith(killer.victim) for line in killer.session.lost)  # the job saw it go
    assert result.trials == 16
    with open_store(db)[0] as store:
        records = store.records(task.workload_key, task.target.key)
    assert len(records) == 16 and len({r.state_key for r in records}) == 16  # each program exactly once
    for r in records:
        assert r.ok or (killer.victim in r.error_msg and "lost" in r.error_msg), r.error_msg
    after = {r.node for r in records if r.timestamp > killer.killed_at}
    assert after and killer.victim not in after, "the job did not go on on the node left"
    _check_built(task, db)
    # nothing of the killed node is left, and the job's own actors and workers ended with it
    deadline = time.time() + 20
    pids = {pid for node_pids in killer.session.node_pids.values() for pid in node_pids} | killer.tree
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.5)
    assert not [p for p in pids if _alive(p)], "a process of the killed node or of the job's actors is left"


INTERRUPTED_JOB = """
import sys
import ansor
from ansor.tuning.callbacks import TuningCallback
from ansor.workloads import make_task

class ShowProcesses(TuningCallback):
    def on_result(self, tuner, result):
        pids = sorted(p for node in tuner.measurer.session.node_pids.values() for p in node)
        print("measured", *pids, flush=True)

task = make_task("matmul", (64, 64, 64), target=ansor.Target.host(num_cores=1))
try:
    ansor.tune(task, trials=500, database=sys.argv[2], cluster=sys.argv[1], policy="sketch.random",
               progress=False, callbacks=[ShowProcesses()])
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_ctrl_c_of_the_job_stops_the_remote_work(tmp_path):
    address = _needs_cluster()
    db = str(tmp_path / "records.db")
    job = subprocess.Popen([sys.executable, "-c", INTERRUPTED_JOB, address, db], stdout=subprocess.PIPE, text=True)
    try:
        pids, lines = set(), 0
        for line in job.stdout:
            if line.startswith("measured"):
                lines += 1
                pids.update(int(p) for p in line.split()[1:])
                if lines >= 4 and len(pids) >= 2:  # actors of both nodes and a measurement worker
                    break
        job.send_signal(signal.SIGINT)
        rest = job.stdout.read()
        assert job.wait(timeout=60) == 130 and "interrupted" in rest
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.5)
    assert not [p for p in pids if _alive(p)], "a measuring process outlived the interrupted job"
    with open_store(db)[0] as store:
        assert store.count() >= lines  # everything measured before the signal is kept


def _assert_ended(pids: set[int], what: str) -> None:
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.5)
    assert not [p for p in pids if _alive(p)], what


# --- a model's tasks across two nodes, records in PostgreSQL, one node killed ---------------------

MODEL_SOURCE = '''
import torch

class ConvReluLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))

def model():
    torch.manual_seed(0)
    return ConvReluLinear().eval(), (torch.randn(1, 3, 8, 8),)
'''


def _model_file(folder) -> str:
    """A small PyTorch model the package has never seen, as `ansor tune-model` takes it."""
    pytest.importorskip("torch")
    path = folder / "conv_relu_linear.py"
    path.write_text(MODEL_SOURCE)
    return str(path)


def _rows_per_program(url: str) -> dict[tuple[str, str, str], int]:
    """The PostgreSQL rows of each measured program, counted by the server."""
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT workload_key, target_key, state_key, count(*) FROM ansor_records "
                            "GROUP BY workload_key, target_key, state_key").fetchall()
    return {(w, t, s): n for w, t, s, n in rows}


def _check_model_built_from(url: str, model_path: str, graph, target) -> None:
    """The model built from the database's records (every task from a record of a node)
    computes what PyTorch computes."""
    net, inputs = runpy.run_path(model_path)["model"]()
    compiled = ansor.build(graph, database=url, target=target, quick_seconds=0, verbose=False)
    assert compiled.kernels and all(k.record is not None and k.record.node for k in compiled.kernels.values())
    out = compiled(*(x.numpy() for x in inputs))
    np.testing.assert_allclose(out, net(*inputs).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_a_models_tasks_tuned_into_postgresql_while_a_node_is_killed(pg_url, own_cluster, tmp_path):
    address, second_node = own_cluster
    model_path = _model_file(tmp_path)
    net, inputs = runpy.run_path(model_path)["model"]()
    graph = ansor.graph.from_torch(net, inputs)
    one_core = ansor.Target.host(num_cores=1)  # what each 1-CPU node offers
    killer = KillNodeMidRun(second_node)
    results = ansor.tune(graph, trials=16, database=pg_url, cluster=address, target=one_core,
                         policy="sketch.random", seed=5, confirm_best=0, progress=False, callbacks=[killer])
    assert killer.victim is not None, "the second node never measured a program"
    assert any(line.startswith(killer.victim) for line in killer.session.lost)  # the job saw it go
    assert len(results) == 2 and sum(r.trials for r in results) == 16  # the job finished on the other node

    rows = _rows_per_program(pg_url)
    assert len(rows) == 16 and set(rows.values()) == {1}  # every measured program, each exactly once
    assert {w for w, _, _ in rows} == {r.task.workload_key for r in results}
    with open_store(pg_url, create=False)[0] as store:
        records = [r for result in results for r in store.records(result.task.workload_key, one_core.key)]
    assert len(records) == 16
    for r in records:
        assert r.ok or (killer.victim in r.error_msg and "lost" in r.error_msg), r.error_msg
    after = {r.node for r in records if r.timestamp > killer.killed_at}
    assert after and killer.victim not in after, "the job did not go on on the node left"
    _check_model_built_from(pg_url, model_path, graph, one_core)
    pids = {pid for node_pids in killer.session.node_pids.values() for pid in node_pids} | killer.tree
    _assert_ended(pids, "a process of the killed node or of the job's actors is left")


# --- a program lost twice ---------------------------------------------------------------------------

class KillEachActorHoldingACall(TuningCallback):
    """kill -9 of a measuring actor's process as soon as it holds a call, once per actor: the
    programs of the first call are lost with the first actor, handed to the other and lost
    with it too."""

    def __init__(self):
        self.killed: list[str] = []  # node names, in the order their actors died
        self.tree: set[int] = set()  # the actors' processes and their children when killed
        self.session = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def on_phase(self, tuner, phase) -> None:
        if phase == PHASE_COMPILING and self._watcher is None:
            self.session = tuner.measurer.session
            self._watcher = threading.Thread(target=self._watch, args=(tuner.measurer.pool,), daemon=True)
            self._watcher.start()

    def _watch(self, pool) -> None:
        while not self._stop.is_set() and len(self.killed) < 2:
            for actor in list(pool.actors):
                if actor.calls and actor.node.name not in self.killed:
                    self.tree |= _tree(actor.pids[0])
                    os.kill(actor.pids[0], signal.SIGKILL)
                    self.killed.append(actor.node.name)
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join()


def test_a_program_lost_twice_is_an_error_record_naming_both_nodes(tmp_path):
    address = _needs_cluster()
    task, db = _task(), str(tmp_path / "records.db")
    killer = KillEachActorHoldingACall()
    try:
        result = ansor.tune(task, trials=2, measures_per_round=2, database=db, cluster=address,
                            policy="sketch.random", seed=7, confirm_best=0, progress=False, callbacks=[killer])
    finally:
        killer.stop()
    assert len(killer.killed) == 2 and len(set(killer.killed)) == 2, killer.killed
    first, second = killer.killed
    assert result.trials == 2  # the job ended with the results it had, no node left to wait for
    with open_store(db)[0] as store:
        records = store.records(task.workload_key, task.target.key)
    assert len(records) == 2 and len({r.state_key for r in records}) == 2
    for r in records:
        assert not r.ok and r.node == f"{first}, {second}", (r.node, r.error_msg)
        assert "lost with its node, twice" in r.error_msg
        assert r.error_msg.index(first) < r.error_msg.index(second)  # in the order they were lost
    _assert_ended(killer.tree, "a process of a killed actor is left")


# --- the command line ---------------------------------------------------------------------------

def test_tune_model_on_a_cluster_into_postgresql_from_the_command_line(pg_url, tmp_path, capsys):
    address = _needs_cluster()
    model_path = _model_file(tmp_path)
    assert main(["tune-model", model_path, "--cores", "1", "--trials", "4", "--cluster", address,
                 "--database", pg_url, "--seed", "1", "--quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "4 programs measured" in out and "--cores 1" in out
    rows = _rows_per_program(pg_url)
    assert len(rows) == 4 and set(rows.values()) == {1}
    one_core = ansor.Target.host(num_cores=1)
    assert {t for _, t, _ in rows} == {one_core.key}
    with open_store(pg_url, create=False)[0] as store:
        assert all(r.ok and r.node for r in store.records())  # measured on a node, which the records name
    net, inputs = runpy.run_path(model_path)["model"]()
    _check_model_built_from(pg_url, model_path, ansor.graph.from_torch(net, inputs), one_core)


def test_a_cluster_failure_is_one_line_on_the_command_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # as where Ray is not installed
    assert main(["tune", "matmul", "--shape", "16,16,16", "--cores", "1", "--trials", "2", "--cluster",
                 "127.0.0.1:1", "--database", str(tmp_path / "r.db"), "--quiet", "--no-baseline"]) == 2
    err = capsys.readouterr().err
    assert "ansor: error: " in err and "pip install 'ansor[cluster]'" in err and "Traceback" not in err
