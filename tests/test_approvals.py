"""Approvals: server mode, client mode (suspend, settle, default deny) and sub-agents."""

from __future__ import annotations

from typing import Any

import pytest

from agent_kit import Ledger, tool_results, user
from durable_agent import (
    InMemoryCheckpointStore,
    ScriptedModel,
    StreamToolApprovalRequest,
    Tool,
    ToolApprovalRequest,
    ToolApprovalResponse,
    agent_tool,
    call,
    generate_text,
    reply,
    resume_from_checkpoint,
    stream_chat,
)


def ids(*values: str) -> Any:
    it = iter(values)
    return lambda: next(it)


async def test_server_mode_approves_and_denies_in_process() -> None:
    ledger = Ledger()
    asked: list[ToolApprovalRequest] = []

    def approve(request: ToolApprovalRequest) -> Any:
        asked.append(request)
        if request.input["amount"] > 100:
            return ToolApprovalResponse(request.approval_id, False, reason="Too expensive.")
        return True

    tools = {"pay": ledger.tool("pay", needs_approval=True)}
    model = ScriptedModel([reply("", call("pay", {"amount": 5}), call("pay", {"amount": 500})), "ok"])
    result = await generate_text(model=model, messages=[user("x")], tools=tools, approve_tool_call=approve)
    small, large = result.steps[0].tool_results
    assert small["output"] == "ok" and not small["is_error"]
    assert large == {**large, "output": "Too expensive.", "is_error": True}
    assert ledger.entries == [("pay", {"amount": 5})]
    assert [r.tool_name for r in asked] == ["pay", "pay"]


async def test_needs_approval_may_be_a_function_of_the_input() -> None:
    ledger = Ledger()

    async def only_big(args: Any) -> bool:
        return bool(args["amount"] > 10)

    tools = {"pay": ledger.tool("pay", needs_approval=only_big)}
    model = ScriptedModel([reply("", call("pay", {"amount": 1}), call("pay", {"amount": 50}))])
    result = await generate_text(model=model, messages=[user("x")], tools=tools)
    assert result.finish_reason == "suspended"
    assert [r.input for r in result.pending_approvals] == [{"amount": 50}]


async def test_client_mode_suspends_then_approved_runs_and_denied_is_an_error() -> None:
    ledger = Ledger()
    store = InMemoryCheckpointStore()
    tools = {"pay": ledger.tool("pay", needs_approval=True), "wipe": ledger.tool("wipe", needs_approval=True)}
    model = ScriptedModel([reply("Need approval.", call("pay", {"a": 1}), call("wipe", {"all": True})), "Done."])
    first = await generate_text(model=model, messages=[user("x")], tools=tools, store=store, run_id="r",
                                generate_id=ids("ap-pay", "ap-wipe"))
    assert first.finish_reason == "suspended"
    assert [(r.approval_id, r.tool_call_id, r.tool_name) for r in first.pending_approvals] == [
        ("ap-pay", "call_0_0", "pay"), ("ap-wipe", "call_0_1", "wipe")]
    stored = store.load("r")
    assert stored is not None and stored.status == "suspended"
    assert [r.approval_id for r in stored.pending_approvals or ()] == ["ap-pay", "ap-wipe"]
    assert ledger.entries == []

    done = await resume_from_checkpoint(store, "r", model=model, tools=tools, approval_responses=[
        ToolApprovalResponse("ap-pay", True), ToolApprovalResponse("ap-wipe", False, reason="Never wipe.")])
    assert ledger.entries == [("pay", {"a": 1})]
    pay, wipe = tool_results(done.messages[2])
    assert not pay["is_error"] and wipe == {**wipe, "is_error": True, "output": "Never wipe."}
    assert done.text == "Done." and store.load("r").status == "completed"  # type: ignore[union-attr]


