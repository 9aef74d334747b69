"""The endpoint in process: the events a reader is sent (keyed by the run's progress, and what a process that
died never logged rebuilt from the run's stored records), the UI message stream mapping (against frames
recorded from the protocol's documentation), the event logs, and the ASGI app (mounting, disconnects)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn

import pytest

from agent_kit import Ledger, tool_results
from durable_agent import (
    Agent,
    ApprovalSigner,
    ConfigurationError,
    DurableOptions,
    ModelCallError,
    ModelRequest,
    RetryPolicy,
    ScriptedModel,
    ScriptedResponse,
    StreamPart,
    Tool,
    Usage,
    call,
    current_tool_call,
    reply,
)
from durable_agent.backends import EndpointRuntime
from durable_agent.backends.memory import MemoryDurableState, MemoryRuntime
from durable_agent.http import (
    ChatEndpoint,
    CorsSettings,
    EventLog,
    MemoryEventLog,
    PostgresEventLog,
    RunEvent,
    SqliteEventLog,
    UiMessageStream,
)
from helpers import wall_clock_ms
from ui_message_stream_schema import check_chunk

VECTORS = Path(__file__).parent / "vectors"


# ------------------------------------------------ events keyed by progress, rebuilt after a process died
#
# A reader is sent the run's event log. Each event's key says where in the run it happened (`RunEvent.key`),
# so what a process that took a run over emits again is stored once; and what the run's stored records
# prove but the dead process never logged is rebuilt from them before the run goes on. Below, process A
# dies at a point the test picks, and process B, an hour later (A's lease long lapsed), serves a reader
# on what A left: a clone of A's memory runtime state and a copy of its event log.

HOUR_MS = 3_600_000


class Died(Exception):
    """Raised where process A dies: nothing A does after it reaches what A left (`DyingLog.left`)."""


class DyingLog(MemoryEventLog):
    """Process A's event log, beside A's runtime `state`. `die()` keeps both as they are now for process B (`left`:
    a clone of the state, a copy of this log) and raises `Died`; this log calls it as it is about to store the
    event keyed `at` (or a key under ``at/``), and A's model or tool may call it themselves."""

    def __init__(self, state: MemoryDurableState, at: str = "") -> None:
        super().__init__()
        self.state, self.at = state, at
        self.runs: list[str] = []
        self.left: tuple[MemoryDurableState, MemoryEventLog] | None = None
        self.dead = asyncio.Event()

    async def create_run(self, run_id: str, session_id: str, meta: Mapping[str, Any]) -> bool:
        created = await super().create_run(run_id, session_id, meta)
        if created:
            self.runs.append(run_id)
        return created

    async def append(self, run_id: str, events: Sequence[tuple[str, dict[str, Any]]]) -> list[RunEvent]:
        if self.left is None and self.at and any(k == self.at or k.startswith(f"{self.at}/") for k, _ in events):
            await self.die()
        return await super().append(run_id, events)

    async def die(self) -> NoReturn:
        copy = MemoryEventLog()
        for run_id in self.runs:
            info = await self.run_info(run_id)
            assert info is not None
            await copy.create_run(run_id, info.session_id, info.meta)
            await copy.append(run_id, [(e.key, e.data) for e in await self.read(run_id)])
        self.left = (self.state.clone(), copy)
        self.dead.set()
        raise Died


def endpoint(runtime: EndpointRuntime, events: EventLog, model: Any, tools: Mapping[str, Tool] | None = None,
             *, on_interrupted: Literal["heal", "resume"] = "heal", **options: Any) -> ChatEndpoint:
    """An endpoint serving session agents of `model` and `tools` on `runtime` (`options`: the agents' own)."""
    durable = DurableOptions(runtime, on_interrupted=on_interrupted)
    return ChatEndpoint(agent=lambda s: Agent(model=model, tools=dict(tools or {}), session_id=s, durable=durable,
                                              **options),
                        runtime=runtime, events=events)


async def started(app: ChatEndpoint, prompt: str = "x") -> str:
    """The id of the run of session ``s`` on `prompt` that `app` started."""
    status, body = await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": prompt})
    assert status == 201, body
    return str(json.loads(body)["run_id"])


async def died_in_run(log: DyingLog, model: Any, tools: Mapping[str, Tool] | None = None, **options: Any) -> str:
    """Process A starts a run and dies in it; the run's id."""
    run_id = await started(endpoint(MemoryRuntime(log.state), log, model, tools, **options))
    await asyncio.wait_for(log.dead.wait(), 10)
    return run_id


def later() -> int:
    """Process B's clock: an hour after A died (A's lease lapsed long ago)."""
    return wall_clock_ms() + HOUR_MS


def left_by(log: DyingLog) -> tuple[MemoryRuntime, MemoryEventLog]:
    """What A left, as process B sees it: the runtime on A's state, and A's event log."""
    assert log.left is not None
    state, events = log.left
    return MemoryRuntime(state, clock=later), events


def taken_over(log: DyingLog, model: Any, tools: Mapping[str, Tool] | None = None,
               **options: Any) -> tuple[ChatEndpoint, MemoryEventLog]:
    """Process B's endpoint on what A left, and its event log."""
    runtime, events = left_by(log)
    return endpoint(runtime, events, model, tools, clock=later, **options), events


async def reconnected(app: ChatEndpoint, events: EventLog, run_id: str, after: int | None = None) -> list[RunEvent]:
    """What a reader that saw `after` events (default: all the log holds) gets from `app` to the end of the leg:
    exactly the log's events after them, returned with their keys."""
    after = len(await events.read(run_id)) if after is None else after
    status, body = await asgi(app, "GET", f"/runs/{run_id}/events?after={after}")
    logged = await events.read(run_id, after)
    assert status == 200 and data_lines(body) == [{**e.data, "seq": e.seq} for e in logged]
    return logged


def said(events: Sequence[RunEvent]) -> list[tuple[str, Any]]:
    """Each event's key and what it says: the text of a delta, the reason of a finish, the output of a result."""
    return [(e.key, e.data.get("text", e.data.get("finish_reason", e.data.get("output")))) for e in events]


class EventModel:
    """A model whose n-th call streams the n-th list of `calls`; an exception in the list is raised there."""

    model_id = "events"

    def __init__(self, *calls: Sequence[dict[str, Any] | Exception]) -> None:
        self.calls = calls
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        self.requests.append(request)
        for event in self.calls[len(self.requests) - 1]:
            if isinstance(event, Exception):
                raise event
            yield event


def delta(text: str) -> dict[str, Any]:
    return {"type": "text-delta", "text": text}


PICK_FILE = Tool(description="Ask the user for a file.", parameters={"type": "object"})
"""A client tool: the user's browser answers its calls."""

STOP = {"type": "finish", "finish_reason": "stop", "usage": Usage(1, 1, 2)}
RETRY_FAST = RetryPolicy(initial_delay_ms=1, jitter=False)


def flaky() -> list[dict[str, Any] | Exception]:
    """A model call that streams a word, then fails as overloaded (a retry's reason)."""
    return [delta("Hel"), ModelCallError("busy", provider="test", kind="overloaded", retryable=True)]


FLAKY_RETRY = {"type": "step-retry", "step_index": 1, "attempt": 0, "error": "ModelCallError: busy", "delay_ms": 1}
"""The event of the retry after step 1's first attempt failed as `flaky` fails (with `RETRY_FAST`)."""


class ProgressSource:
    """A tool source (what an MCP server is to a run) whose one tool, ``scan``, reports its progress as it runs."""

    name = "scanner"
    changed = False

    async def __aenter__(self) -> ProgressSource:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    async def refresh(self) -> None:
        return None

    def listing(self) -> list[dict[str, Any]]:
        return [{"name": "scan"}]

    def bind(self, listing: Sequence[Mapping[str, Any]]) -> dict[str, Tool]:
        return {"scan": Tool(execute=self.scan)}

    def scan(self, args: Any) -> str:
        context = current_tool_call()
        assert context is not None and context.progress_sink is not None  # the report is streamed, not dropped
        context.report_progress(1, 2)
        return "scanned"


async def test_every_logged_event_is_keyed_by_where_in_the_run_it_happened() -> None:
    """A text delta by its step and the characters of that step's text before it, a call, result or approval by
    its id, a step's finish by its step, a leg's finish by the step its checkpoint ended at. A refusal and a tool's
    progress report are sent to no reader: they are no point of the run's progress."""
    runtime, log = MemoryRuntime(), MemoryEventLog()
    model = EventModel(
        [delta("Let "), delta("me "), delta("see."), {"type": "tool-call", "tool_call_id": "c1", "tool_name": "scan",
                                                       "input": {}},
         {"type": "tool-call", "tool_call_id": "c2", "tool_name": "rm", "input": {"path": "x"}},
         {"type": "finish", "finish_reason": "tool-calls", "usage": Usage(1, 1, 2)}],
        [{"type": "refusal", "text": "I would rather not."}, {**STOP, "finish_reason": "refusal"}])
    app = endpoint(runtime, log, model, {"rm": Ledger().tool("rm", needs_approval=True)},
                   mcp_servers=[ProgressSource()])
    run_id = await started(app)
    leg1 = await reconnected(app, log, run_id, 0)
    approval = next(e for e in leg1 if e.key.startswith("approval/"))
    assert [e.key for e in leg1] == ["step/1/start", "step/1/text/0", "step/1/text/4", "step/1/text/7", "call/c1",
                                     "call/c2", approval.key, "step/1/finish", "finish/1"]
    assert approval.data == {"type": "tool-approval-request", "approval_id": approval.key.removeprefix("approval/"),
                             "tool_call_id": "c2", "tool_name": "rm", "input": {"path": "x"}, "agent_path": None,
                             "token": None}
    assert leg1[4].data == {"type": "tool-call", "step_index": 1, "tool_call_id": "c1", "tool_name": "scan",
                            "input": {}}
    verdict = {"approval_id": approval.data["approval_id"], "approved": True}
    assert (await asgi(app, "POST", f"/runs/{run_id}/approvals", verdict))[0] == 202
    leg2 = await reconnected(app, log, run_id, leg1[-1].seq)
    assert said(leg2) == [("result/c1", "scanned"), ("result/c2", "ok"), ("step/3/start", None),
                          ("step/3/finish", "refusal"), ("finish/3", "refusal")]


