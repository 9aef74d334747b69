"""`AsyncDurableObjectCheckpointStore` with a keyring: the Durable Object store where WebCrypto is the only AES-GCM.

Runs on CPython (the keyring's async pair on `cryptography`) and under Pyodide in Node (WebCrypto,
``crypto.subtle``, with no `cryptography`), against the Durable Object storage double
(tests/durable_object_fake.py). The two faces write the same entries: the vector file
tests/vectors/durable_object_store.json holds what the synchronous store wrote with `cryptography`
(fixed nonces), and every implementation must write exactly those entries through the async face and
load them back; where `cryptography` exists, the synchronous store reads what the async face wrote.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_agent import AgentCheckpoint, CheckpointConflictError
from durable_agent.backends.durable_object import (
    AsyncDurableObjectCheckpointStore,
    DurableObjectCheckpointStore,
)
from durable_agent.encryption import DecryptionError, Keyring, envelope_key_id, rekey_async
from durable_agent.testing import CheckpointStoreConformance, conversation, make_checkpoint, message
from durable_object_fake import FakeDurableObjectStorage
from test_encryption import (
    IMPLEMENTATIONS,
    K1,
    K2,
    MARK,
    Implementation,
    marked,
    needs_sync_pair,
    unusable,
    usable,
)

VECTOR_FILE = Path(__file__).parent / "vectors" / "durable_object_store.json"
PREFIX = "checkpoint:"


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request: Any) -> Implementation:
    """Each AES-GCM implementation the async face can use here (WebCrypto: under Pyodide only)."""
    return usable(request)


def ring(implementation: Implementation, *, ids: tuple[str, ...] = ("k1",), primary: str = "k1", **kw: Any) -> Keyring:
    keys = {"k1": K1, "k2": K2}
    return Keyring({key_id: keys[key_id] for key_id in ids}, primary=primary, implementation=implementation, **kw)


def counting_nonces() -> Callable[[], bytes]:
    """Nonces 1, 2, 3... (for the vectors only: a fixed nonce sequence makes the envelopes reproducible)."""
    counter = itertools.count(1)
    return lambda: next(counter).to_bytes(12, "big")


def entry_key(run_id: str, row: int | str) -> str:
    tag = "h0000000000" if row == "header" else f"m{row:010d}"
    return f"{PREFIX}data:{len(run_id)}:{run_id}:{tag}.0000/0001"


def flipped(value: str) -> str:
    i = len(value) // 2
    return value[:i] + ("A" if value[i] != "A" else "B") + value[i + 1 :]


async def fresh_load(storage: FakeDurableObjectStorage, keyring: Keyring | None, run_id: str) -> Any:
    """`run_id` loaded by a new async handle (nothing cached)."""
    async with AsyncDurableObjectCheckpointStore(storage, encryption=keyring) as store:
        return await store.load(run_id)


# -- the vectors: the two faces write the same entries ------------------------------------------------------------


def vector_saves() -> list[AgentCheckpoint]:
    """The saves of the vector file, in order: a first save, an append, a second run."""
    return [
        make_checkpoint("run-v", 1, conversation(2), pending=True),
        make_checkpoint("run-v", 3, conversation(4), status="completed"),
        make_checkpoint("run-w", 0, [message(0)]),
    ]


def normalized(storage: FakeDurableObjectStorage) -> dict[str, Any]:
    """The stored entries, each index entry's random revision replaced by 0."""
    data = dict(storage.kv.data)
    for key, value in data.items():
        if key.startswith(f"{PREFIX}run:"):
            data[key] = json.dumps({**json.loads(value), "v": 0}, separators=(",", ":"))
    return data


def test_the_vector_file_is_what_the_sync_store_writes() -> None:
    """The vectors come from the synchronous store (`cryptography`): regenerate the file with this function's
    `written` if the layout ever changes on purpose."""
    if unusable("cryptography") is not None:
        pytest.skip(str(unusable("cryptography")))
    storage = FakeDurableObjectStorage()
    store = DurableObjectCheckpointStore(storage, encryption=ring("cryptography", nonce_source=counting_nonces()))
    for checkpoint in vector_saves():
        store.save(checkpoint)
    written = normalized(storage)
    assert written == json.loads(VECTOR_FILE.read_text(encoding="utf-8"))["entries"]
    assert {envelope_key_id(value) for key, value in written.items() if ":data:" in key} == {"k1"}


