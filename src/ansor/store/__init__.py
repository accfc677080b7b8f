"""Record stores: where measured programs are kept, behind one small interface.

`ansor.records.RecordStore` is the interface; `SQLiteStore` (one file, the default) implements
it. `open_store` is the one way from what a user passes as ``database=`` (a store, a path, or
None for the user's default database) to an open store. Only the tuning job, the public entry
points and the command line open stores; everything below them receives one.
"""

from __future__ import annotations

import os

from ansor.records import DatabaseError, RecordStore
from ansor.store.sqlite import SQLiteStore, default_database_path

__all__ = ["Database", "DatabaseError", "RecordStore", "SQLiteStore", "default_database_path", "open_store"]

#: The default store under its first public name (`ansor.Database`).
Database = SQLiteStore


def open_store(database: RecordStore | str | os.PathLike[str] | None, create: bool = True) -> tuple[RecordStore, bool]:
    """(store, whether the caller owns it and must close it): a store object as given, else the
    SQLite file at the path (None: the default database). With `create=False` an existing
    database is opened read-only and nothing is created (a missing file is a DatabaseError)."""
    if isinstance(database, RecordStore):
        return database, False
    path = database if database is not None else default_database_path()
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"database: give a path or a record store, not {type(database).__name__}")
    return SQLiteStore(path, create=create), True
