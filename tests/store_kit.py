"""Test kit for SQL stores and runtimes: an async checkpoint store with a sync face, so one test body checks a
sync store and its async twin; writes queued into one group-commit batch."""

from __future__ import annotations

import asyncio
from typing import Any


class BlockingStore:
    """Runs each coroutine method of `store` to its end on an event loop of this handle's own.

    One loop for the handle's life: a `redis.asyncio` client's connections belong to the loop
    that opened them. Use a handle from one thread at a time.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self._loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        return lambda *args, **kwargs: self._loop.run_until_complete(method(*args, **kwargs))

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self.store.close())
        finally:
            self._loop.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def queued_together(db: Any, writes: list[Any]) -> list[Any]:
    """`writes` (coroutines of one SQLite store or runtime) queued while another connection holds the file's
    write lock, so the writer thread takes them in one or two batches; their results or errors, in order."""
    import sqlite3

    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    pending = [asyncio.ensure_future(write) for write in writes]
    await asyncio.sleep(0.05)
    blocker.execute("ROLLBACK")
    blocker.close()
    return await asyncio.gather(*pending, return_exceptions=True)
