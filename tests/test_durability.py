"""Checkpoints at step boundaries, best-effort saves, immutable history, and resume semantics."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_kit import FailingStore, Ledger, add_tool, tool_results, user
from durable_agent import (
    CHECKPOINT_VERSION,
    AgentCheckpoint,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    ConfigurationError,
    InMemoryCheckpointStore,
    Message,
    RunExistsError,
    ScriptedModel,
    ScriptedResponse,
    StreamError,
    StreamToolResult,
    Tool,
    ToolApprovalResponse,
    Usage,
    call,
    checkpoint_at_step,
    content_parts,
    deserialize_checkpoint,
    generate_text,
    reply,
    resume_from_checkpoint,
    resume_stream_from_checkpoint,
    serialize_checkpoint,
    stream_chat,
    total_tokens_exceed,
)


class RecordingStore(InMemoryCheckpointStore):
    """Keeps every saved checkpoint and a deep copy of its messages taken at save time."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: list[AgentCheckpoint] = []
        self.snapshots: list[Any] = []

    def save(self, checkpoint: AgentCheckpoint, *, expected_step_index: int | None = None) -> None:
        self.saved.append(checkpoint)
        self.snapshots.append(copy.deepcopy(list(checkpoint.messages)))
        super().save(checkpoint)


def three_steps() -> ScriptedModel:
    return ScriptedModel([
        reply("one", call("add", {"a": 1, "b": 1}), usage=Usage(3, 1, 4)),
        reply("two", call("add", {"a": 2, "b": 2}), usage=Usage(5, 1, 6)),
        reply("done", usage=Usage(7, 1, 8)),
    ])


async def test_a_checkpoint_at_every_step_boundary() -> None:
    store = RecordingStore()
    ticks = iter(range(1000, 2000))
    result = await generate_text(model=three_steps(), messages=[user("go")], tools={"add": add_tool()},
                                 store=store, run_id="run-1", clock=lambda: next(ticks))
    assert result.run_id == "run-1"
    assert [(c.step_index, c.status) for c in store.saved] == [(0, "running"), (1, "running"), (2, "completed")]
    assert [c.step_id for c in store.saved] == ["run-1#0", "run-1#1", "run-1#2"]
    assert [c.usage.total_tokens for c in store.saved] == [4, 10, 18]
    assert [c.created_at for c in store.saved] == [1000, 1001, 1002]
    assert all(c.version == CHECKPOINT_VERSION and c.pending_approvals is None for c in store.saved)


async def test_the_run_id_is_minted_by_generate_id_when_not_given() -> None:
    store = InMemoryCheckpointStore()
    result = await generate_text(model=three_steps(), messages=[user("go")], tools={"add": add_tool()},
                                 store=store, generate_id=lambda: "minted")
    assert result.run_id == "minted" and store.load("minted") is not None


async def test_a_call_without_tools_does_not_checkpoint_or_carry_a_run_id() -> None:
    store = RecordingStore()
    result = await generate_text(model=ScriptedModel(["hi"]), messages=[user("x")], store=store, run_id="r")
    assert result.run_id is None and store.saved == []
    streamed = stream_chat(model=ScriptedModel(["hi"]), messages=[user("x")], store=store, run_id="r")
    assert streamed.run_id is None


async def test_saved_history_is_an_immutable_snapshot() -> None:
    store = RecordingStore()
    result = await generate_text(model=three_steps(), messages=[user("go")], tools={"add": add_tool()},
                                 store=store, run_id="r")
    for checkpoint, snapshot in zip(store.saved, store.snapshots, strict=True):
        assert list(checkpoint.messages) == snapshot  # later steps never changed an earlier save
    assert store.saved[0].messages is not store.saved[1].messages
    assert list(store.saved[1].messages) == list(result.messages[: len(store.saved[1].messages)])


