"""What a call returns: `GenerateTextResult` (buffered) and the per-step `StepResult`.

The parts a call streams are in `durable_agent.stream_parts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._checkpoint import ToolApprovalRequest, Usage
from ._messages import Message

FinishReason = Literal["stop", "length", "refusal", "content-filter", "suspended", "max-steps", "stop-condition",
                       "runaway"]


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step of this call: the model's answer and the tool results it led to."""

    step_index: int
    text: str
    tool_calls: tuple[dict[str, Any], ...]
    tool_results: tuple[dict[str, Any], ...]
    usage: Usage
    finish_reason: str
    raw_finish_reason: str | None = None  # the provider's own finish reason, when it gave one


@dataclass(frozen=True, slots=True)
class GenerateTextResult:
    """The outcome of `generate_text` or `resume_from_checkpoint`.

    `usage` is what this call cost; `total_usage` is the whole run's (every leg).
    `pending_approvals` and `client_tool_calls` are set when the run suspended.
    `run_id` is set on agentic calls (with tools) and None otherwise. `finish_reason` is
    ``refusal`` when the model declined (a ``refusal`` part ends the last assistant message,
    and `output` stays None) and ``content-filter`` when the provider's filter cut the answer;
    `raw_finish_reason` is the provider's own reason of the last model call (``end_turn``,
    ``content_filter``, ``pause_turn``, ...), None when it gave none.
    """

    text: str
    messages: Sequence[Message]
    steps: tuple[StepResult, ...]
    usage: Usage
    total_usage: Usage
    finish_reason: FinishReason
    pending_approvals: tuple[ToolApprovalRequest, ...]
    client_tool_calls: tuple[dict[str, Any], ...]
    run_id: str | None
    output: Any = None  # the parsed final answer, when the call asked for `output=`
    raw_finish_reason: str | None = None