async def test_text_streamed_before_the_process_died_but_never_logged_is_sent_and_its_step_closes_as_aborted() -> None:
    """A's model call streamed its three words (each a stored partial) and A died logging the second: the reader
    gets the text A never logged, keyed after the logged text, then the step's finish as ``aborted``; B joins
    the text as an aborted turn and goes on with the next step (it never asks for step 1's answer again)."""
    script: list[ScriptedResponse | str] = ["Hi there friend", "Sorry, cut off."]
    log = DyingLog(MemoryDurableState(), at="step/1/text/3")
    run_id = await died_in_run(log, ScriptedModel(script))
    app, events = taken_over(log, model := ScriptedModel(script))
    got = await reconnected(app, events, run_id)
    assert got[0].data == {"type": "text-delta", "step_index": 1, "attempt": 0, "offset": 3, "text": "there friend"}
    assert said(got) == [("step/1/text/3", "there friend"), ("step/1/finish", "aborted"), ("step/2/start", None),
                         ("step/2/text/0", "Sorry, "), ("step/2/text/7", "cut "), ("step/2/text/11", "off."),
                         ("step/2/finish", "stop"), ("finish/2", "stop")]
    assert len(model.requests) == 1 and model.requests[0].messages[-1] == {
        "role": "assistant", "content": [{"type": "text", "text": "Hi there friend"}]}


async def test_a_model_call_that_died_before_it_streamed_text_is_asked_again_and_nothing_is_rebuilt() -> None:
    """A died logging the call its model streamed (no text: no partial stored, no answer recorded): nothing
    proves the call, so nothing is rebuilt; B asks the model for step 1 again, and its call is the one sent."""
    script: list[ScriptedResponse | str] = [reply("", call("t", {}, "c1")), "done"]
    log = DyingLog(MemoryDurableState(), at="call/c1")
    ledger = Ledger()
    run_id = await died_in_run(log, ScriptedModel(script), {"t": ledger.tool("t")})
    app, events = taken_over(log, model := ScriptedModel(script), {"t": ledger.tool("t")})
    assert [e.key for e in await events.read(run_id)] == ["step/1/start"]
    got = await reconnected(app, events, run_id)
    assert [e.key for e in got] == ["call/c1", "result/c1", "step/1/finish", "step/2/start", "step/2/text/0",
                                    "step/2/finish", "finish/2"]
    assert len(model.requests) == 2 and ledger.entries == [("t", {})]  # step 1 asked again; the tool ran once, in B


async def test_a_failed_attempt_the_process_died_before_logging_is_sent_as_a_retry_then_the_next_attempt() -> None:
    """A's first model call attempt streamed a word and failed (the failure recorded with its retry decision, the
    word dropped with it); A died logging the word. The reader gets the retry as A would have sent it (B replays
    the failed attempt from its record, without the model), then the next attempt's text, keyed by the attempt
    from its character 0."""
    log = DyingLog(MemoryDurableState(), at="step/1/text/0")
    run_id = await died_in_run(log, EventModel(flaky()), retry=RETRY_FAST)
    app, events = taken_over(log, model := EventModel([delta("Hel"), delta("lo"), STOP]), retry=RETRY_FAST)
    got = await reconnected(app, events, run_id)
    assert got[0].data == FLAKY_RETRY
    assert said(got[1:]) == [("step/1/text/1/0", "Hel"), ("step/1/text/1/3", "lo"), ("step/1/finish", "stop"),
                             ("finish/1", "stop")]
    assert len(model.requests) == 1


async def test_the_next_attempts_text_the_process_died_before_logging_is_sent_keyed_by_its_attempt() -> None:
    """A logged the first attempt's word and its retry, and died logging the second attempt's: the reader gets
    that attempt's text (its partials), keyed by the attempt, and the step's finish as ``aborted``."""
    log = DyingLog(MemoryDurableState(), at="step/1/text/1/0")
    run_id = await died_in_run(log, EventModel(flaky(), [delta("Hel"), delta("lo"), STOP]), retry=RETRY_FAST)
    app, events = taken_over(log, EventModel([delta("Sorry."), STOP]), retry=RETRY_FAST)
    assert [e.key for e in await events.read(run_id)] == ["step/1/start", "step/1/text/0", "step/1/retry/0"]
    got = await reconnected(app, events, run_id)
    assert said(got) == [("step/1/text/1/0", "Hello"), ("step/1/finish", "aborted"), ("step/2/start", None),
                         ("step/2/text/0", "Sorry."), ("step/2/finish", "stop"), ("finish/2", "stop")]


async def test_a_step_whose_checkpoint_committed_gets_its_results_and_finish_and_is_not_sent_twice() -> None:
    """A died logging the tool's result, its step checkpointed: the reader gets the result and the step's finish
    from the checkpoint and the recorded model answer, then B's next step; B replays step 1 from its records
    (the tool does not run again, the model is not asked again) and sends none of it twice."""
    script: list[ScriptedResponse | str] = [reply("Hi there", call("t", {}, "c1"), usage=Usage(5, 6, 11)),
                                            reply("done", usage=Usage(7, 1, 8))]
    log = DyingLog(MemoryDurableState(), at="result/c1")
    ledger = Ledger()
    run_id = await died_in_run(log, ScriptedModel(script), {"t": ledger.tool("t", result={"n": 1})})
    app, events = taken_over(log, model := ScriptedModel(script), {"t": ledger.tool("t")})
    assert [e.key for e in await events.read(run_id)] == ["step/1/start", "step/1/text/0", "step/1/text/3", "call/c1"]
    got = await reconnected(app, events, run_id)
    assert said(got) == [("result/c1", {"n": 1}), ("step/1/finish", "tool-calls"), ("step/2/start", None),
                         ("step/2/text/0", "done"), ("step/2/finish", "stop"), ("finish/2", "stop")]
    assert got[0].data == {"type": "tool-result", "tool_call_id": "c1", "tool_name": "t", "output": {"n": 1},
                           "is_error": False}
    assert got[1].data["usage"] == Usage(5, 6, 11).to_dict() and got[-1].data["total_usage"]["total_tokens"] == 19
    assert ledger.entries == [("t", {})] and len(model.requests) == 1  # the tool ran in A; B asked for step 2 only


async def test_the_answer_another_process_recorded_for_the_open_step_is_sent_with_its_retries() -> None:
    """A died logging its model's tool call (no text: nothing of the call stored). An operator then finished the run
    from the command line (``durable-agent runs resume``: `Agent.resume`, which logs no events), where the model
    failed once and then answered with text. A reader gets what the records prove of the step the log shows open:
    the failed attempt's retry, the answer's text keyed by its attempt, its call and result, the step's finish;
    then the step the operator's process ran after it, and the run's finish."""
    log = DyingLog(MemoryDurableState(), at="call/c1")
    ledger = Ledger()
    run_id = await died_in_run(log, ScriptedModel([reply("", call("t", {}, "c1"))]), {"t": ledger.tool("t")})
    runtime, events = left_by(log)
    answer = [delta("Let me "), delta("see."),
              {"type": "tool-call", "tool_call_id": "c1", "tool_name": "t", "input": {}},
              {"type": "finish", "finish_reason": "tool-calls", "usage": Usage(1, 1, 2)}]
    model = EventModel(flaky(), answer, [delta("Done."), STOP])
    worker = Agent(model=model, tools={"t": ledger.tool("t")}, session_id="s", durable=DurableOptions(runtime),
                   retry=RETRY_FAST, clock=later)
    result = await worker.resume(run_id=run_id)
    assert result is not None and result.text == "Done."
    app = endpoint(runtime, events, model, {"t": ledger.tool("t")}, clock=later)
    got = await reconnected(app, events, run_id)
    assert said(got) == [("step/1/retry/0", None), ("step/1/text/1/0", "Let me see."), ("call/c1", None),
                         ("result/c1", "ok"), ("step/1/finish", "tool-calls"), ("step/2/start", None),
                         ("step/2/text/0", "Done."), ("step/2/finish", "stop"), ("finish/2", "stop")]
    assert got[0].data == FLAKY_RETRY and got[2].data == {
        "type": "tool-call", "step_index": 1, "tool_call_id": "c1", "tool_name": "t", "input": {}}
    assert len(model.requests) == 3 and ledger.entries == [("t", {})]  # the reader's process asks nothing again


TOOL_STEPS: list[ScriptedResponse | str] = [
    reply("Let me see", call("t", {"a": 1}, "c1"), usage=Usage(1, 2, 3)),
    reply("", call("t", {"a": 2}, "c2"), call("u", {}, "c3"), usage=Usage(4, 5, 9)),
    reply("More", call("u", {}, "c4"), usage=Usage(2, 2, 4)),
    reply("Done.", usage=Usage(3, 3, 6))]
"""A run of three tool steps and an answer (each later step's text one word: one delta, live or rebuilt)."""


