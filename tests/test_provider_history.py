"""What real providers add to a history — reasoning parts with opaque metadata, images and files in
user and tool messages — is kept by the loop and round-trips through the checkpoint codec."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import pytest

from durable_agent import (
    Agent,
    AgentCheckpoint,
    DurableOptions,
    InMemoryCheckpointStore,
    ModelRequest,
    RunSuspendedError,
    Tool,
    Usage,
    deserialize_checkpoint,
    generate_text,
    serialize_checkpoint,
)
from durable_agent.backends.memory import MemoryDurableState, MemoryRuntime

THINKING = {"type": "reasoning", "text": "Both invoices first.", "provider": "anthropic",
            "metadata": {"signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxB"}}
RESPONSES_ITEM = {"type": "reasoning", "text": "", "provider": "openai-responses",
                  "metadata": {"item": {"id": "rs_1", "type": "reasoning", "summary": [],
                                        "encrypted_content": "gAAAAABpK3xQ=="}}}
HISTORY: list[Any] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "What is in these?"},
                                 {"type": "image", "data": b"\x89PNG\r\n\x1a\n\x00", "media_type": "image/png"},
                                 {"type": "file", "data": b"%PDF-1.7\n\xff", "media_type": "application/pdf",
                                  "filename": "invoice.pdf"}]},
    {"role": "assistant", "content": [THINKING, RESPONSES_ITEM,
                                      {"type": "reasoning", "text": "", "provider": "anthropic",
                                       "metadata": {"redacted_data": "EmwKAhgB", "$bytes": "not a tag here"}},
                                      {"type": "tool-call", "tool_call_id": "c1", "tool_name": "shot", "input": {}}]},
    {"role": "tool", "content": [{"type": "tool-result", "tool_call_id": "c1", "tool_name": "shot", "output": "ok",
                                  "is_error": False,
                                  "attachments": [{"type": "image", "data": bytes(range(256)), "media_type": "image/gif"}]}]},
]


def test_reasoning_parts_images_files_and_attachments_round_trip(kernels: ModuleType) -> None:
    checkpoint = AgentCheckpoint(run_id="r", step_index=1, status="running", messages=HISTORY,
                                 usage=Usage(10, 5, 15, reasoning_tokens=3, cache_read_tokens=4, cache_write_tokens=2),
                                 created_at=1)
    text = kernels.encode(checkpoint.to_dict())
    assert kernels.decode(text) == checkpoint.to_dict()
    assert deserialize_checkpoint(serialize_checkpoint(checkpoint)) == checkpoint


def test_usage_details_are_stored_only_when_set_and_old_usage_still_loads() -> None:
    assert Usage(1, 2, 3).to_dict() == {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}
    assert Usage.from_dict({"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}) == Usage(1, 2, 3)
    detailed = Usage(1, 2, 3, reasoning_tokens=1, cache_write_tokens=7)
    assert detailed.to_dict() == {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3, "reasoning_tokens": 1,
                                  "cache_write_tokens": 7}  # the zero detail is left out
    assert Usage.from_dict(detailed.to_dict()) == detailed
    assert detailed + detailed == Usage(2, 4, 6, reasoning_tokens=2, cache_write_tokens=14)


class ThinkingModel:
    """Thinks, calls `shot`, then answers; counts its requests."""

    model_id = "thinking"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        self.requests.append(request)
        if not any(m["role"] == "assistant" for m in request.messages):
            yield {"type": "reasoning", **{k: THINKING[k] for k in ("text", "provider", "metadata")}}
            yield {"type": "text-delta", "text": "Taking a look."}
            yield {"type": "tool-call", "tool_call_id": "c1", "tool_name": "shot", "input": {}}
            yield {"type": "finish", "finish_reason": "tool-calls", "usage": Usage(5, 5, 10, reasoning_tokens=4)}
        else:
            yield {"type": "text-delta", "text": "Done."}
            yield {"type": "finish", "finish_reason": "stop", "usage": Usage(9, 1, 10)}


async def test_the_loop_keeps_reasoning_first_in_the_assistant_message() -> None:
    store = InMemoryCheckpointStore()
    model = ThinkingModel()
    result = await generate_text(model=model, tools={"shot": Tool(execute=lambda a: "ok")},
                                 messages=[{"role": "user", "content": "go"}], store=store, run_id="r1")
    assert result.text == "Done." and result.total_usage.reasoning_tokens == 4
    assert result.messages[1]["content"][:2] == [THINKING, {"type": "text", "text": "Taking a look."}]
    assert model.requests[1].messages[1] == result.messages[1]  # sent back as it was received
    stored = store.load("r1")
    assert stored is not None and deserialize_checkpoint(serialize_checkpoint(stored)) == stored


class Crash(RunSuspendedError):
    """The process dies here: a control error, so nothing records it."""


async def test_a_replayed_model_step_keeps_its_reasoning() -> None:
    state = MemoryDurableState()
    model = ThinkingModel()
    died = [False]

    def shot(args: Any) -> str:
        if not died[0]:
            died[0] = True
            raise Crash()
        return "ok"

    def agent() -> Agent:
        return Agent(model=model, tools={"shot": Tool(execute=shot, replay="safe")},
                     durable=DurableOptions(MemoryRuntime(state=state)), session_id="s1")

    with pytest.raises(Crash):
        await agent().run("go")
    resumed = await agent().resume()
    assert resumed is not None and resumed.text == "Done."
    assert len(model.requests) == 2  # the first model call was answered from its record...
    assert resumed.messages[1]["content"][0] == THINKING  # ...reasoning included
