"""Records in a PostgreSQL server: one database that a team's tuning jobs and readers share.

The same store as `ansor.store.sqlite.SQLiteStore`, for when one machine's file is not enough:
several tuning jobs on several machines write into one database while others read it. Opened
from a ``postgresql://`` (or ``postgres://``) URL in libpq's form, written through psycopg 3
(``pip install 'ansor[postgres]'``).

What holds under concurrency:

* A batch of records is one transaction: a reader sees all of it or none of it. Reads of
  several statements (`summary`, `export_jsonl`) run in one REPEATABLE READ snapshot.
* A record is stored once: every measurement is unique by (workload, target, program,
  timestamp), so a batch retried after a lost connection or a serialization failure adds
  nothing twice, and an import adds only what the database lacks.
* Serialization failures and deadlocks are retried (a few times, with a random pause); a lost
  connection is reopened and the transaction retried. Anything else is a `DatabaseError`.

The tables are prefixed ``ansor_`` and made in the connection's current schema (libpq's
``options=-csearch_path%3D...`` picks another). ``ansor_schema_version`` holds one row per
version applied; a database whose version is newer than `SCHEMA_VERSION` is refused, an older
one is migrated when opened for writing (under an advisory lock, so concurrent openers do it
once). Descriptions, steps and costs are kept as the JSON text they were written as, so records
and workloads read back exactly as they were given, and an export equals the SQLite store's.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, TypeVar

from ansor.records import DatabaseError, Record, canonical_json, median, pool_runs
from ansor.store.jsonl import loads_object, parse_jsonl, target_line, workload_line
from ansor.store.rows import record_from_row, row_from_record, where_clause

__all__ = ["SCHEMA_VERSION", "URL_SCHEMES", "PostgresStore", "is_postgres_url", "redacted_url"]

#: URL schemes that name a PostgreSQL database (libpq accepts both).
URL_SCHEMES = ("postgresql://", "postgres://")

#: Version of the table layout; one row per applied version in ``ansor_schema_version``.
SCHEMA_VERSION = 1

#: Statements that bring a database from the version before to this one.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE ansor_schema_version (
            version integer PRIMARY KEY,
            applied double precision NOT NULL  -- seconds since the epoch
        )""",
        """CREATE TABLE ansor_workloads (
            key         text PRIMARY KEY,
            description text NOT NULL,  -- JSON object, as written
            flop        double precision NOT NULL DEFAULT 0,
            created     double precision NOT NULL
        )""",
        """CREATE TABLE ansor_targets (
            key         text PRIMARY KEY,
            description text NOT NULL  -- JSON object, as written
        )""",
        """CREATE TABLE ansor_records (
            id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            workload_key text NOT NULL,
            target_key   text NOT NULL,
            state_key    text NOT NULL,
            steps        text NOT NULL,  -- JSON list
            costs        text NOT NULL,  -- JSON list of seconds
            median_cost  double precision,  -- NULL unless the record is ok
            error_no     integer NOT NULL,
            error_msg    text NOT NULL,
            all_cost     double precision NOT NULL,
            timestamp    double precision NOT NULL,
            version      text NOT NULL,
            node         text NOT NULL DEFAULT ''  -- the machine that measured it ('' where the job ran)
        )""",
        # One measurement is stored once. State keys are loop nests of any length, beyond what a
        # b-tree entry may hold, so the index keeps their digest.
        """CREATE UNIQUE INDEX ansor_records_measurement
            ON ansor_records (workload_key, target_key, md5(state_key), timestamp)""",
        "CREATE INDEX ansor_records_by_cost ON ansor_records (workload_key, target_key, median_cost)",
    ),
}

_RECORD_COLUMNS = (
    "workload_key, target_key, state_key, steps, costs, median_cost,"
    " error_no, error_msg, all_cost, timestamp, version, node"
)
_INSERT_RECORD = (
    f"INSERT INTO ansor_records ({_RECORD_COLUMNS}) VALUES ({', '.join(['%s'] * 12)})"
    " ON CONFLICT (workload_key, target_key, md5(state_key), timestamp) DO NOTHING"
)
#: Byte order, as SQLite sorts, whatever the database's collation.
_SORTED = 'COLLATE "C"'

