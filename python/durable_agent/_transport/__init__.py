"""HTTP transports for the model adapters: one method, in the manner of httpx's `AsyncBaseTransport`.

An adapter builds an `HttpRequest` (a POST with a JSON body) and hands it to a transport's
`handle_async_request`; it gets back an `HttpResponse` whose body is an async stream of
bytes. The adapter never knows which client carried them. Bundled:

* `HttpxTransport` — httpx, when installed (``pip install durable-agent[http]``);
* `StdlibTransport` — CPython's http.client on a worker thread feeding the event loop, so
  it streams and never blocks the loop;
* `FetchTransport` — JS ``fetch`` under Pyodide (browser) and in Cloudflare Python Workers,
  reading the response's ReadableStream chunk by chunk.

`default_transport()` picks fetch under Pyodide, else httpx when importable, else the
standard library. None of them is imported (nor httpx) until it is used.

Failures a transport cannot turn into a response are the builtins: `TimeoutError` for a
timeout, `ConnectionError` (any `OSError`) for a refused, reset or cut connection.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING

from ._base import HttpRequest, HttpResponse, HttpTransport, Timeouts

if TYPE_CHECKING:
    from ._fetch import FetchTransport
    from ._httpx import HttpxTransport
    from ._stdlib import StdlibTransport

__all__ = [
    "FetchTransport",
    "HttpRequest",
    "HttpResponse",
    "HttpTransport",
    "HttpxTransport",
    "StdlibTransport",
    "Timeouts",
    "default_transport",
]


def default_transport() -> HttpTransport:
    """Fetch under Pyodide/Workers; httpx when installed; else the standard library."""
    if sys.platform == "emscripten":
        from ._fetch import FetchTransport

        return FetchTransport()
    if importlib.util.find_spec("httpx") is not None:
        from ._httpx import HttpxTransport

        return HttpxTransport()
    from ._stdlib import StdlibTransport

    return StdlibTransport()


def __getattr__(name: str) -> object:
    if name == "FetchTransport":
        from ._fetch import FetchTransport

        return FetchTransport
    if name == "HttpxTransport":
        from ._httpx import HttpxTransport

        return HttpxTransport
    if name == "StdlibTransport":
        from ._stdlib import StdlibTransport

        return StdlibTransport
    raise AttributeError(name)