async def test_the_async_face_writes_exactly_the_vector_entries(implementation: Implementation) -> None:
    """Byte for byte what the synchronous store writes: what either face writes, the other reads."""
    storage = FakeDurableObjectStorage()
    keyring = ring(implementation, nonce_source=counting_nonces())
    async with AsyncDurableObjectCheckpointStore(storage, encryption=keyring) as store:
        for checkpoint in vector_saves():
            await store.save(checkpoint)
    assert normalized(storage) == json.loads(VECTOR_FILE.read_text(encoding="utf-8"))["entries"]


async def test_the_async_face_loads_the_vector_entries(implementation: Implementation) -> None:
    storage = FakeDurableObjectStorage()
    storage.kv.data.update(json.loads(VECTOR_FILE.read_text(encoding="utf-8"))["entries"])
    first, latest, other = vector_saves()
    async with AsyncDurableObjectCheckpointStore(storage, encryption=ring(implementation)) as store:
        assert await store.load("run-v") == latest and await store.load("run-w") == other
        assert await store.load_step("run-v", 1) == first
        assert await store.list() == ["run-v", "run-w"] and await store.list(status="completed") == ["run-v"]


# -- sealed, loaded back, refused -----------------------------------------------------------------------------------


async def test_every_kind_of_data_is_sealed_and_loads_back_exactly(implementation: Implementation) -> None:
    storage = FakeDurableObjectStorage()
    keyring = ring(implementation)
    async with AsyncDurableObjectCheckpointStore(storage, encryption=keyring) as store:
        for checkpoint in (marked("run-a", 0), marked("run-a", 1), marked("run-b", 1)):  # a save, an append
            await store.save(checkpoint)
        assert await store.load("run-a") == marked("run-a", 1)  # from its cache's view
    raw = "\n".join(f"{key}={value}" for key, value in storage.kv.data.items())
    assert "run-a" in raw and MARK not in raw
    sealed = [value for key, value in storage.kv.data.items() if ":data:" in key]
    assert len(sealed) == 2 * (1 + 3) and {envelope_key_id(value) for value in sealed} == {"k1"}
    assert await fresh_load(storage, keyring, "run-a") == marked("run-a", 1)
    async with AsyncDurableObjectCheckpointStore(storage, encryption=keyring) as store:
        assert await store.load_step("run-a", 0) == marked("run-a", 0)
        await store.save(make_checkpoint("run-a", 2, conversation(2)))  # a rewrite, by a handle that never saw it
        assert await fresh_load(storage, keyring, "run-a") == make_checkpoint("run-a", 2, conversation(2))


async def test_without_a_keyring_the_same_data_is_stored_in_plaintext() -> None:
    """The control of the test above: the raw read does see what a store writes in plaintext."""
    storage = FakeDurableObjectStorage()
    async with AsyncDurableObjectCheckpointStore(storage) as store:
        await store.save(marked("run-a", 1))
    assert "\n".join(map(str, storage.kv.data.values())).count(MARK) >= 5
    assert await fresh_load(storage, None, "run-a") == marked("run-a", 1)


async def two_runs(implementation: Implementation) -> FakeDurableObjectStorage:
    storage = FakeDurableObjectStorage()
    async with AsyncDurableObjectCheckpointStore(storage, encryption=ring(implementation)) as store:
        await store.save(make_checkpoint("run-a", 2, conversation(3)))
        await store.save(make_checkpoint("run-b", 2, conversation(3)))
    return storage


