"""`Agent` on every runtime (memory, a SQLite file, a Postgres schema): replay of the step in flight,
leases and fencing, heal/resume, suspend, approvals parked on awakeables, tool state.

A "process death" is simulated in-process by a control error raised mid-step (it is never
recorded, exactly like a SIGKILL); another runtime over the same storage plays the new process.
The crash tests with real processes live in test_crash_journal.py and test_agent_sqlite.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_kit import Ledger, tool_results
from durable_agent import (
    APPROVAL_TOKEN_DENIED_REASON,
    RUN_TAKEN_OVER_MESSAGE,
    Agent,
    ApprovalSigner,
    DurableOptions,
    ModelRequest,
    RunLeaseHeldError,
    RunSuspendedError,
    ScriptedModel,
    StaleEpochError,
    StreamToolResult,
    Tool,
    Usage,
    agent_tool,
    call,
    parse_step_key,
    reply,
    resolve_approval,
)
from durable_agent.backends import RunOwner
from durable_agent.backends.memory import MemoryDurableState, MemoryRuntime
from helpers import maybe_await
from test_runtime_postgres import conninfo, opened  # noqa: F401  # fixtures of the postgres case


class Crash(RunSuspendedError):
    """Stands for the process dying here: a control error, so nothing records it."""


@pytest.fixture(params=[
    "memory",
    pytest.param("sqlite", marks=pytest.mark.requires_sqlite),
    pytest.param("postgres", marks=pytest.mark.host_only("needs a Postgres server")),
])
def runtime_on(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
    """Open another "process" (a new runtime, its own connections) on the test's shared storage."""
    if request.param == "postgres":
        opened = request.getfixturevalue("opened")  # test_runtime_postgres: a schema of the test's own
        return lambda: opened()
    if request.param == "sqlite":
        from durable_agent.backends.sqlite import SqliteRuntime

        runtimes: list[Any] = []
        request.addfinalizer(lambda: [runtime.close() for runtime in runtimes])

        def open_sqlite() -> Any:
            runtimes.append(SqliteRuntime(tmp_path / "agent.db"))
            return runtimes[-1]

        return open_sqlite
    state = MemoryDurableState()
    return lambda: MemoryRuntime(state=state)


@pytest.fixture
def agent_on(runtime_on: Callable[[], Any]) -> Callable[..., Agent]:
    """An Agent of session chat-1 in a new "process": `agent_on(model, tools, signer=..., **durable options)`."""

    def make(model: Any, tools: dict[str, Tool], *, runtime: Any = None, **options: Any) -> Agent:
        signer = options.pop("signer", None)
        extra = {"approval_signer": signer} if signer is not None else {}
        return Agent(model=model, tools=tools, durable=DurableOptions(runtime or runtime_on(), **options),
                     session_id="chat-1", **extra)

    return make


async def test_without_a_runtime_the_agent_keeps_history_in_memory() -> None:
    model = ScriptedModel(["first answer", "second answer"])
    agent = Agent(model=model)
    await agent.run("one")
    second = await agent.run("two")
    assert second.text == "second answer"
    assert [m["role"] for m in model.requests[1].messages] == ["user", "assistant", "user"]
    assert await agent.resume() is None


