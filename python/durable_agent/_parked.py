"""What a parked run waits for: pure rules over its ``suspended`` checkpoint, for every caller that decides it.

A run *parks* (``suspended``) with the calls of its last step unanswered in the last
assistant message; a suspended step writes no tool message of its own. It waits for:

* a verdict for each pending approval (`AgentCheckpoint.pending_approvals`; where verdicts
  are stored is the caller's business: awakeables, `approval_responses`);
* a result for each *client* call: an unanswered call without an approval marker, of a tool
  without ``execute`` (when the run's tools are not known, every such call counts: it may be
  one), handed over by appending it to the trailing tool message (`client_results_of`);
* a sub-agent, when it parked with open calls but neither an approval nor a client result:
  the sub-agent's own run waits (its approvals and client calls are its own checkpoint's).

The loop settles whatever is still unanswered when the run is resumed (a missing client
result becomes an error result), so deciding that a parked run may go on is this module's
job: the HTTP endpoint resumes a run once nothing waits, `fork.update_run` turns an
edited run ``running`` only then, and `Agent.resume` leaves a run parked while an approval
has no verdict (`unanswered_approvals`, `parked_result`): a pending decision is never
taken for the user.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ._checkpoint import AgentCheckpoint, ToolApprovalRequest, Usage
from ._messages import Message, content_parts, final_text
from ._results import GenerateTextResult
from ._tools import Tool
from ._transcript import unresolved_calls


def waiting_client_calls(
    checkpoint: AgentCheckpoint | None, tools: Mapping[str, Tool] | None
) -> dict[str, dict[str, Any]]:
    """The client tool calls the parked run waits for (unanswered, no approval marker, a client tool), by call id.

    `tools` None: the run's tools are unknown, so every unanswered unmarked call counts.
    """
    if checkpoint is None or checkpoint.status != "suspended":
        return {}
    calls, approval_ids = unresolved_calls(checkpoint.messages)
    return {c["tool_call_id"]: c for c in calls
            if c["tool_call_id"] not in approval_ids
            and (tools is None or (c["tool_name"] in tools and tools[c["tool_name"]].is_client_tool))}


def client_results_of(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The results the trailing tool messages hold for the last assistant message's calls (recorded client results,
    while the run is parked: a suspended step writes no tool message of its own)."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None or any(m["role"] != "tool" for m in messages[last + 1:]):
        return []
    return [dict(p) for m in messages[last + 1:] for p in content_parts(m) if p["type"] == "tool-result"]


def waits_for_calls(checkpoint: AgentCheckpoint, tools: Mapping[str, Tool] | None) -> bool:
    """True when the parked run waits for more than its approvals' verdicts: a client call or a sub-agent."""
    if checkpoint.status != "suspended" or not unresolved_calls(checkpoint.messages)[0]:
        return False
    if waiting_client_calls(checkpoint, tools):
        return True
    return not checkpoint.pending_approvals and not client_results_of(checkpoint.messages)


def unanswered_approvals(checkpoint: AgentCheckpoint, answered: Collection[str]) -> tuple[ToolApprovalRequest, ...]:
    """The pending approvals of the parked run without a verdict among `answered` (approval ids)."""
    if checkpoint.status != "suspended":
        return ()
    return tuple(r for r in checkpoint.pending_approvals or () if r.approval_id not in answered)


def parked_result(checkpoint: AgentCheckpoint, tools: Mapping[str, Tool] | None) -> GenerateTextResult:
    """The outcome of a resume that left the parked run as it was: ``suspended``, its pending approvals (tokens
    included) and client calls, its history and total usage; no step ran and nothing was spent."""
    return GenerateTextResult(
        text=final_text(checkpoint.messages), messages=tuple(checkpoint.messages), steps=(), usage=Usage(),
        total_usage=checkpoint.usage, finish_reason="suspended",
        pending_approvals=tuple(checkpoint.pending_approvals or ()),
        client_tool_calls=tuple(waiting_client_calls(checkpoint, tools).values()), run_id=checkpoint.run_id,
    )
