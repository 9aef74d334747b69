"""SQLite checkpoint stores (standard library): `SqliteCheckpointStore` (sync) and `AsyncSqliteCheckpointStore`.

Layout and save algorithm: `durable_agent._storage.history` and `_sql`. Per save, one
`BEGIN IMMEDIATE` transaction writes the messages added since the last save of that run
plus its header row, so the cost of a save does not grow with the history.

The file is opened in WAL mode with a busy timeout, so several processes (and threads) may
use one file: writers queue on SQLite's write lock, readers never block. `synchronous`
defaults to FULL: a save that returned survives a power loss; NORMAL is faster and survives
a crash of the process but may lose the last saves on a power loss.

The file is created 0600 when missing (it holds conversations and approval tokens); SQLite
gives its -wal and -shm files the same mode. Damage: text that is not UTF-8, rows out of
place or a damaged page of the file raise `CheckpointCorruptError` naming the run on load; a
failed save makes the store forget its view of the run, and the next save re-reads the rows
and replaces what it cannot trust (`_sql.save_plan`).

`AsyncSqliteCheckpointStore` is the same store for asyncio servers: no database call runs on the
event loop's thread. Its plans go to its connection on a thread of its own, and the saves of
concurrent runs share one commit (group commit, `durable_agent.backends.sqlite._group_commit`); each
waiter is released once its own save is durable. Under Pyodide, which has no threads, each
plan runs at once on the caller's thread. Both stores run one implementation of the logic
(`_SqliteStore`): the sync one drives it on the caller's thread, under a lock.

`sqlite3` is imported when a store is opened; where it is missing (Pyodide 0.28 without its
CDN package) opening raises `FeatureUnavailableError`.
"""

from __future__ import annotations

import asyncio
import builtins
import os
import sys
import threading
from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from ..._checkpoint import AgentCheckpoint, RunStatus
from ..._errors import CheckpointCorruptError, ConfigurationError
from ..._storage.faces import AsyncFace, StoreLogic, SyncFace
from ..._storage.history import PrefixCache
from ..._storage.sealing import DAMAGE, row_sealer
from ...encryption import Keyring
from ...encryption._rekey import Rekeyer, RekeyReport
from .._files import connect_sqlite, file_path, sqlite3_module, truncate_wal
from .._sql import checkpoints as _sql
from .._sql.plan import SQLITE, Mergeable, Plan, T
from .._sql.rekey import Position, rekey_plan
from ._group_commit import GroupCommitSqlite, InlineSqlite

_CORRUPT = ("SQLITE_CORRUPT", "SQLITE_NOTADB")


