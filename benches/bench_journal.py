"""Per-step overhead of the step journal, side by side in one process.

Variants, each running the same N-step agent (a scripted model that calls one tool per step):

* no durability (`generate_text` without a store);
* a plain checkpoint store (checkpoints only): memory, SQLite;
* `Agent` on a durable runtime (checkpoints + step journal + lease): memory, SQLite, and
  Postgres when DURABLE_AGENT_BENCH_POSTGRES_URL is set;
* the anchors: the same agent as a DBOS workflow (a model step and a tool step per turn) on SQLite,
  and on the same Postgres when the URL is set; the Postgres rows are compared with DBOS on Postgres
  (`pip install dbos` for the bench only — the anchor rows are skipped, and say so, without it).

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
    InMemoryCheckpointStore,
    MemoryRuntime,
    ModelRequest,
    ScriptedModel,
    Tool,
    Usage,
    call,
    generate_text,
    reply,
)
from durable_agent.backends.sqlite import SqliteCheckpointStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import per_step, print_header, print_rows

USAGE = Usage(10, 5, 15)
TOOLS = {"noop": Tool(parameters={"type": "object"}, execute=lambda args: "ok")}


def script(steps: int) -> ScriptedModel:
    def answer(request: ModelRequest) -> Any:
        turn = sum(1 for m in request.messages if m["role"] == "tool")
        return reply("", call("noop", {"i": turn}), usage=USAGE) if turn < steps - 1 else reply("done", usage=USAGE)

    return ScriptedModel(answer)


def store_run(steps: int, store: Any) -> None:
    run_id = f"r-{time.perf_counter_ns()}" if store is not None else None
    result = asyncio.run(generate_text(model=script(steps), tools=TOOLS, max_steps=steps + 1, store=store,
                                       run_id=run_id, messages=[{"role": "user", "content": "go"}]))
    assert len(result.steps) == steps


def agent_run(steps: int, runtime_factory: Callable[[], Any]) -> None:
    async def go() -> None:
        agent = Agent(model=script(steps), tools=TOOLS, max_steps=steps + 1,
                      durable=DurableOptions(runtime_factory()), session_id=f"s-{time.perf_counter_ns()}")
        result = await agent.run("go")
        assert len(result.steps) == steps

    asyncio.run(go())


def runtime_factories(tmp: str) -> dict[str, Callable[[], Any]]:
    factories: dict[str, Callable[[], Any]] = {"Agent + memory runtime": MemoryRuntime}
    with contextlib.suppress(ImportError):
        from durable_agent.backends.sqlite import SqliteRuntime

        path = str(Path(tmp) / "journal.db")
        factories["Agent + SQLite runtime"] = lambda: SqliteRuntime(path)
    return factories


class PostgresAgent:
    """`Agent` runs on ONE Postgres runtime (a server keeps its runtime, as DBOS keeps its engine), on one loop."""

    def __init__(self, url: str) -> None:
        from durable_agent.backends.postgres import PostgresRuntime

        self._loop = asyncio.new_event_loop()
        self._runtime = PostgresRuntime(url)

    def __call__(self, steps: int) -> None:
        agent = Agent(model=script(steps), tools=TOOLS, max_steps=steps + 1,
                      durable=DurableOptions(self._runtime), session_id=f"s-{time.perf_counter_ns()}")
        result = self._loop.run_until_complete(agent.run("go"))
        assert len(result.steps) == steps

    def close(self) -> None:
        self._loop.run_until_complete(self._runtime.close())
        self._loop.close()


class DbosAnchor:
    """The agent as a DBOS workflow; `on(url)` (re)launches DBOS on that system database when it changes."""

    def __init__(self) -> None:
        self._url: str | None = None
        self._workflow: Callable[[int], int] | None = None

    def on(self, url: str) -> Callable[[int], int]:
        from dbos import DBOS

        if self._url != url:
            if self._url is not None:
                DBOS.destroy(destroy_registry=False)
            DBOS(config={"name": "bench-journal", "system_database_url": url, "log_level": "WARNING"})
            if self._workflow is None:
                self._workflow = dbos_workflow()
            DBOS.launch()
            self._url = url
        assert self._workflow is not None
        return self._workflow

    def close(self) -> None:
        if self._url is not None:
            from dbos import DBOS

            DBOS.destroy(destroy_registry=True)


def dbos_workflow() -> Callable[[int], int]:
    from dbos import DBOS

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

    return agent_workflow


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", default="10,100")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    url = os.environ.get("DURABLE_AGENT_BENCH_POSTGRES_URL")
    dbos = DbosAnchor() if importlib.util.find_spec("dbos") is not None else None
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_store = SqliteCheckpointStore(str(Path(tmp) / "sessions.db"))
        print_header(32, "none", "DBOS")
        for steps in (int(s) for s in args.steps.split(",")):
            none = per_step(steps, args.repeat, lambda: store_run(steps, None))
            rows: dict[str, float] = {
                "no durability": none,
                "checkpoint store: memory": per_step(steps, args.repeat,
                                                  lambda: store_run(steps, InMemoryCheckpointStore())),
                "checkpoint store: SQLite": per_step(steps, args.repeat, lambda: store_run(steps, sqlite_store)),
            }
            for name, factory in runtime_factories(tmp).items():
                rows[name] = per_step(steps, args.repeat, lambda factory=factory: agent_run(steps, factory))
            if dbos is not None:
                on_sqlite = dbos.on(f"sqlite:///{tmp}/dbos.sqlite")
                rows["DBOS workflow on SQLite"] = per_step(steps, args.repeat, lambda: on_sqlite(steps))
            print_rows(steps, rows, 32, "no durability", "DBOS workflow on SQLite")
            if url:
                on_postgres_agent = PostgresAgent(url)
                on_postgres_agent(1)  # the pool's first connection and the schema check: not per step
                pg_rows = {"no durability": none,
                           "Agent + Postgres runtime": per_step(steps, args.repeat, lambda: on_postgres_agent(steps))}
                on_postgres_agent.close()
                if dbos is not None:
                    on_postgres = dbos.on(url)
                    on_postgres(1)
                    pg_rows["DBOS workflow on Postgres"] = per_step(steps, args.repeat, lambda: on_postgres(steps))
                print_rows(steps, pg_rows, 32, "no durability", "DBOS workflow on Postgres")
        if dbos is None:
            print("DBOS is not installed: pip install dbos (bench only)")
        else:
            dbos.close()
        sqlite_store.close()


if __name__ == "__main__":
    main()
