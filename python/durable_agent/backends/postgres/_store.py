"""Postgres checkpoint stores (psycopg 3): `PostgresCheckpointStore` (sync) and `AsyncPostgresCheckpointStore`.

The same append-only layout as the SQLite store (`_sql`): a header row per run in
`durable_agent_runs`, one row per message in `durable_agent_messages`, a save writing only the
messages added since the run's stored history, in one transaction that first takes a per-run
advisory lock (`pg_advisory_xact_lock`), so concurrent writers of one run queue instead of
interleaving, and writers of different runs do not wait for each other. Loads read in one
REPEATABLE READ snapshot. The tables are created, or migrated, on first use under an advisory
lock; `durable_agent_schema_version` records the version.

Connections come from a `psycopg_pool` pool (`min_size`/`max_size`), or pass your own `pool=`.
A connection lost mid-save rolls the transaction back; the next save finds the stored state
and heals (no gap, no duplicate message). Any failed save makes the store forget its view of
that run, so a stray or damaged row costs one failed save, never every later one. The two stores
run one implementation of the logic (`_PostgresStore`, the pattern of `durable_agent._storage.faces`):
the sync one on a sync pool, on the caller's thread, the async one on an async pool. Install with
``pip install 'durable-agent[postgres]'``.
"""

from __future__ import annotations

import builtins
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from ..._checkpoint import AgentCheckpoint, RunStatus
from ..._errors import ConfigurationError, FeatureUnavailableError
from ..._storage.faces import AsyncFace, StoreLogic, SyncFace
from ..._storage.history import PrefixCache
from ..._storage.sealing import DAMAGE, row_sealer
from ..._util import pool_connection
from ...encryption import Keyring
from ...encryption._rekey import Rekeyer, RekeyReport
from .._sql import checkpoints as _sql
from .._sql.plan import POSTGRES, Plan, T
from .._sql.rekey import Position, rekey_plan

DIALECT = POSTGRES
_READ_SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"


def _pool_module() -> Any:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool
    except ImportError as exc:
        raise FeatureUnavailableError(
            "the Postgres store needs psycopg 3 and psycopg_pool: pip install 'durable-agent[postgres]' "
            f"({exc})"
        ) from exc
    return psycopg_pool


def _check_pool_options(psycopg: Any, conninfo: Any, min_size: Any, max_size: Any) -> None:
    """`ConfigurationError` for pool sizes or a conninfo psycopg_pool would refuse later, or never."""
    if type(min_size) is not int or type(max_size) is not int or not 0 <= min_size <= max_size or max_size < 1:
        raise ConfigurationError(
            f"need ints with 0 <= min_size <= max_size and max_size >= 1, got min_size={min_size!r}, "
            f"max_size={max_size!r}"
        )
    if not isinstance(conninfo, str):
        raise ConfigurationError(f"conninfo must be a str, got {conninfo!r}")
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"bad Postgres conninfo: {exc}") from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise ConfigurationError(f"bad Postgres port {port!r} (1-65535)")


