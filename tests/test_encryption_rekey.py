"""`durable_agent.encryption.rekey` and strict keyrings, on the real backends (SQLite files, JSONL, Postgres, Redis).

Rotation k1 -> k2 then a ring without k1 loads everything (raw bytes hold no k1 envelope); a plaintext database
encrypted in place; a save made between two batches or inside one is never overwritten; a row that does not
open is refused and left as it is; a strict keyring refuses plaintext. The backends and their raw access are
`test_encryption_stores`'s. Postgres and Redis run under `scripts/services` (they skip without it).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_agent import AgentCheckpoint, ConfigurationError, InMemoryCheckpointStore
from durable_agent.encryption import (
    DecryptionError,
    Keyring,
    Place,
    RekeyReport,
    envelope_key_id,
    rekey,
    rekey_async,
)
from durable_agent.testing import conversation, make_checkpoint
from test_encryption import MARK, marked
from test_encryption_stores import (
    HEADER,
    K1,
    K2,
    RING,
    Backend,
    DurableObject,
    Jsonl,
    Postgres,
    Sqlite,
    load,
    redis_backend,
    saved,
)

pytestmark = pytest.mark.host_only("opens SQLite files, service connections and needs cryptography")
pytest.importorskip("cryptography")

ROTATED = Keyring({"k2": K2, "k1": K1}, primary="k2")
K2_ONLY = Keyring({"k2": K2}, primary="k2", strict=True)  # what a server holds once the rekey is done
STRICT_K1 = Keyring({"k1": K1}, primary="k1", strict=True)
REKEYED = ["sqlite", "jsonl", "durable_object", "postgres", "redis"]


@pytest.fixture(params=REKEYED)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        yield Sqlite(tmp_path)
    elif request.param == "jsonl":
        yield Jsonl(tmp_path)
    elif request.param == "durable_object":
        yield DurableObject()
    elif request.param == "postgres":
        from durable_agent.testing.services import postgres_schema

        with postgres_schema("rk") as conninfo:
            yield Postgres(conninfo)
    else:
        with redis_backend() as redis:
            yield redis


def history(run_id: str) -> list[AgentCheckpoint]:
    """A run saved at steps 0, 1, 2 (each an append), so it has a step log."""
    return [make_checkpoint(run_id, step, conversation(step + 1)) for step in range(3)]


def rekeyed(backend: Backend, keyring: Keyring, *, opened_with: Keyring | None = None, **options: Any) -> RekeyReport:
    store = backend.store(opened_with)
    try:
        return rekey(store, keyring, **options)
    finally:
        store.close()


# -- rotation and migration ----------------------------------------------------------------------------------------


def test_after_a_rotation_and_a_rekey_a_ring_without_the_old_key_loads_everything(backend: Backend) -> None:
    runs = {f"run-{i}": history(f"run-{i}") for i in range(3)}
    saved(backend, *(cp for checkpoints in runs.values() for cp in checkpoints), marked("run-m", 1))
    with pytest.raises(DecryptionError, match="key id 'k1', not in this keyring"):
        load(backend, "run-0", K2_ONLY)  # before: the new ring alone cannot read a thing

    report = rekeyed(backend, ROTATED, batch_size=2)
    assert report.examined == report.rewritten > 0 and report.complete and report.refusals == ()
    assert report.batches > 1 or isinstance(backend, Jsonl)  # a JSONL file is replaced whole, in one batch

    for run_id, checkpoints in runs.items():
        assert load(backend, run_id, K2_ONLY) == checkpoints[-1]
        assert [load(backend, run_id, K2_ONLY, step) for step in range(3)] == checkpoints
    assert load(backend, "run-m", K2_ONLY) == marked("run-m", 1)
    raw = backend.raw()
    assert b"enc1t.k1." not in raw and MARK.encode() not in raw and b"enc1t.k2." in raw
    assert [envelope_key_id(backend.get("run-0", row)) for row in (HEADER, 0, 1, 2)] == ["k2"] * 4

    again = rekeyed(backend, ROTATED, batch_size=2)  # nothing left to do
    assert (again.examined, again.rewritten, again.current) == (report.examined, 0, report.examined)


def test_a_plaintext_database_is_encrypted_in_place(backend: Backend) -> None:
    saved(backend, *history("run-a"), marked("run-m", 1), keyring=None)
    assert MARK.encode() in backend.raw()
    with pytest.raises(DecryptionError, match="stored in plaintext, and the keyring is strict"):
        load(backend, "run-m", STRICT_K1)

    report = rekeyed(backend, RING, batch_size=3)
    assert report.examined == report.rewritten > 0 and report.complete

    raw = backend.raw()
    assert MARK.encode() not in raw and b'"role"' not in raw
    assert load(backend, "run-m", STRICT_K1) == marked("run-m", 1)
    assert load(backend, "run-a", STRICT_K1) == history("run-a")[-1]
    assert load(backend, "run-a", STRICT_K1, 1) == history("run-a")[1]


def test_a_strict_rekey_refuses_plaintext_rows_and_leaves_them(backend: Backend) -> None:
    """After the migration a plaintext row can only be planted: a strict rekey does not launder it into an envelope."""
    saved(backend, marked("run-m", 1), keyring=None)
    report = rekeyed(backend, RING, strict=True)
    assert report.examined == report.refused > 0 and report.rewritten == 0 and not report.complete
    assert all("stored in plaintext" in problem or "not an envelope" in problem for problem in report.refusals)
    assert MARK.encode() in backend.raw()
    assert load(backend, "run-m", None) == marked("run-m", 1)


def test_a_row_that_does_not_open_is_refused_named_and_left_while_the_others_are_rekeyed(backend: Backend) -> None:
    saved(backend, *history("run-a"), *history("run-b"))
    backend.put("run-a", 1, Keyring({"k0": bytes(32)}, primary="k0").seal("{}", ("checkpoint-message", "run-a", 1)))
    report = rekeyed(backend, ROTATED)
    assert report.refused == 1 and report.rewritten == report.examined - 1
    assert "('checkpoint-message', 'run-a', 1)" in report.refusals[0] and "'k0'" in report.refusals[0]
    assert envelope_key_id(backend.get("run-a", 1)) == "k0"  # left as it was
    assert load(backend, "run-b", K2_ONLY) == history("run-b")[-1]


def test_a_durable_object_entry_split_in_parts_is_rekeyed_whole() -> None:
    """A message and a header too large for one entry: resealed, they may take another number of parts."""
    from durable_agent.backends.durable_object import DurableObjectCheckpointStore

    backend = DurableObject()
    big = make_checkpoint("run-a", 1, [{"role": "user", "content": "x" * 30_000}, *conversation(2)[1:]])
    store = DurableObjectCheckpointStore(backend.storage, max_entry_bytes=8192, encryption=RING)
    store.save(big)
    long_id = Keyring({"a-much-longer-key-id-" + "9" * 40: K2, "k1": K1}, primary="a-much-longer-key-id-" + "9" * 40)
    report = rekey(store, long_id)
    assert report.rewritten == report.examined == 1 + 2 + 1
    alone = DurableObjectCheckpointStore(backend.storage, max_entry_bytes=8192,
                                         encryption=Keyring({long_id.primary: K2}, primary=long_id.primary))
    assert alone.load("run-a") == big and alone.load_step("run-a", 1) == big
    assert b"enc1t.k1." not in backend.raw()


def test_a_sqlite_row_that_is_not_utf8_is_refused_never_sealed_as_plaintext(tmp_path: Path) -> None:
    backend = Sqlite(tmp_path)
    saved(backend, *history("run-a"), keyring=None)
    with sqlite3.connect(backend.path) as conn:
        conn.execute("UPDATE durable_agent_messages SET body = CAST(? AS TEXT) WHERE seq = 1", (b"\xff\xfe{}",))
    report = rekeyed(backend, RING)
    assert report.refused == 1 and report.rewritten == report.examined - 1
    assert "('checkpoint-message', 'run-a', 1): it is bytes without the envelope marker" in report.refusals[0]
    with sqlite3.connect(backend.path) as conn:
        assert conn.execute("SELECT CAST(body AS BLOB) FROM durable_agent_messages WHERE seq = 1").fetchone() == (
            b"\xff\xfe{}",)


def test_a_rekey_needs_a_keyring_a_positive_batch_and_a_store_that_keeps_rows(tmp_path: Path) -> None:
    store = Sqlite(tmp_path).store()
    with pytest.raises(ConfigurationError, match=r"needs a durable_agent\.encryption\.Keyring"):
        rekey(store, K2)  # type: ignore[arg-type]  # the mistake under test
    with pytest.raises(ConfigurationError, match="batch_size must be a positive int"):
        rekey(store, ROTATED, batch_size=0)
    store.close()
    with pytest.raises(ConfigurationError, match="cannot be rekeyed"):
        rekey(InMemoryCheckpointStore(), ROTATED)
    with pytest.raises(ConfigurationError, match=r"strict must be a bool"):
        Keyring({"k1": K1}, primary="k1", strict="yes")  # type: ignore[arg-type]  # the mistake under test


# -- strict keyrings ---------------------------------------------------------------------------------------------


def test_a_plaintext_row_planted_after_the_migration_is_refused_by_a_strict_keyring(backend: Backend) -> None:
    if isinstance(backend, Jsonl):
        pytest.skip("a JSONL message is a JSON value: planted whole lines are covered by the plaintext-store test")
    saved(backend, *history("run-a"))
    planted = RING.open(backend.get("run-a", 1), ("checkpoint-message", "run-a", 1))
    backend.put("run-a", 1, str(planted))
    assert load(backend, "run-a") == history("run-a")[-1]  # lenient (the default): read as plaintext
    with pytest.raises(DecryptionError, match=r"\('checkpoint-message', 'run-a', 1\).*stored in plaintext"):
        load(backend, "run-a", STRICT_K1)
    header = RING.open(backend.get("run-a", HEADER), ("checkpoint-header", "run-a", 2))
    saved(backend, *history("run-b"))
    backend.put("run-b", HEADER, str(header).replace("run-a", "run-b"))
    with pytest.raises(DecryptionError, match=r"\('checkpoint-header', 'run-b', 2\).*stored in plaintext"):
        load(backend, "run-b", STRICT_K1)


def test_a_strict_store_rewrites_a_planted_row_on_its_next_save(tmp_path: Path) -> None:
    backend = Sqlite(tmp_path)
    saved(backend, *history("run-a"))
    backend.put("run-a", 0, str(RING.open(backend.get("run-a", 0), ("checkpoint-message", "run-a", 0))))
    saved(backend, make_checkpoint("run-a", 3, conversation(4)), keyring=STRICT_K1)
    assert {envelope_key_id(backend.get("run-a", row)) for row in (0, 1, 2, 3)} == {"k1"}
    assert load(backend, "run-a", STRICT_K1) == make_checkpoint("run-a", 3, conversation(4))


# -- live writers --------------------------------------------------------------------------------------------------


def test_saves_between_batches_are_kept(backend: Backend) -> None:
    """A live server (another handle, already on the new primary) saves while the rekey goes batch by batch."""
    saved(backend, *(cp for i in range(6) for cp in history(f"run-{i}")))
    live = backend.store(ROTATED)
    latest = {f"run-{i}": history(f"run-{i}")[-1] for i in range(6)}
    step = 3

    def save_between_batches(report: RekeyReport) -> None:
        nonlocal step
        for run_id in ("run-0", "run-5"):  # one the rekey has passed, one it has not reached (for SQL tables)
            latest[run_id] = make_checkpoint(run_id, step, conversation(step + 1))
            live.save(latest[run_id])
        step += 1

    rekeyed(backend, ROTATED, batch_size=2, progress=save_between_batches)
    live.close()
    assert {run_id: load(backend, run_id, K2_ONLY) for run_id in latest} == latest


class MeddlingKeyring(Keyring):
    """A keyring whose first seal lets a live server save a run first: between a batch's read and its write."""

    def __init__(self, save: Any) -> None:
        super().__init__({"k2": K2, "k1": K1}, primary="k2")
        self._save = save

    def seal(self, plaintext: Any, place: Place, *, binary: bool = False) -> Any:
        save, self._save = self._save, None
        if save is not None:
            save()
        return super().seal(plaintext, place, binary=binary)


