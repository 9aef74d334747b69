"""The run lifecycle on every runtime: each phase one fenced commit, a death between any two commits
recoverable, a stale owner landing nothing; and the loop defects found the same way.

A process death is placed exactly where a SIGKILL lands between two commits: a runtime that
raises a control error (`Crash`, never recorded) right after its k-th write returns. Another
runtime over the same storage plays the next process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agent_kit import recording
from durable_agent import (
    Agent,
    AgentCheckpoint,
    CheckpointVersionError,
    ConfigurationError,
    DurableOptions,
    InMemoryCheckpointStore,
    ModelRequest,
    RunExistsError,
    ScriptedModel,
    SessionStateError,
    StaleEpochError,
    Tool,
    ToolApprovalResponse,
    Usage,
    agent_tool,
    call,
    content_parts,
    generate_text,
    message_text,
    reply,
    resolve_approval,
    resume_from_checkpoint,
    total_tokens_exceed,
)
from durable_agent.backends import RunOwner, RunTransition
from helpers import maybe_await
from test_agent import Crash, agent_on, runtime_on  # noqa: F401  # fixtures: memory, SQLite, Postgres
from test_runtime_postgres import conninfo, opened  # noqa: F401

PROMPTS = ("first", "second")


def scripted(effects: list[tuple[str, Any]], requests: list[tuple[str, int]]) -> tuple[ScriptedModel, dict[str, Tool]]:
    """Each prompt: one round of a safe read and an unsafe charge, then a final answer naming the prompt."""

    def answer(request: ModelRequest) -> Any:
        prompts = [message_text(m) for m in request.messages if m["role"] == "user"]
        last_user = max(i for i, m in enumerate(request.messages) if m["role"] == "user")
        turn = sum(1 for m in request.messages[last_user:] if m["role"] == "tool")
        requests.append((prompts[-1], turn))
        if turn == 0:
            return reply("Working.", call("read", {"p": prompts[-1]}, f"read-{len(prompts)}"),
                         call("charge", {"p": prompts[-1]}, f"charge-{len(prompts)}"))
        return f"Done with {prompts[-1]}."

    def effect(name: str) -> Callable[[Any], str]:
        def execute(args: Any) -> str:
            effects.append((name, args["p"]))
            return f"{name} ok"

        return execute

    return ScriptedModel(answer), {"read": Tool(execute=effect("read"), replay="safe"),
                                   "charge": Tool(execute=effect("charge"))}


def elsewhere(runtime: Any) -> Any:
    """`runtime` as a process on another host: only staleness decides whether its lease lapsed."""
    runtime.owner = RunOwner("elsewhere", 1, runtime.owner.token)
    return runtime


def dies_after(runtime: Any, writes: int) -> Any:
    """`runtime`, made to die (raise `Crash`) right after its `writes`-th write commits."""
    count = [0]
    elsewhere(runtime)

    def after_write(method: Callable[..., Any]) -> Callable[..., Any]:
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            value = await method(*args, **kwargs)
            count[0] += 1
            if count[0] == writes:
                raise Crash()
            return value

        return wrapped

    if hasattr(runtime.backend, "write"):  # the SQL runtimes: every write is one transaction here
        runtime.backend.write = after_write(runtime.backend.write)
    else:  # the memory runtime: its lifecycle commits and journal writes
        runtime.commit = after_write(runtime.commit)
        for name in ("put_steps", "add_partial", "awakeable_for"):
            setattr(runtime.backend, name, after_write(getattr(runtime.backend, name)))
    return runtime


async def drive_session(agent: Agent, runtime: Any) -> None:
    """What a worker does: continue what is unfinished, then run the prompts the history lacks."""
    await agent.resume()
    for prompt in PROMPTS:
        last = await runtime.stores.runs.last("chat-1")
        stored = await maybe_await(runtime.stores.checkpoints.load(last)) if last else None
        asked = [m["content"] for m in stored.messages if m["role"] == "user"] if stored else []
        if prompt not in asked:
            await agent.run(prompt)


@pytest.mark.parametrize("death", range(1, 23))
async def test_a_death_after_any_commit_loses_nothing_and_repeats_nothing(
    runtime_on: Callable[[], Any], death: int  # noqa: F811
) -> None:
    effects: list[tuple[str, Any]] = []
    requests: list[tuple[str, int]] = []
    model, tools = scripted(effects, requests)
    doomed = dies_after(runtime_on(), death)
    crashed = False
    try:
        await drive_session(Agent(model=model, tools=tools, session_id="chat-1",
                                  durable=DurableOptions(doomed, stale_after_ms=1)), doomed)
    except Crash:
        crashed = True
    await asyncio.sleep(0.005)  # the dead process's lease goes stale
    runtime = runtime_on()
    agent = Agent(model=model, tools=tools, session_id="chat-1", durable=DurableOptions(runtime, stale_after_ms=1))
    await drive_session(agent, runtime)  # the next process: never raises, finishes the session

    assert await agent.resume() is None  # nothing left: a finished run is never driven again
    final = await maybe_await(runtime.stores.checkpoints.load(await runtime.stores.runs.last("chat-1")))
    assert final.status == "completed"
    kept = [m for i, m in enumerate(final.messages)  # an aborted partial turn is followed by the retried one
            if not (m["role"] == "assistant" and i + 1 < len(final.messages)
                    and final.messages[i + 1]["role"] == "assistant")]
    texts = [p["text"] for m in kept if m["role"] == "assistant" for p in m["content"] if p["type"] == "text"]
    assert [m["content"] for m in final.messages if m["role"] == "user"] == list(PROMPTS)
    assert texts.count("Done with first.") == 1 and texts.count("Done with second.") == 1, texts
    assert effects.count(("charge", "first")) <= 1 and effects.count(("charge", "second")) <= 1
    for prompt in PROMPTS:  # at most the one model call the death cut short is requested again
        assert requests.count((prompt, 0)) <= 1 + crashed and requests.count((prompt, 1)) <= 1 + crashed


async def test_run_resumes_a_run_whose_owner_went_away_between_listing_and_claim(
    runtime_on: Callable[[], Any]  # noqa: F811
) -> None:
    """``on_interrupted="resume"``: `run()` lists the resumable runs, then claims. A run whose owner
    still held the lease at the listing and lapsed before the claim is resumed, not healed."""
    effects: list[tuple[str, Any]] = []
    requests: list[tuple[str, int]] = []
    model, tools = scripted(effects, requests)
    charge = tools["charge"].execute
    assert charge is not None

    def dies_in_charge(args: Any) -> Any:
        if not any(e == ("charge", "first") for e in effects):
            effects.append(("charge", "first"))
            raise Crash()  # the effect happened; the process died before its done record
        return charge(args)

    first = Agent(model=model, tools={**tools, "charge": Tool(execute=dies_in_charge)}, session_id="chat-1",
                  durable=DurableOptions(elsewhere(runtime_on())))
    with pytest.raises(Crash):
        await first.run("first")
    holder = elsewhere(runtime_on())  # the owner at listing time: alive, lease fresh
    assert (await holder.lease.claim("chat-1", stale_at=0)).claimed

    runtime = runtime_on()
    claim = runtime.lease.claim

    async def after_the_owner_lapsed(session_id: str, *, stale_at: int, **options: Any) -> Any:
        return await claim(session_id, stale_at=10**15, **options)  # time passed: the holder's lease lapsed

    runtime.lease.claim = after_the_owner_lapsed
    agent = Agent(model=model, tools=tools, session_id="chat-1",
                  durable=DurableOptions(runtime, on_interrupted="resume", stale_after_ms=60_000))
    result = await agent.run("second")

    assert result.text == "Done with second."
    assert ("first", 1) in requests  # the interrupted run went on to its final answer
    texts = [p["text"] for m in result.messages if m["role"] == "assistant" for p in content_parts(m)
             if p["type"] == "text"]
    assert texts.count("Done with first.") == 1
    assert effects.count(("charge", "first")) == 1  # its unsafe call is reported interrupted, never repeated


async def test_a_run_id_makes_starting_a_prompt_idempotent_across_processes(
    runtime_on: Callable[[], Any]  # noqa: F811
) -> None:
    """Two processes decide to run the same prompt: the second start is refused with `RunExistsError`,
    after finishing the first one's interrupted run (resume mode), and the prompt is in the history once."""
    effects: list[tuple[str, Any]] = []
    requests: list[tuple[str, int]] = []
    model, tools = scripted(effects, requests)
    doomed = dies_after(runtime_on(), 2)  # dies inside the run: after its start and its first step's write
    with pytest.raises(Crash):
        await Agent(model=model, tools=tools, session_id="chat-1",
                    durable=DurableOptions(doomed, stale_after_ms=1)).run("first", run_id="chat-1/0")
    await asyncio.sleep(0.005)  # the dead process's lease goes stale
    runtime = runtime_on()
    agent = Agent(model=model, tools=tools, session_id="chat-1",
                  durable=DurableOptions(runtime, on_interrupted="resume", stale_after_ms=1))
    with pytest.raises(RunExistsError) as refused:
        await agent.run("first", run_id="chat-1/0")
    assert refused.value.run_id == "chat-1/0" and refused.value.code == "run_exists"
    assert isinstance(refused.value, ConfigurationError)
    stored = await maybe_await(runtime.stores.checkpoints.load("chat-1/0"))
    assert stored.status == "completed"  # finished by the refused call's recovery
    assert [m["content"] for m in stored.messages if m["role"] == "user"] == ["first"]
    assert (await agent.run("second", run_id="chat-1/1")).text == "Done with second."


