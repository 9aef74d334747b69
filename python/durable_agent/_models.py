"""The language-model seam: a small `LanguageModel` Protocol, and the deterministic `ScriptedModel`.

A model streams events for one request. The loop consumes them (the buffered face simply
consumes the stream), so a provider adapter implements one method.

Events are plain dicts:

* ``{"type": "text-delta", "text": str}``
* ``{"type": "tool-call", "tool_call_id": str, "tool_name": str, "input": Any}``
* ``{"type": "refusal", "text": str}`` (optional) — the model declined to answer (OpenAI's
  ``refusal``); the loop keeps it in the assistant message as a ``refusal`` part, and the
  step's finish reason is then ``refusal``.
* ``{"type": "finish", "finish_reason": "stop" | "tool-calls" | "length" | "refusal" |
  "content-filter", "usage": Usage, "raw_finish_reason": str}`` — `raw_finish_reason` (optional)
  is the provider's own word for why it stopped (``end_turn``, ``content_filter``,
  ``pause_turn``, ...), for what the mapped reason does not tell apart.
* ``{"type": "reasoning", "text": str, "provider": str, "metadata": dict}`` (optional) — a finished
  reasoning block of a real provider. The loop keeps it in the assistant message as a
  ``reasoning`` part, and the provider's adapter sends `metadata` back unchanged on the next
  call (a signature, an encrypted reasoning item). Models that do not reason never send it.
* ``{"type": "response-metadata", "id": str, "model": str}`` (optional, either key may be
  missing) — what the provider named the response and the model that answered; tracing puts
  them on the model call's span (``gen_ai.response.id`` / ``gen_ai.response.model``).

A model may also have a ``telemetry_attributes()`` method returning its requests' attributes in
the OpenTelemetry GenAI conventions (``gen_ai.provider.name``, ``gen_ai.request.model``,
``server.address``, ``gen_ai.request.temperature``...): the provider adapters do. Tracing calls
it at each model call; without it a model is ``gen_ai.provider.name = "_OTHER"`` and its
`model_id` is the requested model.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, Protocol, Required, TypedDict, runtime_checkable

from ._checkpoint import Usage
from ._errors import ConfigurationError
from ._messages import Message, content_parts
from ._util import maybe_await

ModelFinishReason = Literal["stop", "tool-calls", "length", "refusal", "content-filter"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model is told about a tool: its name, description and JSON-Schema parameters."""

    name: str
    description: str
    parameters: Mapping[str, Any]


ToolChoice = Literal["auto", "none", "required"] | str


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """Per-call sampling settings; None leaves the provider's default.

    `tool_choice` is ``"auto"``, ``"none"``, ``"required"`` or a tool's name (that tool must be
    called). A provider adapter takes them when it is built (`settings=`, or a copy with
    `model.with_settings(...)`), and per call (`generate_text(model_settings=...)`,
    `Agent.run(..., model_settings=...)`), whose set fields win over the adapter's.
    """

    temperature: float | None = None
    max_tokens: int | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    seed: int | None = None
    top_p: float | None = None


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model call: the history so far, the tools the model may call, and the call's own settings."""

    messages: Sequence[Message]
    tools: tuple[ToolSpec, ...] = ()
    output_schema: Mapping[str, Any] | None = None  # the JSON Schema the final answer must match (`output=`)
    output_name: str = "output"
    settings: ModelSettings | None = None  # `model_settings=` of the call; ScriptedModel ignores them


class TextDeltaEvent(TypedDict):
    type: Literal["text-delta"]
    text: str


class ToolCallEvent(TypedDict):
    type: Literal["tool-call"]
    tool_call_id: str
    tool_name: str
    input: Any


class FinishEvent(TypedDict):
    type: Literal["finish"]
    finish_reason: ModelFinishReason
    usage: Usage
    raw_finish_reason: NotRequired[str]


class ReasoningEvent(TypedDict):
    type: Literal["reasoning"]
    text: str
    provider: str
    metadata: dict[str, Any]


class ResponseMetadataEvent(TypedDict, total=False):
    type: Required[Literal["response-metadata"]]
    id: str
    model: str


class RefusalEvent(TypedDict):
    type: Literal["refusal"]
    text: str


ModelEvent = TextDeltaEvent | ToolCallEvent | FinishEvent | ReasoningEvent | RefusalEvent | ResponseMetadataEvent