@pytest.mark.parametrize("backend", ["postgres", "redis"], indirect=True)
def test_a_save_inside_a_batch_is_not_overwritten_with_stale_data(backend: Backend) -> None:
    """Postgres and Redis read a batch without locking it: a save landing between the read and the write wins
    (compare-and-swap), counted as changed. (SQLite and JSONL hold their write lock over the batch.)"""
    saved(backend, *history("run-a"))
    newer = make_checkpoint("run-a", 1, [{"role": "user", "content": "rewritten history"}, *conversation(2)[1:]])

    def live_save() -> None:
        store = backend.store(ROTATED)
        store.save(newer)  # rewrites message 0 and the header
        store.close()

    report = rekeyed(backend, MeddlingKeyring(live_save), batch_size=100)
    assert report.changed > 0 and not report.complete
    assert load(backend, "run-a", ROTATED) == newer
    again = rekeyed(backend, ROTATED)
    assert again.complete and load(backend, "run-a", K2_ONLY) == newer


@pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)
def test_a_writer_thread_saving_throughout_a_rekey_loses_nothing(backend: Backend) -> None:
    """A writer thread saves every run, 12 rounds, while the rekey runs batch by batch; each batch waits for the
    writer to finish a round after it (so they overlap however the threads are scheduled)."""
    saved(backend, *(cp for i in range(8) for cp in history(f"run-{i}")))
    latest: dict[str, AgentCheckpoint] = {}
    stop = threading.Event()
    round_done = threading.Condition()
    rounds = 0
    failures: list[BaseException] = []

    def writer() -> None:
        nonlocal rounds
        store = backend.store(ROTATED)
        try:
            for step in range(3, 15):
                if stop.is_set():
                    break
                for i in range(8):
                    checkpoint = make_checkpoint(f"run-{i}", step, conversation(step + 1))
                    store.save(checkpoint)
                    latest[checkpoint.run_id] = checkpoint
                with round_done:
                    rounds += 1
                    round_done.notify_all()
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)
        finally:
            store.close()

    def wait_for_a_round(report: RekeyReport) -> None:
        with round_done:
            seen = rounds
            assert round_done.wait_for(lambda: rounds > seen or rounds == 12 or failures, timeout=60)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        report = rekeyed(backend, ROTATED, batch_size=3, progress=wait_for_a_round)
    finally:
        stop.set()
        thread.join()
    assert not failures and rounds >= min(report.batches, 12)
    rekeyed(backend, ROTATED)  # rows a save changed under a batch: now rekeyed
    assert {f"run-{i}": load(backend, f"run-{i}", K2_ONLY) for i in range(8)} == latest


