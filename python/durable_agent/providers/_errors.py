"""Classifying a provider's failures into `ModelCallError`: the shared rules and tables.

Each adapter module names its own tables (its error types and codes); the rules here are
what every provider shares:

1. The provider's error type/code, looked up in the adapter's table, decides the kind;
   otherwise the HTTP status does (`STATUS_KINDS`); otherwise a 5xx is ``server_error``
   and anything else ``bad_request``.
2. A message matching `CONTEXT_PATTERNS` (or a context code) makes it ``context_length``:
   never retryable, since the same request fails the same way.
3. Retryable kinds are `RETRYABLE_KINDS`; a provider's ``x-should-retry`` header overrides.
4. The wait the provider asked for: ``retry-after-ms``, else ``retry-after`` (seconds or an
   HTTP date), else the earliest of the provider's rate-limit reset headers when rate limited.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import ModelCallError

STATUS_KINDS: Mapping[int, str] = {
    400: "bad_request",
    401: "auth",
    403: "permission",
    404: "not_found",
    408: "timeout",
    409: "conflict",
    413: "request_too_large",
    422: "bad_request",
    429: "rate_limited",
    500: "server_error",
    502: "server_error",
    503: "overloaded",
    504: "timeout",
    529: "overloaded",
}

RETRYABLE_KINDS = frozenset(
    {"timeout", "conflict", "rate_limited", "server_error", "overloaded", "connection", "stream_cut",
     "malformed_chunk"}
)

CONTEXT_PATTERNS = re.compile(
    r"context[_ ]length|maximum context length|context window|prompt is too long|too many tokens|"
    r"input length and `max_tokens` exceed|exceeds the context",
    re.IGNORECASE,
)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_DURATION_MS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}


def parse_duration_ms(text: str) -> int | None:
    """OpenAI's reset durations (``1s``, ``6m0s``, ``20ms``, ``1h2m``) in ms; None when unreadable."""
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        return None
    return int(sum(float(n) * _DURATION_MS[u] for n, u in parts))


def parse_retry_after_ms(headers: Mapping[str, str], now: Callable[[], float] = time.time) -> int | None:
    """``retry-after-ms``, else ``retry-after`` as seconds or an HTTP date; None when absent or unreadable."""
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0, int(float(value)))
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0, int(float(value) * 1000))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0, int((when.timestamp() - now()) * 1000))


def error_body(body: bytes) -> tuple[str | None, str | None, str]:
    """(type, code, message) of a JSON error body ``{"error": {...}}`` (or a bare error object)."""
    try:
        data: Any = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return None, None, body.decode("utf-8", "replace")[:500]
    error = data.get("error", data) if isinstance(data, dict) else None
    if isinstance(error, str):
        return None, None, error
    if not isinstance(error, dict):
        return None, None, str(data)[:500]
    kind = error.get("type")
    code = error.get("code")
    message = error.get("message")
    return (
        kind if isinstance(kind, str) else None,
        str(code) if isinstance(code, str | int) and not isinstance(code, bool) else None,
        message if isinstance(message, str) else json.dumps(error)[:500],
    )


def classify(
    *,
    provider: str,
    status: int | None,
    headers: Mapping[str, str],
    error_type: str | None,
    error_code: str | None,
    message: str,
    kinds: Mapping[str, str],
    request_id_header: str,
    reset_headers: Mapping[str, Callable[[str], int | None]] = {},
) -> ModelCallError:
    """A `ModelCallError` from a failure's facts, by the rules in the module docstring."""
    kind = kinds.get(error_code or "") or kinds.get(error_type or "")
    if kind is None:
        kind = STATUS_KINDS.get(status or 0) or ("server_error" if (status or 0) >= 500 else "bad_request")
    if kind == "bad_request" and CONTEXT_PATTERNS.search(message):
        kind = "context_length"
    retryable = kind in RETRYABLE_KINDS
    should_retry = headers.get("x-should-retry")
    if should_retry in ("true", "false") and kind != "context_length":
        retryable = should_retry == "true"
    retry_after = parse_retry_after_ms(headers)
    if retry_after is None and kind == "rate_limited":
        resets = [ms for name, parse in reset_headers.items() if name in headers
                  for ms in [parse(headers[name])] if ms is not None]
        retry_after = min(resets) if resets else None
    label = error_code or error_type
    where = f"HTTP {status}" if status is not None else "in the stream"
    return ModelCallError(
        f"{provider} call failed ({where}, {kind}{', ' + label if label and label != kind else ''}): {message}",
        provider=provider,
        kind=kind,
        retryable=retryable,
        status=status,
        error_code=label,
        retry_after_ms=retry_after,
        context_exceeded=kind == "context_length",
        request_id=headers.get(request_id_header),
    )


def transport_error(provider: str, kind: str, message: str, request_id: str | None = None) -> ModelCallError:
    """A failure below HTTP (connection, timeout, a cut or garbled stream): retryable, no status."""
    return ModelCallError(f"{provider} call failed ({kind}): {message}", provider=provider, kind=kind,
                          retryable=kind in RETRYABLE_KINDS, request_id=request_id)
