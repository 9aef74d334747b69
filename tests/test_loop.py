"""The loop itself: steps, tools, input validation, stop conditions, concurrency, cancellation, streaming."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from agent_kit import Ledger, add_tool, tool_results, user
from durable_agent import (
    ConfigurationError,
    ImagePart,
    InMemoryCheckpointStore,
    ModelPrice,
    ModelRequest,
    RunAbortedError,
    ScriptedModel,
    ScriptedResponse,
    StepOverrides,
    StreamError,
    StreamTextDelta,
    Tool,
    ToolResult,
    Usage,
    call,
    cost_exceeds,
    generate_text,
    reply,
    step_count_is,
    stream_chat,
    total_tokens_exceed,
)


async def test_a_tool_may_return_an_error_result_with_attachments_and_they_survive_a_checkpoint() -> None:
    png: ImagePart = {"type": "image", "data": b"\x89PNG\x00\xff", "media_type": "image/png"}
    shot = Tool(execute=lambda _input: ToolResult("no page", is_error=True, attachments=[png]))
    store = InMemoryCheckpointStore()
    result = await generate_text(model=ScriptedModel([reply("", call("shot", {}, "s")), "ok"]), messages=[user("go")],
                                 tools={"shot": shot}, store=store, run_id="r")
    (got,) = tool_results(result.messages[2])
    assert got["output"] == "no page" and got["is_error"] is True and got.get("attachments") == [png]
    stored = store.load("r")
    assert stored is not None and tool_results(stored.messages[2]) == [got]


async def test_a_tool_step_then_a_final_answer() -> None:
    model = ScriptedModel([reply("Adding.", call("add", {"a": 2, "b": 3})), "The sum is 5."])
    result = await generate_text(model=model, messages=[user("2+3?")], tools={"add": add_tool()})
    assert result.text == "The sum is 5."
    assert result.finish_reason == "stop"
    assert [s.step_index for s in result.steps] == [0, 1]
    assert result.steps[0].tool_results[0]["output"] == 5
    assert [m["role"] for m in result.messages] == ["user", "assistant", "tool", "assistant"]
    assert result.usage == result.steps[0].usage + result.steps[1].usage
    assert result.run_id is None  # no session: nothing durable


async def test_scripted_model_takes_a_function_of_the_request() -> None:
    seen: list[int] = []

    def script(request: ModelRequest) -> Any:
        seen.append(len(request.messages))
        return "short" if len(request.messages) == 1 else "long"

    result = await generate_text(model=ScriptedModel(script), messages=[user("hi")])
    assert result.text == "short" and seen == [1]


async def test_scripted_model_reports_a_clear_error_when_the_script_runs_out() -> None:
    model = ScriptedModel([reply("", call("add", {"a": 1, "b": 1}))])
    with pytest.raises(ConfigurationError, match="turn 1"):
        await generate_text(model=model, messages=[user("x")], tools={"add": add_tool()})


async def test_invalid_input_becomes_an_error_result_the_model_sees() -> None:
    model = ScriptedModel([reply("", call("add", {"a": "two", "c": 1})), "I will fix the input."])
    result = await generate_text(model=model, messages=[user("x")], tools={"add": add_tool()})
    tool_result = result.steps[0].tool_results[0]
    assert tool_result["is_error"] is True
    assert "input.a: expected number" in tool_result["output"]
    assert "missing required property 'b'" in tool_result["output"]
    assert "unexpected property 'c'" in tool_result["output"]
    assert tool_results(model.requests[1].messages[-1])[0]["is_error"] is True


async def test_unknown_tools_and_raising_tools_are_error_results() -> None:
    def boom(_: Any) -> None:
        raise RuntimeError("disk full")

    tools = {"boom": Tool(execute=boom)}
    model = ScriptedModel([reply("", call("nope", {}), call("boom", {})), "ok"])
    result = await generate_text(model=model, messages=[user("x")], tools=tools)
    nope, failed = result.steps[0].tool_results
    assert nope["is_error"] and "Unknown tool 'nope'" in nope["output"]
    assert failed["is_error"] and failed["output"] == "RuntimeError: disk full"


async def test_on_error_chooses_what_the_model_reads_when_a_tool_raises() -> None:
    def down(_: Any) -> None:
        raise RuntimeError("database is down at 10.0.0.7")

    tools = {"fixed": Tool(execute=down, on_error="The lookup failed; try again later."),
             "chosen": Tool(execute=down, on_error=lambda exc: f"failed ({type(exc).__name__})"),
             "default": Tool(execute=down)}
    model = ScriptedModel([reply("", call("fixed", {}), call("chosen", {}), call("default", {})), "ok"])
    result = await generate_text(model=model, messages=[user("x")], tools=tools)
    assert [(r["output"], r["is_error"]) for r in result.steps[0].tool_results] == [
        ("The lookup failed; try again later.", True), ("failed (RuntimeError)", True),
        ("RuntimeError: database is down at 10.0.0.7", True)]
    assert [r["output"] for r in tool_results(model.requests[1].messages[-1])][:2] == [
        "The lookup failed; try again later.", "failed (RuntimeError)"]
    with pytest.raises(ConfigurationError, match="on_error"):
        Tool(execute=down, on_error=42)  # type: ignore[arg-type]


async def test_async_tools_run() -> None:
    async def slow_double(args: Any) -> int:
        await asyncio.sleep(0)
        return int(args["n"]) * 2

    tools = {"double": Tool(parameters={"type": "object", "properties": {"n": {"type": "integer"}}}, execute=slow_double)}
    model = ScriptedModel([reply("", call("double", {"n": 21})), "42"])
    result = await generate_text(model=model, messages=[user("x")], tools=tools)
    assert result.steps[0].tool_results[0]["output"] == 42


async def test_a_pydantic_model_validates_and_converts_the_input() -> None:
    pytest.importorskip("pydantic")
    from pydantic import BaseModel

    class Transfer(BaseModel):
        amount: int
        to: str

    received: list[Transfer] = []

    def transfer(t: Transfer) -> str:
        received.append(t)
        return f"sent {t.amount}"

    tools = {"transfer": Tool(parameters=Transfer, execute=transfer)}
    model = ScriptedModel([reply("", call("transfer", {"amount": "x"}), call("transfer", {"amount": 5, "to": "bob"})), "ok"])
    result = await generate_text(model=model, messages=[user("x")], tools=tools)
    bad, good = result.steps[0].tool_results
    assert bad["is_error"] and "Invalid input" in bad["output"]
    assert good == {**good, "output": "sent 5", "is_error": False}
    assert isinstance(received[0], Transfer)
    assert model.requests[0].tools[0].parameters["properties"]["amount"]["type"] == "integer"


async def test_max_steps_stops_the_call() -> None:
    model = ScriptedModel([reply("", call("add", {"a": i, "b": 1})) for i in range(5)])
    result = await generate_text(model=model, messages=[user("x")], tools={"add": add_tool()}, max_steps=2)
    assert result.finish_reason == "max-steps" and len(result.steps) == 2


async def test_step_count_and_token_budget_stop_conditions() -> None:
    script = [reply("", call("add", {"a": i, "b": 1}), usage=Usage(10, 10, 20)) for i in range(5)]
    by_count = await generate_text(model=ScriptedModel(script), messages=[user("x")], tools={"add": add_tool()},
                                   stop_when=[step_count_is(3)])
    assert by_count.finish_reason == "stop-condition" and len(by_count.steps) == 3
    by_tokens = await generate_text(model=ScriptedModel(script), messages=[user("x")], tools={"add": add_tool()},
                                    stop_when=[total_tokens_exceed(50)])
    assert by_tokens.finish_reason == "stop-condition" and by_tokens.usage.total_tokens == 60


async def test_cost_budget_uses_the_price_table_and_refuses_unknown_models() -> None:
    script = [reply("", call("add", {"a": i, "b": 1}), usage=Usage(1_000_000, 0, 1_000_000)) for i in range(5)]
    prices = {"scripted": ModelPrice(input_per_million=1.0, output_per_million=4.0)}
    result = await generate_text(model=ScriptedModel(script), messages=[user("x")], tools={"add": add_tool()},
                                 stop_when=[cost_exceeds(2.5, prices)])
    assert len(result.steps) == 3  # $1, $2, $3 > $2.5
    with pytest.raises(ConfigurationError, match="no price for model 'other'"):
        await generate_text(model=ScriptedModel(script, model_id="other"), messages=[user("x")],
                            tools={"add": add_tool()}, stop_when=[cost_exceeds(2.5, prices)])


async def test_prepare_step_can_swap_the_model_and_limit_tools() -> None:
    seen: list[tuple[int, int]] = []
    other = ScriptedModel(lambda request: "from the other model", model_id="other")

    def prepare(ctx: Any) -> StepOverrides | None:
        seen.append((ctx.step_index, ctx.usage.total_tokens))
        return StepOverrides(model=other, active_tools=[]) if ctx.step_index == 1 else None

    model = ScriptedModel([reply("", call("add", {"a": 1, "b": 1}), usage=Usage(5, 5, 10))])
    result = await generate_text(model=model, messages=[user("x")], tools={"add": add_tool()}, prepare_step=prepare)
    assert result.text == "from the other model"
    assert seen == [(0, 0), (1, 10)]
    assert other.requests[0].tools == ()


async def test_active_tools_offer_a_subset_in_the_tools_order_for_that_step_only() -> None:
    tools = {name: Tool(description=name, execute=lambda _input: "ok") for name in ("a", "b", "c")}

    def prepare(ctx: Any) -> StepOverrides | None:
        return StepOverrides(active_tools=["c", "a"]) if ctx.step_index == 1 else None

    model = ScriptedModel([reply("", call("b", {})), reply("", call("a", {})), "done"])
    await generate_text(model=model, messages=[user("x")], tools=tools, prepare_step=prepare)
    offered = [[spec.name for spec in request.tools] for request in model.requests]
    assert offered == [["a", "b", "c"], ["a", "c"], ["a", "b", "c"]]
    assert [spec.description for spec in model.requests[1].tools] == ["a", "c"]


def test_usage_adds_count_by_count_and_adding_nothing_changes_nothing() -> None:
    spent = Usage(10, 5, 15, reasoning_tokens=2, cache_read_tokens=3, cache_write_tokens=4)
    assert spent + Usage(1, 2, 3, 4, 5, 6) == Usage(11, 7, 18, 6, 8, 10)
    assert spent + Usage() == spent and Usage() + spent == spent
    assert Usage() + Usage() == Usage()
    assert spent + Usage(cache_write_tokens=1) == Usage(10, 5, 15, 2, 3, 5)  # one count alone is not nothing


async def test_runaway_guard_stops_identical_repeated_tool_calls() -> None:
    ledger = Ledger()
    model = ScriptedModel([reply("", call("poll", {"q": 1})) for _ in range(10)])
    result = await generate_text(model=model, messages=[user("x")], tools={"poll": ledger.tool("poll")},
                                 runaway_limit=3)
    assert result.finish_reason == "runaway"
    assert len(ledger.entries) == 3


TAG: contextvars.ContextVar[str] = contextvars.ContextVar("tag")


@pytest.mark.parametrize(("batches", "tool_runs", "finish"), [
    ([{"q": 1}, {"q": 2}] * 3, 6, "stop"),  # alternating inputs are not a repeat
    ([{"q": 1}, {"q": 1}, {"q": 2}, {"q": 1}, {"q": 1}], 5, "stop"),  # a different batch restarts the count
    ([{"q": 1}, {"q": 2}, {"q": 2}, {"q": 2}, {"q": 3}], 4, "runaway"),  # three in a row, wherever they start
    ([{"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}, {"a": 1, "b": [1, 2]}], 3, "runaway"),  # key order is not a difference
    ([{"q": [1, 2]}, {"q": [2, 1]}, {"q": [1, 2]}], 3, "stop"),  # list order is
])
async def test_the_runaway_guard_counts_only_the_same_batch_in_a_row(
    batches: list[dict[str, Any]], tool_runs: int, finish: str,
) -> None:
    ledger = Ledger()
    model = ScriptedModel([*(reply("", call("poll", args)) for args in batches), "done"])
    result = await generate_text(model=model, messages=[user("x")], tools={"poll": ledger.tool("poll")},
                                 runaway_limit=3)
    assert (result.finish_reason, len(ledger.entries)) == (finish, tool_runs)


async def test_the_runaway_guard_compares_whole_batches() -> None:
    """Two calls a step: the same pair three times stops the run; the same first call with another second does not."""
    ledger = Ledger()
    pairs = [(1, 2), (1, 3), (1, 2), (1, 2), (1, 2)]
    model = ScriptedModel([reply("", call("poll", {"q": a}), call("poll", {"q": b})) for a, b in pairs])
    result = await generate_text(model=model, messages=[user("x")], tools={"poll": ledger.tool("poll")},
                                 runaway_limit=3)
    assert (result.finish_reason, len(ledger.entries)) == ("runaway", 10)


async def test_parallel_tools_respect_max_tool_concurrency() -> None:
    active, peak = 0, 0

    async def work(args: Any) -> int:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.01)
        active -= 1
        return int(args["n"])

    tools = {"work": Tool(execute=work)}
    calls = [call("work", {"n": n}) for n in range(6)]
    for limit, expected_peak in ((None, 6), (2, 2), (1, 1)):
        peak = 0
        model = ScriptedModel([reply("", *calls), "done"])
        result = await generate_text(model=model, messages=[user("x")], tools=tools, max_tool_concurrency=limit)
        assert peak == expected_peak
        assert [r["output"] for r in result.steps[0].tool_results] == list(range(6))  # call order kept


async def test_an_aborted_call_does_not_checkpoint_the_interrupted_step() -> None:
    store = InMemoryCheckpointStore()
    signal = asyncio.Event()

    def slow(args: Any) -> str:
        signal.set()  # the user presses stop while this tool runs
        return "done"

    model = ScriptedModel([reply("", call("add", {"a": 1, "b": 1})), reply("", call("slow", {})), "end"])
    tools = {"add": add_tool(), "slow": Tool(execute=slow)}
    with pytest.raises(RunAbortedError):
        await generate_text(model=model, messages=[user("x")], tools=tools, store=store, run_id="r", signal=signal)
    saved = store.load("r")
    assert saved is not None and saved.step_index == 0  # step 1 was interrupted and not saved
    assert [m["role"] for m in saved.messages] == ["user", "assistant", "tool"]


async def test_task_cancellation_propagates_and_saves_nothing_mid_step() -> None:
    store = InMemoryCheckpointStore()
    started = asyncio.Event()

    stopped = asyncio.Event()

    async def hang(_: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            stopped.set()

    model = ScriptedModel([reply("", call("hang", {}))])
    task = asyncio.ensure_future(generate_text(model=model, messages=[user("x")], tools={"hang": Tool(execute=hang)},
                                               store=store, run_id="c"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stopped.is_set()  # the tool was cancelled with its run, not left running
    assert store.load("c") is None


@pytest.mark.parametrize("calls", [1, 3])
async def test_a_tool_sets_context_variables_in_a_context_of_its_own(calls: int) -> None:
    """A tool runs in a copy of the caller's context: it sees what the caller set, and what it sets stays its own."""
    seen: list[str] = []

    async def tagged(args: Any) -> str:
        seen.append(TAG.get())
        TAG.set(f"tool {args['n']}")
        await asyncio.sleep(0)
        return TAG.get()

    TAG.set("caller")
    model = ScriptedModel([reply("", *(call("tag", {"n": n}) for n in range(calls))), "done"])
    result = await generate_text(model=model, messages=[user("x")], tools={"tag": Tool(execute=tagged)})
    assert seen == ["caller"] * calls
    assert [part["output"] for part in tool_results(result.messages[2])] == [f"tool {n}" for n in range(calls)]
    assert TAG.get() == "caller"


