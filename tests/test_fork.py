"""fork_run / update_run on real runs of the loop: a fork continues from its step, the source is untouched."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agent_kit import tool_results
from durable_agent import (
    InMemoryCheckpointStore,
    ScriptedModel,
    Tool,
    ToolApprovalResponse,
    call,
    checkpoint_at_step,
    fork_run,
    generate_text,
    reply,
    resume_from_checkpoint,
    update_run,
)

TOOLS = {
    "lookup": Tool(description="Find.", parameters={"type": "object"}, execute=lambda args: {"amount": 42}),
    "pay": Tool(description="Pay.", parameters={"type": "object"}, execute=lambda args: "paid", needs_approval=True),
}


def model() -> ScriptedModel:
    return ScriptedModel([reply("Looking.", call("lookup", {})), reply("Paying.", call("pay", {})), "Done."])


def test_a_fork_resumes_from_its_step_and_the_source_is_untouched() -> None:
    async def main() -> None:
        store = InMemoryCheckpointStore()
        first = await generate_text(model=model(), tools=TOOLS, max_steps=5, store=store, run_id="run",
                                    messages=[{"role": "user", "content": "Pay inv-7."}])
        assert first.finish_reason == "suspended"
        source = await checkpoint_at_step(store, "run")
        assert source.step_index == 1 and source.status == "suspended"

        at0 = await checkpoint_at_step(store, "run", 0)
        assert [m["role"] for m in at0.messages] == ["user", "assistant", "tool"] and at0.status == "running"
        forked = await fork_run(store, "run", new_run_id="fork", at_step=0,
                                edit=lambda h: [{"role": "user", "content": "Pay inv-8 instead."}, *h[1:]])
        assert forked.step_index == 0 and forked.usage == at0.usage

        resumed = await resume_from_checkpoint(store, "fork", model=model(), tools=TOOLS, max_steps=5)
        assert resumed.finish_reason == "suspended"
        assert resumed.steps[0].step_index == 1  # the fork continues with the step after its own
        fork_cp = await checkpoint_at_step(store, "fork")
        assert fork_cp.messages[0]["content"] == "Pay inv-8 instead."
        assert await checkpoint_at_step(store, "run") == source

        # update_run: drop the pending pay call in place; the run is no longer suspended
        updated = await update_run(store, "fork", lambda h: h[:-1])
        assert updated.status == "running" and updated.pending_approvals is None
        done = await resume_from_checkpoint(store, "run", model=model(), tools=TOOLS, max_steps=5,
                                            approval_responses=[ToolApprovalResponse(
                                                first.pending_approvals[0].approval_id, True)])
        assert done.text == "Done."

    asyncio.run(main())


def test_bad_steps_and_ids_are_configuration_errors() -> None:
    import pytest

    from durable_agent import ConfigurationError
    from durable_agent.testing import make_checkpoint

    store = InMemoryCheckpointStore()
    store.save(make_checkpoint("r", 1))
    for bad in (True, "1", -1, 1.0):
        with pytest.raises(ConfigurationError):
            asyncio.run(checkpoint_at_step(store, "r", bad))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        asyncio.run(fork_run(store, "r", new_run_id=""))
    with pytest.raises(ConfigurationError):
        asyncio.run(fork_run(store, "r", new_run_id="s", edit=lambda h: "not a history"))  # type: ignore[arg-type,return-value]


CLIENT_TOOLS = {
    "ask": Tool(description="Ask the user.", parameters={"type": "object"}),  # no execute: the UI answers
    "lookup": TOOLS["lookup"],
    "pay": TOOLS["pay"],
}


def answer(call_id: str, name: str = "ask") -> Callable[[list[Any]], list[Any]]:
    """An edit appending the UI's result of `call_id` to the parked step's tool message (one message holds them)."""

    def edit(history: list[Any]) -> list[Any]:
        part = {"type": "tool-result", "tool_call_id": call_id, "tool_name": name, "output": "yes", "is_error": False}
        if history[-1]["role"] == "tool":
            return [*history[:-1], {"role": "tool", "content": [*history[-1]["content"], part]}]
        return [*history, {"role": "tool", "content": [part]}]

    return edit


async def parked(store: InMemoryCheckpointStore, *calls: Any) -> None:
    result = await generate_text(model=ScriptedModel([reply("Asking.", *calls), "Done."]), tools=CLIENT_TOOLS,
                                 max_steps=5, store=store, run_id="run",
                                 messages=[{"role": "user", "content": "Go."}])
    assert result.finish_reason == "suspended"


@pytest.mark.parametrize("tools", [CLIENT_TOOLS, None], ids=["tools", "no-tools"])
def test_an_edited_run_parked_on_client_calls_stays_suspended_until_none_waits(tools: Any) -> None:
    async def main() -> None:
        store = InMemoryCheckpointStore()
        await parked(store, call("ask", {"q": 1}, "c1"), call("ask", {"q": 2}, "c2"))
        one = await update_run(store, "run", answer("c1"), tools=tools)
        assert one.status == "suspended" and not one.pending_approvals  # c2 still waits for the UI
        both = await update_run(store, "run", answer("c2"), tools=tools)
        assert both.status == "running"
        done = await resume_from_checkpoint(store, "run", model=ScriptedModel(lambda request: "Thanks."),
                                            tools=CLIENT_TOOLS)
        results = [p for m in done.messages if m["role"] == "tool" for p in tool_results(m)]
        assert [(p["tool_call_id"], p["output"]) for p in results] == [("c1", "yes"), ("c2", "yes")]

    asyncio.run(main())


def test_a_run_parked_on_a_client_call_and_an_approval_waits_for_both() -> None:
    async def main() -> None:
        store = InMemoryCheckpointStore()
        await parked(store, call("ask", {}, "c1"), call("pay", {}, "p1"))
        source = await checkpoint_at_step(store, "run")
        assert source.pending_approvals
        answered = await update_run(store, "run", answer("c1"), tools=CLIENT_TOOLS)
        assert answered.status == "suspended" and answered.pending_approvals == source.pending_approvals
        forked = await fork_run(store, "run", new_run_id="f", tools=CLIENT_TOOLS)  # no edit: still waits for both
        assert forked.status == "suspended"

    asyncio.run(main())


def test_server_calls_of_a_parked_step_wait_for_nothing_when_the_tools_are_known() -> None:
    async def main() -> None:
        store = InMemoryCheckpointStore()
        await parked(store, call("lookup", {}, "l1"), call("ask", {}, "c1"))  # lookup runs on resume
        assert (await update_run(store, "run", lambda h: h, tools=CLIENT_TOOLS)).status == "suspended"
        assert (await update_run(store, "run", answer("c1"), tools=CLIENT_TOOLS)).status == "running"

    asyncio.run(main())


def test_a_fork_gets_fresh_approval_ids_and_tokens_signed_for_it_or_none() -> None:
    """No two runs share an approval id (`resolve_approval` finds an awakeable by that id alone); a token binds its
    run and approval id, so the fork's are signed anew with a signer and dropped without one (no secret to re-sign)."""
    from durable_agent import ApprovalSigner, ConfigurationError, content_parts

    signer = ApprovalSigner("fork-test-secret-0123456789abcdefghij")

    async def main() -> None:
        store = InMemoryCheckpointStore()
        first = await generate_text(model=model(), tools=TOOLS, max_steps=5, store=store, run_id="run",
                                    approval_signer=signer, messages=[{"role": "user", "content": "Pay inv-7."}])
        (request,) = first.pending_approvals
        ids = iter(["fresh-1", "fresh-2"])
        signed = await fork_run(store, "run", new_run_id="signed", approval_signer=signer,
                                generate_id=lambda: next(ids))
        (mine,) = signed.pending_approvals or ()
        assert mine.approval_id == "fresh-1" and mine.tool_call_id == request.tool_call_id
        asked = next(m for m in reversed(signed.messages) if m["role"] == "assistant")
        marked = {p["tool_call_id"]: p.get("approval_id") for p in content_parts(asked)
                  if p["type"] == "tool-approval-request"}
        assert marked == {request.tool_call_id: "fresh-1"}  # the marker in the transcript renamed too
        payload = signer.verify(mine.token)
        assert payload is not None and (payload["run_id"], payload["approval_id"]) == ("signed", "fresh-1")
        unsigned = await fork_run(store, "run", new_run_id="unsigned", generate_id=lambda: next(ids))
        assert [(r.approval_id, r.token) for r in unsigned.pending_approvals or ()] == [("fresh-2", None)]
        assert (await checkpoint_at_step(store, "run")).pending_approvals == first.pending_approvals  # untouched

        kept = await update_run(store, "run", lambda h: h)  # in place: the ids are still this run's own
        assert kept.pending_approvals == first.pending_approvals
        for same in (lambda: request.approval_id, lambda: ""):  # an id of the source, an empty one
            with pytest.raises(ConfigurationError):
                await fork_run(store, "run", new_run_id="bad", generate_id=same)
        assert store.load("bad") is None

        done = await resume_from_checkpoint(store, "signed", model=model(), tools=TOOLS, max_steps=5,
                                            approval_signer=signer,
                                            approval_responses=[ToolApprovalResponse("fresh-1", True, token=mine.token)])
        assert done.text == "Done." and tool_results(done.messages[-2])[0]["output"] == "paid"

    asyncio.run(main())