# -- async faces and runtimes --------------------------------------------------------------------------------------


def test_rekey_async_rekeys_the_async_stores(tmp_path: Path) -> None:
    from durable_agent.backends import open_store

    saved(Sqlite(tmp_path), *history("run-a"))

    async def main() -> RekeyReport:
        store = open_store(f"sqlite+async:///{tmp_path}/runs.db")
        with pytest.raises(ConfigurationError, match="asynchronous: await rekey_async"):
            rekey(store, ROTATED)
        try:
            return await rekey_async(store, ROTATED, batch_size=2)
        finally:
            await store.close()

    assert asyncio.run(main()).rewritten == 7  # 1 header, 3 messages, 3 step-log headers
    assert load(Sqlite(tmp_path), "run-a", K2_ONLY) == history("run-a")[-1]


def test_rekey_async_rekeys_the_checkpoints_of_a_sqlite_runtime(tmp_path: Path) -> None:
    from durable_agent.backends.sqlite import SqliteRuntime

    saved(Sqlite(tmp_path), *history("run-a"), keyring=None)

    async def main() -> RekeyReport:
        runtime = SqliteRuntime(tmp_path / "runs.db")
        try:
            return await rekey_async(runtime, RING)
        finally:
            runtime.close()

    assert asyncio.run(main()).rewritten == 7  # 1 header, 3 messages, 3 step-log headers
    assert load(Sqlite(tmp_path), "run-a", STRICT_K1) == history("run-a")[-1]
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        bodies = [body for (body,) in conn.execute("SELECT body FROM durable_agent_messages")]
    assert bodies and all(isinstance(body, bytes) and body.startswith(b"enc1t.k1.") for body in bodies)  # binary


