"""The SQLite runtime: the durable-runtime conformance suite on a real file (every `make_runtime` call a
new connection, i.e. another "process"), then what only a shared file shows: real processes,
atomic fenced transactions, codec round trips, the schema version."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_agent import (
    Agent,
    AgentCheckpoint,
    CheckpointCorruptError,
    DurableOptions,
    FeatureUnavailableError,
    ScriptedModel,
    StaleEpochError,
    Usage,
    call,
    reply,
    step_key,
)
from durable_agent.backends import (
    DeferredSteps,
    RunOwner,
    RunTransition,
    StepContext,
    StepRecord,
    StepRequest,
)
from durable_agent.testing.runtime_conformance import Clock, DurableRuntimeConformance
from store_kit import queued_together

PYTHON_DIR = Path(__file__).resolve().parent.parent / "python"
SESSION, RUN = "s-1", "r-1"


def skip_without_sqlite3() -> None:
    """Pyodide 0.28 ships sqlite3 as a separate package; without it only the feature error is testable.

    Skips only under Pyodide: on CPython a missing sqlite3 is a broken interpreter, and fails.
    """
    try:
        import sqlite3  # noqa: F401
    except ImportError:
        if sys.platform != "emscripten":
            raise
        pytest.skip("sqlite3 is not importable on this Pyodide (0.28 ships it only from its CDN)")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def opened(db: Path) -> Iterator[Callable[..., Any]]:
    """Open runtimes on `db` (each one another connection); all are closed after the test."""
    from durable_agent.backends.sqlite import SqliteRuntime

    skip_without_sqlite3()

    runtimes: list[Any] = []

    def open_runtime(clock: Callable[[], int] | None = None, **options: Any) -> Any:
        runtime = SqliteRuntime(db, clock=clock or Clock(), **options)
        runtimes.append(runtime)
        return runtime

    yield open_runtime
    for runtime in runtimes:
        runtime.close()


def _checkpoint(texts: list[str], step: int) -> AgentCheckpoint:
    return AgentCheckpoint(run_id=RUN, step_index=step, status="running", usage=Usage(), created_at=0,
                           messages=[{"role": "user", "content": text} for text in texts])


def _run_checkpoint(run_id: str, messages: list[Any], step: int) -> AgentCheckpoint:
    return AgentCheckpoint(run_id=run_id, step_index=step, status="running", usage=Usage(), created_at=0,
                           messages=messages)


def _watch(plan: Any, rereads: list[str]) -> Any:
    """`plan`, noting each read of a run's stored messages it makes (a save that missed the cache)."""
    try:
        query = plan.send(None)
        while True:
            if query.sql.startswith("SELECT seq, body FROM"):
                rereads.append(query.sql)
            query = plan.send((yield query))
    except StopIteration as stop:
        return stop.value


def _req(key: str, replay: str = "unsafe") -> StepRequest:
    return StepRequest(key=key, kind="tool", replay=replay, payload=None)  # type: ignore[arg-type]


