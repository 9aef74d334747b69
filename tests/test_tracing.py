"""OpenTelemetry spans (opentelemetry-sdk's in-memory exporter) and the run fields on log records."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_agent import (
    Agent,
    DurableOptions,
    InMemoryCheckpointStore,
    MemoryRuntime,
    ScriptedModel,
    Tool,
    ToolApprovalResponse,
    agent_tool,
    call,
    generate_text,
    reply,
    resume_from_checkpoint,
    tracing,
)
from durable_agent.tracing import RunContextFilter
from helpers import maybe_await

pytest.importorskip("opentelemetry.sdk", reason="tracing tests need opentelemetry-sdk (scripts/requirements-dev.txt)")
pytestmark = pytest.mark.host_only("opentelemetry-sdk is not installed under Pyodide")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    class MemoryTracerProvider(TracerProvider):
        """Keeps the finished spans in `memory`."""

        def __init__(self) -> None:
            super().__init__()
            self.memory = InMemorySpanExporter()
            self.add_span_processor(SimpleSpanProcessor(self.memory))

    return MemoryTracerProvider()


@pytest.fixture
def spans(provider: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The package's tracer on an SDK provider of this module only (the global provider is left alone)."""
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("durable_agent"))
    provider.memory.clear()
    yield provider.memory
    provider.memory.clear()


def tools() -> dict[str, Tool]:
    def broken(args: Any) -> Any:
        raise KeyError("no such invoice")

    return {
        "lookup": Tool(description="Find.", parameters={"type": "object"}, execute=lambda args: {"amount": 42}),
        "pay": Tool(description="Pay.", parameters={"type": "object"}, execute=lambda args: "paid", needs_approval=True),
        "broken": Tool(description="Fails.", parameters={"type": "object"}, execute=broken),
    }


def model() -> ScriptedModel:
    return ScriptedModel([reply("Looking.", call("lookup", {})), reply("Paying.", call("pay", {})), "Done."])


def by_name(finished: Any, name: str) -> list[Any]:
    return [s for s in finished if s.name == name]


def test_a_run_its_steps_model_calls_and_tool_calls(spans: Any) -> None:
    store = InMemoryCheckpointStore()
    first = asyncio.run(generate_text(model=model(), tools=tools(), max_steps=5, store=store, run_id="run-1",
                                      messages=[{"role": "user", "content": "Pay."}]))
    finished = spans.get_finished_spans()
    (leg,) = by_name(finished, "invoke_agent")
    steps = by_name(finished, "durable_agent.step")
    chats = by_name(finished, "chat scripted")
    (tool,) = by_name(finished, "execute_tool lookup")
    assert [s.attributes["durable_agent.step_index"] for s in steps] == [0, 1]
    assert all(s.parent.span_id == leg.context.span_id for s in steps)
    assert [c.parent.span_id for c in chats] == [s.context.span_id for s in steps]
    assert tool.parent.span_id == steps[0].context.span_id
    assert leg.parent is None and leg.context.trace_id == tool.context.trace_id

    assert leg.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert leg.attributes["gen_ai.request.model"] == "scripted"
    assert leg.attributes["durable_agent.run_id"] == "run-1" and leg.attributes["gen_ai.conversation.id"] == "run-1"
    assert leg.attributes["durable_agent.resumed"] is False
    assert leg.attributes["durable_agent.finish_reason"] == "suspended"
    assert leg.attributes["gen_ai.usage.input_tokens"] == first.usage.input_tokens
    assert leg.attributes["gen_ai.usage.output_tokens"] == first.usage.output_tokens
    for chat, step in zip(chats, first.steps, strict=True):
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.request.model"] == "scripted"
        assert chat.attributes["gen_ai.usage.input_tokens"] == step.usage.input_tokens
        assert chat.attributes["gen_ai.usage.output_tokens"] == step.usage.output_tokens
        assert chat.attributes["gen_ai.response.finish_reasons"] == (step.finish_reason,)
    assert tool.attributes["gen_ai.tool.name"] == "lookup"
    assert tool.attributes["gen_ai.tool.call.id"] == first.steps[0].tool_calls[0]["tool_call_id"]
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"