def _text(data: bytes) -> str | bytes:
    """A TEXT value as str, or its raw bytes when they are not UTF-8 (a damaged row): bytes
    reach the plans, which report the run as corrupt on load and rewrite the row on save."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def _reading_bytes(conn: Any, plan: _sql.Plan) -> _sql.Plan:
    """`plan`, run whole on `conn` inside its runner's transaction, with text that is not UTF-8 read as bytes.

    It runs at once, when its runner starts it, on the runner's thread: the connection's
    `text_factory` is switched and switched back around it there, never from another thread.
    """
    yield from ()  # a plan that asks its runner for no query: the transaction is open when it starts
    conn.text_factory = _text
    cur = conn.cursor()
    try:
        return _sql.run_sync(cur, SQLITE, plan)
    finally:
        conn.text_factory = str
        cur.close()



@contextmanager
def sqlite_transaction(conn: Any, lock: Any, mode: Literal["DEFERRED", "IMMEDIATE"]) -> Iterator[Any]:
    """A cursor inside ``BEGIN <mode>`` on `conn` (autocommit mode), holding `lock`: committed, or rolled back."""
    with lock:
        cur = conn.cursor()
        cur.execute(f"BEGIN {mode}")
        try:
            yield cur
        except BaseException:
            conn.rollback()
            raise
        else:
            conn.commit()
        finally:
            cur.close()


class _LockedInline(InlineSqlite):
    """`InlineSqlite` for a connection that several threads share: one transaction at a time."""

    def __init__(self, conn: Any, lock: threading.RLock) -> None:
        super().__init__(conn, SQLITE)
        self._lock = lock

    def transaction(self, plan: _sql.Plan, *, write: bool) -> Any:
        with self._lock:
            return super().transaction(plan, write=write)


class _SqliteStore(StoreLogic):
    """The store's logic, written once as coroutines over a plan runner (see the subclasses)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = 10_000,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        cache_runs: int = 256,
        encryption: Keyring | None = None,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ConfigurationError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        if type(busy_timeout_ms) is not int or busy_timeout_ms < 0:
            raise ConfigurationError(f"busy_timeout_ms must be a non-negative int, got {busy_timeout_ms!r}")
        sqlite3 = sqlite3_module("SqliteCheckpointStore")
        self.path = file_path(path, "SQLite database")
        self._cache = PrefixCache(cache_runs)
        self._sealer = row_sealer(encryption, binary_messages=SQLITE.binary_envelopes)
        # page_size only takes effect on a new, empty file. Message rows are ~1-3 KB: 8 KiB pages pack
        # them with ~7% overhead where the default 4 KiB pages waste ~35% (benches/bench_stores.py).
        self._conn = connect_sqlite(
            sqlite3, self.path, busy_timeout_ms=busy_timeout_ms, synchronous=synchronous, page_size=8192,
            prepare=lambda conn: InlineSqlite(conn, SQLITE).transaction(_sql.schema_plan(SQLITE), write=True),
        )
        self._sqlite3 = sqlite3
        self._runner = self._make_runner()

    @abstractmethod
    def _make_runner(self) -> InlineSqlite | GroupCommitSqlite:
        """What runs the plans on `_conn`."""

    async def _run(
        self, write: bool, make_plan: Callable[[], Plan[T]], run_id: str | None = None, merge: Mergeable | None = None
    ) -> T:
        """Run a fresh plan in one transaction, the damage of a run's data reported as that run's.

        Text that is not UTF-8 makes sqlite3 raise `OperationalError` for the whole query; the
        plan then runs once more with such text read as bytes (`_reading_bytes`), which `load`
        reports as corruption of the run and `save` replaces. Only that retry pays for the
        Python-level text decoding. A damaged page (SQLITE_CORRUPT, SQLITE_NOTADB) is
        `CheckpointCorruptError` naming `run_id`. `merge`: the same write, for a runner that
        runs writes of its kind together (`durable_agent.backends.sqlite._group_commit`).
        """
        try:
            try:
                return await self._runner.run(make_plan(), write=write, merge=merge)
            except self._sqlite3.OperationalError as exc:
                if "Could not decode to UTF-8" not in str(exc):
                    raise
            return await self._runner.run(_reading_bytes(self._conn, make_plan()), write=write)
        except self._sqlite3.DatabaseError as exc:
            if run_id is None or getattr(exc, "sqlite_errorname", None) not in _CORRUPT:
                raise
            raise CheckpointCorruptError(f"the database file is damaged ({exc})", run_id=run_id) from exc

    async def _save(self, checkpoint: AgentCheckpoint, expected: int | None) -> None:
        with self._cache.forgetting(checkpoint.run_id):
            revision = await self._run(
                True, lambda: _sql.save_plan(self._cache, checkpoint, expected, SQLITE, sealer=self._sealer),
                checkpoint.run_id, _sql.MergeableSave(self._cache, checkpoint, expected, self._sealer),
            )
        self._cache.remember_save(checkpoint, revision)

    async def _load(self, run_id: str) -> AgentCheckpoint | None:
        with self._cache.forgetting(run_id, DAMAGE):
            found = await self._run(False, lambda: _sql.load_plan(run_id, self._sealer), run_id)
        return _sql.remembered(self._cache, run_id, found)

    async def _load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None:
        return await self._run(False, lambda: _sql.load_step_plan(run_id, step_index, self._sealer), run_id)

    async def _delete(self, run_id: str) -> None:
        await self._run(True, lambda: _sql.delete_plan(run_id))
        self._cache.forget(run_id)

    async def _list(self, status: RunStatus | None, limit: int | None, after: str | None) -> builtins.list[str]:
        return await self._run(False, lambda: _sql.list_plan(status, limit, after))

    async def _prune(self, before: int, status: RunStatus | None, include_suspended: bool) -> builtins.list[str]:
        doomed: builtins.list[str] = await self._run(True, lambda: _sql.prune_plan(before, status, include_suspended))
        for run_id in doomed:
            self._cache.forget(run_id)
        return doomed

    async def _rekey_batch(self, rekeyer: Rekeyer, position: Position, batch_size: int) -> tuple[RekeyReport, Position]:
        """One batch of `durable_agent.encryption.rekey`, in one write transaction (`rekey_plan`); after the last,
        the -wal is cut (`truncate_wal`)."""
        done = await self._run(True, lambda: rekey_plan(_sql.SEALED_COLUMNS, SQLITE, rekeyer, position, batch_size))
        if done[1] is None:
            truncate_wal(self._sqlite3, self.path)
        return done

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"


class SqliteCheckpointStore(_SqliteStore, SyncFace):
    """Checkpoints in one SQLite file; synchronous methods, safe for several processes and threads.

    `path` is a file path (created when missing) or ":memory:". `busy_timeout_ms` is how long
    a writer waits for another process's write transaction before failing. `encryption`: a
    `durable_agent.encryption.Keyring` that seals every message and header row (README,
    "Encryption at rest"); None stores them in plaintext. In an asyncio
    server use `AsyncSqliteCheckpointStore`: this store's calls run on the caller's thread.
    """

    def _make_runner(self) -> InlineSqlite:
        self._lock = threading.RLock()
        return _LockedInline(self._conn, self._lock)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            self._cache.clear()


class AsyncSqliteCheckpointStore(_SqliteStore, AsyncFace):
    """`SqliteCheckpointStore` with coroutine methods that never block the event loop (see the module docs).

    Same file format, options and rules; one handle serves any number of event loops' tasks;
    `save` returns once that save is durable. `await store.close()` (or ``async with``)
    finishes the queued saves and closes the connection.
    """

    def _make_runner(self) -> InlineSqlite | GroupCommitSqlite:
        self._threaded = sys.platform != "emscripten"  # Pyodide: no threads, each plan runs inline
        return (GroupCommitSqlite if self._threaded else InlineSqlite)(self._conn, SQLITE)

    async def close(self) -> None:
        """Finish the queued plans, stop the connection's thread and close the connection."""
        if self._threaded:
            await asyncio.to_thread(self._runner.close)  # the thread finishes its queue: not on the loop
        else:
            self._runner.close()
        self._cache.clear()
