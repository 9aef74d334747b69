"""The few ASGI pieces the endpoint needs, on the bare protocol (no framework): requests, JSON, SSE, the CORS
middleware."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._kernels import kernels

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 1 << 20


class HttpError(Exception):
    """An error answered as ``{"error": {"code", "message"}}`` with `status`; never a traceback."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class CorsSettings:
    """Which browser origins may call the endpoint (`allow_origins`; ``("*",)`` for any) and how.

    Preflights are answered with the methods the endpoint serves and `allow_headers`;
    responses to an allowed origin name it (``Vary: Origin``) and expose the UI message stream
    header. An origin not listed gets no CORS headers (the browser then blocks the response),
    and its preflight a 403. `Cors` applies them to every route.
    """

    allow_origins: Sequence[str] = ()
    allow_headers: Sequence[str] = ("authorization", "content-type", "idempotency-key", "last-event-id")
    allow_credentials: bool = False
    max_age: int = 600
    expose_headers: Sequence[str] = field(default=("x-vercel-ai-ui-message-stream", "location"))

    def allows(self, origin: str) -> bool:
        return "*" in self.allow_origins or origin in self.allow_origins

    def headers(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        if origin is None or not self.allows(origin):
            return []
        any_origin = "*" in self.allow_origins and not self.allow_credentials
        out = [(b"access-control-allow-origin", b"*" if any_origin else origin.encode("latin-1")), (b"vary", b"origin"),
               (b"access-control-expose-headers", ", ".join(self.expose_headers).encode())]
        if self.allow_credentials:
            out.append((b"access-control-allow-credentials", b"true"))
        return out

    def preflight(self, origin: str) -> list[tuple[bytes, bytes]]:
        return [*self.headers(origin), (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                (b"access-control-allow-headers", ", ".join(self.allow_headers).encode()),
                (b"access-control-max-age", str(self.max_age).encode())]


class Cors:
    """The CORS middleware: answers every preflight (``OPTIONS``, any path) itself and adds the CORS headers of
    the request's origin to every response `app` starts, its errors and streams included (`CorsSettings`)."""

    def __init__(self, app: App, settings: CorsSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request.of(scope)
        origin = request.headers.get("origin")
        if request.method == "OPTIONS":
            if origin is None or not self.settings.allows(origin):
                await send_error(send, HttpError(403, "origin_refused", "this origin may not call the endpoint"))
            else:
                await send_empty(send, 204, self.settings.preflight(origin))
            return
        headers = self.settings.headers(origin)
        if not headers:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *headers]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


@dataclass(frozen=True, slots=True)
class Request:
    """What a handler (and the auth hook) sees of a request: method, path, query, lowercase headers."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]

    @classmethod
    def of(cls, scope: Scope) -> Request:
        from urllib.parse import parse_qsl

        headers: dict[str, str] = {}
        for name, value in scope.get("headers", ()):
            headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        return cls(scope["method"].upper(), scope["path"], query, headers)


async def read_json(receive: Receive) -> dict[str, Any]:
    """The request body as a JSON object (422 when it is not one, 413 past `MAX_BODY_BYTES`)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError(400, "disconnected", "the client went away before sending its body")
        body += message.get("body", b"")
        if len(body) > MAX_BODY_BYTES:
            raise HttpError(413, "body_too_large", f"the body is over {MAX_BODY_BYTES} bytes")
        if not message.get("more_body"):
            break
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise HttpError(422, "bad_body", f"the body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise HttpError(422, "bad_body", "the body must be a JSON object")
    return value


async def send_json(send: Send, status: int, value: Any, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = kernels.encode(value).encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: HttpError) -> None:
    """`error` as the endpoint answers it: ``{"error": {"code", "message"}}`` with its status."""
    await send_json(send, error.status, {"error": {"code": error.code, "message": error.message}})


async def send_empty(send: Send, status: int, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0"), *headers]})
    await send({"type": "http.response.body", "body": b""})


def sse_frame(event_id: str | None, data: str) -> bytes:
    """One server-sent event: an optional ``id:`` line and one ``data:`` line (`data` holds no newline)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}data: {data}\n\n".encode()


def field_of(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = True,
             what: str = "") -> Any:
    """`body[name]` checked to be of `kind` (422 otherwise); None when absent and not `required`."""
    if name not in body or body[name] is None:
        if required:
            raise HttpError(422, "bad_body", f"the body needs {name!r}{what}")
        return None
    value = body[name]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise HttpError(422, "bad_body", f"{name!r} has the wrong type{what}")
    return value