class SqlJournalChecks:
    """What the SQL runtimes (SQLite, Postgres) add to the conformance suite: one transaction per write.

    Needs the `make_runtime` fixture of `DurableRuntimeConformance`, and `stray_row(run_id, seq)`: writes a
    message row no save wrote (damage, or a foreign writer) through a connection of its own.
    """

    async def test_a_done_record_and_its_tool_state_commit_together(self, make_runtime: Any) -> None:
        """A bad op late in the list leaves neither the earlier ops nor the done record."""
        runtime = make_runtime(Clock())

        async def handler(ctx: StepContext) -> str:
            ctx.stage_tool_state(
                [{"op": "set", "key": "cwd", "value": "/src"}, {"op": "rename", "key": "cwd"}]
            )
            return "ok"

        scope = await runtime.open_run(session_id=SESSION, run_id=RUN)
        with pytest.raises(ValueError, match="unknown tool-state op"):
            await scope.step(_req(step_key(RUN, 0, "t1")), handler)
        assert await runtime.stores.tool_state(SESSION).all() == {}
        assert [r.status for r in await runtime.inspect.steps(RUN)] == ["pending"]

    async def test_a_stale_writer_commits_neither_its_record_nor_its_tool_state(
        self, make_runtime: Any
    ) -> None:
        clock = Clock()
        old, new = make_runtime(clock), make_runtime(clock)
        first = await old.lease.claim(SESSION, stale_at=0, owner=RunOwner("elsewhere", 1, old.owner.token))

        async def handler(ctx: StepContext) -> str:
            ctx.stage_tool_state([{"op": "set", "key": "k", "value": 1}])
            clock.now += 60_000
            assert (await new.lease.claim(SESSION, stale_at=clock.now - 1)).claimed  # taken over mid-step
            return "late"

        scope = await old.open_run(session_id=SESSION, run_id=RUN)
        with pytest.raises(StaleEpochError) as info:
            await scope.step(_req(step_key(RUN, 0, "t1"), "safe"), handler)
        assert info.value.epoch == first.epoch
        assert await new.inspect.steps() == [] and await new.stores.tool_state(SESSION).all() == {}
        with pytest.raises(StaleEpochError):
            await old.stores.runs.set_last(SESSION, RUN, first.epoch)
        with pytest.raises(StaleEpochError):
            await old.stores.queue.write(SESSION, ["typed ahead"])  # fenced by the old claim, still on `old`
        assert await new.stores.runs.last(SESSION) is None and await new.stores.queue.read(SESSION) == []

    async def test_a_stale_transition_lands_none_of_its_parts(self, make_runtime: Any) -> None:
        """A lifecycle commit of a taken-over session: its checkpoint (an append this process could
        write in one statement), step records, mark and awakeables all stay unwritten."""
        clock = Clock()
        old, new = make_runtime(clock), make_runtime(clock)
        first = await old.lease.claim(SESSION, stale_at=0, owner=RunOwner("elsewhere", 1, old.owner.token))
        saved = _checkpoint(["hi"], 0)
        await old.commit(RunTransition(SESSION, first.epoch, checkpoint=saved, last_run=RUN, mark=RUN))
        clock.now += 60_000
        assert (await new.lease.claim(SESSION, stale_at=clock.now - 1)).claimed
        record = StepRecord(SESSION, RUN, step_key(RUN, 1, "t1"), "tool", "unsafe", "pending")
        with pytest.raises(StaleEpochError):
            await old.commit(RunTransition(SESSION, first.epoch, checkpoint=_checkpoint(["hi", "more"], 1),
                                           last_run="r-2", unmark=True, awakeables=(("k", "aw-1"),),
                                           deferred=DeferredSteps((record,))))
        assert await new.stores.checkpoints.load(RUN) == saved
        assert await new.stores.runs.last(SESSION) == RUN and await new.lease.resumable_run(SESSION) == RUN
        assert await new.inspect.steps() == [] and await new.inspect.awakeables() == []

    async def test_a_stale_checkpoint_commit_lands_nothing(self, make_runtime: Any) -> None:
        """A commit of a checkpoint alone (SQLite checks the fence inside the save's header write)."""
        clock = Clock()
        old, new = make_runtime(clock), make_runtime(clock)
        first = await old.lease.claim(SESSION, stale_at=0, owner=RunOwner("elsewhere", 1, old.owner.token))
        saved = _checkpoint(["hi"], 0)
        await old.commit(RunTransition(SESSION, first.epoch, checkpoint=saved))
        clock.now += 60_000
        assert (await new.lease.claim(SESSION, stale_at=clock.now - 1)).claimed
        with pytest.raises(StaleEpochError):
            await old.commit(RunTransition(SESSION, first.epoch, checkpoint=_checkpoint(["hi", "more"], 1)))
        with pytest.raises(StaleEpochError):
            await old.commit(RunTransition(SESSION, first.epoch, checkpoint=_run_checkpoint("r-new", [], 0)))
        assert await new.stores.checkpoints.load(RUN) == saved and await new.stores.checkpoints.load("r-new") is None

    async def test_a_commit_after_another_writers_save_stores_its_own_checkpoint(self, make_runtime: Any) -> None:
        """The append this process would write in one statement assumes its own last save is stored;
        after another writer's save it must notice, and store the whole checkpoint."""
        clock = Clock()
        runtime, other = make_runtime(clock), make_runtime(clock)
        claim = await runtime.lease.claim(SESSION, stale_at=0)
        await runtime.commit(RunTransition(SESSION, claim.epoch, checkpoint=_checkpoint(["a", "b"], 0)))
        await other.stores.checkpoints.save(_checkpoint(["x"], 5))
        latest = _checkpoint(["a", "b", "c"], 1)
        await runtime.commit(RunTransition(SESSION, claim.epoch, checkpoint=latest))
        assert await other.stores.checkpoints.load(RUN) == latest

    async def test_a_stray_message_row_fails_the_next_commit_as_corruption_and_the_commit_after_heals(
        self, make_runtime: Any, stray_row: Callable[[str, int], None]
    ) -> None:
        """A row at seq = message_count, behind the back of a process whose cache trusts the stored rows: the
        next commit (on Postgres the one-statement append) raised the driver's unique-key error."""
        clock = Clock()
        runtime = make_runtime(clock)
        claim = await runtime.lease.claim(SESSION, stale_at=0)
        await runtime.commit(RunTransition(SESSION, claim.epoch, checkpoint=_checkpoint(["a", "b"], 0)))
        stray_row(RUN, 2)
        record = StepRecord(SESSION, RUN, step_key(RUN, 1, "t1"), "tool", "unsafe", "pending")
        with pytest.raises(CheckpointCorruptError, match="stored already where this save appends message 2") as caught:
            await runtime.commit(RunTransition(SESSION, claim.epoch, checkpoint=_checkpoint(["a", "b", "c"], 1),
                                               deferred=DeferredSteps((record,))))
        assert caught.value.run_id == RUN
        assert await runtime.inspect.steps() == []  # the transition is one transaction: none of it landed
        latest = _checkpoint(["a", "b", "c", "d"], 2)
        await runtime.commit(RunTransition(SESSION, claim.epoch, checkpoint=latest))
        assert await make_runtime(clock).stores.checkpoints.load(RUN) == latest

    async def test_live_runs_past_the_caches_capacity_never_re_read_their_history(self, make_runtime: Any) -> None:
        """Each run in flight is remembered until its lease is released, however many there are: a
        save never re-reads the stored messages of a live run; a released session's runs are forgotten."""
        runtime = make_runtime(Clock())
        write = runtime.backend.write
        rereads: list[Any] = []

        async def watched(plan: Any, merge: Any = None) -> Any:
            return await write(_watch(plan, rereads), merge)

        runtime.backend.write = watched
        many = 300  # more than the 256 runs the cache's LRU part keeps

        async def one(i: int) -> None:
            session, run = f"s-{i}", f"r-{i}"
            epoch = (await runtime.lease.claim(session, stale_at=0)).epoch
            first = [{"role": "user", "content": "hi"}]
            await runtime.commit(RunTransition(session, epoch, checkpoint=_run_checkpoint(run, first, 0),
                                               last_run=run, mark=run))
            await asyncio.sleep(0.01)  # every run is in flight before any saves again
            await runtime.commit(RunTransition(session, epoch, checkpoint=_run_checkpoint(
                run, [*first, {"role": "assistant", "content": "yo"}], 1)))

        await asyncio.gather(*(one(i) for i in range(many)))
        assert rereads == [] and all(runtime.backend.cache.count(f"r-{i}") == 2 for i in range(many))
        for i in range(many):
            await runtime.lease.release(f"s-{i}", await runtime.lease.epoch(f"s-{i}"))
        assert all(runtime.backend.cache.count(f"r-{i}") is None for i in range(many))

    async def test_values_round_trip_through_the_codec(self, make_runtime: Any) -> None:
        clock = Clock()
        runtime = make_runtime(clock)
        value = {"blob": b"\x00\xffraw", "$bytes": "not a tag", "n": 2**70, "s": "ünï ☃"}

        async def handler(ctx: StepContext) -> Any:
            ctx.stage_tool_state([{"op": "set", "key": "blob", "value": b"\x01"}])
            return value

        key = step_key(RUN, 0, "t1")
        await (await runtime.open_run(session_id=SESSION, run_id=RUN)).step(_req(key), handler)
        replayed = await (await make_runtime(clock).open_run(session_id=SESSION, run_id=RUN)).step(_req(key))
        assert replayed.replayed and replayed.value == value
        assert await make_runtime(clock).stores.tool_state(SESSION).get("blob") == b"\x01"
        awakeable = await (await runtime.open_run(session_id=SESSION, run_id=RUN)).awakeable(
            step_key(RUN, 1, "approval")
        )
        assert await make_runtime(clock).resolve_awakeable(awakeable.id, {"bytes": b"ok"})
        assert (await awakeable.wait()).value == {"bytes": b"ok"}