def test_rekey_async_rekeys_the_checkpoints_of_a_postgres_runtime() -> None:
    from durable_agent.backends.postgres import PostgresRuntime
    from durable_agent.testing.services import postgres_schema

    with postgres_schema("rkr") as conninfo:
        backend = Postgres(conninfo)
        saved(backend, *history("run-a"), keyring=None)

        async def main() -> RekeyReport:
            async with PostgresRuntime(conninfo, max_connections=1) as runtime:
                return await rekey_async(runtime, RING, batch_size=2)

        assert asyncio.run(main()).rewritten == 7
        assert load(backend, "run-a", STRICT_K1) == history("run-a")[-1]
        assert MARK.encode() not in backend.raw() and b'"role"' not in backend.raw()


def test_async_postgres_and_redis_stores_rekey() -> None:
    from durable_agent.backends.postgres import AsyncPostgresCheckpointStore
    from durable_agent.backends.redis import AsyncRedisCheckpointStore
    from durable_agent.testing.services import postgres_schema

    with postgres_schema("rka") as conninfo, redis_backend() as redis:
        for backend, make in ((Postgres(conninfo), lambda: AsyncPostgresCheckpointStore(conninfo, max_size=1)),
                              (redis, lambda: AsyncRedisCheckpointStore(redis.url, prefix=redis.prefix))):
            saved(backend, *history("run-a"))

            async def main(make: Any = make) -> RekeyReport:
                store = make()
                try:
                    return await rekey_async(store, ROTATED, batch_size=1)
                finally:
                    await store.close()

            assert asyncio.run(main()).rewritten == 7  # 1 header, 3 messages, 3 step-log headers
            assert load(backend, "run-a", K2_ONLY) == history("run-a")[-1]


