"""The default record store: every measured program in one SQLite file.

The file uses SQLite in WAL mode so several processes (a tuner, ``ansor
show``, a second tuner) can share it; every batch of records is committed in
one transaction, so an interrupted run loses at most the batch in flight.

The file is stamped with `APPLICATION_ID` and carries a ``meta`` table
with the schema version. Opening refuses anything else -- a file that is not
SQLite, another application's database, or a schema newer than this code --
with a `DatabaseError` rather than writing into it.

A workload's description (JSON) names its inputs and outputs and holds the
whole computation (``"computation"``, see `ansor.dag.ComputeDAG.to_data`),
so its records can be replayed by a process that never saw the declaration
(``ansor.replay.workload_dag``). Descriptions written by older versions lack it;
those of named workloads are rebuilt from their ``"spec"``.

JSONL interchange (`SQLiteStore.export_jsonl` / `SQLiteStore.import_jsonl`) is the format of
`ansor.store.jsonl`, the same for every store.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from ansor.records import DatabaseError, Record, canonical_json, median, pool_runs
from ansor.store.jsonl import loads_object, parse_jsonl, target_line, workload_line
from ansor.store.rows import record_from_row, row_from_record, where_clause

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SQLiteStore", "default_database_path"]

#: ``PRAGMA application_id`` stamped on ansor databases ("ANSR" in ASCII), so a
#: foreign SQLite file is recognised before anything is written into it.
APPLICATION_ID = 0x414E5352

#: Version of the table layout below; stored in the ``meta`` table. 2 added ``records.node``
#: (the machine that measured a record). A version-1 file opened for writing is migrated in
#: place, in one transaction (the column is added, empty for every existing record); opened
#: read-only it is read as it is, its records' ``node`` empty. An older ansor refuses a
#: migrated file as newer than it supports.
SCHEMA_VERSION = 2

_BUSY_TIMEOUT_S = 10.0
_SQLITE_HEADER = b"SQLite format 3\x00"

_SCHEMA = """
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE workloads (
    key         TEXT PRIMARY KEY,
    description TEXT NOT NULL,  -- JSON object
    flop        REAL NOT NULL DEFAULT 0,
    created     REAL NOT NULL
);
CREATE TABLE targets (
    key         TEXT PRIMARY KEY,
    description TEXT NOT NULL   -- JSON object
);
CREATE TABLE records (
    id           INTEGER PRIMARY KEY,
    workload_key TEXT NOT NULL,
    target_key   TEXT NOT NULL,
    state_key    TEXT NOT NULL,
    steps        TEXT NOT NULL,  -- JSON list
    costs        TEXT NOT NULL,  -- JSON list of seconds
    median_cost  REAL,           -- NULL unless the record is ok
    error_no     INTEGER NOT NULL,
    error_msg    TEXT NOT NULL,
    all_cost     REAL NOT NULL,
    timestamp    REAL NOT NULL,
    version      TEXT NOT NULL,
    node         TEXT NOT NULL DEFAULT ''  -- the machine that measured it ('' where the job ran)
);
CREATE INDEX records_by_cost ON records (workload_key, target_key, median_cost);
CREATE INDEX records_by_state ON records (workload_key, target_key, state_key);
"""

_RECORD_COLUMNS = (
    "workload_key, target_key, state_key, steps, costs, median_cost,"
    " error_no, error_msg, all_cost, timestamp, version, node"
)
#: What a version-1 file (no ``node`` column) is read with when it may not be migrated.
_RECORD_COLUMNS_V1 = _RECORD_COLUMNS.replace(", node", ", '' AS node")



def default_database_path() -> Path | str:
    """Where records live when no path is given.

    ``$ANSOR_DB`` if set (a path, or a database URL such as ``postgresql://...``, returned as
    the string it is), else ``$XDG_CACHE_HOME/ansor/ansor.db``, else
    ``~/.cache/ansor/ansor.db``: a cache location, since records can always
    be re-measured, yet shared by every run of the same user.
    """
    explicit = os.environ.get("ANSOR_DB")
    if explicit:
        return explicit if "://" in explicit else Path(explicit).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return base / "ansor" / "ansor.db"


class SQLiteStore:
    """Records of measured programs, with the workloads and targets they belong to.

    Usable as a context manager. Safe to open several times on one file,
    from several processes: writes wait up to 10 s for a concurrent writer.
    A single object may also be shared between threads.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, create: bool = True) -> None:
        """Open (and with `create`, make if missing) the database at `path`. `create=False`
        opens an existing ansor database read-only: nothing is created, and nothing is
        written, not even the schema, so commands that only look never leave a file behind."""
        self.path: Path | str = default_database_path() if path is None else path
        if "://" in str(self.path):
            raise DatabaseError("a database URL is no SQLite file: open it with ansor.store.open_store")
        self._memory = str(self.path) == ":memory:"
        if not self._memory:
            self.path = Path(self.path)
        self.read_only = not create
        if self.read_only and self._memory:
            raise DatabaseError(":memory: cannot be opened read-only: it would always be empty")
        self._lock = threading.RLock()
        self._columns = _RECORD_COLUMNS  # what records are selected with (see SCHEMA_VERSION)
        self._conn: sqlite3.Connection | None = self._open()

    @classmethod
    def open_existing(cls, path: str | os.PathLike[str] | None = None) -> SQLiteStore:
        """An existing database, read-only (see `create=False`)."""
        return cls(path, create=False)

    # ------------------------------------------------------------------ opening

    def _fail(self, what: str) -> DatabaseError:
        return DatabaseError(f"{self.path}: {what}")

    def _open(self) -> sqlite3.Connection:
        if self.read_only:
            return self._open_read_only()
        if not self._memory:
            assert isinstance(self.path, Path)
            self._check_header(self.path)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise self._fail(f"cannot create directory {self.path.parent}: {exc}") from None
        try:
            conn = sqlite3.connect(
                str(self.path), timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise self._fail(f"cannot open database: {exc}") from None
        try:
            self._prepare(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_read_only(self) -> sqlite3.Connection:
        """A connection that cannot create the file or write into it.

        SQLite's read-only mode leaves the -wal and -shm files of a WAL database behind when it
        closes; a read-write connection that may not create the file, with every write refused
        (``query_only``), cleans them up like any reader, so it is preferred where the file is
        writable.
        """
        assert isinstance(self.path, Path)
        if not self.path.exists():
            where = "no such file" if self.path.parent.is_dir() else f"no such directory {self.path.parent}"
            raise self._fail(f"no records database here ({where})")
        self._check_header(self.path)
        uri = "file:" + urllib.parse.quote(str(self.path.resolve()))
        conn = None
        for mode in ("rw", "ro"):
            try:
                conn = sqlite3.connect(f"{uri}?mode={mode}", uri=True, timeout=_BUSY_TIMEOUT_S,
                                       isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA query_only = ON")
                break
            except sqlite3.Error as exc:
                if conn is not None:
                    conn.close()
                    conn = None
                error = exc
        if conn is None:
            raise self._fail(f"cannot open database: {error}")
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
            state = self._classify(conn)
            if state == "blank":
                raise self._fail("is empty: not an ansor records database yet")
            if state == "foreign":
                raise self._fail("is an SQLite database that does not belong to ansor (no ansor application_id)")
            if self._check_schema_version(conn) < 2:
                self._columns = _RECORD_COLUMNS_V1
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise self._fail(f"cannot use database: {exc}") from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_header(self, path: Path) -> None:
        """Refuse non-SQLite files up front, with a clearer message than sqlite's."""
        try:
            with open(path, "rb") as fh:
                head = fh.read(len(_SQLITE_HEADER))
        except FileNotFoundError:
            return
        except IsADirectoryError:
            raise self._fail("is a directory, not a records database") from None
        except OSError as exc:
            raise self._fail(f"cannot read file: {exc}") from None
        if head and head != _SQLITE_HEADER:
            raise self._fail("file is not a database (not an SQLite file); refusing to use it")

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Check the file is ours (or blank), creating the schema if blank.

        Nothing is written until the file is known to be blank, so a foreign
        database is left byte-for-byte untouched.
        """
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT_S * 1000)}")
            state = self._classify(conn)
            if state == "blank":
                if not self._memory:
                    conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("BEGIN IMMEDIATE")
                try:
                    # Another process may have initialised the file meanwhile.
                    state = self._classify(conn)
                    if state == "blank":
                        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                        for statement in _SCHEMA.split(";"):
                            if statement.strip():
                                conn.execute(statement)
                        conn.execute(
                            "INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                        )
                        state = "ansor"
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            if state == "foreign":
                raise self._fail(
                    "is an SQLite database that does not belong to ansor"
                    " (no ansor application_id); refusing to write into it"
                )
            if self._check_schema_version(conn) < SCHEMA_VERSION:
                self._migrate(conn)
        except sqlite3.DatabaseError as exc:
            raise self._fail(f"cannot use database: {exc}") from None

    @staticmethod
    def _classify(conn: sqlite3.Connection) -> str:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if app_id == APPLICATION_ID:
            return "ansor"
        if app_id == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            return "blank"
        return "foreign"

    def _check_schema_version(self, conn: sqlite3.Connection) -> int:
        """The file's schema version; a DatabaseError where it is missing, damaged or newer."""
        try:
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.OperationalError:
            row = None
        if row is None:
            raise self._fail("has the ansor application_id but no schema version (damaged database)")
        try:
            version = int(row[0])
        except (TypeError, ValueError):
            raise self._fail(f"has an unreadable schema version {row[0]!r}") from None
        if version > SCHEMA_VERSION:
            raise self._fail(
                f"has schema version {version}, newer than this ansor supports ({SCHEMA_VERSION});"
                " upgrade ansor or use another database file"
            )
        if version < 1:
            raise self._fail(f"has an invalid schema version {version}")
        return version

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        """Bring an older file to `SCHEMA_VERSION` in one transaction (another process may have
        done it meanwhile: the version is read again under the write lock)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = int(conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0])
            if version < 2:
                conn.execute("ALTER TABLE records ADD COLUMN node TEXT NOT NULL DEFAULT ''")
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------- plumbing

    @contextmanager
    def _cursor(self, what: str, write: bool = False) -> Iterator[sqlite3.Connection]:
        """Run one transaction under the lock, turning sqlite errors into DatabaseError.

        Writes take the write lock up front (BEGIN IMMEDIATE) so that a
        concurrent writer makes us wait for the busy timeout instead of
        failing on a read-to-write upgrade.
        """
        with self._lock:
            conn = self._conn
            if conn is None:
                raise DatabaseError(f"{self.path}: database is closed")
            if write and self.read_only:
                raise self._fail(f"{what}: the database was opened read-only")
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise self._fail(f"{what} failed: {exc}") from None

    def _record_from_row(self, row: tuple) -> Record:
        try:
            return record_from_row(row)
        except (TypeError, ValueError) as exc:
            raise self._fail(f"damaged record for workload {row[0]!r}: {exc}") from None

    @staticmethod
    def _row_from_record(rec: Record) -> tuple:
        return row_from_record(rec)

    @staticmethod
    def _where(workload_key: str | None, target_key: str | None) -> tuple[str, list[Any]]:
        return where_clause(workload_key, target_key, "?")

    # ------------------------------------------------------- workloads/targets

    def add_workload(self, key: str, description: dict, flop: float = 0.0) -> None:
        """Register a workload. An existing key is left as it is (keys identify content), except
        that a description without the computation (written by an older ansor) gains it."""
        with self._cursor("add_workload", write=True) as conn:
            _upsert_workloads(conn, [(key, canonical_json(description), float(flop), time.time())])

    def add_target(self, key: str, description: dict) -> None:
        """Register a target; an existing key is left as it is."""
        desc = canonical_json(description)
        with self._cursor("add_target", write=True) as conn:
            conn.execute("INSERT OR IGNORE INTO targets (key, description) VALUES (?, ?)", (key, desc))

    def workload(self, key: str) -> dict[str, Any] | None:
        """``{"key", "description", "flop", "created"}`` for a registered workload, else None."""
        with self._cursor("workload") as conn:
            row = conn.execute(
                "SELECT key, description, flop, created FROM workloads WHERE key = ?", (key,)
            ).fetchone()
        if row is None:
            return None
        return {"key": row[0], "description": json.loads(row[1]), "flop": row[2], "created": row[3]}

    def workload_keys(self) -> list[str]:
        """Sorted keys of all workloads registered or referred to by a record."""
        with self._cursor("workload_keys") as conn:
            rows = conn.execute(
                "SELECT key FROM workloads UNION SELECT DISTINCT workload_key FROM records ORDER BY 1"
            ).fetchall()
        return [r[0] for r in rows]

    def target(self, key: str) -> dict[str, Any] | None:
        """``{"key", "description"}`` for a registered target, else None."""
        with self._cursor("target") as conn:
            row = conn.execute("SELECT key, description FROM targets WHERE key = ?", (key,)).fetchone()
        return None if row is None else {"key": row[0], "description": json.loads(row[1])}

    def target_keys(self) -> list[str]:
        """Sorted keys of all targets registered or referred to by a record."""
        with self._cursor("target_keys") as conn:
            rows = conn.execute(
                "SELECT key FROM targets UNION SELECT DISTINCT target_key FROM records ORDER BY 1"
            ).fetchall()
        return [r[0] for r in rows]

    # ---------------------------------------------------------------- records

    def add_records(self, records: Iterable[Record]) -> int:
        """Insert a batch in one transaction, committed before returning.

        If the process dies mid-batch, the whole batch is rolled back and
        every earlier batch is kept. Returns the number of records inserted.
        """
        count = 0

        def rows() -> Iterator[tuple]:
            nonlocal count
            for rec in records:
                yield self._row_from_record(rec)
                count += 1

        with self._cursor("add_records", write=True) as conn:
            conn.executemany(f"INSERT INTO records ({_RECORD_COLUMNS}) VALUES ({', '.join('?' * 12)})", rows())
        return count

    def records(
        self, workload_key: str | None = None, target_key: str | None = None, ok_only: bool = False
    ) -> list[Record]:
        """Records matching the filters, in insertion order."""
        where, params = self._where(workload_key, target_key)
        if ok_only:
            where += (" AND" if where else " WHERE") + " median_cost IS NOT NULL"
        with self._cursor("records") as conn:
            rows = conn.execute(f"SELECT {self._columns} FROM records{where} ORDER BY id", params).fetchall()
        return [self._record_from_row(r) for r in rows]

    def best(self, workload_key: str, target_key: str, k: int = 1) -> list[Record]:
        """The ``k`` fastest programs with ok records, fastest first.

        A program measured more than once is represented by its first record carrying the
        costs of all its ok measurements (`pool_runs`), and ranked by their median: the fastest
        of hundreds of noisy measurements tends to be a lucky one, so the tuner measures its
        leaders again at the end of a job, and those runs count as much as the first. Ties keep
        the earlier program.
        """
        if k <= 0:
            return []
        pooled = pool_runs(self.records(workload_key, target_key, ok_only=True))
        ranked = sorted(pooled, key=lambda pair: median(pair[1]))  # stable: earlier first
        out = []
        for rec, costs in ranked[:k]:
            if len(costs) != len(rec.costs):
                rec = replace(rec, costs=costs)
            out.append(rec)
        return out

    def measured_state_keys(self, workload_key: str, target_key: str) -> set[str]:
        """State keys already measured (failures included, so they are not retried)."""
        with self._cursor("measured_state_keys") as conn:
            rows = conn.execute(
                "SELECT DISTINCT state_key FROM records WHERE workload_key = ? AND target_key = ?",
                (workload_key, target_key),
            ).fetchall()
        return {r[0] for r in rows}

    def count(self, workload_key: str | None = None, target_key: str | None = None) -> int:
        """Number of records matching the filters, errors included."""
        where, params = self._where(workload_key, target_key)
        with self._cursor("count") as conn:
            return int(conn.execute(f"SELECT count(*) FROM records{where}", params).fetchone()[0])

    def summary(self) -> list[dict[str, Any]]:
        """One row per (workload_key, target_key) that has records, sorted by keys.

        Each dict has ``workload_key``, ``target_key``, ``n_records``,
        ``n_ok``, ``best_cost`` (seconds, None without an ok record; the median of the best
        program's runs), ``best_runs`` (the seconds of each of those runs; empty without one),
        ``workload`` (description dict or None if unregistered), ``flop``,
        ``best_gflops`` (None unless both flop and best_cost are known) and
        ``target`` (description dict or None).
        """
        with self._cursor("summary") as conn:
            rows = conn.execute(
                "SELECT r.workload_key, r.target_key, count(*), count(r.median_cost), min(r.median_cost),"
                " w.description, w.flop, t.description"
                " FROM records r"
                " LEFT JOIN workloads w ON w.key = r.workload_key"
                " LEFT JOIN targets t ON t.key = r.target_key"
                " GROUP BY r.workload_key, r.target_key"
                " ORDER BY r.workload_key, r.target_key"
            ).fetchall()
        out = []
        for wk, tk, n, n_ok, best_cost, wdesc, flop, tdesc in rows:
            flop = float(flop) if flop is not None else 0.0
            best_runs: tuple[float, ...] = ()
            if best_cost is not None:  # the best program as `best` ranks them (pooled re-measurements)
                best = self.best(wk, tk)[0]
                best_cost, best_runs = best.median_cost, best.costs
            out.append(
                {
                    "workload_key": wk,
                    "target_key": tk,
                    "n_records": int(n),
                    "n_ok": int(n_ok),
                    "best_cost": best_cost,
                    "best_runs": best_runs,
                    "workload": json.loads(wdesc) if wdesc is not None else None,
                    "flop": flop,
                    "best_gflops": flop / best_cost / 1e9 if flop > 0 and best_cost else None,
                    "target": json.loads(tdesc) if tdesc is not None else None,
                }
            )
        return out

    # ------------------------------------------------------------------ JSONL

    def export_jsonl(
        self, path: str | os.PathLike[str], workload_key: str | None = None, target_key: str | None = None
    ) -> int:
        """Write matching records (preceded by their workloads and targets) as JSONL.

        See `ansor.store.jsonl` for the line format. Returns the number of
        records written.
        """
        where, params = self._where(workload_key, target_key)
        n = 0
        with self._cursor("export_jsonl") as conn, open(path, "w", encoding="utf-8") as fh:
            # One read transaction: workloads, targets and records form one snapshot.
            for key, desc, flop, created in conn.execute(
                "SELECT key, description, flop, created FROM workloads"
                f" WHERE key IN (SELECT DISTINCT workload_key FROM records{where}) ORDER BY key",
                params,
            ):
                fh.write(workload_line(key, desc, flop, created) + "\n")
            for key, desc in conn.execute(
                "SELECT key, description FROM targets"
                f" WHERE key IN (SELECT DISTINCT target_key FROM records{where}) ORDER BY key",
                params,
            ):
                fh.write(target_line(key, desc) + "\n")
            for row in conn.execute(f"SELECT {self._columns} FROM records{where} ORDER BY id", params):
                fh.write(self._record_from_row(row).to_json() + "\n")
                n += 1
        return n

    def import_jsonl(self, path: str | os.PathLike[str]) -> int:
        """Add the records of a JSONL file that are not already present.

        A record is a duplicate when workload_key, target_key, state_key and
        timestamp all match one already stored (or earlier in the file).
        The whole file is validated first and imported in one transaction,
        so a malformed line (reported with its line number) imports nothing.
        Returns the number of records inserted.
        """
        workloads, targets, records = parse_jsonl(path)
        inserted = 0
        with self._cursor("import_jsonl", write=True) as conn:
            _upsert_workloads(conn, workloads)
            conn.executemany("INSERT OR IGNORE INTO targets (key, description) VALUES (?, ?)", targets)
            for rec in records:
                dup = conn.execute(
                    "SELECT 1 FROM records WHERE workload_key = ? AND target_key = ? AND state_key = ?"
                    " AND timestamp = ? LIMIT 1",
                    (rec.workload_key, rec.target_key, rec.state_key, rec.timestamp),
                ).fetchone()
                if dup is None:
                    conn.execute(
                        f"INSERT INTO records ({_RECORD_COLUMNS}) VALUES ({', '.join('?' * 12)})",
                        self._row_from_record(rec),
                    )
                    inserted += 1
        return inserted

    # -------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Close the connection (idempotent); SQLite checkpoints the WAL on last close."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def closed(self) -> bool:
        """Whether `close` has been called (the object can no longer read or write)."""
        return self._conn is None

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._conn is None else "open"
        return f"SQLiteStore({str(self.path)!r}, {state})"


def _upsert_workloads(conn: sqlite3.Connection, rows: Iterable[tuple]) -> None:
    """Insert (key, description, flop, created) rows; where the key exists, only a stored
    description that lacks the computation is replaced by one that has it."""
    for key, desc, flop, created in rows:
        found = conn.execute("SELECT description FROM workloads WHERE key = ?", (key,)).fetchone()
        if found is None:
            conn.execute("INSERT INTO workloads (key, description, flop, created) VALUES (?, ?, ?, ?)",
                         (key, desc, flop, created))
        elif "computation" in json.loads(desc) and "computation" not in loads_object(found[0]):
            conn.execute("UPDATE workloads SET description = ? WHERE key = ?", (desc, key))
