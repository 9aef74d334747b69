"""The Cloudflare Worker's Python parts (pyodide/worker/src), against a stand-in Durable Object.

workerd cannot run offline here (it downloads its Pyodide bundle at start), so the Worker's
store, service and entry point run against `FakeDurableObjectStorage`, shaped like the real
`ctx.storage` of a SQLite-backed Durable Object as Python sees it through Pyodide's bridge:

* `storage.kv` (`SyncKvStorage`): `get(key)` -> value or None (JS undefined), `put(key, value)`,
  `delete(key)` -> bool, `list(**options)` -> an iterator of `[key, value]` pairs in key order
  (UTF-8 byte order, i.e. code-point order), options `start`, `end`, `prefix`, `reverse`,
  `limit` (Python keyword arguments become the JS options object); key and value together at
  most 2 MB.
* `setAlarm(ms)`, `getAlarm()`, `deleteAlarm()`: awaitables (JS Promises).

Pure Python: runs under CPython and under Pyodide (the project's Pyodide runner).
"""

from __future__ import annotations

import json
import os
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

WORKER_SRC = Path(__file__).resolve().parent.parent / "pyodide" / "worker" / "src"
sys.path.insert(0, str(WORKER_SRC))

from durable_agent import (  # noqa: E402
    ApprovalSigner,
    ScriptedModel,
    deserialize_checkpoint,
    reply,
    call,
    serialize_checkpoint,
)
from durable_agent.errors import CheckpointCorruptError, CodecError, ConfigurationError  # noqa: E402
from durable_agent.testing import SessionStoreConformance, conversation, make_checkpoint  # noqa: E402

import agent_service  # noqa: E402
from do_store import MAX_ENTRY_BYTES, CheckpointTooLargeError, DurableObjectSessionStore  # noqa: E402

SECRET = "a-test-secret-of-at-least-32-bytes!!"


# ------------------------------------------------------------------------------------------------
# The stand-in for a Durable Object's storage
# ------------------------------------------------------------------------------------------------


class FakeSyncKv:
    """`ctx.storage.kv` of a SQLite-backed Durable Object."""

    LIST_OPTIONS = {"start", "end", "prefix", "reverse", "limit"}

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.writes = 0

    @staticmethod
    def _check_key(key: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"Durable Object keys are strings, got {type(key).__name__}")

    def get(self, key: str) -> Any:
        self._check_key(key)
        return self.data.get(key)

    def put(self, key: str, value: Any) -> None:
        self._check_key(key)
        if value is None:
            raise TypeError("undefined is not a storable value")
        size = len(key.encode("utf-8", "surrogatepass")) + (
            len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else len(json.dumps(value))
        )
        if size > MAX_ENTRY_BYTES:
            raise RuntimeError("Error: Values cannot be larger than 2097152 bytes (key and value combined).")
        self.data[key] = value
        self.writes += 1

    def delete(self, key: str) -> bool:
        self._check_key(key)
        return self.data.pop(key, None) is not None

    def list(self, **options: Any) -> Iterator[list[Any]]:
        unknown = set(options) - self.LIST_OPTIONS
        if unknown:
            raise TypeError(f"unknown list() options {sorted(unknown)}")
        order = lambda k: k.encode("utf-8", "surrogatepass")  # noqa: E731
        keys = sorted(self.data, key=order, reverse=bool(options.get("reverse")))
        prefix, start, end = options.get("prefix"), options.get("start"), options.get("end")
        picked = [
            k for k in keys
            if (prefix is None or k.startswith(prefix))
            and (start is None or order(k) >= order(start))
            and (end is None or order(k) < order(end))
        ]
        if options.get("limit") is not None:
            picked = picked[: options["limit"]]
        return iter([[k, self.data[k]] for k in picked])  # a JS iterator of [key, value] arrays