def test_a_resumed_leg_is_linked_to_the_leg_it_continues(spans: Any) -> None:
    store = InMemoryCheckpointStore()
    first = asyncio.run(generate_text(model=model(), tools=tools(), max_steps=5, store=store, run_id="run-2",
                                      messages=[{"role": "user", "content": "Pay."}]))
    (before,) = by_name(spans.get_finished_spans(), "invoke_agent")
    spans.clear()
    verdict = ToolApprovalResponse(first.pending_approvals[0].approval_id, True)
    asyncio.run(resume_from_checkpoint(store, "run-2", model=model(), tools=tools(), approval_responses=[verdict]))
    finished = spans.get_finished_spans()
    (leg,) = by_name(finished, "invoke_agent")
    assert leg.attributes["durable_agent.resumed"] is True and leg.attributes["durable_agent.resumed_from_step"] == 1
    assert [link.context.span_id for link in leg.links] == [before.context.span_id]
    settle, model_step = by_name(finished, "durable_agent.step")
    assert (settle.attributes["durable_agent.step_kind"], settle.attributes["durable_agent.step_index"]) == ("settle", 2)
    assert (model_step.attributes["durable_agent.step_kind"], model_step.attributes["durable_agent.step_index"]) == (
        "model", 3)
    (pay,) = by_name(finished, "execute_tool pay")
    assert pay.parent.span_id == settle.context.span_id


def test_a_failing_tool_is_an_error_span_and_the_run_goes_on(spans: Any) -> None:
    from opentelemetry.trace import StatusCode

    script = ScriptedModel([reply("Trying.", call("broken", {})), "It failed."])
    asyncio.run(generate_text(model=script, tools=tools(), messages=[{"role": "user", "content": "Go."}]))
    finished = spans.get_finished_spans()
    (tool,) = by_name(finished, "execute_tool broken")
    assert tool.status.status_code is StatusCode.ERROR and tool.attributes["error.type"] == "KeyError"
    (leg,) = by_name(finished, "invoke_agent")
    assert leg.status.status_code is StatusCode.UNSET and leg.attributes["durable_agent.finish_reason"] == "stop"


def test_a_failing_run_records_the_error_on_its_leg_and_open_step(spans: Any) -> None:
    from opentelemetry.trace import StatusCode

    script = ScriptedModel([reply("Looking.", call("lookup", {}))])  # no second answer: the model call fails
    with pytest.raises(Exception, match="script"):
        asyncio.run(generate_text(model=script, tools=tools(), messages=[{"role": "user", "content": "Go."}]))
    finished = spans.get_finished_spans()
    (leg,) = by_name(finished, "invoke_agent")
    assert leg.status.status_code is StatusCode.ERROR
    failed_step = by_name(finished, "durable_agent.step")[-1]
    assert failed_step.status.status_code is StatusCode.ERROR
    assert by_name(finished, "chat scripted")[-1].status.status_code is StatusCode.ERROR


def test_a_sub_agent_leg_nests_under_its_tool_call(spans: Any) -> None:
    child = agent_tool(name="researcher", model=ScriptedModel([reply("Child looks.", call("lookup", {})), "42."]),
                       tools={"lookup": tools()["lookup"]})
    parent = ScriptedModel([reply("Asking.", call("researcher", {"prompt": "find it"})), "It is 42."])
    asyncio.run(generate_text(model=parent, tools={"researcher": child}, messages=[{"role": "user", "content": "?"}]))
    finished = spans.get_finished_spans()
    (tool,) = by_name(finished, "execute_tool researcher")
    (child_leg,) = by_name(finished, "invoke_agent researcher")
    assert child_leg.parent.span_id == tool.context.span_id
    assert child_leg.attributes["gen_ai.agent.name"] == "researcher"


def test_an_agent_leg_carries_its_session(spans: Any, caplog: pytest.LogCaptureFixture) -> None:
    script = ScriptedModel([reply("Trying.", call("broken", {})), "It failed."])
    agent = Agent(model=script, tools=tools(), durable=DurableOptions(MemoryRuntime()), session_id="chat-7")
    with caplog.at_level(logging.INFO, logger="durable_agent"):
        result = asyncio.run(agent.run("Go."))
    (leg,) = by_name(spans.get_finished_spans(), "invoke_agent")
    assert leg.attributes["durable_agent.session_id"] == "chat-7" and leg.attributes["gen_ai.conversation.id"] == "chat-7"
    assert leg.attributes["durable_agent.run_id"] == result.run_id
    (record,) = [r for r in caplog.records if "failed" in r.getMessage()]
    assert leg.attributes["durable_agent.resumed"] is False  # from the Agent's start checkpoint, written by no leg
    # the Agent's start checkpoint is step 0: the first model step is 1
    assert (record.run_id, record.step_index, record.session_id) == (result.run_id, 1, "chat-7")  # type: ignore[attr-defined]