async def sent_after_death(script: Sequence[ScriptedResponse | str], tools: Mapping[str, Tool], at: str, *,
                           elsewhere: bool, **options: Any) -> tuple[ChatEndpoint, MemoryEventLog, str, list[RunEvent]]:
    """A dies as it is about to log `at`; then B's endpoint drives the run on for its reader, or (`elsewhere`)
    another process finishes it first with no event log (`Agent.resume`, what ``durable-agent runs resume`` runs)
    and B only serves the reader. B's endpoint, its log, the run's id, and what the reader got."""
    log = DyingLog(MemoryDurableState(), at=at)
    run_id = await died_in_run(log, ScriptedModel(script), tools, **options)
    if elsewhere:
        runtime, events = left_by(log)
        worker = Agent(model=ScriptedModel(script), tools=dict(tools), session_id="s", durable=DurableOptions(runtime),
                       clock=later, **options)
        await worker.resume(run_id=run_id)
        app = endpoint(runtime, events, model := ScriptedModel(script), tools, clock=later, **options)
    else:
        app, events = taken_over(log, model := ScriptedModel(script), tools, **options)
    got = await reconnected(app, events, run_id)
    assert not elsewhere or model.requests == []  # B asks the model nothing of a run another process ended
    return app, events, run_id, got


async def test_the_steps_another_process_ran_are_sent_as_the_endpoint_would_have_sent_them_and_once() -> None:
    """A died logging step 1's result (the step checkpointed); an operator finished the run from the command line
    (`Agent.resume`, no event log): steps 2 to 4, two of them with tool calls. A reader gets the same events, keys
    and data, that it gets when B's endpoint drives those steps itself: each step's start, text, calls, results
    and finish with its recorded usage, then the run's finish; a reader at the end then gets nothing more."""
    ledger = Ledger()
    tools = {"t": ledger.tool("t"), "u": ledger.tool("u", result={"n": 2})}
    _, _, _, driven = await sent_after_death(TOOL_STEPS, tools, "result/c1", elsewhere=False)
    app, events, run_id, got = await sent_after_death(TOOL_STEPS, tools, "result/c1", elsewhere=True)
    assert [(e.key, e.data) for e in got] == [(e.key, e.data) for e in driven]
    assert said(got) == [
        ("result/c1", "ok"), ("step/1/finish", "tool-calls"),
        ("step/2/start", None), ("call/c2", None), ("call/c3", None), ("result/c2", "ok"), ("result/c3", {"n": 2}),
        ("step/2/finish", "tool-calls"),
        ("step/3/start", None), ("step/3/text/0", "More"), ("call/c4", None), ("result/c4", {"n": 2}),
        ("step/3/finish", "tool-calls"),
        ("step/4/start", None), ("step/4/text/0", "Done."), ("step/4/finish", "stop"), ("finish/4", "stop")]
    assert got[-2].data["usage"] == Usage(3, 3, 6).to_dict()
    assert (got[-1].data["usage"], got[-1].data["total_usage"]) == (Usage(9, 10, 19).to_dict(), Usage(10, 12, 22).to_dict())
    assert await asgi(app, "GET", f"/runs/{run_id}/events?after={got[-1].seq}") == (204, b"")
    assert len(await events.read(run_id)) == got[-1].seq


async def test_the_steps_another_process_ran_up_to_its_park_are_sent_with_the_request_and_the_run_goes_on() -> None:
    """As above, but the run the operator resumed parked on an approval in step 2: the reader gets step 2 as B's
    endpoint would have sent it, with the signed request and the leg's suspended finish; its verdict, posted to
    B, runs the approved tool and the run to its end."""
    signer, ledger = ApprovalSigner("s" * 40), Ledger()
    script: list[ScriptedResponse | str] = [reply("Let me see", call("t", {}, "c1"), usage=Usage(1, 2, 3)),
                                            reply("", call("rm", {"path": "x"}, "c2"), usage=Usage(4, 5, 9)),
                                            reply("Removed.", usage=Usage(3, 3, 6))]
    tools = {"t": ledger.tool("t"), "rm": ledger.tool("rm", needs_approval=True)}
    _, _, _, driven = await sent_after_death(script, tools, "result/c1", elsewhere=False, approval_signer=signer)
    app, events, run_id, got = await sent_after_death(script, tools, "result/c1", elsewhere=True,
                                                      approval_signer=signer)
    request = got[-3].data

    def unsigned(events: Sequence[RunEvent]) -> list[tuple[str, Any]]:  # each request's id and token are its own
        return [("approval", {**e.data, "approval_id": None, "token": None}) if e.key.startswith("approval/")
                else (e.key, e.data) for e in events]

    assert unsigned(got) == unsigned(driven)
    assert said(got) == [("result/c1", "ok"), ("step/1/finish", "tool-calls"), ("step/2/start", None),
                         ("call/c2", None), (f"approval/{request['approval_id']}", None), ("step/2/finish", "tool-calls"),
                         ("finish/2", "suspended")]
    assert request["tool_call_id"] == "c2" and signer.verify(request["token"]) is not None
    verdict = {"approval_id": request["approval_id"], "approved": True, "token": request["token"]}
    assert (await asgi(app, "POST", f"/runs/{run_id}/approvals", verdict))[0] == 202
    assert said(await reconnected(app, events, run_id)) == [
        ("result/c2", "ok"), ("step/4/start", None), ("step/4/text/0", "Removed."), ("step/4/finish", "stop"),
        ("finish/4", "stop")]


async def test_a_run_the_next_post_resumes_first_gets_what_the_process_died_before_logging_then_its_new_steps() -> None:
    """As in the test above, A died logging its model's second word; then B (``on_interrupted="resume"``) is asked
    for the session's next run, whose `Agent.run` drives A's run on first. A's reader gets what a reader that came
    before that POST would have got: the text A never logged and the step's aborted finish, then B's steps."""
    script: list[ScriptedResponse | str] = ["Hi there friend", "Sorry, cut off.", "Next run."]
    log = DyingLog(MemoryDurableState(), at="step/1/text/3")
    run_id = await died_in_run(log, ScriptedModel(script))
    app, events = taken_over(log, model := ScriptedModel(script), on_interrupted="resume")
    after = len(await events.read(run_id))
    assert said(await reconnected(app, events, await started(app, "y"), 0))[-1] == ("finish/1", "stop")
    got = await reconnected(app, events, run_id, after)
    assert said(got) == [("step/1/text/3", "there friend"), ("step/1/finish", "aborted"), ("step/2/start", None),
                         ("step/2/text/0", "Sorry, "), ("step/2/text/7", "cut "), ("step/2/text/11", "off."),
                         ("step/2/finish", "stop"), ("finish/2", "stop")]
    assert model.requests[0].messages[-1] == {"role": "assistant", "content": [{"type": "text", "text": "Hi there friend"}]}


async def test_a_post_whose_resumed_interrupted_run_parks_is_a_clear_409_and_starts_nothing() -> None:
    """In ``"resume"`` mode the session's next run first drives A's run on, which parks on an approval: the new
    run does not start (`Agent.run` returns the parked run). The POST says so (409 ``session_parked``, not a 500),
    and starts the run once the parked one is answered."""
    ledger = Ledger()
    script: list[ScriptedResponse | str] = ["Hi there friend", reply("", call("rm", {"path": "x"}, "c1")),
                                            "removed", "Next run."]
    tools = {"rm": ledger.tool("rm", needs_approval=True)}
    log = DyingLog(MemoryDurableState(), at="step/1/text/3")
    run_id = await died_in_run(log, ScriptedModel(script), tools)
    app, events = taken_over(log, ScriptedModel(script), tools, on_interrupted="resume")
    status, body = await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "y", "request_id": "r1"})
    assert (status, json.loads(body)["error"]["code"]) == (409, "session_parked")
    logged = await events.read(run_id)
    assert said(logged[-3:]) == [(logged[-3].key, None), ("step/2/finish", "tool-calls"), ("finish/2", "suspended")]
    verdict = {"approval_id": logged[-3].data["approval_id"], "approved": True}
    assert (await asgi(app, "POST", f"/runs/{run_id}/approvals", verdict))[0] == 202
    assert said(await reconnected(app, events, run_id))[-1] == ("finish/4", "stop")
    status, body = await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "y", "request_id": "r1"})
    assert status == 201, body
    assert said(await reconnected(app, events, json.loads(body)["run_id"], 0))[-1] == ("finish/1", "stop")


async def test_a_run_the_next_post_heals_gets_what_the_process_died_before_logging_and_ends_there() -> None:
    """As above, but B heals (the default): the session's next run ends A's run where A left it, its streamed text
    an aborted turn of its history. A's reader gets the text A never logged, the step's aborted finish and the run's
    finish; nothing drives A's run on (the model is asked for the new run only, which sees the aborted turn)."""
    script: list[ScriptedResponse | str] = ["Hi there friend", "Next run."]
    log = DyingLog(MemoryDurableState(), at="step/1/text/3")
    run_id = await died_in_run(log, ScriptedModel(script))
    app, events = taken_over(log, model := ScriptedModel(script))
    after = len(await events.read(run_id))
    assert said(await reconnected(app, events, await started(app, "y"), 0))[-1] == ("finish/1", "stop")
    got = await reconnected(app, events, run_id, after)
    assert said(got) == [("step/1/text/3", "there friend"), ("step/1/finish", "aborted"), ("finish/1", "stop")]
    assert json.loads((await asgi(app, "GET", f"/runs/{run_id}"))[1])["status"] == "completed"
    assert len(model.requests) == 1 and list(model.requests[0].messages[1:]) == [
        {"role": "assistant", "content": [{"type": "text", "text": "Hi there friend"}]}, {"role": "user", "content": "y"}]