@pytest.mark.parametrize(("source", "target", "place"), [
    (("run-a", 0), ("run-b", 0), ("checkpoint-message", "run-b", 0)),  # another run
    (("run-b", 0), ("run-b", 1), ("checkpoint-message", "run-b", 1)),  # another row of the run
    (("run-a", "header"), ("run-b", "header"), ("checkpoint-header", "run-b", 2)),
])
async def test_a_value_copied_to_another_run_or_row_is_refused_naming_its_place(
    implementation: Implementation, source: tuple[str, int | str], target: tuple[str, int | str],
    place: tuple[Any, ...],
) -> None:
    storage = await two_runs(implementation)
    storage.kv.data[entry_key(*target)] = storage.kv.data[entry_key(*source)]
    with pytest.raises(DecryptionError) as caught:
        await fresh_load(storage, ring(implementation), "run-b")
    assert caught.value.place == place and "not authentic" in str(caught.value) and "run-b" in str(caught.value)
    assert await fresh_load(storage, ring(implementation), "run-a") == make_checkpoint("run-a", 2, conversation(3))


@pytest.mark.parametrize("row", ["header", 1])
async def test_a_flipped_byte_is_refused_naming_its_place(implementation: Implementation, row: int | str) -> None:
    storage = await two_runs(implementation)
    storage.kv.data[entry_key("run-b", row)] = flipped(storage.kv.data[entry_key("run-b", row)])
    with pytest.raises(DecryptionError) as caught:
        await fresh_load(storage, ring(implementation), "run-b")
    kind = "checkpoint-header" if row == "header" else "checkpoint-message"
    assert caught.value.place == (kind, "run-b", 2 if row == "header" else 1)
    assert await fresh_load(storage, ring(implementation), "run-a") == make_checkpoint("run-a", 2, conversation(3))


async def test_a_wrong_key_or_an_unknown_key_id_is_refused_without_naming_the_key(
    implementation: Implementation,
) -> None:
    storage = await two_runs(implementation)
    wrong = Keyring({"k1": K2}, primary="k1", implementation=implementation)  # the same id, another key
    with pytest.raises(DecryptionError) as refused:
        await fresh_load(storage, wrong, "run-b")
    with pytest.raises(DecryptionError) as unknown:
        await fresh_load(storage, ring(implementation, ids=("k2",), primary="k2"), "run-b")
    assert "not authentic" in str(refused.value) and "key id 'k1', not in this keyring" in str(unknown.value)
    for error in (refused.value, unknown.value):
        assert error.place[1] == "run-b" and K1.hex() not in str(error) and K2.hex() not in str(error)


async def test_a_save_after_a_refused_load_replaces_the_damaged_row(implementation: Implementation) -> None:
    storage = FakeDurableObjectStorage()
    async with AsyncDurableObjectCheckpointStore(storage, encryption=ring(implementation)) as store:
        await store.save(make_checkpoint("run-a", 1, conversation(3)))
        storage.kv.data[entry_key("run-a", 1)] = flipped(storage.kv.data[entry_key("run-a", 1)])
        with pytest.raises(DecryptionError):
            await store.load("run-a")
        await store.save(make_checkpoint("run-a", 2, conversation(4)))
    assert await fresh_load(storage, ring(implementation), "run-a") == make_checkpoint("run-a", 2, conversation(4))


# -- rotation -----------------------------------------------------------------------------------------------------


async def test_rotation_then_rekey_leaves_every_entry_under_the_new_key(implementation: Implementation) -> None:
    storage = FakeDurableObjectStorage()
    async with AsyncDurableObjectCheckpointStore(storage, encryption=ring(implementation)) as store:
        await store.save(make_checkpoint("run-a", 1, conversation(2)))
        await store.save(make_checkpoint("run-b", 1, conversation(2)))
    rotated = ring(implementation, ids=("k2", "k1"), primary="k2")
    async with AsyncDurableObjectCheckpointStore(storage, encryption=rotated) as store:
        assert await store.load("run-a") == make_checkpoint("run-a", 1, conversation(2))  # old rows open
        await store.save(make_checkpoint("run-a", 2, conversation(3)))  # new writes use the primary
    ids = [envelope_key_id(storage.kv.data[entry_key("run-a", row)]) for row in (0, 1, 2, "header")]
    assert ids == ["k1", "k1", "k2", "k2"]
    async with AsyncDurableObjectCheckpointStore(storage, encryption=rotated) as store:
        report = await rekey_async(store, rotated, batch_size=1)
    # run-a: messages 0, 1 and step 1's log entry under k1 (message 2, its header and step 2's entry are current);
    # run-b: its 2 messages, header and step log entry; a batch per run, then the empty one that ends the walk
    assert report.complete and (report.rewritten, report.current, report.batches) == (3 + 4, 3, 3)
    assert {envelope_key_id(value) for key, value in storage.kv.data.items() if ":data:" in key} == {"k2"}
    new_only = ring(implementation, ids=("k2",), primary="k2", strict=True)
    assert await fresh_load(storage, new_only, "run-a") == make_checkpoint("run-a", 2, conversation(3))
    assert await fresh_load(storage, new_only, "run-b") == make_checkpoint("run-b", 1, conversation(2))
    async with AsyncDurableObjectCheckpointStore(storage, encryption=new_only) as store:
        assert await store.load_step("run-a", 1) == make_checkpoint("run-a", 1, conversation(2))
        assert (await rekey_async(store, new_only)).rewritten == 0  # a rerun finds every row current


