"""Client tool results: the results a run parked on client tools waits for, and the history that answers them.

A tool without ``execute`` is a *client tool*: the loop parks the run (``suspended``) with the
call unanswered in the last assistant message, and whoever holds the run hands the result
over. The endpoint records a result by appending it to the parked checkpoint's history (the
tool message that answers the call, at the same step index), in one commit fenced by the
session's lease; the run goes on once nothing else waits (`durable_agent._parked`). A result in the history is the
durable record: a second result for the same call is refused, and a server that resumes the
run finds it there. No I/O here: `RunDriver.answer_client_calls` does the commit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._checkpoint import AgentCheckpoint
from .._messages import content_parts
from .._parked import client_results_of, waiting_client_calls
from .._tools import Tool
from .._transcript import tool_message
from ._asgi import HttpError, field_of

__all__ = ["ClientResult", "answered_history", "answers_for", "parse_results", "ui_tool_results"]


@dataclass(frozen=True, slots=True)
class ClientResult:
    """The result of one client tool call, as the UI sends it."""

    tool_call_id: str
    output: Any
    is_error: bool = False


def answers_for(run_id: str, checkpoint: AgentCheckpoint | None, tools: Mapping[str, Tool],
                results: Sequence[ClientResult]) -> list[tuple[dict[str, Any], ClientResult]]:
    """Each result with the call it answers; `HttpError` 409 when the run is not parked (``not_waiting``), a call
    has a result already (``already_answered``) or the run waits for no such client call (``not_pending``)."""
    if checkpoint is None or checkpoint.status != "suspended":
        raise HttpError(409, "not_waiting", f"run {run_id!r} is not waiting for tool results")
    waiting = waiting_client_calls(checkpoint, tools)
    answered = {r["tool_call_id"] for r in client_results_of(checkpoint.messages)}
    for result in results:
        if result.tool_call_id in answered:
            raise HttpError(409, "already_answered", f"tool call {result.tool_call_id!r} has a result already")
        if result.tool_call_id not in waiting:
            raise HttpError(409, "not_pending", f"run {run_id!r} waits for no client tool call {result.tool_call_id!r}")
    return [(waiting[r.tool_call_id], r) for r in results]


def answered_history(checkpoint: AgentCheckpoint, answers: Sequence[tuple[dict[str, Any], ClientResult]],
                     now: int) -> AgentCheckpoint:
    """`checkpoint` with each (call, result) answered in its trailing tool message; same step, still ``suspended``."""
    parts = [{"type": "tool-result", "tool_call_id": call["tool_call_id"], "tool_name": call["tool_name"],
              "output": result.output, "is_error": result.is_error} for call, result in answers]
    messages = list(checkpoint.messages)
    if messages and messages[-1]["role"] == "tool":  # an earlier result of this step: one tool message holds them
        messages[-1] = tool_message([*content_parts(messages[-1]), *parts])
    else:
        messages.append(tool_message(parts))
    return dataclasses.replace(checkpoint, messages=messages, step_id="", created_at=now)


def parse_results(body: Mapping[str, Any]) -> list[ClientResult]:
    """``{"results": [{"tool_call_id", "output", "is_error"?}, ...]}`` or one such object as the body (422 otherwise)."""
    raw = field_of(body, "results", list) if "results" in body else [body]
    if not raw:
        raise HttpError(422, "bad_body", "'results' must not be empty")
    results, seen = [], set()
    for item in raw:
        if not isinstance(item, dict):
            raise HttpError(422, "bad_body", "each result is an object {tool_call_id, output, is_error?}")
        call_id = field_of(item, "tool_call_id", str, what=" in a result")
        if "output" not in item:
            raise HttpError(422, "bad_body", f"the result of {call_id!r} needs 'output' (null is a value)")
        if call_id in seen:
            raise HttpError(422, "bad_body", f"two results for {call_id!r}")
        seen.add(call_id)
        is_error = field_of(item, "is_error", bool, required=False, what=" in a result")
        results.append(ClientResult(call_id, item["output"], bool(is_error)))
    return results


def ui_tool_results(message: Mapping[str, Any]) -> list[tuple[str, ClientResult]]:
    """(tool name, result) of each tool part of an AI SDK UI message that has an output: what `addToolResult` put
    there (``tool-<name>`` or ``dynamic-tool`` parts in state ``output-available`` or ``output-error``)."""
    out: dict[str, tuple[str, ClientResult]] = {}  # one result per call: the first part naming it
    for part in message.get("parts") or ():
        if not isinstance(part, dict) or not isinstance(part.get("toolCallId"), str) or part["toolCallId"] in out:
            continue
        kind = part.get("type")
        if kind == "dynamic-tool":
            name = part.get("toolName")
        elif isinstance(kind, str) and kind.startswith("tool-"):
            name = kind[len("tool-"):]
        else:
            continue
        if not isinstance(name, str):
            continue
        call_id = part["toolCallId"]
        if part.get("state") == "output-available":
            out[call_id] = name, ClientResult(call_id, part.get("output"))
        elif part.get("state") == "output-error":
            out[call_id] = name, ClientResult(call_id, str(part.get("errorText") or ""), True)
    return list(out.values())
