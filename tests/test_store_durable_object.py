"""DurableObjectCheckpointStore against a stand-in Durable Object storage that enforces the real limits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from durable_agent import CheckpointCorruptError, CodecError, ConfigurationError
from durable_agent.backends.durable_object import MAX_ENTRY_BYTES, DurableObjectCheckpointStore
from durable_agent.testing import CheckpointStoreConformance, conversation, make_checkpoint, message
from durable_object_fake import ENTRY_LIMIT, FakeDurableObjectStorage


class TestDurableObjectStore(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self) -> Callable[[], DurableObjectCheckpointStore]:
        storage = FakeDurableObjectStorage()
        return lambda: DurableObjectCheckpointStore(storage)


def test_the_default_limit_is_the_one_of_the_real_storage() -> None:
    assert MAX_ENTRY_BYTES == ENTRY_LIMIT == 2 * 1024 * 1024


def test_a_5_mb_history_is_stored_within_the_entry_limit_and_appended_to() -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectCheckpointStore(storage)
    history = [
        *conversation(4),
        {"role": "tool", "content": [{"type": "text", "text": "é" * 1_600_000}]},  # 3.2 MB in UTF-8: one message
        *({"role": "user", "content": "x" * 100_000 + str(i)} for i in range(20)),  # 2 MB more
        {"role": "user", "content": [{"type": "file", "media_type": "application/octet-stream",
                                      "data": bytes(range(256)) * 1000}]},
    ]
    checkpoint = make_checkpoint("big", 1, history)
    store.save(checkpoint)
    stored = sum(len(k.encode()) + len(v.encode()) for k, v in storage.kv.data.items())
    assert stored > 5_000_000 and storage.kv.largest_entry <= ENTRY_LIMIT
    assert DurableObjectCheckpointStore(storage).load("big") == checkpoint  # a fresh handle: no cache
    writes = storage.kv.writes
    grown = make_checkpoint("big", 2, [*history, message(99)])
    store.save(grown)
    assert storage.kv.writes - writes == 4  # the new message, the header, the index entry, the step log
    assert DurableObjectCheckpointStore(storage).load("big") == grown
    rewritten = make_checkpoint("big", 3, conversation(2))
    DurableObjectCheckpointStore(storage).save(rewritten)  # shrunk by a handle that never saw the run
    assert store.load("big") == rewritten
    assert len(storage.kv.data) == 2 + 1 + 1 + 1  # two messages, one header part, the index entry, step 3
    assert store.load_step("big", 3) == rewritten and store.load_step("big", 1) is None


@pytest.mark.parametrize("text", ["ab" * 9000, "é" * 9000, "\U0001f600" * 5000, "a" + "€" * 7000])
def test_a_split_never_cuts_a_character(text: str) -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectCheckpointStore(storage, max_entry_bytes=8192)
    checkpoint = make_checkpoint("r", 1, [{"role": "user", "content": text}])
    store.save(checkpoint)
    assert sum(1 for k in storage.kv.data if ":m" in k) > 1  # it was split
    assert DurableObjectCheckpointStore(storage, max_entry_bytes=8192).load("r") == checkpoint


def test_runs_of_two_prefixes_do_not_mix() -> None:
    storage = FakeDurableObjectStorage()
    a, b = DurableObjectCheckpointStore(storage, prefix="a:"), DurableObjectCheckpointStore(storage, prefix="b:")
    a.save(make_checkpoint("r", 1, conversation(2)))
    assert b.load("r") is None and b.list() == [] and a.list() == ["r"]


def test_run_ids_that_extend_each_other_keep_their_data_apart() -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectCheckpointStore(storage)
    store.save(make_checkpoint("a", 1, conversation(3)))
    store.save(make_checkpoint("a:m0000000000", 1, conversation(1)))
    store.delete("a:m0000000000")
    assert DurableObjectCheckpointStore(storage).load("a") == make_checkpoint("a", 1, conversation(3))


def test_a_save_that_fails_midway_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectCheckpointStore(storage)
    first = make_checkpoint("r", 1, conversation(3))
    store.save(first)
    before = dict(storage.kv.data)
    put = storage.kv.put
    calls = {"n": 0}

    def failing_put(key: str, value: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("the object was reset")
        put(key, value)

    monkeypatch.setattr(storage.kv, "put", failing_put)
    with pytest.raises(RuntimeError, match="reset"):
        store.save(make_checkpoint("r", 2, conversation(8)))
    assert storage.kv.data == before
    monkeypatch.undo()
    latest = make_checkpoint("r", 3, conversation(9))
    store.save(latest)
    assert DurableObjectCheckpointStore(storage).load("r") == latest


def test_unencodable_checkpoints_write_nothing() -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectCheckpointStore(storage)
    with pytest.raises(CodecError):
        store.save(make_checkpoint("r", 1, [{"role": "user", "content": [{"type": "text", "text": {1, 2}}]}]))
    assert storage.kv.writes == 0


def _first(storage: FakeDurableObjectStorage, marker: str) -> str:
    return next(k for k in sorted(storage.kv.data) if marker in k)


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda s: s.kv.put("checkpoint:run:bad", "not json"), "index entry is unreadable"),
        (lambda s: s.kv.put("checkpoint:run:bad", '{"s":"running"}'), "index entry is unreadable"),
        (lambda s: s.kv.delete(_first(s, "bad:m0000000001")), "out of place"),
        (lambda s: s.kv.delete(max(k for k in s.kv.data if "bad:m" in k)), "holds 2"),
        (lambda s: s.kv.put(_first(s, "bad:m0000000001").replace("m0000000001", "m0000000007"), "{}"), "out of place"),
        (lambda s: s.kv.put(_first(s, "bad:h"), "garbage"), "header"),
        (lambda s: s.kv.put(_first(s, "bad:m0000000002"), '{"role":'), "message 2"),
        (lambda s: s.kv.put("checkpoint:data:3:bad:stray", "x"), "not part of a checkpoint"),
    ],
)
def test_damage_is_corruption_of_its_run_only_and_a_save_heals_it(
    damage: Callable[[FakeDurableObjectStorage], Any], match: str
) -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectCheckpointStore(storage)
    store.save(make_checkpoint("bad", 1, conversation(3), created_at=5))
    good = make_checkpoint("good", 1, conversation(2), created_at=5)
    store.save(good)
    damage(storage)
    with pytest.raises(CheckpointCorruptError, match=match) as caught:
        store.load("bad")
    assert caught.value.run_id == "bad"
    assert store.load("good") == good
    assert "good" in store.list()
    healed = make_checkpoint("bad", 2, conversation(4))
    store.save(healed)
    assert DurableObjectCheckpointStore(storage).load("bad") == healed
    assert store.prune(before=10) == ["good"]


def test_a_damaged_index_entry_is_skipped_by_list_and_prune(caplog: pytest.LogCaptureFixture) -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectCheckpointStore(storage)
    for run_id in ("a", "b"):
        store.save(make_checkpoint(run_id, 1, conversation(1), created_at=5))
    storage.kv.put("checkpoint:run:b", "[]")
    assert store.list() == ["a"] and store.prune(before=10) == ["a"]
    assert "damaged index entry" in caplog.text


def test_a_storage_without_the_kv_api_and_bad_options_are_refused_clearly() -> None:
    class LegacyKvBackedStorage:  # a Durable Object class declared under new_classes, not new_sqlite_classes
        async def get(self, key: str) -> Any:
            return None

    with pytest.raises(ConfigurationError, match="new_sqlite_classes"):
        DurableObjectCheckpointStore(LegacyKvBackedStorage())
    for options in ({"prefix": ""}, {"prefix": 3}, {"max_entry_bytes": 100}, {"cache_runs": -1}):
        with pytest.raises(ConfigurationError):
            DurableObjectCheckpointStore(FakeDurableObjectStorage(), **options)
