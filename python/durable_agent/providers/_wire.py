"""One streamed provider call on the wire: POST through a transport, timeouts, SSE events out.

The rules:

1. Waiting for the response head is bounded by ``connect + read``; each body chunk by
   ``read``; the whole call by ``total``; the consumer's time between events does not count.
   A timeout is a retryable ``timeout`` error.
2. A `ConnectionError`/`OSError` from the transport is a retryable ``connection`` error.
3. A status other than 2xx: the body (at most `MAX_ERROR_BODY` bytes) is read and the
   adapter's `classify` turns it into a `ModelCallError`.
4. The body ends in the middle of an event (or not valid UTF-8): a retryable ``stream_cut``.
   Whether a body that ends cleanly was complete is the adapter's call (its terminal event).
5. The response is closed however the iteration ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing

from .._errors import ModelCallError
from .._transport import HttpRequest, HttpResponse, HttpTransport
from ._errors import transport_error
from ._sse import SSEDecoder, SSEEvent

MAX_ERROR_BODY = 65_536

HttpClassifier = Callable[[int, Mapping[str, str], bytes], ModelCallError]


class _Watchdog:
    """One timer per call instead of one per chunk: it cancels the task when `limit` seconds pass
    without `progress()` (or at the call's `end`), and re-arms itself lazily otherwise.

    While `paused` (the generator is suspended at a yield, and the consumer's time is its own)
    it never fires. `expired` tells the cancellation it caused from any other.
    """

    def __init__(self, limit: float, total: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._limit = limit
        self._end = None if total is None else self._loop.time() + total
        self.expired = False
        self.paused = False
        self._last = self._loop.time()
        self._handle = self._loop.call_at(self._due(), self._check)

    def _due(self) -> float:
        due = self._last + self._limit
        return due if self._end is None else min(due, self._end)

    def progress(self, limit: float | None = None) -> None:
        self._last = self._loop.time()
        self.paused = False
        if limit is not None:
            self._limit = limit

    def _check(self) -> None:
        if self.expired or self._task is None:
            return
        now = self._loop.time()
        if self.paused:  # the consumer's time: look again later, never fire now
            self._last = now
            self._handle = self._loop.call_at(now + self._limit, self._check)
            return
        due = self._due()
        if now >= due:
            self.expired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_at(due, self._check)

    def close(self) -> None:
        self._handle.cancel()

    def timed_out(self, error: BaseException) -> bool:
        """True when `error` is this watchdog's cancellation (which it then withdraws)."""
        if isinstance(error, asyncio.CancelledError) and self.expired and self._task is not None:
            self._task.uncancel()
            return True
        return isinstance(error, TimeoutError)


async def sse_events(
    transport: HttpTransport,
    request: HttpRequest,
    *,
    provider: str,
    classify: HttpClassifier,
    request_id_header: str,
) -> AsyncGenerator[SSEEvent, None]:
    """The SSE events of one streamed call, by the rules in the module docstring."""
    timeouts = request.timeouts
    watchdog = _Watchdog(timeouts.connect + timeouts.read, timeouts.total)
    try:
        try:
            response = await transport.handle_async_request(request)
        except (asyncio.CancelledError, OSError) as exc:
            if watchdog.timed_out(exc):
                raise transport_error(provider, "timeout", f"no response from {request.url} in time") from exc
            if isinstance(exc, OSError):
                raise transport_error(provider, "connection", f"cannot reach {request.url}: {exc}") from exc
            raise
        watchdog.progress(timeouts.read)
        async with aclosing(_events(response, watchdog, provider, classify, request_id_header)) as events:
            async for event in events:
                yield event
    finally:
        watchdog.close()


async def _events(response: HttpResponse, watchdog: _Watchdog, provider: str, classify: HttpClassifier,
                  request_id_header: str) -> AsyncGenerator[SSEEvent, None]:
    request_id = response.headers.get(request_id_header)
    chunks = response.stream.__aiter__()
    try:
        if not 200 <= response.status < 300:
            body = b""
            try:
                while len(body) < MAX_ERROR_BODY:
                    body += await chunks.__anext__()
                    watchdog.progress()
            except StopAsyncIteration:
                pass
            except (asyncio.CancelledError, OSError) as exc:  # classify what came before the failure
                if not watchdog.timed_out(exc) and not isinstance(exc, OSError):
                    raise
            raise classify(response.status, response.headers, body[:MAX_ERROR_BODY])
        decoder = SSEDecoder()
        while True:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except (asyncio.CancelledError, OSError) as exc:
                if watchdog.timed_out(exc):
                    raise transport_error(provider, "timeout", "the stream stalled", request_id) from exc
                if isinstance(exc, OSError):
                    raise transport_error(provider, "stream_cut", f"the stream broke: {exc}", request_id) from exc
                raise
            watchdog.progress()
            try:
                events = decoder.feed(chunk)
            except UnicodeDecodeError as exc:
                raise transport_error(provider, "malformed_chunk", f"the stream is not UTF-8: {exc}",
                                      request_id) from exc
            for event in events:
                watchdog.paused = True
                yield event
                watchdog.progress()
        if not decoder.at_boundary:
            raise transport_error(provider, "stream_cut", "the stream ended in the middle of an event", request_id)
    finally:
        await response.aclose()
