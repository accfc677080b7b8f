"""Record stores: where measured programs are kept, behind one small interface.

`ansor.records.RecordStore` is the interface; `SQLiteStore` (one file, the default) and
`PostgresStore` (a database server a team shares; the ``postgres`` extra) implement it.
`open_store` is the one way from what a user passes as ``database=`` (a store, a path, a
``postgresql://`` URL, or None for the user's default database) to an open store. Only the
tuning job, the public entry points and the command line open stores; everything below them
receives one.
"""

from __future__ import annotations

import os
import re

from ansor.records import DatabaseError, RecordStore
from ansor.store.postgres import PostgresStore, is_postgres_url
from ansor.store.sqlite import SQLiteStore, default_database_path

__all__ = ["Database", "DatabaseError", "PostgresStore", "RecordStore", "SQLiteStore", "default_database_path",
           "is_database_url", "open_store"]

#: The default store under its first public name (`ansor.Database`).
Database = SQLiteStore

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_database_url(database: object) -> bool:
    """Whether `database` is a string of the form ``scheme://...`` (a server, not a file)."""
    return isinstance(database, str) and _URL.match(database) is not None


def open_store(database: RecordStore | str | os.PathLike[str] | None, create: bool = True) -> tuple[RecordStore, bool]:
    """(store, whether the caller owns it and must close it): a store object as given, a
    PostgreSQL database at a ``postgresql://`` or ``postgres://`` URL, else the SQLite file at
    the path (None: the default database). With `create=False` an existing database is opened
    read-only and nothing is created (a missing one is a DatabaseError). Another URL scheme is
    refused by name."""
    if isinstance(database, RecordStore):
        return database, False
    if database is None:
        database = default_database_path()
    if is_postgres_url(database):
        return PostgresStore(database, create=create), True
    if is_database_url(database):
        scheme = _URL.match(database).group(1)  # type: ignore[arg-type,union-attr]
        raise DatabaseError(f"{scheme}:// databases are not supported; give a file path (SQLite) or a "
                            f"postgresql:// URL")
    if not isinstance(database, (str, os.PathLike)):
        raise TypeError(f"database: give a path or a record store, not {type(database).__name__}")
    return SQLiteStore(database, create=create), True
