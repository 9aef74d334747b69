"""The loop's own overhead per step: no store vs. a checkpoint store (memory, SQLite), against LangGraph.

Each run is N steps of a scripted model that calls one trivial tool per step, then answers.
The anchor is the same agent as a LangGraph StateGraph with its SqliteSaver checkpointer
(install `langgraph` and `langgraph-checkpoint-sqlite` for this bench only; without them
the anchor rows are skipped and say so). Everything runs side by side in one process.

    .venv/bin/python benches/bench_loop.py [--steps 10,100,1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from durable_agent import (
    InMemoryCheckpointStore,
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


def scripted(steps: int) -> ScriptedModel:
    def answer(request: ModelRequest) -> Any:
        turn = sum(1 for m in request.messages if m["role"] == "assistant")
        if turn < steps - 1:
            return reply("", call("noop", {"i": turn}), usage=USAGE)
        return reply("done", usage=USAGE)

    return ScriptedModel(answer)


TOOLS = {"noop": Tool(parameters={"type": "object"}, execute=lambda args: "ok")}


async def durable_agent_run(steps: int, store: Any) -> None:
    run_id = f"bench-{time.perf_counter_ns()}" if store is not None else None
    result = await generate_text(model=scripted(steps), tools=TOOLS, max_steps=steps + 1,
                                 messages=[{"role": "user", "content": "go"}], store=store, run_id=run_id)
    assert len(result.steps) == steps


def langgraph_runner(db_path: str) -> Callable[[int], None] | None:
    try:
        import sqlite3

        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, MessagesState, StateGraph
    except ImportError:
        return None
    saver = SqliteSaver(sqlite3.connect(db_path, check_same_thread=False))

    def run(steps: int) -> None:
        def agent(state: MessagesState) -> dict[str, Any]:
            turn = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
            if turn < steps - 1:
                tool_call = {"name": "noop", "args": {"i": turn}, "id": f"c{turn}"}
                return {"messages": [AIMessage(content="", tool_calls=[tool_call])]}
            return {"messages": [AIMessage(content="done")]}

        def tools(state: MessagesState) -> dict[str, Any]:
            last = state["messages"][-1]
            return {"messages": [ToolMessage(content="ok", tool_call_id=c["id"]) for c in last.tool_calls]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", tools)
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", lambda s: "tools" if s["messages"][-1].tool_calls else END)
        graph.add_edge("tools", "agent")
        app = graph.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": f"t-{time.perf_counter_ns()}"}, "recursion_limit": 4 * steps + 10}
        app.invoke({"messages": [HumanMessage(content="go")]}, config)

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", default="10,100,1000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_store = SqliteCheckpointStore(str(Path(tmp) / "bench.db"))
        graph = langgraph_runner(str(Path(tmp) / "langgraph.db"))
        print_header(28, "no store", "LangGraph")
        for steps in (int(s) for s in args.steps.split(",")):
            repeat = args.repeat if steps <= 1000 else 1
            rows: dict[str, float] = {}
            variants = {
                "durable-agent, no store": None,
                "durable-agent, memory store": InMemoryCheckpointStore(),
                "durable-agent, SQLite store": sqlite_store,
            }
            for name, store in variants.items():
                rows[name] = per_step(steps, repeat, lambda store=store: asyncio.run(durable_agent_run(steps, store)))
            if graph is not None:
                rows["LangGraph + SqliteSaver"] = per_step(steps, repeat, lambda: graph(steps))
            print_rows(steps, rows, 28, "durable-agent, no store", "LangGraph + SqliteSaver")
        if graph is None:
            print("LangGraph is not installed: pip install langgraph langgraph-checkpoint-sqlite")
        sqlite_store.close()


if __name__ == "__main__":
    main()
