"""The crash torture's supervisor and its independent checks, shared by tests/test_crash_journal.py
(a short run in the test command) and benches/soak_crash.py (hundreds of kills per backend).

Workers (tests/torture_worker.py) drive sessions of several runs each. The supervisor kills them
in every window a SIGKILL can land in and starts new ones:

* ``aimed``: a worker started with ``TORTURE_DIE_AFTER_WRITES=k`` kills itself right after its
  k-th committed write: a death exactly between two commits (claim, run start, step records,
  checkpoints, run finish);
* ``in-tool``: workers kill themselves inside a tool, before or after its effect;
* ``random``: a worker that logged work since the last kill is SIGKILLed 0-120 ms later
  (model streams, tools, between steps);
* ``stall``: a busy worker is SIGSTOPped past the lease's staleness, so another worker claims
  its session, then SIGCONTed: it must stop with `StaleEpochError` and land nothing.

The checks read the ledger (model requests and tool effects, written by the workers, not the
journal) and each session's final checkpoint.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torture_worker
from durable_agent import TOOL_INTERRUPTED_MESSAGE
from helpers import maybe_await

WORKER = Path(__file__).resolve().parent / "torture_worker.py"


@dataclass
class Tally:
    """What the supervisor did."""

    kills: Counter[str] = field(default_factory=Counter)
    stalls: int = 0
    seconds: float = 0.0

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())


def _spawn(spec: str, ledger: Path, prompts: int, sessions: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    import os

    return subprocess.Popen([sys.executable, str(WORKER), spec, str(ledger), str(prompts), *sessions],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **env})


RECORD_START = b'{"kind": '  # every ledger line begins so: torture_worker.log writes `kind` first


def ledger_entries(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The complete records in ledger bytes, and how many torn ones were skipped.

    A reader can see a line half written: the kernel copies an append page by page, so a line
    that crosses a page boundary shows up in two parts, and a SIGKILL between the parts leaves
    the first part for good, with the next worker's record appended right after it. The last
    part without a newline is not a record yet; a torn fragment is dropped and the complete
    record after it kept. A fragment is a write its worker died in, before the work it logs.
    """
    entries: list[dict[str, Any]] = []
    torn = 0
    lines = data.split(b"\n")
    if lines[-1]:
        torn += 1
    for line in lines[:-1]:
        start = line.rfind(RECORD_START)
        if start < 0:  # a fragment of a record that began before the bytes read
            torn += 1
            continue
        torn += start > 0
        try:
            entries.append(json.loads(line[start:]))
        except json.JSONDecodeError:
            torn += 1
    return entries, torn


def _busy_pids(ledger: Path, after: int) -> set[int]:
    """Pids that wrote to the ledger past byte `after`: workers in the middle of some work."""
    if not ledger.exists():
        return set()
    with ledger.open("rb") as f:
        f.seek(after)
        return {entry["pid"] for entry in ledger_entries(f.read())[0]}


def supervise(spec: str, ledger: Path, *, sessions: list[str], prompts: int, workers: int, kills: int,
              seed: int, deadline_s: float) -> Tally:
    """Run workers until one exits 0 (every session done), killing them `kills` times on the way.

    Most new workers aim a death at themselves (between two commits, or inside a tool); the
    supervisor adds random kills of busy workers, and its first event and every tenth after it is a stall
    instead (not counted as a kill).
    """
    rng = random.Random(seed)
    tally = Tally()
    started = time.monotonic()

    def fresh() -> tuple[subprocess.Popen[bytes], str]:
        mode = rng.choices(["aimed", "in-tool", "none"], [12, 3, 5])[0] if tally.total_kills < kills else "none"
        env = {"TORTURE_DIE_AFTER_WRITES": str(rng.randint(1, 30))} if mode == "aimed" else {}
        if mode == "in-tool":
            env["TORTURE_DIE_IN_TOOL"] = "0.3"
        env["TORTURE_CONCURRENCY"] = str(rng.choice([1, 4]))  # one session at a time, or several as a server
        return _spawn(spec, ledger, prompts, sessions, env), mode

    pool = [fresh() for _ in range(workers)]
    mark, events = 0, 0
    try:
        while time.monotonic() - started < deadline_s:
            time.sleep(0.01)
            for proc, mode in list(pool):
                code = proc.poll()
                if code is None:
                    continue
                if code == 0:
                    tally.seconds = time.monotonic() - started
                    return tally
                if code != -signal.SIGKILL:
                    raise AssertionError(f"worker failed ({code}): {proc.stderr.read().decode()[-3000:]}")  # type: ignore[union-attr]
                tally.kills[mode if mode in ("aimed", "in-tool") else "random"] += 1
                pool.remove((proc, mode))
                pool.append(fresh())
            busy = [(p, m) for p, m in pool if p.poll() is None and p.pid in _busy_pids(ledger, mark)]
            if not busy or tally.total_kills >= kills or rng.random() < 0.8:
                continue
            time.sleep(rng.uniform(0, 0.12))
            victim, mode = rng.choice(busy)
            if victim.poll() is not None:
                continue
            events += 1
            mark = ledger.stat().st_size
            if events % 10 == 1:  # a stall (the first event, then every tenth): the lease lapses, another worker claims
                victim.send_signal(signal.SIGSTOP)
                time.sleep(torture_worker.STALE_AFTER_MS / 1000 + 0.6)
                victim.send_signal(signal.SIGCONT)
                tally.stalls += 1
                continue
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            tally.kills["random"] += 1
            pool.remove((victim, mode))
            pool.append(fresh())
        raise AssertionError(f"the sessions did not all finish within {deadline_s}s ({tally})")
    finally:
        for proc, _ in pool:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def reference_transcript(prompts: int) -> list[Any]:
    """The transcript of a session that nothing interrupted."""
    from durable_agent import Agent, DurableOptions, MemoryRuntime

    model, tools = torture_worker.build(None, "reference", delay=0)
    agent = Agent(model=model, tools=tools, durable=DurableOptions(MemoryRuntime()), session_id="ref")
    result = None
    for n in range(prompts):
        result = await agent.run(torture_worker.prompt_text(n))
    assert result is not None
    return list(result.messages)


