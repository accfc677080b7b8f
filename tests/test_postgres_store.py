"""The record store contract on SQLite and on a real PostgreSQL server, and what a shared
database must hold: batches whole, every measurement once, concurrent jobs and readers.

The PostgreSQL tests need psycopg (the ``postgres`` extra) and a server: `.ci/postgres.sh`
starts one and exports its URL as ``ANSOR_TEST_POSTGRES_URL``. Each test gets a database of its
own, dropped afterwards.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ansor
from ansor.cli import main
from ansor.records import DatabaseError, Record
from ansor.store import PostgresStore, SQLiteStore, open_store
from ansor.store.postgres import redacted_url
from ansor.workloads import make_task

WK = "matmul-512"
TK = "cpu-x86_64-avx512-2c"
STEPS = [["SP", 2, 0, 512, [4, 8, 8], 1], ["AN", 2, 0, 3]]
SRC = str(Path(__file__).resolve().parents[1] / "src")


def rec(state: str, costs=(1e-3,), error_no: int = 0, wk: str = WK, tk: str = TK, ts: float = 1.0, **kw) -> Record:
    return Record(workload_key=wk, target_key=tk, steps=STEPS, state_key=state, costs=costs, error_no=error_no,
                  timestamp=ts, **kw)


# ------------------------------------------------------------------ where the stores live


@pytest.fixture(params=["sqlite", "postgres"])
def location(request, tmp_path):
    """Where a store lives: an SQLite file's path or a fresh PostgreSQL database's URL."""
    if request.param == "sqlite":
        return str(tmp_path / "records.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(location):
    db, _ = open_store(location)
    with db:
        yield db


def _connect(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=True)


# ------------------------------------------------------------------ the contract, on both stores


def test_store_opened_by_location(location):
    with open_store(location)[0] as db:
        assert isinstance(db, PostgresStore if location.startswith("postgresql://") else SQLiteStore)


def test_add_and_query(store):
    store.add_workload(WK, {"op": "matmul", "shape": [512, 512, 512]}, flop=2 * 512**3)
    store.add_workload(WK, {"op": "ignored"}, flop=1.0)  # the first description stays
    store.add_target(TK, {"kind": "cpu"})
    store.add_target(TK, {"kind": "ignored"})
    batch = [rec("s1", (3e-3,), ts=1), rec("s2", (), error_no=2, error_msg="cc failed", ts=2), rec("s3", (1e-3,), ts=3)]
    other = [rec("t1", (5e-3,), wk="conv", ts=4)]
    assert store.add_records(batch) == 3
    assert store.add_records(iter(other)) == 1
    assert store.add_records([]) == 0

    assert store.records() == batch + other
    assert store.records(WK) == batch
    assert store.records(WK, TK, ok_only=True) == [batch[0], batch[2]]
    assert store.records(target_key="nope") == []
    assert (store.count(), store.count(WK), store.count("conv", TK)) == (4, 3, 1)
    w = store.workload(WK)
    assert w["description"] == {"op": "matmul", "shape": [512, 512, 512]} and w["flop"] == 2 * 512**3
    assert store.workload("missing") is None
    assert store.workload_keys() == ["conv", WK]  # byte order, as SQLite sorts
    assert store.target(TK) == {"key": TK, "description": {"kind": "cpu"}}
    assert store.target_keys() == [TK]

    rows = {(s["workload_key"], s["target_key"]): s for s in store.summary()}
    s = rows[(WK, TK)]
    assert (s["n_records"], s["n_ok"]) == (3, 2) and s["best_cost"] == pytest.approx(1e-3)
    assert s["best_gflops"] == pytest.approx(2 * 512**3 / 1e-3 / 1e9) and s["target"] == {"kind": "cpu"}
    assert rows[("conv", TK)]["workload"] is None and rows[("conv", TK)]["best_gflops"] is None


def test_best_pools_the_runs_of_a_program(store):
    store.add_records([
        rec("slow", (9e-3,)), rec("err", (), error_no=7), rec("fast", (2e-3,)),
        rec("fast", (1e-3,), ts=2), rec("mid", (5e-3,)), rec("other-target", (1e-6,), tk="cuda"),
        rec("lucky", (1.4e-3,)), rec("lucky", (8e-3, 8e-3), ts=3),
    ])
    best = store.best(WK, TK, k=10)
    assert [r.state_key for r in best] == ["fast", "mid", "lucky", "slow"]
    assert best[0].costs == (2e-3, 1e-3) and best[0].median_cost == pytest.approx(1.5e-3)
    assert store.best(WK, TK) == [best[0]] and store.best(WK, TK, k=0) == [] and store.best("x", TK) == []
    rows = {row["target_key"]: row for row in store.summary()}
    assert rows[TK]["best_runs"] == (2e-3, 1e-3) and rows["cuda"]["best_cost"] == 1e-6


def test_measured_state_keys_include_errors(store):
    store.add_records([rec("a"), rec("b", (), error_no=5), rec("a", ts=2), rec("c", tk="cuda")])
    assert store.measured_state_keys(WK, TK) == {"a", "b"}
    assert store.measured_state_keys(WK, "cuda") == {"c"}
    assert store.measured_state_keys("x", TK) == set()


def test_the_node_that_measured_a_record_is_kept(store, tmp_path):
    here, there = rec("a"), rec("b", node="worker-2")
    store.add_records([here, there])
    assert [r.node for r in store.records()] == ["", "worker-2"]
    out = tmp_path / "out.jsonl"
    store.export_jsonl(out)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert "node" not in lines[0] and lines[1]["node"] == "worker-2"  # an unnamed node reads as before


def test_a_failed_batch_adds_nothing(store):
    store.add_records([rec("a")])
    with pytest.raises(TypeError):
        store.add_records([rec("b"), "not a record"])  # type: ignore[list-item]
    assert store.measured_state_keys(WK, TK) == {"a"}


def test_two_objects_on_one_database(location):
    with open_store(location)[0] as a, open_store(location)[0] as b:
        a.add_records([rec("a")])
        assert b.measured_state_keys(WK, TK) == {"a"}
        b.add_records([rec("b")])
        assert a.count() == 2


def test_a_closed_store_refuses_calls(location):
    db = open_store(location)[0]
    db.close()
    db.close()  # idempotent
    assert db.closed
    with pytest.raises(DatabaseError, match="closed"):
        db.count()


def test_read_only_opening_reads_and_refuses_writes(location):
    with open_store(location)[0] as db:
        db.add_workload(WK, {"name": "m"}, 1e6)
        db.add_records([rec("s1"), rec("s2", costs=(2e-3,))])
    with open_store(location, create=False)[0] as ro:
        assert ro.read_only
        assert [r.state_key for r in ro.records()] == ["s1", "s2"] and ro.best(WK, TK)[0].state_key == "s1"
        for write in (lambda: ro.add_records([rec("s3")]), lambda: ro.add_workload("w", {}),
                      lambda: ro.add_target("t", {})):
            with pytest.raises(DatabaseError, match="read-only"):
                write()
        assert ro.count() == 2


def test_read_only_opening_of_a_database_without_records_creates_nothing(location):
    with pytest.raises(DatabaseError):
        open_store(location, create=False)
    if location.startswith("postgresql://"):
        with _connect(location) as conn:
            assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'ansor%'").fetchone()[0] == 0
    else:
        assert not Path(location).exists()


def test_a_description_gains_the_computation_and_is_never_replaced_otherwise(store):
    store.add_workload(WK, {"name": "old"})
    store.add_workload(WK, {"name": "new", "computation": {"format": "x"}})
    assert store.workload(WK)["description"] == {"name": "new", "computation": {"format": "x"}}
    store.add_workload(WK, {"name": "newer", "computation": {"format": "y"}})
    store.add_workload(WK, {"name": "newest"})
    assert store.workload(WK)["description"]["name"] == "new"


def test_export_import_roundtrip_and_duplicates(store, location, tmp_path):
    store.add_workload(WK, {"op": "matmul"}, flop=123.0)
    store.add_workload("conv", {"op": "conv2d"}, flop=7.0)
    store.add_target(TK, {"kind": "cpu"})
    store.add_records([rec("a", (2e-3, 1e-3), ts=1.25, all_cost=0.75), rec("b", (), error_no=6, error_msg="timeout"),
                       rec("c", wk="conv", node="n1")])
    out = tmp_path / "records.jsonl"
    assert store.export_jsonl(out) == 3
    with SQLiteStore(tmp_path / "fresh.db") as fresh:
        assert fresh.import_jsonl(out) == 3
        assert fresh.records() == store.records()
        assert fresh.workload(WK) == store.workload(WK) and fresh.target(TK) == store.target(TK)
        again = tmp_path / "again.jsonl"
        fresh.export_jsonl(again)
        assert again.read_text() == out.read_text()
    assert store.import_jsonl(out) == 0 and store.count() == 3  # nothing twice
    dup = tmp_path / "dup.jsonl"
    dup.write_text(f"# by hand\n\n{rec('d').to_json()}\n{rec('d').to_json()}\n{rec('d', ts=2).to_json()}\n")
    assert store.import_jsonl(dup) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(f"{rec('e').to_json()}\n{{not json\n")
    with pytest.raises(DatabaseError, match="line 2"):
        store.import_jsonl(bad)
    assert store.count() == 5  # a bad file imports nothing


def test_newer_schema_is_refused(location):
    open_store(location)[0].close()
    if location.startswith("postgresql://"):
        with _connect(location) as conn:
            conn.execute("INSERT INTO ansor_schema_version (version, applied) VALUES (99, 0)")
    else:
        with sqlite3.connect(location) as conn:
            conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        conn.close()
    for create in (True, False):
        with pytest.raises(DatabaseError, match="schema version 99, newer"):
            open_store(location, create=create)


def test_a_reader_never_sees_half_a_batch(location):
    """A writer commits batches of 25 while a reader counts: every count is whole batches."""
    batches, size = 12, 25
    seen: list[int] = []
    done = threading.Event()

    def write() -> None:
        with open_store(location)[0] as db:
            for b in range(batches):
                db.add_records(rec(f"b{b}-{i}", ts=float(b * size + i)) for i in range(size))
        done.set()

    with open_store(location)[0]:
        pass  # the schema exists before either side starts
    writer = threading.Thread(target=write)
    with open_store(location, create=False)[0] as reader:
        writer.start()
        while not done.is_set():
            seen.append(reader.count())
        writer.join()
        seen.append(reader.count())
    assert all(n % size == 0 for n in seen), sorted(set(seen))
    assert seen[-1] == batches * size


# ------------------------------------------------------------------ the old SQLite files still open


_SCHEMA_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE workloads (key TEXT PRIMARY KEY, description TEXT NOT NULL, flop REAL NOT NULL DEFAULT 0,
                        created REAL NOT NULL);
CREATE TABLE targets (key TEXT PRIMARY KEY, description TEXT NOT NULL);
CREATE TABLE records (id INTEGER PRIMARY KEY, workload_key TEXT NOT NULL, target_key TEXT NOT NULL,
    state_key TEXT NOT NULL, steps TEXT NOT NULL, costs TEXT NOT NULL, median_cost REAL,
    error_no INTEGER NOT NULL, error_msg TEXT NOT NULL, all_cost REAL NOT NULL, timestamp REAL NOT NULL,
    version TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO records (workload_key, target_key, state_key, steps, costs, median_cost, error_no, error_msg,
    all_cost, timestamp, version) VALUES ('matmul-512', 'cpu-x86_64-avx512-2c', 'old', '[]', '[0.002]', 0.002,
    0, '', 0.0, 1.0, 'ansor-1');
"""