async def test_a_run_another_process_ended_gets_its_results_step_finish_and_finish_rebuilt_once() -> None:
    """A died in the step's tool; B's next run of the session healed A's run (its open call answered as
    interrupted, the run ended). A reader of A's run gets what the run's checkpoint proves: the call's result,
    the step's finish and the run's finish with the run's usage (the recorded answer's tokens, which the healed run
    counts); a reader at the end then gets nothing more."""
    log = DyingLog(MemoryDurableState())

    async def doomed(args: Any) -> str:
        await log.die()

    script: list[ScriptedResponse | str] = [reply("Hi there", call("t", {}, "c1"), usage=Usage(5, 6, 11))]
    run_id = await died_in_run(log, ScriptedModel(script), {"t": Tool(execute=doomed)})
    app, events = taken_over(log, ScriptedModel(lambda request: "Next run."), {"t": Tool(execute=doomed)})
    seen = len(await events.read(run_id))
    await reconnected(app, events, await started(app, "y"), 0)  # B's next run, to its end
    got = await reconnected(app, events, run_id, seen)
    assert [(e.key, e.data.get("is_error", e.data.get("finish_reason"))) for e in got] == [
        ("result/c1", True), ("step/1/finish", "tool-calls"), ("finish/1", "stop")]
    assert got[1].data["usage"] == Usage(5, 6, 11).to_dict()  # the recorded model answer's
    view = json.loads((await asgi(app, "GET", f"/runs/{run_id}"))[1])
    assert view["status"] == "completed" and got[-1].data["total_usage"] == view["usage"] == Usage(5, 6, 11).to_dict()
    assert await asgi(app, "GET", f"/runs/{run_id}/events?after={got[-1].seq}") == (204, b"")
    assert len(await events.read(run_id)) == got[-1].seq


async def test_a_run_that_parked_as_the_process_died_gets_its_approval_request_and_a_suspended_finish() -> None:
    """A's run parked on an approval (the checkpoint committed) and A died logging the request: the reader gets
    the request, signed as A would have sent it, the step's finish and the leg's suspended finish; its token
    approves the run."""
    signer, ledger = ApprovalSigner("s" * 40), Ledger()
    script: list[ScriptedResponse | str] = [reply("", call("rm", {"path": "x"}, "c1")), "removed"]
    tools = {"rm": ledger.tool("rm", needs_approval=True)}
    log = DyingLog(MemoryDurableState(), at="approval")
    run_id = await died_in_run(log, ScriptedModel(script), tools, approval_signer=signer)
    app, events = taken_over(log, ScriptedModel(script), tools, approval_signer=signer)
    got = await reconnected(app, events, run_id)
    request = got[0].data
    assert [e.key for e in got] == [f"approval/{request['approval_id']}", "step/1/finish", "finish/1"]
    assert (request["tool_call_id"], got[-1].data["finish_reason"]) == ("c1", "suspended") and ledger.entries == []
    verdict = {"approval_id": request["approval_id"], "approved": True, "token": request["token"]}
    assert (await asgi(app, "POST", f"/runs/{run_id}/approvals", verdict))[0] == 202
    assert (await reconnected(app, events, run_id))[-1].data["finish_reason"] == "stop"
    assert ledger.entries == [("rm", {"path": "x"})]


async def test_a_verdict_for_a_run_that_parked_as_the_process_died_is_sent_after_the_request_it_answers() -> None:
    """As above, but the verdict reaches B before any reader does (its approval id read from GET /runs/{id}): the
    request, the step's finish and the suspended finish A never logged come first, then the approved run."""
    ledger = Ledger()
    script: list[ScriptedResponse | str] = [reply("", call("rm", {"path": "x"}, "c1")), "removed"]
    tools = {"rm": ledger.tool("rm", needs_approval=True)}
    log = DyingLog(MemoryDurableState(), at="approval")
    run_id = await died_in_run(log, ScriptedModel(script), tools)
    app, events = taken_over(log, ScriptedModel(script), tools)
    after = len(await events.read(run_id))
    [pending] = json.loads((await asgi(app, "GET", f"/runs/{run_id}"))[1])["pending_approvals"]
    verdict = {"approval_id": pending["approval_id"], "approved": True}
    assert (await asgi(app, "POST", f"/runs/{run_id}/approvals", verdict))[0] == 202
    went_on = await reconnected(app, events, run_id, after + 3)  # the approved leg, to its end
    parked = (await events.read(run_id, after))[:3]
    assert [(e.key, e.data.get("finish_reason")) for e in parked] == [
        (f"approval/{pending['approval_id']}", None), ("step/1/finish", "tool-calls"), ("finish/1", "suspended")]
    assert said(went_on) == [("result/c1", "ok"), ("step/3/start", None), ("step/3/text/0", "removed"),
                             ("step/3/finish", "stop"), ("finish/3", "stop")]
    assert ledger.entries == [("rm", {"path": "x"})]


async def test_a_result_settled_after_a_verdict_as_the_process_died_is_sent_before_the_run_goes_on() -> None:
    """A's run parked on an approval; the verdict posted to A resumed it, the approved tool ran and its result was
    checkpointed (the settle step), and A died logging it: the reader gets the result (from the checkpoint), then
    the rest of the run, which B drives; the tool ran once, in A."""
    ledger = Ledger()
    script: list[ScriptedResponse | str] = [reply("", call("rm", {"path": "x"}, "c1")), "removed"]
    tools = {"rm": ledger.tool("rm", needs_approval=True)}
    log = DyingLog(MemoryDurableState(), at="result/c1")
    app = endpoint(MemoryRuntime(log.state), log, ScriptedModel(script), tools)
    run_id = await started(app)
    leg1 = await reconnected(app, log, run_id, 0)
    verdict = {"approval_id": leg1[-3].data["approval_id"], "approved": True}
    assert (await asgi(app, "POST", f"/runs/{run_id}/approvals", verdict))[0] == 202
    await asyncio.wait_for(log.dead.wait(), 10)
    app, events = taken_over(log, ScriptedModel(script), tools)
    got = await reconnected(app, events, run_id, leg1[-1].seq)
    assert said(got) == [("result/c1", "ok"), ("step/3/start", None), ("step/3/text/0", "removed"),
                         ("step/3/finish", "stop"), ("finish/3", "stop")]
    assert ledger.entries == [("rm", {"path": "x"})]


async def test_a_client_result_recorded_as_the_process_died_is_sent_before_the_run_goes_on() -> None:
    """A recorded the result of the client tool call its run was parked on, and died before logging it: the
    reader gets the result (from the parked checkpoint that holds it), then the rest of the run, which B drives."""
    script: list[ScriptedResponse | str] = [reply("", call("pick_file", {}, "c1")), "thanks"]
    tools = {"pick_file": PICK_FILE}
    log = DyingLog(MemoryDurableState(), at="result/c1")
    app = endpoint(MemoryRuntime(log.state), log, ScriptedModel(script), tools)
    run_id = await started(app)
    leg1 = await reconnected(app, log, run_id, 0)
    assert leg1[-1].data["finish_reason"] == "suspended"
    status, _ = await asgi(app, "POST", f"/runs/{run_id}/tool-results", {"tool_call_id": "c1", "output": "f"})
    assert status == 500 and log.left is not None  # A died between its commit and its log
    app, events = taken_over(log, model := ScriptedModel(script), tools)
    got = await reconnected(app, events, run_id)
    assert got[0].data == {"type": "tool-result", "tool_call_id": "c1", "tool_name": "pick_file", "output": "f",
                           "is_error": False}
    assert said(got)[-1] == ("finish/2", "stop")
    assert [p["output"] for p in tool_results(model.requests[0].messages[-1])] == ["f"]  # what the model was given


# ---------------------------------------------------------- UI message stream


def recorded_frames() -> list[tuple[str | None, Any]]:
    frames = []
    for block in (VECTORS / "ui_message_stream_v5.sse").read_text().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        data = lines["data"]
        frames.append((lines.get("id"), data if data == "[DONE]" else json.loads(data)))
    return frames


def test_the_ui_message_stream_matches_the_recorded_frames() -> None:
    events: list[dict[str, Any]] = [
        {"type": "step-start", "step_index": 1},
        {"type": "text-delta", "step_index": 1, "offset": 0, "text": "Let me "},
        {"type": "text-delta", "step_index": 1, "offset": 7, "text": "check."},
        {"type": "tool-call", "step_index": 1, "tool_call_id": "call_1", "tool_name": "weather",
         "input": {"city": "Paris"}},
        {"type": "tool-call", "step_index": 1, "tool_call_id": "call_2", "tool_name": "deploy",
         "input": {"env": "prod"}},
        {"type": "tool-result", "tool_call_id": "call_1", "tool_name": "weather", "output": {"sky": "clear"},
         "is_error": False},
        {"type": "tool-approval-request", "approval_id": "ap-1", "tool_call_id": "call_2", "tool_name": "deploy",
         "input": {"env": "prod"}, "agent_path": None, "token": "t0k"},
        {"type": "step-finish", "step_index": 1, "usage": {}, "finish_reason": "tool-calls"},
        {"type": "finish", "step_index": 1, "finish_reason": "suspended",
         "usage": {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12},
         "total_usage": {"input_tokens": 5, "output_tokens": 7, "total_tokens": 12}},
        {"type": "tool-result", "tool_call_id": "call_2", "tool_name": "deploy",
         "output": "The user denied this tool call.", "is_error": True, "denied": True},
        {"type": "step-start", "step_index": 3},
        {"type": "text-delta", "step_index": 3, "offset": 0, "text": "Not deployed."},
        {"type": "step-finish", "step_index": 3, "usage": {}, "finish_reason": "stop"},
        {"type": "error", "code": "run_failed", "message": "ModelError: the provider went away"},
    ]
    folder = UiMessageStream("run-1")
    got: list[tuple[str | None, Any]] = []
    for seq, event in enumerate(events, 1):
        got.extend((f"{seq}.{n}", chunk) for n, chunk in enumerate(folder.chunks(event)))
        if event["type"] in ("finish", "error"):
            got.append((None, "[DONE]"))
    assert got == recorded_frames()
    for _, chunk in got:
        if chunk != "[DONE]":
            check_chunk(chunk)


