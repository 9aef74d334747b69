"""The run's events spoken as the AI SDK UI message stream (the ``ai`` package 6/7's protocol), for `useChat`.

A response in this format carries the header ``x-vercel-ai-ui-message-stream: v1``; each
chunk is one SSE ``data:`` line holding a JSON object, and the stream ends with
``data: [DONE]``. The mapping, event by event (the assistant message's id is the run id, a
step's text block id is ``<run_id>-<step_index>``, or ``<run_id>-<step_index>-<attempt>`` for a
retried model call's later attempts):

===========================  ===============================================================
durable-agent event          UI message stream chunks
===========================  ===============================================================
first event of a leg         ``start`` (``messageId``) before the event's own chunks
``step-start``               ``start-step``
``text-delta``               ``text-start`` (first delta of the step), ``text-delta`` (``delta``)
``tool-call``                ``tool-input-available`` (``toolCallId``, ``toolName``, ``input``)
``tool-result``              ``tool-output-available`` (``output``), or ``tool-output-error``
                             (``errorText``) when ``is_error``; a ``denied`` one (its approval
                             was refused) is ai 7's ``tool-approval-response`` (``approved``
                             false, ``reason``: the output) then ``tool-output-denied``:
                             ``useChat`` puts the tool part in state ``output-denied``
``tool-approval-request``    ``tool-approval-request`` (``approvalId``, ``toolCallId``, and
                             ``signature``: the signed approval token when the agent signs),
                             after a ``tool-input-available`` for a call the stream has not
                             shown (a sub-agent's): ``useChat`` puts the tool part in state
                             ``approval-requested``, and ``addToolApprovalResponse`` sends it
                             back with the verdict and the signature (`ui_tool_approvals`)
``step-retry``               ``data-step-retry`` (``data``: ``stepIndex``, ``attempt``, ``error``,
                             ``delayMs``, ``textId``: the failed attempt's text block, which the UI
                             should drop; v5 has no chunk that removes text)
``step-finish``              ``finish-step``
``finish``                   ``finish`` (``messageMetadata``: ``finishReason``, ``usage``,
                             ``totalUsage``)
``error``                    ``error`` (``errorText``)
===========================  ===============================================================

An open text block is closed (``text-end``) before any chunk that is not a text delta.
Chunks carry only the fields the protocol's strict schema allows. The mapping is a fold over
the run's events (`UiMessageStream`), so a reconnecting reader is brought to the same state
by folding the events it already has, and each chunk gets an SSE id ``<seq>.<n>`` (the n-th
chunk of event ``seq``): `Last-Event-ID` resumes between two chunks of one event too.
"""

from __future__ import annotations

from typing import Any

__all__ = ["UI_MESSAGE_STREAM_HEADER", "UiMessageStream"]

UI_MESSAGE_STREAM_HEADER = ("x-vercel-ai-ui-message-stream", "v1")


def _camel_usage(usage: Any) -> dict[str, Any]:
    usage = usage or {}
    return {"inputTokens": usage.get("input_tokens", 0), "outputTokens": usage.get("output_tokens", 0),
            "totalTokens": usage.get("total_tokens", 0)}


class UiMessageStream:
    """Folds one run's events, in order, into UI message stream chunks (see the module docs)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._open_text: str | None = None
        self._in_leg = False
        self._calls: frozenset[str] = frozenset()  # replaced, never changed: a copy of the fold is its own
        self._asked: tuple[tuple[str, str], ...] = ()  # (tool call id, approval id) of each approval request; replaced

    def chunks(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks of the next event of the run."""
        kind = event.get("type")
        out: list[dict[str, Any]] = []
        if not self._in_leg:
            out.append({"type": "start", "messageId": self.run_id})
            self._in_leg = True
        if kind == "text-delta":
            text_id = self._text_id(event["step_index"], event.get("attempt", 0))
            if self._open_text != text_id:
                self._close_text(out)
                out.append({"type": "text-start", "id": text_id})
                self._open_text = text_id
            out.append({"type": "text-delta", "id": text_id, "delta": event["text"]})
            return out
        self._close_text(out)
        if kind == "step-start":
            out.append({"type": "start-step"})
        elif kind == "tool-call":
            self._call(event, out)
        elif kind == "tool-result":
            if event.get("denied"):
                self._denied(event, out)
            elif event.get("is_error"):
                output = event.get("output")
                out.append({"type": "tool-output-error", "toolCallId": event["tool_call_id"],
                            "errorText": output if isinstance(output, str) else str(output)})
            else:
                out.append({"type": "tool-output-available", "toolCallId": event["tool_call_id"],
                            "output": event.get("output")})
        elif kind == "tool-approval-request":
            if event["tool_call_id"] not in self._calls:
                self._call(event, out)  # the client has a tool part only for a call it was shown
            request = {"type": "tool-approval-request", "approvalId": event["approval_id"],
                       "toolCallId": event["tool_call_id"]}
            if isinstance(event.get("token"), str):
                request["signature"] = event["token"]
            out.append(request)
            self._asked = (*self._asked, (event["tool_call_id"], event["approval_id"]))
        elif kind == "step-retry":
            step, attempt = event["step_index"], event["attempt"]
            out.append({"type": "data-step-retry", "id": f"{self.run_id}-{step}-retry-{attempt}", "data": {
                "stepIndex": step, "attempt": attempt, "error": event.get("error"), "delayMs": event.get("delay_ms"),
                "textId": self._text_id(step, attempt),
            }})
        elif kind == "step-finish":
            out.append({"type": "finish-step"})
        elif kind == "finish":
            out.append({"type": "finish", "messageMetadata": {
                "finishReason": event["finish_reason"], "usage": _camel_usage(event.get("usage")),
                "totalUsage": _camel_usage(event.get("total_usage")),
            }})
            self._in_leg = False
        elif kind == "error":
            out.append({"type": "error", "errorText": event.get("message", "the run failed")})
            self._in_leg = False
        return out

    def _denied(self, event: dict[str, Any], out: list[dict[str, Any]]) -> None:
        """A refused call: the verdict on its approval (when the stream asked for it), then the denial itself."""
        approval_id = next((a for call, a in reversed(self._asked) if call == event["tool_call_id"]), None)
        if approval_id is not None:
            response: dict[str, Any] = {"type": "tool-approval-response", "approvalId": approval_id, "approved": False}
            if isinstance(event.get("output"), str):
                response["reason"] = event["output"]
            out.append(response)
        out.append({"type": "tool-output-denied", "toolCallId": event["tool_call_id"]})

    def _call(self, event: dict[str, Any], out: list[dict[str, Any]]) -> None:
        self._calls = self._calls | {event["tool_call_id"]}
        out.append({"type": "tool-input-available", "toolCallId": event["tool_call_id"],
                    "toolName": event["tool_name"], "input": event["input"]})

    def _text_id(self, step: int, attempt: int) -> str:
        return f"{self.run_id}-{step}" if attempt == 0 else f"{self.run_id}-{step}-{attempt}"

    def _close_text(self, out: list[dict[str, Any]]) -> None:
        if self._open_text is not None:
            out.append({"type": "text-end", "id": self._open_text})
            self._open_text = None
