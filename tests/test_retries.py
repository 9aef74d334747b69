"""Model-call retries and fallbacks: in-process, and on a journal (each attempt its own step, the decision stored)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from durable_agent import (
    MODEL_CALL,
    Agent,
    DurableOptions,
    ModelCallError,
    ModelRequest,
    RetryPolicy,
    RunSuspendedError,
    StreamPart,
    StreamStepRetry,
    StreamTextDelta,
    Usage,
    generate_text,
    step_key,
    stream_chat,
)
from test_agent import runtime_on  # noqa: F401  # fixtures: memory, SQLite, Postgres
from test_runtime_postgres import conninfo, opened  # noqa: F401

FAST = RetryPolicy(attempts=3, initial_delay_ms=1, max_delay_ms=2, jitter=False)


def overloaded(retry_after_ms: int | None = None) -> ModelCallError:
    return ModelCallError("overloaded", provider="test", kind="overloaded", retryable=True, status=529,
                          retry_after_ms=retry_after_ms)


class Flaky:
    """Fails its first `failures` calls (after streaming some text), then answers `answer`."""

    def __init__(self, failures: int, answer: str = "fine", error: Callable[[], Exception] = overloaded,
                 model_id: str = "flaky") -> None:
        self.failures, self.answer, self.error, self.model_id = failures, answer, error, model_id
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        self.requests.append(request)
        if len(self.requests) <= self.failures:
            yield {"type": "text-delta", "text": "half an ans"}
            raise self.error()
        yield {"type": "text-delta", "text": self.answer}
        yield {"type": "finish", "finish_reason": "stop", "usage": Usage(3, 2, 5)}


async def test_a_retryable_failure_is_retried_and_its_partial_text_never_enters_the_history() -> None:
    model = Flaky(2)
    result = stream_chat(model=model, messages=[{"role": "user", "content": "hi"}], retry=FAST)
    parts = [p async for p in result.full_stream]
    retries = [p for p in parts if isinstance(p, StreamStepRetry)]
    assert [(r.step_index, r.attempt, r.delay_ms) for r in retries] == [(0, 0, 1), (0, 1, 2)]
    assert all(isinstance(r.error, ModelCallError) for r in retries)
    assert [(p.step_index, p.attempt) for p in parts if isinstance(p, StreamTextDelta)][-1] == (0, 2)
    final = await result.result()
    assert final.text == "fine" and len(model.requests) == 3
    assert "half an ans" not in str(final.messages)


async def test_what_is_not_retryable_fails_at_once_and_a_spent_policy_gives_up() -> None:
    auth = Flaky(5, error=lambda: ModelCallError("bad key", provider="t", kind="auth", retryable=False, status=401))
    with pytest.raises(ModelCallError, match="bad key"):
        await generate_text(model=auth, messages=[{"role": "user", "content": "hi"}], retry=FAST)
    assert len(auth.requests) == 1
    busy = Flaky(5)
    with pytest.raises(ModelCallError, match="overloaded"):
        await generate_text(model=busy, messages=[{"role": "user", "content": "hi"}], retry=FAST)
    assert len(busy.requests) == 3
    plain = Flaky(1, error=lambda: ValueError("a bug"))  # not a provider error: not retried
    with pytest.raises(ValueError):
        await generate_text(model=plain, messages=[{"role": "user", "content": "hi"}], retry=FAST)


async def test_a_fallback_model_takes_over_when_the_first_keeps_failing() -> None:
    primary, backup = Flaky(10, model_id="primary"), Flaky(0, "from the backup", model_id="backup")
    result = await generate_text(model=primary, fallback=[backup], messages=[{"role": "user", "content": "hi"}],
                                 retry=RetryPolicy(attempts=2, initial_delay_ms=1, max_delay_ms=1, jitter=False))
    assert result.text == "from the backup" and len(primary.requests) == 2 and len(backup.requests) == 1


async def test_the_decision_honours_retry_after_and_gives_up_on_an_unreasonable_one() -> None:
    waits: list[int] = []

    async def sleep(ms: int) -> None:
        waits.append(ms)

    policy = RetryPolicy(attempts=4, initial_delay_ms=100, jitter=False, max_retry_after_ms=5_000, sleep=sleep)
    ask: Any = {"messages": [{"role": "user", "content": "hi"}], "retry": policy, "clock": lambda: 1_000}
    errors = iter([overloaded(), overloaded(2_000)])
    result = stream_chat(model=Flaky(2, error=lambda: next(errors)), **ask)
    retries = [p for p in [p async for p in result.full_stream] if isinstance(p, StreamStepRetry)]
    assert [r.delay_ms for r in retries] == waits == [100, 2_000]  # the backoff, then the server's retry-after
    unreasonable = Flaky(5, error=lambda: overloaded(60_000))  # beyond max_retry_after_ms: give up at once
    with pytest.raises(ModelCallError):
        await generate_text(model=unreasonable, **ask)
    assert len(unreasonable.requests) == 1 and waits == [100, 2_000]
    busy = Flaky(10)
    with pytest.raises(ModelCallError):
        await generate_text(model=busy, **ask)
    assert len(busy.requests) == 4  # the policy's attempts, then the next model (none here)


def sleeps_recorded(runtime: Any, waits: list[int], *, then_stop: bool) -> None:
    """Make `runtime`'s run scopes record each wait; with `then_stop`, the process stops during it."""
    open_run = runtime.open_run

    async def recording_open_run(**kwargs: Any) -> Any:
        scope = await open_run(**kwargs)

        async def sleep(ms: int, signal: Any = None) -> None:
            waits.append(ms)
            if then_stop:
                raise RunSuspendedError()

        scope.sleep = sleep
        return scope

    runtime.open_run = recording_open_run