async def test_each_chunk_is_one_server_sent_event_with_its_id() -> None:
    """After the reconnection delay, the body is nothing but ``id: <event>.<chunk>`` + ``data: <json>`` events,
    each ended by a blank line, then ``data: [DONE]``."""
    import re

    runtime = MemoryRuntime()
    app = ChatEndpoint(agent=lambda s: Agent(model=ScriptedModel(["hi"]), session_id=s,
                                             durable=DurableOptions(runtime)), runtime=runtime, events=MemoryEventLog())
    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    status, body = await asgi(app, "GET", f"/runs/{run_id}/events?format=ui-message-stream")
    frames = re.findall(rb"(id: \d+\.\d+\n)?data: ([^\n]+)\n\n", body)
    assert status == 200 and body == b"retry: 1000\n\n" + b"".join(head + b"data: " + data + b"\n\n"
                                                                 for head, data in frames)
    assert frames[0] == (b"id: 1.0\n", json.dumps({"type": "start", "messageId": run_id}, separators=(",", ":")).encode())
    assert all(head for head, _ in frames[:-1]) and frames[-1] == (b"", b"[DONE]")


def test_a_retried_attempts_text_gets_its_own_block_and_the_failed_one_is_named() -> None:
    folder = UiMessageStream("r")
    chunks = [c for event in (
        {"type": "step-start", "step_index": 1},
        {"type": "text-delta", "step_index": 1, "attempt": 0, "offset": 0, "text": "Hel"},
        {"type": "step-retry", "step_index": 1, "attempt": 0, "error": "TimeoutError: slow", "delay_ms": 5},
        {"type": "text-delta", "step_index": 1, "attempt": 1, "offset": 0, "text": "Hello"},
    ) for c in folder.chunks(event)]
    for chunk in chunks:
        check_chunk(chunk)
    assert [c["type"] for c in chunks] == ["start", "start-step", "text-start", "text-delta", "text-end",
                                           "data-step-retry", "text-start", "text-delta"]
    assert chunks[5]["data"]["textId"] == "r-1" and chunks[6]["id"] == "r-1-1"


# ------------------------------------------------------------------ event logs


