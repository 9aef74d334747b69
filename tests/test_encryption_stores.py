"""Encryption at rest in the checkpoint stores (`encryption=keyring`), on the real backends.

Each backend is driven through its own raw access (the SQLite file with its -wal, the JSONL file, Postgres
rows read with SQL, Redis values read raw, the Durable Object fake's entries): a marker placed in every kind
of stored data never appears there while the store loads it back exactly; a row copied to another run or
row, a wrong or unknown key, a flipped byte or a truncated row is a `DecryptionError` naming the run and the
row, and the other runs stay loadable; rotation, and a plaintext database opened with a keyring.
Postgres and Redis run under `scripts/services` (they skip without it, as their store suites do).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from durable_agent import AgentCheckpoint, ConfigurationError
from durable_agent.encryption import DecryptionError, Keyring, envelope_key_id
from durable_agent.testing import CheckpointStoreConformance, conversation, make_checkpoint
from durable_object_fake import FakeDurableObjectStorage
from test_encryption import MARK, marked

pytestmark = pytest.mark.host_only("opens SQLite files, service connections and needs cryptography")
pytest.importorskip("cryptography")

K1, K2 = bytes(range(32)), bytes(range(1, 33))
RING = Keyring({"k1": K1}, primary="k1")
HEADER = "header"  # the row name of a run's header in the backends' get/put


# -- the backends, each with its raw access --------------------------------------------------------------------


class Backend:
    """A store factory and raw access to what it stored: `raw()` every stored byte; `get`/`put` one row
    (a message by its seq, or `HEADER`) as the text the store wrote."""

    def store(self, keyring: Keyring | None = RING) -> Any:
        raise NotImplementedError

    def raw(self) -> bytes:
        raise NotImplementedError

    def get(self, run_id: str, row: int | str) -> Any:
        raise NotImplementedError

    def put(self, run_id: str, row: int | str, value: Any) -> None:
        raise NotImplementedError


class SqlBackend(Backend):
    def _sql(self, query: str, params: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def get(self, run_id: str, row: int | str) -> Any:
        if row == HEADER:
            return self._sql("SELECT header FROM durable_agent_runs WHERE run_id = ?", (run_id,))[0][0]
        return self._sql("SELECT body FROM durable_agent_messages WHERE run_id = ? AND seq = ?", (run_id, row))[0][0]

    def put(self, run_id: str, row: int | str, value: Any) -> None:
        if row == HEADER:
            self._sql("UPDATE durable_agent_runs SET header = ? WHERE run_id = ?", (value, run_id))
        else:
            self._sql("UPDATE durable_agent_messages SET body = ? WHERE run_id = ? AND seq = ?", (value, run_id, row))


class Sqlite(SqlBackend):
    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "runs.db"

    def store(self, keyring: Keyring | None = RING) -> Any:
        from durable_agent.backends.sqlite import SqliteCheckpointStore

        return SqliteCheckpointStore(self.path, encryption=keyring)

    def raw(self) -> bytes:
        return b"".join(Path(f"{self.path}{end}").read_bytes() for end in ("", "-wal", "-shm")
                        if Path(f"{self.path}{end}").exists())

    def _sql(self, query: str, params: tuple[Any, ...]) -> list[Any]:
        import sqlite3

        with sqlite3.connect(self.path) as conn:
            return conn.execute(query, params).fetchall()


class Postgres(SqlBackend):
    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo

    def store(self, keyring: Keyring | None = RING) -> Any:
        from durable_agent.backends.postgres import PostgresCheckpointStore

        return PostgresCheckpointStore(self.conninfo, max_size=1, encryption=keyring)

    def _sql(self, query: str, params: tuple[Any, ...]) -> list[Any]:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            cur = conn.execute(query.replace("?", "%s"), params)
            return cur.fetchall() if cur.description else []

    def raw(self) -> bytes:
        rows = [row for table in ("durable_agent_runs", "durable_agent_messages", "durable_agent_step_log")
                for row in self._sql(f"SELECT * FROM {table}", ())]
        return repr(rows).encode()


class Redis(Backend):
    def __init__(self, url: str, prefix: str) -> None:
        import redis

        self.url, self.prefix = url, prefix
        self.client: Any = redis.Redis.from_url(url)

    def store(self, keyring: Keyring | None = RING) -> Any:
        from durable_agent.backends.redis import RedisCheckpointStore

        return RedisCheckpointStore(self.url, prefix=self.prefix, encryption=keyring)

    def raw(self) -> bytes:
        values: list[bytes] = []
        for key in self.client.scan_iter(match=self.prefix + "*"):
            kind = self.client.type(key)
            if kind == b"hash":
                values += [b"%s=%s" % pair for pair in self.client.hgetall(key).items()]
            elif kind == b"list":
                values += self.client.lrange(key, 0, -1)
            elif kind == b"zset":
                values += self.client.zrange(key, 0, -1)
            else:
                values.append(self.client.get(key))
        return b"\n".join(values)

    def get(self, run_id: str, row: int | str) -> str:
        if row == HEADER:
            return bytes(self.client.hget(f"{self.prefix}run:{run_id}", "header")).decode()
        return bytes(self.client.lindex(f"{self.prefix}msgs:{run_id}", int(row))).decode()

    def put(self, run_id: str, row: int | str, value: str) -> None:
        if row == HEADER:
            self.client.hset(f"{self.prefix}run:{run_id}", "header", value)
        else:
            self.client.lset(f"{self.prefix}msgs:{run_id}", int(row), value)


class DurableObject(Backend):
    def __init__(self) -> None:
        self.storage = FakeDurableObjectStorage()

    def store(self, keyring: Keyring | None = RING) -> Any:
        from durable_agent.backends.durable_object import DurableObjectCheckpointStore

        return DurableObjectCheckpointStore(self.storage, encryption=keyring)

    def raw(self) -> bytes:
        return "\n".join(f"{k}={v}" for k, v in self.storage.kv.data.items()).encode()

    def _key(self, run_id: str, row: int | str) -> str:
        tag = "h0000000000" if row == HEADER else f"m{row:010d}"
        return f"checkpoint:data:{len(run_id)}:{run_id}:{tag}.0000/0001"

    def get(self, run_id: str, row: int | str) -> str:
        return str(self.storage.kv.data[self._key(run_id, row)])

    def put(self, run_id: str, row: int | str, value: str) -> None:
        self.storage.kv.data[self._key(run_id, row)] = value


class Jsonl(Backend):
    """Rows are values inside save lines: `get`/`put` find the line holding message `seq` (or the run's last)."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "runs.jsonl"

    def store(self, keyring: Keyring | None = RING) -> Any:
        from durable_agent.backends.jsonl import JsonlCheckpointStore

        return JsonlCheckpointStore(self.path, encryption=keyring)

    def raw(self) -> bytes:
        return self.path.read_bytes()

    def _find(self, records: list[dict[str, Any]], run_id: str, row: int | str) -> tuple[dict[str, Any], Any]:
        mine = [r for r in records if r["run_id"] == run_id]
        if row == HEADER:
            return mine[-1]["header"], "sealed"
        for record in mine:
            if record["keep"] <= int(row) < record["keep"] + len(record["messages"]):
                return record["messages"], int(row) - record["keep"]
        raise AssertionError(f"no line holds message {row} of {run_id}")

    def get(self, run_id: str, row: int | str) -> str:
        records = [json.loads(line) for line in self.path.read_text().splitlines()]
        holder, at = self._find(records, run_id, row)
        return str(holder[at])

    def put(self, run_id: str, row: int | str, value: str) -> None:
        """An edit of the file's bytes in place (a value of the same length keeps every line where it was)."""
        old = json.dumps(self.get(run_id, row)).encode()
        data = self.path.read_bytes()
        assert data.count(old) == 1
        self.path.write_bytes(data.replace(old, json.dumps(value).encode()))


BACKENDS = ["sqlite", "jsonl", "durable_object", "postgres", "redis"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    name = request.param
    if name == "sqlite":
        yield Sqlite(tmp_path)
    elif name == "jsonl":
        yield Jsonl(tmp_path)
    elif name == "durable_object":
        yield DurableObject()
    elif name == "postgres":
        from durable_agent.testing.services import postgres_schema

        with postgres_schema("e") as conninfo:
            yield Postgres(conninfo)
    else:
        with redis_backend() as redis:
            yield redis


@contextmanager
def redis_backend() -> Iterator[Redis]:
    """A `Redis` backend under a fresh key prefix, its keys deleted afterwards."""
    from durable_agent.testing.services import REDIS_URL_VAR, service_url

    redis = Redis(service_url(REDIS_URL_VAR, "Redis"), f"e{secrets.token_hex(5)}:")
    try:
        yield redis
    finally:
        keys = list(redis.client.scan_iter(match=redis.prefix + "*"))
        if keys:
            redis.client.delete(*keys)
        redis.client.close()


def closing(store: Any) -> Any:
    store.close()
    return store


def saved(backend: Backend, *checkpoints: AgentCheckpoint, keyring: Keyring | None = RING) -> None:
    store = backend.store(keyring)
    for checkpoint in checkpoints:
        store.save(checkpoint)
    store.close()


def load(backend: Backend, run_id: str, keyring: Keyring | None = RING, step: int | None = None) -> Any:
    """`run_id` loaded by a fresh handle (nothing cached), closed after."""
    store = backend.store(keyring)
    try:
        return store.load(run_id) if step is None else store.load_step(run_id, step)
    finally:
        store.close()


# -- what is stored ---------------------------------------------------------------------------------------------


def test_every_kind_of_data_is_absent_from_the_raw_bytes_and_loads_back_exactly(backend: Backend) -> None:
    first, second = marked("run-a", 0), marked("run-a", 1)
    saved(backend, first, second, marked("run-b", 1))  # a first save, then an append
    raw = backend.raw()
    assert b"run-a" in raw and MARK.encode() not in raw
    assert load(backend, "run-a") == second and load(backend, "run-b") == marked("run-b", 1)
    assert load(backend, "run-a", step=0) == first
    store = backend.store()
    assert sorted(store.list()) == ["run-a", "run-b"] and store.list(status="suspended") == ["run-a", "run-b"]
    store.close()


def test_without_a_keyring_the_same_data_is_stored_in_plaintext(backend: Backend) -> None:
    """The control of the test above: its raw read does see what a store writes in plaintext."""
    saved(backend, marked("run-a", 1), keyring=None)
    assert backend.raw().count(MARK.encode()) >= 5  # (JSON escapes nothing in the marker)
    assert load(backend, "run-a", None) == marked("run-a", 1)


def test_every_row_is_an_envelope_of_the_primary_key(backend: Backend) -> None:
    saved(backend, make_checkpoint("r", 1, conversation(4), pending=True))
    assert [envelope_key_id(backend.get("r", row)) for row in (HEADER, 0, 1, 2, 3)] == ["k1"] * 5


# -- refused: copied, damaged, keys ---------------------------------------------------------------------------


def two_runs(backend: Backend) -> None:
    saved(backend, make_checkpoint("run-a", 2, conversation(3)), make_checkpoint("run-b", 2, conversation(3)))


@pytest.mark.parametrize(("source", "target", "place"), [
    (("run-a", 0), ("run-b", 0), ("checkpoint-message", "run-b", 0)),  # another run
    (("run-b", 0), ("run-b", 1), ("checkpoint-message", "run-b", 1)),  # another row of the run
    (("run-a", HEADER), ("run-b", HEADER), ("checkpoint-header", "run-b", 2)),
])
def test_a_row_copied_to_another_run_or_row_is_refused(
    backend: Backend, source: tuple[str, int | str], target: tuple[str, int | str], place: tuple[Any, ...]
) -> None:
    two_runs(backend)
    backend.put(*target, backend.get(*source))
    with pytest.raises(DecryptionError) as caught:
        load(backend, "run-b")
    assert caught.value.place == place and "not authentic" in str(caught.value) and "run-b" in str(caught.value)
    assert load(backend, "run-a") == make_checkpoint("run-a", 2, conversation(3))


def flipped(value: Any) -> Any:
    """`value` (a text or binary envelope) with its middle character or byte changed."""
    i = len(value) // 2
    if isinstance(value, bytes):
        return value[:i] + bytes([value[i] ^ 1]) + value[i + 1 :]
    return value[:i] + ("A" if value[i] != "A" else "B") + value[i + 1 :]


@pytest.mark.parametrize("damage", [flipped, lambda v: v[:-8], lambda v: v[:30]], ids=["flipped", "truncated", "cut"])
@pytest.mark.parametrize("row", [HEADER, 1])
def test_a_damaged_row_is_refused_naming_its_place_and_other_runs_load(
    backend: Backend, damage: Callable[[str], str], row: int | str
) -> None:
    two_runs(backend)
    backend.put("run-b", row, damage(backend.get("run-b", row)))
    with pytest.raises(DecryptionError) as caught:
        load(backend, "run-b")
    assert caught.value.place[1:] == ("run-b", 2 if row == HEADER else 1)
    assert load(backend, "run-a") == make_checkpoint("run-a", 2, conversation(3))


def test_a_wrong_key_or_an_unknown_key_id_is_refused_without_naming_the_key(backend: Backend) -> None:
    two_runs(backend)
    with pytest.raises(DecryptionError) as wrong:
        load(backend, "run-b", Keyring({"k1": K2}, primary="k1"))  # the same id, another key
    with pytest.raises(DecryptionError) as unknown:
        load(backend, "run-b", Keyring({"k2": K2}, primary="k2"))
    assert "not authentic" in str(wrong.value) and "key id 'k1', not in this keyring" in str(unknown.value)
    for error in (wrong.value, unknown.value):
        assert error.place[1] == "run-b" and K1.hex() not in str(error) and K2.hex() not in str(error)


def test_a_save_after_a_refused_load_replaces_the_damaged_row(backend: Backend) -> None:
    """A load that cannot open a row makes the store forget its view of the run, so its next save re-reads
    the rows and rewrites from the damaged one instead of appending after it."""
    store = backend.store()
    store.save(make_checkpoint("run-a", 1, conversation(3)))
    backend.put("run-a", 1, flipped(backend.get("run-a", 1)))
    with pytest.raises(DecryptionError):
        store.load("run-a")
    store.save(make_checkpoint("run-a", 2, conversation(4)))
    store.close()
    assert load(backend, "run-a") == make_checkpoint("run-a", 2, conversation(4))


# -- rotation and plaintext --------------------------------------------------------------------------------------


def test_after_a_new_primary_old_rows_load_and_new_writes_use_the_primary(backend: Backend) -> None:
    saved(backend, make_checkpoint("run-a", 1, conversation(2)))
    rotated = Keyring({"k2": K2, "k1": K1}, primary="k2")
    assert load(backend, "run-a", rotated) == make_checkpoint("run-a", 1, conversation(2))
    saved(backend, make_checkpoint("run-a", 2, conversation(3)), make_checkpoint("run-b", 1), keyring=rotated)
    assert [envelope_key_id(backend.get("run-a", row)) for row in (0, 1, 2, HEADER)] == ["k1", "k1", "k2", "k2"]
    assert envelope_key_id(backend.get("run-b", 0)) == "k2"
    assert load(backend, "run-a", rotated) == make_checkpoint("run-a", 2, conversation(3))
    with pytest.raises(DecryptionError, match="key id 'k2', not in this keyring"):
        load(backend, "run-a")  # the old ring alone cannot read the new rows


def test_a_plaintext_store_opened_with_a_keyring_loads_its_rows_and_seals_new_ones(backend: Backend) -> None:
    saved(backend, make_checkpoint("run-a", 1, conversation(2)), keyring=None)
    assert load(backend, "run-a") == make_checkpoint("run-a", 1, conversation(2))
    saved(backend, make_checkpoint("run-a", 2, conversation(3)))
    assert [envelope_key_id(backend.get("run-a", row)) for row in (0, 1, 2)] == [None, None, "k1"]
    assert load(backend, "run-a") == make_checkpoint("run-a", 2, conversation(3))
    assert load(backend, "run-a", step=1) == make_checkpoint("run-a", 1, conversation(2))  # a plaintext step


def test_encryption_must_be_a_keyring(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"must be a durable_agent\.encryption\.Keyring"):
        Sqlite(tmp_path).store(os.urandom(32))  # type: ignore[arg-type]  # the mistake under test


def test_sqlite_keeps_message_rows_as_binary_envelopes_and_reads_text_ones_stored_before(tmp_path: Path) -> None:
    """SQLite's message rows are binary envelopes (no base64 to decode on load); a text envelope written before
    still loads, and the next save leaves it as it is (it is still the message)."""
    backend = Sqlite(tmp_path)
    saved(backend, make_checkpoint("run-a", 2, conversation(3)))
    bodies = [backend.get("run-a", seq) for seq in range(3)]
    assert all(isinstance(body, bytes) and body.startswith(b"enc1t.k1.") for body in bodies)
    text = RING.seal(RING.open(bodies[1], ("checkpoint-message", "run-a", 1)), ("checkpoint-message", "run-a", 1))
    backend.put("run-a", 1, text)  # as a store before binary envelopes wrote it
    assert load(backend, "run-a") == make_checkpoint("run-a", 2, conversation(3))
    saved(backend, make_checkpoint("run-a", 3, conversation(4)))
    assert load(backend, "run-a") == make_checkpoint("run-a", 3, conversation(4))
    assert backend.get("run-a", 1) == text and isinstance(backend.get("run-a", 3), bytes)


def test_open_store_passes_encryption_on(tmp_path: Path) -> None:
    from durable_agent.backends import open_store

    store = open_store(f"sqlite:///{tmp_path}/runs.db", encryption=RING)
    store.save(marked("r", 1))
    store.close()
    assert MARK.encode() not in Sqlite(tmp_path).raw() and load(Sqlite(tmp_path), "r") == marked("r", 1)


# -- the whole store surface, encrypted -------------------------------------------------------------------------


class TestEncryptedSqlite(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Callable[[], Any]:
        return lambda: Sqlite(tmp_path).store()


class TestEncryptedJsonl(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Callable[[], Any]:
        return lambda: Jsonl(tmp_path).store()


class TestEncryptedDurableObject(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self) -> Callable[[], Any]:
        backend = DurableObject()
        return lambda: backend.store()


def test_the_async_sqlite_store_seals_the_saves_it_merges_into_one_commit(tmp_path: Path) -> None:
    """`AsyncSqliteCheckpointStore` writes concurrent saves together (`MergeableSave`): sealed as the others."""
    import asyncio

    from durable_agent.backends import open_store

    async def main() -> None:
        store = open_store(f"sqlite+async:///{tmp_path}/runs.db", encryption=RING)
        for step in (0, 1):  # a first save of each run, then an append to each
            await asyncio.gather(*(store.save(marked(f"run-{i}", step)) for i in range(20)))
        assert [await store.load(f"run-{i}") for i in range(20)] == [marked(f"run-{i}", 1) for i in range(20)]
        await store.close()

    asyncio.run(main())
    backend = Sqlite(tmp_path)
    assert MARK.encode() not in backend.raw() and load(backend, "run-7") == marked("run-7", 1)
    assert {envelope_key_id(backend.get(f"run-{i}", row)) for i in range(20) for row in (HEADER, 0, 2)} == {"k1"}


class TestEncryptedAsyncPostgres(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self) -> Iterator[Callable[[], Any]]:
        from durable_agent.backends.postgres import AsyncPostgresCheckpointStore
        from durable_agent.testing.services import postgres_schema

        with postgres_schema("e") as conninfo:
            yield lambda: AsyncPostgresCheckpointStore(conninfo, max_size=2, encryption=RING)


class TestEncryptedAsyncRedis(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self) -> Iterator[Callable[[], Any]]:
        from durable_agent.backends.redis import AsyncRedisCheckpointStore

        with redis_backend() as redis:
            yield lambda: AsyncRedisCheckpointStore(redis.url, prefix=redis.prefix, encryption=RING)
