"""Tests for the records database (ansor.store)."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ansor.records import RECORD_FORMAT_VERSION, DatabaseError, Record
from ansor.store import Database, default_database_path
from ansor.store.sqlite import APPLICATION_ID

WK = "matmul-512"
TK = "llvm -mcpu=x86-64"
STEPS = [["SP", 2, 0, 512, [4, 8, 8], 1], ["AN", 2, 0, 3]]


def rec(state: str, costs=(1e-3,), error_no: int = 0, wk: str = WK, tk: str = TK, ts: float = 1.0, **kw) -> Record:
    return Record(
        workload_key=wk,
        target_key=tk,
        steps=STEPS,
        state_key=state,
        costs=costs,
        error_no=error_no,
        timestamp=ts,
        **kw,
    )


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "records.db"


@pytest.fixture
def db(db_path: Path):
    with Database(db_path) as d:
        yield d


# ------------------------------------------------------------------ Record


def test_record_json_roundtrip_and_normalisation():
    r = Record(WK, TK, (("SP", 2, 0, 512, (4, 8, 8), 1),), "s1", [1e-3, 3e-3, 2e-3], 0, all_cost=0.5, timestamp=12.5)
    assert r.steps == [["SP", 2, 0, 512, [4, 8, 8], 1]]
    assert r.costs == (1e-3, 3e-3, 2e-3)
    assert r.median_cost == pytest.approx(2e-3)
    assert r.ok
    line = r.to_json()
    assert "\n" not in line
    assert list(json.loads(line)) == [
        "version", "workload_key", "target_key", "state_key", "steps",
        "costs", "error_no", "error_msg", "all_cost", "timestamp",
    ]  # fmt: skip
    back = Record.from_json(line)
    assert back == r and hash(back) == hash(r)
    assert back.version == RECORD_FORMAT_VERSION


def test_record_median_and_errors():
    assert rec("a", costs=(4.0, 1.0)).median_cost == 2.5
    err = rec("b", costs=(), error_no=4, error_msg="boom")
    assert err.median_cost == math.inf and not err.ok
    assert rec("c", costs=()).median_cost == math.inf
    assert not rec("c", costs=()).ok


def test_record_rejects_non_json_steps():
    with pytest.raises(TypeError):
        Record(WK, TK, [[object()]], "s", (1.0,), 0)


@pytest.mark.parametrize(
    "line, needle",
    [
        ("not json", "invalid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"workload_key": "w"}', "missing"),
        (json.dumps({**rec("s").to_dict(), "costs": "fast"}), "costs"),
        (json.dumps({**rec("s").to_dict(), "error_no": "0"}), "error_no"),
        (json.dumps({**rec("s").to_dict(), "version": "ansor-99"}), "version"),
    ],
)
def test_record_from_json_errors(line, needle):
    with pytest.raises(DatabaseError, match=needle):
        Record.from_json(line)


# -------------------------------------------------------------- basic use


def test_roundtrip_add_and_query(db: Database):
    db.add_workload(WK, {"op": "matmul", "shape": [512, 512, 512]}, flop=2 * 512**3)
    db.add_workload(WK, {"op": "ignored"}, flop=1.0)  # insert-or-ignore
    db.add_target(TK, {"kind": "llvm"})
    batch = [rec("s1", (3e-3,), ts=1), rec("s2", (), error_no=2, error_msg="cc failed", ts=2), rec("s3", (1e-3,), ts=3)]
    other = [rec("t1", (5e-3,), wk="conv", ts=4)]
    assert db.add_records(batch) == 3
    assert db.add_records(iter(other)) == 1

    assert db.records() == batch + other
    assert db.records(WK) == batch
    assert db.records(WK, TK, ok_only=True) == [batch[0], batch[2]]
    assert db.records(target_key="nope") == []
    assert db.count() == 4 and db.count(WK) == 3 and db.count("conv", TK) == 1

    w = db.workload(WK)
    assert w["description"] == {"op": "matmul", "shape": [512, 512, 512]}
    assert w["flop"] == 2 * 512**3
    assert db.workload("missing") is None
    assert db.workload_keys() == ["conv", WK]
    assert db.target(TK) == {"key": TK, "description": {"kind": "llvm"}}
    assert db.target_keys() == [TK]

    summary = {(s["workload_key"], s["target_key"]): s for s in db.summary()}
    s = summary[(WK, TK)]
    assert (s["n_records"], s["n_ok"]) == (3, 2)
    assert s["best_cost"] == pytest.approx(1e-3)
    assert s["workload"]["op"] == "matmul" and s["flop"] == 2 * 512**3
    assert s["best_gflops"] == pytest.approx(2 * 512**3 / 1e-3 / 1e9)
    assert s["target"] == {"kind": "llvm"}
    c = summary[("conv", TK)]
    assert c["workload"] is None and c["best_gflops"] is None


def test_best_ignores_errors_and_dedupes_states(db: Database):
    db.add_records(
        [
            rec("slow", (9e-3,)),
            rec("err", (), error_no=7),
            rec("fast", (2e-3,)),
            rec("fast", (1e-3,), ts=2),  # re-measured: both runs count
            rec("mid", (5e-3,)),
            rec("other-target", (1e-6,), tk="cuda"),
        ]
    )
    best = db.best(WK, TK, k=10)
    assert [r.state_key for r in best] == ["fast", "mid", "slow"]
    assert best[0].costs == (2e-3, 1e-3) and best[0].median_cost == pytest.approx(1.5e-3)
    assert db.best(WK, TK) == [best[0]]
    assert db.best(WK, TK, k=0) == []
    assert db.best("missing", TK) == []


def test_a_lucky_measurement_loses_its_place_when_measured_again(db: Database):
    db.add_records([rec("lucky", (1e-3,)), rec("steady", (2e-3, 2e-3)), rec("lucky", (3e-3, 3e-3, 3e-3), ts=2)])
    assert [r.state_key for r in db.best(WK, TK, k=2)] == ["steady", "lucky"]
    assert db.best(WK, TK)[0].median_cost == 2e-3
    assert db.summary()[0]["best_cost"] == 2e-3


def test_measured_state_keys_include_errors(db: Database):
    db.add_records([rec("a"), rec("b", (), error_no=5), rec("a", ts=2), rec("c", tk="cuda")])
    assert db.measured_state_keys(WK, TK) == {"a", "b"}
    assert db.measured_state_keys(WK, "cuda") == {"c"}
    assert db.measured_state_keys("x", TK) == set()


def test_new_file_is_wal_and_stamped(db_path: Path):
    Database(db_path).close()
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"meta", "workloads", "targets", "records"} <= tables
    finally:
        conn.close()


def test_empty_file_is_initialised(db_path: Path):
    db_path.touch()
    with Database(db_path) as db:
        db.add_records([rec("a")])
        assert db.count() == 1


def test_closed_database_raises(db_path: Path):
    with Database(db_path) as db:
        pass
    assert db.closed
    db.close()  # idempotent
    with pytest.raises(DatabaseError, match="closed"):
        db.count()


def test_failed_batch_is_rolled_back(db: Database):
    db.add_records([rec("a")])
    with pytest.raises(TypeError):
        db.add_records([rec("b"), "not a record"])  # type: ignore[list-item]
    assert db.measured_state_keys(WK, TK) == {"a"}


# -------------------------------------------------------- concurrency/crash


def test_two_objects_on_one_file(db_path: Path):
    with Database(db_path) as a, Database(db_path) as b:
        a.add_records([rec("a")])
        assert b.measured_state_keys(WK, TK) == {"a"}
        b.add_records([rec("b")])
        assert a.count() == 2


def test_committed_batch_survives_crash(db_path: Path):
    # The child commits one batch, then dies (no close, no cleanup) while a
    # second batch is being written: the first must survive, the second vanish.
    script = textwrap.dedent(
        f"""
        import os
        from ansor.records import Record
        from ansor.store import Database

        def rec(i):
            return Record({WK!r}, {TK!r}, [["AN", 0, 0, 1]], f"s{{i}}", (1e-3 * (i + 1),), 0, timestamp=float(i))

        db = Database({str(db_path)!r})
        db.add_records(rec(i) for i in range(5))

        def in_flight():
            yield rec(100)
            yield rec(101)
            os._exit(3)

        db.add_records(in_flight())
        """
    )
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    with Database(db_path) as db:
        assert db.measured_state_keys(WK, TK) == {f"s{i}" for i in range(5)}
        assert db.best(WK, TK)[0].state_key == "s0"


# ------------------------------------------------------------------ JSONL


def test_export_import_roundtrip(tmp_path: Path, db: Database):
    db.add_workload(WK, {"op": "matmul"}, flop=123.0)
    db.add_workload("conv", {"op": "conv2d"}, flop=7.0)
    db.add_target(TK, {"kind": "llvm"})
    db.add_records([rec("a", (2e-3, 1e-3), ts=1.25, all_cost=0.75), rec("b", (), error_no=6, error_msg="timeout")])
    db.add_records([rec("c", wk="conv")])

    out = tmp_path / "records.jsonl"
    assert db.export_jsonl(out) == 3
    lines = out.read_text().splitlines()
    assert json.loads(lines[0]) == {"workload": db.workload("conv")}
    assert {"target": {"key": TK, "description": {"kind": "llvm"}}} in [json.loads(x) for x in lines]

    with Database(tmp_path / "fresh.db") as fresh:
        assert fresh.import_jsonl(out) == 3
        assert fresh.records() == db.records()
        assert fresh.workload(WK) == db.workload(WK)
        assert fresh.target(TK) == db.target(TK)
        assert fresh.import_jsonl(out) == 0
        assert fresh.count() == 3

    # Filtered export carries only the workloads it needs.
    part = tmp_path / "part.jsonl"
    assert db.export_jsonl(part, workload_key="conv") == 1
    with Database(tmp_path / "part.db") as fresh:
        assert fresh.import_jsonl(part) == 1
        assert fresh.workload_keys() == ["conv"]


def test_import_skips_comments_blanks_and_duplicates_within_file(tmp_path: Path, db: Database):
    line = rec("a").to_json()
    path = tmp_path / "in.jsonl"
    path.write_text(f"# hand-written\n\n{line}\n   \n{line}\n{rec('a', ts=2).to_json()}\n")
    assert db.import_jsonl(path) == 2
    assert db.count() == 2


def test_import_garbage_line_names_line_number(tmp_path: Path, db: Database):
    path = tmp_path / "bad.jsonl"
    path.write_text(f"# header\n{rec('a').to_json()}\n{{this is not json\n{rec('b').to_json()}\n")
    with pytest.raises(DatabaseError, match=r"line 3"):
        db.import_jsonl(path)
    assert db.count() == 0  # nothing from a bad file is imported

    path.write_bytes(rec("a").to_json().encode() + b"\n\xff\xfe garbage\n")
    with pytest.raises(DatabaseError, match=r"line 2"):
        db.import_jsonl(path)

    path.write_text(json.dumps({"workload": {"key": 1}}) + "\n")
    with pytest.raises(DatabaseError, match=r"line 1.*workload"):
        db.import_jsonl(path)


# ----------------------------------------------------- refusing bad files


def test_corrupt_file_raises(db_path: Path):
    db_path.write_bytes(os.urandom(4096))
    with pytest.raises(DatabaseError) as info:
        Database(db_path)
    assert str(db_path) in str(info.value)
    assert "not a database" in str(info.value)


def test_damaged_sqlite_file_raises(db_path: Path):
    Database(db_path).close()
    data = bytearray(db_path.read_bytes())
    data[16:] = b"\xab" * (len(data) - 16)  # keep the magic header, wreck the rest
    db_path.write_bytes(bytes(data))
    with pytest.raises(DatabaseError, match=str(db_path).replace("\\", "\\\\")):
        with Database(db_path) as db:
            db.count()


def test_foreign_sqlite_database_is_refused_and_untouched(db_path: Path):
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE foo (x INTEGER)")
    conn.execute("INSERT INTO foo VALUES (42)")
    conn.commit()
    conn.close()
    before = db_path.read_bytes()
    with pytest.raises(DatabaseError, match="does not belong to ansor"):
        Database(db_path)
    assert db_path.read_bytes() == before
    assert not Path(str(db_path) + "-wal").exists()


def test_other_application_id_is_refused(db_path: Path):
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA application_id = 1234")
    conn.commit()
    conn.close()
    with pytest.raises(DatabaseError, match="does not belong to ansor"):
        Database(db_path)


def test_newer_schema_is_refused(db_path: Path):
    Database(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(DatabaseError, match="newer"):
        Database(db_path)


def test_directory_path_is_refused(tmp_path: Path):
    with pytest.raises(DatabaseError):
        Database(tmp_path)


# ------------------------------------------------------------ default path


def test_default_path_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    target = tmp_path / "deep" / "er" / "mine.db"
    monkeypatch.setenv("ANSOR_DB", str(target))
    assert default_database_path() == target
    with Database() as db:  # parents are created on open
        db.add_records([rec("a")])
    assert target.exists()

    monkeypatch.delenv("ANSOR_DB")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_database_path() == tmp_path / "xdg" / "ansor" / "ansor.db"

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_database_path() == tmp_path / "home" / ".cache" / "ansor" / "ansor.db"


def test_in_memory_database():
    with Database(":memory:") as db:
        db.add_records([rec("a")])
        assert db.count() == 1


# ---------------------------------------------------------------- read-only opening


def _listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_read_only_open_of_a_missing_file_creates_nothing(tmp_path: Path):
    with pytest.raises(DatabaseError, match="no records database here"):
        Database(tmp_path / "missing.db", create=False)
    with pytest.raises(DatabaseError, match="no such directory"):
        Database.open_existing(tmp_path / "no" / "such" / "dir.db")
    assert list(tmp_path.iterdir()) == []


def test_read_only_open_reads_and_writes_nothing(db_path: Path):
    with Database(db_path) as d:
        d.add_workload(WK, {"name": "m"}, 1e6)
        d.add_records([rec("s1"), rec("s2", costs=(2e-3,))])
    before = _listing(db_path.parent)
    with Database(db_path, create=False) as ro:
        assert ro.read_only
        assert [r.state_key for r in ro.records()] == ["s1", "s2"]
        assert ro.best(WK, TK)[0].state_key == "s1"
        with pytest.raises(DatabaseError, match="read-only"):
            ro.add_records([rec("s3")])
        with pytest.raises(DatabaseError, match="read-only"):
            ro.add_workload("other", {})
    assert _listing(db_path.parent) == before  # same bytes, no -wal/-shm left behind


def test_read_only_open_refuses_an_empty_file_without_initialising_it(db_path: Path):
    db_path.write_bytes(b"")
    with pytest.raises(DatabaseError, match="empty"):
        Database(db_path, create=False)
    assert db_path.read_bytes() == b""
    assert _listing(db_path.parent) == {db_path.name: b""}


def test_read_only_open_refuses_a_foreign_database_untouched(db_path: Path):
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = _listing(db_path.parent)
    with pytest.raises(DatabaseError, match="does not belong to ansor"):
        Database(db_path, create=False)
    assert _listing(db_path.parent) == before


# ---------------------------------------------------------------- stored computations


def test_a_description_gains_the_computation_but_is_never_replaced_otherwise(db: Database):
    db.add_workload(WK, {"name": "old"})
    db.add_workload(WK, {"name": "new", "computation": {"format": "x"}})
    assert db.workload(WK)["description"] == {"name": "new", "computation": {"format": "x"}}
    db.add_workload(WK, {"name": "newer", "computation": {"format": "y"}})
    db.add_workload(WK, {"name": "newest"})
    assert db.workload(WK)["description"]["name"] == "new"


def test_summary_gives_the_runs_of_the_best_program(db: Database):
    db.add_records([rec("s1", costs=(3e-3,)), rec("s2", costs=(2e-3,)), rec("s2", costs=(1e-3, 4e-3), ts=2.0)])
    (row,) = db.summary()
    assert row["best_cost"] == pytest.approx(2e-3)
    assert sorted(row["best_runs"]) == pytest.approx([1e-3, 2e-3, 4e-3])
