"""What a call returns: `GenerateTextResult` (buffered) and the per-step `StepResult`, plus stream parts.

Stream parts are plain dicts with a ``type``:

* ``step-start`` (``step_index``), ``text-delta`` (``text``),
* ``tool-call`` (``tool_call_id``, ``tool_name``, ``input``),
* ``tool-result`` (``tool_call_id``, ``tool_name``, ``output``, ``is_error``, and ``attachments`` when the
  tool returned images or files),
* ``tool-progress`` (``tool_call_id``, ``tool_name``, ``progress``, ``total``, ``message``): an MCP tool's
  progress while it runs (`durable_agent.mcp`; not stored, so a replayed call sends none),
* ``tool-approval-request`` (the request's fields: ``approval_id``, ``tool_call_id``, ``tool_name``,
  ``input``, ``agent_path``, ``token``),
* ``step-retry`` (``step_index``, ``attempt``, ``error``, ``delay_ms``): a model call failed and is tried
  again (or by a fallback model); drop whatever text that attempt streamed,
* ``step-finish`` (``step_index``, ``usage``, ``finish_reason``),
* ``finish`` (``finish_reason``, ``usage`` of this call, ``total_usage`` of the run),
* ``error`` (``error``: the exception).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .checkpoint import ToolApprovalRequest, Usage
from .messages import Message

FinishReason = Literal["stop", "length", "suspended", "max-steps", "stop-condition", "runaway"]
Part = dict[str, Any]


@dataclass(frozen=True, slots=True)
class StepResult:
    """One step of this call: the model's answer and the tool results it led to."""

    step_index: int
    text: str
    tool_calls: tuple[dict[str, Any], ...]
    tool_results: tuple[dict[str, Any], ...]
    usage: Usage
    finish_reason: str


@dataclass(frozen=True, slots=True)
class GenerateTextResult:
    """The outcome of `generate_text` or `resume_from_checkpoint`.

    `usage` is what this call cost; `total_usage` is the whole run's (every leg).
    `pending_approvals` and `client_tool_calls` are set when the run suspended.
    `run_id` is set on agentic calls (with tools) and None otherwise.
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