#: Key of the transaction-level advisory lock under which the tables are made or migrated.
_SCHEMA_LOCK = 0x414E5352  # "ANSR"
_ATTEMPTS = 6
_CONNECT_TIMEOUT_S = 10

T = TypeVar("T")


def is_postgres_url(database: Any) -> bool:
    """Whether `database` is a string naming a PostgreSQL database."""
    return isinstance(database, str) and database.startswith(URL_SCHEMES)


def redacted_url(url: str) -> str:
    """The URL with any password replaced by ``***``: what messages and ``store.path`` show."""
    url = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/?#@:]*:)[^/?#@]*@", r"\1***@", url)
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", url)


def _psycopg():
    try:
        import psycopg
    except ImportError:
        raise DatabaseError(
            "a postgresql:// database needs psycopg 3: pip install 'ansor[postgres]'"
        ) from None
    return psycopg


class PostgresStore:
    """Records of measured programs in a PostgreSQL database (see the module docstring).

    Usable as a context manager; one object may be shared between threads (one connection,
    used by one thread at a time). `create=False` opens read-only: nothing is created or
    written, and a database without ansor's tables is a DatabaseError.
    """

    def __init__(self, url: str, create: bool = True) -> None:
        if not is_postgres_url(url):
            raise DatabaseError(f"not a PostgreSQL URL: {redacted_url(str(url))}")
        self._psycopg = _psycopg()
        self._url = url
        self.path: str = redacted_url(url)
        self.read_only = not create
        self._lock = threading.RLock()
        self._conn: Any = None
        self._conn = self._connect()
        try:
            self._prepare()
        except BaseException:
            self.close()
            raise

    @classmethod
    def open_existing(cls, url: str) -> PostgresStore:
        """An existing database, read-only (see `create=False`)."""
        return cls(url, create=False)

    # ------------------------------------------------------------------ opening

    def _fail(self, what: str) -> DatabaseError:
        return DatabaseError(f"{self.path}: {what}")

    def _connect(self) -> Any:
        psycopg = self._psycopg
        params = psycopg.conninfo.conninfo_to_dict(self._url)
        extra: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in params:
            extra["connect_timeout"] = _CONNECT_TIMEOUT_S
        if "application_name" not in params:
            extra["application_name"] = "ansor"
        try:
            conn = psycopg.connect(self._url, **extra)
        except psycopg.Error as exc:
            raise self._fail(f"cannot connect: {_message(exc)}") from None
        conn.read_only = self.read_only
        return conn

    def _prepare(self) -> None:
        """Check the tables are ours and not newer than this code; make or migrate them when
        writable. Nothing is written unless the tables are missing or older."""
        version = self._transaction("open", self._schema_version)
        if version is None and self.read_only:
            raise self._fail("no ansor records in this database (no ansor_schema_version table)")
        self._check_version(version)
        if self.read_only or (version is not None and version >= SCHEMA_VERSION):
            return

        def migrate(conn: Any) -> None:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            current = self._schema_version(conn)  # another client may have done it meanwhile
            self._check_version(current)
            for step in range((current or 0) + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[step]:
                    conn.execute(statement)
                conn.execute("INSERT INTO ansor_schema_version (version, applied) VALUES (%s, %s)",
                             (step, time.time()))

        self._transaction("create the ansor tables", migrate, write=True)

    def _schema_version(self, conn: Any) -> int | None:
        """The newest version applied; None where the tables do not exist at all.

        The tables are looked up in ``pg_tables`` (read under the statement's snapshot) rather
        than by name resolution, whose catalog cache may not yet show tables another client
        has just made: after waiting for that client's schema lock, this must see them."""
        found = {row[0] for row in conn.execute(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = current_schema()"
            " AND tablename IN ('ansor_schema_version', 'ansor_workloads', 'ansor_targets', 'ansor_records')")}
        if "ansor_schema_version" not in found:
            if found:
                raise self._fail("has ansor tables but no ansor_schema_version table (damaged database)")
            return None
        version = conn.execute("SELECT max(version) FROM ansor_schema_version").fetchone()[0]
        if version is None:
            raise self._fail("has an empty ansor_schema_version table (damaged database)")
        return int(version)

    def _check_version(self, version: int | None) -> None:
        if version is not None and version > SCHEMA_VERSION:
            raise self._fail(
                f"has ansor schema version {version}, newer than this ansor supports ({SCHEMA_VERSION});"
                " upgrade ansor or use another database"
            )

    # ------------------------------------------------------------- plumbing

    def _transaction(self, what: str, work: Callable[[Any], T], write: bool = False) -> T:
        """`work(connection)` in one transaction, under the lock; retried where the server says
        a retry may succeed (a serialization failure, a deadlock) and after a lost connection.

        Writes run at READ COMMITTED: each is an insert that skips what exists, atomic at that
        level. Reads run in one REPEATABLE READ snapshot, so a read of several statements sees
        one state of the database. `work` must be safe to run again (it is, for every caller:
        inserts skip what a lost commit may have stored).
        """
        psycopg = self._psycopg
        with self._lock:
            if self._conn is None:
                raise self._fail("database is closed")
            if write and self.read_only:
                raise self._fail(f"{what}: the database was opened read-only")
            level = psycopg.IsolationLevel.READ_COMMITTED if write else psycopg.IsolationLevel.REPEATABLE_READ
            for attempt in range(1, _ATTEMPTS + 1):
                if self._conn.closed:
                    self._conn = self._connect()
                conn = self._conn
                try:
                    conn.isolation_level = level
                    with conn.transaction():
                        return work(conn)
                except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected) as exc:
                    error = exc
                except psycopg.OperationalError as exc:
                    if not conn.closed:
                        raise self._fail(f"{what} failed: {_message(exc)}") from None
                    error = exc  # the connection was lost: open another and try again
                except psycopg.Error as exc:
                    raise self._fail(f"{what} failed: {_message(exc)}") from None
                if attempt < _ATTEMPTS:
                    time.sleep(random.uniform(0, min(0.05 * 2**attempt, 1.0)))
            raise self._fail(f"{what} failed {_ATTEMPTS} times: {_message(error)}")

    @staticmethod
    def _record_from_row(row: tuple) -> Record:
        return record_from_row(row)

    @staticmethod
    def _row_from_record(rec: Record) -> tuple:
        return row_from_record(rec)

    @staticmethod
    def _where(workload_key: str | None, target_key: str | None) -> tuple[str, list[Any]]:
        return where_clause(workload_key, target_key, "%s")

    # ------------------------------------------------------- workloads/targets

    def add_workload(self, key: str, description: dict, flop: float = 0.0) -> None:
        """Register a workload. An existing key is left as it is (keys identify content), except
        that a description without the computation (written by an older ansor) gains it."""
        row = (key, canonical_json(description), float(flop), time.time())
        self._transaction("add_workload", lambda conn: _upsert_workloads(conn, [row]), write=True)

    def add_target(self, key: str, description: dict) -> None:
        """Register a target; an existing key is left as it is."""
        row = (key, canonical_json(description))
        self._transaction("add_target", lambda conn: _insert_targets(conn, [row]), write=True)

    def workload(self, key: str) -> dict[str, Any] | None:
        """``{"key", "description", "flop", "created"}`` for a registered workload, else None."""
        row = self._transaction("workload", lambda conn: conn.execute(
            "SELECT key, description, flop, created FROM ansor_workloads WHERE key = %s", (key,)).fetchone())
        if row is None:
            return None
        return {"key": row[0], "description": json.loads(row[1]), "flop": row[2], "created": row[3]}

    def workload_keys(self) -> list[str]:
        """Sorted keys of all workloads registered or referred to by a record."""
        rows = self._transaction("workload_keys", lambda conn: conn.execute(
            "SELECT key FROM ansor_workloads UNION SELECT DISTINCT workload_key FROM ansor_records").fetchall())
        return sorted(r[0] for r in rows)  # code point order: SQLite's byte order of UTF-8

    def target(self, key: str) -> dict[str, Any] | None:
        """``{"key", "description"}`` for a registered target, else None."""
        row = self._transaction("target", lambda conn: conn.execute(
            "SELECT key, description FROM ansor_targets WHERE key = %s", (key,)).fetchone())
        return None if row is None else {"key": row[0], "description": json.loads(row[1])}

    def target_keys(self) -> list[str]:
        """Sorted keys of all targets registered or referred to by a record."""
        rows = self._transaction("target_keys", lambda conn: conn.execute(
            "SELECT key FROM ansor_targets UNION SELECT DISTINCT target_key FROM ansor_records").fetchall())
        return sorted(r[0] for r in rows)  # code point order: SQLite's byte order of UTF-8

    # ---------------------------------------------------------------- records

    def add_records(self, records: Iterable[Record]) -> int:
        """Insert a batch in one transaction, committed before returning; returns how many
        records were added. A record already stored (the same measurement: workload, target,
        program and timestamp) is not added again, so a retried batch is stored once."""
        rows = [self._row_from_record(rec) for rec in records]
        if not rows:
            return 0

        def insert(conn: Any) -> int:
            with conn.cursor() as cur:
                cur.executemany(_INSERT_RECORD, rows)
                return max(cur.rowcount, 0)

        return self._transaction("add_records", insert, write=True)

    def records(
        self, workload_key: str | None = None, target_key: str | None = None, ok_only: bool = False
    ) -> list[Record]:
        """Records matching the filters, in insertion order."""
        rows = self._transaction("records", lambda conn: self._select(conn, workload_key, target_key, ok_only))
        return [self._record_from_row(r) for r in rows]

    def _select(self, conn: Any, workload_key: str | None, target_key: str | None, ok_only: bool) -> list[tuple]:
        where, params = self._where(workload_key, target_key)
        if ok_only:
            where += (" AND" if where else " WHERE") + " median_cost IS NOT NULL"
        return conn.execute(f"SELECT {_RECORD_COLUMNS} FROM ansor_records{where} ORDER BY id", params).fetchall()

    def best(self, workload_key: str, target_key: str, k: int = 1) -> list[Record]:
        """The ``k`` fastest programs with ok records, fastest first, each ranked by the median
        of all its ok runs (see `ansor.store.sqlite.SQLiteStore.best`). Ties keep the earlier."""
        if k <= 0:
            return []
        return self._transaction("best", lambda conn: self._best(conn, workload_key, target_key, k))

    def _best(self, conn: Any, workload_key: str, target_key: str, k: int) -> list[Record]:
        rows = self._select(conn, workload_key, target_key, ok_only=True)
        pooled = pool_runs(self._record_from_row(r) for r in rows)
        ranked = sorted(pooled, key=lambda pair: median(pair[1]))  # stable: earlier first
        return [rec if len(costs) == len(rec.costs) else replace(rec, costs=costs) for rec, costs in ranked[:k]]

    def measured_state_keys(self, workload_key: str, target_key: str) -> set[str]:
        """State keys already measured (failures included, so they are not retried)."""
        rows = self._transaction("measured_state_keys", lambda conn: conn.execute(
            "SELECT DISTINCT state_key FROM ansor_records WHERE workload_key = %s AND target_key = %s",
            (workload_key, target_key)).fetchall())
        return {r[0] for r in rows}

    def count(self, workload_key: str | None = None, target_key: str | None = None) -> int:
        """Number of records matching the filters, errors included."""
        where, params = self._where(workload_key, target_key)
        return int(self._transaction("count", lambda conn: conn.execute(
            f"SELECT count(*) FROM ansor_records{where}", params).fetchone()[0]))

    def summary(self) -> list[dict[str, Any]]:
        """One row per (workload_key, target_key) that has records, sorted by keys, all from one
        snapshot; the fields of `ansor.store.sqlite.SQLiteStore.summary`."""
        def read(conn: Any) -> list[tuple]:
            rows = conn.execute(
                "SELECT r.workload_key, r.target_key, count(*), count(r.median_cost), min(r.median_cost),"
                " w.description, w.flop, t.description"
                " FROM ansor_records r"
                " LEFT JOIN ansor_workloads w ON w.key = r.workload_key"
                " LEFT JOIN ansor_targets t ON t.key = r.target_key"
                " GROUP BY r.workload_key, r.target_key, w.description, w.flop, t.description"
                f" ORDER BY r.workload_key {_SORTED}, r.target_key {_SORTED}"
            ).fetchall()
            return [(row, self._best(conn, row[0], row[1], 1) if row[4] is not None else []) for row in rows]

        out = []
        for (wk, tk, n, n_ok, best_cost, wdesc, flop, tdesc), best in self._transaction("summary", read):
            flop = float(flop) if flop is not None else 0.0
            best_runs: tuple[float, ...] = ()
            if best:  # the best program as `best` ranks them (pooled re-measurements)
                best_cost, best_runs = best[0].median_cost, best[0].costs
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
        """Write matching records (preceded by their workloads and targets) as JSONL, from one
        snapshot; see `ansor.store.jsonl` for the format. Returns the number of records."""
        where, params = self._where(workload_key, target_key)

        def write(conn: Any) -> int:
            n = 0
            with open(path, "w", encoding="utf-8") as fh:
                for key, desc, flop, created in conn.execute(
                    "SELECT key, description, flop, created FROM ansor_workloads"
                    f" WHERE key IN (SELECT DISTINCT workload_key FROM ansor_records{where})"
                    f" ORDER BY key {_SORTED}",
                    params,
                ):
                    fh.write(workload_line(key, desc, flop, created) + "\n")
                for key, desc in conn.execute(
                    "SELECT key, description FROM ansor_targets"
                    f" WHERE key IN (SELECT DISTINCT target_key FROM ansor_records{where})"
                    f" ORDER BY key {_SORTED}",
                    params,
                ):
                    fh.write(target_line(key, desc) + "\n")
                with conn.cursor(name="ansor_export") as cur:  # server-side: rows arrive in chunks
                    cur.execute(f"SELECT {_RECORD_COLUMNS} FROM ansor_records{where} ORDER BY id", params)
                    for row in cur:
                        fh.write(self._record_from_row(row).to_json() + "\n")
                        n += 1
            return n

        return self._transaction("export_jsonl", write)

    def import_jsonl(self, path: str | os.PathLike[str]) -> int:
        """Add the records of a JSONL file that are not already present, in one transaction.

        A record is a duplicate when workload_key, target_key, state_key and timestamp all match
        one already stored (or earlier in the file). The whole file is validated first, so a
        malformed line (reported with its line number) imports nothing. Returns the number of
        records added.
        """
        workloads, targets, records = parse_jsonl(path)
        rows = [self._row_from_record(rec) for rec in records]

        def insert(conn: Any) -> int:
            _upsert_workloads(conn, workloads)
            _insert_targets(conn, targets)
            if not rows:
                return 0
            with conn.cursor() as cur:
                cur.executemany(_INSERT_RECORD, rows)
                return max(cur.rowcount, 0)

        return self._transaction("import_jsonl", insert, write=True)

    # -------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def closed(self) -> bool:
        """Whether `close` has been called (the object can no longer read or write)."""
        return self._conn is None

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._conn is None else "open"
        return f"PostgresStore({self.path!r}, {state})"


def _upsert_workloads(conn: Any, rows: Iterable[tuple]) -> None:
    """Insert (key, description, flop, created) rows; where the key exists, only a stored
    description that lacks the computation is replaced by one that has it (the row locked, so
    concurrent writers decide one after the other)."""
    for key, desc, flop, created in rows:
        inserted = conn.execute(
            "INSERT INTO ansor_workloads (key, description, flop, created) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (key) DO NOTHING", (key, desc, flop, created)).rowcount
        if inserted or "computation" not in json.loads(desc):
            continue
        found = conn.execute("SELECT description FROM ansor_workloads WHERE key = %s FOR UPDATE", (key,)).fetchone()
        if found is not None and "computation" not in loads_object(found[0]):
            conn.execute("UPDATE ansor_workloads SET description = %s WHERE key = %s", (desc, key))


def _insert_targets(conn: Any, rows: Iterable[tuple]) -> None:
    for key, desc in rows:
        conn.execute("INSERT INTO ansor_targets (key, description) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING",
                     (key, desc))


def _message(exc: BaseException) -> str:
    """A psycopg error as one line (libpq's messages span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__
