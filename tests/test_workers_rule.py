"""The Cloudflare Python Workers rule: no entropy at import time.

In a Worker, `os.urandom` (and so `secrets`, `uuid.uuid4`, seeding `random`) raises at module top
level; it works only inside a request handler. These tests simulate that rule in-process, so they
run on CPython and under Pyodide (the Workers runtime) alike: every entropy source a Python
program reaches is patched to raise while the simulated "module scope" lasts, and to work again
inside `rule.request()`. With the rule in force, the package (every module of it, imported
afresh), the memory store, the codec and the signer import and build; the first entropy is
drawn when a run starts, to mint its run id.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import random
import re
import secrets
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import pytest

PACKAGE = "durable_agent"


class EntropyOutsideRequestError(OSError):
    """What the simulated rule raises: like `os.urandom` failing at a Worker's top level."""


class WorkersEntropyRule:
    """Entropy sources that raise (and are recorded) unless inside `request()`."""

    def __init__(self) -> None:
        self.in_request = False
        self.denied: list[str] = []

    def guard(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            self.check(name)
            return original(*args, **kwargs)

        guarded.__name__ = getattr(original, "__name__", name)
        return guarded

    def check(self, name: str) -> None:
        if not self.in_request:
            self.denied.append(name)
            raise EntropyOutsideRequestError(
                f"{name}: entropy is only available inside a request handler (simulated Workers rule)"
            )

    @contextmanager
    def request(self) -> Iterator[None]:
        """The inside of a request handler: entropy works."""
        self.in_request = True
        try:
            yield
        finally:
            self.in_request = False


@pytest.fixture
def rule(monkeypatch: pytest.MonkeyPatch) -> WorkersEntropyRule:
    """The Workers rule in force for the rest of the test (module scope until `rule.request()`)."""
    rule = WorkersEntropyRule()
    # Under Pyodide tracing is off by default: importing the OpenTelemetry API draws entropy (tracing.py).
    monkeypatch.setenv("DURABLE_AGENT_TRACING", "0")
    monkeypatch.setattr(os, "urandom", rule.guard("os.urandom", os.urandom))  # uuid4 reads it per call
    if hasattr(os, "getrandom"):
        monkeypatch.setattr(os, "getrandom", rule.guard("os.getrandom", os.getrandom))
    # random.SystemRandom (and so every `secrets` function) bound os.urandom at import time.
    monkeypatch.setattr(random, "_urandom", rule.guard("random.SystemRandom", random._urandom))  # type: ignore[attr-defined]
    # Seeding from the OS: random.Random() and random.seed() with no argument (C-level urandom).
    original_seed = random.Random.seed

    def seed(self: random.Random, a: Any = None, version: int = 2) -> None:
        if a is None:
            rule.check("random.Random.seed(None)")
        original_seed(self, a, version)

    monkeypatch.setattr(random.Random, "seed", seed)
    # The module-level functions share one generator seeded from the OS when `random` was imported.
    shared = random._inst
    for name in random.__all__:
        function = getattr(random, name)
        if getattr(function, "__self__", None) is shared:
            monkeypatch.setattr(random, name, rule.guard(f"random.{name}", function))
    monkeypatch.setattr(uuid, "uuid1", rule.guard("uuid.uuid1", uuid.uuid1))  # random clock sequence
    return rule


def _package_modules() -> dict[str, ModuleType]:
    return {n: m for n, m in sys.modules.items() if n == PACKAGE or n.startswith(PACKAGE + ".")}


@pytest.fixture
def fresh_package(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Forget every imported durable_agent module, so the test imports the package afresh.

    The native extension (`durable_agent_native`) stays imported: extension modules cannot be
    initialised twice. Afterwards the fresh modules are dropped and the originals put back.
    """
    for name in _package_modules():
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in _package_modules():
        del sys.modules[name]


# --- the simulation itself -----------------------------------------------------------------------


ENTROPY_SOURCES: dict[str, Callable[[], Any]] = {
    "os.urandom": lambda: os.urandom(16),
    "uuid.uuid4": uuid.uuid4,
    "uuid.uuid1": uuid.uuid1,
    "secrets.token_hex": secrets.token_hex,
    "secrets.randbelow": lambda: secrets.randbelow(10),
    "random.SystemRandom": lambda: random.SystemRandom().random(),
    "random.Random()": random.Random,
    "random.seed()": random.seed,
    "random.random": random.random,
    "random.choice": lambda: random.choice("abc"),
}


@pytest.mark.parametrize("source", list(ENTROPY_SOURCES))
def test_the_simulated_rule_denies_every_entropy_source_outside_a_request(
    rule: WorkersEntropyRule, source: str
) -> None:
    # Looked up at call time: the fixture has patched the modules by now.
    at_call_time: dict[str, Callable[[], Any]] = {
        "uuid.uuid4": lambda: uuid.uuid4(),
        "uuid.uuid1": lambda: uuid.uuid1(),
        "secrets.token_hex": lambda: secrets.token_hex(),
        "random.Random()": lambda: random.Random(),
        "random.seed()": lambda: random.seed(),
        "random.random": lambda: random.random(),
    }
    draw = at_call_time.get(source, ENTROPY_SOURCES[source])
    with pytest.raises(EntropyOutsideRequestError, match="simulated Workers rule"):
        draw()
    assert rule.denied
    with rule.request():
        draw()  # inside a request handler the same call works
    random.Random(42).random()  # an explicit seed is no entropy: allowed anywhere


# --- importing and building at module scope ------------------------------------------------------


def test_every_module_of_the_package_imports_without_entropy(rule: WorkersEntropyRule, fresh_package: None) -> None:
    import durable_agent

    failed: dict[str, str] = {}

    def not_importable(name: str) -> None:
        failed[name] = repr(sys.exc_info()[1])

    names = [PACKAGE]
    for info in pkgutil.walk_packages(durable_agent.__path__, PACKAGE + ".", onerror=not_importable):
        names.append(info.name)
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # noqa: BLE001 - every failure is reported below
            failed[info.name] = repr(exc)
    assert failed == {}, failed
    assert rule.denied == []
    # The walk found the package's parts, including the ones whose drivers are optional.
    for expected in ("durable_agent._checkpoint", "durable_agent.backends.memory", "durable_agent._signing",
                     "durable_agent.backends.sqlite", "durable_agent.backends.postgres",
                     "durable_agent.backends.jsonl", "durable_agent._loop"):
        assert expected in names, expected


def test_module_scope_code_of_a_worker_runs_without_entropy(rule: WorkersEntropyRule, fresh_package: None) -> None:
    """What a Worker's module does at top level: import, build the store, signer, model, agent."""
    import durable_agent as da
    from durable_agent.backends import decode, encode, open_store

    store = da.InMemoryCheckpointStore()
    assert isinstance(open_store("memory://"), da.InMemoryCheckpointStore)
    signer = da.ApprovalSigner(b"k" * 32)
    model = da.ScriptedModel(["hello"])
    agent = da.Agent(model=model, tools={})

    checkpoint = da.AgentCheckpoint(
        run_id="r-1", step_index=0, status="running", usage=da.Usage(), created_at=0,
        messages=[{"role": "user", "content": [{"type": "image", "data": b"\x00\xff", "media_type": "image/png"}]}],
    )
    text = da.serialize_checkpoint(checkpoint)
    assert da.deserialize_checkpoint(text) == checkpoint
    assert decode(encode({"$bytes": b"\x01"})) == {"$bytes": b"\x01"}
    store.save(checkpoint)
    assert store.load("r-1") == checkpoint
    assert (signer, agent) and rule.denied == []


def test_a_memory_runtime_can_be_built_at_module_scope(rule: WorkersEntropyRule, fresh_package: None) -> None:
    from durable_agent.backends.memory import MemoryRuntime

    MemoryRuntime()
    assert rule.denied == []


# --- entropy when a run starts -------------------------------------------------------------------


def _worker_scope() -> tuple[Any, Any, Any]:
    import durable_agent as da

    store = da.InMemoryCheckpointStore()
    model = da.ScriptedModel([da.reply("Adding.", da.call("add", {"a": 2, "b": 3})), "5"])
    tool = da.Tool(description="Add.", parameters={"type": "object"}, execute=lambda x: x["a"] + x["b"])
    return da, store, (model, {"add": tool})


async def test_a_run_draws_entropy_when_it_starts_and_not_before(
    rule: WorkersEntropyRule, fresh_package: None
) -> None:
    da, store, (model, tools) = _worker_scope()
    assert rule.denied == []  # importing and building drew nothing

    # Started at module scope, the run fails at once: minting its run id is its first entropy.
    with pytest.raises(EntropyOutsideRequestError):
        await da.generate_text(model=model, tools=tools, messages=[{"role": "user", "content": "2+3?"}],
                               store=store)
    assert rule.denied and store.list() == []

    # In a request handler the same call works and the run id is a fresh random one.
    with rule.request():
        result = await da.generate_text(model=model, tools=tools, messages=[{"role": "user", "content": "2+3?"}],
                                        store=store)
    assert result.text == "5"
    assert re.fullmatch(r"[0-9a-f]{32}", result.run_id or "")
    assert store.load(result.run_id).status == "completed"


async def test_a_run_with_its_ids_given_draws_no_entropy_at_all(rule: WorkersEntropyRule, fresh_package: None) -> None:
    da, store, (model, tools) = _worker_scope()
    ids = iter(f"id-{n}" for n in range(100))
    result = await da.generate_text(model=model, tools=tools, messages=[{"role": "user", "content": "2+3?"}],
                                    store=store, run_id="run-1", generate_id=lambda: next(ids))
    assert result.text == "5" and result.run_id == "run-1"
    assert store.load("run-1").status == "completed"
    assert rule.denied == []
