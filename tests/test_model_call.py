"""A journaled model step runs in its caller's task, its parts streamed as it puts them.

With a runtime, each model call of an `Agent`'s run is a step of the journal, driven inside the
caller's task (no task of its own per model step). These tests hold it to what a task would have
given, through `Agent.run`/`resume` and their `on_part`: the parts in order, a failure after the
parts before it, a cancellation reaching the model where it waits, a run that stops listening
closing the model's stream; and a step answered from its record gives the parts of its stored turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from durable_agent import (
    MODEL_CALL,
    Agent,
    AgentCheckpoint,
    DurableOptions,
    ModelRequest,
    StreamPart,
    StreamRefusal,
    StreamTextDelta,
    StreamToolCall,
    Tool,
    Usage,
    step_key,
)
from durable_agent.backends import DeferredSteps, RunTransition, StepRecord
from durable_agent.backends.memory import MemoryRuntime

SESSION = "s"
FINISH = {"type": "finish", "finish_reason": "stop", "usage": Usage(1, 2, 3)}


class Model:
    """A model whose call streams what `script()` yields; counts its calls."""

    model_id = "test"

    def __init__(self, script: Callable[[], AsyncIterator[Any]]) -> None:
        self.script = script
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        self.calls += 1
        async for event in self.script():
            yield event


def agent_on(runtime: MemoryRuntime, model: Any, **options: Any) -> Agent:
    return Agent(model=model, tools={"t": Tool(execute=lambda args: "ok")}, durable=DurableOptions(runtime),
                 session_id=SESSION, **options)


class Parts:
    """An `on_part` sink keeping the parts of the kinds a model step streams."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.parts: list[StreamPart] = []
        self.fail_on = fail_on

    async def __call__(self, run_id: str | None, part: StreamPart) -> None:
        if isinstance(part, StreamTextDelta | StreamToolCall | StreamRefusal):
            self.parts.append(part)
            if len(self.parts) == self.fail_on:
                raise LookupError("the listener went away")

    def texts(self) -> list[str]:
        return [p.text for p in self.parts if isinstance(p, StreamTextDelta)]


async def interrupted(runtime: MemoryRuntime, turn: dict[str, Any] | None, replay: str = "safe") -> None:
    """The session as a process left it that stopped right after its run's first model call: the call's record
    (done with `turn`, or pending when None) in the journal, the checkpoint before it, the run marked."""
    epoch = (await runtime.lease.claim(SESSION, stale_at=0)).epoch
    assert epoch is not None
    checkpoint = AgentCheckpoint(run_id="r", step_index=0, status="running", usage=Usage(), created_at=1,
                                 messages=[{"role": "user", "content": "hi"}])
    status = "pending" if turn is None else "done"
    record = StepRecord(SESSION, "r", step_key("r", 1, MODEL_CALL), "model", replay, status, None, turn)  # type: ignore[arg-type]
    await runtime.commit(RunTransition(SESSION, epoch, checkpoint=checkpoint, last_run="r", mark="r",
                                       deferred=DeferredSteps((record,))))
    await runtime.lease.release(SESSION, epoch)


