"""A real crash: a worker process running the demo agent on the SQLite store is SIGKILLed mid-step,
and other processes resume it. The outcome must equal a run that never crashed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

pytestmark = pytest.mark.host_only("spawns and SIGKILLs worker subprocesses")


def _without_approval_ids(messages: Any) -> list[Any]:
    """Approval ids are random per run; everything else must match exactly."""
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [{**p, "approval_id": "*"} if p["type"] == "tool-approval-request" else p for p in content]
        out.append({**message, "content": content})
    return out


async def _uncrashed_transcript(tmp_path: Path) -> list[Any]:
    import demo_agent

    from durable_agent import (
        InMemoryCheckpointStore,
        ToolApprovalResponse,
        generate_text,
        resume_from_checkpoint,
    )

    store = InMemoryCheckpointStore()
    tools = demo_agent.tools(tmp_path / "reference-ledger.jsonl")
    first = await generate_text(model=demo_agent.model(), tools=tools, max_steps=10, store=store, run_id="ref",
                                messages=[{"role": "user", "content": demo_agent.PROMPT}])
    done = await resume_from_checkpoint(store, "ref", model=demo_agent.model(), tools=tools, max_steps=10,
                                        approval_responses=[ToolApprovalResponse(first.pending_approvals[0].approval_id, True)])
    return _without_approval_ids(done.messages)


async def test_sigkill_mid_step_then_resume_in_new_processes(tmp_path: Path) -> None:
    import crash_demo
    import demo_agent

    from durable_agent.backends.sqlite import SqliteCheckpointStore

    db, ledger = tmp_path / "runs.db", tmp_path / "ledger.jsonl"
    killed = crash_demo.spawn("start", db, ledger, 0.02)
    events = crash_demo.follow(killed, kill_at_step=2)
    assert killed.returncode == -9  # really SIGKILLed
    assert not any(e["event"] == "finish" for e in events)
    with SqliteCheckpointStore(str(db)) as store:
        after_crash = store.load(crash_demo.RUN_ID)
    assert after_crash is not None and after_crash.status == "running" and after_crash.step_index == 1
    assert [e["tool"] for e in demo_agent.ledger_entries(ledger)] == ["read_file", "read_file"]

    resumed = crash_demo.follow(crash_demo.spawn("resume", db, ledger, 0.0))
    (approval,) = [e for e in resumed if e["event"] == "approval"]
    assert resumed[-1] == {**resumed[-1], "event": "finish", "reason": "suspended"}
    assert next(e["step"] for e in resumed if e["event"] == "step-start") == 2  # the interrupted step re-runs

    final = crash_demo.follow(crash_demo.spawn("resume", db, ledger, 0.0, verdict=approval["approval_id"]))
    assert final[-1]["event"] == "finish" and final[-1]["reason"] == "stop"
    with SqliteCheckpointStore(str(db)) as store:
        finished = store.load(crash_demo.RUN_ID)
    assert finished is not None and finished.status == "completed"
    assert _without_approval_ids(finished.messages) == await _uncrashed_transcript(tmp_path)
    assert [e["tool"] for e in demo_agent.ledger_entries(ledger)] == [
        "read_file", "read_file", "write_file", "run_tests", "deploy"]  # each effect exactly once


def test_the_demo_command_runs_end_to_end() -> None:
    import os
    import subprocess

    env = {**os.environ, "DEMO_DELAY": "0.01"}
    done = subprocess.run([sys.executable, str(EXAMPLES / "crash_demo.py")], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SIGKILL sent to pid" in done.stdout and "APPROVAL NEEDED" in done.stdout
