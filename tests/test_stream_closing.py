"""A model's stream is closed as soon as the run stops reading it, not whenever the garbage collector gets to it.

With a real adapter the stream is an HTTP response: left open, it holds a connection (and the provider keeps
generating, billed) until the process ends. So when the run ends early while a step streams (an `on_part`
listener that raises, a consumer of `stream_chat`'s stream that stops, the run's task cancelled), the model's stream has
run its `finally` by the time the run has returned or raised: plain runs and durable ones (whose step streams
through the journal).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from durable_agent import Agent, DurableOptions, ModelRequest, StreamPart, StreamTextDelta, Usage, stream_chat
from durable_agent.backends.memory import MemoryRuntime

FINISH = {"type": "finish", "finish_reason": "stop", "usage": Usage(1, 2, 3)}


class Streaming:
    """A model streaming three text deltas (the second after a pause) then a finish; `closed` counts the streams
    that ran their `finally`, `opened` those started. `cleanup_awaits`: its `finally` awaits (as an adapter's
    closing of its HTTP response may) before it counts."""

    model_id = "test"

    def __init__(self, *, cleanup_awaits: bool = False) -> None:
        self.opened = 0
        self.closed = 0
        self.paused = asyncio.Event()
        self.cleanup_awaits = cleanup_awaits

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        self.opened += 1
        try:
            yield {"type": "text-delta", "text": "a"}
            self.paused.set()
            await asyncio.sleep(0.05)
            yield {"type": "text-delta", "text": "b"}
            yield {"type": "text-delta", "text": "c"}
            yield FINISH
        finally:
            if self.cleanup_awaits:
                await asyncio.sleep(0)
            self.closed += 1


Runs = Callable[[Streaming], Agent]
AGENTS: dict[str, Runs] = {
    "plain": lambda model: Agent(model=model),
    "durable": lambda model: Agent(model=model, durable=DurableOptions(MemoryRuntime()), session_id="s"),
}


def failing_on_delta(n: int) -> Callable[[str | None, StreamPart], Any]:
    seen: list[str] = []

    async def on_part(run_id: str | None, part: StreamPart) -> None:
        if isinstance(part, StreamTextDelta):
            seen.append(part.text)
            if len(seen) == n:
                raise LookupError("the listener went away")

    return on_part


@pytest.mark.parametrize("cleanup_awaits", [False, True], ids=["cleanup", "cleanup-that-awaits"])
@pytest.mark.parametrize("delta", [1, 2], ids=["while-the-model-waits", "after-its-pause"])
@pytest.mark.parametrize("make", list(AGENTS.values()), ids=list(AGENTS))
async def test_a_listener_that_raises_closes_the_model_stream(
    make: Runs, delta: int, cleanup_awaits: bool,
) -> None:
    """The listener's own error comes out, whatever the model's stream was doing (on the first delta it is
    waiting in its pause) and whatever its cleanup awaits."""
    model = Streaming(cleanup_awaits=cleanup_awaits)
    with pytest.raises(LookupError):
        await make(model).run("hi", on_part=failing_on_delta(delta))
    assert (model.opened, model.closed) == (1, 1)


async def test_a_consumer_that_stops_reading_closes_the_model_stream() -> None:
    model = Streaming()
    stream = stream_chat(model=model, messages=[{"role": "user", "content": "hi"}]).full_stream
    async for part in stream:
        if isinstance(part, StreamTextDelta):
            break
    await stream.aclose()  # type: ignore[attr-defined]  # what an `async with aclosing(...)` does
    assert (model.opened, model.closed) == (1, 1)


@pytest.mark.parametrize("make", list(AGENTS.values()), ids=list(AGENTS))
async def test_a_cancelled_run_closes_the_model_stream(make: Runs) -> None:
    model = Streaming()
    task = asyncio.ensure_future(make(model).run("hi"))
    await model.paused.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (model.opened, model.closed) == (1, 1)


@pytest.mark.parametrize("cleanup_awaits", [False, True], ids=["cleanup", "cleanup-that-awaits"])
async def test_a_listener_that_raises_after_the_models_last_part_keeps_the_paid_call(cleanup_awaits: bool) -> None:
    """The model call had put all it had when the listener failed: its record is kept, so resuming the session
    answers from it instead of paying for the call again (and the history holds its answer once, not also as an
    aborted turn)."""
    model = Streaming(cleanup_awaits=cleanup_awaits)
    agent = AGENTS["durable"](model)
    with pytest.raises(LookupError):
        await agent.run("hi", on_part=failing_on_delta(3))
    resumed = await agent.resume()
    assert resumed is not None and resumed.text == "abc"
    assert [m["role"] for m in resumed.messages] == ["user", "assistant"]
    assert (model.opened, model.closed) == (1, 1)
