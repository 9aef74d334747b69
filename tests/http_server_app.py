"""The app the HTTP server tests serve with uvicorn, in a process of its own they can SIGKILL.

Configured from the environment: ``HTTP_TEST_DB`` (the SQLite file of the runtime and the
event log), ``HTTP_TEST_LEDGER`` (a file each tool call appends a line to, so a test can count
side effects; a ``#word`` in the prompt goes into the call's arguments as its ``ticket``),
``HTTP_TEST_DELAY`` (seconds per streamed word and per tool call), ``HTTP_TEST_POSTGRES``
(a conninfo: the Postgres runtime and event log instead of SQLite), and ``HTTP_TEST_ORIGIN`` (a
browser origin the CORS allows besides ``http://allowed.example``: a test's page).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from durable_agent import (
    Agent,
    ApprovalSigner,
    DurableOptions,
    ModelRequest,
    ScriptedModel,
    ScriptedResponse,
    Tool,
    call,
    content_parts,
    reply,
)
from durable_agent.backends.sqlite import SqliteRuntime
from durable_agent.http import (
    AuthRequest,
    ChatEndpoint,
    CorsSettings,
    EventLog,
    PostgresEventLog,
    SqliteEventLog,
)

SECRET = "http-test-secret-0123456789abcdef0123456789"
LONG_ANSWER = ("The answer, after a careful study of many old and dusty books in the library, "
               "is forty two and nothing else at all.")
RECOVERED = "Sorry, I was cut off. The answer is forty two."


def script(request: ModelRequest) -> ScriptedResponse:
    """Answers by the conversation's state, so a run resumed in another process gets the same answers."""
    last = request.messages[-1]
    if last["role"] == "assistant":  # a turn a crash cut off, joined to the history as aborted
        return reply(RECOVERED)
    if last["role"] == "tool":
        results = [p for p in content_parts(last) if p["type"] == "tool-result"]
        located = [p["output"] for p in results if p["tool_name"] == "locate"]
        if located:  # the client tool's results, as the UI handed them over
            return reply("You are in " + " and ".join(str(o) for o in located) + ".")
        return reply("Deployed." if any(p["tool_name"] == "deploy" for p in results) else LONG_ANSWER)
    prompt = str(last["content"])
    last_word = prompt.rsplit(" ", 1)[-1]
    ticket = {"ticket": last_word} if last_word.startswith("#") else {}  # "deploy #7": names the run's effects
    if "deploy" in prompt:
        return reply("", call("deploy", {"env": "prod", **ticket}))
    if "where" in prompt:  # the client tool, once per place asked about
        return reply("Let me ask your browser.", *(call("locate", {"place": w}, f"loc-{w}")
                                                   for w in prompt.split()[1:]))
    if "lookup" in prompt:
        return reply("Let me look that up for you.", call("lookup", {"q": "answer", **ticket}))
    return reply(f"You said: {prompt}")


def create() -> ChatEndpoint:
    db, ledger = os.environ["HTTP_TEST_DB"], os.environ["HTTP_TEST_LEDGER"]
    delay = float(os.environ.get("HTTP_TEST_DELAY", "0"))
    postgres = os.environ.get("HTTP_TEST_POSTGRES")
    runtime: Any
    events: EventLog
    if postgres:
        from durable_agent.backends.postgres import PostgresRuntime

        runtime, events = PostgresRuntime(postgres), PostgresEventLog(postgres)
    else:
        runtime, events = SqliteRuntime(db, synchronous="NORMAL"), SqliteEventLog(db)

    async def effect(name: str, args: Any) -> dict[str, Any]:
        with open(ledger, "a", encoding="utf-8") as file:
            file.write(json.dumps([name, args]) + "\n")
        await asyncio.sleep(delay * 20)
        return {"done": name, "args": args}

    tools = {
        "lookup": Tool(description="Look something up.", parameters={"type": "object"},
                       execute=lambda args: effect("lookup", args)),
        "deploy": Tool(description="Deploy.", parameters={"type": "object"},
                       execute=lambda args: effect("deploy", args), needs_approval=True),
        "locate": Tool(description="Where the user is: the browser answers (a client tool).",
                       parameters={"type": "object"}),
    }
    model = ScriptedModel(script, delay=delay)
    signer = ApprovalSigner(SECRET)

    def agent(session_id: str) -> Agent:
        return Agent(model=model, tools=tools, session_id=session_id, approval_signer=signer,
                     durable=DurableOptions(runtime, stale_after_ms=3_000))

    def authorize(request: AuthRequest) -> bool:
        return request.request.headers.get("authorization") != "Bearer intruder"

    page = os.environ.get("HTTP_TEST_ORIGIN")
    origins = ("http://allowed.example", page) if page else ("http://allowed.example",)
    return ChatEndpoint(agent=agent, runtime=runtime, events=events, authorize=authorize,
                        cors=CorsSettings(allow_origins=origins))
