"""A start-up recovery loop: resume every session's run once, as the README's "after a crash: ``await
agent.resume()``" invites a server to do when it starts. tests/test_parked_resume.py runs it in process and as a
second process::

    python startup_loop.py DATABASE LEDGER SESSION...

DATABASE is a SQLite file or a Postgres conninfo. Prints one JSON object: each session's outcome (null when
nothing was continued). Each session's agent answers from a script of its own (`SCRIPTS`); every tool appends its
effect to the LEDGER file, so a test sees what ran, and how often, in any process.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from durable_agent import Agent, ApprovalSigner, DurableOptions, ScriptedModel, Tool, call, reply
from helpers import maybe_await

SIGNER = ApprovalSigner("startup-loop-test-secret-0123456789")
SCRIPTS: dict[str, list[Any]] = {
    "parked": [reply("", call("pay", {"id": "inv-7"}, "pay-1"), call("ship", {"id": "inv-7"}, "ship-1")),
               "Paid and shipped."],
    "crashed": [reply("", call("lookup", {"id": "inv-8"}, "lookup-1")), "Looked it up."],
    "done": ["Hello."],
}


def effect(ledger: Path, name: str) -> Callable[[Any], str]:
    """A tool's execute that appends ``<name> <id>`` to the ledger file."""

    def execute(args: Any) -> str:
        with open(ledger, "a", encoding="utf-8") as f:
            f.write(f"{name} {args['id']}\n")
        return "ok"

    return execute


def agent(runtime: Any, session: str, ledger: Path, **executes: Callable[[Any], Any]) -> Agent:
    """The agent of `session` on `runtime`: its script, tools writing to the ledger (or `executes` by name), signed
    approvals."""
    tools = {"pay": Tool(execute=executes.get("pay", effect(ledger, "pay")), needs_approval=True),
             "ship": Tool(execute=executes.get("ship", effect(ledger, "ship")), needs_approval=True),
             "lookup": Tool(execute=executes.get("lookup", effect(ledger, "lookup")))}
    return Agent(model=ScriptedModel(SCRIPTS[session]), tools=tools, session_id=session,
                 durable=DurableOptions(runtime), approval_signer=SIGNER)


async def resume_every_session(runtime: Any, sessions: Sequence[str], ledger: Path) -> dict[str, Any]:
    """Resume each session once; its outcome as JSON data (None: nothing to continue)."""
    outcomes: dict[str, Any] = {}
    for session in sessions:
        resumer = agent(runtime, session, ledger)
        assert isinstance(resumer.model, ScriptedModel)
        result = await resumer.resume()
        outcomes[session] = None if result is None else {
            "run_id": result.run_id, "finish_reason": result.finish_reason, "text": result.text,
            "pending_approvals": [r.to_dict() for r in result.pending_approvals],
            "model_calls": len(resumer.model.requests),
        }
    return outcomes


def open_runtime(database: str) -> Any:
    if database.endswith(".db"):
        from durable_agent.backends.sqlite import SqliteRuntime

        return SqliteRuntime(database)
    from durable_agent.backends.postgres import PostgresRuntime

    return PostgresRuntime(database)


async def main(database: str, ledger: str, sessions: Sequence[str]) -> None:
    runtime = open_runtime(database)
    try:
        print(json.dumps(await resume_every_session(runtime, sessions, Path(ledger))))
    finally:
        await maybe_await(runtime.close())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
