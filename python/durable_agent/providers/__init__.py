"""Model adapters for real providers, one module per wire API.

* `OpenAIChatModel` (`openai_chat`) — Chat Completions; also every OpenAI-compatible server
  and Azure OpenAI.
* `OpenAIResponsesModel` (`openai_responses`) — OpenAI's Responses API.
* `AnthropicModel` (`anthropic`) — Anthropic's Messages API.

Building requests and parsing the streams is pure standard library; the HTTP call goes
through a transport (`durable_agent._transport`): httpx when installed, the standard
library otherwise, JS fetch under Pyodide and in Workers. Failures raise `ModelCallError`.
"""

from __future__ import annotations

from .._transport import HttpTransport, Timeouts
from ._base import HttpModel, ModelSettings
from .anthropic import AnthropicModel
from .openai_chat import OpenAIChatModel
from .openai_responses import OpenAIResponsesModel

__all__ = ["AnthropicModel", "HttpModel", "HttpTransport", "ModelSettings", "OpenAIChatModel", "OpenAIResponsesModel", "Timeouts"]
