"""Events named by a run's durable progress: what makes a resumed stream lose nothing and repeat nothing.

Every event the endpoint stores carries a key that says *where in the run* it happened, not
*when a process saw it*:

==============================  =====================================================
event                           key
==============================  =====================================================
``step-start``                  ``step/<step_index>/start``
``text-delta``                  ``step/<step_index>/text/<offset>`` (offset: characters of
                                that step's text before this delta); a retried model call's
                                attempt n > 0: ``step/<step_index>/text/<n>/<offset>``
``step-retry``                  ``step/<step_index>/retry/<attempt that failed>``
``tool-call``                   ``call/<tool_call_id>``
``tool-result``                 ``result/<tool_call_id>``
``tool-approval-request``       ``approval/<approval_id>``
``step-finish``                 ``step/<step_index>/finish``
``finish``                      ``finish/<step_index of the checkpoint that ended the leg>``
==============================  =====================================================

The log keeps a key once (`durable_agent.http._events`). The runtime makes every part of a
step durable before the loop yields it (a text delta is a stored stream partial, a tool result
a ``done`` step record, a suspension a checkpoint), so a process that resumes a run after a
crash re-emits the step in flight with the same keys: what the log holds is dropped, and a
replayed model answer (one text delta with the whole text) is cut to the characters the log
lacks. What a process died before logging, though the runtime had committed it, is rebuilt
from the stored records by `missing_events` before the run goes on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .._checkpoint import AgentCheckpoint, Usage
from .._durable_session import is_model_call
from .._errors import StepFailedError
from .._messages import content_parts
from .._parked import client_results_of
from .._storage.keys import parse_step_key
from .._storage.records import StepRecord, StreamPartialRecord
from .._transcript import approval_part
from ..stream_parts import (
    StreamFinish,
    StreamPart,
    StreamStepFinish,
    StreamStepRetry,
    StreamStepStart,
    StreamTextDelta,
    StreamToolApprovalRequest,
    StreamToolCall,
    StreamToolResult,
)
from ._events import RunEvent

__all__ = ["TERMINAL", "ProgressKeys", "error_event", "missing_events", "stop_events"]

TERMINAL = frozenset({"finish", "error"})
"""Event types that end a leg of a run (a finish, suspended or not, or a failure)."""

Keyed = tuple[str, dict[str, Any]]


def _usage(usage: Any) -> dict[str, Any]:
    return usage.to_dict() if isinstance(usage, Usage) else dict(usage or {})


def _text_event(step: int, attempt: int, offset: int, text: str) -> Keyed:
    key = f"step/{step}/text/{offset}" if attempt == 0 else f"step/{step}/text/{attempt}/{offset}"
    return key, {"type": "text-delta", "step_index": step, "attempt": attempt, "offset": offset, "text": text}


def _retry_event(step: int, attempt: int, error: str, delay_ms: int) -> Keyed:
    return f"step/{step}/retry/{attempt}", {"type": "step-retry", "step_index": step, "attempt": attempt,
                                            "error": error, "delay_ms": delay_ms}


def _error_text(error: BaseException) -> str:
    """An error as events show it: its class name (the original one for an error rebuilt from a record) and message."""
    name = error.name if isinstance(error, StepFailedError) else type(error).__name__
    return f"{name}: {error}"


def _call_event(step: int, call: dict[str, Any]) -> Keyed:
    return f"call/{call['tool_call_id']}", {"type": "tool-call", "step_index": step,
                                             **{k: call[k] for k in ("tool_call_id", "tool_name", "input")}}


def _result_event(result: dict[str, Any]) -> Keyed:
    return f"result/{result['tool_call_id']}", {
        "type": "tool-result", **{k: result.get(k) for k in ("tool_call_id", "tool_name", "output")},
        "is_error": bool(result.get("is_error")), **({"denied": True} if result.get("denied") else {}),
    }


def _approval_event(part: dict[str, Any]) -> Keyed:
    return f"approval/{part['approval_id']}", dict(part)


def _step_finish_event(step: int, usage: Any, finish_reason: str) -> Keyed:
    return f"step/{step}/finish", {"type": "step-finish", "step_index": step, "usage": _usage(usage),
                                   "finish_reason": finish_reason}


def _finish_event(step: int, reason: str, usage: Any, total_usage: Any) -> Keyed:
    return f"finish/{step}", {"type": "finish", "step_index": step, "finish_reason": reason,
                              "usage": _usage(usage), "total_usage": _usage(total_usage)}


def error_event(error: BaseException, attempt: str) -> Keyed:
    """The event of a failed leg; `attempt` makes its key unique (a failure is not a point of progress)."""
    code = getattr(error, "code", None)
    return f"error/{attempt}", {"type": "error", "code": code if isinstance(code, str) else "run_failed",
                                "message": _error_text(error)}


def stop_events(logged: Sequence[RunEvent], error: BaseException, attempt: str) -> list[Keyed]:
    """The end of a stopped leg (`RunAbortedError`): the step the stop cut, as the log shows it open, closed
    ``aborted`` (nothing of it was checkpointed), then the leg's ``error`` event (`error_event`)."""
    step = _open_step(logged)
    cut = [_step_finish_event(step, Usage(), "aborted")] if step is not None else []
    return [*cut, error_event(error, attempt)]


