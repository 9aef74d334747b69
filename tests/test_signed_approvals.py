"""Signed approvals wired into the loop: every client-mode request carries a token, and an approved
verdict is honoured only when its token pins exactly that call of that run."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from agent_kit import Ledger, tool_results, user
from durable_agent import (
    APPROVAL_TOKEN_DENIED_REASON,
    ApprovalSigner,
    InMemoryCheckpointStore,
    ScriptedModel,
    StreamToolApprovalRequest,
    StreamToolResult,
    ToolApprovalResponse,
    agent_tool,
    call,
    generate_text,
    reply,
    resume_from_checkpoint,
    resume_stream_from_checkpoint,
    stream_chat,
)

SECRET = "s" * 32
OTHER_SECRET = "o" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def ids(*values: str) -> Any:
    it = iter(values)
    return lambda: next(it)


async def suspended_run(store: InMemoryCheckpointStore, ledger: Ledger, signer: ApprovalSigner, run_id: str = "run-a",
                        amount: int = 5) -> Any:
    tools = {"pay": ledger.tool("pay", needs_approval=True)}
    model = ScriptedModel([reply("", call("pay", {"amount": amount})), "done"])
    first = await generate_text(model=model, messages=[user("pay")], tools=tools, store=store, run_id=run_id,
                                approval_signer=signer, generate_id=ids(f"ap-{run_id}"))
    return first, model, tools


async def test_every_client_mode_request_carries_a_token_bound_to_the_run() -> None:
    store, ledger, signer = InMemoryCheckpointStore(), Ledger(), ApprovalSigner(SECRET)
    first, _, _ = await suspended_run(store, ledger, signer)
    (request,) = first.pending_approvals
    payload = signer.verify(request.token)
    assert payload is not None and payload["run_id"] == "run-a" and payload["approval_id"] == "ap-run-a"
    stored = store.load("run-a")
    assert stored is not None and stored.pending_approvals == (request,)  # the token survives a restart
    streamed = stream_chat(model=ScriptedModel([reply("", call("pay", {"amount": 1}))]), messages=[user("x")],
                           tools={"pay": ledger.tool("pay", needs_approval=True)}, approval_signer=signer,
                           generate_id=ids("ap-s"))
    (part,) = [p async for p in streamed.full_stream if isinstance(p, StreamToolApprovalRequest)]
    assert signer.verify(part.token) is not None and "run_id" not in signer.verify(part.token)  # type: ignore[operator]


async def test_a_valid_token_approves_and_the_tool_runs() -> None:
    store, ledger, signer = InMemoryCheckpointStore(), Ledger(), ApprovalSigner(SECRET)
    first, model, tools = await suspended_run(store, ledger, signer)
    token = first.pending_approvals[0].token
    done = await resume_from_checkpoint(store, "run-a", model=model, tools=tools, approval_signer=signer,
                                        approval_responses=[ToolApprovalResponse("ap-run-a", True, token=token)])
    assert ledger.entries == [("pay", {"amount": 5})] and done.text == "done"


def _forge(token: str) -> str:
    head, payload, mac = token.split(".")
    return f"{head}.{payload}.{('A' if mac[0] != 'A' else 'B')}{mac[1:]}"


async def _attack_tokens(signer: ApprovalSigner, clock: Clock) -> dict[str, Any]:
    """Tokens that must all be refused for approval `ap-run-a` of run `run-a` (input amount 5)."""
    store, ledger = InMemoryCheckpointStore(), Ledger()
    other_run, _, _ = await suspended_run(store, ledger, signer, run_id="run-b")
    big, _, _ = await suspended_run(InMemoryCheckpointStore(), ledger, signer, run_id="run-a", amount=5000)
    own, _, _ = await suspended_run(InMemoryCheckpointStore(), ledger, signer, run_id="run-a")
    retired = ApprovalSigner(OTHER_SECRET, clock=clock)
    retired_run, _, _ = await suspended_run(InMemoryCheckpointStore(), ledger, retired, run_id="run-a")
    valid = own.pending_approvals[0].token
    return {
        "missing": None,
        "garbage": "not-a-token",
        "truncated": valid[: len(valid) // 2],
        "forged mac": _forge(valid),
        "from another run": other_run.pending_approvals[0].token,
        "same call, other input": big.pending_approvals[0].token,
        "signed with a key no longer listed": retired_run.pending_approvals[0].token,
        "wrong type": 12345,
    }


@pytest.mark.parametrize("attack", ["missing", "garbage", "truncated", "forged mac", "from another run",
                                    "same call, other input", "signed with a key no longer listed", "wrong type"])
async def test_attacks_are_denied_with_the_exact_reason(attack: str) -> None:
    clock = Clock()
    signer = ApprovalSigner(SECRET, clock=clock)
    token = (await _attack_tokens(signer, clock))[attack]
    store, ledger = InMemoryCheckpointStore(), Ledger()
    _, model, tools = await suspended_run(store, ledger, signer)
    done = await resume_from_checkpoint(store, "run-a", model=model, tools=tools, approval_signer=signer,
                                        approval_responses=[ToolApprovalResponse("ap-run-a", True, token=token)])
    result = tool_results(done.messages[2])[0]
    assert result == {**result, "is_error": True, "output": APPROVAL_TOKEN_DENIED_REASON}
    assert ledger.entries == []
    assert done.text == "done"  # the loop continues after the denial


async def test_a_token_for_another_approval_cannot_approve_this_one() -> None:
    store, ledger, signer = InMemoryCheckpointStore(), Ledger(), ApprovalSigner(SECRET)
    tools = {"pay": ledger.tool("pay", needs_approval=True)}
    model = ScriptedModel([reply("", call("pay", {"n": 1}), call("pay", {"n": 1})), "ok"])
    first = await generate_text(model=model, messages=[user("x")], tools=tools, store=store, run_id="r",
                                approval_signer=signer, generate_id=ids("ap-1", "ap-2"))
    token_one = first.pending_approvals[0].token
    done = await resume_from_checkpoint(store, "r", model=model, tools=tools, approval_signer=signer,
                                        approval_responses=[ToolApprovalResponse("ap-1", True, token=token_one),
                                                            ToolApprovalResponse("ap-2", True, token=token_one)])
    first_result, second_result = tool_results(done.messages[2])
    assert not first_result["is_error"] and second_result["output"] == APPROVAL_TOKEN_DENIED_REASON
    assert len(ledger.entries) == 1


async def test_replay_after_max_age_is_denied() -> None:
    clock = Clock()
    store, ledger, signer = InMemoryCheckpointStore(), Ledger(), ApprovalSigner(SECRET, clock=clock)
    first, model, tools = await suspended_run(store, ledger, signer)
    clock.now += 60 * 60 * 1000  # an hour later, exactly the window: expired (age >= max age)
    token = first.pending_approvals[0].token
    streamed = resume_stream_from_checkpoint(store, "run-a", model=model, tools=tools, approval_signer=signer,
                                             approval_max_age_ms=60 * 60 * 1000,
                                             approval_responses=[ToolApprovalResponse("ap-run-a", True, token=token)])
    parts = [p async for p in streamed.full_stream]
    assert isinstance(parts[0], StreamToolResult) and parts[0].output == APPROVAL_TOKEN_DENIED_REASON
    assert ledger.entries == []


async def test_denials_need_no_token_and_rotation_keeps_old_tokens_valid() -> None:
    store, ledger, old = InMemoryCheckpointStore(), Ledger(), ApprovalSigner(SECRET)
    first, model, tools = await suspended_run(store, ledger, old)
    denied = await resume_from_checkpoint(store, "run-a", model=model,
                                          tools=tools, approval_signer=old,
                                          approval_responses=[ToolApprovalResponse("ap-run-a", False, "No.")])
    assert tool_results(denied.messages[2])[0]["output"] == "No."

    store2 = InMemoryCheckpointStore()
    first, model, tools = await suspended_run(store2, ledger, old)
    rotated = ApprovalSigner(OTHER_SECRET, previous_secrets=[SECRET])  # deployed while the run waited
    done = await resume_from_checkpoint(store2, "run-a", model=model, tools=tools, approval_signer=rotated,
                                        approval_responses=[ToolApprovalResponse(
                                            "ap-run-a", True, token=first.pending_approvals[0].token)])
    assert not tool_results(done.messages[2])[0]["is_error"] and ledger.entries == [("pay", {"amount": 5})]


async def test_a_plain_same_process_call_verifies_verdicts_too() -> None:
    ledger, signer = Ledger(), ApprovalSigner(SECRET)
    tools = {"pay": ledger.tool("pay", needs_approval=True)}
    model = ScriptedModel([reply("", call("pay", {})), "ok"])
    first = await generate_text(model=model, messages=[user("x")], tools=tools, approval_signer=signer,
                                generate_id=ids("ap"))
    unsigned = await generate_text(model=model, messages=first.messages, tools=tools, approval_signer=signer,
                                   approval_responses=[ToolApprovalResponse("ap", True)])
    assert tool_results(unsigned.messages[2])[0]["output"] == APPROVAL_TOKEN_DENIED_REASON
    signed = await generate_text(model=model, messages=first.messages, tools=tools, approval_signer=signer,
                                 approval_responses=[ToolApprovalResponse("ap", True, token=first.pending_approvals[0].token)])
    assert not tool_results(signed.messages[2])[0]["is_error"] and ledger.entries == [("pay", {})]


async def test_a_raising_signer_is_logged_and_the_request_goes_out_unsigned(caplog: pytest.LogCaptureFixture) -> None:
    class BrokenSigner(ApprovalSigner):
        def sign(self, request: Any, *, run_id: str | None = None) -> str:
            raise RuntimeError("KMS unavailable")

    store, ledger = InMemoryCheckpointStore(), Ledger()
    with caplog.at_level(logging.ERROR, logger="durable_agent"):
        first, model, tools = await suspended_run(store, ledger, BrokenSigner(SECRET))
    assert first.pending_approvals[0].token is None
    assert any("unsigned" in r.getMessage() for r in caplog.records)
    done = await resume_from_checkpoint(store, "run-a", model=model, tools=tools, approval_signer=ApprovalSigner(SECRET),
                                        approval_responses=[ToolApprovalResponse("ap-run-a", True)])
    assert tool_results(done.messages[2])[0]["output"] == APPROVAL_TOKEN_DENIED_REASON  # the safe side


async def test_sub_agent_requests_are_signed_by_the_child_and_verified_through_agent_path() -> None:
    store, ledger, signer = InMemoryCheckpointStore(), Ledger(), ApprovalSigner(SECRET)
    child = agent_tool(name="coder", model=ScriptedModel([reply("", call("shell", {"cmd": "ls"})), "listed"]),
                       tools={"shell": ledger.tool("shell", needs_approval=True)})
    parent = ScriptedModel([reply("", call("coder", {"prompt": "ls"}, "t1")), "all done"])
    first = await generate_text(model=parent, messages=[user("x")], tools={"coder": child},
                                store=store, run_id="p", approval_signer=signer, generate_id=ids("ap-c"))
    (request,) = first.pending_approvals
    assert request.agent_path == ("coder",) and request.token is not None
    payload = signer.verify(request.token)
    assert payload is not None and payload["run_id"] == "p::coder#t1" and payload["agent_path"] == ["coder"]
    forged = await resume_from_checkpoint(store, "p", model=parent, tools={"coder": child}, approval_signer=signer,
                                          approval_responses=[ToolApprovalResponse("ap-c", True, token=_forge(request.token))])
    assert ledger.entries == [] and forged.text == "all done"

    store2 = InMemoryCheckpointStore()
    first = await generate_text(model=parent, messages=[user("x")], tools={"coder": child},
                                store=store2, run_id="p", approval_signer=signer, generate_id=ids("ap-c"))
    done = await resume_from_checkpoint(store2, "p", model=parent, tools={"coder": child}, approval_signer=signer,
                                        approval_responses=[ToolApprovalResponse("ap-c", True,
                                                                                 token=first.pending_approvals[0].token)])
    assert ledger.entries == [("shell", {"cmd": "ls"})] and done.text == "all done"