async def test_a_stale_owner_lands_no_lifecycle_write(agent_on: Callable[..., Agent],  # noqa: F811
                                                      runtime_on: Callable[[], Any]) -> None:  # noqa: F811
    """Stalled right before a checkpoint commit while another process claimed the session: nothing lands."""
    runtime, thief = elsewhere(runtime_on()), runtime_on()
    commit = runtime.commit
    stolen: list[int] = []

    async def stalls_then_commits(transition: RunTransition) -> None:
        if transition.checkpoint is not None and transition.checkpoint.step_index == 1 and not stolen:
            claim = await thief.lease.claim("chat-1", stale_at=10**15)  # the lease lapsed meanwhile
            assert claim.claimed
            stolen.append(claim.epoch)
        await commit(transition)

    runtime.commit = stalls_then_commits
    model = ScriptedModel([reply("", call("noop", {})), "done"])
    agent = Agent(model=model, tools={"noop": Tool(execute=lambda a: "ok")}, session_id="chat-1",
                  durable=DurableOptions(runtime))
    with pytest.raises(StaleEpochError):
        await agent.run("go")
    last = await thief.stores.runs.last("chat-1")
    stored = await maybe_await(thief.stores.checkpoints.load(last))
    assert stored.step_index == 0 and stored.status == "running"  # the start commit only
    assert await thief.lease.resumable_run("chat-1") == last
    with pytest.raises(StaleEpochError):  # every other lifecycle write of the old epoch is refused too
        await runtime.commit(RunTransition("chat-1", stolen[0] - 1, unmark=True))
    assert await thief.lease.resumable_run("chat-1") == last


