"""The one place where a database file is created and opened; files owner-only (0600): they hold conversations and tokens.

**Nothing but SQLite opens an existing database file.** POSIX advisory locks belong to the
process, not to a file descriptor: closing *any* descriptor of a file drops every lock the
process holds on it, those of its open SQLite connections included. SQLite knows this and keeps
its own descriptors open while it holds locks; code beside it does not. One `open()` and
`close()` of a live database (to create it 0600, to check it, to touch it) leaves the process's
connections holding no lock, and the next process to close a connection of its own takes itself
for the last user: it checkpoints and deletes the WAL under the live connections, whose later
writes go to an unlinked file no other process sees, lost at their next restart (SQLite's "How
To Corrupt An SQLite Database File", section 2.2). One process routinely holds several
connections to one file: a server its runtime and its event log, the CLI a runtime and a store.

So every SQLite component (stores, runtimes, event logs) opens its file with `connect_sqlite`:

* A missing file is created with ``O_CREAT | O_EXCL`` (mode 0600): the descriptor we close is that
  of a file no connection held, since it did not exist. When the file exists, SQLite alone opens
  it, and it keeps its mode (one the operator chose, too).
* In one process, creating holds `_CREATING`: another thread cannot connect to the new file
  between its creation and the close of our descriptor (it would have to try creating it first).
* SQLite gives the -wal and -shm files the mode of the database file: all three stay private.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from .._errors import ConfigurationError, FeatureUnavailableError

PRIVATE = 0o600
# Refuse to follow a symlink planted where a new file is created (absent on Windows).
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
MEMORY = ":memory:"

_CREATING = threading.Lock()


def sqlite3_module(who: str) -> ModuleType:
    """The standard library's `sqlite3`, or `FeatureUnavailableError` naming `who` needs it (Pyodide 0.28 lacks it)."""
    try:
        import sqlite3
    except ImportError as exc:
        raise FeatureUnavailableError(
            f"{who} needs the sqlite3 module, which this Python lacks "
            "(on Pyodide 0.28 it is a separate package): " + str(exc)
        ) from exc
    return sqlite3


def file_path(path: Any, what: str) -> str:
    """`path` (a str or `os.PathLike`) as a str; `ConfigurationError` for another type or a NUL."""
    try:
        text = os.fspath(path)
    except TypeError:
        raise ConfigurationError(f"{what} path must be a str or os.PathLike, got {path!r}") from None
    if not isinstance(text, str):
        raise ConfigurationError(f"{what} path must be text, got {path!r}")
    if not text or "\x00" in text:
        raise ConfigurationError(f"{what} path must be non-empty and without NUL, got {text!r}")
    return text


def connect_sqlite(
    sqlite3: ModuleType,
    path: str,
    *,
    busy_timeout_ms: int,
    prepare: Callable[[Any], object],
    synchronous: str | None = None,
    page_size: int | None = None,
) -> Any:
    """A connection to the SQLite file `path` in WAL mode, the file created 0600 when missing (see the module docs).

    Autocommit (the caller opens its transactions), usable from any thread (the caller serialises
    its calls). `prepare(conn)` runs before the connection is handed out (it creates the caller's
    tables). `synchronous`: the PRAGMA, when given. `page_size`: for a new file only (SQLite
    ignores it once the file has pages). `":memory:"` is a private in-memory database.
    Raises `ConfigurationError` when the file cannot be created, opened, put in WAL mode or
    prepared; the connection is then closed.
    """
    try:
        if path != MEMORY:
            _create_missing(file_path(path, "SQLite database"))
        conn = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False)
    except (sqlite3.Error, OSError) as exc:
        raise ConfigurationError(f"cannot open SQLite database {path!r}: {exc}") from exc
    try:
        if page_size is not None:
            conn.execute(f"PRAGMA page_size = {page_size}")  # before WAL mode writes the first page
        _enable_wal(conn, busy_timeout_ms)
        if synchronous is not None:
            conn.execute(f"PRAGMA synchronous = {synchronous}")
        prepare(conn)
    except sqlite3.Error as exc:
        conn.close()
        raise ConfigurationError(f"cannot use SQLite database {path!r}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


def truncate_wal(sqlite3: ModuleType, path: str) -> bool:
    """Copy the -wal file of the SQLite database at `path` into the database and cut it to zero bytes, on a
    connection of its own (``PRAGMA wal_checkpoint(TRUNCATE)``): what a rekey does last, so the pages it
    rewrote leave no older copy in the -wal. False when a reader or writer of another connection kept it
    from finishing (the -wal then still holds frames; SQLite checkpoints them later); nothing for
    ``":memory:"``."""
    if path == MEMORY:
        return True
    conn = sqlite3.connect(path, timeout=10, isolation_level=None)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()
    return not busy


def _create_missing(path: str) -> None:
    """Create `path` empty, mode 0600, unless it exists: an existing file is never opened here.

    A symlink is followed as SQLite follows it (a deployment may link the path to a volume): the
    file is created where the link points. O_EXCL never opens what is there, not even a link.
    """
    target = os.path.realpath(path)  # readlink and lstat only: nothing is opened
    with _CREATING:
        try:
            fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL, PRIVATE)
        except FileExistsError:
            return
        os.close(fd)


def _enable_wal(conn: Any, busy_timeout_ms: int) -> None:
    """Put the SQLite database of `conn` in WAL mode, waiting up to `busy_timeout_ms` for other processes.

    Turning a new file to WAL takes an exclusive lock, and when another connection holds a lock
    SQLite answers SQLITE_BUSY at once instead of calling the busy handler: processes opening one
    new file at the same moment (workers started together) would fail. Try again until the timeout.
    """
    deadline = time.monotonic() + busy_timeout_ms / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
            return
        except Exception as exc:
            if getattr(exc, "sqlite_errorname", None) != "SQLITE_BUSY" or time.monotonic() >= deadline:
                raise
        time.sleep(0.005)
