"""The Postgres runtime against a real server: the conformance suite, the SQL runtimes' checks, claims
racing on one session, LISTEN/NOTIFY waking a waiter, the schema version.

Run under `scripts/services run -- ...` (sets DURABLE_AGENT_TEST_POSTGRES_URL); each test gets a
schema of its own. Without the URL the tests skip, or fail when CI=true.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from durable_agent import ConfigurationError, FeatureUnavailableError, step_key
from durable_agent.backends import StepRequest
from durable_agent.testing.runtime_conformance import Clock, DurableRuntimeConformance
from durable_agent.testing.services import postgres_schema
from test_runtime_sqlite import SESSION, SqlJournalChecks

pytestmark = pytest.mark.host_only("needs a Postgres server and psycopg")


async def _ok(ctx: Any) -> str:
    return "ok"


def _unsafe(key: str) -> StepRequest:
    return StepRequest(key=key, kind="tool", replay="unsafe")


@pytest.fixture
def conninfo() -> Iterator[str]:
    """A conninfo whose search_path is a fresh schema, dropped afterwards."""
    with postgres_schema("rt") as info:
        yield info


@pytest.fixture
def opened(conninfo: str) -> Iterator[Callable[..., Any]]:
    """Open runtimes on the test's schema (each one its own connections); all closed after the test.

    Tests run on an event loop that is gone by teardown; closing a psycopg connection needs no
    I/O on it, so a fresh loop can close them. That is why these runtimes hold one connection
    each (a pool's tasks belong to the loop that opened it); the default pool has its own test.
    """
    from durable_agent.backends.postgres import PostgresRuntime

    runtimes: list[Any] = []

    def open_runtime(clock: Callable[[], int] | None = None, **options: Any) -> Any:
        options.setdefault("max_connections", 1)
        runtimes.append(PostgresRuntime(conninfo, clock=clock or Clock(), **options))
        return runtimes[-1]

    yield open_runtime

    async def close_all() -> None:
        for runtime in runtimes:
            await runtime.close()

    asyncio.run(close_all())


class TestPostgresRuntime(DurableRuntimeConformance, SqlJournalChecks):
    @pytest.fixture
    def make_runtime(self, opened: Callable[..., Any]) -> Any:
        return lambda clock: opened(clock)

    @pytest.fixture
    def stray_row(self, conninfo: str) -> Callable[[str, int], None]:
        import psycopg

        def insert(run_id: str, seq: int) -> None:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("INSERT INTO durable_agent_messages (run_id, seq, body) VALUES (%s, %s, %s)",
                             (run_id, seq, '"stray"'))

        return insert


async def test_racing_claims_of_one_session_have_one_winner_named_to_the_others(
    opened: Callable[..., Any],
) -> None:
    clock = Clock()
    runtimes = [opened(clock) for _ in range(6)]
    for runtime in runtimes:  # connected (and the schema made) first, so the claims race only on the lease
        await runtime.lease.epoch(SESSION)
    for session in (f"race-{n}" for n in range(10)):
        first = await runtimes[0].lease.claim(
            session, stale_at=0
        )  # a released lease row: nothing else to wait on
        await runtimes[0].lease.release(session, first.epoch)
        claims = await asyncio.gather(*(r.lease.claim(session, stale_at=0) for r in runtimes))
        winners = [(r, c) for r, c in zip(runtimes, claims, strict=True) if c.claimed]
        assert [c.epoch for _, c in winners] == [2], claims
        assert all(c.owner == winners[0][0].owner for c in claims if not c.claimed)


async def test_notify_wakes_a_waiting_run_at_once(opened: Callable[..., Any]) -> None:
    waiter, resolver = opened(), opened()
    scope = await waiter.open_run(session_id=SESSION, run_id="r")
    awakeable = await scope.awakeable(step_key("r", 0, "approval"))
    await waiter.backend.wait_for_change(0.01)  # LISTEN is set up by the first wait

    async def resolve_soon() -> None:
        await asyncio.sleep(0.2)
        assert await resolver.resolve_awakeable(awakeable.id, "yes")

    started = time.monotonic()
    resolving = asyncio.ensure_future(resolve_soon())
    await waiter.backend.wait_for_change(30.0)  # returns on the NOTIFY, not after 30 s
    await resolving
    assert time.monotonic() - started < 10
    assert (await awakeable.wait()).value == "yes"


async def test_a_newer_journal_schema_is_refused(conninfo: str, opened: Callable[..., Any]) -> None:
    import psycopg

    await opened().lease.epoch(SESSION)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("INSERT INTO durable_agent_journal_schema_version VALUES (9)")
    with pytest.raises(FeatureUnavailableError, match="version 9"):
        await opened().lease.epoch(SESSION)


async def test_a_pool_serves_the_journal_and_the_checkpoint_store(conninfo: str) -> None:
    from psycopg_pool import AsyncConnectionPool

    from durable_agent import Agent, DurableOptions, ScriptedModel, Tool, call, reply
    from durable_agent.backends.postgres import PostgresRuntime

    async with AsyncConnectionPool(conninfo, min_size=1, max_size=2, open=False) as pool:
        runtime = PostgresRuntime(pool=pool)
        model = ScriptedModel([reply("", call("add", {"a": 1})), "two"])
        agent = Agent(
            model=model,
            tools={"add": Tool(execute=lambda a: a["a"] + 1)},
            durable=DurableOptions(runtime),
            session_id=SESSION,
        )
        result = await agent.run("one plus one")
        assert result.text == "two"
        run_id = await runtime.stores.runs.last(SESSION)
        assert run_id is not None
        stored = await runtime.stores.checkpoints.load(run_id)
        assert stored is not None and stored.status == "completed"
        assert [(r.kind, r.status) for r in await runtime.inspect.steps(run_id)] == [
            ("model", "done"),
            ("tool", "done"),
            ("model", "done"),
        ]
        await runtime.close()
        assert not pool.closed  # a pool passed in stays open


async def test_a_fenced_write_waits_for_a_claim_in_flight_and_is_refused_after_it(
    conninfo: str, opened: Callable[..., Any]
) -> None:
    """A claim holds the lease row FOR UPDATE; a write of the old epoch must not slip in before it commits."""
    import psycopg

    from durable_agent import StaleEpochError

    writer = opened()
    claim = await writer.lease.claim(SESSION, stale_at=0)
    scope = await writer.open_run(session_id=SESSION, run_id="r")
    async with await psycopg.AsyncConnection.connect(conninfo) as claimer:  # another process mid-claim
        await claimer.execute(
            "SELECT epoch FROM durable_agent_leases WHERE session_id = %s FOR UPDATE", (SESSION,)
        )
        writing = asyncio.ensure_future(scope.step(_unsafe(step_key("r", 0, "t1")), _ok))
        await asyncio.sleep(0.3)
        assert not writing.done()  # blocked on the lease row, not written under the old epoch
        await claimer.execute(
            "UPDATE durable_agent_leases SET epoch = epoch + 1 WHERE session_id = %s", (SESSION,)
        )
        await claimer.commit()
        with pytest.raises(StaleEpochError) as info:
            await writing
    assert info.value.epoch == claim.epoch and await writer.inspect.steps("r") == []


async def test_a_journal_write_and_an_appending_transition_are_one_statement_each(
    opened: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One round trip per write: the epoch check rides in the write's own statement, outside any
    transaction block (the statement commits as it ends); a stale one is refused and lands nothing."""
    import psycopg

    from durable_agent import AgentCheckpoint, StaleEpochError, Usage
    from durable_agent.backends import DeferredSteps, RunTransition, StepRecord

    runtime = opened()
    claim = await runtime.lease.claim(SESSION, stale_at=0)

    def checkpoint(texts: list[str], step: int) -> AgentCheckpoint:
        return AgentCheckpoint(run_id="r", step_index=step, status="running", usage=Usage(), created_at=0,
                               messages=[{"role": "user", "content": text} for text in texts])

    await runtime.commit(RunTransition(SESSION, claim.epoch, checkpoint=checkpoint(["a"], 0)))  # first save: parts
    sent: list[str] = []
    execute, transaction = psycopg.AsyncCursor.execute, psycopg.AsyncConnection.transaction

    def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    def counted_transaction(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append("BEGIN")
        return transaction(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted_execute)
    monkeypatch.setattr(psycopg.AsyncConnection, "transaction", counted_transaction)
    pending = StepRecord(SESSION, "r", step_key("r", 1, "t1"), "tool", "unsafe", "pending")
    await runtime.backend.put_steps([pending], epoch=claim.epoch)
    assert len(sent) == 1
    done = StepRecord(SESSION, "r", pending.key, "tool", "unsafe", "done", result="ok",
                      tool_state=({"op": "set", "key": "k", "value": 1},))
    await runtime.commit(RunTransition(SESSION, claim.epoch, checkpoint=checkpoint(["a", "b"], 1),
                                       deferred=DeferredSteps((done,)), last_run="r", mark="r"))
    assert len(sent) == 2
    with pytest.raises(StaleEpochError):
        await runtime.backend.put_steps([pending], epoch=claim.epoch + 1)
    assert len(sent) == 3
    monkeypatch.undo()
    assert [(r.key, r.status) for r in await runtime.inspect.steps("r")] == [(pending.key, "done")]
    assert await runtime.stores.tool_state(SESSION).all() == {"k": 1}
    assert (await runtime.stores.checkpoints.load("r")).messages == checkpoint(["a", "b"], 1).messages
    assert await runtime.stores.runs.last(SESSION) == "r" and await runtime.lease.resumable_run(SESSION) == "r"


async def test_a_run_cancelled_as_the_pool_hands_it_a_connection_ends_cancelled(conninfo: str) -> None:
    """psycopg_pool waits for a connection through `asyncio.wait_for`, which on Python 3.11 can return what
    it waited for and drop a cancellation that arrives as the wait ends (fixed in 3.12). A run cancelled
    then (its client gone, a timeout) must end cancelled, not go on to its end."""
    from psycopg_pool import AsyncConnectionPool

    from durable_agent import Agent, DurableOptions, ScriptedModel, Tool, call, reply
    from durable_agent.backends.postgres import PostgresRuntime

    waiting = asyncio.Event()
    drop_next = [False]

    class DroppingPool(AsyncConnectionPool):
        @contextlib.asynccontextmanager
        async def connection(self, timeout: float | None = None) -> AsyncIterator[Any]:
            if drop_next[0]:
                drop_next[0] = False
                waiting.set()
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    pass  # the connection came as the cancellation did: wait_for returned it
            async with super().connection(timeout) as conn:
                yield conn

    def charge(args: Any) -> str:
        drop_next[0] = True  # the write of its result waits on the pool
        return "charged"

    async with DroppingPool(conninfo, min_size=1, max_size=2, open=False, kwargs={"autocommit": True}) as pool:
        agent = Agent(model=ScriptedModel([reply("", call("charge", {})), "done"]), tools={"charge": Tool(execute=charge)},
                      durable=DurableOptions(PostgresRuntime(pool=pool)), session_id=SESSION)
        run = asyncio.ensure_future(agent.run("go"))
        await asyncio.wait_for(waiting.wait(), 10)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(run, 10)


async def test_the_default_pool_serves_concurrent_runs_without_queueing_on_one_connection(conninfo: str) -> None:
    from durable_agent import Agent, DurableOptions, ScriptedModel, Tool, call, reply
    from durable_agent.backends.postgres import PostgresRuntime

    runtime = PostgresRuntime(conninfo, max_connections=4)
    in_flight, most = [0], [0]

    async def slow(args: Any) -> str:
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        await asyncio.sleep(0.05)
        in_flight[0] -= 1
        return "ok"

    async def session(i: int) -> str:
        agent = Agent(model=ScriptedModel([reply("", call("slow", {})), f"done {i}"]),
                      tools={"slow": Tool(execute=slow, replay="safe")}, durable=DurableOptions(runtime),
                      session_id=f"pool-{i}")
        return (await agent.run("go")).text

    try:
        assert await asyncio.gather(*(session(i) for i in range(12))) == [f"done {i}" for i in range(12)]
        assert most[0] > 1  # the runs overlapped
    finally:
        await runtime.close()
    with pytest.raises(ConfigurationError):
        PostgresRuntime(conninfo, max_connections=0)


async def test_a_checkpoint_load_sees_one_state_while_another_process_appends(
        conninfo: str, opened: Callable[..., Any]) -> None:
    """A load reads the run's header, then its message rows: a save committed between the two (another server
    appending the run's next step) must not make the stored checkpoint look corrupt ("header counts 1 messages, rows
    hold 2": a 500 on an endpoint's view, seen with two servers on one database). The load runs in one snapshot.

    The save is timed with Postgres' own locks, from connections of the test: `held` inserts the row the save will
    write and keeps it uncommitted, so the save waits on it; `blocker` then asks for the messages table outright and
    queues behind the waiting save; the load reads the header and queues behind `blocker` for the rows. Rolling
    `held` back lets the save commit, then `blocker` take and drop its lock, and only then the load read the rows."""
    import threading

    import psycopg

    from durable_agent import AgentCheckpoint, Usage
    from durable_agent.backends.postgres import PostgresCheckpointStore

    runtime = opened()
    first = AgentCheckpoint("r", 0, "running", ({"role": "user", "content": "hi"},), Usage(), 1)
    await runtime.stores.checkpoints.save(first)
    later = AgentCheckpoint("r", 1, "running", (*first.messages, {"role": "assistant", "content": "yo"}), Usage(), 2)
    other = PostgresCheckpointStore(conninfo)  # another process's connection
    stored = other.load("r")  # its schema is checked before the test's locks are taken
    assert stored is not None and stored.step_index == 0

    def waits(mode: str) -> bool:
        """Whether a statement waits for a lock of `mode` (`transactionid`: a row another transaction wrote)."""
        kind = "locktype = 'transactionid'" if mode == "transactionid" else (
            f"relation = 'durable_agent_messages'::regclass AND mode = '{mode}'")
        with psycopg.connect(conninfo, autocommit=True) as probe:
            row = probe.execute(f"SELECT count(*) FROM pg_locks WHERE NOT granted AND {kind}").fetchone()
            return row is not None and row[0] > 0

    async def until(mode: str) -> None:
        for _ in range(1000):
            if waits(mode):
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"nothing waits for {mode}")

    def take_and_drop_the_table() -> None:
        with psycopg.connect(conninfo) as blocker:
            blocker.execute("LOCK TABLE durable_agent_messages IN ACCESS EXCLUSIVE MODE")
            blocker.rollback()

    held = psycopg.connect(conninfo)
    threads = [threading.Thread(target=other.save, args=(later,)), threading.Thread(target=take_and_drop_the_table)]
    try:
        held.execute("INSERT INTO durable_agent_messages (run_id, seq, body) VALUES ('r', 1, '\"held\"')")
        threads[0].start()
        await until("transactionid")  # the save waits for the held row
        threads[1].start()
        await until("AccessExclusiveLock")  # the blocker waits for the save
        load = asyncio.ensure_future(runtime.stores.checkpoints.load("r"))
        await until("AccessShareLock")  # the load has read the header and waits for the blocker
        held.rollback()
        for thread in threads:
            await asyncio.to_thread(thread.join, 10)
        got = await load  # the state the header belongs to
        assert (got.step_index, list(got.messages)) == (0, list(first.messages))
    finally:
        held.close()
        other.close()
    got = await runtime.stores.checkpoints.load("r")
    assert (got.step_index, list(got.messages)) == (1, list(later.messages))