@pytest.fixture(params=["memory", pytest.param("sqlite", marks=pytest.mark.requires_sqlite),
                        pytest.param("postgres", marks=pytest.mark.host_only("needs a Postgres server"))])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A factory of event logs on one store (each SQL one on a connection of its own, as processes have)."""
    if request.param == "memory":
        shared = MemoryEventLog()
        yield lambda: shared
    elif request.param == "sqlite":
        yield lambda: SqliteEventLog(tmp_path / "events.db")
    else:
        from durable_agent.testing.services import postgres_schema

        with postgres_schema("events") as conninfo:
            opened: list[PostgresEventLog] = []

            def make() -> PostgresEventLog:
                opened.append(PostgresEventLog(conninfo, poll_interval_ms=20))
                return opened[-1]

            yield make
            for log in opened:  # the test's loop is gone; closing needs no I/O on the connection
                asyncio.run(log.close())


async def test_a_log_holds_each_key_once_and_numbers_events_in_order(make_log: Any) -> None:
    log, other = make_log(), make_log()  # for SQLite: two connections, as two processes have
    assert await log.create_run("r", "s", {"user": "u"}) is True
    assert await other.create_run("r", "s", {}) is False
    info = await other.run_info("r")
    assert info is not None and info.meta == {"user": "u"}
    first = await log.append("r", [("a", {"n": 1}), ("b", {"n": b"\x00bytes"})])
    again = await other.append("r", [("b", {"n": 2}), ("c", {"n": 3})])
    assert [(e.seq, e.key) for e in first + again] == [(1, "a"), (2, "b"), (3, "c")]
    assert [e.data for e in await other.read("r", 1)] == [{"n": b"\x00bytes"}, {"n": 3}]
    assert await log.run_info("missing") is None


async def test_a_waiting_reader_wakes_on_an_append(make_log: Any) -> None:
    log = make_log()
    await log.create_run("r", "s", {})
    waiter = asyncio.ensure_future(log.wait("r", 0, 30.0))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await log.append("r", [("a", {})])
    await asyncio.wait_for(waiter, 5)


async def test_forget_and_prune_drop_runs_with_their_events(make_log: Any) -> None:
    log = make_log()
    ends = {"done": {"type": "finish", "finish_reason": "stop"}, "failed": {"type": "error", "message": "x"},
            "parked": {"type": "finish", "finish_reason": "suspended"}, "streaming": {"type": "text-delta"},
            "late": {"type": "finish", "finish_reason": "stop"}}
    for run_id, last in ends.items():
        if run_id == "late":
            await asyncio.sleep(0.01)  # registered a few ms after the others
        await log.create_run(run_id, "s", {})
        await log.append(run_id, [("step/0/start", {"type": "step-start"}), ("end", last)])
    await log.create_run("silent", "s", {})
    cut = (await log.run_info("late")).created_at
    assert sorted(await log.prune(before=cut)) == ["done", "failed"]  # registered before `cut`, ended for good
    assert await log.run_info("done") is None and await log.read("done") == []
    assert await make_log().run_info("parked") is not None  # another connection sees the same
    assert await log.forget(["parked", "nope", "parked"]) == ["parked"]
    assert await log.read("parked") == [] and await log.run_info("late") is not None
    assert await log.prune(before=cut + 1) == ["late"]
    assert sorted([r for r in ("streaming", "silent") if await log.run_info(r) is not None]) == ["silent", "streaming"]
    with pytest.raises(ConfigurationError):
        await log.prune(before="yesterday")
    with pytest.raises(ConfigurationError):
        await log.forget("done")


async def test_parked_lists_the_runs_whose_log_ends_with_a_suspended_finish(make_log: Any) -> None:
    log = make_log()
    legs = {"parked": [("finish/1", {"type": "finish", "finish_reason": "suspended"})],
            "done": [("finish/1", {"type": "finish", "finish_reason": "stop"})],
            "going-on": [("finish/1", {"type": "finish", "finish_reason": "suspended"}),
                         ("result/c1", {"type": "tool-result"})],
            "failed": [("error/1", {"type": "error", "message": "x"})]}
    for run_id, events in legs.items():
        await log.create_run(run_id, "s", {})
        await log.append(run_id, [("step/1/start", {"type": "step-start"}), *events])
    await log.create_run("silent", "s", {})
    assert await make_log().parked() == {"parked": 2}  # any process: the seq of the finish that parked it
    await log.append("going-on", [("finish/3", {"type": "finish", "finish_reason": "suspended"})])
    assert await log.parked() == {"parked": 2, "going-on": 4}
    await log.forget(["going-on"])
    assert await log.parked() == {"parked": 2}


async def test_a_pruned_run_is_a_clear_404_and_its_reader_is_let_go() -> None:
    runtime = MemoryRuntime()
    log = MemoryEventLog()
    model = ScriptedModel([reply("a b c d e f g h i j k l m n o p")], delay=0.05)
    app = ChatEndpoint(agent=lambda s: Agent(model=model, session_id=s, durable=DurableOptions(runtime)),
                       runtime=runtime, events=log)
    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    reader = asyncio.ensure_future(asgi(app, "GET", f"/runs/{run_id}/events"))
    while len(await log.read(run_id)) < 3:
        await asyncio.sleep(0.01)
    assert await log.forget([run_id]) == [run_id]  # dropped while streaming (prune() only drops finished runs)
    status, body = await reader  # the stream ends instead of waiting for events that will never be logged
    assert status == 200 and body.count(b"data: ") < 17
    status, body = await asgi(app, "GET", f"/runs/{run_id}/events?after=3")
    assert status == 404 and json.loads(body)["error"] == {
        "code": "unknown_run", "message": f"no run {run_id!r} (never started here, or pruned)"}


async def test_a_reader_at_or_past_the_end_of_a_run_gets_an_answer_not_an_endless_stream() -> None:
    """At the end of a leg nothing follows: 204 (an EventSource stops reconnecting on it, as on /chat/{id}/stream).
    An id the run never sent (past its last event, a chunk its event never had) is a 422, never a stream that
    keeps the reader waiting on keep-alives, nor one that skips the events up to the made-up id."""

    runtime, log, gate = MemoryRuntime(), MemoryEventLog(), asyncio.Event()

    async def slow(args: Any) -> str:
        await gate.wait()
        return "ok"

    model = ScriptedModel([reply("", call("slow", {})), "a b c", reply("", call("pay", {})), "paid"])
    tools = {"slow": Tool(execute=slow, replay="safe"), "pay": Tool(execute=lambda a: "ok", needs_approval=True)}
    app = ChatEndpoint(agent=lambda s: Agent(model=model, tools=tools, session_id=s, durable=DurableOptions(runtime)),
                       runtime=runtime, events=log, keepalive_seconds=0.05)

    async def answer(run_id: str, cursor: str, ui: bool = False) -> tuple[int, bytes]:
        query = "?format=ui-message-stream" if ui else ""
        return await asgi(app, "GET", f"/runs/{run_id}/events{query}", headers={"last-event-id": cursor}, timeout=5)

    def refused(answered: tuple[int, bytes]) -> bool:
        return answered[0] == 422 and json.loads(answered[1])["error"]["code"] == "bad_event_id"

    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    while not any(e.data["type"] == "tool-call" for e in await log.read(run_id)):
        await asyncio.sleep(0.01)
    live = len(await log.read(run_id))  # the run waits in its tool: live, more will come
    assert refused(await answer(run_id, str(live + 1))) and refused(await answer(run_id, str(live + 50)))
    gate.set()
    status, body = await answer(run_id, str(live))  # at the end of a live leg: the stream waits for the rest
    assert status == 200 and data_lines(body)[-1]["type"] == "finish"

    last = len(await log.read(run_id))  # finished
    assert await answer(run_id, str(last)) == (204, b"")
    assert (await asgi(app, "GET", f"/runs/{run_id}/events?after={last}", timeout=5)) == (204, b"")
    for cursor in (str(last + 1), str(last + 1000), "+1", "1.0", "-1"):
        assert refused(await answer(run_id, cursor)), cursor

    frames = [line[4:] for line in (await answer(run_id, "0", ui=True))[1].decode().splitlines()
              if line.startswith("id: ")]
    end, n = frames[-1].split(".")
    assert await answer(run_id, frames[-1], ui=True) == (204, b"")  # the finish chunk: the reader has it all
    assert await answer(run_id, end, ui=True) == (204, b"")
    for cursor in (f"{end}.{int(n) + 1}", f"{int(end) + 1}.0", "0.1", "1.-1", f"{end}.x"):
        assert refused(await answer(run_id, cursor, ui=True)), cursor
    status, body = await answer(run_id, "1.0", ui=True)  # inside event 1 (start, start-step): the rest of it on
    assert status == 200 and data_lines(body)[0] == {"type": "start-step"}

    second = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "pay"}))[1])["run_id"]
    parked = data_lines((await asgi(app, "GET", f"/runs/{second}/events"))[1])
    assert parked[-1]["finish_reason"] == "suspended"
    assert await answer(second, str(parked[-1]["seq"])) == (204, b"")  # waits for a verdict: nothing comes now
    assert refused(await answer(second, str(parked[-1]["seq"] + 1)))


# --------------------------------------------------------- Agent and ASGI app


async def test_agent_run_names_the_run_and_hands_out_its_parts() -> None:
    runtime = MemoryRuntime()
    agent = Agent(model=ScriptedModel([reply("one two"), reply("three")]), session_id="s",
                  durable=DurableOptions(runtime))
    seen: list[tuple[str | None, str]] = []

    async def sink(run_id: str | None, part: StreamPart) -> None:
        seen.append((run_id, part.type))

    result = await agent.run("hi", run_id="chosen", on_part=sink)
    assert result.run_id == "chosen"
    assert seen == [("chosen", t) for t in ("step-start", "text-delta", "text-delta", "step-finish", "finish")]
    with pytest.raises(ConfigurationError, match="already names a stored run"):
        await agent.run("again", run_id="chosen")
    with pytest.raises(ConfigurationError, match="durable"):
        await Agent(model=ScriptedModel(["x"])).run("hi", run_id="r")


async def asgi(app: Any, method: str, path: str, body: Any = None, root: str = "",
               disconnect_after: int | None = None, headers: dict[str, str] | None = None,
               timeout: float = 20) -> tuple[int, bytes]:
    sent = await exchange(app, method, path, body, root, disconnect_after, headers, timeout)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


async def exchange(app: Any, method: str, path: str, body: Any = None, root: str = "",
                   disconnect_after: int | None = None, headers: dict[str, str] | None = None,
                   timeout: float = 20) -> list[dict[str, Any]]:
    """The ASGI messages `app` sends for one request (the reader leaves after `disconnect_after` events)."""
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()
    messages = [{"type": "http.request", "body": json.dumps(body).encode() if body is not None else b""}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if disconnect_after is not None and sum(m.get("body", b"").count(b"data: ") for m in sent) >= disconnect_after:
            gone.set()  # the reader leaves after `disconnect_after` events

    path, _, query = path.partition("?")
    scope = {"type": "http", "method": method, "path": root + path, "root_path": root,
             "query_string": query.encode(),
             "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()]}
    await asyncio.wait_for(app(scope, receive, send), timeout)
    return sent


async def test_the_app_mounted_under_a_prefix_and_a_reader_that_leaves() -> None:
    runtime = MemoryRuntime()
    model = ScriptedModel([reply("a b c d e f")], delay=0.05)
    app = ChatEndpoint(agent=lambda s: Agent(model=model, session_id=s, durable=DurableOptions(runtime)),
                       runtime=runtime, events=MemoryEventLog())
    status, body = await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "hi"}, root="/agent")
    assert status == 201
    run_id = json.loads(body)["run_id"]
    status, body = await asgi(app, "GET", f"/runs/{run_id}/events", root="/agent", disconnect_after=2)
    assert status == 200 and body.count(b"data: ") == 2  # the handler returned when its reader left
    status, body = await asgi(app, "GET", f"/runs/{run_id}/events", root="/agent")
    assert body.count(b"data: ") == 9 and b'"finish"' in body
    assert (await asgi(app, "GET", "/runs", root="/agent"))[0] == 405


async def response_start(app: Any, method: str, path: str, body: Any = None,
                         origin: str | None = None) -> tuple[int, dict[str, str]]:
    """The status and headers `app` answers a request with (the reader leaves once they are sent)."""
    headers = {"access-control-request-method": "POST", **({"origin": origin} if origin is not None else {})}
    start = (await exchange(app, method, path, body, disconnect_after=0, headers=headers))[0]
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}


async def test_every_answer_to_an_allowed_origin_carries_the_cors_headers_and_no_other_origin_gets_them() -> None:
    runtime = MemoryRuntime()
    app = ChatEndpoint(agent=lambda s: Agent(model=ScriptedModel(["done"]), session_id=s,
                                             durable=DurableOptions(runtime)),
                       runtime=runtime, events=MemoryEventLog(), cors=CorsSettings(allow_origins=("http://ok.example",)))
    ok = "http://ok.example"
    status, heads = await response_start(app, "POST", "/runs", {"session_id": "s", "prompt": "hi"}, ok)
    assert status == 201 and heads["location"].startswith("runs/")
    run = heads["location"].removeprefix("runs/")
    answers = [(201, heads)]
    for method, path, body in [("GET", f"/runs/{run}", None), ("GET", f"/runs/{run}/events", None),
                               ("POST", f"/runs/{run}/approvals", {"approval_id": "a", "approved": True}),
                               ("POST", f"/runs/{run}/tool-results", {}), ("POST", "/chat", {"id": "s"}),
                               ("GET", "/chat/nobody/stream", None), ("GET", "/nowhere", None), ("GET", "/runs", None)]:
        answers.append(await response_start(app, method, path, body, ok))
    assert [status for status, _ in answers] == [201, 200, 200, 409, 422, 422, 204, 404, 405]
    for _, heads in answers:
        assert heads["access-control-allow-origin"] == ok and heads["vary"] == "origin"
        assert heads["access-control-expose-headers"] == "x-vercel-ai-ui-message-stream, location"
        assert "access-control-allow-methods" not in heads  # a preflight's only
    status, heads = await response_start(app, "OPTIONS", "/anything/at/all", origin=ok)
    assert status == 204 and heads["access-control-allow-origin"] == ok
    assert heads["access-control-allow-methods"] == "GET, POST, OPTIONS" and heads["access-control-max-age"] == "600"
    for origin in ("http://evil.example", None):
        status, heads = await response_start(app, "GET", f"/runs/{run}", origin=origin)
        assert status == 200 and not any(k.startswith("access-control") for k in heads)
        status, heads = await response_start(app, "OPTIONS", f"/runs/{run}", origin=origin)
        assert status == 403 and not any(k.startswith("access-control") for k in heads)


async def test_the_same_run_asked_twice_at_once_starts_once() -> None:
    runtime = MemoryRuntime()
    model = ScriptedModel([reply("a b c")], delay=0.01)
    app = ChatEndpoint(agent=lambda s: Agent(model=model, session_id=s, durable=DurableOptions(runtime)),
                       runtime=runtime, events=MemoryEventLog())
    body = {"session_id": "s", "prompt": "hi", "request_id": "k"}
    (s1, b1), (s2, b2) = await asyncio.gather(asgi(app, "POST", "/runs", body), asgi(app, "POST", "/runs", body))
    assert sorted((s1, s2)) in ([200, 201], [201, 201]) and json.loads(b1)["run_id"] == json.loads(b2)["run_id"]
    _, events = await asgi(app, "GET", f"/runs/{json.loads(b1)['run_id']}/events")
    assert events.count(b'"step-start"') == 1 and len(model.requests) == 1


async def test_a_sub_agents_signed_approval_is_accepted() -> None:
    from durable_agent import agent_tool

    runtime, ledger, signer = MemoryRuntime(), Ledger(), ApprovalSigner("s" * 40)
    child = agent_tool(name="coder", model=ScriptedModel([reply("", call("shell", {"cmd": "ls"})), "listed"]),
                       tools={"shell": ledger.tool("shell", needs_approval=True)})
    parent = ScriptedModel([reply("", call("coder", {"prompt": "ls"}, "t1")), "all done"])
    app = ChatEndpoint(agent=lambda s: Agent(model=parent, tools={"coder": child}, session_id=s, approval_signer=signer,
                                             durable=DurableOptions(runtime)),
                       runtime=runtime, events=MemoryEventLog())
    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    leg1 = [json.loads(line[6:]) for line in (await asgi(app, "GET", f"/runs/{run_id}/events"))[1].decode().splitlines()
            if line.startswith("data: ")]
    request = next(e for e in leg1 if e["type"] == "tool-approval-request")
    assert request["agent_path"] == ["coder"]
    status, _ = await asgi(app, "POST", f"/runs/{run_id}/approvals",
                           {"approval_id": request["approval_id"], "approved": True, "token": request["token"]})
    assert status == 202
    leg2 = (await asgi(app, "GET", f"/runs/{run_id}/events?after={leg1[-1]['seq']}"))[1].decode()
    assert '"finish_reason":"stop"' in leg2 and ledger.entries == [("shell", {"cmd": "ls"})]


async def test_a_run_parked_on_a_client_tool_is_not_resumed_by_a_reader() -> None:
    model = ScriptedModel([reply("", call("pick_file", {})), "thanks"])
    app, _ = client_tool_app(model)
    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    first = (await asgi(app, "GET", f"/runs/{run_id}/events"))[1]
    assert b'"finish_reason":"suspended"' in first
    last = first.count(b"\nid: ") + first.startswith(b"id: ")
    again = (await asgi(app, "GET", f"/runs/{run_id}/events?after={last}"))[1]
    assert b"data: " not in again and len(model.requests) == 1  # nobody answered the client tool: it waits
    assert json.loads((await asgi(app, "GET", f"/runs/{run_id}"))[1])["status"] == "suspended"


async def test_a_retried_model_call_streams_its_failed_attempt_then_the_next() -> None:
    app = endpoint(MemoryRuntime(), MemoryEventLog(), EventModel(flaky(), [delta("Hel"), delta("lo"), STOP]),
                   retry=RETRY_FAST)
    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    body = (await asgi(app, "GET", f"/runs/{run_id}/events"))[1].decode()
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    assert [(e["type"], e.get("attempt"), e.get("text")) for e in events if e["type"] in ("text-delta", "step-retry")] == [
        ("text-delta", 0, "Hel"), ("step-retry", 0, None), ("text-delta", 1, "Hel"), ("text-delta", 1, "lo")]
    assert events[-1]["type"] == "finish" and [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {**FLAKY_RETRY, "seq": 3} in events  # as the retry is rebuilt from its record when it was never logged


def client_tool_app(model: ScriptedModel, runtime: Any = None, **tools: Any) -> tuple[ChatEndpoint, Any]:
    runtime = runtime or MemoryRuntime()
    return endpoint(runtime, MemoryEventLog(), model, {"pick_file": PICK_FILE, **tools}), runtime


def data_lines(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]


async def test_client_tool_results_resume_the_run_once_every_call_has_one() -> None:
    model = ScriptedModel([reply("", call("pick_file", {"n": 1}, "c1"), call("pick_file", {"n": 2}, "c2")), "thanks"])
    app, _ = client_tool_app(model)
    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    leg1 = data_lines((await asgi(app, "GET", f"/runs/{run_id}/events"))[1])
    view = json.loads((await asgi(app, "GET", f"/runs/{run_id}"))[1])
    assert [c["tool_call_id"] for c in view["pending_tool_calls"]] == ["c1", "c2"]
    status, _ = await asgi(app, "POST", f"/runs/{run_id}/tool-results", {"tool_call_id": "c1", "output": "a.txt"})
    assert status == 202
    view = json.loads((await asgi(app, "GET", f"/runs/{run_id}"))[1])
    assert view["status"] == "suspended" and [c["tool_call_id"] for c in view["pending_tool_calls"]] == ["c2"]
    assert len(model.requests) == 1  # one call still waits: the run does not go on
    status, body = await asgi(app, "POST", f"/runs/{run_id}/tool-results", {"tool_call_id": "c1", "output": "b"})
    assert (status, json.loads(body)["error"]["code"]) == (409, "already_answered")
    status, _ = await asgi(app, "POST", f"/runs/{run_id}/tool-results",
                           {"results": [{"tool_call_id": "c2", "output": None, "is_error": True}]})
    assert status == 202
    leg2 = data_lines((await asgi(app, "GET", f"/runs/{run_id}/events?after={leg1[-1]['seq']}"))[1])
    assert [(e["type"], e.get("tool_call_id"), e.get("output"), e.get("is_error")) for e in leg2[:2]] == [
        ("tool-result", "c1", "a.txt", False), ("tool-result", "c2", None, True)]
    assert leg2[-1]["type"] == "finish" and leg2[-1]["finish_reason"] == "stop"
    assert [e["seq"] for e in leg1 + leg2] == list(range(1, len(leg1) + len(leg2) + 1))
    tool_message = model.requests[1].messages[-1]
    assert [(p["tool_call_id"], p["output"]) for p in tool_results(tool_message)] == [("c1", "a.txt"), ("c2", None)]
    status, body = await asgi(app, "POST", f"/runs/{run_id}/tool-results", {"tool_call_id": "c2", "output": 1})
    assert (status, json.loads(body)["error"]["code"]) == (409, "not_waiting")


async def test_an_approval_does_not_resume_a_run_whose_client_tool_call_waits() -> None:
    ledger = Ledger()
    model = ScriptedModel([reply("", call("pick_file", {}, "c1"), call("rm", {"path": "x"}, "c2")), "done"])
    app, _ = client_tool_app(model, rm=ledger.tool("rm", needs_approval=True))
    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    leg1 = data_lines((await asgi(app, "GET", f"/runs/{run_id}/events"))[1])
    request = next(e for e in leg1 if e["type"] == "tool-approval-request")
    assert (await asgi(app, "POST", f"/runs/{run_id}/approvals",
                       {"approval_id": request["approval_id"], "approved": True}))[0] == 202
    again = (await asgi(app, "GET", f"/runs/{run_id}/events?after={leg1[-1]['seq']}"))[1]
    assert b"data: " not in again and len(model.requests) == 1  # the client call still waits: no placeholder
    assert (await asgi(app, "POST", f"/runs/{run_id}/tool-results", {"tool_call_id": "c1", "output": "f"}))[0] == 202
    leg2 = data_lines((await asgi(app, "GET", f"/runs/{run_id}/events?after={leg1[-1]['seq']}"))[1])
    assert leg2[-1]["finish_reason"] == "stop" and ledger.entries == [("rm", {"path": "x"})]
    answers = [m for m in model.requests[1].messages if m["role"] == "tool"]  # the client's result, then the settled
    assert [[(p["tool_call_id"], p["is_error"]) for p in tool_results(m)] for m in answers] == [[("c1", False)],
                                                                                           [("c2", False)]]


async def test_a_resumed_chat_stream_replays_the_whole_run_as_one_message() -> None:
    """ai 7's default transport takes a resumed stream for the whole message (``resumeStreamIsReplay``): the
    resume replays every leg of the run, the first leg's end not ending the stream, then the leg in flight."""

    model = ScriptedModel([reply("Let me see.", call("pick_file", {}, "c1")), "You picked a file, and so on."],
                          delay=0.05)
    app, _ = client_tool_app(model)
    user = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "pick one"}]}
    first = data_lines((await asgi(app, "POST", "/chat", {"id": "s", "messages": [user]}))[1])
    run_id = first[0]["messageId"]
    assert (await asgi(app, "POST", f"/runs/{run_id}/tool-results", {"tool_call_id": "c1", "output": "f"}))[0] == 202
    _, body = await asgi(app, "GET", "/chat/s/stream")  # a page reload while the next leg streams
    resumed = data_lines(body)
    assert resumed[0] == {"type": "start", "messageId": run_id}
    kinds = [c["type"] for c in resumed]
    assert kinds.index("tool-input-available") < kinds.index("tool-output-available")  # leg 1's call, then its result
    assert [c["messageMetadata"]["finishReason"] for c in resumed if c["type"] == "finish"] == ["suspended", "stop"]
    assert "".join(c["delta"] for c in resumed if c["type"] == "text-delta") == (
        "Let me see.You picked a file, and so on.")
    assert body.count(b"[DONE]") == 1 and body.rstrip().endswith(b"data: [DONE]")  # one stream: the run's last leg ends it


