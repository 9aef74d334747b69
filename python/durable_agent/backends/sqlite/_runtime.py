"""`SqliteRuntime`: the step journal, leases, awakeables, queue, submissions and tool state in one SQLite file.

Several processes may open one file: it is used in WAL mode with a busy timeout, and every
write runs in a ``BEGIN IMMEDIATE`` transaction, so writers queue on SQLite's write lock and
readers never block. A lease holder's write checks the session's epoch inside its own
transaction (see `durable_agent.backends._sql.journal`): a stale writer gets `StaleEpochError` and its
write is not applied. A ``done`` step record commits its tool-state ops in the same transaction.

Checkpoints live in the same file, in the tables of `SqliteCheckpointStore` (which can open the file
too): the runtime writes them itself, inside its fenced lifecycle transactions (`commit`), and
`runtime.stores.checkpoints` reads them through the runtime's connection.

No database call runs on the event loop's thread: plans go to the runtime's connection on a
thread of its own, and the writes of concurrent runs share one commit (group commit, see
`durable_agent.backends.sqlite._group_commit`); each waiter is released once its own write is durable.
Under Pyodide, which has no threads, each plan runs at once on the caller's thread. `sqlite3` is imported when a runtime is opened; where it is missing
(Pyodide 0.28 without its CDN package) opening raises `FeatureUnavailableError`.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Literal

from ..._errors import ConfigurationError
from ..._storage.sealing import row_sealer
from ..._util import wall_clock_ms
from ...encryption import Keyring
from ...encryption._rekey import Rekeyer, RekeyReport
from .._files import connect_sqlite, sqlite3_module, truncate_wal
from .._sql.journal_schema import schema_plan
from .._sql.plan import SQLITE, Mergeable, Plan, T
from .._sql.rekey import Position
from .._sql.runtime import SqlRuntime
from ._group_commit import GroupCommitSqlite, InlineSqlite

DIALECT = SQLITE  # no row locks: BEGIN IMMEDIATE already keeps every other writer out



class _SqliteExecutor:
    """Runs journal plans on one connection: on its own thread with group commit, or inline under Pyodide."""

    dialect = DIALECT

    def __init__(self, path: str, *, busy_timeout_ms: int, synchronous: str, poll_interval_ms: int) -> None:
        sqlite3 = sqlite3_module("SqliteRuntime")
        self._poll = poll_interval_ms / 1000
        self._conn = connect_sqlite(
            sqlite3, path, busy_timeout_ms=busy_timeout_ms, synchronous=synchronous,
            prepare=lambda conn: InlineSqlite(conn, DIALECT).transaction(schema_plan(DIALECT), write=True),
        )
        threaded = sys.platform != "emscripten"
        self._runner = (GroupCommitSqlite if threaded else InlineSqlite)(self._conn, DIALECT)

    def run(self, plan: Plan[T], *, write: bool, merge: Mergeable | None = None,
            snapshot: bool = False) -> Awaitable[T]:
        """`SqlExecutor.run`; every read already sees one snapshot here (`_group_commit`: the reads of a batch
        run in one read transaction; `InlineSqlite`: each plan in its own transaction)."""
        return self._runner.run(plan, write=write, merge=merge)

    async def wait_for_change(self, timeout: float) -> None:
        """SQLite cannot tell another connection of a change: wait one polling interval."""
        await asyncio.sleep(min(timeout, self._poll))

    def close(self) -> None:
        self._runner.close()


class SqliteRuntime(SqlRuntime):
    """A checkpoint-mode `DurableRuntime` in one SQLite file, shared by any number of processes.

    `path`: the file (created when missing). `busy_timeout_ms`: how long a write waits for
    another process's write. `synchronous`: FULL (default) survives a power loss; NORMAL is
    faster and survives a process crash. `poll_interval_ms`: how often an awakeable wait
    looks for a resolution made by another process. `encryption`: a `durable_agent.encryption.Keyring`
    that seals every payload the runtime stores, its checkpoints' rows included (README, "Encryption
    at rest"); None stores them in plaintext. Close it with `close()` or `with`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], int] = wall_clock_ms,
        busy_timeout_ms: int = 10_000,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        poll_interval_ms: int = 20,
        encryption: Keyring | None = None,
    ) -> None:
        sealer = row_sealer(encryption, binary_messages=DIALECT.binary_envelopes)  # a bad option is refused first
        if synchronous not in ("FULL", "NORMAL"):
            raise ConfigurationError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        for name, value in (("busy_timeout_ms", busy_timeout_ms), ("poll_interval_ms", poll_interval_ms)):
            if type(value) is not int or value < 0:
                raise ConfigurationError(f"{name} must be a non-negative int, got {value!r}")
        self.path = os.fspath(path)
        executor = _SqliteExecutor(
            self.path,
            busy_timeout_ms=busy_timeout_ms,
            synchronous=synchronous,
            poll_interval_ms=poll_interval_ms,
        )
        self._executor = executor
        super().__init__(executor, clock=clock, sealer=sealer)

    async def _rekey_batch(self, rekeyer: Rekeyer, position: Position, batch_size: int) -> tuple[RekeyReport, Position]:
        """`SqlRuntime._rekey_batch`; after the last batch the -wal is cut (`truncate_wal`)."""
        done = await super()._rekey_batch(rekeyer, position, batch_size)
        if done[1] is None:
            truncate_wal(sqlite3_module("SqliteRuntime"), self.path)
        return done

    def close(self) -> None:
        """Finish the queued writes and close the database connection."""
        self._executor.close()

    def __enter__(self) -> SqliteRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteRuntime({self.path!r})"