async def test_an_unanswered_gated_call_is_denied_by_default() -> None:
    ledger = Ledger()
    store = InMemoryCheckpointStore()
    tools = {"pay": ledger.tool("pay", needs_approval=True)}
    model = ScriptedModel([reply("", call("pay", {})), "Understood."])
    await generate_text(model=model, messages=[user("x")], tools=tools, store=store, run_id="r")
    done = await resume_from_checkpoint(store, "r", model=model, tools=tools)
    result = tool_results(done.messages[2])[0]
    assert result["is_error"] and "denied" in result["output"]
    assert ledger.entries == []


async def test_a_plain_call_with_verdicts_settles_without_a_session() -> None:
    ledger = Ledger()
    tools = {"pay": ledger.tool("pay", needs_approval=True)}
    model = ScriptedModel([reply("", call("pay", {"n": 1})), "paid"])
    first = await generate_text(model=model, messages=[user("x")], tools=tools, generate_id=ids("ap"))
    assert first.run_id is None and first.finish_reason == "suspended"
    done = await generate_text(model=model, messages=first.messages, tools=tools,
                               approval_responses=[ToolApprovalResponse("ap", True)])
    assert ledger.entries == [("pay", {"n": 1})] and done.text == "paid"


async def test_the_stream_carries_approval_request_parts() -> None:
    tools = {"pay": Tool(execute=lambda _: "ok", needs_approval=True)}
    streamed = stream_chat(model=ScriptedModel([reply("", call("pay", {"x": 1}))]), messages=[user("x")],
                           tools=tools, generate_id=ids("ap"))
    parts = [p async for p in streamed.full_stream]
    request = next(p for p in parts if p.type == "tool-approval-request")
    assert request == StreamToolApprovalRequest(step_index=0, attempt=0, approval_id="ap", tool_call_id="call_0_0",
                                                tool_name="pay", input={"x": 1}, agent_path=None, token=None)
    assert await streamed.finish_reason == "suspended"


# ---------------------------------------------------------------- sub-agents


def coder(ledger: Ledger, name: str = "coder", script: Any = None) -> Tool:
    model = ScriptedModel(script or [reply("", call("run_shell", {"cmd": "pytest"})), "Tests pass now."],
                          model_id=name)
    return agent_tool(name=name, model=model, tools={"run_shell": ledger.tool("run_shell", needs_approval=True)})


async def test_a_sub_agent_approval_suspends_child_and_parent_and_resumes_the_child() -> None:
    ledger = Ledger()
    store = InMemoryCheckpointStore()
    parent_model = ScriptedModel([reply("", call("coder", {"prompt": "fix the test"}, "toolu_1")), "Fixed."])
    tools = {"coder": coder(ledger)}
    first = await generate_text(model=parent_model, messages=[user("fix it")], tools=tools,
                                store=store, run_id="run-7", generate_id=ids("ap-9"))
    assert first.finish_reason == "suspended"
    (request,) = first.pending_approvals
    assert (request.approval_id, request.tool_name, request.agent_path) == ("ap-9", "run_shell", ("coder",))
    child = store.load("run-7::coder#toolu_1")
    assert child is not None and child.status == "suspended" and child.agent_path == ("coder",)
    assert store.load("run-7").pending_approvals == (request,)  # type: ignore[union-attr]

    done = await resume_from_checkpoint(store, "run-7", model=parent_model, tools=tools,
                                        approval_responses=[ToolApprovalResponse("ap-9", True)])
    assert done.text == "Fixed."
    assert ledger.entries == [("run_shell", {"cmd": "pytest"})]
    assert tool_results(done.messages[2])[0]["output"] == "Tests pass now."
    assert store.load("run-7::coder#toolu_1").status == "completed"  # type: ignore[union-attr]