async def stored_turn(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The record a live model call of `events` leaves in the journal (what a replay answers from)."""
    runtime = MemoryRuntime()

    async def script() -> AsyncIterator[Any]:
        for event in events:
            yield event

    model = Model(script)
    result = await agent_on(runtime, model, max_steps=1).run("hi")  # one model call: the turn under test
    (record,) = [r for r in await runtime.inspect.steps(result.run_id) if r.kind == "model"]
    assert record.status == "done" and isinstance(record.result, dict)
    return record.result


async def test_the_step_runs_in_the_callers_task_and_its_parts_come_in_order() -> None:
    tasks: list[asyncio.Task[Any] | None] = []

    async def script() -> AsyncIterator[Any]:
        tasks.append(asyncio.current_task())
        yield {"type": "text-delta", "text": "a"}
        yield {"type": "text-delta", "text": "b"}
        await asyncio.sleep(0)  # a bare yield to the loop
        yield {"type": "text-delta", "text": "c"}
        await asyncio.sleep(0.01)  # a future
        yield {"type": "text-delta", "text": "d"}
        yield FINISH

    parts = Parts()
    result = await agent_on(MemoryRuntime(), Model(script)).run("hi", on_part=parts)
    assert parts.texts() == ["a", "b", "c", "d"] and result.text == "abcd"
    assert tasks == [asyncio.current_task()]


async def test_a_replayed_step_yields_the_parts_of_its_stored_turn() -> None:
    turn = await stored_turn([{"type": "text-delta", "text": "hi"},
                              {"type": "tool-call", "tool_call_id": "c1", "tool_name": "t", "input": {}},
                              {"type": "finish", "finish_reason": "tool-calls", "usage": Usage(1, 2, 3)}])
    runtime = MemoryRuntime()
    await interrupted(runtime, turn)

    async def script() -> AsyncIterator[Any]:
        yield {"type": "text-delta", "text": "done"}
        yield FINISH

    model, parts = Model(script), Parts()
    result = await agent_on(runtime, model).resume(on_part=parts)
    assert result is not None and result.text == "done" and model.calls == 1  # the stored turn was not asked again
    assert [(type(p), p.step_index) for p in parts.parts] == [
        (StreamTextDelta, 1), (StreamToolCall, 1), (StreamTextDelta, 2)]
    text, call = parts.parts[0], parts.parts[1]
    assert isinstance(text, StreamTextDelta) and text.text == "hi"
    assert isinstance(call, StreamToolCall) and (call.tool_call_id, call.tool_name, call.input) == ("c1", "t", {})


async def test_a_replayed_refusal_comes_back_with_its_raw_finish_reason() -> None:
    turn = await stored_turn([{"type": "refusal", "text": "I can't."},
                              {"type": "finish", "finish_reason": "refusal", "raw_finish_reason": "stop",
                               "usage": Usage(1, 2, 3)}])
    assert turn.get("refusal") == "I can't."
    assert "refusal" not in await stored_turn([{"type": "text-delta", "text": "x"}, FINISH])  # only when there is one
    runtime = MemoryRuntime()
    await interrupted(runtime, turn)
    model, parts = Model(lambda: pytest.fail("the refusal is answered from its record")), Parts()
    result = await agent_on(runtime, model).resume(on_part=parts)
    assert result is not None and model.calls == 0
    assert [(type(p), getattr(p, "text", None)) for p in parts.parts] == [(StreamRefusal, "I can't.")]
    assert (result.finish_reason, result.raw_finish_reason, result.usage) == ("refusal", "stop", Usage(1, 2, 3))


async def test_a_failing_step_yields_the_parts_it_put_then_raises_its_error() -> None:
    async def script() -> AsyncIterator[Any]:
        yield {"type": "text-delta", "text": "a"}
        await asyncio.sleep(0)
        yield {"type": "text-delta", "text": "b"}
        raise ValueError("the provider hung up")

    parts = Parts()
    with pytest.raises(ValueError, match="hung up"):
        await agent_on(MemoryRuntime(), Model(script)).run("hi", on_part=parts)
    assert parts.texts() == ["a", "b"]


async def test_an_interrupted_model_step_is_refused() -> None:
    """A model call's record that started and never finished, as an unsafe step would leave it: a model step
    cannot be reported interrupted (it is replayed by running it again), so resuming it is an error."""
    runtime = MemoryRuntime()
    await interrupted(runtime, None, replay="unsafe")
    model = Model(lambda: pytest.fail("an interrupted model step is not run again"))
    with pytest.raises(RuntimeError, match="cannot be interrupted"):
        await agent_on(runtime, model).resume()


async def test_cancelling_the_caller_reaches_the_step_where_it_waits() -> None:
    waiting, cleaned = asyncio.Event(), asyncio.Event()

    async def script() -> AsyncIterator[Any]:
        waiting.set()
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0)  # a step may still await while it cleans up
            cleaned.set()
        yield FINISH

    caller = asyncio.ensure_future(agent_on(MemoryRuntime(), Model(script)).run("hi"))
    await waiting.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert cleaned.is_set()