class TestSqliteRuntime(DurableRuntimeConformance, SqlJournalChecks):
    @pytest.fixture
    def make_runtime(self, opened: Callable[..., Any]) -> Any:
        return lambda clock: opened(clock)

    @pytest.fixture
    def stray_row(self, db: Path) -> Callable[[str, int], None]:
        import contextlib
        import sqlite3

        def insert(run_id: str, seq: int) -> None:
            with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn, conn:
                conn.execute("INSERT INTO durable_agent_messages (run_id, seq, body) VALUES (?, ?, ?)",
                             (run_id, seq, '"stray"'))

        return insert


async def test_a_step_and_its_checkpoint_read_no_fence_row_and_delete_nothing_they_did_not_write(
    opened: Callable[..., Any],
) -> None:
    """SQLite checks the lease epoch inside the first write of each fenced transaction, a save at a
    later step deletes no step-log rows, and a step that streamed nothing deletes no partials:
    statements are what a busy server pays for."""
    runtime = opened()
    statements: list[str] = []
    runtime._executor._conn.set_trace_callback(statements.append)  # the runtime's one connection
    epoch = (await runtime.lease.claim(SESSION, stale_at=0)).epoch
    await runtime.commit(RunTransition(SESSION, epoch, checkpoint=_checkpoint(["hi"], 0), last_run=RUN, mark=RUN))
    scope = await runtime.open_run(session_id=SESSION, run_id=RUN)
    await scope.step(_req(step_key(RUN, 1, "t1")), _ok)
    await runtime.commit(RunTransition(SESSION, epoch, checkpoint=_checkpoint(["hi", "done"], 1)))
    assert not [s for s in statements if s.startswith("SELECT epoch FROM")]
    assert not [s for s in statements if s.startswith("DELETE FROM durable_agent_step_log") and "step_index >" in s]
    assert not [s for s in statements if s.startswith("DELETE FROM durable_agent_partials")]
    assert await runtime.stores.checkpoints.load(RUN) == _checkpoint(["hi", "done"], 1)
    assert [r.status for r in await runtime.inspect.steps(RUN)] == ["done"]


