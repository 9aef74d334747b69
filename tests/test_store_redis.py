"""RedisCheckpointStore against a real server: conformance, corruption, stale writers, lost connections.

Run under `scripts/services run -- ...` (sets DURABLE_AGENT_TEST_REDIS_URL).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from durable_agent import CheckpointCorruptError, ConfigurationError
from durable_agent.testing import (
    CheckpointStoreConformance,
    conversation,
    hammer_one_run,
    make_checkpoint,
    message,
)
from durable_agent.testing.services import REDIS_URL_VAR, service_url
from store_kit import BlockingStore

pytestmark = pytest.mark.host_only("needs a Redis server and redis-py")


@pytest.fixture
def url() -> str:
    return service_url(REDIS_URL_VAR, "Redis")


@pytest.fixture
def prefix(url: str) -> Iterator[str]:
    """A fresh key prefix per test; its keys are deleted afterwards."""
    import redis

    prefix = f"t{secrets.token_hex(5)}:"
    yield prefix
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)
    client.close()


class TestRedisStore(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self, url: str, prefix: str) -> Callable[[], Any]:
        from durable_agent.backends.redis import RedisCheckpointStore

        return lambda: RedisCheckpointStore(url, prefix=prefix)


class TestAsyncRedisStore(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self, url: str, prefix: str) -> Callable[[], Any]:
        from durable_agent.backends.redis import AsyncRedisCheckpointStore

        return lambda: AsyncRedisCheckpointStore(url, prefix=prefix)


@pytest.fixture(params=["sync", "async"])
def Store(request: pytest.FixtureRequest) -> Callable[..., Any]:  # capitalised: it stands for a class
    """Each store class with a sync face: the rules of damage and healing hold for both."""
    from durable_agent.backends.redis import AsyncRedisCheckpointStore, RedisCheckpointStore

    if request.param == "sync":
        return RedisCheckpointStore
    return lambda *args, **kwargs: BlockingStore(AsyncRedisCheckpointStore(*args, **kwargs))


@pytest.fixture
def store(Store: Callable[..., Any], url: str, prefix: str) -> Iterator[Any]:
    with Store(url, prefix=prefix) as s:
        yield s


@pytest.fixture
def raw(url: str) -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(url)
    yield client
    client.close()


def test_a_save_appends_only_the_new_messages(store: Any, raw: Any, prefix: str) -> None:
    history = conversation(10)
    store.save(make_checkpoint("r", 1, history))
    raw.lset(f"{prefix}msgs:r", 0, b"sentinel")  # a save that rewrote the list would overwrite this
    store.save(make_checkpoint("r", 2, [*history, message(10)]))
    assert raw.llen(f"{prefix}msgs:r") == 11
    assert raw.lindex(f"{prefix}msgs:r", 0) == b"sentinel"


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda c, p: c.lset(f"{p}msgs:bad", 2, b"\xff\xfe"), "message 2 is not UTF-8"),
        (lambda c, p: c.lset(f"{p}msgs:bad", 1, b'{"role":'), "message 1 cannot be decoded"),
        (lambda c, p: c.rpop(f"{p}msgs:bad"), "header counts 5"),
        (lambda c, p: c.hset(f"{p}run:bad", "header", b"[]"), "header is not an object"),
        (lambda c, p: c.hset(f"{p}run:bad", "count", b"five"), "not numbers"),
        (lambda c, p: c.hdel(f"{p}run:bad", "header"), "header is missing"),
    ],
)
def test_corrupt_data_raises_a_typed_error_naming_the_run(
    store: Any, raw: Any, prefix: str, damage: Callable[[Any, str], Any], match: str
) -> None:
    store.save(make_checkpoint("bad", 2, conversation(5)))
    good = make_checkpoint("good", 1, conversation(3))
    store.save(good)
    damage(raw, prefix)
    with pytest.raises(CheckpointCorruptError, match=match) as caught:
        store.load("bad")
    assert caught.value.run_id == "bad"
    assert store.load("good") == good
    healed = make_checkpoint("bad", 3, conversation(6))
    store.save(healed)
    assert store.load("bad") == healed


def test_a_lost_connection_heals_on_the_next_save(store: Any, raw: Any) -> None:
    import redis

    history = conversation(4)
    store.save(make_checkpoint("r", 1, history))
    for client in raw.client_list():
        if client.get("name") != "keeper" and int(client["id"]) != raw.client_id():
            raw.client_kill_filter(_id=client["id"])
    history = [*history, message(4)]
    try:  # the sync pool checks a connection before use and reconnects; the async pool may hand out
        store.save(make_checkpoint("r", 2, history))  # the dropped one once (the save fails, nothing half-done)
    except redis.ConnectionError:
        pass
    history = [*history, message(5)]
    store.save(make_checkpoint("r", 3, history))  # the script ran once or not: no gap, no duplicate
    assert store.load("r") == make_checkpoint("r", 3, history)


def test_concurrent_writers_of_one_run_retry_on_stale(url: str, prefix: str, raw: Any) -> None:
    from durable_agent.backends.redis import RedisCheckpointStore

    stores = [RedisCheckpointStore(url, prefix=prefix) for _ in range(3)]
    try:
        loaded = hammer_one_run(stores, steps=30)
    finally:
        for s in stores:
            s.close()
    assert raw.llen(f"{prefix}msgs:hot") == len(loaded.messages)


def test_exactly_one_of_url_or_client(url: str) -> None:
    from durable_agent.backends.redis import RedisCheckpointStore

    with pytest.raises(ConfigurationError):
        RedisCheckpointStore()
    with pytest.raises(ConfigurationError):
        RedisCheckpointStore(url, client=object())


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda c, p: c.zadd(f"{p}runs", {b"\xff\xfe": 0}), id="index-member-not-utf8"),
        pytest.param(lambda c, p: c.hset(f"{p}run:bad", "created_at", b"--5"), id="created-at-not-a-number"),
        pytest.param(lambda c, p: c.hset(f"{p}run:bad", "status", b"\xff"), id="status-not-utf8"),
        pytest.param(lambda c, p: (c.delete(f"{p}run:bad"), c.set(f"{p}run:bad", b"x")), id="header-wrong-type"),
    ],
)
def test_one_damaged_run_does_not_break_list_and_prune(
    store: Any, raw: Any, prefix: str, damage: Callable[[Any, str], Any], caplog: pytest.LogCaptureFixture
) -> None:
    for run_id in ("a", "bad", "c"):
        store.save(make_checkpoint(run_id, 1, conversation(2), created_at=5))
    damage(raw, prefix)
    assert set(store.list()) - {"bad"} == {"a", "c"}
    assert [r for r in store.prune(before=10) if r != "bad"] == ["a", "c"]  # "bad" is fine in one case
    assert "damaged" in caplog.text


@pytest.mark.parametrize("key", ["run", "msgs"])
def test_a_key_of_the_wrong_type_is_corruption_of_its_run_and_a_save_replaces_it(
    store: Any, raw: Any, prefix: str, key: str
) -> None:
    store.save(make_checkpoint("bad", 1, conversation(3)))
    other = make_checkpoint("other", 1, conversation(2))
    store.save(other)
    raw.delete(f"{prefix}{key}:bad")
    raw.sadd(f"{prefix}{key}:bad", b"member")
    with pytest.raises(CheckpointCorruptError, match="another type") as caught:
        store.load("bad")
    assert caught.value.run_id == "bad"
    assert store.load("other") == other
    healed = make_checkpoint("bad", 2, conversation(4))
    store.save(healed)
    assert store.load("bad") == healed


@pytest.mark.parametrize("replace", [
    lambda raw, key: (raw.delete(key), raw.set(key, b"not a list")),  # another type: the save used to drop it...
    lambda raw, key: raw.ltrim(key, 0, 0),  # ...or a list cut short: and append after what was left
], ids=["another-type", "cut-short"])
def test_a_message_list_damaged_behind_a_trusting_cache_fails_the_save_as_corruption_and_the_next_heals(
    store: Any, raw: Any, prefix: str, replace: Callable[[Any, str], Any]
) -> None:
    """The save used to succeed, and the run then loaded as the new messages alone (a silently
    different history)."""
    store.save(make_checkpoint("r", 1, conversation(3)))
    replace(raw, f"{prefix}msgs:r")
    with pytest.raises(CheckpointCorruptError, match="message list") as caught:
        store.save(make_checkpoint("r", 2, conversation(4)))
    assert caught.value.run_id == "r"
    with pytest.raises(CheckpointCorruptError):
        store.load("r")  # still the damage, not a history nobody saved
    latest = make_checkpoint("r", 3, conversation(5))
    store.save(latest)
    assert store.load("r") == latest
    assert raw.llen(f"{prefix}msgs:r") == 5


@pytest.mark.parametrize("revision", [b"abc", b"\xff", b"-1"])
def test_a_damaged_revision_field_is_healed_not_retried_forever(
    Store: Callable[..., Any], url: str, prefix: str, raw: Any, revision: bytes
) -> None:
    with Store(url, prefix=prefix) as writer:
        writer.save(make_checkpoint("r", 1, conversation(2)))
    raw.hset(f"{prefix}run:r", "revision", revision)
    with Store(url, prefix=prefix) as handle:
        store = getattr(handle, "store", handle)  # the async store behind its sync face
        script, calls = store._save_script, {"n": 0}

        def counted(**kwargs: Any) -> Any:
            calls["n"] += 1
            assert calls["n"] <= 3, "the save keeps finding the run stale"
            return script(**kwargs)

        store._save_script = counted
        latest = make_checkpoint("r", 2, conversation(3))
        handle.save(latest)
        assert handle.load("r") == latest


def test_concurrent_async_writers_of_one_run_retry_on_stale(url: str, prefix: str, raw: Any) -> None:
    """Three async handles save one run at once on one event loop: each save lands whole."""
    import asyncio

    from durable_agent.backends.redis import AsyncRedisCheckpointStore, RedisCheckpointStore

    async def writer(i: int) -> None:
        async with AsyncRedisCheckpointStore(url, prefix=prefix) as store:
            for step in range(30):
                await store.save(make_checkpoint("hot", step, conversation((step * (i + 1)) % 9 + 1)))

    async def writers() -> None:
        await asyncio.gather(*(writer(i) for i in range(3)))

    asyncio.run(writers())
    with RedisCheckpointStore(url, prefix=prefix) as store:
        loaded = store.load("hot")
    assert loaded is not None and loaded.step_index == 29
    assert loaded.messages == conversation(len(loaded.messages))
    assert raw.llen(f"{prefix}msgs:hot") == len(loaded.messages)
