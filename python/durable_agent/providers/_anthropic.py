"""`AnthropicModel`: Anthropic's Messages API, streamed.

Requests are ``POST {base_url}/v1/messages`` with ``stream: true``, ``x-api-key`` and
``anthropic-version``. The stream is named events: ``message_start`` (input usage, cache
reads and writes), then per content block ``content_block_start`` / ``content_block_delta``
(``text_delta``, ``input_json_delta`` fragments of a tool's input, ``thinking_delta``,
``signature_delta``) / ``content_block_stop``, then ``message_delta`` (``stop_reason``,
output usage) and ``message_stop``; ``ping`` may come anywhere, and ``error`` ends a stream
that failed after it started (an ``overloaded_error`` is the usual one).

Thinking blocks come back as ``reasoning`` events whose metadata holds the signature (or,
for a redacted block, its data); this adapter sends them back verbatim, first in the
assistant turn, as the API requires for tool use with thinking. System messages become the
``system`` field; tool results become ``tool_result`` blocks in a user turn (images and
PDFs attached to them ride inside); consecutive turns of one role are merged. A ``refusal``
stop reason is the finish reason ``refusal`` (what the model said streams as text); every
stop reason is kept as ``raw_finish_reason`` (``pause_turn`` maps to ``stop``).

Prompt caching: `cache_breakpoints` puts a ``cache_control`` breakpoint on the last tool
definition (``tools``), on the system prompt (``system``) and on the last block of the
conversation (``messages``: each call caches the whole prefix, and the next call reads it
back); `cache_ttl` ``"1h"`` asks for the longer-lived cache. Reads and writes show in the
usage as ``cache_read_tokens`` and ``cache_write_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal, Unpack

from .._checkpoint import Usage
from .._errors import ConfigurationError, ModelCallError
from .._messages import ContentPart, FilePart, ImagePart, content_parts
from .._models import ModelEvent, ModelFinishReason, ModelRequest, response_metadata
from ._base import HttpModel, HttpOptions, b64, output_text, parse_arguments
from ._errors import classify, error_body, transport_error
from ._sse import SSEEvent

ANTHROPIC_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
CACHE_BREAKPOINTS = ("tools", "system", "messages")
CACHE_TTLS = ("5m", "1h")

STOP_REASONS: Mapping[str, ModelFinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "pause_turn": "stop",  # a server tool's long turn paused; raw_finish_reason tells it apart
    "refusal": "refusal",
}

ERROR_KINDS: Mapping[str, str] = {
    "invalid_request_error": "bad_request",
    "authentication_error": "auth",
    "permission_error": "permission",
    "not_found_error": "not_found",
    "request_too_large": "request_too_large",
    "rate_limit_error": "rate_limited",
    "api_error": "server_error",
    "overloaded_error": "overloaded",
    "timeout_error": "timeout",
}


def _reset_ms(value: str) -> int | None:
    """An ``anthropic-ratelimit-*-reset`` RFC 3339 time as ms from now."""
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0, int((when.timestamp() - datetime.now(when.tzinfo).timestamp()) * 1000))


RATE_LIMIT_RESETS = {
    "anthropic-ratelimit-requests-reset": _reset_ms,
    "anthropic-ratelimit-tokens-reset": _reset_ms,
    "anthropic-ratelimit-input-tokens-reset": _reset_ms,
    "anthropic-ratelimit-output-tokens-reset": _reset_ms,
}


def classify_anthropic(status: int | None, headers: Mapping[str, str], error_type: str | None,
                       message: str) -> ModelCallError:
    return classify(provider="anthropic", status=status, headers=headers, error_type=error_type, error_code=None,
                    message=message, kinds=ERROR_KINDS, request_id_header="request-id",
                    reset_headers=RATE_LIMIT_RESETS)


def _media(part: ImagePart | FilePart) -> dict[str, Any]:
    media = part.get("media_type") or "application/octet-stream"
    kind = "image" if part["type"] == "image" else "document"
    return {"type": kind, "source": {"type": "base64", "media_type": media, "data": b64(part["data"])}}


def _blocks(parts: list[ContentPart]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in parts:
        if part["type"] == "text" or part["type"] == "refusal":  # another provider's refusal: as text
            if part["text"]:
                blocks.append({"type": "text", "text": part["text"]})
        elif part["type"] == "image" or part["type"] == "file":
            blocks.append(_media(part))
        elif part["type"] == "reasoning":
            if part["provider"] != "anthropic":
                continue
            meta = part["metadata"]
            if "redacted_data" in meta:
                blocks.append({"type": "redacted_thinking", "data": meta["redacted_data"]})
            else:
                blocks.append({"type": "thinking", "thinking": part["text"], "signature": meta.get("signature", "")})
        elif part["type"] == "tool-call":
            blocks.append({"type": "tool_use", "id": part["tool_call_id"], "name": part["tool_name"],
                           "input": part["input"] if isinstance(part["input"], dict) else {}})
        elif part["type"] == "tool-result":
            attachments = part.get("attachments") or []
            content: Any = output_text(part["output"])
            if attachments:
                content = [{"type": "text", "text": content}, *(_media(a) for a in attachments)]
            blocks.append({"type": "tool_result", "tool_use_id": part["tool_call_id"], "content": content,
                           "is_error": bool(part["is_error"])})
    return blocks


def anthropic_messages(messages: Any) -> tuple[str, list[dict[str, Any]]]:
    """(system, messages) of the Messages API from durable-agent messages (see the module docstring)."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for message in messages:
        parts = content_parts(message)
        if message["role"] == "system":
            system.append("".join(p["text"] for p in parts if p["type"] == "text"))
            continue
        role = "assistant" if message["role"] == "assistant" else "user"
        blocks = _blocks(parts)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return "\n\n".join(system), out