def test_log_records_of_a_plain_run_carry_its_ids(caplog: pytest.LogCaptureFixture) -> None:
    script = ScriptedModel([reply("Looking.", call("lookup", {}))] * 3)  # the same call three times: runaway
    with caplog.at_level(logging.WARNING, logger="durable_agent"):
        asyncio.run(generate_text(model=script, tools=tools(), store=InMemoryCheckpointStore(), run_id="run-9",
                                  messages=[{"role": "user", "content": "Go."}]))
    (record,) = [r for r in caplog.records if "repeated" in r.getMessage()]
    assert (record.run_id, record.step_index, record.session_id) == ("run-9", 2, None)  # type: ignore[attr-defined]
    other = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    assert RunContextFilter().filter(other) and (other.run_id, other.step_index, other.session_id) == (None,) * 3  # type: ignore[attr-defined]


def test_nothing_is_imported_or_traced_without_the_api_or_when_turned_off() -> None:
    """The API is imported at the first run, not with the package; blocked or turned off, runs still go."""
    code = """
import asyncio, sys
blocked = sys.argv[1] == "blocked"
if blocked:
    sys.modules["opentelemetry"] = None  # what a missing package looks like to `import`
import durable_agent
from durable_agent import ScriptedModel, Tool, call, generate_text, reply
assert not any(m.split(".")[0] == "opentelemetry" for m in sys.modules if sys.modules[m] is not None)
tools = {"t": Tool(description="t", parameters={"type": "object"}, execute=lambda a: 1)}
r = asyncio.run(generate_text(model=ScriptedModel([reply("x", call("t", {})), "done"]), tools=tools,
                              messages=[{"role": "user", "content": "go"}]))
assert r.text == "done"
from durable_agent.tracing import get_tracer
assert get_tracer() is None
print("ok")
"""
    for mode, env in (("blocked", {}), ("off", {"DURABLE_AGENT_TRACING": "0"})):
        done = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=60,
                              env={"PYTHONPATH": str(ROOT / "python"), "PATH": "/usr/bin:/bin", **env})
        assert done.stdout == "ok\n", done.stderr


