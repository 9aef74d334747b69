"""`OpenAIResponsesModel`: OpenAI's Responses API, streamed.

Requests are ``POST {base_url}/responses`` with ``stream: true``. By default the call is
stateless (``store: false``) and asks for ``reasoning.encrypted_content``: each reasoning
item the model produces comes back as a ``reasoning`` event whose metadata is the whole item
(id, summary, encrypted content), and is sent back unchanged as an input item on later
calls, so a reasoning model keeps its chain of thought across tool calls without OpenAI
storing anything.

The stream is typed events: ``response.output_item.added`` / ``.done`` frame each output
item (a message, a function call, a reasoning item); ``response.output_text.delta`` carries
text; ``response.function_call_arguments.delta`` the arguments of a call (taken whole from
the item's ``.done``); ``response.completed`` (or ``response.incomplete``) ends it with the
usage (cached input and reasoning tokens in its details); ``response.failed`` and ``error``
report a failure inside the stream. A refusal (``response.refusal.delta``) becomes a ``refusal``
event and the finish reason ``refusal``; the raw finish reason is the response's status, or its
``incomplete_details.reason``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Unpack

from .._checkpoint import Usage
from .._errors import ModelCallError
from .._messages import ContentPart, content_parts
from .._models import ModelEvent, ModelFinishReason, ModelRequest, response_metadata
from ._base import HttpModel, HttpOptions, data_url, output_text, parse_arguments, schema_name
from ._errors import transport_error
from ._openai_chat import OPENAI_BASE_URL, classify_openai
from ._sse import SSEEvent

# ``response.incomplete``'s ``incomplete_details.reason`` → finish reason.
INCOMPLETE_REASONS: Mapping[str, ModelFinishReason] = {
    "max_output_tokens": "length",
    "content_filter": "content-filter",
}


def _input_content(parts: list[ContentPart]) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = []
    for part in parts:
        if part["type"] == "text":
            content.append({"type": "input_text", "text": part["text"]})
        elif part["type"] == "image":
            content.append({"type": "input_image", "image_url": data_url(part)})
        elif part["type"] == "file":
            content.append({"type": "input_file", "filename": part.get("filename", "file"), "file_data": data_url(part)})
    return content


def responses_input(messages: Any) -> list[dict[str, Any]]:
    """durable-agent messages → Responses input items (see the module docstring)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if isinstance(message["content"], str):
            items.append({"role": role, "content": message["content"]})
            continue
        parts = content_parts(message)
        if role == "assistant":
            for part in parts:
                if part["type"] == "reasoning" and part["provider"] == "openai-responses":
                    items.append(dict(part["metadata"]["item"]))
                elif part["type"] == "text" and part["text"]:
                    items.append({"role": "assistant", "content": part["text"]})
                elif part["type"] == "refusal":
                    items.append({"type": "message", "role": "assistant",
                                  "content": [{"type": "refusal", "refusal": part["text"]}]})
                elif part["type"] == "tool-call":
                    items.append({"type": "function_call", "call_id": part["tool_call_id"], "name": part["tool_name"],
                                  "arguments": json.dumps(part["input"], ensure_ascii=False)})
        elif role == "tool":
            for part in parts:
                if part["type"] == "tool-result":
                    output: Any = output_text(part["output"])
                    if part.get("attachments"):
                        output = [{"type": "input_text", "text": output},
                                  *_input_content(list(part.get("attachments", ())))]
                    items.append({"type": "function_call_output", "call_id": part["tool_call_id"], "output": output})
        else:
            items.append({"role": role, "content": _input_content(parts)})
    return items


def responses_usage(data: Mapping[str, Any]) -> Usage:
    prompt, output = int(data.get("input_tokens") or 0), int(data.get("output_tokens") or 0)
    return Usage(prompt, output, int(data.get("total_tokens") or prompt + output),
                 reasoning_tokens=int((data.get("output_tokens_details") or {}).get("reasoning_tokens") or 0),
                 cache_read_tokens=int((data.get("input_tokens_details") or {}).get("cached_tokens") or 0))