class FakeDurableObjectStorage:
    """`ctx.storage`: the synchronous KV API plus the (async) alarm API."""

    def __init__(self) -> None:
        self.kv = FakeSyncKv()
        self.alarm: int | None = None

    async def setAlarm(self, scheduled_ms: int) -> None:  # noqa: N802 (the JS name)
        self.alarm = int(scheduled_ms)

    async def getAlarm(self) -> int | None:  # noqa: N802
        return self.alarm

    async def deleteAlarm(self) -> None:  # noqa: N802
        self.alarm = None


# ------------------------------------------------------------------------------------------------
# The store
# ------------------------------------------------------------------------------------------------


class TestDurableObjectStore(SessionStoreConformance):
    @pytest.fixture
    def make_store(self) -> Callable[[], DurableObjectSessionStore]:
        storage = FakeDurableObjectStorage()
        return lambda: DurableObjectSessionStore(storage)


def test_the_entry_holds_the_codec_text_so_bytes_survive() -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectSessionStore(storage)
    history = [*conversation(3), {"role": "user", "content": [
        {"type": "file", "media_type": "application/octet-stream", "data": b"\x00\xff\x10 raw"}]}]
    checkpoint = make_checkpoint("run-1", 3, history)
    store.save(checkpoint)
    (key, value), = storage.kv.list(prefix="checkpoint:")
    header, body = value.split("\n", 1)
    assert key == "checkpoint:run-1"
    assert json.loads(header) == {"s": checkpoint.status, "i": 3, "t": checkpoint.created_at}
    assert body == serialize_checkpoint(checkpoint)
    loaded = store.load("run-1")
    assert loaded == checkpoint
    assert loaded.messages[-1]["content"][0]["data"] == b"\x00\xff\x10 raw"


def test_runs_of_two_prefixes_do_not_mix() -> None:
    storage = FakeDurableObjectStorage()
    a, b = DurableObjectSessionStore(storage, prefix="a:"), DurableObjectSessionStore(storage, prefix="b:")
    a.save(make_checkpoint("r", 1, conversation(2)))
    assert b.load("r") is None and b.list() == [] and a.list() == ["r"]


def test_a_checkpoint_too_large_for_one_entry_is_refused_and_the_stored_one_stays() -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectSessionStore(storage, max_entry_bytes=4_000)
    small = make_checkpoint("big", 1, conversation(2))
    store.save(small)
    with pytest.raises(CheckpointTooLargeError) as err:
        store.save(make_checkpoint("big", 2, [*conversation(2), {"role": "user", "content": "x" * 5_000}]))
    assert err.value.code == "checkpoint_too_large" and isinstance(err.value, ValueError)
    assert "4000" in str(err.value)
    assert store.load("big") == small


def test_the_default_limit_is_the_one_of_the_real_storage() -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectSessionStore(storage)
    just_over = make_checkpoint("r", 1, [{"role": "user", "content": "y" * MAX_ENTRY_BYTES}])
    with pytest.raises(CheckpointTooLargeError):
        store.save(just_over)
    assert storage.kv.writes == 0


def test_unencodable_checkpoints_write_nothing() -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectSessionStore(storage)
    with pytest.raises(CodecError):
        store.save(make_checkpoint("r", 1, [{"role": "user", "content": [{"type": "text", "text": {1, 2}}]}]))
    assert storage.kv.writes == 0


def test_a_damaged_entry_is_reported_as_corrupt() -> None:
    storage = FakeDurableObjectStorage()
    store = DurableObjectSessionStore(storage)
    storage.kv.put("checkpoint:r", "not a checkpoint")
    with pytest.raises(CheckpointCorruptError, match="'r'"):
        store.load("r")
    storage.kv.put("checkpoint:r", '{"s":"running"}\n{}')
    with pytest.raises(CheckpointCorruptError):
        store.list()


