"""Postgres stores (sync and async) against a real server: conformance, schema, faults.

Run under `scripts/services run -- ...` (sets DURABLE_AGENT_TEST_POSTGRES_URL).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from durable_agent import CheckpointCorruptError, FeatureUnavailableError
from durable_agent.testing import (
    CheckpointStoreConformance,
    conversation,
    hammer_one_run,
    make_checkpoint,
    message,
)
from durable_agent.testing.services import postgres_schema

pytestmark = pytest.mark.host_only("needs a Postgres server and psycopg")


@pytest.fixture
def conninfo() -> Iterator[str]:
    """A conninfo whose search_path is a fresh schema, dropped afterwards."""
    with postgres_schema("t") as info:
        yield info


def _sql(conninfo: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


class TestPostgresStore(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self, conninfo: str) -> Callable[[], Any]:
        from durable_agent.backends.postgres import PostgresCheckpointStore

        return lambda: PostgresCheckpointStore(conninfo, max_size=2)


class TestAsyncPostgresStore(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self, conninfo: str) -> Callable[[], Any]:
        from durable_agent.backends.postgres import AsyncPostgresCheckpointStore

        return lambda: AsyncPostgresCheckpointStore(conninfo, max_size=2)


@pytest.fixture
def store(conninfo: str) -> Iterator[Any]:
    from durable_agent.backends.postgres import PostgresCheckpointStore

    with PostgresCheckpointStore(conninfo, max_size=2) as s:
        yield s


def test_schema_version_table_and_newer_schema_refused(conninfo: str, store: Any) -> None:
    from durable_agent.backends.postgres import PostgresCheckpointStore

    store.save(make_checkpoint("r", 1))
    assert _sql(conninfo, "SELECT version FROM durable_agent_schema_version ORDER BY version") == [(1,), (2,)]
    _sql(conninfo, "INSERT INTO durable_agent_schema_version VALUES (7)")
    with PostgresCheckpointStore(conninfo) as newer, pytest.raises(FeatureUnavailableError, match="version 7"):
        newer.load("r")


def test_a_save_writes_only_the_new_messages(conninfo: str, store: Any) -> None:
    history = conversation(10)
    store.save(make_checkpoint("r", 1, history))
    before = _sql(conninfo, "SELECT seq, xmin::text FROM durable_agent_messages ORDER BY seq")
    store.save(make_checkpoint("r", 2, [*history, message(10)]))
    after = _sql(conninfo, "SELECT seq, xmin::text FROM durable_agent_messages ORDER BY seq")
    assert after[:10] == before and len(after) == 11  # the old rows were not touched


def test_corrupt_rows_raise_a_typed_error_naming_the_run(conninfo: str, store: Any) -> None:
    store.save(make_checkpoint("bad", 2, conversation(5)))
    good = make_checkpoint("good", 1, conversation(3))
    store.save(good)
    _sql(conninfo, "UPDATE durable_agent_messages SET body = 'garbage' WHERE run_id = 'bad' AND seq = 3")
    with pytest.raises(CheckpointCorruptError, match="message 3") as caught:
        store.load("bad")
    assert caught.value.run_id == "bad"
    _sql(conninfo, "UPDATE durable_agent_runs SET header = '{\"version\":1}' WHERE run_id = 'good'")
    with pytest.raises(CheckpointCorruptError, match="header names run None"):
        store.load("good")
    healed = make_checkpoint("bad", 3, conversation(6))
    store.save(healed)
    assert store.load("bad") == healed


def test_a_connection_lost_mid_run_heals_on_the_next_save(conninfo: str, store: Any) -> None:
    import psycopg

    history = conversation(4)
    store.save(make_checkpoint("r", 1, history))
    _sql(
        conninfo,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
    )
    history = [*history, message(4)]
    try:
        store.save(make_checkpoint("r", 2, history))  # the loop logs a failed save and goes on
    except psycopg.OperationalError:
        pass
    history = [*history, message(5)]
    store.save(make_checkpoint("r", 3, history))
    assert store.load("r") == make_checkpoint("r", 3, history)
    assert _sql(conninfo, "SELECT seq FROM durable_agent_messages ORDER BY seq") == [(i,) for i in range(6)]


def test_concurrent_writers_of_one_run_queue_on_its_lock(conninfo: str) -> None:
    from durable_agent.backends.postgres import PostgresCheckpointStore

    stores = [PostgresCheckpointStore(conninfo, max_size=1) for _ in range(3)]
    try:
        loaded = hammer_one_run(stores)
    finally:
        for s in stores:
            s.close()
    assert _sql(conninfo, "SELECT message_count FROM durable_agent_runs") == [(len(loaded.messages),)]
    assert _sql(conninfo, "SELECT seq FROM durable_agent_messages ORDER BY seq") == [
        (i,) for i in range(len(loaded.messages))
    ]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_failed_save_drops_the_cache_so_the_next_save_heals(conninfo: str, asynchronous: bool) -> None:
    """A stray row at seq = message_count fails the next save as corruption of its run (it was a raw
    UniqueViolation, and before that every later save of this process failed)."""
    import asyncio

    from durable_agent.backends.postgres import AsyncPostgresCheckpointStore, PostgresCheckpointStore

    async def scenario() -> None:
        store = (AsyncPostgresCheckpointStore if asynchronous else PostgresCheckpointStore)(conninfo, max_size=1)

        async def call(result: Any) -> Any:
            return await result if asynchronous else result

        try:
            await call(store.save(make_checkpoint("r", 1, conversation(3))))
            _sql(conninfo, "INSERT INTO durable_agent_messages VALUES ('r', 3, 'stray')")
            with pytest.raises(CheckpointCorruptError, match="stored already where this save appends message 3") as caught:
                await call(store.save(make_checkpoint("r", 2, conversation(4))))
            assert caught.value.run_id == "r"
            latest = make_checkpoint("r", 3, conversation(5))
            await call(store.save(latest))
            assert await call(store.load("r")) == latest
        finally:
            await call(store.close())

    asyncio.run(scenario())
    assert _sql(conninfo, "SELECT seq FROM durable_agent_messages ORDER BY seq") == [(i,) for i in range(5)]


def test_a_row_numbered_below_zero_is_removed_by_the_heal(conninfo: str, store: Any) -> None:
    store.save(make_checkpoint("r", 1, conversation(3)))
    _sql(conninfo, "INSERT INTO durable_agent_messages VALUES ('r', -1, 'stray')")
    with pytest.raises(CheckpointCorruptError, match="contiguous"):
        store.load("r")
    healed = make_checkpoint("r", 2, conversation(4))
    store.save(healed)
    assert store.load("r") == healed
    assert _sql(conninfo, "SELECT seq FROM durable_agent_messages ORDER BY seq") == [(i,) for i in range(4)]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_pool_given_with_pool_stays_the_callers_and_the_stores_own_pool_closes_with_it(
    conninfo: str, asynchronous: bool
) -> None:
    """`pool=` is used as it is (never opened nor closed by the store); a store's own pool closes on
    leaving its ``with`` / ``async with`` block, after which the store refuses to work."""
    import asyncio

    import psycopg_pool

    from durable_agent.backends.postgres import AsyncPostgresCheckpointStore, PostgresCheckpointStore

    async def sync_scenario() -> None:
        with psycopg_pool.ConnectionPool(conninfo, min_size=1, max_size=2, open=True) as pool:
            with PostgresCheckpointStore(pool=pool) as store:
                store.save(make_checkpoint("r", 1))
            assert not pool.closed
            with PostgresCheckpointStore(pool=pool) as again:
                assert again.load("r") == make_checkpoint("r", 1)
        with PostgresCheckpointStore(conninfo, max_size=1) as own:
            own.save(make_checkpoint("r", 2))
        with pytest.raises(psycopg_pool.PoolClosed):
            own.load("r")

    async def async_scenario() -> None:
        async with psycopg_pool.AsyncConnectionPool(conninfo, min_size=1, max_size=2, open=False) as pool:
            async with AsyncPostgresCheckpointStore(pool=pool) as store:
                await store.save(make_checkpoint("r", 1))
            assert not pool.closed
            async with AsyncPostgresCheckpointStore(pool=pool) as again:
                assert await again.load("r") == make_checkpoint("r", 1)
        async with AsyncPostgresCheckpointStore(conninfo, max_size=1) as own:
            await own.save(make_checkpoint("r", 2))
        with pytest.raises(psycopg_pool.PoolClosed):
            await own.load("r")

    asyncio.run(async_scenario() if asynchronous else sync_scenario())
    assert _sql(conninfo, "SELECT step_index FROM durable_agent_runs") == [(2,)]
