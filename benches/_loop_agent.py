"""The agent bench_loop times: N steps of a scripted model calling one trivial tool per step, then an answer.

Imported after the caller has put the `durable_agent` it measures on `sys.path` (this tree's, or
another commit's for `bench_loop.py --against`), so it uses only names every tree exports.
"""

from __future__ import annotations

import time
from typing import Any

from durable_agent import Agent, ModelRequest, ScriptedModel, Tool, Usage, call, generate_text, reply

USAGE = Usage(10, 5, 15)
TOOLS = {"noop": Tool(parameters={"type": "object"}, execute=lambda args: "ok")}


def scripted(steps: int) -> ScriptedModel:
    def answer(request: ModelRequest) -> Any:
        turn = sum(1 for m in request.messages if m["role"] == "assistant")
        if turn < steps - 1:
            return reply("", call("noop", {"i": turn}), usage=USAGE)
        return reply("done", usage=USAGE)

    return ScriptedModel(answer)


async def generate_run(steps: int, store: Any = None) -> None:
    """One `generate_text` run of `steps` steps (checkpointed when `store` is given)."""
    run_id = f"bench-{time.perf_counter_ns()}" if store is not None else None
    result = await generate_text(model=scripted(steps), tools=TOOLS, max_steps=steps + 1,
                                 messages=[{"role": "user", "content": "go"}], store=store, run_id=run_id)
    assert len(result.steps) == steps


async def agent_run(steps: int) -> None:
    """One run of a plain `Agent` (no durable runtime) of `steps` steps."""
    agent = Agent(model=scripted(steps), tools=TOOLS, max_steps=steps + 1)
    result = await agent.run("go")
    assert len(result.steps) == steps
