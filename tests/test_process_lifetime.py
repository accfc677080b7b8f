"""Worker processes end with their parent: nothing a killed or interrupted tuner started keeps
running (and slows the next measurements), and the database it wrote stays whole."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ansor.process_lifetime import parent_death_signal_supported

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")

WORKERS_START_SECONDS = 240.0  # a loaded machine may take a while to reach the second round
EXIT_SECONDS = 10.0


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: [state, ppid, ...]; None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _alive(pid: int) -> bool:
    """Whether `pid` runs; a zombie (exited, not yet reaped by its new parent) counts as gone."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def _descendants(root: int) -> set[int]:
    """Every live process whose parent chain leads to `root`."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as file:
            return file.read().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _wait_until_gone(pids: set[int], seconds: float) -> set[int]:
    """The pids still alive after up to `seconds`; those are killed, so no test leaves them."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    left = {p for p in pids if _alive(p)}
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def _committed_records(db_path: Path) -> int:
    if not db_path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1.0) as conn:
            return int(conn.execute("SELECT count(*) FROM records").fetchone()[0])
    except sqlite3.Error:
        return 0  # not created yet, or busy


TUNE_SCRIPT = """
import sys
import ansor
from ansor.costmodel.model import RandomModel
from ansor.search.sketch_policy import SketchPolicy
from ansor.workloads import make_task

task = make_task("matmul", (64, 64, 64))
# a trusted model from the first round: the search's worker pool starts at once
policy = SketchPolicy(task, 0, params={"search_workers": 2, "evolutionary_search_population": 128,
                                       "evolutionary_search_num_iters": 1}, cost_model=RandomModel())
try:
    ansor.tune(task, trials=100000, database=sys.argv[1], policy=policy, progress=False,
               measures_per_round=16)
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)
"""


