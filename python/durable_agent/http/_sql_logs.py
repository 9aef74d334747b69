"""`SqliteEventLog` and `PostgresEventLog`: the event log in a database every server process shares.

Both run the plans of `durable_agent.http._sql`, each call one transaction. A reader in the
writing process wakes at once (`Wakeups`); a reader in another process polls the database
every `poll_interval_ms` while it waits. With ``encryption=keyring`` (a `durable_agent.encryption.Keyring`)
each run's meta and each event's data are sealed, bound to their run and seq (README, "Encryption at rest").
"""

from __future__ import annotations

import abc
import asyncio
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import ConfigurationError, FeatureUnavailableError
from .._storage.sealing import row_sealer
from .._util import wall_clock_ms
from ..backends._files import truncate_wal
from ..backends._sql.plan import POSTGRES, SQLITE, Dialect, Plan, T, run_async, run_sync
from ..backends._sql.rekey import Position, rekey_plan
from ..backends.sqlite._group_commit import InlineSqlite
from ..backends.sqlite._store import sqlite_transaction
from ..encryption import Keyring
from ..encryption._rekey import Rekeyer, RekeyReport
from . import _sql
from ._events import RunEvent, RunInfo, Wakeups, check_prune, check_run_ids

__all__ = ["PostgresEventLog", "SqliteEventLog"]



class _SqlEventLog(abc.ABC):
    """The `EventLog` methods over an executor's `_run(plan, write=)`; subclasses open the database."""

    _dialect: Dialect

    def __init__(self, clock: Callable[[], int], poll_interval_ms: int, encryption: Keyring | None) -> None:
        if type(poll_interval_ms) is not int or poll_interval_ms <= 0:
            raise ConfigurationError(f"poll_interval_ms must be a positive int, got {poll_interval_ms!r}")
        self._sealer = row_sealer(encryption)
        self._clock = clock
        self._poll = poll_interval_ms / 1000
        self._wakeups = Wakeups()

    @abc.abstractmethod
    async def _run(self, plan: Plan[T], *, write: bool) -> T:
        ...

    async def create_run(self, run_id: str, session_id: str, meta: Mapping[str, Any]) -> bool:
        return await self._run(_sql.create_run_plan(run_id, session_id, int(self._clock()), meta, self._sealer), write=True)

    async def run_info(self, run_id: str) -> RunInfo | None:
        return await self._run(_sql.run_info_plan(run_id, self._sealer), write=False)

    async def append(self, run_id: str, events: Sequence[tuple[str, dict[str, Any]]]) -> list[RunEvent]:
        added = await self._run(_sql.append_plan(self._dialect, run_id, events, self._sealer), write=True)
        if added:
            self._wakeups.notify(run_id)
        return added

    async def read(self, run_id: str, after: int = 0) -> list[RunEvent]:
        return await self._run(_sql.read_plan(run_id, after, self._sealer), write=False)

    async def wait(self, run_id: str, after: int, timeout: float) -> None:
        if await self._run(_sql.latest_plan(run_id), write=False) <= after:
            await self._wakeups.wait(run_id, min(timeout, self._poll))

    async def forget(self, run_ids: Sequence[str]) -> list[str]:
        return self._forgotten(await self._run(_sql.forget_plan(check_run_ids(run_ids)), write=True))

    async def prune(self, *, before: int) -> list[str]:
        return self._forgotten(await self._run(_sql.prune_plan(check_prune(before), self._sealer), write=True))

    async def parked(self) -> dict[str, int]:
        return await self._run(_sql.parked_plan(), write=False)

    async def _rekey_batch(self, rekeyer: Rekeyer, position: Position, batch_size: int) -> tuple[RekeyReport, Position]:
        """One batch of `durable_agent.encryption.rekey_async(log, keyring)`, in one write transaction (`rekey_plan`)."""
        return await self._run(rekey_plan(_sql.SEALED_COLUMNS, self._dialect, rekeyer, position, batch_size), write=True)

    def _forgotten(self, gone: list[str]) -> list[str]:
        for run_id in gone:
            self._wakeups.notify(run_id)  # a waiting reader of this process finds the run gone
        return gone


class SqliteEventLog(_SqlEventLog):
    """An `EventLog` in a SQLite file (WAL mode): pass the SQLite runtime's path (and keyring) to keep one file.

    The calls are short and synchronous, like `SqliteRuntime`'s; a write is one ``BEGIN
    IMMEDIATE`` transaction. The file is created owner-only when missing. Close with `close()`.
    """

    _dialect = SQLITE

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 10_000, poll_interval_ms: int = 50,
                 clock: Callable[[], int] = wall_clock_ms, encryption: Keyring | None = None) -> None:
        super().__init__(clock, poll_interval_ms, encryption)
        from ..backends._files import connect_sqlite, sqlite3_module

        sqlite3 = self._sqlite3 = sqlite3_module("SqliteEventLog")

        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._conn = connect_sqlite(sqlite3, self.path, busy_timeout_ms=busy_timeout_ms,
                                    prepare=lambda conn: InlineSqlite(conn, SQLITE).transaction(
                                        _sql.schema_plan(SQLITE), write=True))

    def _transaction(self, plan: Plan[T], *, write: bool) -> T:
        with sqlite_transaction(self._conn, self._lock, "IMMEDIATE" if write else "DEFERRED") as cursor:
            return run_sync(cursor, SQLITE, plan)

    async def _run(self, plan: Plan[T], *, write: bool) -> T:
        return self._transaction(plan, write=write)

    async def _rekey_batch(self, rekeyer: Rekeyer, position: Position, batch_size: int) -> tuple[RekeyReport, Position]:
        """`_SqlEventLog._rekey_batch`; after the last batch the -wal is cut (`truncate_wal`)."""
        done = await super()._rekey_batch(rekeyer, position, batch_size)
        if done[1] is None:
            truncate_wal(self._sqlite3, self.path)
        return done

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"SqliteEventLog({self.path!r})"


class PostgresEventLog(_SqlEventLog):
    """An `EventLog` in Postgres (psycopg 3, ``pip install 'durable-agent[postgres]'``), for servers on many hosts.

    `conninfo`: a libpq URL or DSN (its ``options`` may set a ``search_path``), e.g. the
    Postgres runtime's. One connection, opened on first use inside the running event loop;
    its transactions take turns. Close with ``await log.close()``.
    """

    _dialect = POSTGRES

    def __init__(self, conninfo: str, *, poll_interval_ms: int = 100, clock: Callable[[], int] = wall_clock_ms,
                 encryption: Keyring | None = None) -> None:
        super().__init__(clock, poll_interval_ms, encryption)
        try:
            import psycopg
        except ImportError as exc:
            raise FeatureUnavailableError(
                f"PostgresEventLog needs psycopg 3: pip install 'durable-agent[postgres]' ({exc})") from exc
        self._psycopg = psycopg
        self._conninfo = conninfo
        self._conn: Any = None
        self._turn: asyncio.Lock | None = None

    async def _run(self, plan: Plan[T], *, write: bool) -> T:
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:
            if self._conn is None or self._conn.closed:
                self._conn = await self._psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                async with self._conn.transaction(), self._conn.cursor() as cursor:
                    await run_async(cursor, POSTGRES, _sql.schema_plan(POSTGRES))
            async with self._conn.transaction(), self._conn.cursor() as cursor:
                return await run_async(cursor, POSTGRES, plan)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    def __repr__(self) -> str:
        return "PostgresEventLog(...)"  # the conninfo may hold a password