def test_a_storage_without_the_kv_api_is_refused_clearly() -> None:
    class LegacyKvBackedStorage:  # a Durable Object class declared under new_classes, not new_sqlite_classes
        async def get(self, key: str) -> Any:
            return None

    with pytest.raises(ConfigurationError, match="new_sqlite_classes"):
        DurableObjectSessionStore(LegacyKvBackedStorage())


# ------------------------------------------------------------------------------------------------
# The service the Durable Object runs
# ------------------------------------------------------------------------------------------------


def service(storage: FakeDurableObjectStorage, **kwargs: Any) -> agent_service.RunService:
    return agent_service.RunService(storage, secret=SECRET, clock=lambda: 1_000_000, **kwargs)


async def test_a_run_suspends_for_approval_then_a_signed_verdict_completes_it() -> None:
    storage = FakeDurableObjectStorage()
    status, started = await service(storage).handle("POST", "/runs/r1", json.dumps({"prompt": "Refund A-1001"}))
    assert status == 200 and started["status"] == "suspended"
    assert storage.alarm is None  # the leg ended: no healing needed
    (pending,) = started["pending"]
    assert pending["tool_name"] == "refund" and pending["input"] == {"order_id": "A-1001", "amount_cents": 4200}
    assert ApprovalSigner(SECRET).verify(pending["token"]) is not None
    assert storage.kv.get("refund:A-1001") is None

    # A later request: a new service over the same storage, as after the object was evicted.
    verdict = {"approvals": [{"approval_id": pending["approval_id"], "approved": True, "token": pending["token"]}]}
    status, done = await service(storage).handle("POST", "/runs/r1/approvals", json.dumps(verdict))
    assert status == 200 and done["status"] == "completed", done
    assert done["text"] == "Done: 42.00 EUR refunded on order A-1001."
    assert json.loads(storage.kv.get("refund:A-1001")) == {"amount_cents": 4200}
    status, shown = await service(storage).handle("GET", "/runs/r1", "")
    assert (status, shown) == (200, done)


@pytest.mark.parametrize("token", [None, "v1.forged.token", "wrong-secret"])
async def test_a_verdict_without_a_valid_token_is_a_denial(token: str | None) -> None:
    storage = FakeDurableObjectStorage()
    _, started = await service(storage).handle("POST", "/runs/r2", json.dumps({"prompt": "Refund A-1001"}))
    (pending,) = started["pending"]
    if token == "wrong-secret":
        forged = ApprovalSigner("another-secret-of-at-least-32-bytes!")
        token = forged.sign(deserialize_checkpoint(storage.kv.get("checkpoint:r2").split("\n", 1)[1])
                            .pending_approvals[0], run_id="r2")
    verdict = {"approvals": [{"approval_id": pending["approval_id"], "approved": True, "token": token}]}
    status, done = await service(storage).handle("POST", "/runs/r2/approvals", json.dumps(verdict))
    assert status == 200 and done["status"] == "completed"
    assert storage.kv.get("refund:A-1001") is None  # the refund never ran
    history = service(storage).store.load("r2").messages
    results = [p for m in history if m["role"] == "tool" for p in m["content"] if p.get("tool_name") == "refund"]
    assert results and results[0]["is_error"] is True


async def test_the_alarm_resumes_a_run_that_died_between_steps() -> None:
    storage = FakeDurableObjectStorage()
    calls = {"n": 0}

    def flaky_model() -> ScriptedModel:
        def answer(request: Any) -> Any:
            turn = sum(1 for m in request.messages if m["role"] == "assistant")
            calls["n"] += 1
            if turn == 1 and calls["n"] == 2:
                raise ConnectionError("the object was evicted mid-step")
            return agent_service.scripted_support_model()._script[turn]  # type: ignore[index]
        return ScriptedModel(answer)

    with pytest.raises(Exception, match="evicted"):
        await service(storage, model_factory=flaky_model).start("r3", "Refund A-1001")
    stored = service(storage).store.load("r3")
    assert stored.status == "running" and stored.step_index == 0  # step 1 is stored, step 2 was lost
    assert storage.alarm == 1_000_000 + agent_service.HEAL_AFTER_MS  # the safety net is armed

    healed = await service(storage, model_factory=flaky_model).heal()
    assert [h["status"] for h in healed] == ["suspended"]
    assert storage.alarm is None
    lookups = [m for m in service(storage).store.load("r3").messages if m["role"] == "tool"]
    assert len(lookups) == 1  # the finished lookup step was not run again


