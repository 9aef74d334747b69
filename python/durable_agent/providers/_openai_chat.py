"""`OpenAIChatModel`: the Chat Completions API, streamed — and every OpenAI-compatible server.

vLLM, Ollama, LM Studio, llama.cpp's server, OpenRouter, Groq, Together, a LiteLLM proxy:
point `base_url` at their ``/v1``. Azure OpenAI: `OpenAIChatModel.azure(...)` (its URL
shape, ``api-version`` and ``api-key`` header).

Requests are ``POST {base_url}/chat/completions`` with ``stream: true`` and
``stream_options.include_usage`` (usage arrives in a last chunk with no choices). Tool calls
stream as fragments keyed by ``index`` (the id and name in the first, the JSON arguments
spread over the rest); they are emitted whole when the stream ends. The stream ends with
``data: [DONE]``. A body that ends without it was cut (a retryable ``stream_cut``) unless it
already carried the finish reason and, when usage was asked for, the usage chunk: a stream
that stops between the two would otherwise count as a success that cost nothing.
A refusal (``delta.refusal``) becomes a ``refusal`` event and the finish reason ``refusal``
(OpenAI itself says ``stop``; the raw reason is kept as ``raw_finish_reason``), and goes
back as the assistant message's ``refusal``. Reasoning text that some compatible servers stream (``reasoning_content``, ``reasoning``)
becomes a ``reasoning`` event; Chat Completions takes no reasoning back, so it is not sent.
Chat tool messages cannot carry images: a tool result's attachments follow the tool
messages as one user message.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from typing import Any, Unpack

from .._checkpoint import Usage
from .._errors import ConfigurationError, ModelCallError
from .._messages import ContentPart, Message, content_parts
from .._models import FinishEvent, ModelEvent, ModelFinishReason, ModelRequest, response_metadata
from ._base import HttpModel, HttpOptions, data_url, output_text, parse_arguments, schema_name
from ._errors import classify, error_body, parse_duration_ms, transport_error
from ._sse import SSEEvent

OPENAI_BASE_URL = "https://api.openai.com/v1"

FINISH_REASONS: Mapping[str, ModelFinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "content_filter": "content-filter",
}

# OpenAI's error codes and types (and those compatible servers copy) → durable-agent's kinds.
ERROR_KINDS: Mapping[str, str] = {
    "context_length_exceeded": "context_length",
    "string_above_max_length": "bad_request",
    "rate_limit_exceeded": "rate_limited",
    "insufficient_quota": "quota_exceeded",
    "invalid_api_key": "auth",
    "authentication_error": "auth",
    "permission_error": "permission",
    "model_not_found": "not_found",
    "invalid_request_error": "bad_request",
    "server_error": "server_error",
    "engine_overloaded": "overloaded",
}

RATE_LIMIT_RESETS = {
    "x-ratelimit-reset-requests": parse_duration_ms,
    "x-ratelimit-reset-tokens": parse_duration_ms,
}


def classify_openai(provider: str, status: int | None, headers: Mapping[str, str], error: Any) -> ModelCallError:
    """An OpenAI-style error object (or HTTP error body) as a `ModelCallError`."""
    if isinstance(error, bytes):
        error_type, code, message = error_body(error)
    else:
        error = error if isinstance(error, dict) else {"message": str(error)}
        raw_code = error.get("code")
        error_type = error.get("type") if isinstance(error.get("type"), str) else None
        code = str(raw_code) if isinstance(raw_code, str | int) and not isinstance(raw_code, bool) else None
        message = str(error.get("message") or json.dumps(error))
    return classify(provider=provider, status=status, headers=headers, error_type=error_type, error_code=code,
                    message=message, kinds=ERROR_KINDS, request_id_header="x-request-id",
                    reset_headers=RATE_LIMIT_RESETS)


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """durable-agent messages → Chat Completions messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if isinstance(message["content"], str):
            out.append({"role": role, "content": message["content"]})
        elif role == "tool":
            out.extend(_tool_messages(message))
        elif role == "assistant":
            out.append(_assistant_message(message))
        else:
            out.append({"role": role, "content": _user_content(content_parts(message))})
    return out


def _user_content(parts: list[ContentPart]) -> str | list[dict[str, Any]]:
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts if p["type"] == "text")
    content: list[dict[str, Any]] = []
    for part in parts:
        if part["type"] == "text":
            content.append({"type": "text", "text": part["text"]})
        elif part["type"] == "image":
            content.append({"type": "image_url", "image_url": {"url": data_url(part)}})
        elif part["type"] == "file":
            content.append({"type": "file", "file": {"filename": part.get("filename", "file"),
                                                     "file_data": data_url(part)}})
    return content


