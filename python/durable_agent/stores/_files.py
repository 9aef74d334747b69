"""Creating the files that hold conversations and approval tokens: owner-only (0600)."""

from __future__ import annotations

import os

PRIVATE = 0o600
# Refuse to follow a symlink planted where a new file is created (absent on Windows).
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def create_private(path: str) -> None:
    """Create `path` empty with mode 0600 when it does not exist; an existing file keeps its mode.

    SQLite creates its -wal and -shm files with the mode of the database file, so creating
    the database this way keeps all three private. Raises `OSError` (a missing directory, no
    permission).
    """
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE))
