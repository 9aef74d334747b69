"""Provider connection pooling: agent steps over a real local HTTP server, one pooled client per
model against a new client per call (what a model without ``transport=`` did before it kept one).

Each variant runs `CALLS` one-step `generate_text` calls through `OpenAIChatModel` against a
threaded HTTP server on 127.0.0.1 replaying a recorded Chat Completions stream
(tests/replay.py), and counts the TCP connections the server accepted. Rows:

* ``pooled (default)`` — one model without ``transport=``: its own `HttpxTransport`, one pool;
* ``client per call`` — a fresh `HttpxTransport` (a fresh ``httpx.AsyncClient``) for every call,
  never closed: the old default;
* ``stdlib (pooled)`` — one `StdlibTransport` (the default without httpx), keeping its connections alive;
* ``stdlib per call`` — a fresh `StdlibTransport` for every call (what it did before it kept them).

Plain HTTP on loopback, so the gap is the cost of a TCP connect and a client; against a real
provider each new connection also pays a TLS handshake (one or two round trips, tens of ms).

Run: ``.venv/bin/python benches/bench_pooling.py``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))

from durable_agent import generate_text  # noqa: E402
from durable_agent._transport import HttpxTransport, StdlibTransport  # noqa: E402
from durable_agent.providers import OpenAIChatModel  # noqa: E402
from replay import ReplayServer  # noqa: E402

CALLS = 100
REPEATS = 3
ASK: Any = [{"role": "user", "content": "Is inv-7 ready?"}]


async def steps(server: ReplayServer, model_for_call: Callable[[str], OpenAIChatModel]) -> tuple[int, float]:
    """(connections the server accepted, seconds) for `CALLS` one-step runs."""
    url = server.base_url("openai_chat/text")
    before = server.connections
    start = time.perf_counter()
    for _ in range(CALLS):
        result = await generate_text(model=model_for_call(url), messages=ASK)
        assert result.text.endswith("ready.")
    return server.connections - before, time.perf_counter() - start


async def pooled(server: ReplayServer) -> tuple[int, float]:
    holder: dict[str, OpenAIChatModel] = {}

    def one_model(url: str) -> OpenAIChatModel:
        return holder.setdefault(url, OpenAIChatModel("m", base_url=url, api_key="k"))

    try:
        return await steps(server, one_model)
    finally:
        for model in holder.values():
            await model.aclose()


async def client_per_call(server: ReplayServer) -> tuple[int, float]:
    return await steps(server, lambda url: OpenAIChatModel("m", base_url=url, api_key="k",
                                                           transport=HttpxTransport()))


async def stdlib(server: ReplayServer) -> tuple[int, float]:
    transport = StdlibTransport()
    try:
        return await steps(server, lambda url: OpenAIChatModel("m", base_url=url, api_key="k", transport=transport))
    finally:
        await transport.aclose()


async def stdlib_per_call(server: ReplayServer) -> tuple[int, float]:
    return await steps(server, lambda url: OpenAIChatModel("m", base_url=url, api_key="k",
                                                           transport=StdlibTransport()))


async def main() -> None:
    variants = {"pooled (default)": pooled, "client per call": client_per_call, "stdlib (pooled)": stdlib,
                "stdlib per call": stdlib_per_call}
    with ReplayServer() as server:
        rows: dict[str, tuple[int, float]] = {}
        for name, run in variants.items():
            rows[name] = min([await run(server) for _ in range(REPEATS)], key=lambda r: r[1])
    base = rows["pooled (default)"][1]
    print(f"{CALLS} one-step generate_text calls over 127.0.0.1 (best of {REPEATS})")
    print(f"{'variant':<18} {'connections':>11} {'ms/call':>9} {'vs pooled':>10}")
    for name, (connections, seconds) in rows.items():
        print(f"{name:<18} {connections:>11} {seconds / CALLS * 1000:9.3f} {seconds / base:9.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
