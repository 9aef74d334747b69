"""Model adapters for real providers, one module per wire API.

* `OpenAIChatModel` (`openai_chat`) — Chat Completions; also every OpenAI-compatible server
  and Azure OpenAI.
* `OpenAIResponsesModel` (`openai_responses`) — OpenAI's Responses API.
* `AnthropicModel` (`anthropic`) — Anthropic's Messages API.

Building requests and parsing the streams is pure standard library; the HTTP call goes
through a transport (`HttpTransport`, one method): `HttpxTransport` (httpx, when installed),
`StdlibTransport` (standard library, CPython), `FetchTransport` (JS fetch under Pyodide and in
Workers); `default_transport()` picks one. Failures raise `ModelCallError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._models import ModelSettings
from .._transport import HttpRequest, HttpResponse, HttpTransport, Timeouts, default_transport
from ._anthropic import AnthropicModel
from ._base import HttpModel
from ._openai_chat import OpenAIChatModel
from ._openai_responses import OpenAIResponsesModel

if TYPE_CHECKING:
    from .._transport import FetchTransport, HttpxTransport, StdlibTransport

__all__ = [
    "AnthropicModel",
    "FetchTransport",
    "HttpModel",
    "HttpRequest",
    "HttpResponse",
    "HttpTransport",
    "HttpxTransport",
    "ModelSettings",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "StdlibTransport",
    "Timeouts",
    "default_transport",
]


def __getattr__(name: str) -> object:
    """The transports are imported on first use (httpx's, the stdlib one's ssl, Pyodide's js)."""
    if name in ("FetchTransport", "HttpxTransport", "StdlibTransport"):
        from .. import _transport

        return getattr(_transport, name)
    raise AttributeError(name)
