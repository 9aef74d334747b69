"""Crash torture on the SQLite runtime with real processes, and lease fencing between two real workers.

Workers (tests/torture_worker.py) drive agent sessions whose tools append their effects to a
shared ledger; a supervisor SIGKILLs them at random moments, many times, and starts new ones.
Asserted: every run finishes; no unsafe effect appears twice; no model call is requested again
once its step finished (a tool of that turn ran, which happens only after the model step's
done record is durable); the final transcripts equal those of uncrashed runs, except for the
documented markers (an interrupted unsafe call's result, an aborted partial assistant turn).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torture_worker  # noqa: E402

from durable_agent import Agent, DurableOptions, create_memory_runtime  # noqa: E402
from durable_agent._util import maybe_await  # noqa: E402
from durable_agent.loop import TOOL_INTERRUPTED_MESSAGE  # noqa: E402

pytestmark = pytest.mark.host_only("spawns and SIGKILLs worker processes")

WORKER = Path(__file__).resolve().parent / "torture_worker.py"
SESSIONS = [f"account-{i}" for i in range(6)]


def spawn(spec: str, ledger: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(WORKER), spec, str(ledger), *SESSIONS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def busy_pids(ledger: Path, after: int) -> set[int]:
    """Pids that wrote to the ledger past byte `after`: workers in the middle of some work."""
    if not ledger.exists():
        return set()
    with ledger.open("rb") as f:
        f.seek(after)
        return {json.loads(line)["pid"] for line in f.read().splitlines() if line.strip()}


def supervise(spec: str, ledger: Path, *, workers: int, max_kills: int, seed: int, deadline_s: float) -> int:
    """Run workers until one exits 0 (every session done); SIGKILL busy ones at random moments meanwhile.

    A kill lands only on a worker that logged work since the previous kill, a random 0-120 ms after
    the supervisor noticed it, so kills hit model streams and tool calls, not interpreter start-up.
    """
    rng = random.Random(seed)
    pool = [spawn(spec, ledger) for _ in range(workers)]
    kills, start, mark = 0, time.monotonic(), 0
    try:
        while time.monotonic() - start < deadline_s:
            time.sleep(0.01)
            for proc in pool:
                if proc.poll() is not None and proc.returncode not in (0, -9):
                    raise AssertionError(f"worker failed: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            if any(p.returncode == 0 for p in pool):
                return kills
            busy = [p for p in pool if p.poll() is None and p.pid in busy_pids(ledger, mark)]
            if kills < max_kills and busy:
                time.sleep(rng.uniform(0, 0.12))
                victim = rng.choice(busy)
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                kills += 1
                mark = ledger.stat().st_size
                pool = [p for p in pool if p.poll() is None] + [spawn(spec, ledger)]
        raise AssertionError(f"the runs did not all finish within {deadline_s}s ({kills} kills)")
    finally:
        for proc in pool:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def reference_transcript() -> list[Any]:
    model, tools = torture_worker.build(None, "reference", delay=0)
    agent = Agent(model=model, tools=tools, durable=DurableOptions(create_memory_runtime()), session_id="ref")
    return list((await agent.run(torture_worker.PROMPT)).messages)


def comparable(messages: list[Any]) -> list[Any]:
    """Drop aborted partial assistant turns (an assistant text followed by another assistant message)."""
    kept = []
    for i, message in enumerate(messages):
        following = messages[i + 1]["role"] if i + 1 < len(messages) else None
        if message["role"] == "assistant" and following == "assistant":
            continue
        kept.append(message)
    return kept


def same_except_interrupted(actual: list[Any], expected: list[Any]) -> bool:
    if len(actual) != len(expected):
        return False
    for got, want in zip(actual, expected, strict=True):
        if got["role"] != "tool":
            if got != want:
                return False
            continue
        for got_part, want_part in zip(got["content"], want["content"], strict=True):
            if got_part != want_part and got_part["output"] != TOOL_INTERRUPTED_MESSAGE:
                return False
    return True


@pytest.fixture(params=["sqlite", "postgres"])
def runtime_spec(request: Any, tmp_path: Path) -> Iterator[str]:
    """Where the workers keep their journal: a SQLite file, or a fresh schema on the test Postgres."""
    if request.param == "sqlite":
        yield f"sqlite:{tmp_path / 'journal.db'}"
        return
    from durable_agent.testing.services import postgres_schema

    with postgres_schema("torture") as conninfo:
        yield "postgres:" + conninfo


async def test_runs_survive_many_random_sigkills(runtime_spec: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    kills = supervise(runtime_spec, ledger, workers=3, max_kills=20, seed=7, deadline_s=150)
    print(f"\ncrash torture ({runtime_spec.split(':')[0]}): {kills} SIGKILLs of worker processes, "
          f"{len(SESSIONS)} sessions")
    assert kills == 20, "the supervisor should have killed busy workers 20 times"

    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    charges = [(e["session"], e["turn"]) for e in entries if e["kind"] == "effect" and e["tool"] == "charge"]
    assert len(charges) == len(set(charges)), "an unsafe effect happened twice"

    for session in SESSIONS:
        for turn in range(torture_worker.TURNS + 1):
            events = [e for e in entries if e["session"] == session and e.get("turn") == turn]
            first_effect = next((i for i, e in enumerate(events) if e["kind"] == "effect"), None)
            if first_effect is not None:
                late = [e for e in events[first_effect:] if e["kind"] == "model"]
                assert not late, f"{session} turn {turn}: a finished model call was requested again"

    requests = [(e["session"], e["turn"]) for e in entries if e["kind"] == "model"]
    print(f"model requests: {len(requests)} for {len(set(requests))} model steps; "
          f"charges: {len(charges)} (none twice)")

    expected = comparable(await reference_transcript())
    runtime = torture_worker.open_runtime(runtime_spec)
    interrupted = 0
    for session in SESSIONS:
        last = await runtime.stores.runs.last(session)
        checkpoint = await maybe_await(runtime.stores.session.load(last))
        assert checkpoint is not None and checkpoint.status == "completed", session
        assert same_except_interrupted(comparable(list(checkpoint.messages)), expected), session
        interrupted += sum(1 for m in checkpoint.messages if m["role"] == "tool" for p in m["content"]
                           if p["output"] == TOOL_INTERRUPTED_MESSAGE)
    print(f"unsafe calls reported as interrupted: {interrupted}")
    await maybe_await(runtime.close())


FENCING_WORKER = """
import asyncio, sys, time
sys.path.insert(0, {python!r})
from durable_agent import Agent, DurableOptions, ScriptedModel, StaleEpochError, Tool, call, reply
from durable_agent.runtime import RunOwner
from durable_agent.runtime.sqlite import sqlite_runtime