def _version_1_file(path: Path) -> None:
    """A records file as ansor wrote it before records named their node."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 1095652178")
    conn.executescript(_SCHEMA_V1)
    conn.commit()
    conn.close()


def test_a_version_1_sqlite_file_is_read_as_it_is_and_migrated_when_written(tmp_path):
    path = tmp_path / "old.db"
    _version_1_file(path)
    before = path.read_bytes()
    with SQLiteStore(path, create=False) as ro:
        assert [(r.state_key, r.node) for r in ro.records()] == [("old", "")]
    assert path.read_bytes() == before  # read-only: not migrated
    with SQLiteStore(path) as db:
        db.add_records([rec("new", node="n2")])
        assert [(r.state_key, r.node) for r in db.records()] == [("old", ""), ("new", "n2")]
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == "2"
    conn.close()


# ------------------------------------------------------------------ opening by URL


def test_urls_are_refused_by_name_where_they_cannot_be_served(tmp_path, monkeypatch):
    with pytest.raises(DatabaseError, match=r"mysql:// databases are not supported"):
        open_store("mysql://host/db")
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the postgres extra were not installed
    with pytest.raises(DatabaseError, match=r"pip install 'ansor\[postgres\]'"):
        open_store("postgresql://nobody@localhost/none")
    monkeypatch.setenv("ANSOR_DB", "postgres://nobody@localhost/none")
    with pytest.raises(DatabaseError, match=r"ansor\[postgres\]"):
        open_store(None)  # the default database may be a server too
    assert list(tmp_path.iterdir()) == []  # no file named after a URL


def test_passwords_are_not_shown():
    assert redacted_url("postgresql://me:secret@db:5432/ansor") == "postgresql://me:***@db:5432/ansor"
    assert redacted_url("postgres://db/ansor?sslmode=require&password=s3") == "postgres://db/ansor?sslmode=require&password=***"
    assert redacted_url("postgresql:///ansor?host=/run/pg") == "postgresql:///ansor?host=/run/pg"


def test_an_unreachable_server_is_one_clear_error(tmp_path):
    pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")
    url = f"postgresql:///ansor?host={tmp_path}&user=me&password=hunter2&connect_timeout=2"
    with pytest.raises(DatabaseError, match="cannot connect") as info:
        open_store(url)
    assert "hunter2" not in str(info.value) and "\n" not in str(info.value)


# ------------------------------------------------------------------ PostgreSQL under concurrency


def _backend_pids(url: str) -> list[int]:
    with _connect(url) as conn:
        return [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'ansor'")]


def test_clients_opening_a_blank_database_at_once_make_the_tables_once(pg_url):
    errors: list[BaseException] = []

    def open_and_write(i: int) -> None:
        try:
            with open_store(pg_url)[0] as db:
                db.add_records([rec(f"s{i}")])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_and_write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with _connect(pg_url) as conn:
        assert conn.execute("SELECT version FROM ansor_schema_version").fetchall() == [(1,)]
        assert conn.execute("SELECT count(*) FROM ansor_records").fetchone()[0] == 4


def test_a_lost_connection_is_reopened_and_the_batch_stored_once(pg_url):
    with open_store(pg_url)[0] as db:
        db.add_records([rec("a")])
        (pid,) = _backend_pids(pg_url)
        with _connect(pg_url) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
        assert db.add_records([rec("b"), rec("a")]) == 1  # reconnected; "a" was stored already
        assert sorted(r.state_key for r in db.records()) == ["a", "b"]


def test_a_deadlocked_batch_is_retried(pg_url):
    """The store's batch and another client insert the same two measurements in opposite orders;
    the server aborts the store's transaction (it waited first), the store retries, and each
    measurement is stored once."""
    first, second = rec("x", ts=1.0), rec("y", ts=2.0)
    row = PostgresStore._row_from_record
    insert = ("INSERT INTO ansor_records (workload_key, target_key, state_key, steps, costs, median_cost, error_no,"
              " error_msg, all_cost, timestamp, version, node) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
              " ON CONFLICT (workload_key, target_key, md5(state_key), timestamp) DO NOTHING")
    with open_store(pg_url)[0] as db, _connect(pg_url) as other:
        other.execute("BEGIN")
        other.execute(insert, row(second))  # holds `second` until it commits
        outcome: list = []
        writer = threading.Thread(target=lambda: outcome.append(db.add_records([first, second])))
        writer.start()
        (pid,) = _backend_pids(pg_url)
        with _connect(pg_url) as watch:
            for _ in range(200):  # until the store waits for `second`
                state = watch.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                if state and state[0] == "Lock":
                    break
                time.sleep(0.02)
        other.execute(insert, row(first))  # waits for the store: a cycle, which the store's check finds first
        other.execute("COMMIT")
        writer.join(timeout=30)
        assert outcome == [0]  # retried; by then the other client had stored both
        assert db.count() == 2 and {r.state_key for r in db.records()} == {"x", "y"}


def test_concurrent_writers_of_the_same_measurements_store_each_once(pg_url):
    """Four processes add overlapping batches of the same measurements at once."""
    script = (
        "import sys\n"
        "from ansor.records import Record\n"
        "from ansor.store import open_store\n"
        "db = open_store(sys.argv[1])[0]\n"
        "start = int(sys.argv[2])\n"
        "for b in range(10):\n"
        "    db.add_records(Record('w', 't', [], f's{i}', (1e-3,), 0, timestamp=float(i))\n"
        "                   for i in range(start + 10 * b, start + 10 * b + 30))\n"
        "db.close()\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open_store(pg_url)[0]:
        pass
    procs = [subprocess.Popen([sys.executable, "-c", script, pg_url, str(start)], env=env, stderr=subprocess.PIPE,
                              text=True) for start in (0, 5, 10, 15)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    with open_store(pg_url, create=False)[0] as db:
        keys = [r.state_key for r in db.records()]
    assert sorted(keys, key=lambda k: int(k[1:])) == [f"s{i}" for i in range(15 + 90 + 30)]


# ------------------------------------------------------------------ tuning with records in PostgreSQL


def test_a_task_tuned_into_postgresql_is_built_from_it_and_round_trips_through_sqlite(pg_url, tmp_path):
    task = make_task("matmul", (32, 32, 32))
    result = ansor.tune(task, trials=4, database=pg_url, seed=0, progress=False)
    assert result.trials == 4 and result.best_cost < float("inf")
    kernel = ansor.build(task, database=pg_url)
    a, b = (np.random.default_rng(i).random((32, 32), dtype=np.float32) for i in (1, 2))
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-4, atol=1e-4)
    with open_store(pg_url, create=False)[0] as db:
        best = db.best(task.workload_key, task.target.key)[0]
        records = db.records()
    assert kernel.record is not None and kernel.record.state_key == best.state_key
    assert len(records) >= 4 and len({r.state_key for r in records}) == 4

    # PostgreSQL -> SQLite -> a second PostgreSQL database, through the command line: the same records.
    first, second, sqlite = tmp_path / "pg.jsonl", tmp_path / "sqlite.jsonl", str(tmp_path / "copy.db")
    assert main(["export", str(first), "--database", pg_url]) == 0
    assert main(["import", str(first), "--database", sqlite]) == 0
    assert main(["export", str(second), "--database", sqlite]) == 0
    assert second.read_text() == first.read_text()
    with SQLiteStore(sqlite, create=False) as copy:
        assert copy.records() == records
    assert main(["import", str(second), "--database", pg_url]) == 0  # back where they came from: nothing new
    with open_store(pg_url, create=False)[0] as db:
        assert db.records() == records


def _run_cli(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ansor.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_tuning_jobs_and_a_reader_share_one_database(pg_url, tmp_path):
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "ANSOR_CACHE_DIR": str(tmp_path / "cache"), "ANSOR_DB": str(tmp_path / "unused.db"),
           "ANSOR_PRETRAINED": "0"}
    jobs = {shape: _run_cli(["tune", "matmul", "--shape", shape, "--trials", "4", "--database", pg_url,
                             "--quiet", "--no-baseline", "--seed", "1"], env)
            for shape in ("24,24,24", "40,40,40")}
    reads = 0
    while any(job.poll() is None for job in jobs.values()):
        show = subprocess.run([sys.executable, "-m", "ansor.cli", "show", "--database", pg_url], env=env,
                              capture_output=True, text=True, timeout=120)
        # before the first job has made the tables a reader finds no records database: not an error of the store
        assert show.returncode == 0 or "no ansor records" in show.stderr, show.stderr
        reads += show.returncode == 0
        time.sleep(0.5)  # leave the two cores to the jobs between reads
    outputs = {shape: job.communicate() for shape, job in jobs.items()}
    for shape, job in jobs.items():
        assert job.returncode == 0, outputs[shape][1]
    assert reads > 0
    with open_store(pg_url, create=False)[0] as db:
        for shape, (out, _) in outputs.items():
            task = make_task("matmul", tuple(int(x) for x in shape.split(",")))
            measured = int(re.search(r"(\d+) programs measured", out).group(1))
            added = re.search(r"(\d+) records added", out)
            records = db.records(task.workload_key, task.target.key)
            assert measured == 4
            assert len(records) == (int(added.group(1)) if added else measured)
            assert len({r.state_key for r in records}) == measured
            assert len({(r.state_key, r.timestamp) for r in records}) == len(records)  # no duplicate
    show = subprocess.run([sys.executable, "-m", "ansor.cli", "show", "--database", pg_url], env=env,
                          capture_output=True, text=True, timeout=120)
    assert show.returncode == 0 and "24x24x24" in show.stdout and "40x40x40" in show.stdout, show.stdout
