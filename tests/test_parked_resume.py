"""`resume()` never decides a pending approval: a run parked on approvals stays parked until each one has a verdict,
on every runtime (memory, a SQLite file, a Postgres schema), whoever resumes it: another process, or a start-up
loop that resumes every session (tests/startup_loop.py, in process and as a real second process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import startup_loop
from agent_kit import tool_results
from durable_agent import UNANSWERED_REASON, GenerateTextResult, ToolApprovalResponse, Usage, resolve_approval
from helpers import maybe_await
from test_agent import Crash, runtime_on  # noqa: F401  # fixtures: memory, SQLite, Postgres
from test_runtime_postgres import conninfo, opened  # noqa: F401

HERE = Path(__file__).resolve().parent
SESSIONS = ("crashed", "parked", "done")


def ledger_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def stored(runtime: Any, run_id: str | None) -> Any:
    assert run_id is not None
    return await maybe_await(runtime.stores.checkpoints.load(run_id))


async def test_resume_without_every_verdict_leaves_the_run_parked(
    runtime_on: Callable[[], Any], tmp_path: Path  # noqa: F811
) -> None:
    ledger = tmp_path / "ledger.txt"
    first = await startup_loop.agent(runtime_on(), "parked", ledger).run("Pay and ship inv-7.")
    assert first.finish_reason == "suspended"
    pay, ship = first.pending_approvals
    parked = await stored(runtime_on(), first.run_id)

    resumer = startup_loop.agent(runtime_on(), "parked", ledger)  # another process, no verdict anywhere
    again = await resumer.resume()
    assert again is not None and again.finish_reason == "suspended" and again.run_id == first.run_id
    assert again.pending_approvals == first.pending_approvals  # the same requests, their tokens included
    assert list(again.messages) == list(parked.messages) and again.steps == () and again.usage == Usage()
    assert again.total_usage == first.total_usage
    assert resumer.model.requests == [] and ledger_of(ledger) == []  # type: ignore[attr-defined]
    runtime = runtime_on()
    assert await stored(runtime, first.run_id) == parked  # nothing settled, nothing denied
    assert {a.id: a.resolved for a in await runtime.inspect.awakeables()} == {pay.approval_id: False,
                                                                             ship.approval_id: False}
    assert await runtime.lease.resumable_run("parked") is None  # parked, not in progress

    # a verdict for one of the two: kept on its awakeable, and the run waits for the other
    half = await startup_loop.agent(runtime_on(), "parked", ledger).resume(
        approval_responses=[ToolApprovalResponse(pay.approval_id, True, token=pay.token)])
    assert half is not None and half.finish_reason == "suspended" and half.pending_approvals == first.pending_approvals
    assert {a.id: a.resolved for a in await runtime.inspect.awakeables()} == {pay.approval_id: True,
                                                                             ship.approval_id: False}
    assert await stored(runtime_on(), first.run_id) == parked and ledger_of(ledger) == []

    done = await startup_loop.agent(runtime_on(), "parked", ledger).resume(
        approval_responses=[ToolApprovalResponse(ship.approval_id, True, token=ship.token)])
    assert done is not None and done.text == "Paid and shipped."
    assert ledger_of(ledger) == ["pay inv-7", "ship inv-7"]
    assert UNANSWERED_REASON not in json.dumps(list(done.messages))


async def test_a_leg_that_died_before_settling_leaves_the_run_parked_again(
    runtime_on: Callable[[], Any], tmp_path: Path  # noqa: F811
) -> None:
    """The verdicts of a resume whose process died while settling them were never stored: the next resume without
    them must not read their absence as denials. The run is parked again (unmarked); once they come, the tool that
    finished in the dead leg is replayed from its record and the one that only started is reported interrupted."""
    ledger = tmp_path / "ledger.txt"
    first = await startup_loop.agent(runtime_on(), "parked", ledger).run("Pay and ship inv-7.")
    verdicts = [ToolApprovalResponse(r.approval_id, True, token=r.token) for r in first.pending_approvals]
    pay = startup_loop.effect(ledger, "pay")

    def dies_paying(args: Any) -> Any:
        pay(args)
        raise Crash()  # the process dies while the payment goes out

    with pytest.raises(Crash):
        await startup_loop.agent(runtime_on(), "parked", ledger, pay=dies_paying).resume(approval_responses=verdicts)
    runtime = runtime_on()
    assert await runtime.lease.resumable_run("parked") == first.run_id  # the dead leg left it in progress
    again = await startup_loop.agent(runtime_on(), "parked", ledger).resume()
    assert again is not None and again.finish_reason == "suspended"
    assert again.pending_approvals == first.pending_approvals
    assert sorted(ledger_of(ledger)) == ["pay inv-7", "ship inv-7"]  # the dead leg's round: pay died, ship finished
    assert await runtime.lease.resumable_run("parked") is None
    for request in first.pending_approvals:
        assert await resolve_approval(runtime, request.approval_id, approved=True, token=request.token)
    done = await startup_loop.agent(runtime_on(), "parked", ledger).resume()
    assert done is not None and done.text == "Paid and shipped."
    assert sorted(ledger_of(ledger)) == ["pay inv-7", "ship inv-7"]  # neither is sent again
    pay_result = next(p for m in done.messages if m["role"] == "tool" for p in tool_results(m)
                      if p["tool_call_id"] == "pay-1")
    assert pay_result["is_error"] and "interrupted" in pay_result["output"]


def crash(args: Any) -> Any:
    raise Crash()  # the process dies in the lookup


async def park_crash_finish(runtime: Any, ledger: Path) -> GenerateTextResult:
    """Three sessions as a crash leaves them: one parked on two approvals, one interrupted mid-tool, one finished."""
    parked = await startup_loop.agent(runtime, "parked", ledger).run("Pay and ship inv-7.")
    assert parked.finish_reason == "suspended" and len(parked.pending_approvals) == 2
    with pytest.raises(Crash):
        await startup_loop.agent(runtime, "crashed", ledger, lookup=crash).run("Look up inv-8.")
    assert (await startup_loop.agent(runtime, "done", ledger).run("Hi.")).text == "Hello."
    return parked


def check_start_up(outcomes: dict[str, Any], parked: GenerateTextResult, ledger: Path) -> None:
    """The interrupted run finished, the finished one was left alone, the parked one is still parked."""
    assert outcomes["crashed"]["finish_reason"] == "stop" and outcomes["crashed"]["text"] == "Looked it up."
    assert outcomes["done"] is None
    assert outcomes["parked"] == {
        "run_id": parked.run_id, "finish_reason": "suspended", "text": parked.text,
        "pending_approvals": [r.to_dict() for r in parked.pending_approvals], "model_calls": 0,
    }
    assert ledger_of(ledger) == []  # nothing paid or shipped; the interrupted lookup is not run again


async def approve_and_finish(runtime: Any, parked: GenerateTextResult, ledger: Path) -> None:
    """The verdicts arrive (a webhook), and the next start-up finishes the parked run: each effect once."""
    for request in parked.pending_approvals:
        assert await resolve_approval(runtime, request.approval_id, approved=True, token=request.token)
    outcomes = await startup_loop.resume_every_session(runtime, SESSIONS, ledger)
    assert outcomes["crashed"] is None and outcomes["done"] is None
    assert outcomes["parked"]["finish_reason"] == "stop" and outcomes["parked"]["text"] == "Paid and shipped."
    assert ledger_of(ledger) == ["pay inv-7", "ship inv-7"]
    final = await stored(runtime, parked.run_id)
    assert final.status == "completed" and UNANSWERED_REASON not in json.dumps(list(final.messages))


async def test_a_start_up_loop_resuming_every_session_leaves_the_parked_one_parked(
    runtime_on: Callable[[], Any], tmp_path: Path  # noqa: F811
) -> None:
    ledger = tmp_path / "ledger.txt"
    parked = await park_crash_finish(runtime_on(), ledger)
    outcomes = await startup_loop.resume_every_session(runtime_on(), SESSIONS, ledger)
    check_start_up(outcomes, parked, ledger)
    again = await startup_loop.resume_every_session(runtime_on(), SESSIONS, ledger)  # the next start-up
    assert again == {"crashed": None, "parked": outcomes["parked"], "done": None}
    await approve_and_finish(runtime_on(), parked, ledger)


@pytest.mark.host_only("runs the start-up loop in a second process")
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_second_process_resuming_every_session_leaves_the_parked_one_parked(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    database = str(tmp_path / "agent.db") if kind == "sqlite" else request.getfixturevalue("conninfo")
    ledger = tmp_path / "ledger.txt"
    runtime = startup_loop.open_runtime(database)
    try:
        parked = await park_crash_finish(runtime, ledger)
        loop = subprocess.run(
            [sys.executable, str(HERE / "startup_loop.py"), database, str(ledger), *SESSIONS],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "python"), str(HERE)])},
        )
        assert loop.returncode == 0, loop.stderr
        check_start_up(json.loads(loop.stdout), parked, ledger)
        await approve_and_finish(runtime, parked, ledger)
    finally:
        await maybe_await(runtime.close())
