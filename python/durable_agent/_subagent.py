"""Sub-agents: `agent_tool` runs a child agent loop as one tool of a parent.

With a durable parent, the child checkpoints under its own key,
``{parent_run_id}::{agent_name}#{tool_call_id}``. The tool call id comes from the parent's
history, so a resumed parent that re-executes the same call lands on the same key, and
two parallel calls of one sub-agent never share one. When the child suspends on a
client-mode approval, the parent suspends too, with the child's requests (tagged with
their `agent_path`) as its own pending approvals; resuming the parent with the verdicts
re-executes the call, and the child settles them from its checkpoint and goes on.

Without a checkpoint store on the parent call, a child that needs a client-mode verdict cannot wait for one: the
parent model gets an `is_error` result saying so. A child inherits the parent's
`approve_tool_call`, signer, clock and id generator unless it sets its own.

The child's usage counts toward its parent: it rides on the call's tool result (``usage``),
so the parent's usage, `total_usage` and budget stop conditions see it; the child's own
checkpoints keep the child's usage alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._errors import ConfigurationError
from ._generate import _consume
from ._loop import AgentLoop
from ._messages import final_text
from ._models import LanguageModel
from ._options import RunOptions
from ._tool_calls import SubAgentSuspended, current_tool_call
from ._tools import Tool
from ._util import maybe_await

PROMPT_SCHEMA = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "The task for the sub-agent."}},
    "required": ["prompt"],
}


def child_run_id(parent_run_id: str, agent_name: str, tool_call_id: str) -> str:
    """The key a durable sub-agent call checkpoints under."""
    return f"{parent_run_id}::{agent_name}#{tool_call_id}"


def agent_tool(
    *,
    name: str,
    model: LanguageModel,
    tools: Mapping[str, Tool],
    description: str | None = None,
    system: str | None = None,
    max_steps: int = 20,
    **options: Any,
) -> Tool:
    """A tool that runs a child agent on the `prompt` it is given and returns the child's final text.

    `options` are any other call options for the child (`stop_when`, `approve_tool_call`, ...).
    """
    if not name or not isinstance(name, str):
        raise ConfigurationError("agent_tool needs a non-empty name")

    async def execute(args: Mapping[str, Any]) -> str:
        context = current_tool_call()
        if context is None:
            raise ConfigurationError(f"sub-agent {name!r} can only run as a tool inside an agent loop")
        parent = context.options
        inherited = {
            "approve_tool_call": parent.approve_tool_call,
            "approval_signer": parent.approval_signer,
            "approval_max_age_ms": parent.approval_max_age_ms,
            "clock": parent.clock,
            "generate_id": parent.generate_id,
            "signal": parent.signal,
        }
        child_options = {**{k: v for k, v in inherited.items() if v is not None}, **options}
        child_options["approval_responses"] = parent.approval_responses
        path = (*parent.agent_path, name)
        run_id: str | None = None
        messages: list[Any] = [{"role": "user", "content": args["prompt"]}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        resume_id = None
        store = context.durability.checkpoints  # the parent's: its store=, or a durable leg's fenced commits
        if context.run_id is not None and store is not None:
            run_id = child_run_id(context.run_id, name, context.tool_call_id)
            stored = await maybe_await(store.load(run_id))
            if stored is not None and stored.refuse_newer().status == "completed":
                context.report_usage(stored.usage)  # the parent's step re-runs: its usage was never saved
                return final_text(stored.messages)  # the call finished before a crash: don't run it again
            if stored is not None:
                resume_id = run_id
        run_options = RunOptions.build(model, {"tools": tools, "max_steps": max_steps, **child_options},
                                       store=store if run_id is not None else None, run_id=run_id,
                                       agent_path=path)
        result = await _consume(AgentLoop(run_options, None if resume_id else messages, resume_run_id=resume_id))
        if result.finish_reason == "suspended":
            if run_id is None:
                waiting = ", ".join(r.tool_name for r in result.pending_approvals) or "a client tool"
                raise RuntimeError(
                    f"sub-agent {name!r} needs a client-mode verdict for {waiting}, which requires a checkpoint "
                    "store on the parent call (store=) (or an approve_tool_call callback)"
                )
            raise SubAgentSuspended(result.pending_approvals, result.usage)
        context.report_usage(result.usage)
        return result.text

    return Tool(
        description=description or f"Delegate a task to the {name!r} sub-agent; returns its final answer.",
        parameters=PROMPT_SCHEMA,
        execute=execute,
    )
