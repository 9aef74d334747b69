"""Per-step overhead of the step journal, side by side in one process.

Variants, each running the same N-step agent (a scripted model that calls one tool per step):

* no durability (`generate_text` without a session);
* a plain session store (checkpoints only): memory, SQLite;
* `Agent` on a durable runtime (checkpoints + step journal + lease): memory, SQLite, and
  Postgres when DURABLE_AGENT_BENCH_POSTGRES_URL is set;
* the anchor: the same agent as a DBOS workflow on SQLite (a model step and a tool step per
  turn; `pip install dbos` for the bench only — the anchor row is skipped, and says so, without it).

    .venv/bin/python benches/bench_journal.py [--steps 10,100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from durable_agent import (
    Agent,
    DurableOptions,
    InMemorySessionStore,
    ModelRequest,
    ScriptedModel,
    Session,
    Tool,
    Usage,
    call,
    create_memory_runtime,
    generate_text,
    reply,
)
from durable_agent.stores.sqlite import SqliteSessionStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import per_step, print_header, print_rows

USAGE = Usage(10, 5, 15)
TOOLS = {"noop": Tool(parameters={"type": "object"}, execute=lambda args: "ok")}


def script(steps: int) -> ScriptedModel:
    def answer(request: ModelRequest) -> Any:
        turn = sum(1 for m in request.messages if m["role"] == "tool")
        return reply("", call("noop", {"i": turn}), usage=USAGE) if turn < steps - 1 else reply("done", usage=USAGE)

    return ScriptedModel(answer)


def session_run(steps: int, store: Any) -> None:
    session = Session(store, f"r-{time.perf_counter_ns()}") if store is not None else None
    result = asyncio.run(generate_text(model=script(steps), tools=TOOLS, max_steps=steps + 1, session=session,
                                       messages=[{"role": "user", "content": "go"}]))
    assert len(result.steps) == steps


def agent_run(steps: int, runtime_factory: Callable[[], Any]) -> None:
    async def go() -> None:
        agent = Agent(model=script(steps), tools=TOOLS, max_steps=steps + 1,
                      durable=DurableOptions(runtime_factory()), session_id=f"s-{time.perf_counter_ns()}")
        result = await agent.run("go")
        assert len(result.steps) == steps

    asyncio.run(go())


def runtime_factories(tmp: str) -> dict[str, Callable[[], Any]]:
    factories: dict[str, Callable[[], Any]] = {"Agent + memory runtime": create_memory_runtime}
    with contextlib.suppress(ImportError):
        from durable_agent.runtime.sqlite import sqlite_runtime

        path = str(Path(tmp) / "journal.db")
        factories["Agent + SQLite runtime"] = lambda: sqlite_runtime(path)
    url = os.environ.get("DURABLE_AGENT_BENCH_POSTGRES_URL")
    if url:
        from durable_agent.runtime.postgres import postgres_runtime

        factories["Agent + Postgres runtime"] = lambda: postgres_runtime(url)
    return factories


def dbos_runner(tmp: str) -> Callable[[int], None] | None:
    if importlib.util.find_spec("dbos") is None:
        return None
    from dbos import DBOS

    DBOS(config={"name": "bench-journal", "system_database_url": f"sqlite:///{tmp}/dbos.sqlite",
                 "log_level": "WARNING"})

    @DBOS.step()
    def model_step(turn: int, steps: int) -> dict[str, Any]:
        if turn < steps - 1:
            return {"text": "", "tool_calls": [{"tool_name": "noop", "input": {"i": turn}}]}
        return {"text": "done", "tool_calls": []}

    @DBOS.step()
    def tool_step(args: dict[str, Any]) -> str:
        return "ok"

    @DBOS.workflow()
    def agent_workflow(steps: int) -> int:
        history: list[Any] = [{"role": "user", "content": "go"}]
        for turn in range(steps):
            answer = model_step(turn, steps)
            history.append({"role": "assistant", "content": answer})
            for tool_call in answer["tool_calls"]:
                history.append({"role": "tool", "content": tool_step(tool_call["input"])})
        return len(history)

    DBOS.launch()
    return lambda steps: agent_workflow(steps)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", default="10,100")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_store = SqliteSessionStore(str(Path(tmp) / "sessions.db"))
        dbos = dbos_runner(tmp)
        print_header(32, "none", "DBOS")
        for steps in (int(s) for s in args.steps.split(",")):
            rows: dict[str, float] = {
                "no durability": per_step(steps, args.repeat, lambda: session_run(steps, None)),
                "session store: memory": per_step(steps, args.repeat,
                                                  lambda: session_run(steps, InMemorySessionStore())),
                "session store: SQLite": per_step(steps, args.repeat, lambda: session_run(steps, sqlite_store)),
            }
            for name, factory in runtime_factories(tmp).items():
                rows[name] = per_step(steps, args.repeat, lambda factory=factory: agent_run(steps, factory))
            if dbos is not None:
                rows["DBOS workflow on SQLite"] = per_step(steps, args.repeat, lambda: dbos(steps))
            print_rows(steps, rows, 32, "no durability", "DBOS workflow on SQLite")
        if dbos is None:
            print("DBOS is not installed: pip install dbos (bench only)")
        sqlite_store.close()


if __name__ == "__main__":
    main()
