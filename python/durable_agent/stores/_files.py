"""Creating the files that hold conversations and approval tokens (owner-only, 0600), and opening SQLite ones."""

from __future__ import annotations

import os
import time
from typing import Any

from ..errors import ConfigurationError

PRIVATE = 0o600
# Refuse to follow a symlink planted where a new file is created (absent on Windows).
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


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


def create_private(path: str) -> None:
    """Create `path` empty with mode 0600 when it does not exist; an existing file keeps its mode.

    SQLite creates its -wal and -shm files with the mode of the database file, so creating
    the database this way keeps all three private. Raises `OSError` (a missing directory, no
    permission) and `ConfigurationError` for a path holding NUL.
    """
    file_path(path, "database")
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE))


def enable_wal(conn: Any, busy_timeout_ms: int) -> None:
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