async def test_a_lone_tool_result_committed_with_its_checkpoint_deletes_no_partials(opened: Callable[..., Any]) -> None:
    """A batch's only tool call commits its result with the step's checkpoint (a deferred record). A
    tool streams nothing, so that commit deletes no stream partials: only the final answer, which
    streamed its text, drops its own."""
    from agent_kit import Ledger

    runtime = opened()
    statements: list[str] = []
    runtime._executor._conn.set_trace_callback(statements.append)
    ledger = Ledger()
    model = ScriptedModel([reply("", call("charge", {"n": n})) for n in range(3)] + ["charged thrice"])
    agent = Agent(model=model, tools={"charge": ledger.tool("charge")}, durable=DurableOptions(runtime),
                  session_id=SESSION)
    result = await agent.run("go", run_id=RUN)
    assert result.text == "charged thrice" and len(ledger.entries) == 3
    assert [r.status for r in await runtime.inspect.steps(RUN)] == ["done"] * 7  # 4 model calls, 3 tools
    deletes = [s for s in statements if s.startswith("DELETE FROM durable_agent_partials")]
    assert len(deletes) == 1, deletes


async def _ok(ctx: StepContext) -> str:
    return "ok"


async def test_a_newer_journal_schema_is_refused(db: Path, opened: Callable[..., Any]) -> None:
    import sqlite3

    opened().close()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO durable_agent_journal_schema_version VALUES (9)")
    conn.close()
    with pytest.raises(FeatureUnavailableError, match="version 9"):
        opened()