def _text_lengths(events: Iterable[RunEvent]) -> dict[tuple[int, int], int]:
    """Characters of text the log holds per (step, attempt)."""
    lengths: dict[tuple[int, int], int] = {}
    for event in events:
        data = event.data
        if data.get("type") == "text-delta":
            at = (data["step_index"], data.get("attempt", 0))
            lengths[at] = max(lengths.get(at, 0), data["offset"] + len(data["text"]))
    return lengths


class ProgressKeys:
    """Turns the parts one process sees of a run into keyed events, continuing the events the log holds.

    A part says where it belongs (``step_index``, ``attempt``), so each maps on its own; only the characters
    of each (step, attempt)'s text seen so far are counted, to give a text delta its offset (a ``step-start``
    or ``step-retry`` begins that count anew, for the attempt the parts after it carry)."""

    def __init__(self, logged: Sequence[RunEvent]) -> None:
        self._logged_text = _text_lengths(logged)  # characters of each (step, attempt)'s text the log holds
        self._seen_text: dict[tuple[int, int], int] = {}  # characters of it this process saw

    def events(self, part: StreamPart, *, leg_step: int | None = None) -> list[Keyed]:
        """The keyed events of `part` (none for a text delta the log holds). `leg_step` keys a ``finish``."""
        step = part.step_index
        match part:
            case StreamStepStart():
                self._seen_text[(step, 0)] = 0
                return [(f"step/{step}/start", {"type": "step-start", "step_index": step})]
            case StreamTextDelta():
                return self._text(step, part.attempt, part.text)
            case StreamStepRetry():
                self._seen_text[(step, part.attempt + 1)] = 0
                return [_retry_event(step, part.attempt, _error_text(part.error), part.delay_ms)]
            case StreamToolCall():
                return [_call_event(step, {"tool_call_id": part.tool_call_id, "tool_name": part.tool_name,
                                           "input": part.input})]
            case StreamToolResult():
                return [_result_event({"tool_call_id": part.tool_call_id, "tool_name": part.tool_name,
                                       "output": part.output, "is_error": part.is_error, "denied": part.denied})]
            case StreamToolApprovalRequest():
                return [_approval_event(approval_part(part.request))]
            case StreamStepFinish():
                return [_step_finish_event(step, part.usage, part.finish_reason)]
            case StreamFinish():
                return [_finish_event(step if leg_step is None else leg_step, part.finish_reason, part.usage,
                                      part.total_usage)]
        return []

    def _text(self, step: int, attempt: int, text: str) -> list[Keyed]:
        at = (step, attempt)
        start = self._seen_text.get(at, 0)
        end = self._seen_text[at] = start + len(text)
        logged = self._logged_text.get(at, 0)
        if end <= logged:
            return []
        cut = max(logged - start, 0)
        self._logged_text[at] = end
        return [_text_event(*at, start + cut, text[cut:])]


def _open_step(events: Sequence[RunEvent]) -> int | None:
    """The last step the log shows started and not finished."""
    keys = {e.key for e in events}
    for event in reversed(events):
        if event.data.get("type") == "step-start":
            step = int(event.data["step_index"])
            return None if f"step/{step}/finish" in keys else step
    return None


def _parked_last(events: Sequence[RunEvent]) -> bool:
    """Whether the log's last leg ended parked (its last finish is ``suspended``)."""
    finish = next((e for e in reversed(events) if e.data.get("type") == "finish"), None)
    return finish is not None and finish.data.get("finish_reason") == "suspended"


def _results_in(messages: Sequence[Any], call_ids: set[str]) -> list[dict[str, Any]]:
    return [dict(p) for m in messages if m["role"] == "tool" for p in content_parts(m)
            if p["type"] == "tool-result" and p["tool_call_id"] in call_ids]


