"""`StdlibTransport`: http.client on a worker thread, streaming into the event loop.

Each request gets a daemon thread that connects, sends, reads the response head and then
the body in chunks as they arrive (``read1``), handing each to the event loop with
``call_soon_threadsafe``. The loop only ever awaits a queue, so it is never blocked.
Closing the response shuts the socket down, which wakes the thread from a blocked read.
One connection per call (no pooling) and no proxy support: install httpx for those.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading
import urllib.parse
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ._base import HttpRequest, HttpResponse, lower_headers

if TYPE_CHECKING:
    import ssl  # imported when an HTTPS connection is made: Pyodide 0.28 ships it as a separate package

_CHUNK = 65_536
_END = object()


class StdlibTransport:
    """A transport with no dependency beyond CPython's standard library (not for Pyodide)."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context

    async def handle_async_request(self, request: HttpRequest) -> HttpResponse:
        loop = asyncio.get_running_loop()
        worker = _Worker(request, loop, self._ssl_context)
        threading.Thread(target=worker.run, name="durable-agent-http", daemon=True).start()
        try:
            status, headers = await worker.head
        except BaseException:
            worker.close()
            raise

        async def aclose() -> None:
            worker.close()

        return HttpResponse(status, headers, worker.chunks(), aclose)


class _Worker:
    def __init__(self, request: HttpRequest, loop: asyncio.AbstractEventLoop, context: ssl.SSLContext | None) -> None:
        self.request = request
        self.loop = loop
        self.context = context
        self.head: asyncio.Future[tuple[int, dict[str, str]]] = loop.create_future()
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.closed = threading.Event()
        self.sock: socket.socket | None = None

    def _post(self, callback: Any, *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.closed.set()

    def _set_head(self, value: Any, error: BaseException | None) -> None:
        if self.head.done():
            return
        if error is not None:
            self.head.set_exception(error)
        else:
            self.head.set_result(value)

    def run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        try:
            url = urllib.parse.urlsplit(self.request.url)
            timeouts = self.request.timeouts
            if url.scheme == "https":
                conn = http.client.HTTPSConnection(url.hostname or "", url.port, timeout=timeouts.connect,
                                                   context=self.context or _default_ssl_context())
            else:
                conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeouts.connect)
            conn.connect()
            self.sock = conn.sock
            if self.closed.is_set():
                return
            conn.sock.settimeout(timeouts.read)
            target = url.path or "/"
            if url.query:
                target += "?" + url.query
            conn.request("POST", target, body=self.request.body, headers=dict(self.request.headers))
            response = conn.getresponse()
            self._post(self._set_head, (response.status, lower_headers(response.getheaders())), None)
            while not self.closed.is_set():
                chunk = response.read1(_CHUNK)
                if not chunk:
                    break
                self._post(self.queue.put_nowait, chunk)
            self._post(self.queue.put_nowait, _END)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            error = _as_builtin(exc)
            self._post(self._set_head, None, error)
            self._post(self.queue.put_nowait, error)
        finally:
            if conn is not None:
                conn.close()

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            item = await self.queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self.closed.set()
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _as_builtin(exc: BaseException) -> BaseException:
    """http.client's failures as the transport contract's builtins (TimeoutError, ConnectionError)."""
    if isinstance(exc, TimeoutError | OSError):
        return exc
    if isinstance(exc, http.client.IncompleteRead | http.client.HTTPException):
        return ConnectionError(f"the connection broke mid-response: {exc!r}")
    return exc


def _default_ssl_context() -> ssl.SSLContext:
    import ssl

    return ssl.create_default_context()