async def test_a_failing_store_is_logged_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    store = FailingStore()
    with caplog.at_level(logging.ERROR, logger="durable_agent"):
        result = await generate_text(model=three_steps(), messages=[user("go")], tools={"add": add_tool()},
                                     store=store, run_id="r")
    assert result.text == "done" and store.attempts == 3
    assert sum("saving checkpoint" in r.getMessage() for r in caplog.records) == 3


async def test_a_store_that_hangs_then_raises_does_not_kill_the_run(caplog: pytest.LogCaptureFixture) -> None:
    class HangingStore(InMemoryCheckpointStore):
        async def save(self, checkpoint: AgentCheckpoint) -> None:  # type: ignore[override]
            await asyncio.sleep(0.05)
            raise TimeoutError("statement timeout")

    with caplog.at_level(logging.ERROR, logger="durable_agent"):
        result = await generate_text(model=three_steps(), messages=[user("go")], tools={"add": add_tool()},
                                     store=HangingStore(), run_id="r")
    assert result.finish_reason == "stop"
    assert any("TimeoutError" in (r.exc_text or "") for r in caplog.records)


async def test_async_stores_are_awaited() -> None:
    class AsyncStore:
        def __init__(self) -> None:
            self.inner = InMemoryCheckpointStore()

        async def save(self, checkpoint: AgentCheckpoint) -> None:
            self.inner.save(checkpoint)

        async def load(self, run_id: str) -> AgentCheckpoint | None:
            return self.inner.load(run_id)

    store = AsyncStore()
    first = await generate_text(model=ScriptedModel([reply("", call("pay", {}))]), messages=[user("x")],
                                tools={"pay": Tool(execute=lambda _: "paid", needs_approval=True)},
                                store=store, run_id="a", generate_id=lambda: "ap-1")
    assert first.finish_reason == "suspended"
    done = await resume_from_checkpoint(store, "a", model=ScriptedModel([reply("", call("pay", {})), "paid!"]),
                                        tools={"pay": Tool(execute=lambda _: "paid", needs_approval=True)},
                                        approval_responses=[ToolApprovalResponse("ap-1", True)])
    assert done.text == "paid!"


async def test_unknown_run_rejects_and_the_streaming_twin_reports_it_as_a_part() -> None:
    store = InMemoryCheckpointStore()
    with pytest.raises(CheckpointNotFoundError) as info:
        await resume_from_checkpoint(store, "ghost", model=ScriptedModel(["x"]))
    assert info.value.run_id == "ghost" and info.value.code == "checkpoint_not_found"
    streamed = resume_stream_from_checkpoint(store, "ghost", model=ScriptedModel(["x"]))  # no synchronous raise
    assert streamed.run_id == "ghost"
    parts = [p async for p in streamed.full_stream]
    assert [p.type for p in parts] == ["error"] and isinstance(parts[0], StreamError)
    assert isinstance(parts[0].error, CheckpointNotFoundError)
    with pytest.raises(CheckpointNotFoundError):
        await streamed.usage
    with pytest.raises(CheckpointNotFoundError):
        await streamed.finish_reason


async def test_counters_and_budgets_continue_across_legs() -> None:
    store = RecordingStore()
    gated = {"add": add_tool(), "pay": Tool(execute=lambda _: "paid", needs_approval=True)}
    script = [
        reply("", call("add", {"a": 1, "b": 1}), usage=Usage(10, 10, 20)),
        reply("", call("pay", {}), usage=Usage(10, 10, 20)),
        reply("", call("add", {"a": 2, "b": 2}), usage=Usage(10, 10, 20)),
        reply("", call("add", {"a": 3, "b": 3}), usage=Usage(10, 10, 20)),
    ]
    first = await generate_text(model=ScriptedModel(script), messages=[user("x")], tools=gated,
                                store=store, run_id="r", generate_id=lambda: "ap")
    assert first.finish_reason == "suspended" and first.usage.total_tokens == 40
    seen_usage: list[int] = []
    second = await resume_from_checkpoint(
        store, "r", model=ScriptedModel(script), tools=gated,
        approval_responses=[ToolApprovalResponse("ap", True)],
        stop_when=[total_tokens_exceed(70)],  # the whole run: 40 before + 20 + 20 = 80 > 70
        prepare_step=lambda ctx: seen_usage.append(ctx.usage.total_tokens),
    )
    assert second.finish_reason == "stop-condition"
    assert second.usage.total_tokens == 40  # this leg's own usage
    assert second.total_usage.total_tokens == 80
    assert seen_usage == [40, 60]  # prepare_step sees the whole run
    indices = [c.step_index for c in store.saved]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)  # monotonic across legs
    assert store.saved[-1].usage.total_tokens == 80


