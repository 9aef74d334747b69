"""Rekeying a runtime's journal and the endpoint's event log (`rekey_async(runtime)`, `rekey_async(log)`), strict
keyrings on the journal's readers, and the CLI on an encrypted database (``DURABLE_AGENT_KEYS``).

The data is `test_encryption_runtimes`' run through every kind of journal data (steps, approvals, queue, send,
tool state, checkpoints, event log) plus a run that died mid-stream (its partial stored), on a real SQLite file
(with its -wal) and a real Postgres schema (under `scripts/services`; skipped without it). The CLI runs as
subprocesses, one of them SIGKILLed mid-rekey.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from durable_agent import Agent, DurableOptions
from durable_agent.encryption import DecryptionError, Keyring, rekey_async
from test_cli import ledger  # noqa: F401 - the fixture
from test_encryption_rekey import K2_ONLY, ROTATED, STRICT_K1, keys_env, rekey_killed_mid_way
from test_encryption_runtimes import (
    MARK,
    RING,
    SESSION,
    Crash,
    Database,
    SqliteDatabase,
    StreamsThenDies,
    database,  # noqa: F401 - the fixture
    every_kind_of_journal_data,
)

pytestmark = pytest.mark.host_only("opens SQLite files, Postgres connections and subprocesses, needs cryptography")
pytest.importorskip("cryptography")

DIED = "chat-2"  # the session of the run that died mid-stream


def died_mid_stream(db: Database, keyring: Keyring | None) -> Any:
    """An Agent of session `DIED` on `db` whose run (r2) died mid-stream: its partial is stored, the run unfinished.
    Returns a maker of the Agent that resumes it (with a runtime under a given keyring)."""
    model = StreamsThenDies(["(the dead stream)", f"Done {MARK}."])

    def agent(ring: Keyring | None) -> Agent:
        return Agent(model=model, durable=DurableOptions(db.runtime(ring), stale_after_ms=1), session_id=DIED)

    with pytest.raises(Crash):
        asyncio.run(agent(keyring).run(f"question {MARK}", run_id="r2"))
    return agent


async def rekeyed(db: Database, keyring: Keyring, **options: Any) -> Any:
    """`rekey_async` of `db`'s runtime, then of its event log."""
    return (await rekey_async(db.runtime(keyring), keyring, **options)
            + await rekey_async(db.event_log(keyring), keyring, **options))


@pytest.mark.parametrize("before", ["k1", "plaintext"])
def test_after_a_rekey_every_journal_and_event_row_is_under_the_new_key_and_a_strict_ring_resumes_the_run(
    database: Database, before: str  # noqa: F811 - the fixture
) -> None:
    """k1 → k2 (a rotation), or plaintext → k1 (an unencrypted database sealed in place), in batches of 3."""
    old, new, strict = (RING, ROTATED, K2_ONLY) if before == "k1" else (None, RING, STRICT_K1)
    asyncio.run(every_kind_of_journal_data(database, old))
    agent = died_mid_stream(database, old)
    assert [p.text for p in asyncio.run(database.runtime(old).inspect.partials())] == [f"partial {MARK} "] * 2

    report = asyncio.run(rekeyed(database, new, batch_size=3))
    raw = database.raw()
    assert b"enc1t.k1." not in raw if before == "k1" else b"enc1t.k1." in raw
    assert MARK.encode() not in raw
    assert report.complete and report.rewritten > 30 and report.batches > 12, report

    async def loaded() -> None:  # every reader, under a ring that holds the new key alone and refuses plaintext
        runtime = database.runtime(strict)
        assert f"reply {MARK}" in repr([s.result for s in await runtime.inspect.steps("r1")])
        assert [p.text for p in await runtime.inspect.partials()] == [f"partial {MARK} "] * 2
        assert f"ok {MARK}" in repr([a.value for a in await runtime.inspect.awakeables()])
        assert await runtime.stores.queue.read(SESSION) == [{"id": "q1", "text": f"queued {MARK}"}]
        assert await runtime.stores.submissions.claim(SESSION, "req-1", "fp") == (False, {"answer": f"sent {MARK}"})
        assert await runtime.stores.tool_state(SESSION).all() == {"cwd": f"/in-{MARK}"}
        stored = await runtime.stores.checkpoints.load("r1")
        assert stored is not None and stored.status == "completed" and f"Deployed {MARK}." in repr(stored.messages[-1])
        log = database.event_log(strict)
        assert [e.seq for e in await log.read("r1")] == [1, 2]
        assert (await log.run_info("r1")).meta == {"who": f"meta {MARK}"}
        done = await agent(strict).resume()  # the run that died mid-stream, its partial read back
        assert done is not None and done.text == f"Done {MARK}."

    asyncio.run(loaded())
    again = asyncio.run(rekeyed(database, new))
    assert again.rewritten == 0 and again.current == again.examined


