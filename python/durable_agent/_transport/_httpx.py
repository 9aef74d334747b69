"""`HttpxTransport`: httpx's AsyncClient (``pip install durable-agent[http]``); imported on first use."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from typing import Any

from ._base import HttpRequest, HttpResponse, lower_headers


class HttpxTransport:
    """Streams through an `httpx.AsyncClient`: yours (you close it), or one per event loop that this
    transport owns (connections are pooled across calls; `aclose()` closes the running loop's)."""

    def __init__(self, client: Any = None) -> None:
        import httpx  # noqa: F401  # fail here, clearly, when the extra is not installed

        self._client = client
        self._owned: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    def _client_for_loop(self) -> Any:
        if self._client is not None:
            return self._client
        import httpx

        loop = asyncio.get_running_loop()
        client = self._owned.get(loop)
        if client is None:
            client = self._owned[loop] = httpx.AsyncClient()
        return client

    async def aclose(self) -> None:
        client = self._owned.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def handle_async_request(self, request: HttpRequest) -> HttpResponse:
        import httpx

        t = request.timeouts
        timeout = httpx.Timeout(connect=t.connect, read=t.read, write=t.read, pool=t.connect)
        client = self._client_for_loop()
        built = client.build_request("POST", request.url, headers=dict(request.headers), content=request.body,
                                     timeout=timeout)
        try:
            response = await client.send(built, stream=True)
        except httpx.TimeoutException as exc:
            raise TimeoutError(f"no response in time: {exc!r}") from exc
        except httpx.TransportError as exc:
            raise ConnectionError(f"the connection failed: {exc!r}") from exc
        return HttpResponse(response.status_code, lower_headers(response.headers.multi_items()),
                            _chunks(response), response.aclose)


async def _chunks(response: Any) -> AsyncIterator[bytes]:
    import httpx

    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx.TimeoutException as exc:
        raise TimeoutError(f"the response stalled: {exc!r}") from exc
    except httpx.TransportError as exc:
        raise ConnectionError(f"the connection broke mid-response: {exc!r}") from exc