async def test_stream_chat_streams_the_same_run_generate_text_returns() -> None:
    script: list[ScriptedResponse | str] = [reply("Let me add.", call("add", {"a": 2, "b": 3})), "The sum is five."]
    buffered = await generate_text(model=ScriptedModel(script), messages=[user("x")], tools={"add": add_tool()})
    streamed = stream_chat(model=ScriptedModel(script), messages=[user("x")], tools={"add": add_tool()})
    parts = [p async for p in streamed.full_stream]
    kinds = [p.type for p in parts]
    assert kinds[0] == "step-start" and kinds[-1] == "finish"
    assert kinds.count("text-delta") > 2  # text arrives in deltas
    assert kinds.index("tool-call") < kinds.index("tool-result") < kinds.index("step-finish")
    assert "".join(p.text for p in parts if isinstance(p, StreamTextDelta)) == "Let me add.The sum is five."
    outcome = await streamed.result()
    assert outcome.messages == buffered.messages
    assert await streamed.usage == buffered.usage
    assert await streamed.finish_reason == "stop"
    with pytest.raises(RuntimeError, match="only once"):
        streamed.full_stream  # noqa: B018


async def test_awaiting_usage_alone_drives_the_stream() -> None:
    streamed = stream_chat(model=ScriptedModel(["hello there"]), messages=[user("x")])
    assert (await streamed.usage).output_tokens > 0
    assert await streamed.finish_reason == "stop"


async def test_a_failing_model_is_an_error_part_and_rejected_awaitables() -> None:
    def broken(_: ModelRequest) -> Any:
        raise TimeoutError("provider timed out")

    streamed = stream_chat(model=ScriptedModel(broken), messages=[user("x")])
    parts = [p async for p in streamed.full_stream]
    assert isinstance(parts[-1], StreamError) and isinstance(parts[-1].error, TimeoutError)
    with pytest.raises(TimeoutError):
        await streamed.usage
    with pytest.raises(TimeoutError):
        await generate_text(model=ScriptedModel(broken), messages=[user("x")])


async def test_bad_options_are_refused_clearly() -> None:
    model = ScriptedModel(["x"])
    with pytest.raises(ConfigurationError, match="max_steps"):
        await generate_text(model=model, messages=[user("x")], max_steps=0)
    with pytest.raises(TypeError, match="max_stepz"):
        await generate_text(model=model, messages=[user("x")], max_stepz=3)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="LanguageModel"):
        await generate_text(model=object(), messages=[user("x")])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="parameters"):
        Tool(parameters=42)
