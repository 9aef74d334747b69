"""`Agent` on the SQLite runtime with a real process: a run SIGKILLed in the middle of an unsafe tool is
resumed by another process; nothing runs twice and the finished model call is not requested again.

The in-process scenarios (replay, leases, heal/resume, suspend, approvals, tool state) run on every
runtime, this one included, in test_agent.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent_kit import tool_results
from durable_agent import Agent, CheckpointCorruptError, DurableOptions, ScriptedModel, Tool, call, reply

PYTHON_DIR = Path(__file__).resolve().parent.parent / "python"
SESSION = "chat-1"


# ------------------------------------------------------------ a real SIGKILL

_WORKER = textwrap.dedent("""
    import asyncio, json, os, signal, sys
    from durable_agent import Agent, DurableOptions, ScriptedModel, Tool, call, reply
    from durable_agent.backends.sqlite import SqliteRuntime

    db, ledger = sys.argv[1], sys.argv[2]

    def effect(name):
        def execute(args):
            with open(ledger, "a") as f:
                f.write(json.dumps([name, args]) + "\\n")
            if name == "charge":
                os.kill(os.getpid(), signal.SIGKILL)  # dies while the card is being charged
            return "found"
        return execute

    model = ScriptedModel([reply("", call("lookup", {"id": 1}), call("charge", {"usd": 5})), "never"])
    tools = {"lookup": Tool(execute=effect("lookup"), replay="safe"), "charge": Tool(execute=effect("charge"))}
    agent = Agent(model=model, tools=tools, durable=DurableOptions(SqliteRuntime(db)), session_id="chat-1")
    asyncio.run(agent.run("buy it"))
""")


@pytest.mark.host_only("spawns and SIGKILLs a worker process")
async def test_a_run_sigkilled_mid_tool_resumes_in_another_process(tmp_path: Path) -> None:
    from durable_agent.backends.sqlite import SqliteRuntime

    ledger = tmp_path / "ledger.jsonl"
    worker = subprocess.run(
        [sys.executable, "-c", _WORKER, str(tmp_path / "agent.db"), str(ledger)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=PYTHON_DIR,
        env={"PYTHONPATH": str(PYTHON_DIR), "PATH": "/usr/bin:/bin"},
    )
    assert worker.returncode == -9, worker.stderr
    model = ScriptedModel([reply("", call("lookup", {"id": 1}), call("charge", {"usd": 5})), "Reported."])
    ran: list[str] = []
    tools = {
        "lookup": Tool(execute=lambda a: ran.append("lookup"), replay="safe"),
        "charge": Tool(execute=lambda a: ran.append("charge")),
    }
    # The worker's pid is gone: its lease is free at once, no staleness wait.
    with SqliteRuntime(tmp_path / "agent.db") as runtime:
        resumed = await Agent(
            model=model, tools=tools, durable=DurableOptions(runtime), session_id=SESSION
        ).resume()
    assert resumed is not None and resumed.text == "Reported."
    # The first model call came from its record and the charge was not run again. The lookup is
    # safe: it comes from its record if its done record was durable before the kill, else it runs again.
    assert "charge" not in ran and len(model.requests) == 1
    lookup, charge = tool_results(resumed.messages[2])
    assert lookup["output"] in ("found", None) and not lookup["is_error"]
    assert charge["is_error"] and "interrupted" in charge["output"]
    assert [json.loads(line)[0] for line in ledger.read_text().splitlines()] == [
        "lookup",
        "charge",
    ]  # once each


# ------------------------------------------------------------ damage behind the runtime's back


@pytest.mark.requires_sqlite
async def test_a_stray_message_row_fails_one_checkpoint_commit_and_the_run_completes_healed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A row nobody saved where the step's messages go: that step's commit fails as corruption of the run
    (it was a raw sqlite3.IntegrityError), the loop logs it and goes on, and the next commit heals the run."""
    import sqlite3

    from durable_agent.backends.sqlite import SqliteRuntime

    def stray_row() -> None:  # another connection to the file (a foreign writer, or damage)
        with contextlib.closing(sqlite3.connect(tmp_path / "agent.db", timeout=10)) as conn, conn:
            conn.execute("INSERT INTO durable_agent_messages (run_id, seq, body) VALUES (?, ?, ?)", ("r", 1, '"stray"'))

    with SqliteRuntime(tmp_path / "agent.db") as runtime:

        async def lookup(args: object) -> str:
            stray_row()  # seq 1: where this step's assistant message goes
            return "found"

        model = ScriptedModel([reply("", call("lookup", {"id": 1})), "Done."])
        agent = Agent(model=model, tools={"lookup": Tool(execute=lookup)}, durable=DurableOptions(runtime),
                      session_id=SESSION)
        with caplog.at_level(logging.ERROR, logger="durable_agent"):
            result = await agent.run("find it", run_id="r")
        assert result.text == "Done." and len(model.requests) == 2
        failed = [r for r in caplog.records if "saving checkpoint r#1 failed" in r.getMessage()]
        assert len(failed) == 1 and isinstance(failed[0].exc_info[1], CheckpointCorruptError)  # type: ignore[index]
        stored = await runtime.stores.checkpoints.load("r")
        assert stored is not None and stored.status == "completed" and stored.messages == list(result.messages)
