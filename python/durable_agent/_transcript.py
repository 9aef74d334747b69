"""The transcript shapes the loop writes: assistant and tool messages, the calls a history leaves open."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ._checkpoint import ToolApprovalRequest
from ._messages import Message, content_parts


def tool_message(results: Sequence[Mapping[str, Any]]) -> Message:
    # The tool phase keeps its results as the plain dicts it also streams (typing them ToolResultPart
    # would retype the loop's stream parts too).
    return {"role": "tool", "content": list(results)}  # type: ignore[arg-type]


def assistant_message(
    text: str, tool_calls: Sequence[dict[str, Any]], approvals: Sequence[ToolApprovalRequest] = (),
    reasoning: Sequence[dict[str, Any]] = (), refusal: str = "",
) -> Message:
    """The assistant message of a step: its reasoning parts, text, refusal, tool calls, and a marker per call
    awaiting a verdict."""
    content: list[Any] = [*reasoning, *([{"type": "text", "text": text}] if text else [])]
    if refusal:
        content.append({"type": "refusal", "text": refusal})
    content.extend({"type": "tool-call", **{k: c[k] for k in ("tool_call_id", "tool_name", "input")}}
                   for c in tool_calls)
    content.extend(
        {"type": "tool-approval-request", "approval_id": r.approval_id, "tool_call_id": r.tool_call_id}
        for r in approvals
    )
    return {"role": "assistant", "content": content}


def unresolved_calls(messages: Sequence[Message]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The tool calls of the last assistant message that no later tool message answers.

    Also returns the approval ids that message recorded, by tool call id.
    """
    for index in range(len(messages) - 1, -1, -1):
        if messages[index]["role"] == "assistant":
            break
    else:
        return [], {}
    if any(m["role"] != "tool" for m in messages[index + 1 :]):
        return [], {}  # the conversation moved on: nothing trails
    parts = content_parts(messages[index])
    answered = {
        p["tool_call_id"]
        for m in messages[index + 1 :]
        if m["role"] == "tool"
        for p in content_parts(m)
        if p["type"] == "tool-result"
    }
    calls = [dict(p) for p in parts if p["type"] == "tool-call" and p["tool_call_id"] not in answered]
    approvals = {p["tool_call_id"]: p["approval_id"] for p in parts if p["type"] == "tool-approval-request"}
    return calls, approvals


def approval_part(request: ToolApprovalRequest) -> dict[str, Any]:
    """The JSON form of a request as the endpoint sends it: a ``tool-approval-request`` event, an entry of a
    run's ``pending_approvals`` (every field present, None when unset)."""
    return {
        "type": "tool-approval-request",
        "approval_id": request.approval_id,
        "tool_call_id": request.tool_call_id,
        "tool_name": request.tool_name,
        "input": request.input,
        "agent_path": request.agent_path,
        "token": request.token,
    }