def response_metadata(response: Mapping[str, Any]) -> ResponseMetadataEvent:
    """The ``response-metadata`` event of a provider's response object: its ``id`` and ``model``, when named."""
    event: ResponseMetadataEvent = {"type": "response-metadata"}
    if isinstance(response.get("id"), str):
        event["id"] = response["id"]
    if isinstance(response.get("model"), str):
        event["model"] = response["model"]
    return event


@runtime_checkable
class LanguageModel(Protocol):
    """A model: `stream(request)` yields text deltas and tool calls, then one finish event."""

    model_id: str

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]: ...


@dataclass(frozen=True, slots=True)
class ScriptedToolCall:
    """A tool call in a scripted response. Without an id, the model derives a stable one."""

    tool_name: str
    input: Any = field(default_factory=dict)
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class ScriptedResponse:
    """One scripted model turn: text (streamed in word-sized deltas) and/or tool calls."""

    text: str = ""
    tool_calls: Sequence[ScriptedToolCall] = ()
    usage: Usage | None = None
    finish_reason: ModelFinishReason | None = None


ScriptEntry = ScriptedResponse | str
ScriptFunction = Callable[[ModelRequest], ScriptEntry | Awaitable[ScriptEntry]]

_WORDS = re.compile(r"\S+\s*|\s+")


def call(tool_name: str, input: Any = None, tool_call_id: str | None = None) -> ScriptedToolCall:
    """Shorthand for a `ScriptedToolCall`."""
    return ScriptedToolCall(tool_name, {} if input is None else input, tool_call_id)


def reply(text: str = "", *tool_calls: ScriptedToolCall, usage: Usage | None = None) -> ScriptedResponse:
    """Shorthand for a `ScriptedResponse`."""
    return ScriptedResponse(text=text, tool_calls=tool_calls, usage=usage)


def _history_chars(messages: Sequence[Message]) -> int:
    total = 0
    for message in messages:
        for part in content_parts(message):
            total += len(str(part.get("text", part.get("output", part.get("input", "")))))
    return total


class ScriptedModel:
    """A deterministic model for tests and demos.

    Given a list, it answers the n-th assistant turn of a conversation with the n-th entry,
    where n counts the assistant messages already in the request. Because the choice depends
    only on the history, a run resumed in another process gets the same answers. Given a
    function, it calls it with each request. Usage is derived from the sizes of the history
    and of the answer (about four characters a token) unless the response sets it.
    """

    def __init__(
        self,
        script: Sequence[ScriptEntry] | ScriptFunction,
        *,
        model_id: str = "scripted",
        delay: float = 0.0,
    ) -> None:
        if not callable(script) and not isinstance(script, Sequence):
            raise ConfigurationError("ScriptedModel takes a list of responses or a function of the request")
        self.model_id = model_id
        self.delay = delay
        self._script = script
        self.requests: list[ModelRequest] = []

    async def _respond(self, request: ModelRequest) -> tuple[int, ScriptedResponse]:
        turn = sum(1 for m in request.messages if m["role"] == "assistant")
        if callable(self._script):
            entry = await maybe_await(self._script(request))
        else:
            if turn >= len(self._script):
                raise ConfigurationError(
                    f"ScriptedModel {self.model_id!r} has {len(self._script)} responses; turn {turn} asked for more"
                )
            entry = self._script[turn]
        return turn, ScriptedResponse(text=entry) if isinstance(entry, str) else entry

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.requests.append(request)
        turn, response = await self._respond(request)
        for delta in _WORDS.findall(response.text):
            if self.delay:
                await asyncio.sleep(self.delay)
            yield {"type": "text-delta", "text": delta}
        for j, scripted in enumerate(response.tool_calls):
            if self.delay:
                await asyncio.sleep(self.delay)
            yield {
                "type": "tool-call",
                "tool_call_id": scripted.tool_call_id or f"call_{turn}_{j}",
                "tool_name": scripted.tool_name,
                "input": scripted.input,
            }
        usage = response.usage
        if usage is None:
            prompt = max(1, _history_chars(request.messages) // 4)
            completion = len(response.text) // 4 + 8 * len(response.tool_calls) + 1
            usage = Usage(prompt, completion, prompt + completion)
        reason: ModelFinishReason = response.finish_reason or ("tool-calls" if response.tool_calls else "stop")
        yield {"type": "finish", "finish_reason": reason, "usage": usage}
