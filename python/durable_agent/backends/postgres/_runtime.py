"""`PostgresRuntime`: the step journal, leases, awakeables, queue, submissions and tool state in Postgres.

The same tables and plans as the SQLite runtime (`durable_agent.backends._sql.journal`), on psycopg 3's
async API. Every plan runs in one READ COMMITTED transaction:

* a claim reads the session's lease row ``SELECT ... FOR UPDATE`` and applies the lease rules
  (`durable_agent._storage.leases`) to it; concurrent claimers of one session queue on that
  row lock and the later ones see the winner, so they are refused naming it;
* a lease holder's write reads the lease row ``FOR SHARE`` in its own transaction and stops
  with `StaleEpochError` (rolled back, nothing applied) when the epoch moved on;
* resolving an awakeable sends ``NOTIFY durable_agent_journal`` in its transaction; a waiting
  run ``LISTEN``s on a connection of its own and re-reads at once (`wait_for_change`), with
  a poll of at most a second as the fallback.

Checkpoints live in the same database, in the tables of `AsyncPostgresCheckpointStore` (which can
open the database too): the runtime writes them itself, inside its fenced lifecycle transactions
(`commit`), and `runtime.stores.checkpoints` reads them through the runtime's connection.

Connections: by default a pool of up to `max_connections` (10), so concurrent runs do not queue
behind each other's transactions, plus one connection for LISTEN, all opened on first use inside
the running event loop; or pass a `psycopg_pool.AsyncConnectionPool` as `pool=`. Close with
``await runtime.close()``.
Install with ``pip install 'durable-agent[postgres]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..._errors import ConfigurationError, FeatureUnavailableError
from ..._storage.sealing import row_sealer
from ..._util import pool_connection, wall_clock_ms
from ...encryption import Keyring
from .._sql.journal_schema import schema_plan
from .._sql.plan import POSTGRES, Mergeable, Plan, Query, T, execute_async, run_async
from .._sql.runtime import SqlRuntime

logger = logging.getLogger("durable_agent")

CHANNEL = "durable_agent_journal"  # what `POSTGRES.notify` notifies
DIALECT = POSTGRES
_READ_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise FeatureUnavailableError(
            f"PostgresRuntime needs psycopg 3: pip install 'durable-agent[postgres]' ({exc})"
        ) from exc
    return psycopg


class _Listener:
    """LISTENs on its own connection; `wait` returns when a notification came since the last `wait`, or on timeout.

    The flag stays set until a `wait` consumes it, so a notification that arrives between a
    waiter's read and its `wait` is not lost. Several waiters may share one flag: one of them
    may consume it first and the others then wait out their (short) timeout and read again.
    """

    def __init__(self, psycopg: Any, conninfo: str) -> None:
        self._psycopg, self._conninfo = psycopg, conninfo
        self._conn: Any = None
        self._pump: asyncio.Task[None] | None = None
        self._changed: asyncio.Event | None = None
        self._failed = False

    async def _start(self) -> None:
        self._changed = asyncio.Event()
        try:
            self._conn = await self._psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            await self._conn.execute(f"LISTEN {CHANNEL}")
        except self._psycopg.Error as exc:
            logger.warning("cannot LISTEN for awakeable resolutions (%s); waits poll instead", exc)
            self._failed = True
            return
        self._pump = asyncio.ensure_future(self._receive())

    async def _receive(self) -> None:
        assert self._changed is not None
        try:
            async for _ in self._conn.notifies():
                self._changed.set()
        except self._psycopg.Error as exc:
            logger.warning("lost the LISTEN connection (%s); waits poll instead", exc)
            self._failed = True

    async def wait(self, timeout: float) -> None:
        if self._changed is None:
            await self._start()
        assert self._changed is not None
        if self._failed:
            await asyncio.sleep(timeout)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)
        self._changed.clear()

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
        if self._conn is not None:
            await self._conn.close()


class _PostgresExecutor:
    """Runs journal plans, each in its own transaction, on a pool's connections (or one connection)."""

    dialect = DIALECT

    def __init__(self, conninfo: str, pool: Any, max_connections: int) -> None:
        self._psycopg = _psycopg()
        self._own_pool = pool is None and max_connections > 1
        if self._own_pool:
            try:
                import psycopg_pool
            except ImportError as exc:
                raise FeatureUnavailableError(
                    f"PostgresRuntime's pool needs psycopg_pool: pip install 'durable-agent[postgres]' ({exc})"
                ) from exc
            pool = psycopg_pool.AsyncConnectionPool(conninfo, min_size=1, max_size=max_connections, open=False,
                                                    kwargs={"autocommit": True})
        self._conninfo = conninfo if pool is None else pool.conninfo
        self._pool = pool
        self._opened = not self._own_pool
        self._conn: Any = None
        self._turn: asyncio.Lock | None = None
        self._migrated = False
        self.listener = _Listener(self._psycopg, self._conninfo)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A connection for one transaction: the pool's, or this executor's own (transactions take turns)."""
        if self._pool is not None:
            if not self._opened:  # opened inside the running event loop, on first use
                self._opened = True
                await self._pool.open()
            async with pool_connection(self._pool) as conn:
                yield conn
            return
        if self._turn is None:
            self._turn = asyncio.Lock()
        async with self._turn:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = await self._psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            yield self._conn

    async def _transaction(self, conn: Any, plan: Plan[T], first: Query | None = None) -> T:
        async with conn.transaction(), conn.cursor() as cur:
            return await run_async(cur, DIALECT, plan, first)

    async def run(self, plan: Plan[T], *, write: bool, merge: Mergeable | None = None, snapshot: bool = False) -> T:
        """A write in one transaction; a read statement by statement (autocommit: one round trip each), or with
        `snapshot` in one REPEATABLE READ, READ ONLY transaction (a checkpoint: its header and its rows).

        A write whose first statement may run alone (`Query.alone`: a fenced write checks the
        lease inside its one statement) is that statement, committed as it ends: one round trip.
        If the plan goes on, the rest runs in a transaction of its own.

        Every read is one statement but `resumable`'s, whose answer is advisory anyway: a listed
        run is only resumed through a claim, which re-checks the lease under its row lock.
        """
        async with self.connection() as conn:
            if not self._migrated:
                await self._transaction(conn, schema_plan(DIALECT))
                self._migrated = True
            if not write and snapshot:
                async with conn.transaction(), conn.cursor() as cur:
                    await cur.execute(_READ_SNAPSHOT)
                    return await run_async(cur, DIALECT, plan)
            if not write:
                async with conn.cursor() as cur:
                    return await run_async(cur, DIALECT, plan)
            try:
                first = next(plan)
            except StopIteration as stop:
                done: T = stop.value
                return done
            if not (first.alone and conn.autocommit):
                return await self._transaction(conn, plan, first)
            async with conn.cursor() as cur:
                answer = await execute_async(cur, DIALECT, first)
            try:
                rest = plan.send(answer)
            except StopIteration as stop:
                value: T = stop.value
                return value
            return await self._transaction(conn, plan, rest)

    async def wait_for_change(self, timeout: float) -> None:
        await self.listener.wait(timeout)

    async def close(self) -> None:
        await self.listener.close()
        if self._conn is not None:
            await self._conn.close()
        if self._own_pool and self._opened:
            await self._pool.close()


class PostgresRuntime(SqlRuntime):
    """A checkpoint-mode `DurableRuntime` in a Postgres database, shared by any number of processes.

    `conninfo`: a libpq URL or DSN (its ``options`` may set a ``search_path``). `pool`: a
    `psycopg_pool.AsyncConnectionPool` to use instead; without one the runtime opens its own pool of
    up to `max_connections` (1: a single connection whose transactions take turns). `encryption`: a
    `durable_agent.encryption.Keyring` that seals every payload the runtime stores, its checkpoints'
    rows included (README, "Encryption at rest"); None stores them in plaintext.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: Any = None,
        clock: Callable[[], int] = wall_clock_ms,
        max_connections: int = 10,
        encryption: Keyring | None = None,
    ) -> None:
        sealer = row_sealer(encryption)  # a bad option is refused before anything is opened
        if type(max_connections) is not int or max_connections < 1:
            raise ConfigurationError(f"max_connections must be an int of at least 1, got {max_connections!r}")
        executor = _PostgresExecutor(conninfo, pool, max_connections)
        self._executor = executor
        super().__init__(executor, clock=clock, sealer=sealer)

    async def close(self) -> None:
        """Close the connections this runtime opened (a pool passed in stays open)."""
        await self._executor.close()

    async def __aenter__(self) -> PostgresRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