async def test_resume_of_a_completed_run_returns_none_without_a_model_call(
    agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]  # noqa: F811
) -> None:
    model = ScriptedModel([reply("", call("noop", {})), "done", "never asked"])
    tools = {"noop": Tool(execute=lambda a: "ok")}
    first = await agent_on(model, tools).run("go")
    assert await agent_on(model, tools).resume(run_id=first.run_id) is None
    assert await agent_on(model, tools).resume() is None
    assert len(model.requests) == 2


async def test_a_marked_run_without_checkpoint_is_reported_with_a_way_out(
    agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]  # noqa: F811
) -> None:
    runtime = runtime_on()
    claim = await runtime.lease.claim("chat-1", stale_at=0)
    await runtime.commit(RunTransition("chat-1", claim.epoch, mark="ghost-run", last_run="ghost-run"))
    await runtime.lease.release("chat-1", claim.epoch)  # state an older version could leave behind
    model = ScriptedModel(["hello"])
    attempts: list[Callable[[Agent], Awaitable[Any]]] = [lambda a: a.resume(), lambda a: a.run("hi")]
    for attempt in attempts:
        with pytest.raises(SessionStateError) as info:
            await attempt(agent_on(model, {}))
        assert info.value.session_id == "chat-1" and info.value.run_id == "ghost-run"
        assert "abandon_interrupted" in str(info.value)
    assert await agent_on(model, {}).abandon_interrupted() == "ghost-run"
    assert (await agent_on(model, {}).run("hi")).text == "hello"


