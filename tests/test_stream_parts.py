"""Stream parts are typed and placed: every part says its step and its model call attempt."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from durable_agent import (
    InMemoryCheckpointStore,
    ModelCallError,
    ModelRequest,
    RetryPolicy,
    ScriptedModel,
    ScriptedResponse,
    StreamError,
    StreamPart,
    StreamStepRetry,
    StreamTextDelta,
    StreamToolApprovalRequest,
    Tool,
    ToolApprovalResponse,
    Usage,
    call,
    reply,
    resume_stream_from_checkpoint,
    stream_chat,
)

FAST = RetryPolicy(attempts=3, initial_delay_ms=1, max_delay_ms=1, jitter=False)


class FailsOnceThenCalls:
    """Step 0: streams text and fails, then asks for the `echo` tool. Step 1: answers."""

    model_id = "fails-once"

    def __init__(self) -> None:
        self.calls = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        self.calls += 1
        if self.calls == 1:
            yield {"type": "text-delta", "text": "half"}
            raise ModelCallError("overloaded", provider="test", kind="overloaded", retryable=True, status=529)
        if self.calls == 2:
            yield {"type": "text-delta", "text": "calling"}
            yield {"type": "tool-call", "tool_call_id": "c1", "tool_name": "echo", "input": {"x": 1}}
            yield {"type": "finish", "finish_reason": "tool-calls", "usage": Usage(1, 1, 2)}
            return
        yield {"type": "text-delta", "text": "done"}
        yield {"type": "finish", "finish_reason": "stop", "usage": Usage(1, 1, 2)}


def placed(parts: list[StreamPart]) -> list[tuple[str, int, int]]:
    return [(p.type, p.step_index, p.attempt) for p in parts]


async def test_every_part_carries_its_step_and_the_attempt_of_its_model_call() -> None:
    streamed = stream_chat(model=FailsOnceThenCalls(), messages=[{"role": "user", "content": "go"}], retry=FAST,
                           tools={"echo": Tool(execute=lambda args: args)})
    parts = [p async for p in streamed.full_stream]
    assert placed(parts) == [
        ("step-start", 0, 0), ("text-delta", 0, 0), ("step-retry", 0, 0),  # the retry names the attempt that failed
        ("text-delta", 0, 1), ("tool-call", 0, 1), ("tool-result", 0, 1), ("step-finish", 0, 1),
        ("step-start", 1, 0), ("text-delta", 1, 0), ("step-finish", 1, 0), ("finish", 1, 0),
    ]
    retry = parts[2]
    assert isinstance(retry, StreamStepRetry) and isinstance(retry.error, ModelCallError) and retry.delay_ms == 1
    assert [p.text for p in parts if isinstance(p, StreamTextDelta)] == ["half", "calling", "done"]


async def test_a_settle_phase_is_attempt_0_of_its_own_step_and_an_approval_is_placed_where_it_was_asked() -> None:
    store = InMemoryCheckpointStore()
    tools = {"pay": Tool(execute=lambda _: "paid", needs_approval=True)}
    script: list[ScriptedResponse | str] = [reply("", call("pay", {})), "paid it"]
    first = stream_chat(model=ScriptedModel(script), messages=[{"role": "user", "content": "pay"}], tools=tools,
                        store=store, run_id="r", generate_id=lambda: "ap")
    parts = [p async for p in first.full_stream]
    assert placed(parts)[-3:] == [("tool-approval-request", 0, 0), ("step-finish", 0, 0), ("finish", 0, 0)]
    stored = store.load("r")
    assert stored is not None and stored.pending_approvals is not None
    assert isinstance(parts[-3], StreamToolApprovalRequest) and parts[-3].request == stored.pending_approvals[0]
    second = resume_stream_from_checkpoint(store, "r", model=ScriptedModel(script), tools=tools,
                                           approval_responses=[ToolApprovalResponse("ap", True)])
    assert list(dict.fromkeys(placed([p async for p in second.full_stream]))) == [  # the text comes in deltas
        ("tool-result", 1, 0), ("step-start", 2, 0), ("text-delta", 2, 0), ("step-finish", 2, 0), ("finish", 2, 0)]


async def test_a_failure_is_an_error_part_placed_at_the_step_it_ended() -> None:
    class Broken:
        model_id = "broken"

        async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
            raise ValueError("no")
            yield  # pragma: no cover - makes this an async generator

    parts = [p async for p in stream_chat(model=Broken(), messages=[{"role": "user", "content": "x"}]).full_stream]
    assert placed(parts) == [("step-start", 0, 0), ("error", 0, 0)]
    assert isinstance(parts[-1], StreamError) and isinstance(parts[-1].error, ValueError)


def test_a_part_is_frozen_and_its_dict_has_its_fields_type_first() -> None:
    part = StreamTextDelta(step_index=2, attempt=1, text="hi")
    with pytest.raises(dataclasses.FrozenInstanceError):
        part.text = "changed"  # type: ignore[misc]
    assert list(part.to_dict().items()) == [("type", "text-delta"), ("step_index", 2), ("attempt", 1), ("text", "hi")]
    with pytest.raises(TypeError):
        StreamTextDelta(step_index=0, text="x", type="error")  # type: ignore[call-arg]
