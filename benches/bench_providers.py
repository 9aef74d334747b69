"""Model adapters: parse cost per streamed chunk of recorded provider streams, ours against the
official ``openai`` and ``anthropic`` SDKs, measured side by side in one process.

Every side streams the same bytes (tests/recordings/*/<name>.http), one chunk per server-sent
event, from memory (no sockets), so the figures are the client's own cost: building the
request, the HTTP client's response pipeline, SSE parsing, JSON decoding and the adapter's
work per event. Rows:

* ``ours (memory)`` — our adapter over an in-memory transport (the floor of our stack);
* ``ours (httpx)`` — our adapter over `HttpxTransport` with an ``httpx.MockTransport``: the HTTP
  client the SDKs use (recent SDK releases use its ``httpx2`` fork; the header says which), so
  this row against the SDK rows compares like with like;
* ``sdk`` — ``openai.AsyncOpenAI`` / ``anthropic.AsyncAnthropic`` ``create(..., stream=True)``
  iterated to the end over a ``MockTransport`` of their HTTP client (typed event objects, no
  accumulation: the SDK's lightest streaming path).

Then one full tool-call turn (request built, the stream parsed, tool calls assembled) of our
adapter, as a share of a 20 ms model latency.

Run: ``.venv/bin/python benches/bench_providers.py`` (needs ``pip install openai anthropic httpx``,
see benches/requirements.txt).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))

import anthropic  # noqa: E402
import httpx  # noqa: E402
import openai  # noqa: E402

from durable_agent import ModelRequest, ToolSpec  # noqa: E402
from durable_agent._transport import HttpRequest, HttpResponse, HttpxTransport  # noqa: E402
from durable_agent.providers import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel  # noqa: E402
from replay import Recording, load  # noqa: E402

REPEATS = 7
LATENCY_MS = 20.0
LOOKUP = ToolSpec("lookup", "Find an invoice.", {"type": "object", "properties": {"id": {"type": "string"}}})
REQUEST = ModelRequest(messages=({"role": "user", "content": "Pay invoices inv-7 and inv-8."},), tools=(LOOKUP,))
SDK_TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Find an invoice.",
                                               "parameters": dict(LOOKUP.parameters)}}]


def events_of(recording: Recording) -> list[bytes]:
    """The body split after every event: one network chunk per server-sent event."""
    parts = recording.body.split(b"\n\n")
    return [p + b"\n\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


class MemoryTransport:
    def __init__(self, recording: Recording) -> None:
        self.recording, self.chunks = recording, events_of(recording)

    async def handle_async_request(self, request: HttpRequest) -> HttpResponse:
        async def stream() -> AsyncIterator[bytes]:
            for chunk in self.chunks:
                yield chunk

        async def aclose() -> None:
            return None

        return HttpResponse(self.recording.status, self.recording.headers, stream(), aclose)


def mock_http(recording: Recording, http: Any = httpx) -> Any:
    """An AsyncClient of the `http` module (httpx, or the fork an SDK pins) answering from memory."""
    chunks = events_of(recording)

    class Body(http.AsyncByteStream):  # type: ignore[name-defined, misc]
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

    def handler(request: Any) -> Any:
        return http.Response(recording.status, headers=recording.headers, stream=Body())

    return http.AsyncClient(transport=http.MockTransport(handler))


def sdk_http_module(sdk: Any) -> Any:
    """The HTTP client module the SDK is built on (httpx; recent SDK releases are built on the httpx2 fork)."""
    base = sdk._base_client
    return getattr(base, "httpx2", None) or base.httpx


async def drain(stream: Any) -> None:
    async for _ in stream:
        pass


def ours(cls: Any, model: str, transport: Any) -> Callable[[], Awaitable[None]]:
    adapter = cls(model, base_url="https://llm.test/v1", api_key="k", transport=transport)
    return lambda: drain(adapter.stream(REQUEST))


def sdk_chat(client: openai.AsyncOpenAI) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        stream = await client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}],
                                                      tools=SDK_TOOLS, stream=True,  # type: ignore[arg-type]
                                                      stream_options={"include_usage": True})
        await drain(stream)

    return run


def sdk_responses(client: openai.AsyncOpenAI) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        stream = await client.responses.create(model="o4-mini", input="x", stream=True, store=False)
        await drain(stream)

    return run


def sdk_anthropic(client: anthropic.AsyncAnthropic) -> Callable[[], Awaitable[None]]:
    async def run() -> None:
        stream = await client.messages.create(model="claude-sonnet-5-5", max_tokens=1024, stream=True,
                                              messages=[{"role": "user", "content": "x"}])
        await drain(stream)

    return run


async def best_us(run: Callable[[], Awaitable[None]], rounds: int) -> float:
    """Best of REPEATS batches of `rounds` calls, in microseconds per call."""
    for _ in range(max(1, rounds // 10)):
        await run()  # warm up (imports, caches, pydantic validators)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(rounds):
            await run()
        best = min(best, (time.perf_counter() - start) / rounds)
    return best * 1e6


CASES = [
    ("openai_chat", "tools", OpenAIChatModel, "gpt-4o-mini"),
    ("openai_chat", "text", OpenAIChatModel, "gpt-4o-mini"),
    ("openai_responses", "tools", OpenAIResponsesModel, "o4-mini"),
    ("openai_responses", "text", OpenAIResponsesModel, "o4-mini"),
    ("anthropic", "tools", AnthropicModel, "claude-sonnet-5-5"),
    ("anthropic", "text", AnthropicModel, "claude-sonnet-5-5"),
]


def sdk_for(api: str, recording: Recording) -> Callable[[], Awaitable[None]]:
    if api == "anthropic":
        return sdk_anthropic(anthropic.AsyncAnthropic(api_key="k", base_url="https://llm.test",
                                                      http_client=mock_http(recording, sdk_http_module(anthropic)),
                                                      max_retries=0))
    client = openai.AsyncOpenAI(api_key="k", base_url="https://llm.test/v1",
                                http_client=mock_http(recording, sdk_http_module(openai)),
                                max_retries=0)
    return sdk_chat(client) if api == "openai_chat" else sdk_responses(client)


async def main() -> None:
    print(f"python {sys.version.split()[0]}, openai {openai.__version__} (on {sdk_http_module(openai).__name__}), "
          f"anthropic {anthropic.__version__} (on {sdk_http_module(anthropic).__name__}), httpx {httpx.__version__}; "
          f"one chunk per event; best of {REPEATS}")
    print(f"{'recording':<24} {'events':>6} {'ours mem µs/chunk':>18} {'ours httpx':>11} {'sdk':>9} "
          f"{'sdk/ours(httpx)':>16} {'sdk/ours(mem)':>14}")
    for api, name, cls, model in CASES:
        recording = load(f"{api}/{name}")
        n = len(events_of(recording))
        mem = await best_us(ours(cls, model, MemoryTransport(recording)), 200) / n
        via_httpx = await best_us(ours(cls, model, HttpxTransport(mock_http(recording))), 100) / n
        sdk = await best_us(sdk_for(api, recording), 100) / n
        print(f"{api + '/' + name:<24} {n:>6} {mem:>18.2f} {via_httpx:>11.2f} {sdk:>9.2f} "
              f"{sdk / via_httpx:>15.2f}x {sdk / mem:>13.2f}x")
    print()
    for api, _, cls, model in CASES[::2]:
        recording = load(f"{api}/tools")
        turn = await best_us(ours(cls, model, MemoryTransport(recording)), 200)
        print(f"{api:<18} full tool-call turn (2 parallel calls, {len(events_of(recording))} events): "
              f"{turn:8.1f} µs = {turn / 1000 / LATENCY_MS * 100:.2f}% of a {LATENCY_MS:.0f} ms model latency")


if __name__ == "__main__":
    asyncio.run(main())