def _start_tuner(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """The tuner, its output going to tmp_path/tuner.log: a pipe would stay open as long as
    any orphaned worker lives, and reading it would hang instead of failing."""
    db_path = tmp_path / "tune.db"
    env = {**os.environ, "ANSOR_CACHE_DIR": str(tmp_path / "cache")}
    with open(tmp_path / "tuner.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", TUNE_SCRIPT, str(db_path)], env=env,
                                stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group, for the SIGINT test
    return proc, db_path


def _log(tmp_path: Path) -> str:
    return (tmp_path / "tuner.log").read_text(errors="replace")[-3000:]


def _wait_for_workers(proc: subprocess.Popen, db_path: Path) -> set[int]:
    """The tuner's descendants once it has committed records and runs its measurement worker
    and both search workers (all Python processes like itself)."""
    deadline = time.monotonic() + WORKERS_START_SECONDS
    comm = _comm(proc.pid)
    while time.monotonic() < deadline and proc.poll() is None:
        family = _descendants(proc.pid)
        workers = [p for p in family if _comm(p) == comm]
        if len(workers) >= 3 and _committed_records(db_path) > 0:
            return family
        time.sleep(0.2)
    family = _descendants(proc.pid)
    proc.kill()
    proc.wait()
    _wait_until_gone(family, 0)
    pytest.fail(f"the tuner did not start its workers and commit records in time:\n"
                f"{_log(db_path.parent)}")


def test_killed_tuner_leaves_no_worker_and_a_whole_database(tmp_path) -> None:
    from ansor.store import Database

    proc, db_path = _start_tuner(tmp_path)
    family = _wait_for_workers(proc, db_path)
    proc.kill()
    proc.wait()
    assert _wait_until_gone(family, EXIT_SECONDS) == set()
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db = Database(db_path)
    try:
        records = db.records()
        assert records and all(isinstance(rec.steps, list) for rec in records)
        assert db.count() == len(records)
    finally:
        db.close()


def test_ctrl_c_stops_the_tuner_without_worker_tracebacks(tmp_path) -> None:
    """A terminal's Ctrl-C reaches the whole process group: the workers ignore it, the tuner
    stops, and no process prints a traceback."""
    proc, db_path = _start_tuner(tmp_path)
    family = _wait_for_workers(proc, db_path)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        _wait_until_gone(family, 0)
        pytest.fail(f"the tuner did not stop on SIGINT:\n{_log(tmp_path)}")
    assert _wait_until_gone(family, EXIT_SECONDS) == set()
    log = _log(tmp_path)
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    assert proc.returncode in (0, 130), log  # stopped (by an exception or a return)


CHILD_SCRIPT = """
import os, sys, time
from ansor.process_lifetime import bind_to_parent
parent = os.getpid()
if os.fork() == 0:
    bind_to_parent(parent, creator_is_main_thread=sys.argv[1] == "1")
    time.sleep(300)
    os._exit(0)
print("ready", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("death_signal", [True, False], ids=["death-signal", "polling"])
def test_bound_worker_exits_when_its_parent_is_killed(death_signal: bool) -> None:
    if death_signal and not parent_death_signal_supported():
        pytest.skip("no parent-death signal on this platform")
    proc = subprocess.Popen([sys.executable, "-c", CHILD_SCRIPT, "1" if death_signal else "0"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + EXIT_SECONDS
    family: set[int] = set()
    while not family and time.monotonic() < deadline:
        family = _descendants(proc.pid)
        time.sleep(0.05)
    assert len(family) == 1
    time.sleep(0.2)  # let the child bind itself
    proc.kill()
    proc.wait()
    proc.stdout.close()
    assert _wait_until_gone(family, EXIT_SECONDS) == set()


def test_a_worker_orphaned_before_binding_exits_at_once() -> None:
    """The parent died before the worker armed its signal: the parent-id check catches it."""
    script = textwrap.dedent("""
        import os, sys
        from ansor.process_lifetime import bind_to_parent
        bind_to_parent(os.getppid() + 1_000_000)  # a parent that is not ours any more
        sys.exit(0)  # not reached
    """)
    result = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert result.returncode == 1


def test_workers_started_from_a_finished_thread_keep_working() -> None:
    """The parent-death signal follows the thread that started a worker: workers started from
    a short-lived thread must not die with it (they watch the parent process instead)."""
    import threading

    import numpy as np

    from ansor.schedule.state import State
    from ansor.search.workers import SearchWorkers
    from ansor.workloads import make_task

    task = make_task("matmul", (16, 16, 16))
    workers = SearchWorkers(task.dag, n_workers=2, min_parallel=1)
    states = [State(task.dag)] * 4
    try:
        first: list = []
        thread = threading.Thread(target=lambda: first.extend(workers(states)))
        thread.start()
        thread.join()
        assert len(first) == 4
        pids = set(workers._pool._processes)
        time.sleep(0.5)  # a signal sent at the thread's exit has arrived by now
        assert all(_alive(pid) for pid in pids)
        again = workers(states)
        assert all(np.array_equal(a, b) for a, b in zip(first, again))
    finally:
        workers.close()


def test_measurement_worker_started_from_a_finished_thread_keeps_working(tmp_path) -> None:
    import threading

    import numpy as np

    from ansor.measure import Builder, MeasureErrorNo, Runner, TimingPolicy

    source = """
void add(void* a, void* b, void* c) {
  for (int i = 0; i < 64; ++i) ((float*)c)[i] = ((float*)a)[i] + ((float*)b)[i];
}
"""
    lib = Builder(cache_dir=tmp_path).compile_one(source).lib_path
    a, b = np.arange(64, dtype=np.float32), np.ones(64, dtype=np.float32)
    with Runner(timing=TimingPolicy(warmup=1, repeat=1, min_repeat_ms=1.0)) as runner:
        runner.set_task([a, b], [a + b])
        results: list = []
        thread = threading.Thread(target=lambda: results.append(runner.run(lib, "add")))
        thread.start()
        thread.join()
        pid = runner.worker_pid
        time.sleep(0.5)
        assert _alive(pid)
        results.append(runner.run(lib, "add"))
        assert runner.worker_pid == pid
        assert [r.error_no for r in results] == [MeasureErrorNo.NO_ERROR] * 2


def test_killed_model_tuner_keeps_its_records_and_the_rerun_resumes(tmp_path) -> None:
    """kill -9 of `ansor tune-model`: nothing of it stays alive, the database is whole, and the
    same command run again counts the kept records against its --trials."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 1)).eval()
    onnx_path = tmp_path / "m.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, 16, 16),), str(onnx_path), dynamo=True)
    db_path = tmp_path / "model.db"
    env = {**os.environ, "ANSOR_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "ansor.cli", "tune-model", str(onnx_path), "--trials", "100000",
               "--database", str(db_path), "--quiet"]
    with open(tmp_path / "tuner.log", "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + WORKERS_START_SECONDS
    while time.monotonic() < deadline and proc.poll() is None and _committed_records(db_path) == 0:
        time.sleep(0.2)
    family = _descendants(proc.pid)
    proc.kill()
    proc.wait()
    assert _wait_until_gone(family, EXIT_SECONDS) == set()
    kept = _committed_records(db_path)
    assert kept > 0, _log(tmp_path)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rerun = subprocess.run([*command[:6], "0", *command[7:]], env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert f"holds {kept} records" in rerun.stderr and "this run measures 0 more" in rerun.stderr
    assert _committed_records(db_path) == kept  # --trials 0 measures nothing
