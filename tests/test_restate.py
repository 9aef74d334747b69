"""The journal's replay mode on a real restate-server: `durable_agent.restate` end to end.

Run under `DURABLE_AGENT_SERVICES="postgres redis restate" scripts/services run -- pytest ...`
(scripts/test does). Without a server the tests skip; with CI=true they fail.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("restate", reason="needs restate-sdk: pip install 'durable-agent[restate]'")

from durable_agent import TOOL_INTERRUPTED_MESSAGE, resolve_approval
from durable_agent.restate import RestateIngress, RestateIngressError
from durable_agent.testing.restate import (
    ServiceProcess,
    admin_query,
    ingress_call,
    restate_urls,
)
from durable_agent.testing.runtime_conformance import CHECKPOINT_ONLY, DurableRuntimeConformance

SERVICE = Path(__file__).resolve().parent / "restate_service.py"
pytestmark = [
    pytest.mark.host_only("a real restate-server and a service process"),
    pytest.mark.kernel_independent,  # its subject: the Restate server and service processes (the rule: pyproject.toml)
]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    _, admin = restate_urls()
    process = ServiceProcess(admin, tmp_path_factory.mktemp("restate-ledger"), SERVICE)
    process.start()
    yield process
    process.stop()


def ingress(name: str) -> RestateIngress:
    return RestateIngress(restate_urls()[0], name=name, timeout=120)


def ledger(service: ServiceProcess) -> list[str]:
    path = service.workdir / "ledger"
    return path.read_text().splitlines() if path.exists() else []


def session_id() -> str:
    return f"s{uuid.uuid4().hex[:12]}"


async def until(check: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def park_the_readme_run(service: ServiceProcess, client: RestateIngress, session: str) -> tuple[str, Any]:
    """Start the README agent's run, wait until Restate suspended it on its approval, and SIGKILL the service
    process that ran it: (the invocation id, the pending approval)."""
    paid = ledger(service).count("effect pay inv-7")  # by the tests before
    invocation = await client.send(session, f"{session} Pay invoice inv-7.")

    async def parked() -> Any:
        status = await client.status(session)
        return status if status["pending_approvals"] else None

    status = await until(parked, "the run to park on its approval")
    assert status["status"] == "suspended"
    (request,) = status["pending_approvals"]
    assert (request["tool_name"], request["input"]) == ("pay", {"id": "inv-7"}) and request["token"]
    assert request["awakeable_id"].startswith("sign_")  # the Restate awakeable the approval id maps to

    async def suspended() -> bool:
        rows = admin_query(service.admin, f"SELECT status FROM sys_invocation WHERE id = '{invocation}'")
        return bool(rows) and rows[0]["status"] == "suspended"

    await until(suspended, "Restate to suspend the parked invocation")  # no process holds the run
    service.kill()  # and the process that ran it is gone
    assert ledger(service).count("effect pay inv-7") == paid
    return invocation, request


async def test_the_readme_agent_parks_on_an_approval_and_an_ingress_call_from_another_process_finishes_it(
    service: ServiceProcess,
) -> None:
    client, session = ingress("readme"), session_id()
    paid = ledger(service).count("effect pay inv-7")
    invocation, request = await park_the_readme_run(service, client, session)
    service.start()  # another process serves the agent; the test process is the resolver
    assert await resolve_approval(client, "no-such-approval", approved=True) is False
    assert await resolve_approval(client, request["approval_id"], approved=True, token=request["token"]) is True
    result = await client.output(invocation)
    assert (result["finish_reason"], result["text"]) == ("stop", "Invoice inv-7 is paid.")
    assert ledger(service).count("effect pay inv-7") == paid + 1
    model_calls = [line for line in ledger(service) if line.startswith(f"model {session} ")]
    assert model_calls == [f"model {session} {t} {e}" for t in range(3) for e in ("begin", "end")]
    assert (await client.status(session))["status"] == "completed"


async def test_a_verdict_sent_while_no_service_process_runs_is_accepted_and_applied_after_the_restart(
    service: ServiceProcess,
) -> None:
    """`resolve_approval` returns once Restate accepted the verdict: it does not wait for a service process
    (it used to wait out the client's timeout, then raise, although Restate had queued the verdict)."""
    client, session = ingress("readme"), session_id()
    paid = ledger(service).count("effect pay inv-7")
    invocation, request = await park_the_readme_run(service, client, session)
    impatient = RestateIngress(restate_urls()[0], name="readme", timeout=20)  # what a timed-out call would take
    try:
        assert await resolve_approval(impatient, request["approval_id"], approved=True, token=request["token"])
        assert ledger(service).count("effect pay inv-7") == paid  # nothing ran it yet
    finally:
        service.start()  # the verdict waited in Restate
    result = await client.output(invocation)
    assert (result["finish_reason"], result["text"]) == ("stop", "Invoice inv-7 is paid.")
    assert ledger(service).count("effect pay inv-7") == paid + 1


async def test_a_replay_of_a_run_parked_on_an_approval_parks_it_again_and_never_denies_the_approval(
    service: ServiceProcess,
) -> None:
    """What resuming means on Restate: the engine retries the invocation, whose replay waits on the same awakeable
    (the runtime lists nothing resumable, and `run_agent` resumes the run only once every verdict is in). The
    user's pending decision is never taken for them: killed while parked, the run parks again, undenied."""
    client, session = ingress("patient"), session_id()
    paid = ledger(service).count("effect pay inv-7")
    invocation = await client.send(session, f"{session} Pay invoice inv-7.")

    async def parked() -> Any:
        status = await client.status(session)
        return status if status["pending_approvals"] else None

    before = await until(parked, "the run to park on its approval")
    (row,) = admin_query(service.admin, f"SELECT status FROM sys_invocation WHERE id = '{invocation}'")
    assert row["status"] == "running"  # parked on its stream: the SIGKILL fails the attempt, Restate retries it
    service.kill()
    service.start()

    async def replaying() -> bool:
        (row,) = admin_query(service.admin, "SELECT status, retry_count FROM sys_invocation "
                                            f"WHERE id = '{invocation}'")
        return row["status"] == "running" and (row.get("retry_count") or 0) > 0

    await until(replaying, "Restate to retry the invocation on the new process")
    after = await client.status(session)
    assert (after["status"], after["pending_approvals"]) == ("suspended", before["pending_approvals"])
    (request,) = after["pending_approvals"]
    assert await resolve_approval(client, request["approval_id"], approved=True, token=request["token"]) is True
    result = await client.output(invocation)
    assert (result["finish_reason"], result["text"]) == ("stop", "Invoice inv-7 is paid.")  # not denied for us
    tool_results = [p for m in result["messages"] if m["role"] == "tool" for p in m["content"]]
    assert [(p["tool_name"], p["output"], p["is_error"]) for p in tool_results][-1] == ("pay", "paid", False)
    assert ledger(service).count("effect pay inv-7") == paid + 1


async def test_a_forged_token_is_refused_as_on_the_other_runtimes(service: ServiceProcess) -> None:
    client, session = ingress("readme"), session_id()
    invocation = await client.send(session, f"{session} Pay invoice inv-7.")

    async def parked() -> Any:
        return (await client.status(session))["pending_approvals"]

    (request,) = await until(parked, "the run to park on its approval")
    forged = request["token"][:-4] + ("AAAA" if not request["token"].endswith("AAAA") else "BBBB")
    # This time through Restate's own awakeable endpoint, by the awakeable id `status` maps the approval to.
    verdict = json.dumps({"approved": True, "reason": None, "token": forged}).encode()
    resolve = urllib.request.Request(f"{restate_urls()[0]}/restate/awakeables/{request['awakeable_id']}/resolve",
                                     data=verdict, method="POST", headers={"content-type": "application/json"})
    await asyncio.to_thread(lambda: urllib.request.urlopen(resolve, timeout=30).close())
    result = await client.output(invocation)
    tool_results = [p for m in result["messages"] if m["role"] == "tool" for p in m["content"]]
    assert tool_results[-1]["tool_name"] == "pay" and tool_results[-1]["is_error"] is True
    assert "effect pay inv-7" not in [line for line in ledger(service) if session in line]


async def test_sigkills_mid_model_stream_and_mid_unsafe_tool_each_effect_once_no_finished_call_again(
    service: ServiceProcess,
) -> None:
    client, session = ingress("crashy"), session_id()
    (service.workdir / "kill-points").write_text("model-stream unsafe-tool\n")
    try:
        invocation = await client.send(session, f"{session} charge me")
        for point in ("model-stream", "unsafe-tool"):
            await asyncio.to_thread(service.wait_killed)
            assert f"killed {point}" in ledger(service)
            service.start()  # Restate retries the invocation on the new process
        result = await client.output(invocation)
    finally:
        (service.workdir / "kill-points").unlink()
    assert (result["finish_reason"], result["text"]) == ("stop", "finished")
    lines = ledger(service)
    assert lines.count(f"effect charge {session}") == 1  # the unsafe effect: once
    tool_results = [p for m in result["messages"] if m["role"] == "tool" for p in m["content"]]
    assert [(p["output"], p["is_error"]) for p in tool_results] == [(TOOL_INTERRUPTED_MESSAGE, True)]
    calls = [line for line in lines if line.startswith(f"model {session} ")]
    assert calls.count(f"model {session} 0 begin") == 2  # the first was killed mid-stream...
    assert calls.count(f"model {session} 0 end") == 1  # ...the one that finished was not requested again
    assert calls.count(f"model {session} 1 begin") == calls.count(f"model {session} 1 end") == 1
    # The engine's journal: the unsafe step's intent was acknowledged before its handler's entry; the
    # handler's entry holds `interrupted`; no model step has an intent.
    rows = admin_query(service.admin, f"SELECT index, entry_type, name FROM sys_journal WHERE id = '{invocation}' "
                                      "ORDER BY index")
    runs = [(r["index"], r.get("name") or "") for r in rows if r["entry_type"] == "Command: Run"]
    intents = [(i, name) for i, name in runs if name.startswith("intent ")]
    assert len(intents) == 1 and ":model:" not in intents[0][1]
    intent_at, intent_name = intents[0]
    handler_at = next(i for i, name in runs if name == intent_name.removeprefix("intent "))
    acks = [r["index"] for r in rows if r["entry_type"] == "Notification: Run"]
    assert any(intent_at < ack < handler_at for ack in acks)


async def test_parallel_unsafe_tools_replay_in_the_journal_order_after_a_sigkill(service: ServiceProcess) -> None:
    client, session = ingress("parallel"), session_id()
    (service.workdir / "kill-points").write_text("after-fan-out\n")
    try:
        invocation = await client.send(session, f"{session} fan out")
        await asyncio.to_thread(service.wait_killed)
        service.start()  # the new process replays three concurrent unsafe steps from the journal
        result = await client.output(invocation)
    finally:
        (service.workdir / "kill-points").unlink()
    assert (result["finish_reason"], result["text"]) == ("stop", "fanned out")
    effects = [line for line in ledger(service) if line.startswith(f"effect work {session}-")]
    assert sorted(effects) == [f"effect work {session}-{n}" for n in (1, 2, 3)]  # each once
    tool_results = [p for m in result["messages"] if m["role"] == "tool" for p in m["content"]]
    assert [p["output"] for p in tool_results[:3]] == [f"worked {session}-{n}" for n in (1, 2, 3)]


async def test_two_clients_sending_to_one_session_are_serialised_by_the_engine(service: ServiceProcess) -> None:
    session = session_id()
    first, second = await asyncio.gather(ingress("serial").run(session, f"{session} one"),
                                         ingress("serial").run(session, f"{session} two"))
    assert sorted([first["text"], second["text"]]) == ["seen 1 prompts", "seen 2 prompts"]
    calls = [line.rsplit(" ", 1)[1] for line in ledger(service) if line.startswith(f"model {session} ")]
    assert calls == ["begin", "end", "begin", "end"]  # never two model calls of the session at once
    later = first if first["text"] == "seen 2 prompts" else second
    prompts = [m["content"] for m in later["messages"] if m["role"] == "user"]
    assert prompts in ([f"{session} one", f"{session} two"], [f"{session} two", f"{session} one"])


async def test_a_failing_model_fails_the_invocation_for_good_and_the_next_run_heals_it(
    service: ServiceProcess,
) -> None:
    client, session = ingress("failing"), session_id()
    with pytest.raises(RestateIngressError) as info:
        await client.run(session, f"{session} please fail")
    assert "StepFailedError" in str(info.value) and "model down" in str(info.value)
    assert [line for line in ledger(service) if line.startswith(f"model {session} ")] == [f"model {session} 0 begin"]
    result = await client.run(session, f"{session} hello")  # the failed run is healed, the session goes on
    assert (result["finish_reason"], result["text"]) == ("stop", "fine, 2 prompts")




async def test_a_model_retry_waits_on_a_durable_timer_of_the_engine(service: ServiceProcess) -> None:
    """The retry policy's backoff runs as `ctx.sleep`: the failed attempt and the timer are journal entries."""
    client, session = ingress("busy"), session_id()
    result = await client.run(session, f"{session} hello")
    assert (result["finish_reason"], result["text"]) == ("stop", "answered after a retry")
    begun = [line for line in ledger(service) if line.startswith(f"model {session} ") and line.endswith("begin")]
    assert len(begun) == 2  # the overloaded attempt, then the retry
    rows = admin_query(restate_urls()[1], "SELECT j.entry_type AS entry_type, j.name AS name FROM sys_journal j "
                                          f"JOIN sys_invocation i ON j.id = i.id WHERE i.target_service_key = '{session}'")
    assert "Command: Sleep" in [r["entry_type"] for r in rows], rows
    names = [r.get("name") or "" for r in rows]
    assert any(name.endswith(":model:0") for name in names) and any(name.endswith(":model:1") for name in names), names


CASES = sorted(name for name in dir(DurableRuntimeConformance) if name.startswith("test_"))


@pytest.mark.parametrize("case", CASES)
async def test_runtime_conformance_in_replay_mode(service: ServiceProcess, case: str) -> None:
    """Each case runs inside a Restate invocation of the test service, on a `RestateRuntime`."""
    reason = CHECKPOINT_ONLY.get(case)
    if reason is not None:
        pytest.skip(f"replay mode: {reason}")
    outcome = await asyncio.to_thread(ingress_call, restate_urls()[0], "conformance", f"{case}-{uuid.uuid4().hex[:8]}",
                                      "case", case)
    assert outcome == {"passed": case}, outcome.get("failed")


async def test_scope_sleep_is_a_durable_timer_of_the_engine(service: ServiceProcess) -> None:
    """The seam a model retry policy waits through: on Restate it is `ctx.sleep`, a journaled timer."""
    ingress_url, admin = restate_urls()
    key = f"sleep-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(ingress_call, ingress_url, "conformance", key, "durable_sleep", 50)
    rows = admin_query(admin, "SELECT j.entry_type AS entry_type FROM sys_journal j JOIN sys_invocation i "
                              f"ON j.id = i.id WHERE i.target_service_key = '{key}'")
    assert "Command: Sleep" in [r["entry_type"] for r in rows]


async def test_an_awakeable_times_out_on_a_durable_timer_or_takes_its_value(service: ServiceProcess) -> None:
    outcome = await asyncio.to_thread(ingress_call, restate_urls()[0], "conformance",
                                      f"awk-{uuid.uuid4().hex[:8]}", "awakeable_outcomes", 100)
    assert outcome == [True, {"approved": True}]


@pytest.mark.parametrize("order", ["lookup charge tag", "charge tag lookup"])
@pytest.mark.parametrize("point", ["charge-mid-round", "lookup-mid-round"])
@pytest.mark.parametrize("agent", ["rounds", "gated"])  # gated: max_tool_concurrency=2, the third call waits
async def test_a_sigkill_mid_round_of_safe_and_unsafe_tools_completes_with_the_unsafe_effect_at_most_once(
    service: ServiceProcess, agent: str, order: str, point: str,
) -> None:
    """Killed inside `charge` while the slow safe `lookup` still runs, or inside `lookup` after `charge` (which
    stages tool state) and `tag` finished, with the safe call first or the unsafe one: the replay matches the
    journal and the run finishes."""
    client, session = ingress(agent), session_id()
    (service.workdir / "kill-points").write_text(f"{point}:{session}\n")
    try:
        invocation = await client.send(session, f"{session} {order}")
        await asyncio.to_thread(service.wait_killed)
        assert f"killed {point}:{session}" in ledger(service)
        log_from = len(service_log(service))
        service.start()  # Restate retries the invocation on the new process
        result = await until(lambda: finished(service, client, invocation, log_from), "the replayed round to finish")
    finally:
        (service.workdir / "kill-points").unlink()
    assert (result["finish_reason"], result["text"]) == ("stop", "round done")
    assert ledger(service).count(f"effect charge {session}") == 1
    outputs = {p["tool_name"]: p["output"] for m in result["messages"] if m["role"] == "tool" for p in m["content"]}
    assert outputs["lookup"] == {"id": session, "amount": 42}  # the safe tool ran again where it had not finished
    assert outputs["charge"] == (TOOL_INTERRUPTED_MESSAGE if point == "charge-mid-round" else "charged")
    assert outputs["tag"] == "tagged"


def service_log(service: ServiceProcess) -> str:
    return (service.workdir / "service.log").read_text()


async def finished(service: ServiceProcess, client: RestateIngress, invocation: str,
                   log_from: int) -> dict[str, Any] | None:
    """The invocation's outcome once it completed; None while it runs; fails at once when its replay does not
    match the journal (Restate would retry it until it pauses it)."""
    mismatch = "(570)" in service_log(service)[log_from:]
    assert not mismatch, "journal mismatch 570: the replay took another path than the killed attempt"
    (row,) = admin_query(service.admin, f"SELECT status FROM sys_invocation WHERE id = '{invocation}'")
    if row["status"] != "completed":
        return None
    return await client.output(invocation)


async def test_an_agent_with_an_mcp_server_completes_and_a_sigkill_mid_call_never_runs_the_unsafe_effect_twice(
    service: ServiceProcess,
) -> None:
    """The served agent's tools are a stdio MCP server's (tests/mcp_test_server.py, its own ledger). The server
    adds a tool and announces it; the next step offers it; the service is SIGKILLed while the server's `charge`
    runs, after its effect. Restate retries the invocation on a new process with a new server (which lacks the
    added tool): the replay matches the journal (the listing change included), the charge is reported
    interrupted, not run again, the added tool's call is an error result, and the run completes."""
    from mcp_kit import effects

    client, session = ingress("mcp"), session_id()
    mcp_ledger = service.workdir / "mcp-ledger.jsonl"
    invocation = await client.send(session, f"{session} charge me")
    await until(lambda: asyncio.to_thread(lambda: any(e["account"] == session for e in effects(mcp_ledger, "charge"))),
                "the MCP server's charge effect", 120)
    service.kill()
    log_from = len(service_log(service))
    service.start()  # Restate retries the invocation on the new process, which starts its own MCP server
    result = await until(lambda: finished(service, client, invocation, log_from), "the replayed run to finish", 120)
    assert (result["finish_reason"], result["text"]) == ("stop", "mcp done")
    assert len([e for e in effects(mcp_ledger, "charge") if e["account"] == session]) == 1  # once, never again
    outputs = {p["tool_call_id"]: p for m in result["messages"] if m["role"] == "tool" for p in m["content"]}
    assert outputs["grow-1"]["output"] == {"result": "grown"}
    assert (outputs["charge-1"]["output"], outputs["charge-1"]["is_error"]) == (TOOL_INTERRUPTED_MESSAGE, True)
    assert outputs["extra-1"]["is_error"] and "no longer offers the tool 'extra'" in outputs["extra-1"]["output"]
    offered = [line.split()[-1] for line in ledger(service) if line.startswith(f"offered {session} ")]
    assert offered == ["False", "True", "True", "True"]  # from the step after the announcement on, replayed too
