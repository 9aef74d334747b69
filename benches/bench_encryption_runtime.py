"""Encryption at rest on the SQLite runtime: the per-step time of an `Agent` with and without a keyring, side by side.

An `Agent` on `SqliteRuntime` (one file per configuration, opened once, as a server keeps its runtime) runs
`STEPS` steps per run, each a `ScriptedModel` answer (~600 characters of text and one tool call with an
80-character input) and one tool call returning ~2 KB: the payloads of benches/bench_stores.py. Every step
stores the model's answer and the tool's result as step records and the checkpoint's two new messages and
header; with ``encryption=keyring`` each of those is an envelope (AES-256-GCM). The figure is the best of
`ROUNDS` runs, plaintext and encrypted interleaved in one process, divided by `STEPS`; with
``synchronous=FULL`` (the default: an fsync per commit) and ``NORMAL`` (no fsync: the CPU cost shows).

Target (issue 24): <= 1.15x.

Run: ``.venv/bin/python benches/bench_encryption_runtime.py`` (needs ``pip install 'durable-agent[crypto]'``).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stores import step_messages

from durable_agent import Agent, DurableOptions, ModelRequest, ScriptedModel, Tool, Usage, call, reply
from durable_agent.backends.sqlite import SqliteRuntime
from durable_agent.encryption import Keyring

STEPS = 20
ROUNDS = 5
KEYRING = Keyring({"k1": bytes(range(32))}, primary="k1")
USAGE = Usage(100, 20, 120)


def _payloads(step: int) -> tuple[str, dict[str, Any], Any]:
    """The model's text, the tool's input and the tool's output at `step` (bench_stores' messages)."""
    assistant, tool = step_messages(step)
    text, tool_call = assistant["content"]
    return text["text"], tool_call["input"], tool["content"][0]["output"]


def script() -> ScriptedModel:
    def answer(request: ModelRequest) -> Any:
        turn = sum(1 for m in request.messages if m["role"] == "tool")
        if turn >= STEPS - 1:
            return reply("done", usage=USAGE)
        text, tool_input, _ = _payloads(turn + 1)
        return reply(text, call("search", tool_input), usage=USAGE)

    return ScriptedModel(answer)


TOOLS = {"search": Tool(parameters={"type": "object"}, execute=lambda args: _payloads(1)[2])}


async def per_step_ms(runtime: SqliteRuntime, session: str) -> float:
    agent = Agent(model=script(), tools=TOOLS, max_steps=STEPS + 1, durable=DurableOptions(runtime), session_id=session)
    start = time.perf_counter()
    result = await agent.run("find the invoices")
    elapsed = time.perf_counter() - start
    assert len(result.steps) == STEPS
    return elapsed / STEPS * 1e3


async def compare(tmp: str, synchronous: Literal["FULL", "NORMAL"]) -> tuple[float, float]:
    """(plaintext, encrypted): the best per-step ms of `ROUNDS` runs each, interleaved."""
    runtimes = {name: SqliteRuntime(Path(tmp, f"{synchronous}-{name}.db"), synchronous=synchronous, encryption=keyring)
                for name, keyring in (("plain", None), ("sealed", KEYRING))}
    figures: dict[str, list[float]] = {name: [] for name in runtimes}
    try:
        for round_ in range(ROUNDS + 1):  # the first round warms both up and is not counted
            for name, runtime in runtimes.items():
                ms = await per_step_ms(runtime, f"s-{round_}")
                if round_:
                    figures[name].append(ms)
    finally:
        for runtime in runtimes.values():
            runtime.close()
    return min(figures["plain"]), min(figures["sealed"])


def main() -> None:
    print(f"Python {sys.version.split()[0]}; Agent on SqliteRuntime, {STEPS} steps a run (one ~2 KB tool call each);"
          " plaintext vs encryption=keyring (AES-256-GCM)")
    with tempfile.TemporaryDirectory() as tmp:
        for synchronous in ("FULL", "NORMAL"):  # type: Literal["FULL", "NORMAL"]
            plain, sealed = asyncio.run(compare(tmp, synchronous))
            print(f"per step (synchronous={synchronous}): plaintext {plain:6.3f} ms, encrypted {sealed:6.3f} ms:"
                  f" {sealed / plain:.2f}x (target <= 1.15x)")


if __name__ == "__main__":
    main()