def test_no_span_is_made_until_a_tracer_provider_is_set() -> None:
    """With the API installed but no provider, the proxy's spans would record nothing: a leg makes none, and a
    provider set afterwards gets the next leg's spans (a fresh process: the global provider can be set once)."""
    code = """
import asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from durable_agent import ScriptedModel, Tool, call, generate_text, reply

made = []
start_span = trace.ProxyTracer.start_span
trace.ProxyTracer.start_span = lambda self, *a, **k: made.append(a[0]) or start_span(self, *a, **k)
tools = {"t": Tool(description="t", parameters={"type": "object"}, execute=lambda a: 1)}

def run():
    return asyncio.run(generate_text(model=ScriptedModel([reply("x", call("t", {})), "done"]), tools=tools,
                                     messages=[{"role": "user", "content": "go"}]))

assert run().text == "done"
assert made == [], made
memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
trace.set_tracer_provider(provider)
assert run().text == "done"
names = sorted(span.name for span in memory.get_finished_spans())
assert "invoke_agent" in names and "execute_tool t" in names, names
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT / "python"), "PATH": "/usr/bin:/bin"})
    assert done.stdout == "ok\n", done.stderr


RESPONSES = {  # adapter → (provider name, requested model, the recording's response id and model)
    "openai_chat": ("openai", "gpt-4o-mini", "chatcmpl-AbC123", "gpt-4o-mini-2024-07-18"),
    "openai_responses": ("openai", "o4-mini", "resp_68a1f0d7e9b2", "o4-mini-2025-04-16"),
    "anthropic": ("anthropic", "claude-sonnet-4-5", "msg_01XFDUDYJgAACzvnptvVoYEL", "claude-sonnet-4-5-20250929"),
}


@pytest.mark.parametrize("api", sorted(RESPONSES))
def test_a_model_call_names_its_provider_server_settings_and_response(spans: Any, api: str) -> None:
    from durable_agent.providers import ModelSettings
    from test_providers_replay import adapter

    provider, requested, response_id, response_model = RESPONSES[api]
    model, _ = adapter(api, "text", settings=ModelSettings(temperature=0.3, max_tokens=256, top_p=0.9))
    result = asyncio.run(generate_text(model=model, messages=[{"role": "user", "content": "Invoices?"}],
                                       agent_name="billing"))
    finished = spans.get_finished_spans()
    (chat,) = by_name(finished, f"chat {requested}")  # the model as the provider names it, no adapter prefix
    from opentelemetry.trace import SpanKind

    assert chat.kind is SpanKind.CLIENT
    assert dict(chat.attributes) == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider, "gen_ai.request.model": requested,
        "server.address": "llm.test", "server.port": 443, "gen_ai.request.temperature": 0.3,
        "gen_ai.request.max_tokens": 256, "gen_ai.request.top_p": 0.9,
        "gen_ai.response.id": response_id, "gen_ai.response.model": response_model,
        **tracing._usage_attributes(result.usage), "gen_ai.response.finish_reasons": ("stop",)}
    (leg,) = by_name(finished, "invoke_agent billing")
    assert leg.attributes["gen_ai.agent.name"] == "billing"
    assert (leg.attributes["gen_ai.provider.name"], leg.attributes["gen_ai.request.model"]) == (provider, requested)


def test_an_azure_endpoint_is_azure_openai_and_a_model_without_the_hook_is_other() -> None:
    from durable_agent.providers import OpenAIChatModel

    azure = OpenAIChatModel.azure("prod-4o", endpoint="https://acme.openai.azure.com", api_key="k")
    assert tracing.model_attributes(azure) == {"gen_ai.provider.name": "azure.ai.openai",
                                               "gen_ai.request.model": "prod-4o",
                                               "server.address": "acme.openai.azure.com", "server.port": 443}
    local = OpenAIChatModel("llama3", base_url="http://localhost:8000/v1")
    assert tracing.model_attributes(local)["gen_ai.provider.name"] == "openai"
    assert tracing.model_attributes(local)["server.port"] == 8000
    assert tracing.model_attributes(ScriptedModel(["x"])) == {"gen_ai.provider.name": "_OTHER",
                                                              "gen_ai.request.model": "scripted"}


def test_the_agent_name_is_settable_and_checked(spans: Any) -> None:
    from durable_agent import ConfigurationError

    agent = Agent(model=ScriptedModel(["Hi."]), agent_name="Support desk")
    asyncio.run(agent.run("Hello"))
    (leg,) = by_name(spans.get_finished_spans(), "invoke_agent Support desk")
    assert leg.attributes["gen_ai.agent.name"] == "Support desk"
    with pytest.raises(ConfigurationError, match="agent_name"):
        Agent(model=ScriptedModel(["Hi."]), agent_name="")


def test_a_resumed_leg_links_to_the_trace_stored_with_its_run(spans: Any) -> None:
    """The trace context rides on every checkpoint: a leg that has only the store to go by (another process;
    here this process with its memory of earlier legs wiped) links to the leg that started the run."""
    store = InMemoryCheckpointStore()
    first = asyncio.run(generate_text(model=model(), tools=tools(), max_steps=5, store=store, run_id="run-3",
                                      messages=[{"role": "user", "content": "Pay."}]))
    (before,) = by_name(spans.get_finished_spans(), "invoke_agent")
    stored = store.load("run-3")
    assert stored is not None and stored.trace_context == {
        "traceparent": f"00-{before.context.trace_id:032x}-{before.context.span_id:016x}-{before.context.trace_flags:02x}"}
    tracing._last_leg.clear()
    spans.clear()
    verdict = ToolApprovalResponse(first.pending_approvals[0].approval_id, True)
    asyncio.run(resume_from_checkpoint(store, "run-3", model=model(), tools=tools(), approval_responses=[verdict]))
    (leg,) = by_name(spans.get_finished_spans(), "invoke_agent")
    assert leg.context.trace_id != before.context.trace_id and leg.parent is None
    (link,) = leg.links
    assert (link.context.trace_id, link.context.span_id) == (before.context.trace_id, before.context.span_id)
    assert dict(link.attributes) == {"durable_agent.link": "started_by"}
    done = store.load("run-3")
    assert done is not None and done.status == "completed" and done.trace_context == stored.trace_context


def _worker(mode: str, db: Path, spans: Path, url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "tests" / "tracing_worker.py"), mode, str(db), str(spans), url],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "python"), **env})


def _spans_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("kill_in", ["lookup", "pay"])
def test_a_run_resumed_after_a_crash_in_another_process_links_to_the_trace_that_started_it(
    tmp_path: Path, kill_in: str
) -> None:
    """A worker runs an Agent (SQLite runtime, an OpenAI-compatible server) and SIGKILLs itself inside a tool of
    its first step (only the run's start checkpoint is stored) or of its second; another process resumes it."""
    from durable_agent.backends.sqlite import SqliteRuntime
    from replay import ReplayServer

    db, first_file, second_file = tmp_path / "runs.db", tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    with ReplayServer() as server:
        url = server.base_url("openai_chat/tools", "openai_chat/pay", "openai_chat/text")
        killed = _worker("start", db, first_file, url, TRACING_WORKER_KILL_IN=kill_in)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        resumed = _worker("resume", db, second_file, url)
        assert resumed.returncode == 0, resumed.stderr
        port = server.port
    first, second = _spans_of(first_file), _spans_of(second_file)
    runtime = SqliteRuntime(str(db))
    try:
        stored = asyncio.run(maybe_await(runtime.stores.checkpoints.load("run-1")))
    finally:
        runtime.close()
    assert stored is not None and stored.status == "completed" and stored.trace_context is not None
    _, started_trace, started_span, _ = stored.trace_context["traceparent"].split("-")

    # the first process: its leg never ended (no invoke_agent span), but what ended is of the stored trace
    assert first and {s["trace_id"] for s in first} == {started_trace}
    assert not [s for s in first if s["name"].startswith("invoke_agent")]
    assert all(s["parent_id"] == started_span for s in first if s["name"] == "durable_agent.step")

    # the second process: one trace, rooted at the resumed leg, which links to the leg that started the run
    (root,) = [s for s in second if s["parent_id"] is None]
    assert root["name"] == "invoke_agent billing" and {s["trace_id"] for s in second} == {root["trace_id"]}
    assert root["trace_id"] != started_trace
    assert root["links"] == [{"trace_id": started_trace, "span_id": started_span,
                              "attributes": {"durable_agent.link": "started_by"}}]
    by_id = {s["span_id"]: s for s in second}
    for span in second:
        ancestor = span
        while ancestor["parent_id"] is not None:
            ancestor = by_id[ancestor["parent_id"]]
        assert ancestor is root, span["name"]
    assert {k: root["attributes"][k] for k in (
        "gen_ai.operation.name", "gen_ai.agent.name", "gen_ai.provider.name", "gen_ai.request.model",
        "gen_ai.conversation.id", "durable_agent.run_id", "durable_agent.resumed", "durable_agent.resumed_from_step",
        "durable_agent.finish_reason")} == {
        "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "billing", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o-mini", "gen_ai.conversation.id": "chat-1", "durable_agent.run_id": "run-1",
        "durable_agent.resumed": True, "durable_agent.resumed_from_step": {"lookup": 0, "pay": 1}[kill_in],
        "durable_agent.finish_reason": "stop"}

    # every model call a process made (not replayed from the journal) says what it asked and what answered
    calls = [s for s in first + second if s["name"].startswith("chat") and not s["attributes"].get("durable_agent.replayed")]
    assert calls and all(s["name"] == "chat gpt-4o-mini" and s["kind"] == "CLIENT" for s in calls)
    for call_span in calls:
        attributes = call_span["attributes"]
        assert {k: attributes[k] for k in (
            "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.id",
            "gen_ai.response.model", "server.address", "server.port", "gen_ai.request.temperature",
            "gen_ai.request.max_tokens")} == {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o-mini",
            "gen_ai.response.id": "chatcmpl-AbC123", "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
            "server.address": "127.0.0.1", "server.port": port, "gen_ai.request.temperature": 0.2,
            "gen_ai.request.max_tokens": 300}
        assert attributes["gen_ai.usage.input_tokens"] > 0 and attributes["gen_ai.usage.output_tokens"] > 0


def test_the_readme_tracing_snippet_prints_what_it_says() -> None:
    """Run in a process of its own: it sets the global tracer provider, which can be set once."""
    import re

    (block,) = [b for b in re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
                if 'agent_name="greeter"' in b]
    promised = block.strip().splitlines()[-1].removeprefix("# ")
    done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT / "python"), "PATH": "/usr/bin:/bin"})
    assert done.stdout == promised + "\n", done.stderr
