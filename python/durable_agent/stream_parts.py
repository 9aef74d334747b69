"""Stream parts: what `stream_chat(...).full_stream` yields and `Agent.run(on_part=)` receives.

Every part is a frozen dataclass with a literal ``type`` (a class attribute: ``StreamTextDelta.type ==
"text-delta"``) and the place in the run it belongs to:

* ``step_index``: the step of the run (it goes on across legs, as the checkpoint's does);
* ``attempt``: the step's model call attempt, 0 until a ``step-retry`` (a ``step-retry`` part carries the
  attempt that failed; the parts after it carry the next one). A settle phase (the unanswered calls a
  resumed run answers before its next step) is attempt 0 of its step.

So a reader places a part without remembering the parts before it. Read the fields as attributes
(``part.type``, ``part.text``); match on the class (``isinstance(part, StreamTextDelta)``) or on
``part.type``, which type checkers narrow the `StreamPart` union on. ``part.to_dict()`` gives ``type`` and the
fields as a dict, for code that wants a mapping.

==============================  ===========================  =======================================================
``type``                        class                        fields (besides ``step_index`` and ``attempt``)
==============================  ===========================  =======================================================
``step-start``                  `StreamStepStart`
``text-delta``                  `StreamTextDelta`            ``text``
``refusal``                     `StreamRefusal`              ``text``: the model declined
``tool-call``                   `StreamToolCall`             ``tool_call_id``, ``tool_name``, ``input``
``tool-result``                 `StreamToolResult`           ``tool_call_id``, ``tool_name``, ``output``, ``is_error``,
                                                             ``attachments`` (images or files the tool returned),
                                                             ``usage`` (a sub-agent's, else None), ``denied`` (its
                                                             approval was refused: the call never ran)
``tool-progress``               `StreamToolProgress`         ``tool_call_id``, ``tool_name``, ``progress``, ``total``,
                                                             ``message``: an MCP tool's progress while it runs (not
                                                             stored, so a replayed call sends none)
``tool-approval-request``       `StreamToolApprovalRequest`  the request's ``approval_id``, ``tool_call_id``,
                                                             ``tool_name``, ``input``, ``agent_path``, ``token``
``step-retry``                  `StreamStepRetry`            ``error`` (the exception), ``delay_ms``: a model call
                                                             failed and is tried again (or by a fallback model); drop
                                                             whatever text that attempt streamed
``step-finish``                 `StreamStepFinish`           ``usage``, ``finish_reason``, ``raw_finish_reason`` (the
                                                             provider's own)
``finish``                      `StreamFinish`               ``finish_reason``, ``usage`` of this call, ``total_usage``
                                                             of the run (``step_index``: the leg's last step)
``error``                       `StreamError`                ``error``: the exception that ended the call
==============================  ===========================  =======================================================

The endpoint (`durable_agent.http`) stores each part as an event of its own JSON shape
(`durable_agent.http._progress`); these classes are the in-process form.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from ._checkpoint import ToolApprovalRequest, Usage
from ._messages import FilePart, ImagePart
from ._results import FinishReason

__all__ = [
    "StreamError",
    "StreamFinish",
    "StreamPart",
    "StreamRefusal",
    "StreamStepFinish",
    "StreamStepRetry",
    "StreamStepStart",
    "StreamTextDelta",
    "StreamToolApprovalRequest",
    "StreamToolCall",
    "StreamToolProgress",
    "StreamToolResult",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Placed:
    """Where in the run a part belongs (see the module docs)."""

    step_index: int
    attempt: int = 0

    type: ClassVar[str]  # each part class's own literal

    def to_dict(self) -> dict[str, Any]:
        """The part's fields as a dict, ``type`` first (values as they are: exceptions, `Usage`, ...)."""
        return {"type": self.type, **{f.name: getattr(self, f.name) for f in fields(self)}}


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamStepStart(_Placed):
    """A step begins: its model call follows."""

    type: ClassVar[Literal["step-start"]] = "step-start"


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamTextDelta(_Placed):
    """The next characters of the model's answer (a replayed answer comes as one delta)."""

    type: ClassVar[Literal["text-delta"]] = "text-delta"
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamRefusal(_Placed):
    """The model declined: its explanation, as it streams."""

    type: ClassVar[Literal["refusal"]] = "refusal"
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamToolCall(_Placed):
    """The model asked for a tool call."""

    type: ClassVar[Literal["tool-call"]] = "tool-call"
    tool_call_id: str
    tool_name: str
    input: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamToolResult(_Placed):
    """A tool call's result, streamed once it is durable (the same result the tool message holds)."""

    type: ClassVar[Literal["tool-result"]] = "tool-result"
    tool_call_id: str
    tool_name: str
    output: Any
    is_error: bool
    attachments: tuple[ImagePart | FilePart, ...] = ()
    usage: Usage | None = None  # what a sub-agent behind the tool spent
    denied: bool = False  # its approval was refused: it never ran (`ToolResultPart`)

    @classmethod
    def of(cls, result: Mapping[str, Any], *, step_index: int, attempt: int) -> StreamToolResult:
        """The part of a tool result as the tool message holds it."""
        usage = result.get("usage")
        return cls(step_index=step_index, attempt=attempt, tool_call_id=result["tool_call_id"],
                   tool_name=result["tool_name"], output=result.get("output"), is_error=bool(result.get("is_error")),
                   attachments=tuple(result.get("attachments") or ()),
                   usage=Usage.from_dict(usage) if usage is not None else None, denied=bool(result.get("denied")))


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamToolProgress(_Placed):
    """A running tool's progress report (`ToolCallContext.report_progress`)."""

    type: ClassVar[Literal["tool-progress"]] = "tool-progress"
    tool_call_id: str
    tool_name: str
    progress: float
    total: float | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamToolApprovalRequest(_Placed):
    """A tool call waits for a verdict (the run suspends); the fields are the `ToolApprovalRequest`'s."""

    type: ClassVar[Literal["tool-approval-request"]] = "tool-approval-request"
    approval_id: str
    tool_call_id: str
    tool_name: str
    input: Any
    agent_path: tuple[str, ...] | None = None  # the sub-agents between the run and the tool, outermost first
    token: str | None = None

    @classmethod
    def of(cls, request: ToolApprovalRequest, *, step_index: int, attempt: int) -> StreamToolApprovalRequest:
        return cls(step_index=step_index, attempt=attempt, approval_id=request.approval_id,
                   tool_call_id=request.tool_call_id, tool_name=request.tool_name, input=request.input,
                   agent_path=request.agent_path, token=request.token)

    @property
    def request(self) -> ToolApprovalRequest:
        """The request this part announces (what `resolve_approval` and a `ToolApprovalResponse` answer)."""
        return ToolApprovalRequest(self.approval_id, self.tool_call_id, self.tool_name, self.input, self.agent_path,
                                   self.token)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamStepRetry(_Placed):
    """Model call attempt `attempt` failed with `error`; the next starts after `delay_ms`. Drop its text."""

    type: ClassVar[Literal["step-retry"]] = "step-retry"
    error: BaseException
    delay_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamStepFinish(_Placed):
    """A step ended (its checkpoint is stored): the model call's usage and finish reason."""

    type: ClassVar[Literal["step-finish"]] = "step-finish"
    usage: Usage
    finish_reason: str
    raw_finish_reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamFinish(_Placed):
    """The call ended (or suspended): `usage` of this call, `total_usage` of the run."""

    type: ClassVar[Literal["finish"]] = "finish"
    finish_reason: FinishReason
    usage: Usage
    total_usage: Usage


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamError(_Placed):
    """The call failed: the last part (`generate_text` raises `error` instead)."""

    type: ClassVar[Literal["error"]] = "error"
    error: BaseException


StreamPart = (StreamStepStart | StreamTextDelta | StreamRefusal | StreamToolCall | StreamToolResult
              | StreamToolProgress | StreamToolApprovalRequest | StreamStepRetry | StreamStepFinish | StreamFinish
              | StreamError)
"""Any stream part; narrow it with ``isinstance`` or on ``part.type``."""
