"""`durability.drain`: a journaled model step runs in its caller's task, its parts streamed as it puts them.

The step is a coroutine driven inside the caller's task (no task of its own per model step);
these tests hold it to what a task would have given: the parts in order, a failure after the
parts before it, a cancellation reaching the step where it waits, an early stop closing it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest

from durable_agent import StreamRefusal, StreamTextDelta, StreamToolCall, Usage
from durable_agent._durability import drain
from durable_agent._model_call import ModelTurn
from durable_agent.backends import StepCompleted, StepInterrupted


async def collected(parts: deque[Any], step: Any, turn: ModelTurn | None = None) -> list[Any]:
    return [part async for part in drain(parts, step, turn or ModelTurn())]


async def test_the_step_runs_in_the_callers_task_and_its_parts_come_in_order() -> None:
    parts: deque[Any] = deque()
    tasks: list[asyncio.Task[Any] | None] = []

    async def step() -> StepCompleted:
        tasks.append(asyncio.current_task())
        parts.extend(["a", "b"])
        await asyncio.sleep(0)  # a bare yield to the loop
        parts.append("c")
        await asyncio.sleep(0.01)  # a future
        parts.append("d")
        return StepCompleted("value", replayed=False)

    assert await collected(parts, step()) == ["a", "b", "c", "d"]
    assert tasks == [asyncio.current_task()]


async def test_a_replayed_step_yields_the_parts_of_its_stored_turn() -> None:
    stored = {"text": "hi", "tool_calls": [{"tool_call_id": "c1", "tool_name": "t", "input": {}}],
              "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}, "finish_reason": "tool-calls"}

    async def step() -> StepCompleted:
        return StepCompleted(stored, replayed=True)

    turn = ModelTurn()
    assert await collected(deque(), step(), turn) == [
        StreamTextDelta(step_index=0, text="hi"), StreamToolCall(step_index=0, tool_call_id="c1", tool_name="t", input={})]
    assert turn.text == "hi" and turn.finish_reason == "tool-calls"


async def test_a_replayed_refusal_comes_back_with_its_raw_finish_reason() -> None:
    live = ModelTurn(usage=Usage(1, 2, 3), finish_reason="refusal", refusal="I can't.", raw_finish_reason="stop")
    stored = live.to_json()

    async def step() -> StepCompleted:
        return StepCompleted(stored, replayed=True)

    turn = ModelTurn()
    assert await collected(deque(), step(), turn) == [StreamRefusal(step_index=0, text="I can't.")]
    assert (turn.refusal, turn.finish_reason, turn.raw_finish_reason, turn.usage) == (
        "I can't.", "refusal", "stop", Usage(1, 2, 3))
    assert "refusal" not in ModelTurn().to_json()  # stored only when there is one


async def test_a_failing_step_yields_the_parts_it_put_then_raises_its_error() -> None:
    parts: deque[Any] = deque()
    seen: list[Any] = []

    async def step() -> StepCompleted:
        parts.append("a")
        await asyncio.sleep(0)
        parts.append("b")
        raise ValueError("the provider hung up")

    with pytest.raises(ValueError, match="hung up"):
        async for part in drain(parts, step(), ModelTurn()):
            seen.append(part)
    assert seen == ["a", "b"]


async def test_an_interrupted_model_step_is_refused() -> None:
    async def step() -> StepInterrupted:
        return StepInterrupted()

    with pytest.raises(RuntimeError, match="cannot be interrupted"):
        await collected(deque(), step())


async def test_cancelling_the_caller_reaches_the_step_where_it_waits() -> None:
    waiting, cleaned = asyncio.Event(), asyncio.Event()

    async def step() -> StepCompleted:
        waiting.set()
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0)  # a step may still await while it cleans up
            cleaned.set()
        return StepCompleted(None, replayed=False)

    caller = asyncio.ensure_future(collected(deque(), step()))
    await waiting.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert cleaned.is_set()


async def test_a_caller_that_stops_iterating_closes_the_step() -> None:
    parts: deque[Any] = deque()
    closed = []

    async def step() -> StepCompleted:
        try:
            parts.append("a")
            await asyncio.sleep(0)
            parts.append("b")
            await asyncio.sleep(0)
            return StepCompleted(None, replayed=False)
        finally:
            closed.append(True)

    stream: Any = drain(parts, step(), ModelTurn())
    assert await stream.__anext__() == "a"
    await stream.aclose()
    assert closed == [True]
