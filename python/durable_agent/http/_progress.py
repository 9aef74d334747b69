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
from the stored records by `missing_events` before the run goes on; so are the steps another
process ran with no event log (``durable-agent runs resume`` on the endpoint's database).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .._checkpoint import AgentCheckpoint, Usage
from .._errors import StepFailedError
from .._interrupted import is_model_call
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


def _asked(run_id: str, step: int, steps: Sequence[StepRecord], partials: Sequence[StreamPartialRecord]) -> bool:
    """Whether the step's model call left any record or partial (a step with none is a settle phase, or a call
    that died before it streamed: nothing proves it)."""
    return any(is_model_call(r.key, run_id, step) for r in steps) or _streamed(run_id, step, partials)


def _streamed(run_id: str, step: int, partials: Sequence[StreamPartialRecord]) -> bool:
    """Whether the step's model call streamed before it stopped: the resumed run joins that as an aborted turn."""
    return any(is_model_call(p.step_key, run_id, step) for p in partials)


def _carried(results: Iterable[dict[str, Any]]) -> Usage:
    """The tokens tool results carry (a sub-agent's), as the loop adds them to its step's usage."""
    return sum((Usage.from_dict(r["usage"]) for r in results if "usage" in r), Usage())


def _step_events(run_id: str, step: int, logged: Sequence[RunEvent], checkpoint: AgentCheckpoint | None,
                 steps: Sequence[StepRecord], partials: Sequence[StreamPartialRecord]) -> tuple[list[Keyed], Usage]:
    """A step's events after its start, beyond what the log holds, as its records prove them; and what the step
    cost (its answer's tokens and those its results carry: a sub-agent's).

    Its model call (`_model_call`), the calls of its answer, and, once the checkpoint is past the
    step, their results, the approval requests it parked on (the checkpoint's own step only) and
    its finish (``aborted`` when the call never finished but streamed: the resumed run joins that
    text as an aborted turn and goes on with the next step).
    """
    out, model = _model_call(run_id, step, logged, steps, partials)
    calls = list(model["tool_calls"]) if model is not None else []
    out.extend(_call_event(step, c) for c in calls)
    usage = Usage.from_dict(model["usage"]) if model is not None else Usage()
    past = checkpoint is not None and checkpoint.step_index >= step
    if past:
        assert checkpoint is not None
        results = _results_in(checkpoint.messages, {c["tool_call_id"] for c in calls})
        out.extend(_result_event(r) for r in results)
        usage += _carried(results)
        if checkpoint.status == "suspended" and checkpoint.step_index == step:
            out.extend(_approval_event(approval_part(r)) for r in checkpoint.pending_approvals or ())
    if past or (model is None and _streamed(run_id, step, partials)):
        out.append(_step_finish_event(step, model["usage"] if model is not None else Usage(),
                                      model["finish_reason"] if model is not None else "aborted"))
    return out, usage


def _last_step(events: Sequence[RunEvent]) -> int:
    """The last step the log shows anything of (0: none; a run's first step is 1)."""
    return max((int(e.data["step_index"]) for e in events if "step_index" in e.data), default=0)


def _unanswered(events: Iterable[Keyed]) -> set[str]:
    """The calls `events` show made and not answered."""
    keys = {key for key, _ in events}
    return {data["tool_call_id"] for key, data in events
            if data.get("type") == "tool-call" and f"result/{data['tool_call_id']}" not in keys}


def _unlogged_steps(run_id: str, logged: Sequence[RunEvent], rebuilt: Sequence[Keyed], checkpoint: AgentCheckpoint,
                    steps: Sequence[StepRecord], partials: Sequence[StreamPartialRecord]) -> tuple[list[Keyed], Usage]:
    """The steps after the last one the log shows, up to the checkpoint's: another process ran them and logged
    nothing (`Agent.resume`, what ``durable-agent runs resume`` runs). Each as the loop streams it: its start,
    then `_step_events`; a step whose model call left nothing is a settle phase: the results of the calls left
    unanswered (those the log and `rebuilt` show). And what those steps cost: the usage of their leg."""
    out: list[Keyed] = []
    usage = Usage()
    for step in range(_last_step(logged) + 1, checkpoint.step_index + 1):
        if _asked(run_id, step, steps, partials):
            events, cost = _step_events(run_id, step, (), checkpoint, steps, partials)
            out += [(f"step/{step}/start", {"type": "step-start", "step_index": step}), *events]
        else:
            so_far = [*((e.key, e.data) for e in logged), *rebuilt, *out]
            results = _results_in(checkpoint.messages, _unanswered(so_far))
            out.extend(_result_event(r) for r in results)
            cost = _carried(results)
        usage += cost
    return out, usage


def missing_events(
    run_id: str,
    logged: Sequence[RunEvent],
    checkpoint: AgentCheckpoint | None,
    steps: Sequence[StepRecord],
    partials: Sequence[StreamPartialRecord],
) -> list[Keyed]:
    """What the stored run proves happened but the log lacks; call it only while no process drives the run.

    In loop order: for the step the log shows open, the rest of it (`_step_events`): a
    ``step-retry`` per failed model call attempt, the text its last attempt's partials (or its
    finished answer) hold beyond the logged text, its tool calls, and, once the run's
    checkpoint is past that step, its tool results and its step-finish; then every step after
    the last one the log shows, up to the checkpoint's (`_unlogged_steps`: run by a leg that
    resumed a parked run, or by another process that logs nothing); then, when the checkpoint
    parked or finished the run, its approval requests and the leg's ``finish`` (its usage:
    that of the steps rebuilt whole), and the client tool results recorded since it parked.
    The events a resumed run will produce itself (a step it replays) are left to it.
    """
    keys = {e.key for e in logged}
    out: list[Keyed] = []
    step = _open_step(logged)
    ended = checkpoint is not None and checkpoint.status in ("suspended", "completed")
    if step is not None:
        out.extend(_step_events(run_id, step, logged, checkpoint, steps, partials)[0])
    leg_usage = Usage()
    if checkpoint is not None:
        unlogged, leg_usage = _unlogged_steps(run_id, logged, out, checkpoint, steps, partials)
        out.extend(unlogged)
    if ended and checkpoint is not None and f"finish/{checkpoint.step_index}" not in keys:
        if checkpoint.status == "suspended":
            out.extend(_approval_event(approval_part(r)) for r in checkpoint.pending_approvals or ())
        reason = "suspended" if checkpoint.status == "suspended" else "stop"
        out.append(_finish_event(checkpoint.step_index, reason, leg_usage, checkpoint.usage))
    if checkpoint is not None and checkpoint.status == "suspended":  # results handed over for its client tools
        out.extend(_result_event(r) for r in client_results_of(checkpoint.messages))
    seen = set(keys)
    unique = []
    for key, data in out:
        if key not in seen:
            seen.add(key)
            unique.append((key, data))
    return unique