def without_aborted_turns(messages: list[Any]) -> list[Any]:
    """Drop aborted partial assistant turns (an assistant text followed by another assistant message)."""
    return [m for i, m in enumerate(messages)
            if not (m["role"] == "assistant" and i + 1 < len(messages) and messages[i + 1]["role"] == "assistant")]


def transcript_difference(actual: list[Any], expected: list[Any]) -> str | None:
    """Where `actual` differs from `expected`, except tool results reported as interrupted (the
    documented marker); None when they agree."""
    for index, (got, want) in enumerate(zip(actual, expected, strict=False)):  # lengths compared below
        same = got == want or (
            got["role"] == want["role"] == "tool" and len(got["content"]) == len(want["content"])
            and all(g == w or g.get("output") == TOOL_INTERRUPTED_MESSAGE
                    for g, w in zip(got["content"], want["content"], strict=True)))
        if not same:
            return f"message {index}: got {json.dumps(got)[:400]} wanted {json.dumps(want)[:400]}"
    if len(actual) != len(expected):
        return f"{len(actual)} messages, wanted {len(expected)}; the extra: {json.dumps(actual[len(expected):])[:400]}"
    return None


class Checked:
    """What checks found, as lists that must all be empty."""

    @property
    def failures(self) -> dict[str, Any]:
        """The lists that are not empty, by name."""
        return {name: value for name, value in vars(self).items() if isinstance(value, list) and value}


@dataclass
class Findings(Checked):
    """What the independent checks found; every list must be empty."""

    unfinished: list[str] = field(default_factory=list)
    duplicate_effects: list[Any] = field(default_factory=list)
    repeated_model_calls: list[Any] = field(default_factory=list)
    duplicated_answers: list[str] = field(default_factory=list)
    wrong_transcripts: list[str] = field(default_factory=list)
    model_requests: int = 0
    model_steps: int = 0
    interrupted: int = 0
    refused: int = 0
    torn: int = 0


async def check(spec: str, ledger: Path, sessions: list[str], prompts: int) -> Findings:
    found = Findings()
    entries, found.torn = ledger_entries(ledger.read_bytes())
    found.refused = sum(1 for e in entries if e["kind"] == "refused")
    charges = Counter((e["session"], e["prompt"], e["turn"]) for e in entries
                      if e["kind"] == "effect" and e["tool"] == "charge")
    found.duplicate_effects = [key for key, n in charges.items() if n > 1]
    requests = [(e["session"], e["prompt"], e["turn"]) for e in entries if e["kind"] == "model"]
    found.model_requests, found.model_steps = len(requests), len(set(requests))
    first_effect: dict[Any, int] = {}
    for i, e in enumerate(entries):
        if e["kind"] == "effect":
            first_effect.setdefault((e["session"], e["prompt"], e["turn"]), i)
    # A turn's tools run only once its model step's done record is durable: a request of that
    # turn after one of its effects is a finished model call requested again.
    found.repeated_model_calls = sorted({(e["session"], e["prompt"], e["turn"]) for i, e in enumerate(entries)
                                         if e["kind"] == "model"
                                         and first_effect.get((e["session"], e["prompt"], e["turn"]), i) < i})

    expected = without_aborted_turns(await reference_transcript(prompts))
    runtime = torture_worker.open_runtime(spec)
    try:
        for session in sessions:
            if await torture_worker.prompts_answered(runtime, session) < prompts:
                found.unfinished.append(session)
                continue
            stored = await maybe_await(runtime.stores.checkpoints.load(await runtime.stores.runs.last(session)))
            messages = without_aborted_turns(list(stored.messages))
            texts = [p["text"] for m in messages if m["role"] == "assistant" for p in m["content"]
                     if p["type"] == "text"]
            if any(texts.count(torture_worker.final_answer(n)) != 1 for n in range(prompts)):
                found.duplicated_answers.append(session)
            difference = transcript_difference(messages, expected)
            if difference is not None:
                found.wrong_transcripts.append(f"{session}: {difference} (all: {json.dumps(stored.messages)[-3000:]})")
            found.interrupted += sum(1 for m in messages if m["role"] == "tool" for p in m["content"]
                                     if p["output"] == TOOL_INTERRUPTED_MESSAGE)
    finally:
        await maybe_await(runtime.close())
    return found
