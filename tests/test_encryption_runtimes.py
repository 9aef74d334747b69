"""Encryption at rest in the SQL runtimes' journal and the endpoint's SQL event logs (``encryption=keyring``).

On a real SQLite file (with its -wal) and a real Postgres schema: an `Agent` run that streams and dies, resumes,
keeps tool state, parks on an approval and is approved, with a queued message, a completed send and an event log
beside it, behaves exactly as without a keyring, while a marker placed in every kind of journal data (tool input
and output, model reply, stream partial, approval token and verdict, queued message, send result, tool state,
event data and meta) never appears in the raw bytes or rows. A value copied to another row is refused with a
`DecryptionError` naming the row's place; a wrong key too; plaintext rows still load; group-committed writes are
sealed like the others; the runtime conformance suite passes on encrypted runtimes.
Postgres runs under `scripts/services` (it skips without it, as its runtime suite does).
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_kit import tool_results
from durable_agent import (
    Agent,
    ApprovalSigner,
    ConfigurationError,
    DurableOptions,
    ModelRequest,
    RunSuspendedError,
    ScriptedModel,
    Tool,
    call,
    current_tool_call,
    reply,
    resolve_approval,
)
from durable_agent.encryption import DecryptionError, Keyring, envelope_key_id
from durable_agent.testing.runtime_conformance import DurableRuntimeConformance
from store_kit import queued_together
from test_runtime_sqlite import SqlJournalChecks

pytestmark = pytest.mark.host_only("opens SQLite files and Postgres connections, needs cryptography")
pytest.importorskip("cryptography")

K1, K2 = bytes(range(32)), bytes(range(1, 33))
RING = Keyring({"k1": K1}, primary="k1")
MARK = "zq" + secrets.token_hex(8)  # unique per session: only what this test stored can hold it
SESSION = "chat-1"
PYTHON_DIR = Path(__file__).resolve().parent.parent / "python"
JOURNAL_TABLES = ("durable_agent_steps", "durable_agent_partials", "durable_agent_awakeables", "durable_agent_queues",
                  "durable_agent_submissions", "durable_agent_tool_state", "durable_agent_runs",
                  "durable_agent_messages", "durable_agent_step_log", "durable_agent_http_runs",
                  "durable_agent_http_events")


class Crash(RunSuspendedError):
    """Stands for the process dying here: a control error, so nothing records it."""


# -- the databases, each with its raw access ------------------------------------------------------------------


class Database:
    """Runtimes and event logs on one database, and raw access to it: `raw()` every stored byte, `sql` a statement
    on a connection of its own (``?`` placeholders)."""

    def runtime(self, keyring: Keyring | None = RING, clock: Callable[[], int] | None = None) -> Any:
        raise NotImplementedError

    def event_log(self, keyring: Keyring | None = RING) -> Any:
        raise NotImplementedError

    def raw(self) -> bytes:
        raise NotImplementedError

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class SqliteDatabase(Database):
    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "agent.db"
        self.opened: list[Any] = []

    def runtime(self, keyring: Keyring | None = RING, clock: Callable[[], int] | None = None) -> Any:
        from durable_agent.backends.sqlite import SqliteRuntime

        options: dict[str, Any] = {"clock": clock} if clock is not None else {}
        self.opened.append(SqliteRuntime(self.path, encryption=keyring, **options))
        return self.opened[-1]

    def event_log(self, keyring: Keyring | None = RING) -> Any:
        from durable_agent.http import SqliteEventLog

        self.opened.append(SqliteEventLog(self.path, encryption=keyring))
        return self.opened[-1]

    def raw(self) -> bytes:
        return b"".join(Path(f"{self.path}{end}").read_bytes() for end in ("", "-wal", "-shm")
                        if Path(f"{self.path}{end}").exists())

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
        import sqlite3

        with sqlite3.connect(self.path) as conn:
            return conn.execute(query, params).fetchall()

    async def close(self) -> None:
        for opened in self.opened:
            opened.close()


class PostgresDatabase(Database):
    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.opened: list[Any] = []

    def runtime(self, keyring: Keyring | None = RING, clock: Callable[[], int] | None = None) -> Any:
        from durable_agent.backends.postgres import PostgresRuntime

        options: dict[str, Any] = {"clock": clock} if clock is not None else {}
        self.opened.append(PostgresRuntime(self.conninfo, max_connections=1, encryption=keyring, **options))
        return self.opened[-1]

    def event_log(self, keyring: Keyring | None = RING) -> Any:
        from durable_agent.http import PostgresEventLog

        self.opened.append(PostgresEventLog(self.conninfo, encryption=keyring))
        return self.opened[-1]

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            cur = conn.execute(query.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []

    def raw(self) -> bytes:
        present = {name for (name,) in self.sql("SELECT table_name FROM information_schema.tables"
                                                " WHERE table_schema = current_schema()")}
        return repr([row for table in JOURNAL_TABLES if table in present
                     for row in self.sql(f"SELECT * FROM {table}")]).encode()

    async def close(self) -> None:
        for opened in self.opened:
            await opened.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.host_only("needs a Postgres server"))])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        db: Database = SqliteDatabase(tmp_path)
        yield db
        asyncio.run(db.close())
        return
    from durable_agent.testing.services import postgres_schema

    with postgres_schema("er") as conninfo:
        db = PostgresDatabase(conninfo)
        yield db
        asyncio.run(db.close())  # psycopg connections close without I/O: a fresh loop can close them


# -- one run through every kind of journal data ---------------------------------------------------------------


class StreamsThenDies(ScriptedModel):
    """A `ScriptedModel` whose first answer dies mid-stream, after some text holding the marker."""

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        if not self.requests:
            self.requests.append(request)
            yield {"type": "text-delta", "text": f"partial {MARK} "}
            raise Crash()
        async for event in super().stream(request):
            yield event


async def every_kind_of_journal_data(db: Database, keyring: Keyring | None) -> list[bytes]:
    """The run of the module docs on `db`, its outcome checked at each point; the raw bytes at each point."""
    signer = ApprovalSigner("k" * 32)
    deployed: list[Any] = []

    def cd(args: Any) -> str:
        context = current_tool_call()
        assert context is not None
        context.stage_tool_state([{"op": "set", "key": "cwd", "value": args["path"]}])
        return f"out {MARK}"

    def deploy(args: Any) -> str:
        deployed.append(args)
        return "deployed"

    tools = {"cd": Tool(execute=cd, replay="safe"), "deploy": Tool(execute=deploy, needs_approval=True)}
    model = StreamsThenDies([  # by the assistant turns in the request: the dead stream's partial is the first
        "(the dead stream)",
        reply(f"reply {MARK}", call("cd", {"path": f"/in-{MARK}"})),
        reply("", call("deploy", {"v": f"v-{MARK}"})),
        f"Deployed {MARK}.",
    ])

    def agent() -> Agent:  # a new "process" each time
        return Agent(model=model, tools=tools, durable=DurableOptions(db.runtime(keyring), stale_after_ms=1),
                     session_id=SESSION, approval_signer=signer)

    raws = []
    with pytest.raises(Crash):
        await agent().run(f"question {MARK}", run_id="r1")
    assert [p.text for p in await db.runtime(keyring).inspect.partials()] == [f"partial {MARK} "]
    raws.append(db.raw())  # the partial is stored while its step is unfinished

    parked = await agent().resume()
    assert parked is not None and parked.finish_reason == "suspended"
    (request,) = parked.pending_approvals
    assert request.token is not None and request.input == {"v": f"v-{MARK}"}
    assert await db.runtime(keyring).stores.tool_state(SESSION).all() == {"cwd": f"/in-{MARK}"}
    webhook = db.runtime(keyring)
    assert await resolve_approval(webhook, request.approval_id, approved=True, reason=f"ok {MARK}", token=request.token)
    (awakeable,) = await webhook.inspect.awakeables()
    assert awakeable.resolved and awakeable.value["token"] == request.token

    stores = db.runtime(keyring).stores
    await stores.queue.write(SESSION, [{"id": "q1", "text": f"queued {MARK}"}])
    assert await stores.submissions.claim(SESSION, "req-1", "fp") == (True, None)
    await stores.submissions.complete(SESSION, "req-1", {"answer": f"sent {MARK}"})
    log = db.event_log(keyring)
    assert await log.create_run("r1", SESSION, {"who": f"meta {MARK}"})
    events = [("step/0/text/0", {"type": "text-delta", "delta": f"event {MARK}"}), ("finish", {"type": "finish"})]
    assert [e.data for e in await log.append("r1", events)] == [data for _, data in events]
    raws.append(db.raw())  # parked, approved, queued, sent, logged

    done = await agent().resume()
    assert done is not None and done.text == f"Deployed {MARK}." and deployed == [{"v": f"v-{MARK}"}]
    assert tool_results(done.messages[3])[0]["output"] == f"out {MARK}"
    assert len(model.requests) == 4  # the dead stream, then one request per step: no step's answer asked twice
    assert model.requests[1].messages[-1] == {"role": "assistant", "content": [{"type": "text", "text": f"partial {MARK} "}]}
    later = db.runtime(keyring)
    assert await later.stores.queue.read(SESSION) == [{"id": "q1", "text": f"queued {MARK}"}]
    assert await later.stores.submissions.claim(SESSION, "req-1", "fp") == (False, {"answer": f"sent {MARK}"})
    assert await later.stores.tool_state(SESSION).all() == {"cwd": f"/in-{MARK}"}
    steps = await later.inspect.steps("r1")
    assert f"reply {MARK}" in repr([s.result for s in steps]) and f"out {MARK}" in repr([s.result for s in steps])
    stored = await later.stores.checkpoints.load("r1")
    assert stored is not None and stored.status == "completed" and stored.messages == list(done.messages)
    reader = db.event_log(keyring)
    assert [(e.seq, e.key, e.data) for e in await reader.read("r1")] == [(1, *events[0]), (2, *events[1])]
    assert (await reader.run_info("r1")).meta == {"who": f"meta {MARK}"}
    raws.append(db.raw())
    return [raw.replace(request.token.encode(), b"<token>" + MARK.encode()) for raw in raws]  # the token counts too


async def test_every_kind_of_journal_data_is_absent_from_the_raw_bytes_and_the_run_behaves_the_same(
    database: Database,
) -> None:
    for raw in await every_kind_of_journal_data(database, RING):
        assert SESSION.encode() in raw and b"r1" in raw and MARK.encode() not in raw


async def test_without_a_keyring_the_same_run_stores_the_marker_in_plaintext(database: Database) -> None:
    """The control of the test above: the same run and checks pass, and the raw reads see what is stored."""
    partial, parked, done = await every_kind_of_journal_data(database, None)
    assert b"partial " + MARK.encode() in partial
    for kind in (b"<token>", b"queued ", b"sent ", b"meta ", b"event ", b"ok "):  # verdict reason and token
        assert kind + MARK.encode() in parked, kind
    for kind in (b"reply ", b"out ", b"/in-", b"v-", b"Deployed "):
        assert kind + MARK.encode() in done, kind


async def test_every_journal_column_holds_an_envelope_of_the_primary_key(database: Database) -> None:
    await every_kind_of_journal_data(database, RING)
    columns = {
        "durable_agent_steps": ("result", "error", "tool_state"),
        "durable_agent_awakeables": ("value",),
        "durable_agent_queues": ("entries",),
        "durable_agent_submissions": ("result",),
        "durable_agent_tool_state": ("value",),
        "durable_agent_http_runs": ("meta",),
        "durable_agent_http_events": ("data",),
        "durable_agent_runs": ("header",),
        "durable_agent_messages": ("body",),
    }
    for table, names in columns.items():
        values = [v for row in database.sql(f"SELECT {', '.join(names)} FROM {table}") for v in row if v is not None]
        assert values and {envelope_key_id(v) for v in values} == {"k1"}, table


async def test_a_partial_holds_an_envelope_of_its_text_and_of_its_thinking(database: Database) -> None:
    from durable_agent.backends import StreamPartialRecord

    runtime = database.runtime()
    claim = await runtime.lease.claim(SESSION, stale_at=0)
    for seq, (text, thinking) in enumerate([(f"t {MARK}", None), ("", f"th {MARK}")]):
        await runtime.backend.add_partial(StreamPartialRecord(SESSION, "r1", "r1:0:model:0", seq, text, thinking),
                                          epoch=claim.epoch)
    stored = database.sql("SELECT text, thinking FROM durable_agent_partials ORDER BY seq")
    assert [envelope_key_id(v) for row in stored for v in row if v is not None] == ["k1", "k1", "k1"]
    assert [(p.text, p.thinking) for p in await database.runtime().inspect.partials()] == [
        (f"t {MARK}", None), ("", f"th {MARK}")]
    assert MARK.encode() not in database.raw()


# -- refused: copied rows, wrong keys ------------------------------------------------------------------------


async def two_of_each(db: Database) -> tuple[Any, list[Any]]:
    """Two steps (one failed), two tool-state keys, two resolved awakeables, two logged events; the
    runtime and the log."""
    from durable_agent.backends import StepErrorRecord, StepRecord

    runtime = db.runtime()
    claim = await runtime.lease.claim(SESSION, stale_at=0)
    ops = ({"op": "set", "key": "a", "value": "A"}, {"op": "set", "key": "b", "value": "B"})
    await runtime.backend.put_steps([
        StepRecord(SESSION, "r1", "r1:0:a:0", "tool", "safe", "done", result="one", tool_state=ops),
        StepRecord(SESSION, "r1", "r1:0:b:0", "tool", "safe", "failed", error=StepErrorRecord("E", "two")),
    ], epoch=claim.epoch)
    for key, awakeable_id in (("x", "aw-x"), ("y", "aw-y")):
        await runtime.backend.awakeable_for(SESSION, key, awakeable_id, None, epoch=claim.epoch)
        await runtime.resolve_awakeable(awakeable_id, {"approved": True, "token": f"token-{key}"})
    log = db.event_log()
    await log.create_run("r1", SESSION, {})
    await log.append("r1", [("k1", {"type": "one"}), ("k2", {"type": "two"})])
    return runtime, log


COPIES = [  # (table, column, the source row's WHERE, the target row's WHERE, the target's place)
    ("durable_agent_steps", "result", "key = 'r1:0:a:0'", "key = 'r1:0:b:0'", ("step-result", SESSION, "r1:0:b:0")),
    ("durable_agent_steps", "tool_state", "key = 'r1:0:a:0'", "key = 'r1:0:b:0'",
     ("step-tool-state", SESSION, "r1:0:b:0")),
    ("durable_agent_steps", "error", "key = 'r1:0:b:0'", "key = 'r1:0:a:0'", ("step-error", SESSION, "r1:0:a:0")),
    ("durable_agent_tool_state", "value", "key = 'a'", "key = 'b'", ("tool-state", SESSION, "b")),
    ("durable_agent_awakeables", "value", "id = 'aw-x'", "id = 'aw-y'", ("awakeable", "aw-y")),
    ("durable_agent_http_events", "data", "seq = 1", "seq = 2", ("event", "r1", 2)),
]


async def read_back(runtime: Any, log: Any) -> None:
    await runtime.inspect.steps("r1")
    await runtime.stores.tool_state(SESSION).all()
    await runtime.inspect.awakeables()
    await log.read("r1")


@pytest.mark.parametrize(("table", "column", "source", "target", "place"), COPIES,
                         ids=[f"{c[0].removeprefix('durable_agent_')}.{c[1]}" for c in COPIES])
async def test_a_value_copied_to_another_row_is_refused_naming_the_rows_place(
    database: Database, table: str, column: str, source: str, target: str, place: tuple[Any, ...]
) -> None:
    runtime, log = await two_of_each(database)
    (value,) = database.sql(f"SELECT {column} FROM {table} WHERE {source}")[0]
    database.sql(f"UPDATE {table} SET {column} = ? WHERE {target}", (value,))
    with pytest.raises(DecryptionError) as caught:
        await read_back(runtime, log)
    assert caught.value.place == place and "not authentic" in str(caught.value)


async def test_a_queue_or_a_send_result_copied_to_another_session_is_refused(database: Database) -> None:
    runtime = database.runtime()
    for session in ("s-a", "s-b"):
        await runtime.stores.queue.write(session, [{"text": session}])
        await runtime.stores.submissions.claim(session, "req", "fp")
        await runtime.stores.submissions.complete(session, "req", {"run_id": session})
    for table, column, read, place in (
        ("durable_agent_queues", "entries", runtime.stores.queue.read("s-b"), ("queue", "s-b")),
        ("durable_agent_submissions", "result", runtime.stores.submissions.claim("s-b", "req", "fp"),
         ("submission", "s-b", "req")),
    ):
        (value,) = database.sql(f"SELECT {column} FROM {table} WHERE session_id = 's-a'")[0]
        database.sql(f"UPDATE {table} SET {column} = ? WHERE session_id = 's-b'", (value,))
        with pytest.raises(DecryptionError) as caught:
            await read
        assert caught.value.place == place


async def test_a_wrong_key_or_an_unknown_key_id_is_refused_and_a_rotated_ring_reads_and_seals_with_its_primary(
    database: Database,
) -> None:
    await two_of_each(database)
    for ring, problem in ((Keyring({"k1": K2}, primary="k1"), "not authentic"),
                          (Keyring({"k2": K2}, primary="k2"), "key id 'k1', not in this keyring")):
        with pytest.raises(DecryptionError, match=problem) as caught:
            await database.runtime(ring).inspect.steps("r1")
        assert caught.value.place[0] == "step-result" and K1.hex() not in str(caught.value)
        with pytest.raises(DecryptionError, match=problem):
            await database.event_log(ring).read("r1")
    rotated = Keyring({"k2": K2, "k1": K1}, primary="k2")
    runtime = database.runtime(rotated)
    assert [s.result for s in await runtime.inspect.steps("r1")] == ["one", None]
    await runtime.stores.queue.write(SESSION, ["next"])
    assert [envelope_key_id(v) for (v,) in database.sql("SELECT entries FROM durable_agent_queues")] == ["k2"]


async def test_plaintext_rows_still_load_on_a_runtime_and_a_log_with_a_keyring(database: Database) -> None:
    plain = database.runtime(None)
    claim = await plain.lease.claim(SESSION, stale_at=0)
    from durable_agent.backends import StepRecord

    ops = ({"op": "set", "key": "a", "value": "A"},)
    await plain.backend.put_steps([StepRecord(SESSION, "r1", "r1:0:a:0", "tool", "safe", "done", result="one",
                                              tool_state=ops)], epoch=claim.epoch)
    await plain.stores.queue.write(SESSION, ["q"])
    await database.event_log(None).create_run("r1", SESSION, {"m": 1})
    await database.event_log(None).append("r1", [("k1", {"type": "one"})])
    sealed = database.runtime()
    assert [s.result for s in await sealed.inspect.steps("r1")] == ["one"]
    assert await sealed.stores.tool_state(SESSION).all() == {"a": "A"}
    assert await sealed.stores.queue.read(SESSION) == ["q"]
    log = database.event_log()
    assert [e.data for e in await log.read("r1")] == [{"type": "one"}]
    assert (await log.run_info("r1")).meta == {"m": 1}
    await log.append("r1", [("k2", {"type": "two"})])
    assert [envelope_key_id(v) for (v,) in database.sql("SELECT data FROM durable_agent_http_events ORDER BY seq")] == [
        None, "k1"]
    assert [e.data for e in await log.read("r1")] == [{"type": "one"}, {"type": "two"}]


async def test_a_checkpoint_save_after_a_refused_load_rewrites_the_damaged_row(database: Database) -> None:
    """The runtime's load that cannot open a row makes it forget its view of the run: its next commit re-reads
    the rows and rewrites from the damaged one instead of appending after it (as the stores do)."""
    from durable_agent import AgentCheckpoint, Usage
    from durable_agent.backends import RunTransition

    def checkpoint(step: int) -> AgentCheckpoint:
        messages: list[Any] = [{"role": "user", "content": f"m{i}"} for i in range(step + 1)]
        return AgentCheckpoint("r1", step, "running", messages, Usage(), 0)

    runtime = database.runtime()
    claim = await runtime.lease.claim(SESSION, stale_at=0)
    await runtime.commit(RunTransition(SESSION, claim.epoch, checkpoint(1)))
    (body,) = database.sql("SELECT body FROM durable_agent_messages WHERE seq = 0")[0]
    database.sql("UPDATE durable_agent_messages SET body = ? WHERE seq = 1", (body,))
    with pytest.raises(DecryptionError) as caught:
        await runtime.stores.checkpoints.load("r1")
    assert caught.value.place == ("checkpoint-message", "r1", 1)
    await runtime.commit(RunTransition(SESSION, claim.epoch, checkpoint(2)))
    assert await database.runtime().stores.checkpoints.load("r1") == checkpoint(2)


def test_encryption_must_be_a_keyring_and_a_runtime_refuses_another_before_opening_its_file(tmp_path: Path) -> None:
    from durable_agent.backends.sqlite import SqliteRuntime
    from durable_agent.http import SqliteEventLog

    for opener in (SqliteRuntime, SqliteEventLog):
        with pytest.raises(ConfigurationError, match=r"must be a durable_agent\.encryption\.Keyring"):
            opener(tmp_path / "agent.db", encryption=K1)  # type: ignore[arg-type]  # the mistake under test
        assert not (tmp_path / "agent.db").exists()


# -- group commit, a real SIGKILL ----------------------------------------------------------------------------


async def test_writes_merged_into_one_sqlite_commit_are_sealed_like_the_others(tmp_path: Path) -> None:
    """Step batches and run transitions of many sessions queued together are written by merged statements
    (group commit); every row of them is sealed and loads back."""
    from durable_agent import AgentCheckpoint, Usage
    from durable_agent.backends import DeferredSteps, RunTransition, StepRecord

    db = SqliteDatabase(tmp_path)
    runtime = db.runtime()
    sessions = [f"s{i}" for i in range(12)]
    epochs = [(await runtime.lease.claim(s, stale_at=0)).epoch for s in sessions]

    def step(session: str, n: int) -> StepRecord:
        ops = ({"op": "set", "key": "k", "value": f"{session} {MARK}"},)
        return StepRecord(session, f"run-{session}", f"run-{session}:{n}:t:0", "tool", "safe", "done",
                          result=f"{session} {n} {MARK}", tool_state=ops)

    def transition(session: str, epoch: int) -> RunTransition:
        checkpoint = AgentCheckpoint(f"run-{session}", 0, "running", [{"role": "user", "content": f"{session} {MARK}"}],
                                     Usage(), 0)
        return RunTransition(session, epoch, checkpoint, last_run=f"run-{session}", mark=f"run-{session}",
                             awakeables=((f"k-{session}", f"aw-{session}"),), deferred=DeferredSteps((step(session, 1),)))

    results = await queued_together(db.path, [runtime.backend.put_steps([step(s, 0)], epoch=e) for s, e in zip(sessions, epochs, strict=True)])
    results += await queued_together(db.path, [runtime.commit(transition(s, e)) for s, e in zip(sessions, epochs, strict=True)])
    assert results == [None] * 2 * len(sessions)
    assert MARK.encode() not in db.raw()
    reader = db.runtime()
    for session in sessions:
        assert [s.result for s in await reader.inspect.steps(f"run-{session}")] == [f"{session} {n} {MARK}" for n in (0, 1)]
        assert await reader.stores.tool_state(session).all() == {"k": f"{session} {MARK}"}
        loaded = await reader.stores.checkpoints.load(f"run-{session}")
        assert loaded is not None and loaded.messages == [{"role": "user", "content": f"{session} {MARK}"}]
    await db.close()


_WORKER = textwrap.dedent("""
    import asyncio, os, signal, sys
    from durable_agent import Agent, DurableOptions, ScriptedModel, Tool, call, reply
    from durable_agent.backends.sqlite import SqliteRuntime
    from durable_agent.encryption import Keyring

    db, mark = sys.argv[1], sys.argv[2]

    def charge(args):
        os.kill(os.getpid(), signal.SIGKILL)  # dies while the card is being charged

    model = ScriptedModel([reply("", call("lookup", {"q": "in " + mark}), call("charge", {"usd": mark})), "never"])
    tools = {"lookup": Tool(execute=lambda a: "out " + mark, replay="safe"), "charge": Tool(execute=charge)}
    runtime = SqliteRuntime(db, encryption=Keyring.from_env())
    agent = Agent(model=model, tools=tools, durable=DurableOptions(runtime), session_id="chat-1")
    asyncio.run(agent.run("buy it " + mark))