async def test_results_for_a_run_this_process_drives_do_not_fence_it_out() -> None:
    model = ScriptedModel([reply("one two three four five six seven eight nine ten")], delay=0.02)
    app, _ = client_tool_app(model)
    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    status, body = await asgi(app, "POST", f"/runs/{run_id}/tool-results", {"tool_call_id": "c1", "output": 1})
    assert (status, json.loads(body)["error"]["code"]) == (409, "not_waiting")
    events = data_lines((await asgi(app, "GET", f"/runs/{run_id}/events"))[1])
    assert events[-1]["finish_reason"] == "stop" and len(model.requests) == 1  # never fenced out, never replayed
    parked = ScriptedModel([reply("", call("pick_file", {}, "c1")), "thanks"])
    app, _ = client_tool_app(parked)
    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    leg1 = data_lines((await asgi(app, "GET", f"/runs/{run_id}/events"))[1])
    # answered as soon as the parked leg's finish is read, while its task may still be ending: waited for, not refused
    status, _ = await asgi(app, "POST", f"/runs/{run_id}/tool-results", {"tool_call_id": "c1", "output": 1})
    assert status == 202 and leg1[-1]["finish_reason"] == "suspended"
    leg2 = data_lines((await asgi(app, "GET", f"/runs/{run_id}/events?after={leg1[-1]['seq']}"))[1])
    assert leg2[-1]["finish_reason"] == "stop" and len(parked.requests) == 2


async def test_the_tool_outputs_of_a_ui_message_are_read_as_use_chat_writes_them() -> None:
    """``addToolResult`` posts the whole assistant message: of its tool parts, those with an output are results
    (``tool-<name>`` or ``dynamic-tool``; ``output-error`` an error), the first part of a call counts, and parts
    still waiting for their output or naming no call are not results."""

    model = ScriptedModel([reply("", call("pick_file", {}, "c1"), call("ask", {}, "c2"), call("pick_file", {}, "c3")),
                           "thanks"])
    app, _ = client_tool_app(model, ask=Tool(description="Ask the user.", parameters={"type": "object"}))
    user = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "go"}]}
    run_id = data_lines((await asgi(app, "POST", "/chat", {"id": "s", "messages": [user]}))[1])[0]["messageId"]
    message: dict[str, Any] = {"role": "assistant", "parts": [
        {"type": "text", "text": "hi"},
        {"type": "tool-pick_file", "toolCallId": "c1", "state": "output-available", "input": {}, "output": {"f": 1}},
        {"type": "tool-pick_file", "toolCallId": "c1", "state": "output-available", "input": {}, "output": "again"},
        {"type": "dynamic-tool", "toolName": "ask", "toolCallId": "c2", "state": "output-error", "errorText": "no"},
        {"type": "tool-pick_file", "toolCallId": "c3", "state": "input-available", "input": {}},
        {"type": "dynamic-tool", "toolCallId": "c3", "state": "output-available", "output": 1},  # no tool name
        {"type": "tool-pick_file", "state": "output-available", "output": 1},  # no call id
    ]}
    status, body = await asgi(app, "POST", "/chat", {"id": "s", "messages": [user, message]}, disconnect_after=3)
    assert status == 200 and [(c["type"], c["toolCallId"]) for c in data_lines(body)[1:]] == [
        ("tool-output-available", "c1"), ("tool-output-error", "c2")]  # after "start": the two results
    view = json.loads((await asgi(app, "GET", f"/runs/{run_id}"))[1])
    assert [c["tool_call_id"] for c in view["pending_tool_calls"]] == ["c3"] and len(model.requests) == 1
    last = {"role": "assistant", "parts": [*message["parts"][:4], {**message["parts"][4], "output": "c.txt",
                                                                    "state": "output-available"}]}
    body = (await asgi(app, "POST", "/chat", {"id": "s", "messages": [user, last]}))[1]
    assert data_lines(body)[-1]["messageMetadata"]["finishReason"] == "stop"
    answers = [p for m in model.requests[1].messages if m["role"] == "tool" for p in tool_results(m)]
    assert [(p["tool_call_id"], p["output"], p["is_error"]) for p in answers] == [
        ("c1", {"f": 1}, False), ("c2", "no", True), ("c3", "c.txt", False)]