class OpenAIResponsesModel(HttpModel):
    """A `LanguageModel` over OpenAI's Responses API (streamed). See the module docstring.

    `api_key` defaults to ``OPENAI_API_KEY`` and `base_url` to ``OPENAI_BASE_URL`` (else
    OpenAI's), read when the model is built. `reasoning` is sent as the request's
    ``reasoning`` (``{"effort": "low", "summary": "auto"}``). `store=True` lets OpenAI keep the
    responses; the reasoning items are still carried in the history.
    """

    default_base_url = OPENAI_BASE_URL
    base_url_env = "OPENAI_BASE_URL"
    api_key_env = "OPENAI_API_KEY"
    provider = "openai-responses"
    provider_name = "openai"

    def __init__(
        self,
        model: str,
        *,
        reasoning: Mapping[str, Any] | None = None,
        store: bool = False,
        **options: Unpack[HttpOptions],
    ) -> None:
        super().__init__(model, **options)
        self.reasoning = dict(reasoning) if reasoning is not None else None
        self.store = store

    def url(self) -> str:
        return f"{self.base_url}/responses"

    def request_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "input": responses_input(request.messages), "stream": True,
                                "store": self.store, "include": ["reasoning.encrypted_content"]}
        s = self.settings_for(request)
        if request.tools:
            body["tools"] = [{"type": "function", "name": t.name, "description": t.description,
                              "parameters": dict(t.parameters), "strict": False} for t in request.tools]
            if s.tool_choice is not None:
                body["tool_choice"] = (s.tool_choice if s.tool_choice in ("auto", "none", "required")
                                       else {"type": "function", "name": s.tool_choice})
            if s.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = s.parallel_tool_calls
        if self.reasoning is not None:
            body["reasoning"] = self.reasoning
        if s.max_tokens is not None:
            body["max_output_tokens"] = s.max_tokens
        for name in ("temperature", "top_p"):
            if (value := getattr(s, name)) is not None:
                body[name] = value
        if request.output_schema is not None:
            body["text"] = {"format": {"type": "json_schema", "name": schema_name(request.output_name),
                                       "schema": dict(request.output_schema)}}
        return body

    def classify_http(self, status: int, headers: Mapping[str, str], body: bytes) -> ModelCallError:
        return classify_openai(self.provider, status, headers, body)

    async def parse(self, events: AsyncIterator[SSEEvent]) -> AsyncIterator[ModelEvent]:
        calls: list[ModelEvent] = []
        refusal: list[str] = []
        final: dict[str, Any] | None = None
        async for event in events:
            try:
                data = json.loads(event.data)
            except ValueError as exc:
                raise transport_error(self.provider, "malformed_chunk", f"not JSON: {event.data[:200]!r}") from exc
            kind = data.get("type") if isinstance(data, dict) else None
            if kind == "response.output_text.delta":
                yield {"type": "text-delta", "text": data["delta"]}
            elif kind == "response.refusal.delta":
                refusal.append(data["delta"])
            elif kind == "response.output_item.done":
                item = data["item"]
                if item.get("type") == "function_call":
                    calls.append({"type": "tool-call", "tool_call_id": item["call_id"], "tool_name": item["name"],
                                  "input": parse_arguments(item.get("arguments") or "")})
                elif item.get("type") == "reasoning":
                    summary = "\n\n".join(s.get("text", "") for s in item.get("summary") or ())
                    yield {"type": "reasoning", "text": summary, "provider": self.provider,
                           "metadata": {"item": {k: v for k, v in item.items() if k != "status"}}}
            elif kind in ("response.completed", "response.incomplete"):
                final = data["response"]
                break
            elif kind == "response.failed":
                error = (data.get("response") or {}).get("error") or {}
                raise classify_openai(self.provider, None, {}, error)
            elif kind == "error":
                raise classify_openai(self.provider, None, {}, data.get("error") or data)
            elif kind is None:
                raise transport_error(self.provider, "malformed_chunk", f"an event without a type: {event.data[:200]!r}")
        if final is None:
            raise transport_error(self.provider, "stream_cut", "the stream ended before response.completed")
        if refusal:
            yield {"type": "refusal", "text": "".join(refusal)}
        for call in calls:
            yield call
        reason: ModelFinishReason = "stop"
        raw = str(final.get("status") or "completed")
        if final.get("status") == "incomplete":
            raw = str((final.get("incomplete_details") or {}).get("reason") or raw)
            reason = INCOMPLETE_REASONS.get(raw, "stop")
        if calls:
            reason = "tool-calls"
        elif refusal:
            reason = "refusal"
        yield response_metadata(final)
        yield {"type": "finish", "finish_reason": reason, "usage": responses_usage(final.get("usage") or {}),
               "raw_finish_reason": raw}
