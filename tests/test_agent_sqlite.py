"""`Agent` on the SQL runtimes: the key scenarios of test_agent.py on a real SQLite file (and on a real
Postgres schema when DURABLE_AGENT_TEST_POSTGRES_URL is set), each "process" its own connection;
then a real process SIGKILLed mid-tool on SQLite and resumed by another.

A simulated process death is a control error raised mid-step (never recorded, like a SIGKILL).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_kit import Ledger
from test_agent import Crash, StreamsThenDies
from test_runtime_postgres import conninfo, opened  # noqa: F401  # fixtures of the postgres case
from test_runtime_sqlite import skip_without_sqlite3

from durable_agent import (
    Agent,
    DurableOptions,
    RunLeaseHeldError,
    RunSuspendedError,
    ScriptedModel,
    StaleEpochError,
    Tool,
    call,
    reply,
)
from durable_agent._util import maybe_await
from durable_agent.errors import RUN_TAKEN_OVER_MESSAGE
from durable_agent.runtime import RunOwner

PYTHON_DIR = Path(__file__).resolve().parent.parent / "python"
SESSION = "chat-1"


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.host_only("needs a Postgres server"))]
)
def runtime_on(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Open another "process" (new connections) on the test's database; all closed afterwards."""
    if request.param == "postgres":
        return request.getfixturevalue("opened")  # test_runtime_postgres: a schema of the test's own
    from durable_agent.runtime.sqlite import sqlite_runtime

    skip_without_sqlite3()
    runtimes: list[Any] = []

    def open_runtime() -> Any:
        runtimes.append(sqlite_runtime(tmp_path / "agent.db"))
        return runtimes[-1]

    request.addfinalizer(lambda: [runtime.close() for runtime in runtimes])
    return open_runtime


@pytest.fixture
def agent_on(runtime_on: Callable[[], Any]) -> Callable[..., Agent]:
    def make(model: Any, tools: dict[str, Tool], **durable: Any) -> Agent:
        return Agent(
            model=model, tools=tools, durable=DurableOptions(runtime_on(), **durable), session_id=SESSION
        )

    return make


async def test_runs_of_a_session_share_its_history(agent_on: Callable[..., Agent]) -> None:
    model = ScriptedModel(["hello", "again"])
    await agent_on(model, {}).run("hi")
    second = await agent_on(model, {}).run("and now?")
    assert second.text == "again"
    assert [m["content"] for m in model.requests[1].messages] == [
        "hi",
        [{"type": "text", "text": "hello"}],
        "and now?",
    ]


async def test_resume_replays_the_step_in_flight(agent_on: Callable[..., Agent]) -> None:
    ledger = Ledger()
    crashed = [False]

    def charge(args: Any) -> str:
        ledger.entries.append(("charge", args))
        if not crashed[0]:
            crashed[0] = True
            raise Crash()
        return "charged"

    tools = {
        "lookup": Tool(execute=lambda a: ledger.entries.append(("lookup", a)) or "found", replay="safe"),
        "charge": Tool(execute=charge),
    }
    model = ScriptedModel([reply("", call("lookup", {"id": 1}), call("charge", {"usd": 5})), "Reported."])
    with pytest.raises(Crash):
        await agent_on(model, tools, stale_after_ms=1).run("buy it")
    resumed = await agent_on(model, tools).resume()
    assert resumed is not None and resumed.text == "Reported."
    assert len(model.requests) == 2
    assert ledger.entries == [("lookup", {"id": 1}), ("charge", {"usd": 5})]
    lookup, charge_result = resumed.messages[2]["content"]
    assert (
        lookup["output"] == "found" and charge_result["is_error"] and "interrupted" in charge_result["output"]
    )
    assert await agent_on(model, tools).resume() is None


async def test_safe_tools_run_again_after_a_crash(agent_on: Callable[..., Agent]) -> None:
    runs: list[int] = []

    def read(args: Any) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise Crash()
        return "content"

    tools = {"read": Tool(execute=read, replay="safe")}
    model = ScriptedModel([reply("", call("read", {})), "ok"])
    with pytest.raises(Crash):
        await agent_on(model, tools).run("x")
    resumed = await agent_on(model, tools).resume()
    assert resumed is not None and resumed.messages[2]["content"][0]["output"] == "content" and len(runs) == 2


async def test_stream_partials_become_an_aborted_assistant_turn_on_resume(
    agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]
) -> None:
    model = StreamsThenDies()
    with pytest.raises(Crash):
        await agent_on(model, {"noop": Tool(execute=lambda a: None)}).run("question")
    assert [p.text for p in await runtime_on().inspect.partials()] == ["The answer ", "is "]
    resumed = await agent_on(model, {"noop": Tool(execute=lambda a: None)}).resume()
    assert resumed is not None and resumed.text == "42."
    assert model.requests[1].messages[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "The answer is "}],
    }


