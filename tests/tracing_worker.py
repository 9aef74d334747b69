"""A traced worker process: an `Agent` on a SQLite runtime, calling an OpenAI-compatible server, with the
OpenTelemetry SDK's in-memory exporter also writing every span as it ends to a JSON-lines file (so a
SIGKILL loses only the spans still open). tests/test_tracing.py starts it, lets it kill itself inside a tool, then resumes the run in a
second one.

    python tests/tracing_worker.py start|resume DB SPANS BASE_URL

``TRACING_WORKER_KILL_IN=<tool>``: that tool SIGKILLs the process when it is called.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from durable_agent import Agent, DurableOptions, Tool
from durable_agent.backends.sqlite import SqliteRuntime
from durable_agent.providers import ModelSettings, OpenAIChatModel

RUN_ID, SESSION_ID, AGENT_NAME = "run-1", "chat-1", "billing"


class DumpingExporter(InMemorySpanExporter):
    """The SDK's in-memory exporter, also appending each span it gets to a file (one JSON object a line,
    written through at once)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(json.dumps(as_dict(span)) + "\n")
        return super().export(spans)


def as_dict(span: ReadableSpan) -> dict[str, Any]:
    context, parent = span.get_span_context(), span.parent
    assert context is not None
    return {
        "name": span.name, "kind": span.kind.name, "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}", "parent_id": f"{parent.span_id:016x}" if parent else None,
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in (span.attributes or {}).items()},
        "links": [{"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}",
                   "attributes": dict(link.attributes or {})} for link in span.links],
        "status": span.status.status_code.name,
    }


def tools() -> dict[str, Tool]:
    def effect(name: str) -> Any:
        def execute(args: Any) -> Any:
            if os.environ.get("TRACING_WORKER_KILL_IN") == name:
                os.kill(os.getpid(), signal.SIGKILL)
            return {"tool": name, "ok": True}

        return execute

    return {"lookup": Tool(description="Find an invoice.", parameters={"type": "object"}, execute=effect("lookup"),
                           replay="safe"),
            "pay": Tool(description="Pay an invoice.", parameters={"type": "object"}, execute=effect("pay"))}


async def main(mode: str, db: str, spans: str, base_url: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(DumpingExporter(spans)))
    trace.set_tracer_provider(provider)
    model = OpenAIChatModel("gpt-4o-mini", base_url=base_url, api_key="sk-test",
                            settings=ModelSettings(temperature=0.2, max_tokens=300))
    runtime = SqliteRuntime(db)
    try:
        agent = Agent(model=model, tools=tools(), durable=DurableOptions(runtime), session_id=SESSION_ID,
                      agent_name=AGENT_NAME)
        if mode == "start":
            await agent.run("Pay invoices inv-7 and inv-8.", run_id=RUN_ID)
        else:
            result = await agent.resume()
            assert result is not None and result.finish_reason == "stop", result
    finally:
        runtime.close()
    provider.shutdown()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
