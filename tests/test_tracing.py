"""OpenTelemetry spans (opentelemetry-sdk's in-memory exporter) and the run fields on log records."""

from __future__ import annotations

import asyncio
import logging
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
    (leg,) = by_name(finished, "invoke_agent durable_agent")
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
    (before,) = by_name(spans.get_finished_spans(), "invoke_agent durable_agent")
    spans.clear()
    verdict = ToolApprovalResponse(first.pending_approvals[0].approval_id, True)
    asyncio.run(resume_from_checkpoint(store, "run-2", model=model(), tools=tools(), approval_responses=[verdict]))
    finished = spans.get_finished_spans()
    (leg,) = by_name(finished, "invoke_agent durable_agent")
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
    (leg,) = by_name(finished, "invoke_agent durable_agent")
    assert leg.status.status_code is StatusCode.UNSET and leg.attributes["durable_agent.finish_reason"] == "stop"


def test_a_failing_run_records_the_error_on_its_leg_and_open_step(spans: Any) -> None:
    from opentelemetry.trace import StatusCode

    script = ScriptedModel([reply("Looking.", call("lookup", {}))])  # no second answer: the model call fails
    with pytest.raises(Exception, match="script"):
        asyncio.run(generate_text(model=script, tools=tools(), messages=[{"role": "user", "content": "Go."}]))
    finished = spans.get_finished_spans()
    (leg,) = by_name(finished, "invoke_agent durable_agent")
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
    (leg,) = by_name(spans.get_finished_spans(), "invoke_agent durable_agent")
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
assert "invoke_agent durable_agent" in names and "execute_tool t" in names, names
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT / "python"), "PATH": "/usr/bin:/bin"})
    assert done.stdout == "ok\n", done.stderr