async def test_a_plaintext_store_is_sealed_in_place_by_rekey(implementation: Implementation) -> None:
    storage = FakeDurableObjectStorage()
    async with AsyncDurableObjectCheckpointStore(storage) as store:
        await store.save(marked("run-a", 1))
    keyring = ring(implementation)
    async with AsyncDurableObjectCheckpointStore(storage, encryption=keyring) as store:
        assert (await rekey_async(store, keyring)).complete
    assert MARK not in "\n".join(map(str, storage.kv.data.values()))
    assert await fresh_load(storage, ring(implementation, strict=True), "run-a") == marked("run-a", 1)


# -- another request runs while a save awaits the keyring ------------------------------------------------------------


class HoppingKeyring(Keyring):
    """A keyring whose every async seal and open yields to the event loop first, as a WebCrypto promise does:
    other tasks (another request to the Durable Object) run in between, whatever the implementation."""

    async def seal_async(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0)
        return await super().seal_async(*args, **kwargs)

    async def open_async(self, value: object, place: Any) -> str | bytes:
        await asyncio.sleep(0)
        return await super().open_async(value, place)


def hopping(implementation: Implementation) -> Keyring:
    return HoppingKeyring({"k1": K1}, primary="k1", implementation=implementation)


@pytest.mark.parametrize("handles", [1, 2], ids=["one-handle", "two-handles"])
async def test_saves_interleaved_while_sealing_store_the_latest_whole(
    implementation: Implementation, handles: int
) -> None:
    """A save that extends the run and one that rewrites it, their sealing interleaved: the run stored is the
    checkpoint saved last, never the rewrite with the other save's extra message after it."""
    storage = FakeDurableObjectStorage()
    stores = [AsyncDurableObjectCheckpointStore(storage, encryption=hopping(implementation)) for _ in range(handles)]
    await stores[0].save(make_checkpoint("run", 2, conversation(3)))
    await stores[-1].load("run")
    extended = make_checkpoint("run", 3, conversation(5))
    rewritten = make_checkpoint("run", 3, [*conversation(2), {"role": "user", "content": "instead"}])
    finished: list[AgentCheckpoint] = []

    async def save(store: AsyncDurableObjectCheckpointStore, checkpoint: AgentCheckpoint) -> None:
        await store.save(checkpoint)
        finished.append(checkpoint)

    await asyncio.gather(save(stores[0], extended), save(stores[-1], rewritten))
    assert len(finished) == 2
    assert await fresh_load(storage, ring(implementation), "run") == finished[-1]
    assert (await stores[0].load("run")) == finished[-1]


async def test_the_expected_step_guard_holds_across_an_await(implementation: Implementation) -> None:
    """Two saves expecting step 2, their sealing interleaved: one is stored, the other is a conflict."""
    storage = FakeDurableObjectStorage()
    store = AsyncDurableObjectCheckpointStore(storage, encryption=hopping(implementation))
    await store.save(make_checkpoint("run", 2, conversation(3)))
    first, second = make_checkpoint("run", 3, conversation(4)), make_checkpoint("run", 3, conversation(5))
    outcomes: list[Any] = []

    async def save(checkpoint: AgentCheckpoint) -> None:
        try:
            await store.save(checkpoint, expected_step_index=2)
            outcomes.append(checkpoint)
        except CheckpointConflictError as exc:
            outcomes.append(exc)

    await asyncio.gather(save(first), save(second))
    stored = [outcome for outcome in outcomes if isinstance(outcome, AgentCheckpoint)]
    conflicts = [outcome for outcome in outcomes if isinstance(outcome, CheckpointConflictError)]
    assert len(stored) == 1 and len(conflicts) == 1
    assert await fresh_load(storage, ring(implementation), "run") == stored[0]