# ---------------------------------------------------------------- loop defects


async def test_a_newer_checkpoint_is_refused_on_resume_whatever_the_store() -> None:
    store = InMemoryCheckpointStore()
    store.save(AgentCheckpoint(run_id="r", step_index=3, status="suspended", usage=Usage(), created_at=1,
                               messages=[{"role": "user", "content": "x"}], version=2))
    model = ScriptedModel(["never"])
    with pytest.raises(CheckpointVersionError):
        await resume_from_checkpoint(store, "r", model=model, tools={"t": Tool(execute=lambda a: 1)})
    with pytest.raises(CheckpointVersionError):  # a new call on that run id must not overwrite it either
        await generate_text(model=model, tools={"t": Tool(execute=lambda a: 1)}, messages=[{"role": "user",
                            "content": "x"}], store=store, run_id="r")
    stored = store.load("r")
    assert stored is not None and stored.version == 2 and not model.requests


async def test_newer_checkpoint_of_an_agent_session_is_refused(agent_on: Callable[..., Agent],  # noqa: F811
                                                               runtime_on: Callable[[], Any]) -> None:  # noqa: F811
    runtime = runtime_on()
    if not isinstance(runtime.stores.checkpoints, InMemoryCheckpointStore):
        pytest.skip("stores that decode text refuse a newer version on load (tested with the codec)")
    await agent_on(ScriptedModel(["a"]), {}, runtime=runtime).run("hi")
    last = await runtime.stores.runs.last("chat-1")
    old = runtime.stores.checkpoints.load(last)
    assert old is not None
    runtime.stores.checkpoints.save(AgentCheckpoint(run_id=last, step_index=old.step_index, status="completed",
                                                usage=Usage(), created_at=1, messages=old.messages, version=2))
    with pytest.raises(CheckpointVersionError):
        await agent_on(ScriptedModel(["b"]), {}, runtime=runtime).run("again")


@pytest.mark.parametrize("verdict", ["false", "true", 0, 1, None])
async def test_a_verdict_must_be_a_real_bool_on_every_path(verdict: Any) -> None:
    with pytest.raises(ConfigurationError):
        ToolApprovalResponse("a-1", verdict)
    from durable_agent import MemoryRuntime

    with pytest.raises(ConfigurationError):
        await resolve_approval(MemoryRuntime(), "a-1", approved=verdict)
    paid: list[Any] = []
    with pytest.raises(ConfigurationError):  # server mode: an approver's answer is a verdict too
        await generate_text(
            model=ScriptedModel([reply("", call("pay", {})), "done"]),
            messages=[{"role": "user", "content": "pay"}],
            tools={"pay": Tool(execute=recording(paid, "paid"), needs_approval=True)},
            approve_tool_call=lambda request: verdict,
        )
    assert paid == []


