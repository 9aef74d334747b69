"""What a run *is* between steps: `AgentCheckpoint`, its parts, and its stored form.

The stored form of a dataclass uses its field names (snake_case); the text form is the
checkpoint codec's output (see ``docs/codec.md``).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._errors import CheckpointCorruptError, CheckpointVersionError, CodecError, ConfigurationError
from ._kernels import kernels
from ._messages import Message

CHECKPOINT_VERSION = 1
RunStatus = Literal["running", "suspended", "completed"]
RUN_STATUSES: tuple[RunStatus, ...] = ("running", "suspended", "completed")


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage. Adding two gives the sum; `total_tokens` is kept as the provider reported it.

    `input_tokens` counts the whole prompt, cached parts included; the details say how much of
    it was read from (`cache_read_tokens`) or written to (`cache_write_tokens`) a provider's
    prompt cache, and how much of `output_tokens` was reasoning (`reasoning_tokens`). The
    stored form names a detail only when it is not zero.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        if not any(_usage_values(other)):  # adding nothing (a phase without sub-agents): no new object
            return self
        return Usage(*map(operator.add, _usage_values(self), _usage_values(other)))  # C-speed: a few per step

    def to_dict(self) -> dict[str, int]:
        out = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
               "total_tokens": self.total_tokens}
        if self.reasoning_tokens or self.cache_read_tokens or self.cache_write_tokens:  # rare: details named
            out.update((name, value) for name in _USAGE_FIELDS[3:] if (value := getattr(self, name)))
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        values = [data.get(name, 0) for name in _USAGE_FIELDS]
        if not all(type(v) is int and v >= 0 for v in values):
            raise ValueError(f"usage counts must be non-negative ints, got {dict(data)!r}")
        return cls(*values)


_USAGE_FIELDS = ("input_tokens", "output_tokens", "total_tokens", "reasoning_tokens", "cache_read_tokens",
                 "cache_write_tokens")
_usage_values = operator.attrgetter(*_USAGE_FIELDS)

NO_USAGE = Usage()
"""Zero usage, shared: the default of what has spent nothing yet (a `Usage` is immutable; building one costs a
frozen dataclass's field-by-field init, several a step)."""


@dataclass(frozen=True, slots=True)
class ToolApprovalRequest:
    """A gated tool call waiting for a verdict (client mode).

    `approval_id` is distinct from `tool_call_id`: verdicts name the approval, and a token
    signed for one approval cannot settle another. `agent_path` names the sub-agents the
    request came through (outermost first); None for the top-level agent.
    """

    approval_id: str
    tool_call_id: str
    tool_name: str
    input: Any
    agent_path: tuple[str, ...] | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        path = self.agent_path
        if path is not None:
            if isinstance(path, str) or not all(isinstance(p, str) for p in path):
                raise TypeError("agent_path must be a sequence of agent names (str), not a single str")
            object.__setattr__(self, "agent_path", tuple(path))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "approval_id": self.approval_id,
            "tool_call_id": self.tool_call_id,
            "tool_name": self.tool_name,
            "input": self.input,
        }
        if self.agent_path is not None:
            data["agent_path"] = list(self.agent_path)
        if self.token is not None:
            data["token"] = self.token
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolApprovalRequest:
        for name in ("approval_id", "tool_call_id", "tool_name"):
            if not isinstance(data.get(name), str):
                raise ValueError(f"approval request field {name!r} must be a str")
        path = data.get("agent_path")
        if path is not None and not (isinstance(path, list) and all(isinstance(p, str) for p in path)):
            raise ValueError("approval request agent_path must be a list of str")
        token = data.get("token")
        if token is not None and not isinstance(token, str):
            raise ValueError("approval request token must be a str")
        return cls(
            approval_id=data["approval_id"],
            tool_call_id=data["tool_call_id"],
            tool_name=data["tool_name"],
            input=data.get("input"),
            agent_path=tuple(path) if path is not None else None,
            token=token,
        )


@dataclass(frozen=True, slots=True)
class ToolApprovalResponse:
    """A verdict on one approval request. A denial needs no token; an approval may need one."""

    approval_id: str
    approved: bool
    reason: str | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        check_verdict(self.approved)


def check_verdict(approved: object) -> bool:
    """`approved` itself when it is a real bool; anything else (``"false"``, 0, None) is refused.

    Every path that takes a verdict checks it here, so ``approved="false"`` is never honoured
    as an approval by truthiness.
    """
    if type(approved) is not bool:
        raise ConfigurationError(f"an approval verdict must be True or False, got {approved!r}")
    return approved


