"""The SQLite backend (standard-library `sqlite3`): a checkpoint store and a runtime on one file.

`SqliteCheckpointStore` / `AsyncSqliteCheckpointStore` keep checkpoints; `SqliteRuntime` adds
the step journal, leases, awakeables and the endpoint's submissions, with concurrent runs'
writes sharing one commit (group commit). All of them, and the endpoint's SQLite event log,
may share one database file in one process and across processes (`_files.connect_sqlite`).
"""

from __future__ import annotations

from ._runtime import SqliteRuntime
from ._store import AsyncSqliteCheckpointStore, SqliteCheckpointStore

__all__ = ["AsyncSqliteCheckpointStore", "SqliteCheckpointStore", "SqliteRuntime"]