""")


async def test_a_run_sigkilled_on_an_encrypted_runtime_resumes_in_another_process(tmp_path: Path) -> None:
    import base64

    from durable_agent.backends.sqlite import SqliteRuntime

    worker = subprocess.run(
        [sys.executable, "-c", _WORKER, str(tmp_path / "agent.db"), MARK], capture_output=True, text=True, timeout=60,
        cwd=PYTHON_DIR, env={"PYTHONPATH": str(PYTHON_DIR), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                             "DURABLE_AGENT_KEYS": f"k1:{base64.b64encode(K1).decode()}"},
    )
    assert worker.returncode == -9, worker.stderr
    assert MARK.encode() not in SqliteDatabase(tmp_path).raw()
    model = ScriptedModel([reply("", call("lookup", {"q": f"in {MARK}"}), call("charge", {"usd": MARK})), "Reported."])
    ran: list[str] = []
    tools = {"lookup": Tool(execute=lambda a: ran.append("lookup"), replay="safe"),
             "charge": Tool(execute=lambda a: ran.append("charge"))}
    with SqliteRuntime(tmp_path / "agent.db", encryption=RING) as runtime:
        resumed = await Agent(model=model, tools=tools, durable=DurableOptions(runtime), session_id=SESSION).resume()
    assert resumed is not None and resumed.text == "Reported." and len(model.requests) == 1 and "charge" not in ran
    lookup, charge = tool_results(resumed.messages[2])
    assert lookup["output"] in (f"out {MARK}", None) and charge["is_error"] and "interrupted" in charge["output"]
    assert MARK.encode() not in SqliteDatabase(tmp_path).raw()


# -- the whole runtime surface, encrypted ----------------------------------------------------------------------


def write_stray_row(db: Database, run_id: str, seq: int) -> None:
    """A message row no save wrote (damage, or a foreign writer), through a connection of its own."""
    db.sql("INSERT INTO durable_agent_messages (run_id, seq, body) VALUES (?, ?, ?)", (run_id, seq, '"stray"'))


class EncryptedRuntimeChecks(DurableRuntimeConformance, SqlJournalChecks):
    """The conformance suite and the SQL journal checks on the runtime of `journal_db` (a subclass's fixture),
    encrypted with `RING`."""

    @pytest.fixture
    def make_runtime(self, journal_db: Database) -> Callable[[Callable[[], int]], Any]:
        return lambda clock: journal_db.runtime(RING, clock)

    @pytest.fixture
    def stray_row(self, journal_db: Database) -> Callable[[str, int], None]:
        return functools.partial(write_stray_row, journal_db)


class TestEncryptedSqliteRuntime(EncryptedRuntimeChecks):
    @pytest.fixture
    def journal_db(self, tmp_path: Path) -> Iterator[Database]:
        db = SqliteDatabase(tmp_path)
        yield db
        asyncio.run(db.close())


@pytest.mark.host_only("needs a Postgres server")
class TestEncryptedPostgresRuntime(EncryptedRuntimeChecks):
    @pytest.fixture
    def journal_db(self) -> Iterator[Database]:
        from durable_agent.testing.services import postgres_schema

        with postgres_schema("er") as conninfo:
            db = PostgresDatabase(conninfo)
            yield db
            asyncio.run(db.close())
