"""The agents benches/bench_restate.py serves on Restate: ``python benches/_restate_service.py PORT WORKDIR``.

``bench``: the N-step agent of bench_journal.py (N comes as the prompt). ``crash``: the same
agent whose tool SIGKILLs this process at turn 3 (once per session, noted in WORKDIR), and
whose next model request notes when the run resumed, for the restart-to-resumed latency.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import restate
from bench_journal import TOOLS, USAGE

from durable_agent import Agent, ModelRequest, ScriptedModel, Tool, call, reply
from durable_agent.restate import agent_services, serve

WORKDIR = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(".")
KILL_AT = 3
RETRY = restate.InvocationRetryPolicy(initial_interval=timedelta(milliseconds=50),
                                      max_interval=timedelta(milliseconds=500), exponentiation_factor=2.0)


def steps_of(request: ModelRequest) -> tuple[int, int]:
    """(this turn, the run's step count), the count being the prompt."""
    first = next(m for m in request.messages if m["role"] == "user")
    return sum(1 for m in request.messages if m["role"] == "tool"), int(str(first["content"]).split()[-1])


def answer(request: ModelRequest) -> Any:
    turn, steps = steps_of(request)
    return reply("", call("noop", {"i": turn}), usage=USAGE) if turn < steps - 1 else reply("done", usage=USAGE)


def mark(name: str) -> Path:
    return WORKDIR / name


def crash_answer(request: ModelRequest) -> Any:
    if mark("killed").exists() and not mark("resumed").exists():
        mark("resumed").write_text(str(time.time()))
    return answer(request)


def crashing_noop(args: dict[str, Any]) -> str:
    if args["i"] == KILL_AT and not mark("killed").exists():
        mark("killed").write_text(str(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    return "ok"


bench = Agent(model=ScriptedModel(answer), tools=TOOLS, max_steps=1000)
crash = Agent(model=ScriptedModel(crash_answer), max_steps=1000,
              tools={"noop": Tool(parameters={"type": "object"}, execute=crashing_noop)})

if __name__ == "__main__":
    services = [*agent_services(bench, name="bench"), *agent_services(crash, name="crash", retry_policy=RETRY)]
    asyncio.run(serve(restate.app(services), port=int(sys.argv[1])))