def _model_call(run_id: str, step: int, logged: Sequence[RunEvent], steps: Sequence[StepRecord],
                partials: Sequence[StreamPartialRecord]) -> tuple[list[Keyed], dict[str, Any] | None]:
    """The open step's model call as its records prove it: a ``step-retry`` per failed attempt and the text
    of its last attempt beyond what the log holds; and the finished answer (None when no attempt finished)."""
    out: list[Keyed] = []
    attempts = [r for r in steps if is_model_call(r.key, run_id, step)]
    for failed in sorted((r for r in attempts if r.status == "failed"), key=lambda r: parse_step_key(r.key).attempt):
        error = failed.error
        decision = error.decision if error is not None and isinstance(error.decision, dict) else {}
        message = f"{error.name}: {error.message}" if error is not None else "the model call failed"
        out.append(_retry_event(step, parse_step_key(failed.key).attempt, message, int(decision.get("delay_ms", 0))))
    done = next((r for r in attempts if r.status == "done"), None)
    streamed = [p for p in partials if is_model_call(p.step_key, run_id, step)]
    if done is not None:
        attempt, text = parse_step_key(done.key).attempt, str(done.result["text"])
    else:
        attempt = max((parse_step_key(p.step_key).attempt for p in streamed), default=0)
        last = sorted((p for p in streamed if parse_step_key(p.step_key).attempt == attempt), key=lambda p: p.seq)
        text = "".join(p.text for p in last)
    logged_text = _text_lengths(logged).get((step, attempt), 0)
    if len(text) > logged_text:
        out.append(_text_event(step, attempt, logged_text, text[logged_text:]))
    return out, done.result if done is not None else None


def _streamed(run_id: str, step: int, partials: Sequence[StreamPartialRecord]) -> bool:
    """Whether the step's model call streamed before it stopped: the resumed run joins that as an aborted turn."""
    return any(is_model_call(p.step_key, run_id, step) for p in partials)


def missing_events(
    run_id: str,
    logged: Sequence[RunEvent],
    checkpoint: AgentCheckpoint | None,
    steps: Sequence[StepRecord],
    partials: Sequence[StreamPartialRecord],
) -> list[Keyed]:
    """What the stored run proves happened but the log lacks; call it only while no process drives the run.

    In loop order: for the step the log shows open, a ``step-retry`` per failed model call
    attempt, the text its last attempt's partials (or its finished answer) hold beyond the
    logged text, its tool calls, and, once the run's
    checkpoint is past that step, its tool results and its step-finish (``aborted`` when the
    model call never finished: the resumed run joins that text as an aborted turn and goes
    on with the next step); when the log's last leg ended parked, the results the checkpoint
    holds for the calls it logged unanswered (settled by the leg that resumed it, or client
    results); then, when the checkpoint parked or finished the run, its approval requests and
    the leg's ``finish``, and the client tool results recorded since it parked. The events a
    resumed run will produce itself (a step it replays) are left to it.
    """
    keys = {e.key for e in logged}
    out: list[Keyed] = []
    step = _open_step(logged)
    past = checkpoint.step_index if checkpoint is not None else -1
    ended = checkpoint is not None and checkpoint.status in ("suspended", "completed")
    if step is not None:
        retries_and_text, model = _model_call(run_id, step, logged, steps, partials)
        out.extend(retries_and_text)
        calls = list(model["tool_calls"]) if model is not None else []
        out.extend(_call_event(step, c) for c in calls)
        if past >= step:
            assert checkpoint is not None
            out.extend(_result_event(r) for r in _results_in(checkpoint.messages, {c["tool_call_id"] for c in calls}))
        if past >= step and checkpoint is not None and checkpoint.status == "suspended":
            out.extend(_approval_event(approval_part(r)) for r in checkpoint.pending_approvals or ())
        if past >= step or (model is None and _streamed(run_id, step, partials)):
            usage = model["usage"] if model is not None else Usage()
            out.append(_step_finish_event(step, usage, model["finish_reason"] if model is not None else "aborted"))
    if checkpoint is not None and _parked_last(logged):  # results its calls got since: settled, or a client's
        unanswered = {e.data["tool_call_id"] for e in logged
                      if e.data.get("type") == "tool-call" and f"result/{e.data['tool_call_id']}" not in keys}
        out.extend(_result_event(r) for r in _results_in(checkpoint.messages, unanswered))
    if ended and checkpoint is not None and f"finish/{checkpoint.step_index}" not in keys:
        if checkpoint.status == "suspended":
            out.extend(_approval_event(approval_part(r)) for r in checkpoint.pending_approvals or ())
        reason = "suspended" if checkpoint.status == "suspended" else "stop"
        out.append(_finish_event(checkpoint.step_index, reason, Usage(), checkpoint.usage))
    if checkpoint is not None and checkpoint.status == "suspended":  # results handed over for its client tools
        out.extend(_result_event(r) for r in client_results_of(checkpoint.messages))
    seen = set(keys)
    unique = []
    for key, data in out:
        if key not in seen:
            seen.add(key)
            unique.append((key, data))
    return unique
