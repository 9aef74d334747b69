"""A stdio server's stderr: passed on to ours as it comes, its last bytes kept for the error that explains a failure.

The SDK hands the server process a file as its stderr (`writer`); here that is the write end of a
pipe, and a daemon thread drains the read end: each chunk goes on to `sys.stderr` (what a server
wrote reached the user's terminal before too) and into a tail of at most `limit` bytes. When the
server fails to start or dies, `tail()` waits (bounded) for the pipe's end, which comes as the
process exits, so a Python server's last traceback is in the `MCPServerError`.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import sys
import threading
from typing import TextIO

STDERR_TAIL_BYTES = 2048
"""How much of a stdio server's stderr an `MCPServerError` carries: its last 2 KB."""

DRAIN_WAIT = 2.0
"""How long `tail()` waits for the server's stderr to end (its process is gone by then, or soon)."""


class StderrTail:
    """The stderr of one server process (see the module docs)."""

    def __init__(self, limit: int = STDERR_TAIL_BYTES) -> None:
        read_fd, write_fd = os.pipe()
        self.writer: TextIO = os.fdopen(write_fd, "w")
        self._limit = limit
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, args=(read_fd,), name="mcp-stderr", daemon=True)
        self._thread.start()

    def spawned(self) -> None:
        """Close this process's copy of the write end (the server has its own): the pipe ends when the server does.
        Idempotent; called once the process is started, or failed to start."""
        if not self.writer.closed:
            self.writer.close()

    def _drain(self, read_fd: int) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        with os.fdopen(read_fd, "rb", buffering=0) as reader:
            while chunk := reader.read(4096):
                with self._lock:
                    self._tail += chunk
                    del self._tail[:-self._limit]
                try:
                    sys.stderr.write(decoder.decode(chunk))
                except (OSError, ValueError):  # our own stderr is closed: the tail is still kept
                    pass

    async def tail(self) -> str:
        """The last `limit` bytes the server wrote to stderr, once it ended (or `DRAIN_WAIT` passed), as text."""
        self.spawned()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, DRAIN_WAIT)
        with self._lock:
            return bytes(self._tail).decode(errors="replace").strip()
