"""The demo in server mode: the same scripted coding assistant, served by `durable_agent.http.ChatEndpoint`.

The page (src/server.html) talks to this server over HTTP and server-sent events instead of
running Python itself: runs live in a SQLite file, and a page reload, a dropped connection or a
server killed mid-run and started again all continue the same stream (Last-Event-ID).

    DEMO_DB=/tmp/demo.db DEMO_ORIGINS=http://127.0.0.1:8000 \\
        uvicorn --factory server_app:create --app-dir pyodide/demo --port 8010

Env: ``DEMO_DB`` (the SQLite file), ``DEMO_LEDGER`` (a JSONL file of tool effects; default next
to the database), ``DEMO_ORIGINS`` (comma-separated origins the page is served from),
``DEMO_SPEED`` (``fast`` for tests), ``DEMO_TOOL_SECONDS`` (how long each tool runs; 0.5 when fast,
else 1), ``DEMO_SECRET`` (the approval signer's secret: it stays on
the server; the page only ever carries tokens).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "src"), str(HERE.parent.parent / "examples"), str(HERE.parent.parent / "python")]

import demo_app  # noqa: E402  # the browser demo's scenario: tools and scripted model

from durable_agent import Agent, ApprovalSigner, DurableOptions  # noqa: E402
from durable_agent.backends.sqlite import SqliteRuntime  # noqa: E402
from durable_agent.http import ChatEndpoint, CorsSettings, SqliteEventLog  # noqa: E402


def create() -> ChatEndpoint:
    db = Path(os.environ.get("DEMO_DB", "demo-server.db"))
    ledger = Path(os.environ.get("DEMO_LEDGER", str(db.with_suffix(".ledger.jsonl"))))
    fast = os.environ.get("DEMO_SPEED") == "fast"
    runtime = SqliteRuntime(db, synchronous="NORMAL")
    signer = ApprovalSigner(os.environ.get("DEMO_SECRET") or "demo-secret-change-me-0123456789abcdef")
    model = demo_app.scripted_model(0.03 if fast else 0.08)

    async def record(name: str, args: Any) -> None:
        with ledger.open("a", encoding="utf-8") as file:
            file.write(json.dumps({"tool": name, "input": args}) + "\n")

    tool_seconds = float(os.environ.get("DEMO_TOOL_SECONDS") or (0.5 if fast else 1.0))
    tools = demo_app.demo_tools(record, tool_seconds=tool_seconds)

    def agent(session_id: str) -> Agent:
        return Agent(model=model, tools=tools, session_id=session_id, approval_signer=signer,
                     max_steps=demo_app.MAX_STEPS, durable=DurableOptions(runtime, stale_after_ms=5_000))

    origins = tuple(o.strip() for o in os.environ.get("DEMO_ORIGINS", "").split(",") if o.strip())
    return ChatEndpoint(agent=agent, runtime=runtime, events=SqliteEventLog(db), cors=CorsSettings(allow_origins=origins))
