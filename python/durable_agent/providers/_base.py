"""What the three adapters share: per-call settings, the endpoint, and the one streamed call.

An adapter subclasses `HttpModel` and supplies four pure pieces: the URL, the headers, the
JSON body of a request, and a parser that turns the SSE events into model events. The HTTP
call itself (transport, timeouts, error classification of a non-2xx status) is here, once.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import json
import os
import re
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import fields, replace
from typing import Any, Self, TypedDict

from .._errors import ConfigurationError, ModelCallError
from .._messages import FilePart, ImagePart
from .._models import ModelEvent, ModelRequest, ModelSettings
from .._transport import HttpRequest, HttpTransport, Timeouts, default_transport
from ._sse import SSEEvent
from ._wire import sse_events

AZURE_OPENAI_HOSTS = (".openai.azure.com", ".cognitiveservices.azure.com", ".services.ai.azure.com")
DRAIN_LIMIT = 1.0  # seconds a finished call waits for the end of its response body


class HttpOptions(TypedDict, total=False):
    """What every adapter takes besides its model name (see `HttpModel`)."""

    base_url: str | None
    api_key: str | None
    headers: Mapping[str, str] | None
    extra_body: Mapping[str, Any] | None
    settings: ModelSettings | None
    transport: HttpTransport | None
    timeouts: Timeouts | None
    timeout: float | None


class HttpModel(abc.ABC):
    """A `LanguageModel` over a streamed HTTP API. See the module docstring.

    `base_url` defaults to the environment variable `base_url_env`, else `default_base_url`;
    `api_key` to `api_key_env`, read when the model is built (never at import). Without a key
    no credential is sent (local servers need none), but the provider's own endpoint refuses
    to be built without one. `headers` and `extra_body` are merged over what the adapter
    builds. `timeouts` bounds each call (`Timeouts`, in seconds); `timeout=30` is the shorthand
    for a whole call of at most 30 seconds (``Timeouts.within(30)``).

    Without `transport`, the model makes one with `default_transport()` when it is built and
    keeps it, so its calls share a connection pool (httpx's; the browser's under fetch); copies
    from `with_settings` share it too. Close it with ``async with model:`` or
    ``await model.aclose()``. A `transport` you pass is yours to close.
    """

    provider = "http"
    provider_name = "_OTHER"  # the GenAI conventions' gen_ai.provider.name of the API (`telemetry_attributes`)
    request_id_header = "x-request-id"
    default_base_url = ""
    base_url_env = ""
    api_key_env = ""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        settings: ModelSettings | None = None,
        transport: HttpTransport | None = None,
        timeouts: Timeouts | None = None,
        timeout: float | None = None,
    ) -> None:
        base_url = base_url or os.environ.get(self.base_url_env) or self.default_base_url
        if not isinstance(model, str) or not model:
            raise ConfigurationError(f"{type(self).__name__} needs a model name, got {model!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.model = model
        self.model_id = f"{self.provider}:{model}"
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})
        self.extra_body = dict(extra_body or {})
        self.settings = settings or ModelSettings()
        if timeout is not None and timeouts is not None:
            raise ConfigurationError("pass timeout= or timeouts=, not both")
        self.timeouts = timeouts or (Timeouts.within(timeout) if timeout is not None else Timeouts())
        self._owns_transport = transport is None
        self._transport = transport if transport is not None else default_transport()
        self.api_key = api_key if api_key is not None else os.environ.get(self.api_key_env)
        if not self.api_key and self.base_url == self.default_base_url:
            raise ConfigurationError(
                f"{type(self).__name__} needs an API key: pass api_key= or set {self.api_key_env}")

    async def aclose(self) -> None:
        """Close the connections of the transport this model made (a no-op for one you passed)."""
        close = getattr(self._transport, "aclose", None) if self._owns_transport else None
        if close is not None:
            await close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def settings_for(self, request: ModelRequest) -> ModelSettings:
        """This model's settings, with the fields the call set (`request.settings`) over them."""
        if request.settings is None:
            return self.settings
        call = {f.name: value for f in fields(ModelSettings) if (value := getattr(request.settings, f.name)) is not None}
        return replace(self.settings, **call)

    def with_settings(self, **changes: Any) -> Any:
        """A copy of this model with some settings changed (``temperature=0``, ``tool_choice="none"``)."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.settings = replace(self.settings, **changes)
        return clone

    def telemetry_attributes(self) -> dict[str, Any]:
        """What this model's requests are, in the OpenTelemetry GenAI conventions (read by `durable_agent.tracing`):
        the provider, the model as the provider names it, the server, and the sampling settings that are set.
        An OpenAI-compatible endpoint is ``openai``, as the conventions ask, but Azure's own hosts are
        ``azure.ai.openai``."""
        url = urllib.parse.urlsplit(self.base_url)
        host = url.hostname or ""
        provider = self.provider_name
        if provider == "openai" and host.endswith(AZURE_OPENAI_HOSTS):
            provider = "azure.ai.openai"
        attributes: dict[str, Any] = {"gen_ai.provider.name": provider, "gen_ai.request.model": self.model,
                                      "server.address": host,
                                      "server.port": url.port or (443 if url.scheme == "https" else 80)}
        for name in ("temperature", "max_tokens", "top_p", "seed"):
            if (value := getattr(self.settings, name)) is not None:
                attributes[f"gen_ai.request.{name}"] = value
        return attributes

    # -- what each adapter supplies -------------------------------------------------------------

    @abc.abstractmethod
    def url(self) -> str:
        ...

    @abc.abstractmethod
    def request_headers(self) -> dict[str, str]:
        ...

    @abc.abstractmethod
    def body(self, request: ModelRequest) -> dict[str, Any]:
        ...

    @abc.abstractmethod
    def parse(self, events: AsyncIterator[SSEEvent]) -> AsyncIterator[ModelEvent]:
        ...

    @abc.abstractmethod
    def classify_http(self, status: int, headers: Mapping[str, str], body: bytes) -> ModelCallError:
        ...

    # -- the call ---------------------------------------------------------------------------------

    def http_request(self, request: ModelRequest) -> HttpRequest:
        """The HTTP request of a model request (pure: no I/O)."""
        body = self.body(request)
        body.update(self.extra_body)
        headers = {"content-type": "application/json", "accept": "text/event-stream", **self.request_headers()}
        headers.update(self.headers)
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return HttpRequest(self.url(), headers, data, self.timeouts)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        events = sse_events(self._transport, self.http_request(request), provider=self.provider,
                            classify=self.classify_http, request_id_header=self.request_id_header)
        async with aclosing(events):  # the response is released here, not when the generator is collected
            async for event in self.parse(events):
                yield event
            try:  # what follows the terminal event (normally the chunked encoding's end): read, so the connection
                async with asyncio.timeout(DRAIN_LIMIT):  # goes back to the pool instead of being dropped half-read;
                    async for _ in events:  # a body that does not end, or breaks, is dropped: the call is done
                        pass
            except (TimeoutError, ModelCallError):
                pass


def schema_name(name: str) -> str:
    """A JSON schema's name as OpenAI accepts it: letters, digits, '_' and '-', at most 64 characters."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "output"


def data_url(part: ImagePart | FilePart) -> str:
    """A ``data:`` URL of an image or file part's bytes."""
    media = part.get("media_type") or "application/octet-stream"
    return f"data:{media};base64,{base64.b64encode(part['data']).decode('ascii')}"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def output_text(output: Any) -> str:
    """A tool result's output as the text a provider takes: a str as is, anything else as JSON."""
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)


def parse_arguments(raw: str) -> Any:
    """Streamed tool-call arguments as a value; "" is {}. Invalid JSON stays the raw string, so the
    tool's input validation reports it to the model instead of the run failing."""
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw
