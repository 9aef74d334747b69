"""The shared classification rules: retry-after headers, reset durations, x-should-retry, context errors."""

from __future__ import annotations

import pytest

from durable_agent.providers._errors import classify, parse_duration_ms, parse_retry_after_ms


@pytest.mark.parametrize(("text", "ms"), [("1s", 1000), ("6m0s", 360_000), ("20ms", 20), ("1h2m", 3_720_000),
                                          ("19.5s", 19_500), ("soon", None), ("", None), ("5x", None)])
def test_reset_durations(text: str, ms: int | None) -> None:
    assert parse_duration_ms(text) == ms


def test_retry_after_headers() -> None:
    assert parse_retry_after_ms({"retry-after-ms": "250", "retry-after": "9"}) == 250
    assert parse_retry_after_ms({"retry-after": "2"}) == 2000
    assert parse_retry_after_ms({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, now=lambda: 1445412480.0) == 10_000
    assert parse_retry_after_ms({"retry-after": "whenever"}) is None
    assert parse_retry_after_ms({}) is None


def classified(status: int | None, headers: dict[str, str], message: str = "m", code: str | None = None) -> object:
    return classify(provider="p", status=status, headers=headers, error_type=None, error_code=code, message=message,
                    kinds={}, request_id_header="x-request-id", reset_headers={"x-reset": parse_duration_ms})


@pytest.mark.parametrize(("status", "kind", "retryable"), [
    (408, "timeout", True), (409, "conflict", True), (429, "rate_limited", True), (500, "server_error", True),
    (502, "server_error", True), (503, "overloaded", True), (529, "overloaded", True), (599, "server_error", True),
    (400, "bad_request", False), (401, "auth", False), (403, "permission", False), (404, "not_found", False),
    (418, "bad_request", False),
])
def test_status_kinds(status: int, kind: str, retryable: bool) -> None:
    error = classified(status, {})
    assert (error.kind, error.retryable) == (kind, retryable)  # type: ignore[attr-defined]


def test_rate_limit_reset_headers_give_the_wait_when_retry_after_is_absent() -> None:
    assert classified(429, {"x-reset": "2s"}).retry_after_ms == 2000  # type: ignore[attr-defined]
    assert classified(500, {"x-reset": "2s"}).retry_after_ms is None  # type: ignore[attr-defined]


def test_x_should_retry_overrides_but_never_for_context_errors() -> None:
    assert classified(400, {"x-should-retry": "true"}).retryable is True  # type: ignore[attr-defined]
    assert classified(500, {"x-should-retry": "false"}).retryable is False  # type: ignore[attr-defined]
    error = classified(400, {"x-should-retry": "true"}, "prompt is too long: 210000 tokens > 200000 maximum")
    assert (error.kind, error.retryable, error.context_exceeded) == ("context_length", False, True)  # type: ignore[attr-defined]