def _assistant_message(message: Message) -> dict[str, Any]:
    parts = content_parts(message)
    text = "".join(p["text"] for p in parts if p["type"] == "text")
    entry: dict[str, Any] = {"role": "assistant", "content": text or None}
    if refusal := "".join(p["text"] for p in parts if p["type"] == "refusal"):
        entry["refusal"] = refusal
    calls = [
        {"id": p["tool_call_id"], "type": "function",
         "function": {"name": p["tool_name"], "arguments": json.dumps(p["input"], ensure_ascii=False)}}
        for p in parts if p["type"] == "tool-call"
    ]
    if calls:
        entry["tool_calls"] = calls
    elif entry["content"] is None:
        entry["content"] = ""
    return entry


def _tool_messages(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    attached: list[ContentPart] = []
    for part in content_parts(message):
        if part["type"] == "tool-result":
            out.append({"role": "tool", "tool_call_id": part["tool_call_id"], "content": output_text(part["output"])})
            if part.get("attachments"):
                attached.append({"type": "text", "text": f"Attachments of tool call {part['tool_call_id']}:"})
                attached.extend(part.get("attachments", ()))
    if attached:
        out.append({"role": "user", "content": _user_content(attached)})
    return out


def tool_choice(choice: str) -> Any:
    return choice if choice in ("auto", "none", "required") else {"type": "function", "function": {"name": choice}}


def chat_usage(data: Mapping[str, Any]) -> Usage:
    prompt, completion = int(data.get("prompt_tokens") or 0), int(data.get("completion_tokens") or 0)
    prompt_details = data.get("prompt_tokens_details") or {}
    completion_details = data.get("completion_tokens_details") or {}
    return Usage(prompt, completion, int(data.get("total_tokens") or prompt + completion),
                 reasoning_tokens=int(completion_details.get("reasoning_tokens") or 0),
                 cache_read_tokens=int(prompt_details.get("cached_tokens") or 0))


class OpenAIChatModel(HttpModel):
    """A `LanguageModel` over Chat Completions (streamed). See the module docstring.

    `api_key` defaults to ``OPENAI_API_KEY`` and `base_url` to ``OPENAI_BASE_URL`` (else
    OpenAI's), both read when the model is built. Without a key no ``Authorization`` header
    is sent (local servers need none); OpenAI's own endpoint refuses to be built without one.
    `settings.max_tokens` is sent as ``max_completion_tokens`` to OpenAI and as ``max_tokens``
    elsewhere (what compatible servers read), unless `max_tokens_field` says otherwise.
    """

    default_base_url = OPENAI_BASE_URL
    base_url_env = "OPENAI_BASE_URL"
    api_key_env = "OPENAI_API_KEY"
    provider = "openai-chat"
    provider_name = "openai"

    def __init__(
        self,
        model: str,
        *,
        include_usage: bool = True,
        max_tokens_field: str | None = None,
        query: Mapping[str, str] | None = None,
        api_key_header: str = "authorization",
        **options: Unpack[HttpOptions],
    ) -> None:
        super().__init__(model, **options)
        self.include_usage = include_usage
        self.max_tokens_field = max_tokens_field or (
            "max_completion_tokens" if self.base_url == OPENAI_BASE_URL else "max_tokens")
        self.query = dict(query or {})
        self.api_key_header = api_key_header.lower()

    @classmethod
    def azure(
        cls,
        deployment: str,
        *,
        endpoint: str | None = None,
        api_version: str = "2024-10-21",
        api_key: str | None = None,
        **options: Any,
    ) -> OpenAIChatModel:
        """Azure OpenAI: ``{endpoint}/openai/deployments/{deployment}/chat/completions?api-version=...``
        with an ``api-key`` header. `endpoint` and `api_key` default to ``AZURE_OPENAI_ENDPOINT`` and
        ``AZURE_OPENAI_API_KEY``. Without a key it refuses to be built, unless `headers` carry an
        ``Authorization`` (a Microsoft Entra ID bearer token)."""
        endpoint = endpoint or os.environ.get("AZURE_OPENAI_ENDPOINT")
        if not endpoint:
            raise ConfigurationError("OpenAIChatModel.azure needs endpoint= or AZURE_OPENAI_ENDPOINT")
        key = api_key if api_key is not None else os.environ.get("AZURE_OPENAI_API_KEY", "")
        if not key and not any(name.lower() == "authorization" for name in options.get("headers") or {}):
            raise ConfigurationError("OpenAIChatModel.azure needs an API key: pass api_key= or set "
                                     "AZURE_OPENAI_API_KEY (or an Entra ID token as headers={'Authorization': ...})")
        return cls(deployment, base_url=f"{endpoint.rstrip('/')}/openai/deployments/{deployment}", api_key=key,
                   query={"api-version": api_version}, api_key_header="api-key",
                   max_tokens_field=options.pop("max_tokens_field", "max_completion_tokens"), **options)

    def url(self) -> str:
        query = urllib.parse.urlencode(self.query)
        return f"{self.base_url}/chat/completions" + (f"?{query}" if query else "")

    def request_headers(self) -> dict[str, str]:
        if not self.api_key:
            return {}
        if self.api_key_header == "authorization":
            return {"authorization": f"Bearer {self.api_key}"}
        return {self.api_key_header: self.api_key}

    def body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": chat_messages(request.messages), "stream": True}
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        if request.tools:
            body["tools"] = [
                {"type": "function",
                 "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)}}
                for t in request.tools
            ]
        s = self.settings_for(request)
        if s.tool_choice is not None and request.tools:
            body["tool_choice"] = tool_choice(s.tool_choice)
        if s.parallel_tool_calls is not None and request.tools:
            body["parallel_tool_calls"] = s.parallel_tool_calls
        if s.max_tokens is not None:
            body[self.max_tokens_field] = s.max_tokens
        for name in ("temperature", "seed", "top_p"):
            if (value := getattr(s, name)) is not None:
                body[name] = value
        if request.output_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": schema_name(request.output_name), "schema": dict(request.output_schema)}}
        return body

    def classify_http(self, status: int, headers: Mapping[str, str], body: bytes) -> ModelCallError:
        return classify_openai(self.provider, status, headers, body)

    async def parse(self, events: AsyncIterator[SSEEvent]) -> AsyncIterator[ModelEvent]:
        calls: dict[int, list[str]] = {}  # index → [id, name, arguments]
        reasoning: list[str] = []
        refusal: list[str] = []
        usage: Usage | None = None
        finish: str | None = None
        response: Mapping[str, Any] = {}  # a chunk naming the completion's id and model
        done = False
        async for event in events:
            if event.data == "[DONE]":
                done = True
                break
            try:
                chunk = json.loads(event.data)
            except ValueError as exc:
                raise transport_error(self.provider, "malformed_chunk", f"not JSON: {event.data[:200]!r}") from exc
            if not isinstance(chunk, dict):
                raise transport_error(self.provider, "malformed_chunk", f"not an object: {event.data[:200]!r}")
            if "error" in chunk:
                raise classify_openai(self.provider, None, {}, chunk["error"])
            response = chunk if chunk.get("id") else response
            if chunk.get("usage"):
                usage = chat_usage(chunk["usage"])
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if text := delta.get("content"):
                    yield {"type": "text-delta", "text": text}
                if declined := delta.get("refusal"):
                    refusal.append(declined)
                if thought := delta.get("reasoning_content") or delta.get("reasoning"):
                    reasoning.append(thought)
                for fragment in delta.get("tool_calls") or ():
                    slot = calls.setdefault(int(fragment.get("index", len(calls))), ["", "", ""])
                    function = fragment.get("function") or {}
                    slot[0] = fragment.get("id") or slot[0]
                    slot[1] += function.get("name") or ""
                    slot[2] += function.get("arguments") or ""
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        if not done and (finish is None or (self.include_usage and usage is None)):
            raise transport_error(self.provider, "stream_cut", "the stream ended before [DONE]"
                                  + (" (after the finish reason, before the usage chunk)" if finish else ""))
        if reasoning:
            yield {"type": "reasoning", "text": "".join(reasoning), "provider": self.provider, "metadata": {}}
        if refusal:
            yield {"type": "refusal", "text": "".join(refusal)}
        for index in sorted(calls):
            call_id, name, arguments = calls[index]
            yield {"type": "tool-call", "tool_call_id": call_id or f"call_{index}", "tool_name": name,
                   "input": parse_arguments(arguments)}
        reason: ModelFinishReason = (
            "tool-calls" if calls else "refusal" if refusal else FINISH_REASONS.get(finish or "stop", "stop"))
        ending: FinishEvent = {"type": "finish", "finish_reason": reason, "usage": usage or Usage()}
        if finish:
            ending["raw_finish_reason"] = finish
        yield response_metadata(response)
        yield ending