def stall(args):
    time.sleep(1.5)          # blocks the event loop: the lease is not renewed meanwhile
    return "slow result"

async def main():
    runtime = sqlite_runtime({db!r})
    runtime.owner = RunOwner("laptop", 1, runtime.owner.token)   # a machine that went to sleep
    model = ScriptedModel([reply("", call("stall", {{}})), reply("", call("stall", {{}})), "done"])
    agent = Agent(model=model, tools={{"stall": Tool(execute=stall)}}, session_id="shared",
                  durable=DurableOptions(runtime, stale_after_ms=300))
    try:
        await agent.run("go")
    except StaleEpochError as exc:
        print("STALE", exc.epoch, flush=True)
        sys.exit(3)
    print("FINISHED", flush=True)

asyncio.run(main())
"""


async def test_the_loser_of_a_lease_race_stops_with_stale_epoch_and_writes_nothing(tmp_path: Path) -> None:
    from durable_agent.runtime.sqlite import sqlite_runtime

    db = tmp_path / "fence.db"
    python_dir = str(Path(__file__).resolve().parent.parent / "python")
    script = tmp_path / "slow_worker.py"
    script.write_text(FENCING_WORKER.format(python=python_dir, db=str(db)))
    slow = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    runtime = sqlite_runtime(str(db))
    try:
        while await runtime.stores.runs.last("shared") is None:  # wait until the slow worker is inside its run
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.6)  # its lease (300 ms) lapses while its tool blocks
        claim = await runtime.lease.claim("shared", stale_at=runtime.clock() - 300)
        assert claim.claimed, "the lapsed lease should be claimable"
        out, err = slow.communicate(timeout=30)
    finally:
        if slow.poll() is None:
            slow.kill()
    assert slow.returncode == 3 and out.decode().startswith("STALE"), err.decode()[-2000:]
    run_id = await runtime.stores.runs.last("shared")
    checkpoint = runtime.stores.session.load(run_id)
    assert checkpoint is not None and checkpoint.step_index == 0  # the loser's step never landed
    records = await runtime.inspect.steps(run_id)
    assert all(r.status == "pending" for r in records if r.kind == "tool"), records  # never marked done by it
    await runtime.lease.release("shared", claim.epoch)
    runtime.close()