async def test_a_rekey_leaves_a_run_saved_while_it_sealed_to_the_save(implementation: Implementation) -> None:
    storage = FakeDurableObjectStorage()
    old = ring(implementation)
    async with AsyncDurableObjectCheckpointStore(storage, encryption=old) as store:
        await store.save(make_checkpoint("run", 1, conversation(2)))
    rotated = HoppingKeyring({"k2": K2, "k1": K1}, primary="k2", implementation=implementation)
    rekeying = AsyncDurableObjectCheckpointStore(storage, encryption=rotated)
    writer = AsyncDurableObjectCheckpointStore(storage, encryption=old)  # a server not yet switched

    async def save_meanwhile() -> None:
        await asyncio.sleep(0)
        await writer.save(make_checkpoint("run", 2, conversation(3)))

    report, _ = await asyncio.gather(rekey_async(rekeying, rotated), save_meanwhile())
    assert report.changed == 4 and report.rewritten == 0 and not report.complete
    assert await fresh_load(storage, old, "run") == make_checkpoint("run", 2, conversation(3))
    assert (await rekey_async(rekeying, rotated)).complete  # a rerun finishes it


# -- CPython: both faces on one storage ----------------------------------------------------------------------------


@needs_sync_pair
async def test_the_sync_store_and_the_async_face_read_each_others_runs() -> None:
    storage = FakeDurableObjectStorage()
    keyring = ring("cryptography")
    sync_store = DurableObjectCheckpointStore(storage, encryption=keyring)
    async_store = AsyncDurableObjectCheckpointStore(storage, encryption=keyring)
    sync_store.save(marked("by-sync", 0))
    await async_store.save(marked("by-async", 0))
    assert await async_store.load("by-sync") == marked("by-sync", 0)
    assert sync_store.load("by-async") == marked("by-async", 0)
    await async_store.save(marked("by-sync", 1))  # each appends to the other's run
    sync_store.save(marked("by-async", 1))
    assert sync_store.load("by-sync") == marked("by-sync", 1) and sync_store.load_step("by-sync", 0) == marked(
        "by-sync", 0
    )
    assert await async_store.load("by-async") == marked("by-async", 1)
    assert MARK not in "\n".join(map(str, storage.kv.data.values()))


def skip_without_a_blocking_loop() -> None:
    """The conformance suite runs an async store on an event loop of its own (`StoreCalls`); under Pyodide that
    loop blocks on JS promises, which needs stack switching (JSPI)."""
    if sys.platform == "emscripten":
        from pyodide.ffi import can_run_sync

        if not can_run_sync():
            pytest.skip("the conformance suite's own event loop needs stack switching (JSPI) under Pyodide")


class TestAsyncDurableObjectStore(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self) -> Callable[[], AsyncDurableObjectCheckpointStore]:
        skip_without_a_blocking_loop()
        storage = FakeDurableObjectStorage()
        return lambda: AsyncDurableObjectCheckpointStore(storage)


class TestEncryptedAsyncDurableObjectStore(CheckpointStoreConformance):
    """The whole store surface, encrypted: on `cryptography` under CPython, on WebCrypto under Pyodide."""

    @pytest.fixture
    def make_store(self) -> Callable[[], AsyncDurableObjectCheckpointStore]:
        skip_without_a_blocking_loop()
        implementation: Implementation = "webcrypto" if sys.platform == "emscripten" else "cryptography"
        reason = unusable(implementation)
        if reason is not None:
            pytest.skip(reason)
        storage, keyring = FakeDurableObjectStorage(), ring(implementation)
        return lambda: AsyncDurableObjectCheckpointStore(storage, encryption=keyring)