class _AgentOnlyStores:
    """What `Agent` uses of a runtime's stores, and nothing else (no submissions)."""

    def __init__(self, stores: Any) -> None:
        self.checkpoints, self.runs, self.tool_state = stores.checkpoints, stores.runs, stores.tool_state


class _AgentOnlyRuntime:
    """A bundled runtime behind only the members `DurableRuntime` declares (set on the instance: a
    Protocol check reads attributes statically on Python 3.12+, past any `__getattr__`)."""

    def __init__(self, runtime: Any) -> None:
        for name in ("mode", "owner", "lease", "inspect", "is_control_error", "open_run", "commit",
                     "resolve_awakeable", "find_awakeable"):
            setattr(self, name, getattr(runtime, name))
        self.stores = _AgentOnlyStores(runtime.stores)


def test_the_endpoint_needs_a_runtime_with_submissions_an_agent_does_not() -> None:
    from durable_agent.backends import DurableRuntime, EndpointStores

    bundled = MemoryRuntime()
    assert isinstance(bundled, EndpointRuntime) and isinstance(bundled.stores, EndpointStores)
    agent_only = _AgentOnlyRuntime(bundled)
    assert isinstance(agent_only, DurableRuntime) and not isinstance(agent_only.stores, EndpointStores)
    with pytest.raises(ConfigurationError, match="EndpointRuntime"):
        ChatEndpoint(agent=lambda s: Agent(model=ScriptedModel(["hi"]), session_id=s,
                                           durable=DurableOptions(agent_only)),
                     runtime=agent_only, events=MemoryEventLog())  # type: ignore[arg-type]


async def test_an_agent_runs_on_a_runtime_with_only_what_its_protocol_declares() -> None:
    runtime = _AgentOnlyRuntime(MemoryRuntime())
    agent = Agent(model=ScriptedModel(["hi"]), session_id="s", durable=DurableOptions(runtime))  # type: ignore[arg-type]
    assert (await agent.run("x")).text == "hi"


@pytest.mark.parametrize("kind", ["memory", pytest.param("sqlite", marks=pytest.mark.requires_sqlite)])
async def test_concurrent_client_results_of_one_run_are_all_recorded(kind: str, tmp_path: Path) -> None:
    """Two requests answering different calls of one parked run at once, in one process: each claims the session's
    lease for its commit, so they take turns (a claim while the other holds it would be refused)."""

    if kind == "sqlite":  # its I/O runs on a thread: the two requests interleave
        from durable_agent.backends.sqlite import SqliteRuntime

        runtime = SqliteRuntime(tmp_path / "agent.db")
    model = ScriptedModel([reply("", call("pick_file", {"n": 1}, "c1"), call("pick_file", {"n": 2}, "c2")), "thanks"])
    app, _ = client_tool_app(model, runtime if kind == "sqlite" else None)
    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    leg1 = data_lines((await asgi(app, "GET", f"/runs/{run_id}/events"))[1])  # parked on both calls
    answers = await asyncio.gather(*(asgi(app, "POST", f"/runs/{run_id}/tool-results", {"tool_call_id": c, "output": c})
                                     for c in ("c1", "c2")))
    assert [status for status, _ in answers] == [202, 202], answers
    leg2 = data_lines((await asgi(app, "GET", f"/runs/{run_id}/events?after={leg1[-1]['seq']}"))[1])
    assert leg2[-1]["finish_reason"] == "stop"
    assert [(p["tool_call_id"], p["output"]) for p in tool_results(model.requests[1].messages[-1])] == [("c1", "c1"),
                                                                                                  ("c2", "c2")]
    if kind == "sqlite":
        while app.driver.driving(run_id):  # the leg logged its finish; its task still releases the lease
            await asyncio.sleep(0.01)
        runtime.close()


async def test_a_verdict_for_a_parked_run_is_refused_unrecorded_while_another_run_of_its_session_runs_here() -> None:
    """The driver's per-session guard: the lease alone would refuse only the resume, after the verdict was stored."""

    ledger = Ledger()
    model = ScriptedModel([reply("", call("rm", {"path": "x"}, "c1")),
                           "one two three four five six seven eight nine ten", "done"], delay=0.02)
    app, runtime = client_tool_app(model, rm=ledger.tool("rm", needs_approval=True))
    parked = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    leg1 = data_lines((await asgi(app, "GET", f"/runs/{parked}/events"))[1])
    request = next(e for e in leg1 if e["type"] == "tool-approval-request")
    busy = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "y"}))[1])["run_id"]
    verdict = {"approval_id": request["approval_id"], "approved": True}
    status, body = await asgi(app, "POST", f"/runs/{parked}/approvals", verdict)
    assert (status, json.loads(body)["error"]["code"]) == (409, "session_busy")
    awakeables = await runtime.inspect.awakeables()
    assert awakeables and not any(a.resolved for a in awakeables)  # nothing recorded: send it again later
    assert data_lines((await asgi(app, "GET", f"/runs/{busy}/events"))[1])[-1]["finish_reason"] == "stop"
    assert (await asgi(app, "POST", f"/runs/{parked}/approvals", verdict))[0] == 202


async def test_a_new_run_right_after_a_leg_logged_its_finish_waits_for_that_leg_to_end() -> None:
    """A client that read a leg's finish and starts the session's next run at once is not refused as busy while
    the finished leg's task is still releasing its lease (seen under Pyodide, where that takes longer)."""

    model = ScriptedModel([reply("", call("pick_file", {}, "c1")), "second run"])
    runtime = MemoryRuntime()
    release = runtime.lease.release

    async def slow_release(session_id: str, epoch: int) -> None:
        await asyncio.sleep(0.05)  # the leg's task ends a little after its finish event
        await release(session_id, epoch)

    runtime.lease.release = slow_release  # type: ignore[method-assign]
    app, _ = client_tool_app(model, runtime)
    parked = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    leg = data_lines((await asgi(app, "GET", f"/runs/{parked}/events"))[1])
    assert leg[-1]["finish_reason"] == "suspended"
    status, body = await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "y"})
    assert status == 201, body
    run_id = json.loads(body)["run_id"]
    assert data_lines((await asgi(app, "GET", f"/runs/{run_id}/events"))[1])[-1]["finish_reason"] == "stop"


async def test_a_stopped_parked_run_takes_no_verdict_and_its_session_starts_the_next_run() -> None:
    """A run parked on an approval is driven by no process: its stop is the log's ``run_aborted`` error, written under
    the session's lease; a verdict after it is refused unrecorded, and the tool never runs."""

    ledger = Ledger()
    model = ScriptedModel([reply("", call("rm", {"path": "x"}, "c1")), "hello"])
    app, _ = client_tool_app(model, rm=ledger.tool("rm", needs_approval=True))
    run_id = json.loads((await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "x"}))[1])["run_id"]
    leg1 = data_lines((await asgi(app, "GET", f"/runs/{run_id}/events"))[1])
    request = next(e for e in leg1 if e["type"] == "tool-approval-request")
    status, body = await asgi(app, "POST", f"/runs/{run_id}/cancel")
    assert (status, json.loads(body)) == (202, {"run_id": run_id, "status": "aborted"})
    status, body = await asgi(app, "POST", f"/runs/{run_id}/approvals",
                              {"approval_id": request["approval_id"], "approved": True})
    assert (status, json.loads(body)["error"]["code"]) == (409, "run_ended")
    assert (await asgi(app, "POST", f"/runs/{run_id}/cancel"))[0] == 409
    tail = data_lines((await asgi(app, "GET", f"/runs/{run_id}/events?after={leg1[-1]['seq']}"))[1])
    assert [(e["type"], e["code"]) for e in tail] == [("error", "run_aborted")]
    assert ledger.entries == []
    assert json.loads((await asgi(app, "GET", f"/runs/{run_id}"))[1])["status"] == "aborted"
    status, body = await asgi(app, "POST", "/runs", {"session_id": "s", "prompt": "y"})
    assert status == 201


def test_a_sub_agents_approval_shows_its_call_first_so_the_sdk_has_a_tool_part_to_ask_on() -> None:
    """ai 7 sets the state of the tool part named by ``toolCallId``; a sub-agent's call never streamed in the parent's
    log, so its approval request brings the call along (once, and a copy of the fold counts the same chunks)."""
    import copy

    request = {"type": "tool-approval-request", "approval_id": "a9", "tool_call_id": "sub-c1", "tool_name": "shell",
               "input": {"cmd": "ls"}, "agent_path": ["coder"], "token": None}
    folder = UiMessageStream("run-1")
    folder.chunks({"type": "step-start", "step_index": 1})
    assert len(copy.copy(folder).chunks(request)) == 2
    chunks = folder.chunks(request)
    assert chunks == [{"type": "tool-input-available", "toolCallId": "sub-c1", "toolName": "shell",
                       "input": {"cmd": "ls"}},
                      {"type": "tool-approval-request", "approvalId": "a9", "toolCallId": "sub-c1"}]
    for chunk in chunks:
        check_chunk(chunk)
    assert folder.chunks(request) == [chunks[1]]  # the call is shown once