async def test_on_a_journal_each_attempt_is_a_step_and_a_resume_takes_the_stored_decision(
    runtime_on: Callable[[], Any]  # noqa: F811
) -> None:
    """The process stops during the backoff wait; the resumed run does not call attempt 0 again,
    and waits only what is left of the stored wait."""
    now = [1_000_000]
    model = Flaky(1)
    slow = RetryPolicy(attempts=3, initial_delay_ms=60_000, max_delay_ms=60_000, jitter=False)

    def agent(runtime: Any) -> Agent:
        return Agent(model=model, durable=DurableOptions(runtime, stale_after_ms=1), session_id="chat-1",
                     retry=slow, clock=lambda: now[0])

    first, waits = runtime_on(), list[int]()
    sleeps_recorded(first, waits, then_stop=True)
    with pytest.raises(RunSuspendedError):
        await agent(first).run("hi")
    assert waits == [60_000] and len(model.requests) == 1
    run_id = await first.stores.runs.last("chat-1")
    records = {r.key: r for r in await first.inspect.steps(run_id)}
    failed = records[step_key(run_id, 1, MODEL_CALL, 0)]
    assert failed.status == "failed" and failed.error is not None and failed.error.retryable is True
    assert failed.error.decision == {"action": "retry", "delay_ms": 60_000, "retry_at": 1_060_000}

    now[0] += 45_000  # the next process starts 45 s later: 15 s of the wait are left
    second, waited = runtime_on(), list[int]()
    sleeps_recorded(second, waited, then_stop=False)
    parts: list[StreamPart] = []

    async def on_part(_: str | None, part: StreamPart) -> None:
        parts.append(part)

    resumed = await agent(second).resume(on_part=on_part)
    assert resumed is not None and resumed.text == "fine"
    assert [(p.type, p.step_index, p.attempt) for p in parts] == [  # the stored failure comes back as its retry
        ("step-start", 1, 0), ("step-retry", 1, 0), ("text-delta", 1, 1), ("step-finish", 1, 1), ("finish", 1, 1)]
    assert waited == [15_000] and len(model.requests) == 2  # attempt 0 was not requested again
    statuses = {r.key: r.status for r in await second.inspect.steps(run_id)}
    assert statuses[step_key(run_id, 1, MODEL_CALL, 1)] == "done"


async def test_healing_takes_the_answer_of_whichever_attempt_finished() -> None:
    """A process stopped with its run's model call failed at attempt 0 and done at attempt 1 (its records
    committed, its checkpoint not): the session's next run heals it with attempt 1's answer."""
    from durable_agent import Agent, AgentCheckpoint, DurableOptions, ScriptedModel
    from durable_agent.backends import DeferredSteps, RunTransition, StepRecord
    from durable_agent.backends.memory import MemoryRuntime

    runtime = MemoryRuntime()
    epoch = (await runtime.lease.claim("s", stale_at=0)).epoch
    assert epoch is not None
    checkpoint = AgentCheckpoint(run_id="r", step_index=0, status="running", usage=Usage(), created_at=1,
                                 messages=[{"role": "user", "content": "hi"}])
    answer = {"text": "from attempt 1", "tool_calls": [], "usage": Usage().to_dict(), "finish_reason": "stop"}
    records = (StepRecord("s", "r", step_key("r", 1, MODEL_CALL, 0), "model", "safe", "failed", None),
               StepRecord("s", "r", step_key("r", 1, MODEL_CALL, 1), "model", "safe", "done", None, answer))
    await runtime.commit(RunTransition("s", epoch, checkpoint=checkpoint, last_run="r", mark="r",
                                       deferred=DeferredSteps(records)))
    await runtime.lease.release("s", epoch)  # the process stopped: its run stays marked in progress
    model = ScriptedModel(lambda request: "next")
    agent = Agent(model=model, durable=DurableOptions(runtime, on_interrupted="heal"), session_id="s")
    await agent.run("go on")
    healed = runtime.stores.checkpoints.load("r")
    assert healed is not None and healed.status == "completed"
    assert healed.messages[-1]["content"] == [{"type": "text", "text": "from attempt 1"}]
    assert len(model.requests) == 1  # the new run's call only: the healed one was not asked again


async def test_an_injected_sleep_takes_the_backoff_wait_so_a_429_test_does_not_wait_in_real_time() -> None:
    """A 429 asking for 19.5 s, over a real adapter: the policy's `sleep` gets the wait, nothing waits."""
    from durable_agent.providers import OpenAIChatModel
    from replay import ReplayTransport

    waits: list[int] = []

    async def sleep(ms: int) -> None:
        waits.append(ms)

    transport = ReplayTransport(["openai_chat/rate_limited", "openai_chat/text"])
    model = OpenAIChatModel("m", base_url="https://llm.test/v1", api_key="k", transport=transport)
    result = await generate_text(model=model, messages=[{"role": "user", "content": "hi"}],
                                 retry=RetryPolicy(sleep=sleep), clock=lambda: 1_000)  # a still clock: the whole wait
    assert result.text.endswith("both invoices are ready.") and waits == [19_500] and len(transport.requests) == 2
    assert RetryPolicy(sleep=sleep) == RetryPolicy()  # how it waits is not what the policy decides