async def test_runs_of_a_session_share_its_history(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    model = ScriptedModel(["hello", "again"])
    await agent_on(model, {}).run("hi")
    second = await agent_on(model, {}).run("and now?")  # another process, same session
    assert second.text == "again"
    assert [m["content"] for m in model.requests[1].messages] == ["hi", [{"type": "text", "text": "hello"}], "and now?"]


async def test_resume_replays_the_step_in_flight(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    """A finished model call is not requested again, a finished tool does not run again,
    and an unsafe tool that started and never finished is reported as interrupted."""
    ledger = Ledger()
    crashed = [False]

    def charge(args: Any) -> str:
        ledger.entries.append(("charge", args))
        if not crashed[0]:
            crashed[0] = True
            raise Crash()  # the process dies while the card is being charged
        return "charged"

    def look_up(args: Any) -> str:
        ledger.entries.append(("lookup", args))
        return "found"

    tools = {"lookup": Tool(execute=look_up, replay="safe"), "charge": Tool(execute=charge)}
    model = ScriptedModel([reply("", call("lookup", {"id": 1}), call("charge", {"usd": 5})), "Reported."])
    with pytest.raises(Crash):
        await agent_on(model, tools, stale_after_ms=1).run("buy it")
    assert len(model.requests) == 1

    resumed = await agent_on(model, tools).resume()
    assert resumed is not None and resumed.text == "Reported."
    assert len(model.requests) == 2  # the first model call was answered from its record
    assert ledger.entries == [("lookup", {"id": 1}), ("charge", {"usd": 5})]  # nothing ran twice
    lookup, charge_result = tool_results(resumed.messages[2])
    assert lookup["output"] == "found" and not lookup["is_error"]
    assert charge_result["is_error"] and "interrupted" in charge_result["output"]
    assert await agent_on(model, tools).resume() is None  # nothing left to continue


async def test_safe_tools_run_again_after_a_crash(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    runs: list[int] = []

    def read(args: Any) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise Crash()
        return "content"

    tools = {"read": Tool(execute=read, replay="safe")}
    model = ScriptedModel([reply("", call("read", {})), "ok"])
    with pytest.raises(Crash):
        await agent_on(model, tools).run("x")
    resumed = await agent_on(model, tools).resume()
    assert resumed is not None and tool_results(resumed.messages[2])[0]["output"] == "content" and len(runs) == 2


class FirstCallThen:
    """A model whose first call streams `first`'s events (`Crash` among them: the process dies there) and every
    later call `then`'s; `requests` are what each call was asked."""

    model_id = "first-call-then"

    def __init__(self, first: list[Any], then: list[Any]) -> None:
        self.first, self.then, self.requests = first, then, list[ModelRequest]()

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        self.requests.append(request)
        for event in self.first if len(self.requests) == 1 else self.then:
            if event is Crash:
                raise Crash()
            yield event


def text(*deltas: str) -> list[dict[str, Any]]:
    return [{"type": "text-delta", "text": delta} for delta in deltas]


def finish(reason: str = "stop") -> dict[str, Any]:
    return {"type": "finish", "finish_reason": reason, "usage": Usage(1, 1, 2)}


async def died_then_healed(agent: Callable[[Any], Agent], runtime_on: Callable[[], Any]) -> tuple[Any, Any]:
    """Session chat-1's first run dies (`Crash`); once its lease is stale, the session's next run, in another
    process, heals it. That run's result, and the checkpoint the heal left of the first."""
    first = runtime_on()
    with pytest.raises(Crash):
        await agent(first).run("first")
    run_id = await first.stores.runs.last("chat-1")
    await asyncio.sleep(0.01)  # let the dead run's lease go stale
    second = runtime_on()
    result = await agent(second).run("second")
    return result, await maybe_await(second.stores.checkpoints.load(run_id))


async def test_stream_partials_become_an_aborted_assistant_turn_on_resume(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    model = FirstCallThen([*text("The answer ", "is "), Crash], [*text("42."), finish()])  # dies mid-stream
    with pytest.raises(Crash):
        await agent_on(model, {"noop": Tool(execute=lambda a: None)}).run("question")
    assert [p.text for p in await runtime_on().inspect.partials()] == ["The answer ", "is "]
    resumed = await agent_on(model, {"noop": Tool(execute=lambda a: None)}).resume()
    assert resumed is not None
    assert model.requests[1].messages[-1] == {"role": "assistant", "content": [{"type": "text", "text": "The answer is "}]}
    assert resumed.text == "42."


async def test_a_second_process_cannot_run_a_held_session(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    seen: list[str] = []

    async def nested(args: Any) -> str:
        try:
            await agent_on(ScriptedModel(["never"]), {}).run("me too")
        except RunLeaseHeldError as exc:
            seen.append(str(exc))
            assert exc.session_id == "chat-1" and exc.owner is not None
        return "done"

    model = ScriptedModel([reply("", call("nested", {})), "ok"])
    await agent_on(model, {"nested": Tool(execute=nested)}).run("go")
    assert seen and "held by" in seen[0]


async def test_a_writer_that_lost_the_lease_stops_at_once_without_a_final_save(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    thief = runtime_on()

    async def steal(args: Any) -> str:
        claim = await thief.lease.claim("chat-1", stale_at=10**15)  # another process takes the session over
        assert claim.claimed
        return "stolen"

    model = ScriptedModel([reply("", call("steal", {})), reply("", call("steal", {})), "never"])
    victim = runtime_on()
    victim.owner = RunOwner("laptop", 1, victim.owner.token)  # a laptop that went to sleep mid-run
    agent = agent_on(model, {"steal": Tool(execute=steal)}, runtime=victim)
    with pytest.raises(StaleEpochError) as info:
        await agent.run("go")
    assert RUN_TAKEN_OVER_MESSAGE in str(info.value)
    run_id = await victim.stores.runs.last("chat-1")
    stored = await maybe_await(victim.stores.checkpoints.load(run_id))
    assert stored.step_index == 0  # no save after takeover
    assert len(model.requests) == 1


async def test_heal_answers_the_interrupted_calls_and_starts_the_new_run(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    ledger = Ledger()

    def dies(args: Any) -> None:
        raise Crash()

    model = ScriptedModel([reply("", call("dies", {})), "New run answer."])
    with pytest.raises(Crash):
        await agent_on(model, {"dies": Tool(execute=dies), "log": ledger.tool("log")}).run("first")
    result = await agent_on(model, {"dies": Tool(execute=dies)}, stale_after_ms=1).run("second")
    history = model.requests[-1].messages
    assert tool_results(history[2])[0]["is_error"] and "interrupted" in tool_results(history[2])[0]["output"]
    assert history[3] == {"role": "user", "content": "second"}
    assert result.text == "New run answer."


async def test_a_healed_run_counts_the_tokens_of_the_step_it_closes(runtime_on: Callable[[], Any]) -> None:
    """The run's model answer was recorded (its call paid for), and a sub-agent call of its step finished, when the
    process died in the step's other tool: healing closes the step from those records, and the run's usage counts
    the answer's tokens and the sub-agent's, as the step's own checkpoint would have."""
    helper = agent_tool(name="helper", model=ScriptedModel([reply("found", usage=Usage(2, 3, 5))]), tools={})

    def dies(args: Any) -> None:
        raise Crash()

    model = ScriptedModel([reply("", call("helper", {"prompt": "look"}, "c1"), call("dies", {}, "c2"),
                                 usage=Usage(5, 6, 11)), reply("Next run.", usage=Usage(1, 1, 2))])
    tools = {"helper": helper, "dies": Tool(execute=dies)}

    def agent(runtime: Any) -> Agent:  # one call at a time: the sub-agent's call ends before the process dies
        return Agent(model=model, tools=tools, durable=DurableOptions(runtime, stale_after_ms=1), session_id="chat-1",
                     max_tool_concurrency=1)

    result, healed = await died_then_healed(agent, runtime_on)
    assert healed.status == "completed" and [(r["output"], r["is_error"]) for r in tool_results(healed.messages[-1])] \
        == [("found", False), (healed.messages[-1]["content"][1]["output"], True)]
    assert healed.usage == Usage(7, 9, 16)  # the answer's 5/6/11 and the sub-agent's 2/3/5
    assert result.usage == Usage(1, 1, 2) and len(model.requests) == 2  # the new run's own; nothing asked again


REASONING = {"type": "reasoning", "text": "The file must go.", "provider": "anthropic", "metadata": {"signature": "sig-1"}}
"""A signed reasoning block: a provider wants it sent back with the call it led to."""


async def test_a_healed_step_keeps_its_answers_reasoning_as_the_loop_does(runtime_on: Callable[[], Any]) -> None:
    """The recorded answer a heal closes the step with is the assistant message the loop would have written: its
    reasoning block too (a provider refuses a tool call's continuation without its signed reasoning)."""
    model = FirstCallThen([REASONING, {"type": "tool-call", "tool_call_id": "c1", "tool_name": "dies", "input": {}},
                           finish("tool-calls")], [*text("Next run."), finish()])

    def dies(args: Any) -> None:
        raise Crash()

    def agent(runtime: Any) -> Agent:
        return Agent(model=model, tools={"dies": Tool(execute=dies)}, session_id="chat-1",
                     durable=DurableOptions(runtime, stale_after_ms=1))

    await died_then_healed(agent, runtime_on)
    assert model.requests[1].messages[1] == {"role": "assistant", "content": [
        REASONING, {"type": "tool-call", "tool_call_id": "c1", "tool_name": "dies", "input": {}}]}


@pytest.mark.parametrize("words", [[], ["Hi ", "there"]], ids=["before-it-streamed", "mid-answer"])
async def test_a_run_healed_in_its_model_call_ends_there_with_what_it_streamed(
        runtime_on: Callable[[], Any], words: list[str]) -> None:
    """The process died in the run's model call (no answer recorded): healing ends the run there, its streamed
    text (if any) an aborted turn of its history, as a resumed run would have joined it. The run is completed, so
    nothing continues it later, and the session's next run goes on from its history."""
    model = FirstCallThen([*text(*words), Crash], [*text("Next run."), finish()])

    def agent(runtime: Any) -> Agent:
        return Agent(model=model, durable=DurableOptions(runtime, stale_after_ms=1), session_id="chat-1")

    result, healed = await died_then_healed(agent, runtime_on)
    assert result.text == "Next run."
    aborted = [{"role": "assistant", "content": [{"type": "text", "text": "Hi there"}]}] if words else []
    assert (healed.status, healed.step_index, healed.messages) == (
        "completed", 1, [{"role": "user", "content": "first"}, *aborted])
    assert await agent(runtime_on()).resume(run_id=healed.run_id) is None and len(model.requests) == 2
    assert list(model.requests[1].messages) == [*healed.messages, {"role": "user", "content": "second"}]


async def test_on_interrupted_resume_continues_the_run_before_the_prompt(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    attempts: list[int] = []

    def flaky(args: Any) -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise Crash()
        return "fine"

    tools = {"flaky": Tool(execute=flaky, replay="safe")}
    model = ScriptedModel([reply("", call("flaky", {})), "first run done", "second run done"])
    with pytest.raises(Crash):
        await agent_on(model, tools, stale_after_ms=1).run("first")
    await asyncio.sleep(0.01)  # let the dead run's lease go stale
    result = await agent_on(model, tools, on_interrupted="resume", stale_after_ms=1).run("second")
    assert result.text == "second run done" and len(attempts) == 2
    assert [m["content"] for m in model.requests[-1].messages if m["role"] == "user"] == ["first", "second"]


async def test_a_parked_run_whose_resumed_leg_died_is_recovered_with_its_verdict_not_denied(
        runtime_on: Callable[[], Any]) -> None:
    """A parked run got its verdict (`resolve_approval`) and its resumed leg died in the approved tool, so the run is
    marked again. The session's next run in ``"resume"`` mode drives it on with the verdict its approval's
    awakeable holds, as `resume` does: the tool runs again (it is ``safe`` to), approved, not denied by default."""
    ran: list[Any] = []

    def pay(args: Any) -> str:
        ran.append(args)
        if len(ran) == 1:
            raise Crash()
        return "paid"

    tools = {"pay": Tool(execute=pay, needs_approval=True, replay="safe")}
    model = ScriptedModel([reply("", call("pay", {"id": "inv-7"}, "c1")), "Paid.", "Next run."])

    def agent(runtime: Any, mode: Any = "heal") -> Agent:
        return Agent(model=model, tools=tools, session_id="chat-1",
                     durable=DurableOptions(runtime, on_interrupted=mode, stale_after_ms=1))

    first = runtime_on()
    parked = await agent(first).run("Pay inv-7.")
    await resolve_approval(first, parked.pending_approvals[0].approval_id, approved=True)
    with pytest.raises(Crash):
        await agent(first).resume()
    await asyncio.sleep(0.01)  # let the dead leg's lease go stale
    second = runtime_on()
    result = await agent(second, "resume").run("Next.")
    recovered = await maybe_await(second.stores.checkpoints.load(parked.run_id))
    assert [(r["output"], r["is_error"]) for r in tool_results(recovered.messages[2])] == [("paid", False)]
    assert (recovered.status, result.text, len(ran)) == ("completed", "Next run.", 2)


async def test_suspend_stops_the_run_and_resume_continues_it(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    holder: list[Agent] = []

    def pause(args: Any) -> str:
        holder[0].suspend()  # a host draining before it exits
        return "paused here"

    model = ScriptedModel([reply("", call("pause", {})), "after the pause"])
    agent = agent_on(model, {"pause": Tool(execute=pause)})
    holder.append(agent)
    with pytest.raises(RunSuspendedError):
        await agent.run("go")
    resumed = await agent_on(model, {"pause": Tool(execute=pause)}).resume()
    assert resumed is not None and resumed.text == "after the pause"
    assert tool_results(resumed.messages[2])[0]["output"] == "paused here"  # replayed, not run again


async def test_a_client_mode_approval_parks_on_an_awakeable_resolved_from_another_process(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    ledger = Ledger()
    signer = ApprovalSigner("k" * 32)
    tools = {"deploy": ledger.tool("deploy", needs_approval=True)}
    model = ScriptedModel([reply("", call("deploy", {"v": 2})), "Deployed."])

    def agent() -> Agent:
        return agent_on(model, tools, signer=signer)

    first = await agent().run("ship it")
    assert first.finish_reason == "suspended"
    (request,) = first.pending_approvals
    awakeables = await runtime_on().inspect.awakeables()
    assert [a.id for a in awakeables] == [request.approval_id] and not awakeables[0].resolved

    webhook = runtime_on()  # the process that receives the human's click
    assert await resolve_approval(webhook, "no-such-approval", approved=True) is False
    assert await resolve_approval(webhook, request.approval_id, approved=True, token=request.token) is True
    done = await agent().resume()
    assert done is not None and done.text == "Deployed." and ledger.entries == [("deploy", {"v": 2})]


async def test_an_approval_sent_without_its_token_is_denied_when_a_signer_is_set(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    ledger = Ledger()
    signer = ApprovalSigner("k" * 32)
    tools = {"deploy": ledger.tool("deploy", needs_approval=True)}
    model = ScriptedModel([reply("", call("deploy", {})), "Not deployed."])
    agent = agent_on(model, tools, signer=signer)
    first = await agent.run("ship it")
    await resolve_approval(runtime_on(), first.pending_approvals[0].approval_id, approved=True)
    done = await agent.resume()
    assert done is not None and ledger.entries == []
    assert tool_results(done.messages[2])[0]["output"] == APPROVAL_TOKEN_DENIED_REASON


async def test_tools_keep_per_session_state_that_commits_only_with_a_finished_call(agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]) -> None:
    from durable_agent import current_tool_call

    seen: list[Any] = []
    crashed = [False]

    def cd(args: Any) -> str:
        context = current_tool_call()
        assert context is not None
        seen.append(dict(context.tool_state))
        context.stage_tool_state([{"op": "set", "key": "cwd", "value": args["path"]}])
        if args["path"] == "/crash" and not crashed[0]:
            crashed[0] = True
            raise Crash()  # dies after staging: the staged change must not land
        return f"now in {args['path']}"

    tools = {"cd": Tool(execute=cd, replay="safe")}
    model = ScriptedModel([reply("", call("cd", {"path": "/src"})), reply("", call("cd", {"path": "/crash"})),
                           "done", "second run"])
    with pytest.raises(Crash):
        await agent_on(model, tools).run("go")
    assert await runtime_on().stores.tool_state("chat-1").all() == {"cwd": "/src"}
    await agent_on(model, tools).resume()
    assert seen == [{}, {"cwd": "/src"}, {"cwd": "/src"}]  # the crashed call's change never showed
    assert await runtime_on().stores.tool_state("chat-1").all() == {"cwd": "/crash"}
    with pytest.raises(Exception, match="tool-state op"):
        from durable_agent import ToolCallContext

        ToolCallContext(None, None, "c", "t").stage_tool_state([{"op": "append", "key": "x"}])  # type: ignore[arg-type]


async def test_a_step_with_one_unsafe_call_is_two_commits_and_its_result_is_durable_before_it_is_streamed(
    agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]
) -> None:
    """The spec's floor for a step with one unsafe tool call: its intent (with the model's answer) before it
    runs, its result with the checkpoint after. A caller sees the result only once it is durable."""
    runtime = runtime_on()
    writes: list[str] = []

    def counting(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            writes.append(name)
            return inner(*args, **kwargs)

        return counted

    runtime.backend.put_steps = counting("put_steps", runtime.backend.put_steps)
    runtime.commit = counting("commit", runtime.commit)
    ledger = Ledger()
    seen: list[str] = []  # the stored status of each tool call whose result was streamed

    async def on_part(run_id: str | None, part: Any) -> None:
        if isinstance(part, StreamToolResult):
            records = await runtime_on().inspect.steps("r1")
            seen.extend(r.status for r in records if parse_step_key(r.key).call == part.tool_call_id)

    model = ScriptedModel([reply("", call("charge", {"n": n})) for n in range(3)] + ["charged thrice"])
    agent = agent_on(model, {"charge": ledger.tool("charge")}, runtime=runtime)
    result = await agent.run("go", run_id="r1", on_part=on_part)
    assert result.text == "charged thrice" and len(ledger.entries) == 3
    assert len(writes) == 1 + 3 * 2 + 1, writes  # the run's start, 2 per tool step, the final checkpoint
    assert seen == ["done"] * 3


async def test_a_tool_result_whose_checkpoint_commit_failed_rides_on_the_next_write(
    agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]
) -> None:
    """A lone tool call's result record rides on its step's checkpoint commit. A save that fails is logged
    and the run goes on (durability never kills a run); the record goes back to the run's scope, and its
    next write carries it, rather than being lost while the run acts on the result."""
    runtime = runtime_on()
    commit = runtime.commit
    failed: list[int] = []

    async def failing_once(transition: Any) -> None:
        if transition.deferred.records and not failed:
            failed.append(len(transition.deferred.records))
            raise OSError("disk I/O error")
        await commit(transition)

    runtime.commit = failing_once
    ledger = Ledger()
    model = ScriptedModel([reply("", call("charge", {"n": 1})), "charged"])
    agent = agent_on(model, {"charge": ledger.tool("charge")}, runtime=runtime)
    result = await agent.run("go", run_id="r1")
    assert result.text == "charged" and len(ledger.entries) == 1 and failed == [1]
    stored = {parse_step_key(r.key).call: r.status for r in await runtime_on().inspect.steps("r1")}
    assert stored == {"model": "done", "call_0_0": "done"}, stored


async def test_a_leg_ends_even_when_a_lease_renewal_swallows_its_cancellation() -> None:
    """A connection pool's wait on Python 3.11 (`asyncio.wait_for`) can drop a cancellation that arrives
    as the wait ends; a renewer that relied on being cancelled renewed forever and its leg never ended.

    The renewer's first renewal is still waiting when the leg ends (the tool returns only once it
    started), so the leg's cancellation always lands inside it, never between two renewals."""
    runtime = MemoryRuntime()
    renew = runtime.lease.renew
    swallowed: list[bool] = []
    test_over: list[bool] = []
    renewing = asyncio.Event()

    async def renew_dropping_cancellation(session_id: str, epoch: int) -> bool:
        if not renewing.is_set():
            renewing.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                swallowed.append(True)  # what the pool's wait did: the renewal goes on as if nothing happened
        if test_over:
            return False  # a lost lease ends any renewer still running, so a failing test ends too
        return await renew(session_id, epoch)

    runtime.lease.renew = renew_dropping_cancellation  # type: ignore[method-assign]

    async def slow(args: Any) -> str:
        await renewing.wait()
        return "ok"

    # A renewal every 1 s; a step trusts the lease for 1.5 s after the claim, so no step renews it itself.
    agent = Agent(model=ScriptedModel([reply("", call("slow", {})), "done"]), tools={"slow": Tool(execute=slow)},
                  durable=DurableOptions(runtime, stale_after_ms=3000), session_id="chat-1")
    run = asyncio.ensure_future(agent.run("go"))
    await asyncio.wait({run}, timeout=5)
    ended = run.done()
    test_over.append(True)
    result = await run
    assert ended, "the leg waited for a renewer that went on renewing"
    assert result.text == "done" and swallowed


def blocking_tool(started: asyncio.Event, go_on: asyncio.Event) -> dict[str, Tool]:
    """A tool that holds its run mid-step until `go_on` is set."""

    async def slow(args: Any) -> str:
        started.set()
        await go_on.wait()
        return "slow ok"

    return {"slow": Tool(execute=slow)}


async def test_a_second_concurrent_run_through_one_runtime_is_refused_and_the_first_finishes(
    runtime_on: Callable[[], Any]
) -> None:
    """Two runs of one session through ONE runtime object (a server with two requests, `gather`):
    the second claim must not take the lease from the first (it would die with StaleEpochError)."""
    runtime = runtime_on()
    started, go_on = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([reply("Working.", call("slow", {}, "c1")), "Done first.", "Done third."])
    agent = Agent(model=model, tools=blocking_tool(started, go_on), session_id="chat-1",
                  durable=DurableOptions(runtime))
    first = asyncio.ensure_future(agent.run("first"))
    await started.wait()
    with pytest.raises(RunLeaseHeldError) as info:
        await agent.run("second")
    assert info.value.session_id == "chat-1" and info.value.owner == runtime.owner
    go_on.set()
    assert (await first).text == "Done first."  # not fenced out by the refused claim
    assert (await agent.run("third")).text == "Done third."  # released: this runtime claims the session again
    assert [m["content"] for m in model.requests[-1].messages if m["role"] == "user"] == ["first", "third"]


async def test_gathered_runs_of_one_session_on_one_runtime_one_runs_one_is_refused(
    runtime_on: Callable[[], Any]
) -> None:
    runtime = runtime_on()
    started, go_on = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([reply("Working.", call("slow", {}, "c1")), "Done."])
    agent = Agent(model=model, tools=blocking_tool(started, go_on), session_id="chat-1",
                  durable=DurableOptions(runtime))

    async def release_when_started() -> None:
        await started.wait()
        go_on.set()

    outcomes = await asyncio.gather(agent.run("a"), agent.run("b"), release_when_started(), return_exceptions=True)
    results = [o for o in outcomes[:2] if not isinstance(o, BaseException)]
    refused = [o for o in outcomes[:2] if isinstance(o, BaseException)]
    assert [r.text for r in results] == ["Done."]
    assert len(refused) == 1 and isinstance(refused[0], RunLeaseHeldError), refused


async def test_a_runtime_reclaims_its_session_after_a_failed_run_or_a_release_that_did_not_land(
    runtime_on: Callable[[], Any]
) -> None:
    runtime = runtime_on()

    def fails_once(request: ModelRequest) -> Any:
        if len(model.requests) == 1:
            raise RuntimeError("model down")
        return "Back."

    model = ScriptedModel(fails_once)
    agent = Agent(model=model, session_id="chat-1", durable=DurableOptions(runtime))
    with pytest.raises(RuntimeError, match="model down"):
        await agent.run("one")
    assert (await agent.run("two")).text == "Back."  # the failed run released in its finally

    release = runtime.lease.release
    rows_change = runtime.backend.change_lease

    async def release_lost(session_id: str, epoch: int) -> None:
        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise OSError("connection lost")

        runtime.backend.change_lease = refused
        try:
            await release(session_id, epoch)
        finally:
            runtime.backend.change_lease = rows_change

    runtime.lease.release = release_lost
    assert (await agent.run("three")).text == "Back."
    assert (await runtime.lease.epoch("chat-1")) is not None and not (
        await runtime_on().lease.claim("chat-1", stale_at=0)).claimed  # the lease row still names this runtime
    runtime.lease.release = release
    assert (await agent.run("four")).text == "Back."  # its own token: no run of it is live, so it re-claims