async def test_the_settled_result_streams_before_the_new_legs_first_step() -> None:
    store = InMemoryCheckpointStore()
    tools = {"pay": Tool(execute=lambda _: "paid", needs_approval=True)}
    script: list[ScriptedResponse | str] = [reply("", call("pay", {"amount": 3})), "all paid"]
    first = await generate_text(model=ScriptedModel(script), messages=[user("x")], tools=tools,
                                store=store, run_id="r", generate_id=lambda: "ap")
    suspended_at = store.load("r").step_index  # type: ignore[union-attr]
    streamed = resume_stream_from_checkpoint(store, "r", model=ScriptedModel(script), tools=tools,
                                             approval_responses=[ToolApprovalResponse("ap", True)])
    parts = [p async for p in streamed.full_stream]
    kinds = [p.type for p in parts]
    assert isinstance(parts[0], StreamToolResult) and parts[0].output == "paid"
    assert kinds.index("tool-result") < kinds.index("step-start")
    first_step = next(p for p in parts if p.type == "step-start")
    assert first_step.step_index > suspended_at and parts[0].step_index == suspended_at + 1
    assert first.finish_reason == "suspended" and await streamed.finish_reason == "stop"


def test_checkpoints_round_trip_through_the_codec_with_bytes() -> None:
    image = bytes(range(256)) * 4
    checkpoint = AgentCheckpoint(
        run_id="r", step_index=3, status="suspended", created_at=5,
        messages=[user("look"), {"role": "user", "content": [{"type": "image", "data": image}]}],
        usage=Usage(1, 2, 3),
        pending_approvals=(),
        agent_path=("coder",),
    )
    text = serialize_checkpoint(checkpoint)
    back = deserialize_checkpoint(text)
    assert back == checkpoint
    part = content_parts(back.messages[1])[0]
    assert part["type"] == "image" and part["data"] == image  # real bytes, not a decayed dict


def test_a_checkpoint_from_a_newer_schema_is_refused_clearly() -> None:
    data = AgentCheckpoint(run_id="r", step_index=0, status="running", messages=[], usage=Usage(), created_at=0).to_dict()
    data["version"] = CHECKPOINT_VERSION + 1
    from durable_agent.backends import encode

    with pytest.raises(CheckpointVersionError, match="newer"):
        deserialize_checkpoint(encode(data))