def test_a_strict_keyring_refuses_plaintext_in_every_journal_and_event_reader(
    database: Database  # noqa: F811 - the fixture
) -> None:
    asyncio.run(every_kind_of_journal_data(database, None))
    died_mid_stream(database, None)

    async def refused() -> None:
        runtime, log = database.runtime(STRICT_K1), database.event_log(STRICT_K1)
        readers = [runtime.inspect.steps("r1"), runtime.inspect.partials(), runtime.inspect.awakeables(),
                   runtime.stores.queue.read(SESSION), runtime.stores.submissions.claim(SESSION, "req-1", "fp"),
                   runtime.stores.tool_state(SESSION).all(), runtime.stores.checkpoints.load("r1"),
                   log.read("r1"), log.run_info("r1")]
        for reader in readers:
            with pytest.raises(DecryptionError, match="stored in plaintext, and the keyring is strict"):
                await reader

    asyncio.run(refused())


def test_a_runtime_rekey_sigkilled_mid_way_is_finished_by_running_it_again(tmp_path: Path) -> None:
    db = SqliteDatabase(tmp_path)
    stores = db.runtime(RING).stores

    async def queued() -> None:
        for n in range(600):
            await stores.queue.write(f"s-{n:04}", [{"id": "q", "text": f"queued {MARK}"}])

    asyncio.run(queued())
    rekey_killed_mid_way(db.path, "durable_agent_queues", "entries", "--runtime", f"sqlite:///{db.path}")

    async def loaded() -> list[Any]:
        return [await db.runtime(K2_ONLY).stores.queue.read(f"s-{n:04}") for n in (0, 599)]

    assert asyncio.run(loaded()) == [[{"id": "q", "text": f"queued {MARK}"}]] * 2
    asyncio.run(db.close())
    assert b"enc1t.k1." not in db.raw()


# -- the CLI on an encrypted database -------------------------------------------------------------------------