async def test_sub_agent_usage_counts_toward_the_parent_and_its_budget() -> None:
    child = agent_tool(name="helper", model=ScriptedModel([reply("", call("noop", {})), "child done"]),
                       tools={"noop": Tool(execute=lambda a: "ok")})
    parent_model = ScriptedModel([reply("", call("helper", {"prompt": "help"})),
                                  reply("", call("helper", {"prompt": "again"})), "parent done"])
    store = InMemoryCheckpointStore()
    result = await generate_text(model=parent_model, tools={"helper": child}, store=store, run_id="p",
                                 messages=[{"role": "user", "content": "go"}], stop_when=[total_tokens_exceed(20)])
    child_checkpoint = store.load("p::helper#" + result.steps[0].tool_calls[0]["tool_call_id"])
    assert child_checkpoint is not None
    child_usage = child_checkpoint.usage
    assert child_usage.total_tokens > 0
    assert result.finish_reason == "stop-condition" and len(result.steps) == 1  # the child's tokens count
    assert result.total_usage.total_tokens == result.steps[0].usage.total_tokens + child_usage.total_tokens
    parent = store.load("p")
    assert parent is not None and parent.usage == result.total_usage


async def test_a_crash_in_the_leg_after_an_approval_stays_resumable(
    agent_on: Callable[..., Agent], runtime_on: Callable[[], Any]  # noqa: F811
) -> None:
    """The leg that settles the verdict is marked in progress again: a death after its first checkpoint
    (here in the next model call) leaves a run `resume()` continues, not a run nothing will ever finish."""
    paid: list[Any] = []
    answers = iter([reply("", call("pay", {"id": 7})), Crash(), "Paid."])

    def answer(request: ModelRequest) -> Any:
        step = next(answers)
        if isinstance(step, Crash):
            raise step  # the process dies in the leg after the approval, past its settle checkpoint
        return step

    model = ScriptedModel(answer)
    tools = {"pay": Tool(execute=recording(paid, "paid"), needs_approval=True)}
    parked = await agent_on(model, tools).run("pay it")
    assert parked.finish_reason == "suspended"
    verdict = ToolApprovalResponse(parked.pending_approvals[0].approval_id, True)
    with pytest.raises(Crash):
        await agent_on(model, tools, stale_after_ms=1).resume(approval_responses=[verdict])
    await asyncio.sleep(0.005)
    done = await agent_on(model, tools, stale_after_ms=1).resume()
    assert done is not None and done.text == "Paid." and paid == [{"id": 7}]


async def test_a_stop_request_from_another_process_ends_the_run_for_good(
    agent_on: Callable[..., Agent],  # noqa: F811
) -> None:
    """`DurableSession.request_stop` from another "process" (no lease): the leg watching stop requests stops at its
    next check, unmarks the run (the session's next run starts) and raises `RunAbortedError`; a leg without the
    option leaves nothing to ask (False, nothing recorded), and the caller's own signal leaves the run marked."""
    from durable_agent import RunAbortedError

    words = " ".join(f"w{i}" for i in range(200))
    agent = agent_on(ScriptedModel([words, "next"], delay=0.01), {}, stop_requests=True)
    streamed = asyncio.Event()

    async def seen(run_id: str | None, part: Any) -> None:
        streamed.set()

    running = asyncio.ensure_future(agent.run("long", run_id="run-stop", on_part=seen))
    await streamed.wait()
    other = agent_on(ScriptedModel([]), {})  # another process's agent of the session, without the option
    assert other.session is not None
    assert await other.session.request_stop("run-stop") is True
    with pytest.raises(RunAbortedError):
        await running
    runtime = other.durable.runtime if other.durable is not None else None
    assert runtime is not None and await runtime.lease.resumable_run("chat-1") is None
    assert (await agent_on(ScriptedModel(["next"]), {}).run("again")).text == "next"
    assert await other.session.request_stop("never-ran") is False

    own = asyncio.Event()

    async def abort(run_id: str | None, part: Any) -> None:
        own.set()

    plain = agent_on(ScriptedModel([words, words], delay=0.01), {}, stop_requests=True)
    assert plain.durable is not None
    with pytest.raises(RunAbortedError):
        await plain.durable_copy(plain.durable, "chat-1", signal=own).run("mine", run_id="r2", on_part=abort)
    assert await runtime.lease.resumable_run("chat-1") == "r2"  # the caller's own abort: resumable as before