def test_a_missing_sqlite3_module_is_a_feature_error(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from durable_agent.backends.sqlite import SqliteRuntime

    monkeypatch.setitem(sys.modules, "sqlite3", None)  # what `import sqlite3` meets without the module
    with pytest.raises(FeatureUnavailableError, match="sqlite3"):
        SqliteRuntime(db)


# --------------------------------------------------------------- real processes

_CHILD = textwrap.dedent("""
    import asyncio, os, sys
    from durable_agent.backends.sqlite import SqliteRuntime
    from durable_agent import step_key
    from durable_agent.backends import StepRequest

    async def main(db, action):
        runtime = SqliteRuntime(db)
        claim = await runtime.lease.claim("s-1", stale_at=0)
        print("claimed" if claim.claimed else "refused", claim.epoch, os.getpid(), flush=True)
        if action == "die-mid-step" and claim.claimed:
            async def charge(ctx):
                os._exit(9)  # the process dies while the tool runs: nothing after this is written
            scope = await runtime.open_run(session_id="s-1", run_id="r-1")
            await scope.step(StepRequest(key=step_key("r-1", 0, "charge"), kind="tool", replay="unsafe"), charge)
        sys.stdin.read()  # hold the lease until the parent closes our stdin

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


def _spawn(db: Path, action: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(db), action],
        cwd=PYTHON_DIR,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PYTHONPATH": str(PYTHON_DIR), "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.host_only("spawns worker processes")
def test_concurrent_processes_claim_one_session_once(db: Path, opened: Callable[..., Any]) -> None:
    opened()  # create the schema first, so the children race only on the claim
    children = [_spawn(db, "hold") for _ in range(4)]
    try:
        lines = [child.stdout.readline().split() for child in children]  # type: ignore[union-attr]
    finally:
        for child in children:
            child.communicate("", timeout=30)
    assert sorted(line[0] for line in lines) == ["claimed", "refused", "refused", "refused"], lines
    assert all(child.returncode == 0 for child in children), [c.stderr for c in children]


@pytest.mark.host_only("spawns and kills a worker process")
async def test_a_process_dead_mid_step_leaves_its_lease_and_an_interrupted_step(
    db: Path, opened: Callable[..., Any]
) -> None:
    child = _spawn(db, "die-mid-step")
    out, err = child.communicate(timeout=30)
    assert child.returncode == 9, err
    runtime = opened()
    assert [r.status for r in await runtime.inspect.steps("r-1")] == ["pending"]
    # Its owner is on this host and gone: known dead, so the lease is free at once (no staleness wait).
    claim = await runtime.lease.claim(SESSION, stale_at=0)
    assert claim.claimed and claim.epoch == int(out.split()[1]) + 1
    ran: list[str] = []

    async def charge(ctx: StepContext) -> str:
        ran.append("again")
        return "charged twice"

    scope = await runtime.open_run(session_id=SESSION, run_id=RUN)
    outcome = await scope.step(StepRequest(key=step_key(RUN, 0, "charge"), kind="tool", replay="unsafe"), charge)
    assert outcome.status == "interrupted" and ran == []


@pytest.mark.host_only("runs a fresh interpreter in a subprocess")
def test_importing_the_package_does_not_load_the_runtime_drivers() -> None:
    probe = (
        "import sys, durable_agent, durable_agent.backends\n"
        "print(sorted(m for m in ('sqlite3', 'psycopg', 'durable_agent.backends.sqlite',"
        " 'durable_agent.backends.postgres') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PYTHON_DIR,
        env={"PYTHONPATH": str(PYTHON_DIR), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


async def test_a_run_started_by_its_leg_reads_nothing_only_a_crashed_leg_leaves(opened: Callable[..., Any]) -> None:
    """A fresh run has no step records, no streamed text and no checkpoint but the one its leg just committed:
    it reads none of them back (each read is a round trip through the connection's thread). A resumed run does.
    The run marked in progress comes with the claim."""
    from durable_agent import Agent, DurableOptions, ScriptedModel, Tool, call, reply

    runtime = opened()
    reads: list[str] = []
    read = runtime.backend.read

    async def counted(plan: Any, **options: Any) -> Any:
        reads.append(plan.gi_code.co_name)
        return await read(plan, **options)

    runtime.backend.read = counted
    tools = {"noop": Tool(execute=lambda args: "ok")}
    model = ScriptedModel([reply("", call("noop", {})), "first", "second"])
    agent = Agent(model=model, tools=tools, durable=DurableOptions(runtime), session_id=SESSION)
    assert (await agent.run("one")).text == "first"
    # a new session: its last run (none), its tool state; not the run's own records or checkpoint, not the
    # resumable listing ("heal" mode heals a marked run without one), not the marked run (the claim reports it)
    assert sorted(reads) == ["last_run_plan", "tool_state_plan"], reads
    reads.clear()
    assert (await agent.run("two")).text == "second"
    assert reads.count("load_plan") == 1 and "steps_plan" not in reads, reads  # the first run's history only
    assert [m["role"] for m in model.requests[-1].messages] == ["user", "assistant", "tool", "assistant", "user"]


SESSIONS = [f"s{i}" for i in range(12)]


async def _started(runtime: Any) -> dict[str, int]:
    """Each of `SESSIONS` claimed, its run `r-<session>` started with one message; their epochs."""
    epochs = {}
    for session in SESSIONS:
        epochs[session] = (await runtime.lease.claim(session, stale_at=0)).epoch
        run = f"r-{session}"
        await runtime.commit(RunTransition(session, epochs[session], last_run=run, mark=run,
                                           checkpoint=_run_checkpoint(run, [{"role": "user", "content": "hi"}], 0)))
    return epochs


def _tool_done(session: str, ops: tuple[Any, ...] | None = None) -> StepRecord:
    run = f"r-{session}"
    return StepRecord(session, run, step_key(run, 1, "t1"), "tool", "unsafe", "done", result="ok", tool_state=ops)


def _answered(session: str) -> AgentCheckpoint:
    return _run_checkpoint(f"r-{session}", [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}], 1)


@pytest.mark.host_only("threads: the group-commit writer merges writes")
async def test_the_step_records_and_checkpoints_of_many_sessions_share_their_statements(
    db: Path, opened: Callable[..., Any]
) -> None:
    """A busy server's writer thread pays a GIL hand-off per statement (`durable_agent.backends.sqlite._group_commit`): the
    step records of twelve sessions queued together are one fenced upsert (and the tool state one of
    them commits, one more), their dropped partials one delete, their checkpoints one header
    update; every row lands as if written one by one."""
    from durable_agent.backends import StreamPartialRecord

    runtime = opened()
    epochs = await _started(runtime)
    s7 = _tool_done("s7")
    await runtime.backend.add_partial(StreamPartialRecord("s7", "r-s7", s7.key, 0, "strea"), epoch=epochs["s7"])
    statements: list[str] = []
    runtime._executor._conn.set_trace_callback(statements.append)
    ops = ({"op": "set", "key": "k", "value": 5},)
    results = await queued_together(db, [
        runtime.backend.put_steps([_tool_done(s, ops if s == "s5" else None)], epoch=epochs[s],
                                  streamed={s7.key} if s == "s7" else set())
        for s in SESSIONS
    ])
    assert results == [None] * len(SESSIONS)
    results = await queued_together(db, [runtime.commit(RunTransition(s, epochs[s], checkpoint=_answered(s)))
                                          for s in SESSIONS])
    assert results == [None] * len(SESSIONS)
    step_inserts = [s for s in statements if s.startswith("INSERT INTO durable_agent_steps")]
    header_updates = [s for s in statements if s.startswith("UPDATE durable_agent_runs")]
    # twelve each, one by one; merged, at most half: two batches at most (`queued_together`), each written in
    # power-of-2 chunks (`sql.plan.chunks`)
    assert 2 <= len(step_inserts) <= 6 and 1 <= len(header_updates) <= 6, (len(step_inserts), len(header_updates))
    fresh = opened()
    for session in SESSIONS:
        assert await fresh.inspect.steps(f"r-{session}") == [_tool_done(session, ops if session == "s5" else None)]
        assert await fresh.stores.checkpoints.load(f"r-{session}") == _answered(session)
    assert await fresh.backend.tool_state("s5", None) == {"k": 5}
    assert await fresh.inspect.partials("r-s7") == []


@pytest.mark.host_only("threads: the group-commit writer merges writes")
async def test_a_stale_fence_among_merged_writes_refuses_only_its_own(db: Path, opened: Callable[..., Any]) -> None:
    """Another process claimed one session: its step records and its checkpoint, queued with the other
    sessions' writes, fail with `StaleEpochError` and land nothing; the others land."""
    clock = Clock()
    runtime, other = opened(clock), opened(clock)
    epochs = await _started(runtime)
    clock.now += 60_000
    assert (await other.lease.claim("s3", stale_at=clock.now - 1)).claimed
    results = await queued_together(db, [runtime.backend.put_steps([_tool_done(s)], epoch=epochs[s])
                                          for s in SESSIONS])
    assert isinstance(results[3], StaleEpochError) and results[:3] + results[4:] == [None] * (len(SESSIONS) - 1)
    results = await queued_together(db, [runtime.commit(RunTransition(s, epochs[s], checkpoint=_answered(s)))
                                          for s in SESSIONS])
    assert isinstance(results[3], StaleEpochError) and results[:3] + results[4:] == [None] * (len(SESSIONS) - 1)
    assert await other.inspect.steps("r-s3") == []
    assert (await other.stores.checkpoints.load("r-s3")).step_index == 0
    for session in SESSIONS[:3] + SESSIONS[4:]:
        assert await other.inspect.steps(f"r-{session}") == [_tool_done(session)]
        assert await other.stores.checkpoints.load(f"r-{session}") == _answered(session)


@pytest.mark.host_only("threads: the group-commit writer merges writes")
async def test_runs_started_and_finished_together_share_their_statements(db: Path, opened: Callable[..., Any]) -> None:
    """Twelve sessions claim, start a run (latest run, mark, first checkpoint) and finish it (checkpoint,
    unmark) in batches: one fence check, one upsert of latest runs, one update of the marks, one
    insert of new run heads per batch. Each session ends as if its writes ran one by one."""
    runtime = opened()
    epochs = {s: (await runtime.lease.claim(s, stale_at=0)).epoch for s in SESSIONS}
    hi = [{"role": "user", "content": "hi"}]
    statements: list[str] = []
    runtime._executor._conn.set_trace_callback(statements.append)
    started = await queued_together(db, [
        runtime.commit(RunTransition(s, epochs[s], checkpoint=_run_checkpoint(f"r-{s}", hi, 0), last_run=f"r-{s}",
                                     mark=f"r-{s}"))
        for s in SESSIONS
    ])
    assert started == [None] * len(SESSIONS)
    assert [await runtime.lease.resumable_run(s) for s in SESSIONS] == [f"r-{s}" for s in SESSIONS]
    finished = await queued_together(db, [
        runtime.commit(RunTransition(s, epochs[s], checkpoint=_answered(s), unmark=True,
                                     awakeables=(("approve", "aw-s4"),) if s == "s4" else ()))
        for s in SESSIONS
    ])
    assert finished == [None] * len(SESSIONS)
    # one by one: twelve each, 24 lease updates; merged, at most half (two batches of power-of-2 chunks at most)
    assert 1 <= len([s for s in statements if s.startswith("INSERT INTO durable_agent_last_runs")]) <= 6
    assert 1 <= len([s for s in statements if s.startswith("INSERT INTO durable_agent_runs")]) <= 6
    assert 2 <= len([s for s in statements if s.startswith("UPDATE durable_agent_leases")]) <= 12
    fresh = opened()
    for session in SESSIONS:
        assert await fresh.stores.runs.last(session) == f"r-{session}"
        assert await fresh.lease.resumable_run(session) is None
        assert await fresh.stores.checkpoints.load(f"r-{session}") == _answered(session)
    assert [(a.id, a.session_id, a.key) for a in await fresh.inspect.awakeables()] == [("aw-s4", "s4", "approve")]
    from durable_agent.backends.sqlite import SqliteCheckpointStore

    with SqliteCheckpointStore(db) as store:  # the same tables: each run's step log holds both saves
        assert [store.load_step(f"r-{s}", 0) for s in SESSIONS] == [_run_checkpoint(f"r-{s}", hi, 0) for s in SESSIONS]


@pytest.mark.host_only("threads: the group-commit writer merges writes")
async def test_runs_parked_together_share_their_awakeables_and_tool_state_statements(
    db: Path, opened: Callable[..., Any]
) -> None:
    """Twelve sessions park at once, each committing a tool's record with tool state (a key set, a key
    deleted) and opening an awakeable: their awakeables are one insert, their tool state one upsert
    and one delete per batch, as their step records (each used to be written on its own: twelve
    of each); each session ends as if its writes ran one by one."""
    runtime = opened()
    epochs = await _started(runtime)
    for s in SESSIONS:  # a key each park deletes
        await runtime.backend.put_steps([_tool_done(s, ({"op": "set", "key": "old", "value": 0},))], epoch=epochs[s])
    parked = {s: _tool_done(s, ({"op": "set", "key": "k", "value": s}, {"op": "delete", "key": "old"}))
              for s in SESSIONS}
    statements: list[str] = []
    runtime._executor._conn.set_trace_callback(statements.append)
    results = await queued_together(db, [
        runtime.commit(RunTransition(s, epochs[s], checkpoint=_answered(s), awakeables=(("approve", f"aw-{s}"),),
                                     deferred=DeferredSteps((parked[s],))))
        for s in SESSIONS
    ])
    assert results == [None] * len(SESSIONS)
    for table in ("INSERT INTO durable_agent_awakeables", "INSERT INTO durable_agent_tool_state",
                  "DELETE FROM durable_agent_tool_state"):
        assert 1 <= len([s for s in statements if s.startswith(table)]) <= 6, table  # two batches at most
    fresh = opened()
    assert [(a.id, a.session_id, a.key, a.resolved) for a in await fresh.inspect.awakeables()] == [
        (f"aw-{s}", s, "approve", False) for s in sorted(SESSIONS)
    ]
    for session in SESSIONS:
        assert await fresh.backend.tool_state(session, None) == {"k": session}
        assert await fresh.inspect.steps(f"r-{session}") == [parked[session]]
        assert await fresh.stores.checkpoints.load(f"r-{session}") == _answered(session)


@pytest.mark.host_only("threads: the group-commit writer merges writes")
async def test_a_new_run_whose_id_is_taken_falls_back_to_its_own_save(db: Path, opened: Callable[..., Any]) -> None:
    """A run this process never saw is saved as a new run; when its id is taken (another process saved
    it), the merged insert of new heads writes nothing and each start runs its own plan, which
    replaces the stored run as a save does."""
    runtime, other = opened(), opened()
    epochs = {s: (await runtime.lease.claim(s, stale_at=0)).epoch for s in SESSIONS}
    await other.stores.checkpoints.save(_run_checkpoint("r-s2", [{"role": "user", "content": "elsewhere"}], 5))
    hi = [{"role": "user", "content": "hi"}]
    started = await queued_together(db, [
        runtime.commit(RunTransition(s, epochs[s], checkpoint=_run_checkpoint(f"r-{s}", hi, 0), last_run=f"r-{s}"))
        for s in SESSIONS
    ])
    assert started == [None] * len(SESSIONS)
    for session in SESSIONS:
        assert await other.stores.checkpoints.load(f"r-{session}") == _run_checkpoint(f"r-{session}", hi, 0)
        assert await other.stores.runs.last(session) == f"r-{session}"
