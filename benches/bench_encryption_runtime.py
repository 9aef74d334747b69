"""Encryption at rest on the SQLite runtime: the per-step time of an `Agent` with and without a keyring, side by side.

An `Agent` on `SqliteRuntime` (one file per configuration, opened once, as a server keeps its runtime) runs
`STEPS` steps per run, each a `ScriptedModel` answer (~600 characters of text and one tool call with an
80-character input) and one tool call returning ~2 KB: the payloads of benches/bench_stores.py. Every step
stores the model's answer and the tool's result as step records and the checkpoint's two new messages and
header; with ``encryption=keyring`` each of those is an envelope (AES-256-GCM). The figures are the best of
`ROUNDS` runs, plaintext and encrypted interleaved in one process, divided by `STEPS`: wall time, and the
process's CPU time (every thread: the loop's and the SQLite writer's), which a machine shared with other work
disturbs far less; with ``synchronous=FULL`` (the default: an fsync per commit) and ``NORMAL`` (no fsync).
On a loaded machine both still swing by tens of percent from one run to the next, so the bench also times the
sealing itself (the CPU time of every `Keyring.seal`/`open` of the encrypted runs, through `TimedKeyring`): envelopes and
microseconds per step, and that time over the plaintext CPU per step, the ratio the sealing alone adds.

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
ROUNDS = 6


class TimedKeyring(Keyring):
    """A `Keyring` that counts its seals and opens and the CPU time they take (of the thread running them: the
    loop's or the SQLite writer's; a wait for the GIL is not counted)."""

    envelopes = 0
    seconds = 0.0

    def seal(self, plaintext: Any, place: Any, **options: Any) -> Any:
        start = time.thread_time()
        try:
            return super().seal(plaintext, place, **options)
        finally:
            self.envelopes += 1
            self.seconds += time.thread_time() - start

    def open(self, value: object, place: Any) -> Any:
        start = time.thread_time()
        try:
            return super().open(value, place)
        finally:
            self.envelopes += 1
            self.seconds += time.thread_time() - start


KEYRING = TimedKeyring({"k1": bytes(range(32))}, primary="k1")
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


async def per_step_ms(runtime: SqliteRuntime, session: str) -> tuple[float, float]:
    """(wall, CPU) ms per step of one run."""
    agent = Agent(model=script(), tools=TOOLS, max_steps=STEPS + 1, durable=DurableOptions(runtime), session_id=session)
    wall, cpu = time.perf_counter(), time.process_time()
    result = await agent.run("find the invoices")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert len(result.steps) == STEPS
    return wall / STEPS * 1e3, cpu / STEPS * 1e3


async def compare(tmp: str, synchronous: Literal["FULL", "NORMAL"]) -> dict[str, tuple[float, float]]:
    """Per configuration ("plain", "sealed"): the best (wall, CPU) ms per step of `ROUNDS` runs, interleaved."""
    runtimes = {name: SqliteRuntime(Path(tmp, f"{synchronous}-{name}.db"), synchronous=synchronous, encryption=keyring)
                for name, keyring in (("plain", None), ("sealed", KEYRING))}
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in runtimes}
    try:
        for round_ in range(ROUNDS + 1):  # the first round warms both up and is not counted
            for name, runtime in sorted(runtimes.items(), reverse=round_ % 2 == 1):  # each first in turn
                ms = await per_step_ms(runtime, f"s-{round_}")
                if round_:
                    figures[name].append(ms)
    finally:
        for runtime in runtimes.values():
            runtime.close()
    return {name: (min(w for w, _ in runs), min(c for _, c in runs)) for name, runs in figures.items()}


def main() -> None:
    print(f"Python {sys.version.split()[0]}; Agent on SqliteRuntime, {STEPS} steps a run (one ~2 KB tool call each);"
          " plaintext vs encryption=keyring (AES-256-GCM)")
    with tempfile.TemporaryDirectory() as tmp:
        for synchronous in ("FULL", "NORMAL"):  # type: Literal["FULL", "NORMAL"]
            KEYRING.envelopes, KEYRING.seconds = 0, 0.0
            figures = asyncio.run(compare(tmp, synchronous))
            steps = (ROUNDS + 1) * STEPS
            sealing_ms = KEYRING.seconds / steps * 1e3
            print(f"sealing (synchronous={synchronous}): {KEYRING.envelopes / steps:.1f} envelopes,"
                  f" {sealing_ms:.3f} ms per step: {1 + sealing_ms / figures['plain'][1]:.2f}x the plaintext CPU")
            for i, what in enumerate(("wall", "CPU")):
                plain, sealed = figures["plain"][i], figures["sealed"][i]
                print(f"per step, {what:4} (synchronous={synchronous}): plaintext {plain:7.3f} ms,"
                      f" encrypted {sealed:7.3f} ms: {sealed / plain:.2f}x (target <= 1.15x)")


if __name__ == "__main__":
    main()