@dataclass(frozen=True, slots=True)
class AgentCheckpoint:
    """The state of a run at a step boundary. See the checkpoint spec; every field is plain data.

    `trace_context` is the W3C trace context (``{"traceparent": ..., "tracestate": ...}``) of the
    leg that started the run, carried by every later checkpoint, so a leg resumed in another
    process links its span to the trace that started the run (`durable_agent.tracing`). None when
    that leg was not traced; stored only when set, so checkpoints written without it (and by
    earlier releases) load as they are.
    """

    run_id: str
    step_index: int
    status: RunStatus
    messages: Sequence[Message]
    usage: Usage
    created_at: int
    pending_approvals: tuple[ToolApprovalRequest, ...] | None = None
    agent_path: tuple[str, ...] | None = None
    version: int = CHECKPOINT_VERSION
    step_id: str = field(default="")
    trace_context: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if not self.step_id:
            object.__setattr__(self, "step_id", f"{self.run_id}#{self.step_index}")

    def to_dict(self, *, messages: bool = True) -> dict[str, Any]:
        """The stored dict; `messages=False` leaves the history out (a store's header: O(1), nothing copied)."""
        data: dict[str, Any] = {
            "version": self.version,
            "run_id": self.run_id,
            "step_id": self.step_id,
            "step_index": self.step_index,
            "status": self.status,
        }
        if messages:
            data["messages"] = list(self.messages)
        data["usage"] = self.usage.to_dict()
        if self.pending_approvals is not None:
            data["pending_approvals"] = [r.to_dict() for r in self.pending_approvals]
        if self.agent_path is not None:
            data["agent_path"] = list(self.agent_path)
        data["created_at"] = self.created_at
        if self.trace_context is not None:
            data["trace_context"] = dict(self.trace_context)
        return data

    def refuse_newer(self) -> AgentCheckpoint:
        """This checkpoint, unless a newer durable-agent wrote it (`CheckpointVersionError`).

        Stores that decode text refuse such a checkpoint when loading it; stores that keep
        objects (the in-memory one) do not, so whoever continues a run checks it here too.
        """
        if type(self.version) is not int or self.version > CHECKPOINT_VERSION:
            raise CheckpointVersionError(self.version, CHECKPOINT_VERSION)
        return self

    @classmethod
    def from_dict(cls, data: Any, *, run_id: str | None = None) -> AgentCheckpoint:
        """Rebuild a checkpoint from its stored dict, checking every field.

        Raises `CheckpointVersionError` for a newer schema and `CheckpointCorruptError`
        (naming `run_id` when known) for anything malformed.
        """
        if not isinstance(data, dict):
            raise CheckpointCorruptError(f"expected an object, got {type(data).__name__}", run_id=run_id)
        run_id = data.get("run_id") if isinstance(data.get("run_id"), str) else run_id
        version = data.get("version")
        if type(version) is int and version > CHECKPOINT_VERSION:
            raise CheckpointVersionError(version, CHECKPOINT_VERSION)
        try:
            return cls._checked(data)
        except (TypeError, ValueError, KeyError) as exc:
            raise CheckpointCorruptError(str(exc), run_id=run_id) from None

    @classmethod
    def _checked(cls, data: dict[str, Any]) -> AgentCheckpoint:
        if data.get("version") != CHECKPOINT_VERSION or type(data.get("version")) is not int:
            raise ValueError(f"unknown schema version {data.get('version')!r}")
        for name, kind in (("run_id", str), ("step_id", str), ("status", str), ("messages", list)):
            if not isinstance(data.get(name), kind):
                raise ValueError(f"field {name!r} must be a {kind.__name__}")
        step_index, created_at = data.get("step_index"), data.get("created_at")
        if type(step_index) is not int or step_index < 0:
            raise ValueError("field 'step_index' must be a non-negative int")
        if type(created_at) is not int:
            raise ValueError("field 'created_at' must be an int (epoch ms)")
        if data["status"] not in RUN_STATUSES:
            raise ValueError(f"unknown status {data['status']!r}")
        if data["step_id"] != f"{data['run_id']}#{step_index}":
            raise ValueError("step_id does not match run_id and step_index")
        for message in data["messages"]:
            if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
                raise ValueError("every message must be an object with a known role")
            if not isinstance(message.get("content"), (str, list)):
                raise ValueError("message content must be a str or a list of parts")
        if not isinstance(data.get("usage"), dict):
            raise ValueError("field 'usage' must be an object")
        pending = data.get("pending_approvals")
        if pending is not None and not isinstance(pending, list):
            raise ValueError("field 'pending_approvals' must be a list")
        path = data.get("agent_path")
        if path is not None and not (isinstance(path, list) and all(isinstance(p, str) for p in path)):
            raise ValueError("field 'agent_path' must be a list of str")
        trace_context = data.get("trace_context")
        if trace_context is not None and not (
            isinstance(trace_context, dict) and all(isinstance(v, str) for v in trace_context.values())
        ):
            raise ValueError("field 'trace_context' must be an object of str values")
        return cls(
            run_id=data["run_id"],
            step_index=step_index,
            status=data["status"],
            messages=data["messages"],
            usage=Usage.from_dict(data["usage"]),
            created_at=created_at,
            pending_approvals=(
                tuple(ToolApprovalRequest.from_dict(r) for r in pending) if pending is not None else None
            ),
            agent_path=tuple(path) if path is not None else None,
            version=CHECKPOINT_VERSION,
            step_id=data["step_id"],
            trace_context=trace_context,
        )


def serialize_checkpoint(checkpoint: AgentCheckpoint) -> str:
    """The checkpoint as codec text (compact JSON; bytes-safe and lossless)."""
    return kernels.encode(checkpoint.to_dict())


def deserialize_checkpoint(text: str, *, run_id: str | None = None) -> AgentCheckpoint:
    """Rebuild a checkpoint from `serialize_checkpoint` output.

    Raises `CheckpointCorruptError` for text that is not a valid checkpoint (truncated,
    garbage, wrong types) and `CheckpointVersionError` for a newer schema.
    """
    try:
        data = kernels.decode(text)
    except CodecError as exc:
        raise CheckpointCorruptError(str(exc), run_id=run_id) from None
    return AgentCheckpoint.from_dict(data, run_id=run_id)