async def test_a_second_process_cannot_run_a_held_session(agent_on: Callable[..., Agent]) -> None:
    seen: list[RunLeaseHeldError] = []

    async def nested(args: Any) -> str:
        with pytest.raises(RunLeaseHeldError) as info:
            await agent_on(ScriptedModel(["never"]), {}).run("me too")
        seen.append(info.value)
        return "done"

    model = ScriptedModel([reply("", call("nested", {})), "ok"])
    await agent_on(model, {"nested": Tool(execute=nested)}).run("go")
    assert seen and seen[0].session_id == SESSION and seen[0].owner is not None


async def test_a_writer_that_lost_the_lease_stops_at_once_without_a_final_save(
    runtime_on: Callable[[], Any],
) -> None:
    thief = runtime_on()

    async def steal(args: Any) -> str:
        assert (await thief.lease.claim(SESSION, stale_at=10**15)).claimed
        return "stolen"

    model = ScriptedModel([reply("", call("steal", {})), reply("", call("steal", {})), "never"])
    victim = runtime_on()
    victim.owner = RunOwner("laptop", 1, victim.owner.token)
    agent = Agent(
        model=model, tools={"steal": Tool(execute=steal)}, durable=DurableOptions(victim), session_id=SESSION
    )
    with pytest.raises(StaleEpochError) as info:
        await agent.run("go")
    assert RUN_TAKEN_OVER_MESSAGE in str(info.value)
    run_id = await thief.stores.runs.last(SESSION)
    assert (await maybe_await(thief.stores.session.load(run_id))).step_index == 0 and len(model.requests) == 1
    # The model call finished; the tool's done record came after the takeover and was refused.
    assert [(r.kind, r.status) for r in await thief.inspect.steps(run_id)] == [
        ("model", "done"),
        ("tool", "pending"),
    ]


async def test_heal_answers_the_interrupted_calls_and_starts_the_new_run(
    agent_on: Callable[..., Agent],
) -> None:
    def dies(args: Any) -> None:
        raise Crash()

    model = ScriptedModel([reply("", call("dies", {})), "New run answer."])
    with pytest.raises(Crash):
        await agent_on(model, {"dies": Tool(execute=dies)}).run("first")
    result = await agent_on(model, {"dies": Tool(execute=dies)}, stale_after_ms=1).run("second")
    history = model.requests[-1].messages
    assert history[2]["content"][0]["is_error"] and "interrupted" in history[2]["content"][0]["output"]
    assert history[3] == {"role": "user", "content": "second"} and result.text == "New run answer."


async def test_on_interrupted_resume_continues_the_run_before_the_prompt(
    agent_on: Callable[..., Agent],
) -> None:
    attempts: list[int] = []

    def flaky(args: Any) -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise Crash()
        return "fine"

    tools = {"flaky": Tool(execute=flaky, replay="safe")}
    model = ScriptedModel([reply("", call("flaky", {})), "first run done", "second run done"])
    with pytest.raises(Crash):
        await agent_on(model, tools, stale_after_ms=1).run("first")
    await asyncio.sleep(0.01)
    result = await agent_on(model, tools, on_interrupted="resume", stale_after_ms=1).run("second")
    assert result.text == "second run done" and len(attempts) == 2
    assert [m["content"] for m in model.requests[-1].messages if m["role"] == "user"] == ["first", "second"]


async def test_suspend_stops_the_run_and_resume_continues_it(agent_on: Callable[..., Agent]) -> None:
    holder: list[Agent] = []

    def pause(args: Any) -> str:
        holder[0].suspend()
        return "paused here"

    model = ScriptedModel([reply("", call("pause", {})), "after the pause"])
    holder.append(agent_on(model, {"pause": Tool(execute=pause)}))
    with pytest.raises(RunSuspendedError):
        await holder[0].run("go")
    resumed = await agent_on(model, {"pause": Tool(execute=pause)}).resume()
    assert resumed is not None and resumed.text == "after the pause"
    assert resumed.messages[2]["content"][0]["output"] == "paused here"


# ------------------------------------------------------------ a real SIGKILL

_WORKER = textwrap.dedent("""
    import asyncio, json, os, signal, sys
    from durable_agent import Agent, DurableOptions, ScriptedModel, Tool, call, reply
    from durable_agent.runtime.sqlite import sqlite_runtime

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
    agent = Agent(model=model, tools=tools, durable=DurableOptions(sqlite_runtime(db)), session_id="chat-1")
    asyncio.run(agent.run("buy it"))
""")


@pytest.mark.host_only("spawns and SIGKILLs a worker process")
async def test_a_run_sigkilled_mid_tool_resumes_in_another_process(tmp_path: Path) -> None:
    from durable_agent.runtime.sqlite import sqlite_runtime

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
    with sqlite_runtime(tmp_path / "agent.db") as runtime:
        resumed = await Agent(
            model=model, tools=tools, durable=DurableOptions(runtime), session_id=SESSION
        ).resume()
    assert resumed is not None and resumed.text == "Reported."
    assert (
        ran == [] and len(model.requests) == 1
    )  # the first model call and the lookup came from their records
    lookup, charge = resumed.messages[2]["content"]
    assert lookup["output"] == "found" and charge["is_error"] and "interrupted" in charge["output"]
    assert [json.loads(line)[0] for line in ledger.read_text().splitlines()] == [
        "lookup",
        "charge",
    ]  # once each
