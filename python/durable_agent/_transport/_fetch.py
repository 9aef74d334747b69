"""`FetchTransport`: JS ``fetch`` under Pyodide (browser, Node) and in Cloudflare Python Workers.

The response body is read from its ReadableStream one chunk at a time; closing the
response cancels the reader and aborts the request. Imported only under Pyodide.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ._base import HttpRequest, HttpResponse


class FetchTransport:
    """`fetch` defaults to the runtime's global ``fetch``; pass another (a Worker binding's) to use it."""

    def __init__(self, fetch: Any = None) -> None:
        self._fetch = fetch

    async def handle_async_request(self, request: HttpRequest) -> HttpResponse:
        import js
        from pyodide.ffi import JsException, to_js

        fetch = self._fetch or js.fetch
        controller = js.AbortController.new()
        init = to_js(
            {"method": "POST", "headers": dict(request.headers), "body": request.body.decode("utf-8"),
             "signal": controller.signal},
            dict_converter=js.Object.fromEntries,
        )
        try:
            response = await fetch(request.url, init)
        except JsException as exc:
            raise ConnectionError(f"fetch failed: {exc}") from exc
        headers = {str(k).lower(): str(v) for k, v in getattr(js.Array, "from")(response.headers.entries()).to_py()}
        reader = response.body.getReader() if response.body is not None else None

        async def aclose() -> None:
            if reader is not None:
                try:
                    await reader.cancel()
                except JsException:
                    pass
            controller.abort()

        return HttpResponse(int(response.status), headers, _chunks(reader, JsException), aclose)


async def _chunks(reader: Any, js_exception: type[BaseException]) -> AsyncIterator[bytes]:
    if reader is None:
        return
    while True:
        try:
            result = await reader.read()
        except js_exception as exc:
            raise ConnectionError(f"the response body broke: {exc}") from exc
        if result.done:
            return
        yield bytes(result.value.to_bytes())
