"""Crash torture with real processes on the SQLite and Postgres runtimes, and lease fencing between two real workers.

The short version of benches/soak_crash.py (same supervisor, same checks: tests/torture_supervisor.py):
about 50 SIGKILLs per backend aimed between commits, inside tools (before and after the
effect) and at random moments, plus stalled (SIGSTOPped) workers racing a new owner. Asserted:
every session finishes every run; no unsafe effect twice; no finished model call requested
again; no final answer twice; transcripts equal an uncrashed session's except the documented
markers (an interrupted unsafe call's result, an aborted partial assistant turn).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torture_supervisor
import torture_worker

pytestmark = [
    pytest.mark.host_only("spawns and SIGKILLs worker processes"),
    pytest.mark.kernel_independent,  # its subject: the commit windows SIGKILLs land in, and leases (the rule: pyproject.toml)
]

SESSIONS = [f"account-{i}" for i in range(10)]
PROMPTS = 16  # enough work that the ~50 kills land before the sessions finish, four at a time per worker


@pytest.fixture(params=["sqlite", "postgres"])
def runtime_spec(request: Any, tmp_path: Path) -> Iterator[str]:
    """Where the workers keep their journal: a SQLite file, or a fresh schema on the test Postgres."""
    with torture_worker.journal_spec(request.param, tmp_path, "torture") as spec:
        yield spec


async def test_sessions_survive_sigkills_in_every_window(runtime_spec: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    tally = torture_supervisor.supervise(runtime_spec, ledger, sessions=SESSIONS, prompts=PROMPTS, workers=3,
                                         kills=50, seed=11, deadline_s=400)
    found = await torture_supervisor.check(runtime_spec, ledger, SESSIONS, PROMPTS)
    print(f"\ncrash torture ({runtime_spec.split(':')[0]}): {tally.total_kills} SIGKILLs {dict(tally.kills)}, "
          f"{tally.stalls} stalls, {tally.seconds:.0f} s; {found.model_requests} model requests for "
          f"{found.model_steps} model steps; {found.interrupted} unsafe calls reported interrupted; "
          f"{found.refused} claims refused; {found.torn} torn ledger lines")
    assert found.failures == {}, "\n".join(f"{name}: {value}" for name, value in found.failures.items())
    # the supervisor stops killing at 50; a fast machine may finish the sessions a few kills short of it
    assert tally.total_kills >= 40 and tally.stalls >= 1
    assert tally.kills["aimed"] >= 5 and tally.kills["random"] >= 5


def test_the_ledger_reader_skips_records_torn_by_a_kill_or_read_half_written() -> None:
    whole = [{"kind": "model", "session": "a", "pid": 1}, {"kind": "effect", "session": "b", "pid": 2}]
    lines = [json.dumps(entry).encode() for entry in whole]
    data = lines[0] + b"\n" + lines[0][:20] + lines[1] + b"\n" + lines[1][:15]  # torn mid-line, then half written
    assert torture_supervisor.ledger_entries(data) == (whole, 2)
    assert torture_supervisor.ledger_entries(lines[0][9:] + b"\n" + lines[1] + b"\n") == (whole[1:], 1)  # read from mid-line


FENCING_WORKER = """
import asyncio, sys, time
sys.path.insert(0, {python!r})
from durable_agent import Agent, DurableOptions, ScriptedModel, StaleEpochError, Tool, call, reply
from durable_agent.backends import RunOwner
from durable_agent.backends.sqlite import SqliteRuntime

def stall(args):
    time.sleep(1.5)          # blocks the event loop: the lease is not renewed meanwhile
    return "slow result"

async def main():
    runtime = SqliteRuntime({db!r})
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
    from durable_agent.backends.sqlite import SqliteRuntime

    db = tmp_path / "fence.db"
    python_dir = str(Path(__file__).resolve().parent.parent / "python")
    script = tmp_path / "slow_worker.py"
    script.write_text(FENCING_WORKER.format(python=python_dir, db=str(db)))
    slow = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    runtime = SqliteRuntime(str(db))
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
    assert run_id is not None and claim.epoch is not None
    checkpoint = await runtime.stores.checkpoints.load(run_id)
    assert checkpoint is not None and checkpoint.step_index == 0  # the loser's step never landed
    records = await runtime.inspect.steps(run_id)
    assert all(r.status == "pending" for r in records if r.kind == "tool"), records  # never marked done by it
    await runtime.lease.release("shared", claim.epoch)
    runtime.close()
