"""One streamed provider call on the wire: POST through a transport, timeouts, SSE events out.

The rules:

1. Waiting for the response head is bounded by ``connect + read``; each body chunk by
   ``read``; the whole call by ``total``. A timeout is a retryable ``timeout`` error.
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


from .._transport import HttpRequest, HttpTransport
from ..errors import ModelCallError
from ._errors import transport_error
from ._sse import SSEDecoder, SSEEvent

MAX_ERROR_BODY = 65_536

HttpClassifier = Callable[[int, Mapping[str, str], bytes], ModelCallError]


class _Deadline:
    def __init__(self, total: float | None) -> None:
        self._loop = asyncio.get_running_loop()
        self._end = None if total is None else self._loop.time() + total

    def at(self, seconds: float) -> float:
        """The loop time `seconds` from now, or the call's end when that comes first."""
        when = self._loop.time() + seconds
        return when if self._end is None else min(when, self._end)


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
    deadline = _Deadline(timeouts.total)
    try:
        async with asyncio.timeout_at(deadline.at(timeouts.connect + timeouts.read)):
            response = await transport.handle_async_request(request)
    except TimeoutError as exc:
        raise transport_error(provider, "timeout", f"no response from {request.url} in time") from exc
    except OSError as exc:
        raise transport_error(provider, "connection", f"cannot reach {request.url}: {exc}") from exc
    request_id = response.headers.get(request_id_header)
    chunks = response.stream.__aiter__()
    try:
        if not 200 <= response.status < 300:
            body = b""
            try:
                while len(body) < MAX_ERROR_BODY:
                    async with asyncio.timeout_at(deadline.at(timeouts.read)):
                        body += await chunks.__anext__()
            except (StopAsyncIteration, OSError):  # TimeoutError is an OSError: classify what came
                pass
            raise classify(response.status, response.headers, body[:MAX_ERROR_BODY])
        decoder = SSEDecoder()
        while True:
            try:
                async with asyncio.timeout_at(deadline.at(timeouts.read)):
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except TimeoutError as exc:
                raise transport_error(provider, "timeout", "the stream stalled", request_id) from exc
            except OSError as exc:
                raise transport_error(provider, "stream_cut", f"the stream broke: {exc}", request_id) from exc
            try:
                events = decoder.feed(chunk)
            except UnicodeDecodeError as exc:
                raise transport_error(provider, "malformed_chunk", f"the stream is not UTF-8: {exc}",
                                      request_id) from exc
            for event in events:
                yield event
        if not decoder.at_boundary:
            raise transport_error(provider, "stream_cut", "the stream ended in the middle of an event", request_id)
    finally:
        await response.aclose()
