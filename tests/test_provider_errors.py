"""The classification rules every adapter shares: retry-after headers, reset durations, x-should-retry, context errors.

Checked through `OpenAIChatModel` answering with an HTTP error (status, headers, an OpenAI error body): the
`ModelCallError` it raises carries the facts the loop decides on.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from durable_agent import ModelCallError, ModelRequest
from durable_agent.providers import HttpRequest, HttpResponse, OpenAIChatModel


@dataclass
class ErrorTransport:
    """Answers every request with `status`, `headers` and an OpenAI error body carrying `message`."""

    status: int
    headers: dict[str, str]
    message: str = "m"

    async def handle_async_request(self, request: HttpRequest) -> HttpResponse:
        body = json.dumps({"error": {"message": self.message}}).encode()

        async def stream() -> AsyncIterator[bytes]:
            yield body

        async def aclose() -> None:
            return None

        return HttpResponse(self.status, self.headers, stream(), aclose)


async def classified(status: int, headers: dict[str, str], message: str = "m") -> ModelCallError:
    model = OpenAIChatModel("gpt-4o-mini", api_key="sk-test", base_url="https://llm.test/v1",
                            transport=ErrorTransport(status, headers, message))
    with pytest.raises(ModelCallError) as caught:
        async for _ in model.stream(ModelRequest(messages=({"role": "user", "content": "hi"},))):
            pass
    return caught.value


@pytest.mark.parametrize(("text", "ms"), [("1s", 1000), ("6m0s", 360_000), ("20ms", 20), ("1h2m", 3_720_000),
                                          ("19.5s", 19_500), ("soon", None), ("", None), ("5x", None)])
async def test_reset_durations(text: str, ms: int | None) -> None:
    assert (await classified(429, {"x-ratelimit-reset-tokens": text})).retry_after_ms == ms


async def test_retry_after_headers() -> None:
    assert (await classified(429, {"retry-after-ms": "250", "retry-after": "9"})).retry_after_ms == 250
    assert (await classified(503, {"retry-after": "2"})).retry_after_ms == 2000
    soon = email.utils.formatdate(time.time() + 10, usegmt=True)  # an HTTP date: whole seconds
    assert 8_000 <= (await classified(503, {"retry-after": soon})).retry_after_ms <= 10_000  # type: ignore[operator]
    assert (await classified(503, {"retry-after": "whenever"})).retry_after_ms is None
    assert (await classified(503, {})).retry_after_ms is None


@pytest.mark.parametrize(("status", "kind", "retryable"), [
    (408, "timeout", True), (409, "conflict", True), (429, "rate_limited", True), (500, "server_error", True),
    (502, "server_error", True), (503, "overloaded", True), (529, "overloaded", True), (599, "server_error", True),
    (400, "bad_request", False), (401, "auth", False), (403, "permission", False), (404, "not_found", False),
    (418, "bad_request", False),
])
async def test_status_kinds(status: int, kind: str, retryable: bool) -> None:
    error = await classified(status, {})
    assert (error.kind, error.retryable, error.status) == (kind, retryable, status)


async def test_rate_limit_reset_headers_give_the_wait_when_retry_after_is_absent() -> None:
    assert (await classified(429, {"x-ratelimit-reset-requests": "2s"})).retry_after_ms == 2000
    assert (await classified(429, {"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "1s"})
            ).retry_after_ms == 1000  # the sooner of the two
    assert (await classified(500, {"x-ratelimit-reset-requests": "2s"})).retry_after_ms is None


async def test_x_should_retry_overrides_but_never_for_context_errors() -> None:
    assert (await classified(400, {"x-should-retry": "true"})).retryable is True
    assert (await classified(500, {"x-should-retry": "false"})).retryable is False
    error = await classified(400, {"x-should-retry": "true"}, "prompt is too long: 210000 tokens > 200000 maximum")
    assert (error.kind, error.retryable, error.context_exceeded) == ("context_length", False, True)