class _PostgresStore(StoreLogic):
    """The store's logic, written once as coroutines over `_run_once` (one plan in one transaction).

    `PostgresCheckpointStore` runs its plans on a sync pool's connection on the caller's thread
    (they never suspend: its methods drive the logic with `run_now`), `AsyncPostgresCheckpointStore`
    on an async pool's.
    """

    def __init__(
        self,
        conninfo: str = "",
        *,
        pool: Any = None,
        min_size: int = 1,
        max_size: int = 4,
        cache_runs: int = 256,
        encryption: Keyring | None = None,
    ) -> None:
        psycopg_pool = _pool_module()
        import psycopg

        if pool is None:
            _check_pool_options(psycopg, conninfo, min_size, max_size)
        self._operational_error: type[Exception] = psycopg.OperationalError
        self._cache = PrefixCache(cache_runs)
        self._sealer = row_sealer(encryption)
        self._migrated = False
        self._own_pool = pool is None
        self._pool = self._open_pool(psycopg_pool, conninfo, min_size, max_size) if pool is None else pool

    @abstractmethod
    def _open_pool(self, psycopg_pool: Any, conninfo: str, min_size: int, max_size: int) -> Any:
        """The store's own pool of `conninfo` (when no `pool=` was given)."""

    @abstractmethod
    async def _run_once(self, plan: Plan[T], snapshot: bool) -> T:
        """Run `plan` in one transaction (REPEATABLE READ when `snapshot`), migrating the schema on first use."""

    async def _run(self, make_plan: Callable[[], Plan[T]], *, snapshot: bool = False) -> T:
        """Run a fresh plan in one transaction, once more on a new connection if the first one was dead.

        Every plan is safe to run again: a save whose commit was lost in the failure finds a
        revision it does not know and re-reads the stored rows.
        """
        try:
            return await self._run_once(make_plan(), snapshot)
        except self._operational_error:
            return await self._run_once(make_plan(), snapshot)

    async def _save(self, checkpoint: AgentCheckpoint, expected: int | None) -> None:
        with self._cache.forgetting(checkpoint.run_id):
            revision = await self._run(lambda: _sql.save_plan(self._cache, checkpoint, expected, DIALECT, sealer=self._sealer))
        self._cache.remember_save(checkpoint, revision)

    async def _load(self, run_id: str) -> AgentCheckpoint | None:
        with self._cache.forgetting(run_id, DAMAGE):
            found = await self._run(lambda: _sql.load_plan(run_id, self._sealer), snapshot=True)
        return _sql.remembered(self._cache, run_id, found)

    async def _load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None:
        return await self._run(lambda: _sql.load_step_plan(run_id, step_index, self._sealer), snapshot=True)

    async def _delete(self, run_id: str) -> None:
        await self._run(lambda: _sql.delete_plan(run_id))
        self._cache.forget(run_id)

    async def _list(self, status: RunStatus | None, limit: int | None, after: str | None) -> builtins.list[str]:
        return await self._run(lambda: _sql.list_plan(status, limit, after))

    async def _prune(self, before: int, status: RunStatus | None, include_suspended: bool) -> builtins.list[str]:
        doomed: builtins.list[str] = await self._run(lambda: _sql.prune_plan(before, status, include_suspended))
        for run_id in doomed:
            self._cache.forget(run_id)
        return doomed

    async def _rekey_batch(self, rekeyer: Rekeyer, position: Position, batch_size: int) -> tuple[RekeyReport, Position]:
        """One batch of `durable_agent.encryption.rekey`, in one transaction (`rekey_plan`)."""
        return await self._run(lambda: rekey_plan(_sql.SEALED_COLUMNS, DIALECT, rekeyer, position, batch_size))


class PostgresCheckpointStore(_PostgresStore, SyncFace):
    """Checkpoints in Postgres; synchronous methods, safe for many processes.

    `conninfo` is a libpq URL or DSN. Call `close()` (or use `with`) to close the pool. `encryption`: a
    `durable_agent.encryption.Keyring` that seals every message and header row (README, "Encryption at
    rest"); None stores them in plaintext.
    """

    def _open_pool(self, psycopg_pool: Any, conninfo: str, min_size: int, max_size: int) -> Any:
        return psycopg_pool.ConnectionPool(conninfo, min_size=min_size, max_size=max_size, open=True)

    async def _run_once(self, plan: Plan[T], snapshot: bool) -> T:
        with self._pool.connection() as conn:
            if not self._migrated:
                with conn.transaction(), conn.cursor() as cur:
                    _sql.run_sync(cur, DIALECT, _sql.schema_plan(DIALECT))
                self._migrated = True
            with conn.transaction(), conn.cursor() as cur:
                if snapshot:
                    cur.execute(_READ_SNAPSHOT)
                return _sql.run_sync(cur, DIALECT, plan)

    def close(self) -> None:
        if self._own_pool:
            self._pool.close()
        self._cache.clear()


class AsyncPostgresCheckpointStore(_PostgresStore, AsyncFace):
    """`PostgresCheckpointStore` with coroutine methods (psycopg's async pool), for asyncio servers.

    The pool opens on first use, inside the running event loop; `await store.close()` (or
    ``async with``) closes it.
    """

    _opened = False  # whether the store's own pool was opened (a pool given with `pool=` is the caller's)

    def _open_pool(self, psycopg_pool: Any, conninfo: str, min_size: int, max_size: int) -> Any:
        return psycopg_pool.AsyncConnectionPool(conninfo, min_size=min_size, max_size=max_size, open=False)

    async def _run_once(self, plan: Plan[T], snapshot: bool) -> T:
        if self._own_pool and not self._opened:
            await self._pool.open()
            self._opened = True
        async with pool_connection(self._pool) as conn:
            if not self._migrated:
                async with conn.transaction(), conn.cursor() as cur:
                    await _sql.run_async(cur, DIALECT, _sql.schema_plan(DIALECT))
                self._migrated = True
            async with conn.transaction(), conn.cursor() as cur:
                if snapshot:
                    await cur.execute(_READ_SNAPSHOT)
                return await _sql.run_async(cur, DIALECT, plan)

    async def close(self) -> None:
        if self._own_pool and self._opened:
            await self._pool.close()
        self._cache.clear()