# -- the CLI: durable-agent runs rekey -------------------------------------------------------------------------


def keys_env(*ids: str) -> dict[str, str]:
    """``DURABLE_AGENT_KEYS`` holding `ids` (k1, k2) in that order, the first primary."""
    import base64

    keys = {"k1": K1, "k2": K2}
    return {"DURABLE_AGENT_KEYS": ",".join(f"{i}:{base64.b64encode(keys[i]).decode()}" for i in ids)}


def test_cli_rekey_rotates_the_store_and_prints_a_summary(tmp_path: Path) -> None:
    from cli_kit import cli

    backend = Sqlite(tmp_path)
    saved(backend, *history("run-a"), marked("run-m", 1))
    url = f"sqlite:///{backend.path}"
    done = cli("--store", url, "runs", "rekey", "--batch-size", "2", env=keys_env("k2", "k1"))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no progress lines off a terminal
    assert done.stdout.startswith("rekeyed to key 'k2': 12 row(s) examined in ") and "12 rewritten" in done.stdout
    assert "the other keys can be dropped" in done.stdout
    assert load(backend, "run-m", K2_ONLY) == marked("run-m", 1)
    assert b"enc1t.k1." not in backend.raw()

    again = cli("--store", url, "--json", "runs", "rekey", env=keys_env("k2", "k1"))
    assert again.returncode == 0 and '"rewritten":0' in again.stdout and '"current":12' in again.stdout


def test_cli_rekey_encrypts_a_plaintext_postgres_store_in_place() -> None:
    from cli_kit import cli
    from durable_agent.testing.services import postgres_schema
    from test_cli import schema_url

    with postgres_schema("rkc") as conninfo:
        backend = Postgres(conninfo)
        saved(backend, marked("run-m", 1), keyring=None)
        url = schema_url(conninfo)
        done = cli("--store", url, "runs", "rekey", env=keys_env("k1"))
        assert done.returncode == 0, done.stderr
        assert MARK.encode() not in backend.raw() and load(backend, "run-m", STRICT_K1) == marked("run-m", 1)