class AnthropicModel(HttpModel):
    """A `LanguageModel` over Anthropic's Messages API (streamed). See the module docstring.

    `api_key` defaults to ``ANTHROPIC_API_KEY`` (read when the model is built), `base_url` to
    ``ANTHROPIC_BASE_URL`` else Anthropic's. The API requires `max_tokens`:
    `settings.max_tokens`, else `DEFAULT_MAX_TOKENS`. `thinking` is sent as the request's
    ``thinking`` (``{"type": "adaptive"}``, or ``{"type": "enabled", "budget_tokens": 2048}``).
    `cache_breakpoints` (any of ``"tools"``, ``"system"``, ``"messages"``) and `cache_ttl`
    (``"5m"``, ``"1h"``) control prompt caching (see the module docstring).
    """

    default_base_url = ANTHROPIC_BASE_URL
    base_url_env = "ANTHROPIC_BASE_URL"
    api_key_env = "ANTHROPIC_API_KEY"
    provider = "anthropic"
    provider_name = "anthropic"
    request_id_header = "request-id"

    def __init__(
        self,
        model: str,
        *,
        thinking: Mapping[str, Any] | None = None,
        anthropic_version: str = ANTHROPIC_VERSION,
        cache_breakpoints: Iterable[Literal["tools", "system", "messages"]] = (),
        cache_ttl: Literal["5m", "1h"] | None = None,
        **options: Unpack[HttpOptions],
    ) -> None:
        super().__init__(model, **options)
        self.thinking = dict(thinking) if thinking is not None else None
        self.anthropic_version = anthropic_version
        self.cache_breakpoints = frozenset(cache_breakpoints)
        if not self.cache_breakpoints <= set(CACHE_BREAKPOINTS):
            raise ConfigurationError(f"cache_breakpoints takes {', '.join(CACHE_BREAKPOINTS)}; "
                                     f"got {sorted(self.cache_breakpoints)}")
        if cache_ttl is not None and cache_ttl not in CACHE_TTLS:
            raise ConfigurationError(f"cache_ttl is '5m' or '1h', got {cache_ttl!r}")
        self.cache_control: dict[str, str] = {"type": "ephemeral", **({"ttl": cache_ttl} if cache_ttl else {})}

    def url(self) -> str:
        return f"{self.base_url}/v1/messages"

    def request_headers(self) -> dict[str, str]:
        headers = {"anthropic-version": self.anthropic_version}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        return headers

    def body(self, request: ModelRequest) -> dict[str, Any]:
        system, messages = anthropic_messages(request.messages)
        s = self.settings_for(request)
        body: dict[str, Any] = {"model": self.model, "max_tokens": s.max_tokens or DEFAULT_MAX_TOKENS,
                                "messages": messages, "stream": True}
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [{"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
                             for t in request.tools]
            choice: dict[str, Any] | None = None
            if s.tool_choice is not None:
                choice = {"auto": {"type": "auto"}, "none": {"type": "none"}, "required": {"type": "any"}}.get(
                    s.tool_choice, {"type": "tool", "name": s.tool_choice})
            if s.parallel_tool_calls is False:
                choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
            if choice is not None:
                body["tool_choice"] = choice
        self._mark_cache_breakpoints(body)
        if self.thinking is not None:
            body["thinking"] = self.thinking
        if s.temperature is not None:
            body["temperature"] = s.temperature
        if s.top_p is not None:
            body["top_p"] = s.top_p
        return body

    def _mark_cache_breakpoints(self, body: dict[str, Any]) -> None:
        """Put `cache_control` where `cache_breakpoints` asks (see the module docstring)."""
        marks = self.cache_breakpoints
        if "tools" in marks and body.get("tools"):
            body["tools"][-1]["cache_control"] = self.cache_control
        if "system" in marks and body.get("system"):
            body["system"] = [{"type": "text", "text": body["system"], "cache_control": self.cache_control}]
        if "messages" in marks:
            blocks = [b for m in body["messages"] for b in m["content"]
                      if b["type"] not in ("thinking", "redacted_thinking")]  # these cannot carry one
            if blocks:
                blocks[-1]["cache_control"] = self.cache_control

    def classify_http(self, status: int, headers: Mapping[str, str], body: bytes) -> ModelCallError:
        error_type, _, message = error_body(body)
        return classify_anthropic(status, headers, error_type, message)

    async def parse(self, events: AsyncIterator[SSEEvent]) -> AsyncIterator[ModelEvent]:
        blocks: dict[int, dict[str, Any]] = {}
        usage: dict[str, int] = {}
        stop_reason = "end_turn"
        tool_calls: list[ModelEvent] = []
        response: Mapping[str, Any] = {}  # the message, as message_start names it
        finished = False
        async for event in events:
            try:
                data = json.loads(event.data)
            except ValueError as exc:
                raise transport_error(self.provider, "malformed_chunk", f"not JSON: {event.data[:200]!r}") from exc
            kind = data.get("type") if isinstance(data, dict) else None
            if kind == "content_block_delta":
                delta = data["delta"]
                block = blocks[data["index"]]
                dtype = delta.get("type")
                if dtype == "text_delta":
                    yield {"type": "text-delta", "text": delta["text"]}
                elif dtype == "input_json_delta":
                    block["json"] += delta.get("partial_json", "")
                elif dtype == "thinking_delta":
                    block["thinking"] += delta.get("thinking", "")
                elif dtype == "signature_delta":
                    block["signature"] += delta.get("signature", "")
            elif kind == "content_block_start":
                block = dict(data["content_block"])
                if block.get("type") == "tool_use":
                    block["json"] = ""
                blocks[data["index"]] = block
            elif kind == "content_block_stop":
                block = blocks[data["index"]]
                if block.get("type") == "tool_use":
                    raw = block["json"]
                    tool_calls.append({"type": "tool-call", "tool_call_id": block["id"], "tool_name": block["name"],
                                       "input": parse_arguments(raw) if raw else block.get("input") or {}})
                elif block.get("type") == "thinking":
                    yield {"type": "reasoning", "text": block.get("thinking", ""), "provider": self.provider,
                           "metadata": {"signature": block.get("signature", "")}}
                elif block.get("type") == "redacted_thinking":
                    yield {"type": "reasoning", "text": "", "provider": self.provider,
                           "metadata": {"redacted_data": block.get("data", "")}}
            elif kind == "message_start":
                usage.update(data["message"].get("usage") or {})
                response = data["message"]
            elif kind == "message_delta":
                usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
                stop_reason = (data.get("delta") or {}).get("stop_reason") or stop_reason
            elif kind == "message_stop":
                finished = True
                break
            elif kind == "error":
                error = data.get("error") or {}
                raise classify_anthropic(None, {}, error.get("type"), str(error.get("message") or error))
            elif kind is None:
                raise transport_error(self.provider, "malformed_chunk", f"an event without a type: {event.data[:200]!r}")
        if not finished:
            raise transport_error(self.provider, "stream_cut", "the stream ended before message_stop")
        for call in tool_calls:
            yield call
        yield response_metadata(response)
        yield {"type": "finish", "usage": anthropic_usage(usage), "raw_finish_reason": stop_reason,
               "finish_reason": "tool-calls" if tool_calls else STOP_REASONS.get(stop_reason, "stop")}


def anthropic_usage(data: Mapping[str, Any]) -> Usage:
    """Anthropic's usage: `input_tokens` excludes cache reads and writes; ours counts the whole prompt."""
    read = int(data.get("cache_read_input_tokens") or 0)
    write = int(data.get("cache_creation_input_tokens") or 0)
    prompt = int(data.get("input_tokens") or 0) + read + write
    output = int(data.get("output_tokens") or 0)
    return Usage(prompt, output, prompt + output, cache_read_tokens=read, cache_write_tokens=write)
