"""Every CPython transport against a local HTTP server replaying recorded provider streams over real
sockets: streams, failures, timeouts, and full agent runs whose checkpoints round-trip."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from durable_agent import (
    InMemoryCheckpointStore,
    ModelCallError,
    Tool,
    Usage,
    deserialize_checkpoint,
    generate_text,
    serialize_checkpoint,
)
from durable_agent.providers import (
    HttpRequest,
    HttpTransport,
    HttpxTransport,
    OpenAIChatModel,
    StdlibTransport,
    Timeouts,
)
from replay import ReplayServer
from test_providers_replay import ADAPTERS, FAILURE_FIELDS, FAILURES, check_failure, collect

pytestmark = pytest.mark.host_only("runs an HTTP server on 127.0.0.1 and real sockets")

TRANSPORTS: dict[str, Callable[[], HttpTransport]] = {"stdlib": StdlibTransport, "httpx": HttpxTransport}


@pytest.fixture(params=sorted(TRANSPORTS))
def transport(request: Any) -> HttpTransport:
    return TRANSPORTS[request.param]()


@pytest.fixture(scope="module")
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as running:
        yield running


SUFFIXES = {"openai_chat": "/v1", "openai_responses": "/v1", "anthropic": ""}


def adapter(server: ReplayServer, transport: HttpTransport, api: str, *names: str, **options: Any) -> Any:
    """The `api` adapter replaying `names` from the server, through `transport`."""
    url = server.base_url(*(f"{api}/{n}" for n in names), suffix=SUFFIXES[api])
    return ADAPTERS[api](base_url=url, transport=transport, **options)


def chat(server: ReplayServer, transport: HttpTransport, *names: str, **options: Any) -> OpenAIChatModel:
    model: OpenAIChatModel = adapter(server, transport, "openai_chat", *names, **options)
    return model


async def test_chat_text_and_tool_calls_over_sockets(server: ReplayServer, transport: HttpTransport) -> None:
    events = await collect(chat(server, transport, "text"))
    assert "".join(e["text"] for e in events if e["type"] == "text-delta").endswith("42 € — both invoices are ready.")
    assert events[-1]["usage"] == Usage(96, 12, 108, cache_read_tokens=64)
    events = await collect(chat(server, transport, "tools"))
    assert [e["input"] for e in events if e["type"] == "tool-call"] == [{"id": "inv-7"}, {"id": "inv-8"}]


@pytest.mark.parametrize(FAILURE_FIELDS, FAILURES)
async def test_failures_over_sockets(server: ReplayServer, transport: HttpTransport, api: str, name: str, kind: str,
                                     status: int | None, retryable: bool, retry_after: int | None,
                                     context: bool, code: str | None) -> None:
    with pytest.raises(ModelCallError) as caught:
        await collect(adapter(server, transport, api, name))
    check_failure(caught.value, api, name, kind, status, retryable, retry_after, context, code)


async def test_the_httpx_transport_pools_per_loop_and_closes_its_client(server: ReplayServer) -> None:
    import httpx

    transport = HttpxTransport()
    for _ in range(2):  # the second call reuses the pooled client of this loop
        assert [e["type"] for e in await collect(chat(server, transport, "text"))][-1] == "finish"
    await transport.aclose()
    assert [e["type"] for e in await collect(chat(server, transport, "text"))][-1] == "finish"  # a new client
    mine = httpx.AsyncClient()
    await collect(chat(server, HttpxTransport(mine), "text"))
    assert not mine.is_closed  # a client you pass in is yours to close
    await mine.aclose()


async def test_a_model_without_a_transport_pools_its_connections_and_closes_them_on_exit() -> None:
    """Three calls of one model open one connection (not three), and `async with` closes it."""
    with ReplayServer() as own:
        async with OpenAIChatModel("m", base_url=own.base_url("openai_chat/text"), api_key="k") as model:
            for _ in range(3):
                assert [e["type"] for e in await collect(model)][-1] == "finish"
            assert (own.connections, own.open_connections) == (1, 1)
            copy = model.with_settings(temperature=0)  # a copy shares the pool
            assert [e["type"] for e in await collect(copy)][-1] == "finish" and own.connections == 1
        for _ in range(500):  # the server sees the client hang up
            if own.open_connections == 0:
                break
            await asyncio.sleep(0.01)
        assert own.open_connections == 0
        await model.aclose()  # closing twice is harmless


async def test_the_stdlib_transport_keeps_connections_alive_and_replaces_one_the_server_dropped() -> None:
    with ReplayServer() as own:
        transport = StdlibTransport()
        model = OpenAIChatModel("m", base_url=own.base_url("openai_chat/text"), api_key="k", transport=transport)
        for _ in range(3):
            assert [e["type"] for e in await collect(model)][-1] == "finish"
        assert own.connections == 1
        dropped = OpenAIChatModel("m", base_url=own.base_url("openai_chat/text_then_hang_up"), api_key="k",
                                  transport=transport)
        for _ in range(2):  # the first reuses the connection, which the server then drops; the second finds
            assert [e["type"] for e in await collect(dropped)][-1] == "finish"  # it dead: a fresh one, no error
        assert own.connections == 2
        await transport.aclose()
        for _ in range(500):  # the server sees the client hang up
            if own.open_connections == 0:
                break
            await asyncio.sleep(0.01)
        assert own.open_connections == 0


async def test_a_stalled_stream_is_a_retryable_read_timeout(server: ReplayServer, transport: HttpTransport) -> None:
    model = chat(server, transport, "stall", timeouts=Timeouts(connect=2, read=0.3, total=30))
    with pytest.raises(ModelCallError) as caught:
        await collect(model)
    assert (caught.value.kind, caught.value.retryable) == ("timeout", True)


async def test_a_refused_connection_is_a_retryable_connection_error(transport: HttpTransport) -> None:
    with socket.socket() as probe:  # a port nobody listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        model = OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", transport=transport,
                                timeouts=Timeouts(connect=2, read=2, total=5))
        with pytest.raises(ModelCallError) as caught:
            await collect(model)
    assert (caught.value.kind, caught.value.retryable) == ("connection", True)


def lookup_tools(seen: list[str]) -> dict[str, Tool]:
    def lookup(args: Any) -> Any:
        seen.append(args["id"])
        return {"id": args["id"], "amount": 42}

    return {"lookup": Tool(description="Find an invoice.", execute=lookup,
                           parameters={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]})}


async def run_agent(model: Any) -> tuple[Any, Any, list[str]]:
    seen: list[str] = []
    store = InMemoryCheckpointStore()
    result = await generate_text(model=model, tools=lookup_tools(seen), max_steps=5,
                                 messages=[{"role": "user", "content": "Pay invoices inv-7 and inv-8."}],
                                 store=store, run_id="run-1")
    checkpoint = store.load("run-1")
    assert checkpoint is not None
    assert deserialize_checkpoint(serialize_checkpoint(checkpoint)) == checkpoint
    return result, checkpoint, seen


async def test_a_full_agent_run_with_the_chat_adapter(server: ReplayServer, transport: HttpTransport) -> None:
    result, checkpoint, seen = await run_agent(chat(server, transport, "tools", "text"))
    assert result.finish_reason == "stop" and seen == ["inv-7", "inv-8"]
    assert result.text == "Invoice inv-7 is 42 € — both invoices are ready."
    assert result.total_usage == Usage(81 + 96, 46 + 12, 127 + 108, cache_read_tokens=64)
    assert checkpoint.status == "completed" and len(checkpoint.messages) == 4


async def test_a_full_agent_run_with_the_anthropic_adapter_sends_thinking_back(
    server: ReplayServer, transport: HttpTransport
) -> None:
    model = adapter(server, transport, "anthropic", "tools", "text")
    result, checkpoint, seen = await run_agent(model)
    assert result.finish_reason == "stop" and seen == ["inv-7", "inv-8"]
    assert result.text == "Invoice inv-7 is 42 € — both invoices are ready."
    assistant = checkpoint.messages[1]["content"]
    assert assistant[0] == {"type": "reasoning", "provider": "anthropic",
                            "text": "The user wants two invoices paid; I should look both up first.",
                            "metadata": {"signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"}}
    sent = server.requests_to(model.base_url)[1]["body"]["messages"][1]["content"]
    assert sent[0] == {"type": "thinking", "thinking": assistant[0]["text"],
                       "signature": assistant[0]["metadata"]["signature"]}
    assert [b["type"] for b in sent] == ["thinking", "text", "tool_use", "tool_use"]


async def test_a_full_agent_run_with_the_responses_adapter_sends_reasoning_back(
    server: ReplayServer, transport: HttpTransport
) -> None:
    model = adapter(server, transport, "openai_responses", "tools", "text")
    result, checkpoint, seen = await run_agent(model)
    assert result.finish_reason == "stop" and seen == ["inv-7", "inv-8"]
    assert result.total_usage == Usage(310 + 702, 190 + 19, 500 + 721, reasoning_tokens=128, cache_read_tokens=640)
    item = checkpoint.messages[1]["content"][0]["metadata"]["item"]
    sent = server.requests_to(model.base_url)[1]["body"]["input"]
    assert sent[1] == item and item["encrypted_content"].startswith("gAAAAAB")
    assert [i.get("type") for i in sent[2:]] == ["function_call", "function_call", "function_call_output",
                                                 "function_call_output"]


def test_the_real_model_example_runs_the_tour_against_an_openai_compatible_server(server: ReplayServer) -> None:
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "real_model.py"
    base = server.base_url("openai_chat/tools", "openai_chat/pay", "openai_chat/text")
    env = {"PATH": "/usr/bin:/bin", "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": base, "OPENAI_MODEL": "m"}
    done = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "needs approval: pay {'id': 'inv-7'}" in done.stdout
    assert "both invoices are ready. | paid: ['inv-7']" in done.stdout
    skipped = subprocess.run([sys.executable, str(example)], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin"})
    assert skipped.returncode == 0 and "SKIPPED" in skipped.stdout


async def test_the_stdlib_transport_reuses_a_connection_after_a_body_of_known_length() -> None:
    """A body sent with Content-Length (a JSON answer, an MCP server's) read to its end leaves http.client's
    response open: the next call on the pooled connection failed with ResponseNotReady until it is closed."""
    import http.server
    import threading

    connections: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            connections.append(1)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    transport = StdlibTransport()
    try:
        request = HttpRequest(f"http://127.0.0.1:{server.server_address[1]}/", {"content-type": "application/json"},
                              b"{}")
        for _ in range(3):
            response = await transport.handle_async_request(request)
            assert (response.status, b"".join([c async for c in response.stream])) == (200, b'{"ok": true}')
            await response.aclose()
        assert len(connections) == 1
    finally:
        await transport.aclose()
        server.shutdown()
        server.server_close()