async def test_sub_agent_approvals_work_at_any_depth() -> None:
    ledger = Ledger()
    store = InMemoryCheckpointStore()
    inner = coder(ledger, "tester")
    middle = agent_tool(name="lead", model=ScriptedModel(
        [reply("", call("tester", {"prompt": "run"}, "toolu_m")), "lead done"], model_id="lead"), tools={"tester": inner})
    top = ScriptedModel([reply("", call("lead", {"prompt": "go"}, "toolu_t")), "all done"])
    first = await generate_text(model=top, messages=[user("x")], tools={"lead": middle},
                                store=store, run_id="deep", generate_id=ids("ap-deep"))
    assert first.pending_approvals[0].agent_path == ("lead", "tester")
    assert store.load("deep::lead#toolu_t::tester#toolu_m") is not None
    done = await resume_from_checkpoint(store, "deep", model=top, tools={"lead": middle},
                                        approval_responses=[ToolApprovalResponse("ap-deep", True)])
    assert done.text == "all done" and ledger.entries == [("run_shell", {"cmd": "pytest"})]


async def test_parallel_calls_of_one_sub_agent_never_collide() -> None:
    ledger = Ledger()
    store = InMemoryCheckpointStore()
    tools = {"coder": coder(ledger)}
    parent = ScriptedModel([reply("", call("coder", {"prompt": "a"}, "t1"), call("coder", {"prompt": "b"}, "t2")), "ok"])
    first = await generate_text(model=parent, messages=[user("x")], tools=tools, store=store, run_id="p",
                                generate_id=ids("ap-1", "ap-2"))
    assert sorted(r.approval_id for r in first.pending_approvals) == ["ap-1", "ap-2"]
    assert store.load("p::coder#t1") is not None and store.load("p::coder#t2") is not None
    done = await resume_from_checkpoint(store, "p", model=parent, tools=tools, approval_responses=[
        ToolApprovalResponse("ap-1", True), ToolApprovalResponse("ap-2", False, reason="no")])
    assert ledger.entries == [("run_shell", {"cmd": "pytest"})]
    assert done.text == "ok"


async def test_siblings_of_a_suspended_sub_agent_are_re_run_on_resume() -> None:
    """Documented behaviour: a suspended step writes no tool message, so its siblings run again."""
    ledger = Ledger()
    store = InMemoryCheckpointStore()
    tools = {"coder": coder(ledger), "note": ledger.tool("note")}
    parent = ScriptedModel([reply("", call("note", {"n": 1}), call("coder", {"prompt": "a"}, "t1")), "ok"])
    await generate_text(model=parent, messages=[user("x")], tools=tools, store=store, run_id="p",
                        generate_id=ids("ap"))
    await resume_from_checkpoint(store, "p", model=parent, tools=tools,
                                 approval_responses=[ToolApprovalResponse("ap", True)])
    assert ledger.entries.count(("note", {"n": 1})) == 2


async def test_without_a_store_a_gated_sub_agent_call_is_a_clear_error_for_the_parent() -> None:
    ledger = Ledger()
    parent = ScriptedModel([reply("", call("coder", {"prompt": "fix"})), "I could not."])
    result = await generate_text(model=parent, messages=[user("x")], tools={"coder": coder(ledger)})
    tool_result = result.steps[0].tool_results[0]
    assert tool_result["is_error"] and "checkpoint store on the parent call (store=)" in tool_result["output"]
    assert ledger.entries == [] and result.text == "I could not."


async def test_a_sub_agent_inherits_the_parents_server_approver() -> None:
    ledger = Ledger()
    parent = ScriptedModel([reply("", call("coder", {"prompt": "fix"})), "done"])
    result = await generate_text(model=parent, messages=[user("x")], tools={"coder": coder(ledger)},
                                 approve_tool_call=lambda request: request.agent_path == ("coder",))
    assert ledger.entries == [("run_shell", {"cmd": "pytest"})] and result.text == "done"


@pytest.mark.parametrize("bad", ["", None])
def test_agent_tool_needs_a_name(bad: Any) -> None:
    from durable_agent import ConfigurationError

    with pytest.raises(ConfigurationError):
        agent_tool(name=bad, model=ScriptedModel(["x"]), tools={})
