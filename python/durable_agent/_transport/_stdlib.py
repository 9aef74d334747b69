"""`StdlibTransport`: http.client on a worker thread, streaming into the event loop.

Each request gets a daemon thread that connects, sends, reads the response head and then
the body in chunks as they arrive (``read1``), handing each to the event loop with
``call_soon_threadsafe``. The loop only ever awaits a queue, so it is never blocked.
Closing the response shuts the socket down, which wakes the thread from a blocked read.

Connections are kept alive: a response read to its end leaves its connection idle in the
transport's pool (per scheme, host and port, at most `MAX_IDLE` each) for the next call;
`aclose()` closes the idle ones. A pooled connection the server dropped meanwhile fails
before any byte of a response comes back: the request is then sent once more on a fresh
connection. No proxy support: install httpx for that.
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
MAX_IDLE = 8

Origin = tuple[str, str, int | None]  # scheme, host, port


class _Pool:
    """Idle kept-alive connections by origin; shared by the worker threads, so locked."""

    def __init__(self) -> None:
        self._idle: dict[Origin, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def take(self, origin: Origin) -> http.client.HTTPConnection | None:
        with self._lock:
            idle = self._idle.get(origin)
            return idle.pop() if idle else None

    def give(self, origin: Origin, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if len(idle) < MAX_IDLE:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle = [conn for conns in self._idle.values() for conn in conns]
            self._idle.clear()
        for conn in idle:
            conn.close()


class StdlibTransport:
    """A transport with no dependency beyond CPython's standard library (not for Pyodide)."""

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context
        self._pool = _Pool()

    async def aclose(self) -> None:
        """Close the idle connections (calls in flight keep theirs until they end)."""
        self._pool.close()

    async def handle_async_request(self, request: HttpRequest) -> HttpResponse:
        loop = asyncio.get_running_loop()
        worker = _Worker(request, loop, self._ssl_context, self._pool)
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
    def __init__(self, request: HttpRequest, loop: asyncio.AbstractEventLoop, context: ssl.SSLContext | None,
                 pool: _Pool) -> None:
        self.request = request
        self.loop = loop
        self.context = context
        self.pool = pool
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
        kept = False
        try:
            url = urllib.parse.urlsplit(self.request.url)
            origin: Origin = (url.scheme, url.hostname or "", url.port)
            target = (url.path or "/") + (f"?{url.query}" if url.query else "")
            response: http.client.HTTPResponse | None = None
            conn = self.pool.take(origin)
            if conn is not None:
                try:
                    response = self._send(conn, target)
                except (ConnectionError, http.client.BadStatusLine):  # dropped while idle: no response came
                    conn.close()
                    conn = None
            if conn is None:
                conn = self._connect(url)
                if self.closed.is_set():
                    return
                response = self._send(conn, target)
            assert response is not None
            self._post(self._set_head, (response.status, lower_headers(response.getheaders())), None)
            while not self.closed.is_set():
                chunk = response.read1(_CHUNK)
                if not chunk:
                    if not response.will_close:  # read to its end: the connection can carry the next call
                        self.sock = None  # closing this response must no longer shut it down
                        # A body of known length read to its end leaves the response open, and http.client
                        # refuses the connection's next response (ResponseNotReady) until it is closed.
                        response.close()
                        self.pool.give(origin, conn)
                        kept = True
                    break
                self._post(self.queue.put_nowait, chunk)
            self._post(self.queue.put_nowait, _END)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            error = _as_builtin(exc)
            self._post(self._set_head, None, error)
            self._post(self.queue.put_nowait, error)
        finally:
            if conn is not None and not kept:
                conn.close()

    def _connect(self, url: urllib.parse.SplitResult) -> http.client.HTTPConnection:
        timeout = self.request.timeouts.connect
        conn: http.client.HTTPConnection
        if url.scheme == "https":
            conn = http.client.HTTPSConnection(url.hostname or "", url.port, timeout=timeout,
                                               context=self.context or _default_ssl_context())
        else:
            conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeout)
        conn.connect()
        return conn

    def _send(self, conn: http.client.HTTPConnection, target: str) -> http.client.HTTPResponse:
        self.sock = conn.sock
        conn.sock.settimeout(self.request.timeouts.read)
        conn.request("POST", target, body=self.request.body, headers=dict(self.request.headers))
        return conn.getresponse()

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
