"""A worker process for the crash-torture test: drives agent sessions on the SQLite runtime until all are done.

Every model request and every tool effect is appended, one JSON line each, to a shared
ledger (O_APPEND writes of a single line: whole lines, in the order they happened). A
supervisor SIGKILLs workers at random moments and starts new ones.

    python tests/torture_worker.py RUNTIME LEDGER SESSION [SESSION ...]

RUNTIME is ``sqlite:<path>`` or ``postgres:<conninfo>``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from durable_agent import (  # noqa: E402
    Agent,
    DurableOptions,
    ModelRequest,
    RunLeaseHeldError,
    ScriptedModel,
    StaleEpochError,
    Tool,
    call,
    reply,
)

TURNS = 4
PROMPT = "Reconcile the accounts."


def log(ledger: str, **entry: Any) -> None:
    line = (json.dumps({**entry, "pid": os.getpid()}) + "\n").encode()
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def build(ledger: str | None, session: str, delay: float) -> tuple[ScriptedModel, dict[str, Tool]]:
    """The agent: each turn reads (safe) and charges (unsafe) in parallel; the model's answer depends
    only on how many tool rounds the history holds, so an aborted partial turn does not shift it."""

    def answer(request: ModelRequest) -> Any:
        turn = sum(1 for m in request.messages if m["role"] == "tool")
        if ledger:
            log(ledger, kind="model", session=session, turn=turn)
        if turn < TURNS:
            return reply(f"Turn {turn}: reading the ledger and charging the fee for this period now.",
                         call("read", {"turn": turn}, f"read-{turn}"),
                         call("charge", {"turn": turn, "usd": 3}, f"charge-{turn}"))
        return "All accounts reconciled."

    async def effect(name: str, args: Any) -> str:
        await asyncio.sleep(0.04)
        if ledger:
            log(ledger, kind="effect", tool=name, session=session, turn=args["turn"])
        return f"{name} {args['turn']} ok"

    async def read(args: Any) -> str:
        return await effect("read", args)

    async def charge(args: Any) -> str:
        return await effect("charge", args)

    tools = {"read": Tool(execute=read, replay="safe"), "charge": Tool(execute=charge, replay="unsafe")}
    return ScriptedModel(answer, delay=delay), tools


def open_runtime(spec: str) -> Any:
    """A runtime from ``sqlite:<path>`` or ``postgres:<conninfo>``."""
    kind, _, where = spec.partition(":")
    if kind == "sqlite":
        from durable_agent.runtime.sqlite import sqlite_runtime

        return sqlite_runtime(where)
    if kind == "postgres":
        from durable_agent.runtime.postgres import postgres_runtime

        return postgres_runtime(where)
    raise ValueError(f"unknown runtime {spec!r}")


async def drive(spec: str, ledger: str, sessions: list[str]) -> None:
    runtime = open_runtime(spec)
    done: set[str] = set()
    while len(done) < len(sessions):
        for session in sessions:
            if session in done:
                continue
            model, tools = build(ledger, session, delay=0.004)
            agent = Agent(model=model, tools=tools, session_id=session,
                          durable=DurableOptions(runtime, stale_after_ms=2_000))
            try:
                if await runtime.stores.runs.last(session) is None:
                    await agent.run(PROMPT)
                elif await agent.resume() is None:
                    done.add(session)
            except (RunLeaseHeldError, StaleEpochError):
                await asyncio.sleep(0.02)  # another worker has it: come back later


if __name__ == "__main__":
    runtime_spec, ledger_path, *names = sys.argv[1:]
    asyncio.run(drive(runtime_spec, ledger_path, names))