def test_the_cli_opens_an_encrypted_sqlite_runtime_with_durable_agent_keys(
    tmp_path: Path, ledger: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811 - the fixture
) -> None:
    from cli_kit import cli
    from test_cli import journal_run

    monkeypatch.setenv("DURABLE_AGENT_KEYS", keys_env("k1")["DURABLE_AGENT_KEYS"])
    run_id, approval, runtime, env = journal_run(tmp_path)  # the agent's server seals under k1
    path = Path(runtime.removeprefix("sqlite:///"))
    assert b"inv-7" not in b"".join(Path(f"{path}{end}").read_bytes() for end in ("", "-wal") if Path(f"{path}{end}").exists())
    unset = {**env, "DURABLE_AGENT_KEYS": ""}
    for command in (["runs", "list"], ["runs", "show", run_id], ["runs", "approve", run_id, approval],
                    ["runs", "fork", run_id, "--to", "f-1"]):  # prune reads no sealed value: it needs no keys
        done = cli("--runtime", runtime, *command, env=unset)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.startswith("durable-agent: error: the database is encrypted")
        assert "set DURABLE_AGENT_KEYS" in done.stderr and "Traceback" not in done.stderr

    keyed = {**env, **keys_env("k1")}
    listed = cli("--runtime", runtime, "runs", "list", env=keyed)
    assert listed.returncode == 0 and run_id in listed.stdout, listed.stderr
    shown = cli("--runtime", runtime, "runs", "show", run_id, env=keyed)
    assert shown.returncode == 0 and "Journal steps" in shown.stdout and "inv-7" in shown.stdout, shown.stderr
    assert cli("--runtime", runtime, "runs", "approve", run_id, approval, env=keyed).returncode == 0
    resumed = cli("--runtime", runtime, "runs", "resume", run_id, "--agent", "cli_agent:journal_agent", env=keyed)
    assert resumed.returncode == 0 and ledger.read_text() == "paid inv-7\n", resumed.stderr
    assert cli("--runtime", runtime, "runs", "fork", run_id, "--to", "f-1", env=keyed).returncode == 0

    rotated = {**env, **keys_env("k2", "k1")}
    rekey = cli("--runtime", runtime, "--json", "runs", "rekey", env=rotated)
    assert rekey.returncode == 0 and '"refused":0' in rekey.stdout, rekey.stderr
    k2 = {**env, **keys_env("k2")}
    assert "f-1" in cli("--runtime", runtime, "runs", "list", env=k2).stdout
    pruned = cli("--runtime", runtime, "runs", "prune", "--before", "0m", "--include-suspended", env=k2)
    assert pruned.returncode == 0 and "deleted 2 run(s)" in pruned.stdout, pruned.stderr
    assert cli("--runtime", runtime, "--json", "runs", "list", env=k2).stdout.strip() == "[]"


def test_the_cli_opens_and_rekeys_an_encrypted_postgres_runtime_and_its_event_log() -> None:
    from cli_kit import cli
    from durable_agent.testing.services import postgres_schema
    from test_cli import schema_url
    from test_encryption_runtimes import PostgresDatabase

    with postgres_schema("rkj") as conninfo:
        db = PostgresDatabase(conninfo)
        asyncio.run(every_kind_of_journal_data(db, RING))
        url = schema_url(conninfo)
        unset = cli("--runtime", url, "runs", "show", "r1", env={"DURABLE_AGENT_KEYS": ""})
        assert unset.returncode == 2 and "set DURABLE_AGENT_KEYS" in unset.stderr, unset.stderr
        shown = cli("--runtime", url, "runs", "show", "r1", env=keys_env("k1"))
        assert shown.returncode == 0 and f"Deployed {MARK}." in shown.stdout, shown.stderr
        rekey = cli("--runtime", url, "--json", "runs", "rekey", env=keys_env("k2", "k1"))
        assert rekey.returncode == 0 and '"refused":0' in rekey.stdout, rekey.stderr
        assert b"enc1t.k1." not in db.raw()  # the journal's, the checkpoints' and the event log's rows

        async def read() -> list[int]:
            return [e.seq for e in await db.event_log(K2_ONLY).read("r1")]

        assert asyncio.run(read()) == [1, 2]
        asyncio.run(db.close())


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_the_cli_on_an_encrypted_store_needs_durable_agent_keys(tmp_path: Path, kind: str) -> None:
    from cli_kit import cli
    from test_encryption import marked
    from test_encryption_stores import Jsonl, Sqlite, saved

    backend = Sqlite(tmp_path) if kind == "sqlite" else Jsonl(tmp_path)
    saved(backend, marked("run-m", 1))
    url = f"{kind}:///{backend.path}"
    unset = cli("--store", url, "runs", "show", "run-m", env={"DURABLE_AGENT_KEYS": ""})
    assert unset.returncode == 2 and "the database is encrypted" in unset.stderr and "Traceback" not in unset.stderr
    shown = cli("--store", url, "--json", "runs", "show", "run-m", env=keys_env("k1"))
    assert shown.returncode == 0 and '"run_id":"run-m"' in shown.stdout.replace(" ", ""), shown.stderr