async def test_a_run_stopped_after_its_model_answered_and_before_its_tools_counts_that_answers_tokens(
    agent_on: Callable[..., Agent],  # noqa: F811
) -> None:
    """A stop asked once the step's model call answered (its tokens paid) ends the run before the step's tools
    run: the run stays at its last checkpoint (its history, its step), unmarked, and its usage counts the
    answer's tokens, which no later leg would count (nothing continues a stopped run)."""
    from durable_agent import RunAbortedError

    ran: list[Any] = []
    own = asyncio.Event()
    answer = ScriptedModel([reply("Let me look", call("t", {}, "c1"), usage=Usage(5, 6, 11))])
    asks: list[Callable[[str], Awaitable[bool]]] = []  # another process's `request_stop`

    class StoppedOnceAnswered:
        """The answer, then a stop asked from another process, which the leg notices at its next check."""

        model_id = "stopped"

        async def stream(self, request: ModelRequest) -> Any:
            async for event in answer.stream(request):
                yield event
            assert await asks[0]("r") is True
            own.set()  # the leg's check sees the stop now, not a quarter second later

    agent = agent_on(StoppedOnceAnswered(), {"t": Tool(execute=recording(ran, "ok"))}, stop_requests=True)
    other = agent_on(ScriptedModel([]), {})
    assert agent.durable is not None and other.session is not None
    asks.append(other.session.request_stop)
    with pytest.raises(RunAbortedError):
        await agent.durable_copy(agent.durable, "chat-1", signal=own).run("x", run_id="r")
    runtime = agent.durable.runtime
    checkpoint = await maybe_await(runtime.stores.checkpoints.load("r"))
    assert (checkpoint.step_index, checkpoint.status, [m["role"] for m in checkpoint.messages]) == (0, "running",
                                                                                                   ["user"])
    assert checkpoint.usage == Usage(5, 6, 11) and ran == []
    assert await runtime.lease.resumable_run("chat-1") is None


@pytest.mark.parametrize("how", ["abort", "suspend"])
async def test_a_leg_stopped_after_its_model_answered_leaves_the_answer_to_the_resume_which_counts_it(
    agent_on: Callable[..., Agent], how: str,  # noqa: F811
) -> None:
    """The caller's own abort signal, or `Agent.suspend`, once the step's model call answered: the run stays
    resumable, and its resume replays the recorded answer (the model is not asked again), runs the tools, and
    counts the answer's tokens with the next step's."""
    from durable_agent import RunAbortedError, RunSuspendedError

    ran: list[Any] = []
    own = asyncio.Event()
    model = ScriptedModel([reply("Let me look", call("t", {}, "c1"), usage=Usage(5, 6, 11)),
                           reply("Done.", usage=Usage(1, 1, 2))])
    agents: list[Agent] = []

    class StoppedOnceAnswered:
        model_id = "stopped"

        async def stream(self, request: ModelRequest) -> Any:
            async for event in model.stream(request):
                yield event
            if how == "abort":
                own.set()
            else:
                agents[0].suspend()

    tools = {"t": Tool(execute=recording(ran, "ok"))}
    plain = agent_on(StoppedOnceAnswered(), tools)
    assert plain.durable is not None
    agents.append(plain.durable_copy(plain.durable, "chat-1", signal=own) if how == "abort" else plain)
    agent = agents[0]
    with pytest.raises(RunAbortedError if how == "abort" else RunSuspendedError):
        await agent.run("x", run_id="r")
    assert ran == [] and len(model.requests) == 1
    done = await agent_on(model, tools).resume(run_id="r")
    assert done is not None and done.text == "Done." and ran == [{}] and len(model.requests) == 2
    assert done.total_usage == Usage(6, 7, 13)


def test_stop_requests_need_a_checkpoint_mode_runtime() -> None:
    class Replay:
        mode = "replay"

    with pytest.raises(ConfigurationError):
        DurableOptions(Replay(), stop_requests=True)  # type: ignore[arg-type]