def test_cli_rekey_exit_codes(tmp_path: Path) -> None:
    from cli_kit import cli

    backend = Sqlite(tmp_path)
    saved(backend, *history("run-a"))
    url = f"sqlite:///{backend.path}"
    missing = cli("--store", url, "runs", "rekey", env={"DURABLE_AGENT_KEYS": ""})
    assert missing.returncode == 2 and missing.stderr.startswith("durable-agent: error: DURABLE_AGENT_KEYS is not set")
    assert "Traceback" not in missing.stderr

    dropped = cli("--store", url, "runs", "rekey", env=keys_env("k2"))  # k1 is not in the ring: nothing opens
    assert dropped.returncode == 1, dropped.stderr
    assert "7 row(s) could not be opened" in dropped.stdout and "key id 'k1', not in this keyring" in dropped.stdout
    assert load(backend, "run-a") == history("run-a")[-1]  # left as they were

    saved(backend, *history("run-b"), keyring=None)
    strict = cli("--store", url, "runs", "rekey", "--strict", env=keys_env("k1"))
    assert strict.returncode == 1 and "stored in plaintext" in strict.stdout
    assert envelope_key_id(backend.get("run-b", 0)) is None

    nowhere = cli("--store", f"sqlite:///{tmp_path}/none.db", "runs", "rekey", env=keys_env("k1"))
    assert nowhere.returncode == 3


def test_cli_rekey_shows_a_progress_line_per_batch_on_a_terminal(tmp_path: Path) -> None:
    from cli_kit import cli_on_terminal

    backend = Sqlite(tmp_path)
    saved(backend, *history("run-a"))
    code, output = cli_on_terminal("--store", f"sqlite:///{backend.path}", "runs", "rekey", "--batch-size", "3",
                                   env=keys_env("k2", "k1"))
    assert code == 0, output
    lines = [line for line in output.replace("\x1b[K", "").split("\r") if line.startswith("batch ")]
    assert lines[0] == "batch 1: 1 row(s) examined, 1 rewritten"  # the header rows, then messages, then steps
    assert lines[-1] == f"batch {len(lines)}: 7 row(s) examined, 7 rewritten" and len(lines) > 2
    assert "rekeyed to key 'k2'" in output


def rekey_killed_mid_way(path: Path, table: str, column: str, *opened: str) -> None:
    """``durable-agent <opened> runs rekey --batch-size 1`` (keys k2, k1) on the SQLite file `path`, SIGKILLed once
    10 values of `table`.`column` are under k2 and others still under k1: each is then a whole envelope of one key
    or the other; the rerun exits 0 and leaves no value under k1 there."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from cli_kit import ROOT, cli

    def under(key_id: str) -> int:
        with sqlite3.connect(path) as conn:
            header = f"enc1t.{key_id}.".encode()  # the start of a text or binary envelope (a BLOB: compare bytes)
            row = conn.execute(f"SELECT count(*) FROM {table} WHERE substr(CAST({column} AS BLOB), 1, ?) = ?",
                               (len(header), header))
            return int(row.fetchone()[0])

    rows = under("k1")
    environ = {**os.environ, **keys_env("k2", "k1"), "PYTHONPATH": str(ROOT / "python")}
    process = subprocess.Popen([sys.executable, "-m", "durable_agent.cli", *opened, "runs", "rekey", "--batch-size", "1"],
                               env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while under("k2") < 10 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    assert 10 <= under("k2") and under("k1") > 0  # killed mid-way: some rows rewritten, others not yet
    assert under("k1") + under("k2") == rows  # every value is a whole envelope of one key or the other

    rerun = cli(*opened, "--json", "runs", "rekey", env=keys_env("k2", "k1"))
    assert rerun.returncode == 0, rerun.stderr
    assert '"refused":0' in rerun.stdout and '"rewritten":0' not in rerun.stdout
    assert under("k1") == 0


def test_cli_rekey_killed_mid_way_is_finished_by_running_it_again(tmp_path: Path) -> None:
    """A rekey SIGKILLed between (or inside) its one-row batches leaves every row whole, under k1 or k2; the rerun
    rewrites what is left, and then a ring without k1 loads every run."""
    backend = Sqlite(tmp_path)
    store = backend.store()
    runs = {f"run-{i:04}": make_checkpoint(f"run-{i:04}", 1, conversation(2)) for i in range(1000)}
    for checkpoint in runs.values():
        store.save(checkpoint)
    store.close()
    rekey_killed_mid_way(backend.path, "durable_agent_runs", "header", "--store", f"sqlite:///{backend.path}")
    store = backend.store(K2_ONLY)
    assert {run_id: store.load(run_id) for run_id in runs} == runs
    store.close()
    assert b"enc1t.k1." not in backend.raw()