def test_the_trace_context_is_stored_only_when_set_and_checked_when_read() -> None:
    """Checkpoints written before it existed (no ``trace_context`` key) load with None; a bad one is corruption."""
    from durable_agent.backends import encode

    plain = AgentCheckpoint(run_id="r", step_index=0, status="running", messages=[], usage=Usage(), created_at=0)
    assert "trace_context" not in plain.to_dict() and deserialize_checkpoint(serialize_checkpoint(plain)) == plain
    traced = dataclasses.replace(plain, trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    assert deserialize_checkpoint(serialize_checkpoint(traced)) == traced
    for bad in ("00-…", {"traceparent": 7}, ["00-…"]):
        with pytest.raises(CheckpointCorruptError, match="trace_context"):
            deserialize_checkpoint(encode({**plain.to_dict(), "trace_context": bad}), run_id="r")


@pytest.mark.parametrize(
    "text",
    ['{"version":1', "garbage", '{"version":1,"run_id":"r"}', "[]",
     '{"version":1,"run_id":"r","step_id":"r#0","step_index":"0","status":"running","messages":[],'
     '"usage":{},"created_at":0}'],
)
def test_malformed_checkpoint_text_is_a_typed_error(text: str) -> None:
    with pytest.raises(CheckpointCorruptError):
        deserialize_checkpoint(text, run_id="r")


async def test_client_tools_suspend_and_resume_feeds_the_placeholder() -> None:
    store = InMemoryCheckpointStore()
    tools = {"ask_user": Tool(description="Ask the human", parameters={"type": "object"})}
    model = ScriptedModel([reply("", call("ask_user", {"q": "color?"})), "I'll pick blue."])
    first = await generate_text(model=model, messages=[user("x")], tools=tools, store=store, run_id="r")
    assert first.finish_reason == "suspended" and first.pending_approvals == ()
    assert first.client_tool_calls[0]["tool_name"] == "ask_user"
    assert store.load("r").status == "suspended"  # type: ignore[union-attr]
    done = await resume_from_checkpoint(store, "r", model=model, tools=tools)
    placeholder = tool_results(done.messages[2])[0]
    assert placeholder["is_error"] and placeholder["output"] == "No result provided for this client tool."
    assert done.text == "I'll pick blue."


async def test_the_escape_hatch_appends_the_real_client_result_and_stays_durable() -> None:
    store = RecordingStore()
    tools = {"ask_user": Tool(parameters={"type": "object"})}
    model = ScriptedModel([reply("", call("ask_user", {"q": "color?"})), "Blue it is."])
    await generate_text(model=model, messages=[user("x")], tools=tools, store=store, run_id="r")
    checkpoint = store.load("r")
    assert checkpoint is not None
    answered: list[Message] = [*checkpoint.messages, {"role": "tool", "content": [
        {"type": "tool-result", "tool_call_id": "call_0_0", "tool_name": "ask_user", "output": "blue", "is_error": False}
    ]}]
    done = await generate_text(model=model, messages=answered, tools=tools, store=store, run_id="r")
    assert done.text == "Blue it is."
    assert tool_results(model.requests[-1].messages[-1])[0]["output"] == "blue"
    last = store.saved[-1]
    assert last.status == "completed" and last.step_index == checkpoint.step_index + 1


async def test_sibling_calls_of_a_client_suspended_batch_run_once_on_resume() -> None:
    ledger = Ledger()
    store = InMemoryCheckpointStore()
    tools = {"log": ledger.tool("log"), "pay": ledger.tool("pay", needs_approval=True)}
    model = ScriptedModel([reply("", call("log", {"n": 1}), call("pay", {"n": 2})), "ok"])
    await generate_text(model=model, messages=[user("x")], tools=tools, store=store, run_id="r",
                        generate_id=lambda: "ap")
    assert ledger.entries == []  # nothing of a suspended batch runs before the verdict
    await resume_from_checkpoint(store, "r", model=model, tools=tools,
                                 approval_responses=[ToolApprovalResponse("ap", True)])
    assert ledger.entries == [("log", {"n": 1}), ("pay", {"n": 2})]


async def test_a_run_id_without_a_store_is_a_clear_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="without store="):
        await generate_text(model=ScriptedModel(["hi"]), messages=[user("x")], run_id="r")
    with pytest.raises(ConfigurationError, match="without store="):
        stream_chat(model=ScriptedModel(["hi"]), messages=[user("x")], run_id="r")
    with pytest.raises(ConfigurationError, match="without store="):
        await resume_from_checkpoint(None, "r", model=ScriptedModel(["hi"]))  # type: ignore[arg-type]


