"""The Cloudflare Worker's Python parts (pyodide/worker/src), against a stand-in Durable Object.

workerd cannot run offline here (it downloads its Pyodide bundle at start), so the Worker's
service and entry point run against `FakeDurableObjectStorage` (tests/durable_object_fake.py),
which enforces the real storage's limits. The store itself, `durable_agent.backends.durable_object`,
is tested in tests/test_store_durable_object.py.

Pure Python: runs under CPython and under Pyodide (the project's Pyodide runner).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

WORKER_SRC = Path(__file__).resolve().parent.parent / "pyodide" / "worker" / "src"
sys.path.insert(0, str(WORKER_SRC))

import agent_service  # noqa: E402

from durable_agent import (  # noqa: E402
    ApprovalSigner,
    ConfigurationError,
    ScriptedModel,
    call,
    content_parts,
    reply,
)
from durable_agent.backends.durable_object import AsyncDurableObjectCheckpointStore  # noqa: E402
from durable_agent.encryption import DecryptionError, Keyring  # noqa: E402
from durable_object_fake import FakeDurableObjectStorage  # noqa: E402

SECRET = "a-test-secret-of-at-least-32-bytes!!"


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
        parked = await AsyncDurableObjectCheckpointStore(storage).load("r2")
        assert parked is not None and parked.pending_approvals
        token = forged.sign(parked.pending_approvals[0], run_id="r2")
    verdict = {"approvals": [{"approval_id": pending["approval_id"], "approved": True, "token": token}]}
    status, done = await service(storage).handle("POST", "/runs/r2/approvals", json.dumps(verdict))
    assert status == 200 and done["status"] == "completed"
    assert storage.kv.get("refund:A-1001") is None  # the refund never ran
    stored = await service(storage).store.load("r2")
    assert stored is not None
    results = [p for m in stored.messages if m["role"] == "tool" for p in content_parts(m)
               if p["type"] == "tool-result" and p["tool_name"] == "refund"]
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
    stored = await service(storage).store.load("r3")
    assert stored is not None and stored.status == "running" and stored.step_index == 0  # step 1 is stored, step 2 was lost
    assert storage.alarm == 1_000_000 + agent_service.HEAL_AFTER_MS  # the safety net is armed

    healed = await service(storage, model_factory=flaky_model).heal()
    assert [h["status"] for h in healed] == ["suspended"]
    assert storage.alarm is None
    lookups = [m for m in (await service(storage).store.load("r3")).messages if m["role"] == "tool"]
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

    vars(module).update(DurableObject=DurableObject, WorkerEntrypoint=WorkerEntrypoint, Response=Response)
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

    def idFromName(self, name: str) -> str:
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
    for name in ("entry", "agent_service"):
        monkeypatch.delitem(sys.modules, name, raising=False)

    def no_entropy(n: int) -> bytes:
        raise RuntimeError("entropy is not allowed at import time in Workers")

    monkeypatch.setattr(os, "urandom", no_entropy)
    import entry as module

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
    stored = await AsyncDurableObjectCheckpointStore(storage).load("r6")
    assert stored is not None and stored.status == "suspended"


KEYS_SECRET = "k1:" + base64.b64encode(bytes(range(32))).decode()  # the DURABLE_AGENT_KEYS secret
CRUSHED = "crushed-zq7"  # in the prompt only: found nowhere in storage when the object seals


def no_aes_gcm() -> str | None:
    """Why no AES-GCM runs here (None: one does): `cryptography`, or WebCrypto under Pyodide."""
    from test_encryption import unusable

    reasons = [unusable("cryptography"), unusable("webcrypto")]
    return None if None in reasons else "; ".join(str(r) for r in reasons)


async def test_with_durable_agent_keys_the_worker_keeps_its_runs_sealed(entry: Any) -> None:
    """With the DURABLE_AGENT_KEYS secret the object keeps its checkpoints and the prompt it may restart from
    sealed (WebCrypto in a Worker, `cryptography` here on CPython); the run goes on as without it."""
    if (reason := no_aes_gcm()) is not None:
        pytest.skip(reason)
    env = types.SimpleNamespace(APPROVAL_SECRET=SECRET, DURABLE_AGENT_KEYS=KEYS_SECRET)
    env.AGENT_RUN = FakeNamespace(entry.AgentRun, env)
    worker = entry.Default(None, env)
    started = await worker.fetch(FakeRequest("POST", "https://w.example/runs",
                                             json.dumps({"prompt": f"Refund A-1001, the parcel arrived {CRUSHED}"})))
    body = json.loads(started.body)
    assert started.status == 200 and body["status"] == "suspended", body
    run_id, (pending,) = body["run_id"], body["pending"]
    verdict = {"approvals": [{"approval_id": pending["approval_id"], "approved": True, "token": pending["token"]}]}
    done = await worker.fetch(FakeRequest("POST", f"https://w.example/runs/{run_id}/approvals", json.dumps(verdict)))
    assert json.loads(done.body)["text"] == "Done: 42.00 EUR refunded on order A-1001."

    (storage,) = env.AGENT_RUN.storages.values()
    values = [str(value) for _, value in storage.kv.list(prefix="")]
    assert values and not any(CRUSHED in value or pending["token"] in value for value in values)
    with pytest.raises(DecryptionError):  # what the object stored opens with the keyring only
        await AsyncDurableObjectCheckpointStore(storage).load(run_id)
    keyring = agent_service.keyring_from(env)
    assert keyring is not None and (await AsyncDurableObjectCheckpointStore(storage, encryption=keyring).load(run_id))


async def test_the_alarm_restarts_a_run_from_its_sealed_prompt(entry: Any) -> None:
    if (reason := no_aes_gcm()) is not None:
        pytest.skip(reason)
    env = types.SimpleNamespace(APPROVAL_SECRET=SECRET, DURABLE_AGENT_KEYS=KEYS_SECRET)
    keyring = agent_service.keyring_from(env)
    assert keyring is not None
    storage = FakeDurableObjectStorage()
    storage.kv.put("prompt:r7", await keyring.seal_async("Refund A-1001", ("worker-prompt", "r7")))
    await entry.AgentRun(types.SimpleNamespace(storage=storage), env).alarm()
    stored = await AsyncDurableObjectCheckpointStore(storage, encryption=keyring).load("r7")
    assert stored is not None and stored.status == "suspended"


def test_without_the_secret_the_worker_stores_in_plaintext() -> None:
    assert agent_service.keyring_from(types.SimpleNamespace()) is None
    k2 = base64.b64encode(bytes(range(1, 33))).decode()
    primary = agent_service.keyring_from(types.SimpleNamespace(DURABLE_AGENT_KEYS=f"k2:{k2},{KEYS_SECRET}",
                                                               DURABLE_AGENT_PRIMARY_KEY="k1"))
    assert isinstance(primary, Keyring) and primary.primary == "k1" and primary.key_ids == ("k2", "k1")


def test_the_scripted_model_is_deterministic() -> None:
    # The healing test relies on the n-th answer depending only on the history.
    model = agent_service.scripted_support_model()
    assert isinstance(model, ScriptedModel) and len(model._script) == 3  # type: ignore[arg-type]
    assert callable(reply) and callable(call)  # the helpers the worker's script is written with


def test_the_worker_uses_the_packages_openai_adapter_over_fetch_when_a_key_is_set() -> None:
    from durable_agent.providers import FetchTransport, OpenAIChatModel

    assert agent_service.model_factory_from(types.SimpleNamespace()) is agent_service.scripted_support_model
    env = types.SimpleNamespace(OPENAI_API_KEY="sk-w", OPENAI_BASE_URL="https://llm.example/v1", OPENAI_MODEL="m-1")
    model = agent_service.model_factory_from(env)()
    assert isinstance(model, OpenAIChatModel) and isinstance(model._transport, FetchTransport)
    assert (model.model, model.base_url, model.api_key) == ("m-1", "https://llm.example/v1", "sk-w")
