"""A worker process for the MCP crash tests: an `Agent` on a journal runtime whose tools are an MCP server's.

    python tests/mcp_crash_worker.py start|resume RUNTIME LEDGER SERVER [SCENARIO]

RUNTIME is ``sqlite:<path>`` or ``postgres:<conninfo>`` (as in torture_worker.py); SERVER is ``stdio``
(the worker starts tests/mcp_test_server.py on LEDGER, passing MCP_TEST_PAUSE on) or the URL of the
test server under uvicorn. ``start`` runs the prompt as run ``r``: the model reads a balance (a
read-only tool: safe) and charges an account (unsafe) in one step, then answers. The test SIGKILLs
the worker while the charge runs; ``resume`` continues the run in a new process and prints the
outcome as one JSON line. SCENARIO ``grow`` (`grow_answer`): the server first adds a tool and announces
it, so the run's listing changes before the charge the worker is killed in.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from durable_agent import Agent, DurableOptions, ModelRequest, ScriptedModel, call, reply
from durable_agent.mcp import HttpServer, Server, StdioServer
from mcp_kit import SERVER
from torture_worker import open_runtime

PROMPT = "Charge account a 7 after checking its balance."


def answer(request: ModelRequest) -> Any:
    if not any(m["role"] == "tool" for m in request.messages):
        return reply("Checking and charging.", call("balance", {"account": "a"}, "read-1"),
                     call("charge", {"account": "a", "amount": 7}, "charge-1"))
    return reply("Done.")


OFFERED: list[bool] = []  # per model request of this process (scenario ``grow``): whether `extra` was offered


def grow_answer(request: ModelRequest) -> Any:
    """Scenario ``grow``: the server adds `extra` (announcing it), then the model charges, then calls `extra`."""
    OFFERED.append("extra" in {spec.name for spec in request.tools})
    parts: list[Any] = [p for m in request.messages if m["role"] == "tool" for p in m["content"]]
    answered = {p["tool_call_id"] for p in parts}
    if "grow-1" not in answered:
        return reply("Adding a tool.", call("grow", {}, "grow-1"))
    if "charge-1" not in answered:
        return reply("Charging.", call("charge", {"account": "a", "amount": 7}, "charge-1"))
    if "extra-1" not in answered:
        return reply("Using the new tool.", call("extra", {}, "extra-1"))
    return reply("Done.")


def mcp_server(ledger: str, where: str) -> Server:
    if where == "stdio":
        return StdioServer(sys.executable, [SERVER, ledger], name="bank", connect_timeout=60,
                           env={"MCP_TEST_PAUSE": os.environ.get("MCP_TEST_PAUSE", "0")})
    return HttpServer(where, name="bank", connect_timeout=60)


async def main(mode: str, runtime_spec: str, ledger: str, where: str, scenario: str = "bank") -> None:
    runtime = open_runtime(runtime_spec)
    agent = Agent(model=ScriptedModel(grow_answer if scenario == "grow" else answer), session_id="s", mcp_servers=[mcp_server(ledger, where)],
                  durable=DurableOptions(runtime, stale_after_ms=1_000))
    result = await (agent.run(PROMPT, run_id="r") if mode == "start" else agent.resume())
    assert result is not None
    parts: list[Any] = [p for m in result.messages if m["role"] == "tool" for p in m["content"]]
    results = {p["tool_call_id"]: p for p in parts}
    print(json.dumps({"finish_reason": result.finish_reason, "text": result.text,
                      "results": {k: {"output": v["output"], "is_error": v["is_error"]} for k, v in results.items()},
                      "offered_extra": OFFERED}),
          flush=True)
    closed = runtime.close()
    if inspect.isawaitable(closed):
        await closed


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