async def test_a_store_without_save_and_load_or_an_empty_run_id_is_refused_before_the_run() -> None:
    model = ScriptedModel(["hi"])
    with pytest.raises(ConfigurationError, match="CheckpointStore"):
        await generate_text(model=model, messages=[user("x")], store={"r": "not a store"},  # type: ignore[arg-type]
                            run_id="r")
    with pytest.raises(ConfigurationError, match="non-empty str"):
        await generate_text(model=model, messages=[user("x")], store=InMemoryCheckpointStore(), run_id="")


@pytest.fixture(params=["memory", pytest.param("sqlite", marks=pytest.mark.requires_sqlite), "jsonl"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The reference store and two persistent ones: the rule for a stored run id is the loop's, not a store's."""
    if request.param == "memory":
        yield InMemoryCheckpointStore()
    elif request.param == "sqlite":
        from durable_agent.backends.sqlite import SqliteCheckpointStore

        with SqliteCheckpointStore(tmp_path / "runs.db") as store:
            yield store
    else:
        from durable_agent.backends.jsonl import JsonlCheckpointStore

        with JsonlCheckpointStore(tmp_path / "runs.jsonl", fsync=False) as store:
            yield store


def _two_steps() -> ScriptedModel:
    """Two steps per leg (a tool call, then an answer), 8 tokens each: turns 0-1 answer the first leg, 2-3 the next."""
    leg = [reply("", call("add", {"a": 1, "b": 1}), usage=Usage(6, 2, 8)), reply("two", usage=Usage(6, 2, 8))]
    return ScriptedModel(leg * 2)


async def test_a_call_on_a_stored_run_id_whose_messages_do_not_extend_its_history_is_refused(any_store: Any) -> None:
    """It used to run and store a half-merged run: the second call's messages, but its usage (32) and
    step index (3) carried on from the first call's (16, 1), and step 1 could no longer be read."""
    tools = {"add": add_tool()}
    await generate_text(model=_two_steps(), messages=[user("first job")], tools=tools, store=any_store, run_id="r")
    stored = any_store.load("r")
    assert (stored.step_index, stored.usage.total_tokens) == (1, 16)
    second = _two_steps()
    with pytest.raises(RunExistsError, match="resume_from_checkpoint") as caught:
        await generate_text(model=second, messages=[user("another job")], tools=tools, store=any_store, run_id="r")
    assert caught.value.run_id == "r"
    retry = stream_chat(model=second, messages=[user("first job")], tools=tools, store=any_store, run_id="r")
    parts = [part async for part in retry.full_stream]  # a retry of the started run: its history is longer
    assert [p.type for p in parts] == ["error"] and isinstance(parts[0], StreamError)
    assert isinstance(parts[0].error, RunExistsError)
    assert second.requests == []  # refused before any model call
    assert any_store.load("r") == stored
    assert (await checkpoint_at_step(any_store, "r", 0)).step_index == 0


async def test_a_call_whose_messages_extend_the_stored_history_continues_the_run_and_its_step_log(
    any_store: Any,
) -> None:
    """The checkpoint spec's escape hatch: the stored history plus what the caller adds is the run's next leg."""
    tools = {"add": add_tool()}
    model = _two_steps()
    await generate_text(model=model, messages=[user("x")], tools=tools, store=any_store, run_id="r")
    first = any_store.load("r")
    more: list[Message] = [*first.messages, user("and again")]
    done = await generate_text(model=model, messages=more, tools=tools, store=any_store, run_id="r")
    assert (done.usage.total_tokens, done.total_usage.total_tokens) == (16, 32)
    latest = any_store.load("r")
    assert (latest.step_index, latest.usage.total_tokens) == (3, 32)
    assert [(await checkpoint_at_step(any_store, "r", i)).step_index for i in range(4)] == [0, 1, 2, 3]
    assert (await checkpoint_at_step(any_store, "r", 1)).messages == first.messages
