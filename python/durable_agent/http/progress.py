"""Events named by a run's durable progress: what makes a resumed stream lose nothing and repeat nothing.

Every event the endpoint stores carries a key that says *where in the run* it happened, not
*when a process saw it*:

==============================  =====================================================
event                           key
==============================  =====================================================
``step-start``                  ``step/<step_index>/start``
``text-delta``                  ``step/<step_index>/text/<offset>`` (offset: characters of
                                that step's text before this delta)
``tool-call``                   ``call/<tool_call_id>``
``tool-result``                 ``result/<tool_call_id>``
``tool-approval-request``       ``approval/<approval_id>``
``step-finish``                 ``step/<step_index>/finish``
``finish``                      ``finish/<step_index of the checkpoint that ended the leg>``
==============================  =====================================================

The log keeps a key once (`durable_agent.http.events`). The runtime makes every part of a
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

from ..checkpoint import AgentCheckpoint, Usage
from ..loop import approval_part
from ..messages import content_parts
from ..runtime.keys import MODEL_CALL, step_key
from ..runtime.records import StepRecord, StreamPartialRecord
from .events import RunEvent

__all__ = ["TERMINAL", "ProgressKeys", "error_event", "missing_events"]

TERMINAL = frozenset({"finish", "error"})
"""Event types that end a leg of a run (a finish, suspended or not, or a failure)."""

Keyed = tuple[str, dict[str, Any]]


def _usage(usage: Any) -> dict[str, Any]:
    return usage.to_dict() if isinstance(usage, Usage) else dict(usage or {})


def _text_event(step: int, offset: int, text: str) -> Keyed:
    return f"step/{step}/text/{offset}", {"type": "text-delta", "step_index": step, "offset": offset, "text": text}


def _call_event(step: int, call: dict[str, Any]) -> Keyed:
    return f"call/{call['tool_call_id']}", {"type": "tool-call", "step_index": step,
                                             **{k: call[k] for k in ("tool_call_id", "tool_name", "input")}}


def _result_event(result: dict[str, Any]) -> Keyed:
    return f"result/{result['tool_call_id']}", {
        "type": "tool-result", **{k: result.get(k) for k in ("tool_call_id", "tool_name", "output")},
        "is_error": bool(result.get("is_error")),
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
                                "message": f"{type(error).__name__}: {error}"}


def _text_lengths(events: Iterable[RunEvent]) -> dict[int, int]:
    lengths: dict[int, int] = {}
    for event in events:
        data = event.data
        if data.get("type") == "text-delta":
            step = data["step_index"]
            lengths[step] = max(lengths.get(step, 0), data["offset"] + len(data["text"]))
    return lengths


class ProgressKeys:
    """Turns the parts one process sees of a run into keyed events, continuing the events the log holds."""

    def __init__(self, logged: Sequence[RunEvent]) -> None:
        self._logged_text = _text_lengths(logged)  # characters of each step's text the log holds
        self._seen_text: dict[int, int] = {}  # characters of each step's text this process saw
        self._step = 0

    def events(self, part: dict[str, Any], *, leg_step: int | None = None) -> list[Keyed]:
        """The keyed events of `part` (none for a text delta the log holds). `leg_step` keys a ``finish``."""
        kind = part["type"]
        if kind == "step-start":
            self._step = step = part["step_index"]
            self._seen_text[step] = 0
            return [(f"step/{step}/start", {"type": "step-start", "step_index": step})]
        if kind == "text-delta":
            return self._text(part["text"])
        if kind == "tool-call":
            return [_call_event(self._step, part)]
        if kind == "tool-result":
            return [_result_event(part)]
        if kind == "tool-approval-request":
            return [_approval_event(part)]
        if kind == "step-finish":
            return [_step_finish_event(part["step_index"], part["usage"], part["finish_reason"])]
        if kind == "finish":
            return [_finish_event(self._step if leg_step is None else leg_step, part["finish_reason"],
                                  part["usage"], part["total_usage"])]
        return []

    def _text(self, text: str) -> list[Keyed]:
        step = self._step
        start = self._seen_text.get(step, 0)
        end = self._seen_text[step] = start + len(text)
        logged = self._logged_text.get(step, 0)
        if end <= logged:
            return []
        cut = max(logged - start, 0)
        self._logged_text[step] = end
        return [_text_event(step, start + cut, text[cut:])]


def _open_step(events: Sequence[RunEvent]) -> int | None:
    """The last step the log shows started and not finished."""
    keys = {e.key for e in events}
    for event in reversed(events):
        if event.data.get("type") == "step-start":
            step = int(event.data["step_index"])
            return None if f"step/{step}/finish" in keys else step
    return None


def _results_in(messages: Sequence[Any], call_ids: set[str]) -> list[dict[str, Any]]:
    return [dict(p) for m in messages if m["role"] == "tool" for p in content_parts(m)
            if p["type"] == "tool-result" and p["tool_call_id"] in call_ids]


def missing_events(
    run_id: str,
    logged: Sequence[RunEvent],
    checkpoint: AgentCheckpoint | None,
    steps: Sequence[StepRecord],
    partials: Sequence[StreamPartialRecord],
) -> list[Keyed]:
    """What the stored run proves happened but the log lacks; call it only while no process drives the run.

    In loop order: for the step the log shows open, the text its stored partials (or its
    finished model call) hold beyond the logged text, its tool calls, and, once the run's
    checkpoint is past that step, its tool results and its step-finish (``aborted`` when the
    model call never finished: the resumed run joins that text as an aborted turn and goes
    on with the next step); then, when the checkpoint parked or finished the run, its
    approval requests and the leg's ``finish``. The events a resumed run will produce itself
    (a step it replays) are left to it.
    """
    keys = {e.key for e in logged}
    out: list[Keyed] = []
    step = _open_step(logged)
    past = checkpoint.step_index if checkpoint is not None else -1
    ended = checkpoint is not None and checkpoint.status in ("suspended", "completed")
    if step is not None:
        model_key = step_key(run_id, step, MODEL_CALL)
        model = next((r.result for r in steps if r.key == model_key and r.status == "done"), None)
        if model is not None:
            text = model["text"]
        else:
            text = "".join(p.text for p in sorted((p for p in partials if p.step_key == model_key),
                                                  key=lambda p: p.seq))
        logged_text = _text_lengths(logged).get(step, 0)
        if len(text) > logged_text:
            out.append(_text_event(step, logged_text, text[logged_text:]))
        calls = list(model["tool_calls"]) if model is not None else []
        out.extend(_call_event(step, c) for c in calls)
        if past >= step:
            assert checkpoint is not None
            out.extend(_result_event(r) for r in _results_in(checkpoint.messages, {c["tool_call_id"] for c in calls}))
        if past >= step and checkpoint is not None and checkpoint.status == "suspended":
            out.extend(_approval_event(approval_part(r)) for r in checkpoint.pending_approvals or ())
        if past >= step or (model is None and text):
            usage = model["usage"] if model is not None else Usage()
            out.append(_step_finish_event(step, usage, model["finish_reason"] if model is not None else "aborted"))
    if ended and checkpoint is not None and f"finish/{checkpoint.step_index}" not in keys:
        if checkpoint.status == "suspended":
            out.extend(_approval_event(approval_part(r)) for r in checkpoint.pending_approvals or ())
        reason = "suspended" if checkpoint.status == "suspended" else "stop"
        out.append(_finish_event(checkpoint.step_index, reason, Usage(), checkpoint.usage))
    seen = set(keys)
    unique = []
    for key, data in out:
        if key not in seen:
            seen.add(key)
            unique.append((key, data))
    return unique
