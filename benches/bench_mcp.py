"""Per-call overhead of the durable MCP path against the bare `mcp` client, side by side in one process.

One stdio MCP server (tests/mcp_test_server.py, its read-only `balance` tool), opened once, and an N-step
agent whose scripted model calls one tool per step. Rows, in ms per call:

* ``bare mcp client``: `ClientSession.call_tool` on the same server, N times (the anchor);
* ``Server.call``: durable-agent's client path alone (connection, result mapping);
* ``generate_text, local tool`` / ``generate_text, MCP tool``: the loop without durability, the tool
  being a local tool that makes the same bare call, or the server's tool through `mcp_servers=`;
* ``Agent + SQLite, local tool`` / ``Agent + SQLite, MCP tool``: the same on a durable SQLite runtime
  (checkpoint, step journal, lease).

``CPU added by MCP`` is the MCP row's client CPU per call minus the local-tool row's of the same loop
(``Server.call``: minus the bare client's): what running a call as an MCP tool costs beyond making
the call (the goal: at most 1 ms on SQLite). CPU time is the measure that a loaded machine and the
server's round trip hardly blur; wall ms and ``vs bare`` (the ratio to the bare call) are printed too.

    .venv/bin/python benches/bench_mcp.py [--calls 200] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from mcp import ClientSession, StdioServerParameters, stdio_client

from durable_agent import Agent, DurableOptions, ModelRequest, ScriptedModel, Tool, call, generate_text, reply
from durable_agent.backends.sqlite import SqliteRuntime
from durable_agent.mcp import StdioServer

SERVER = str(Path(__file__).resolve().parent.parent / "tests" / "mcp_test_server.py")
ARGS = {"account": "a"}


def script(tool: str, steps: int) -> ScriptedModel:
    def answer(request: ModelRequest) -> Any:
        turn = sum(1 for m in request.messages if m["role"] == "tool")
        return reply("", call(tool, {"account": f"a{turn}"})) if turn < steps else reply("done")  # not a runaway

    return ScriptedModel(answer)


async def best_per_call(calls: int, repeat: int, variants: dict[str, Callable[[], Awaitable[Any]]]
                        ) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds per call of each variant: the best of `repeat` rounds, each round running every
    variant once (interleaved, so a noisy neighbour slows all alike). CPU is this process's only: the
    client's own work, which the server's round trip and the machine's load hardly blur."""
    best = {name: (float("inf"), float("inf")) for name in variants}
    for _ in range(repeat):
        for name, run in variants.items():
            wall, cpu = time.perf_counter(), time.process_time()
            await run()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return {name: (wall / calls, cpu / calls) for name, (wall, cpu) in best.items()}


async def main(calls: int, repeat: int) -> None:
    ledger = str(Path(tempfile.mkdtemp()) / "ledger.jsonl")
    params = StdioServerParameters(command=sys.executable, args=[SERVER, ledger])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as bare, \
            StdioServer(sys.executable, [SERVER, ledger]) as server:
        await bare.initialize()

        async def bare_calls() -> None:
            for _ in range(calls):
                await bare.call_tool("balance", ARGS)

        async def wrapper_calls() -> None:
            for _ in range(calls):
                await server.call("balance", ARGS)

        async def local(arguments: Any) -> Any:
            return (await bare.call_tool("balance", arguments)).structured_content

        local_tools = {"balance_local": Tool(parameters=server.tools["balance"].parameters, execute=local,
                                             replay="safe")}

        async def plain(tool: str) -> None:
            extra: dict[str, Any] = {"mcp_servers": [server]} if tool == "balance" else {"tools": local_tools}
            result = await generate_text(model=script(tool, calls), messages=[{"role": "user", "content": "go"}],
                                         max_steps=calls + 1, **extra)
            assert len(result.steps) == calls + 1

        with tempfile.TemporaryDirectory() as tmp, SqliteRuntime(str(Path(tmp) / "journal.db")) as runtime:
            async def durable(tool: str) -> None:
                extra: dict[str, Any] = {"mcp_servers": [server]} if tool == "balance" else {"tools": local_tools}
                agent = Agent(model=script(tool, calls), max_steps=calls + 1, durable=DurableOptions(runtime),
                              session_id=f"s-{time.perf_counter_ns()}", **extra)
                result = await agent.run("go")
                assert len(result.steps) == calls + 1

            rows = await best_per_call(calls, repeat, {
                "bare mcp client": bare_calls,
                "Server.call": wrapper_calls,
                "generate_text, local tool": lambda: plain("balance_local"),
                "generate_text, MCP tool": lambda: plain("balance"),
                "Agent + SQLite, local tool": lambda: durable("balance_local"),
                "Agent + SQLite, MCP tool": lambda: durable("balance"),
            })
    print(f"{calls} calls, best of {repeat}")
    print(f"{'variant':<28} {'ms/call':>9} {'vs bare':>9} {'CPU ms/call':>12} {'CPU added by MCP':>17}")
    pairs = {"Server.call": "bare mcp client", "generate_text, MCP tool": "generate_text, local tool",
             "Agent + SQLite, MCP tool": "Agent + SQLite, local tool"}
    bare_wall = rows["bare mcp client"][0]
    for name, (wall, cpu) in rows.items():
        added = f"{(cpu - rows[pairs[name]][1]) * 1000:16.3f}" if name in pairs else ""
        print(f"{name:<28} {wall * 1000:9.3f} {wall / bare_wall:8.2f}x {cpu * 1000:12.3f} {added:>17}")

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.repeat))