async def test_the_alarm_restarts_a_run_lost_in_its_first_step() -> None:
    storage = FakeDurableObjectStorage()
    storage.kv.put("prompt:r4", "Refund A-1001")  # start() wrote the prompt, then the object died
    healed = await service(storage).heal()
    assert [h["run_id"] for h in healed] == ["r4"] and healed[0]["status"] == "suspended"


async def test_bad_requests_get_clear_errors() -> None:
    storage = FakeDurableObjectStorage()
    svc = service(storage)
    assert (await svc.handle("GET", "/runs/nope", ""))[0] == 404
    assert (await svc.handle("GET", "/elsewhere", ""))[0] == 404
    assert (await svc.handle("POST", "/runs/r5", "{}"))[0] == 400
    assert (await svc.handle("POST", "/runs/r5", "not json"))[0] == 400
    assert (await svc.handle("POST", "/runs/r5/approvals", json.dumps({"approvals": [{"x": 1}]})))[0] == 400
    assert (await svc.handle("DELETE", "/runs/r5", ""))[0] == 405
    await svc.handle("POST", "/runs/r5", json.dumps({"prompt": "Refund A-1001"}))
    assert (await svc.handle("POST", "/runs/r5", json.dumps({"prompt": "again"})))[0] == 409


def test_a_missing_secret_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="APPROVAL_SECRET"):
        agent_service.RunService(FakeDurableObjectStorage(), secret=None)


# ------------------------------------------------------------------------------------------------
# The entry point, with a stand-in `workers` module and Durable Object namespace
# ------------------------------------------------------------------------------------------------


def fake_workers_module() -> types.ModuleType:
    module = types.ModuleType("workers")

    class DurableObject:
        def __init__(self, ctx: Any, env: Any) -> None:
            self.ctx = ctx
            self.env = env

    class WorkerEntrypoint:
        def __init__(self, ctx: Any, env: Any) -> None:
            self.ctx = ctx
            self.env = env

    class Response:
        def __init__(self, body: str, status: int = 200, headers: dict[str, str] | None = None) -> None:
            self.body, self.status, self.headers = body, status, headers or {}

    module.DurableObject, module.WorkerEntrypoint, module.Response = DurableObject, WorkerEntrypoint, Response
    return module


class FakeRequest:
    def __init__(self, method: str, url: str, body: str = "") -> None:
        self.method, self.url, self._body = method, url, body

    async def text(self) -> str:
        return self._body


class FakeNamespace:
    """`env.AGENT_RUN`: one object per name; RPC passes strings only; storage outlives instances."""

    def __init__(self, cls: Any, env: Any) -> None:
        self.cls, self.env = cls, env
        self.storages: dict[str, FakeDurableObjectStorage] = {}

    def idFromName(self, name: str) -> str:  # noqa: N802
        return f"id:{name}"

    def get(self, object_id: str) -> Any:
        storage = self.storages.setdefault(object_id, FakeDurableObjectStorage())
        instance = self.cls(types.SimpleNamespace(storage=storage), self.env)  # a fresh instance per call

        class Stub:
            async def handle(self, *args: Any) -> str:
                assert all(isinstance(a, str) for a in args), "RPC arguments here are strings"
                answer = await instance.handle(*args)
                assert isinstance(answer, str)
                return answer

        return Stub()


