"""Streamable HTTP without the SDK: MCP over the package's own HTTP transport (pure; fetch under Pyodide).

The client side of the spec's streamable HTTP transport that a tool-calling client needs, in
POSTs only: each JSON-RPC message is one POST; the answer is a JSON body or a server-sent event
stream that carries the call's progress notifications before its response; the session id the
server hands out on ``initialize`` (``Mcp-Session-Id``) and the negotiated protocol version go
on every later request. A call past its timeout is sent ``notifications/cancelled``. Not done
here: the optional GET stream (server-initiated messages: sampling, elicitation, list changes not
sent on a call's stream),
resuming a cut stream, and the closing DELETE (the server's idle timeout ends the session).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from typing import TYPE_CHECKING, Any

from .._errors import MCPServerError
from .._transport import HttpRequest, HttpTransport, Timeouts
from ..providers._sse import SSEDecoder
from ._results import error_result, timed_out

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .._transport import HttpResponse
    from ._connection import Progress
    from ._results import Wire

PROTOCOL_VERSION = "2025-11-25"
CLIENT_INFO = {"name": "durable-agent", "version": "1"}


class RemoteError(Exception):
    """A JSON-RPC error response."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"MCP error {code}: {message}")
        self.code = code


class PlainHttpConnection:
    """An MCP session at `url` over `transport` (see the module docs); the same face as the SDK's `Connection`."""

    def __init__(self, label: str, url: str, headers: Mapping[str, str], transport: HttpTransport) -> None:
        self.label = label
        self.broken = False
        self.tools_changed = False  # set by a list change announced on a call's stream (there is no GET stream)
        self._url = url
        self._headers = dict(headers)
        self._transport = transport
        self._ids = itertools.count(1)
        self._session_id: str | None = None
        self._protocol: str | None = None

    async def open(self, timeout: float) -> list[dict[str, Any]]:
        """Initialize and list the tools within `timeout` seconds; `MCPServerError` otherwise."""
        try:
            async with asyncio.timeout(timeout):
                answer = await self._request("initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                                            "clientInfo": CLIENT_INFO})
                self._protocol = str(answer.get("protocolVersion") or PROTOCOL_VERSION)
                await self._notify("notifications/initialized", None)
                return await self._listed()
        except TimeoutError:
            raise MCPServerError(self.label, f"did not answer initialize within {timeout:g} s") from None
        except (OSError, RemoteError, ValueError) as exc:
            raise MCPServerError(self.label, f"could not connect: {exc}") from exc

    async def relist(self, timeout: float) -> list[dict[str, Any]]:
        """List the tools again (as `Connection.relist`)."""
        self.tools_changed = False
        try:
            async with asyncio.timeout(timeout):
                return await self._listed()
        except TimeoutError:
            raise MCPServerError(self.label, f"did not list its tools within {timeout:g} s") from None
        except (OSError, RemoteError, ValueError) as exc:
            self.broken = True
            raise MCPServerError(self.label, f"failed listing its tools again: {exc}") from exc

    async def _listed(self) -> list[dict[str, Any]]:
        """Every tool the server lists, page by page."""
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            page = await self._request("tools/list", {"cursor": cursor} if cursor else {})
            tools.extend(page.get("tools") or ())
            cursor = page.get("nextCursor")
            if not cursor:
                return tools

    async def call(self, name: str, arguments: dict[str, Any], timeout: float | None,
                   progress: Progress | None) -> Wire:
        """Call tool `name` (as `Connection.call`)."""
        request_id = next(self._ids)
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if progress is not None:
            params["_meta"] = {"progressToken": request_id}
        try:
            async with asyncio.timeout(timeout):
                return await self._request("tools/call", params, request_id, progress)
        except TimeoutError:
            with contextlib.suppress(OSError, ValueError):
                await self._notify("notifications/cancelled", {"requestId": request_id, "reason": "timed out"})
            return timed_out(name, timeout or 0)
        except RemoteError as exc:
            return error_result(str(exc))
        except (OSError, ValueError) as exc:
            self.broken = True
            raise MCPServerError(self.label, f"failed during a call of tool {name!r}: {exc}") from exc

    async def close(self) -> None:
        """Nothing to release: each request was its own exchange."""

    async def _request(self, method: str, params: Any, request_id: int | None = None,
                       progress: Progress | None = None) -> dict[str, Any]:
        """Send one request; its result, or `RemoteError`. A transport failure raises `OSError`, a malformed
        answer `ValueError`."""
        request_id = next(self._ids) if request_id is None else request_id
        response = await self._post({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        try:
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                decoder = SSEDecoder()
                async for chunk in response.stream:
                    for event in decoder.feed(chunk):
                        message = json.loads(event.data) if event.data.strip() else {}
                        if message.get("id") == request_id and ("result" in message or "error" in message):
                            return _answer(message)
                        if message.get("method") == "notifications/tools/list_changed":
                            self.tools_changed = True
                        elif message.get("method") == "notifications/progress" and progress is not None:
                            note = message.get("params") or {}
                            await progress(note.get("progress", 0), note.get("total"), note.get("message"))
                raise ConnectionError(f"the answer stream of {method} ended without a response")
            body = b"".join([chunk async for chunk in response.stream])
            return _answer(json.loads(body))
        finally:
            await response.aclose()

    async def _notify(self, method: str, params: Any) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        response = await self._post(message)
        await response.aclose()

    async def _post(self, message: dict[str, Any]) -> HttpResponse:
        headers = {**self._headers, "content-type": "application/json",
                   "accept": "application/json, text/event-stream"}
        if self._session_id is not None:
            headers["mcp-session-id"] = self._session_id
        if self._protocol is not None:
            headers["mcp-protocol-version"] = self._protocol
        request = HttpRequest(self._url, headers, json.dumps(message).encode(), Timeouts(read=3600.0, total=None))
        response = await self._transport.handle_async_request(request)
        if response.status >= 400:
            detail = b"".join([chunk async for chunk in response.stream])[:300].decode(errors="replace")
            await response.aclose()
            raise ConnectionError(f"HTTP {response.status} from {self._url}: {detail}")
        self._session_id = response.headers.get("mcp-session-id", self._session_id)
        return response


def _answer(message: Mapping[str, Any]) -> dict[str, Any]:
    if "error" in message:
        error = message["error"] or {}
        raise RemoteError(int(error.get("code", 0)), str(error.get("message", "")))
    result = message.get("result")
    if not isinstance(result, dict):
        raise ValueError(f"a JSON-RPC answer without a result object: {message!r}"[:300])
    return result