@pytest.fixture
def entry(monkeypatch: pytest.MonkeyPatch) -> Any:
    """entry.py imported fresh, with os.urandom failing as Workers make it fail at import time."""
    monkeypatch.setitem(sys.modules, "workers", fake_workers_module())
    for name in ("entry", "agent_service", "do_store"):
        monkeypatch.delitem(sys.modules, name, raising=False)

    def no_entropy(n: int) -> bytes:
        raise RuntimeError("entropy is not allowed at import time in Workers")

    monkeypatch.setattr(os, "urandom", no_entropy)
    import entry as module  # noqa: PLC0415

    monkeypatch.undo()  # back to normal: request handlers may use entropy
    yield module
    for name in ("entry",):
        sys.modules.pop(name, None)


async def test_the_worker_routes_a_run_through_its_durable_object(entry: Any) -> None:
    env = types.SimpleNamespace(APPROVAL_SECRET=SECRET)
    env.AGENT_RUN = FakeNamespace(entry.AgentRun, env)
    worker = entry.Default(None, env)

    started = await worker.fetch(FakeRequest("POST", "https://w.example/runs", json.dumps({"prompt": "Refund"})))
    body = json.loads(started.body)
    assert started.status == 200 and body["status"] == "suspended", body
    assert started.headers["content-type"] == "application/json"
    run_id, (pending,) = body["run_id"], body["pending"]
    assert list(env.AGENT_RUN.storages) == [f"id:{run_id}"]

    verdict = {"approvals": [{"approval_id": pending["approval_id"], "approved": True, "token": pending["token"]}]}
    done = await worker.fetch(FakeRequest("POST", f"https://w.example/runs/{run_id}/approvals", json.dumps(verdict)))
    assert done.status == 200 and json.loads(done.body)["status"] == "completed"
    shown = await worker.fetch(FakeRequest("GET", f"https://w.example/runs/{run_id}"))
    assert json.loads(shown.body)["text"] == "Done: 42.00 EUR refunded on order A-1001."
    assert (await worker.fetch(FakeRequest("GET", "https://w.example/"))).status == 404


async def test_the_worker_reports_a_missing_secret(entry: Any) -> None:
    env = types.SimpleNamespace()
    env.AGENT_RUN = FakeNamespace(entry.AgentRun, env)
    answer = await entry.Default(None, env).fetch(FakeRequest("POST", "https://w.example/runs", '{"prompt": "x"}'))
    assert answer.status == 500 and "APPROVAL_SECRET" in json.loads(answer.body)["error"]


async def test_the_alarm_handler_heals_through_the_entry_point(entry: Any) -> None:
    env = types.SimpleNamespace(APPROVAL_SECRET=SECRET)
    storage = FakeDurableObjectStorage()
    storage.kv.put("prompt:r6", "Refund A-1001")
    await entry.AgentRun(types.SimpleNamespace(storage=storage), env).alarm()
    assert json.loads(storage.kv.get("checkpoint:r6").split("\n", 1)[0])["s"] == "suspended"


def test_the_scripted_model_is_deterministic() -> None:
    # The healing test relies on the n-th answer depending only on the history.
    model = agent_service.scripted_support_model()
    assert isinstance(model, ScriptedModel) and len(model._script) == 3  # type: ignore[arg-type]
    assert reply and call  # the helpers the worker's script is written with


def test_the_worker_uses_the_packages_openai_adapter_over_fetch_when_a_key_is_set() -> None:
    from durable_agent.providers import FetchTransport, OpenAIChatModel

    assert agent_service.model_factory_from(types.SimpleNamespace()) is agent_service.scripted_support_model
    env = types.SimpleNamespace(OPENAI_API_KEY="sk-w", OPENAI_BASE_URL="https://llm.example/v1", OPENAI_MODEL="m-1")
    model = agent_service.model_factory_from(env)()
    assert isinstance(model, OpenAIChatModel) and isinstance(model._transport, FetchTransport)
    assert (model.model, model.base_url, model.api_key) == ("m-1", "https://llm.example/v1", "sk-w")
