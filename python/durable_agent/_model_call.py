"""One model step of the loop: the call, its retries and fallbacks, through the run's journal when there is one.

A step makes attempts until one succeeds. After a failed attempt the decision is, in order:

1. the error is not retryable, or the policy allows no more attempts of this model: the next
   model of ``fallback`` (its own attempts, its own backoff) — or, with none left, the step fails;
2. otherwise, wait ``RetryPolicy.delay_ms`` (``Retry-After`` honoured) and try the same model.

A failed attempt's streamed text never enters the history: the stream carries a
``step-retry`` part (``step_index``, ``attempt``, ``error``, ``delay_ms``) telling a UI to drop
what it showed of that attempt.

On a journal runtime each attempt is a step of its own (the ``attempt`` field of the step
key). A failed attempt is recorded with its error's facts and the decision taken, including
the absolute time the next attempt may start; a replayed run takes the stored decision
instead of judging again, so a crash during a backoff wait resumes the remaining wait, not
attempt 1. Without a journal a resumed run simply makes the step's attempts again.
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._checkpoint import NO_USAGE, Usage
from ._durability import Durability
from ._errors import StepFailedError, is_control_error
from ._models import LanguageModel, ModelRequest
from ._options import RunOptions
from ._retry import RetryPolicy
from ._storage.keys import MODEL_CALL, RunKeys
from ._storage.records import StepRequest
from ._storage.scope import DEFER_DONE, StepContext
from .stream_parts import StreamPart, StreamRefusal, StreamStepRetry, StreamTextDelta, StreamToolCall
from .tracing import RunTrace


@dataclass(slots=True)
class ModelTurn:
    """What one model call produced; its JSON form is the model step's stored result.

    `step_index` and `attempt` (set by `ModelCaller.call`) place the parts it streams; they are not stored."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage = NO_USAGE
    finish_reason: str = "stop"
    reasoning: list[dict[str, Any]] = field(default_factory=list)  # reasoning parts, kept in the history
    response: dict[str, str] = field(default_factory=dict)  # the provider's id and model of it (traced, not stored)
    refusal: str = ""  # the model declined: its explanation (a ``refusal`` part of the history)
    raw_finish_reason: str | None = None  # the provider's own finish reason
    finished: bool = False  # the model's stream has put its finish event (not stored)
    step_index: int = 0
    attempt: int = 0

    def to_json(self) -> dict[str, Any]:
        optional = {"reasoning": self.reasoning, "refusal": self.refusal, "raw_finish_reason": self.raw_finish_reason}
        return {"text": self.text, "tool_calls": self.tool_calls, "usage": self.usage.to_dict(),
                "finish_reason": self.finish_reason, **{k: v for k, v in optional.items() if v}}

    def replay(self, stored: dict[str, Any]) -> list[StreamPart]:
        """Take a replayed model step's stored result; the parts a live call would have streamed."""
        self.text, self.tool_calls = stored["text"], list(stored["tool_calls"])
        self.usage, self.finish_reason = Usage.from_dict(stored["usage"]), stored["finish_reason"]
        self.reasoning = list(stored.get("reasoning", ()))
        self.refusal, self.raw_finish_reason = stored.get("refusal", ""), stored.get("raw_finish_reason")
        step, attempt = self.step_index, self.attempt
        text: list[StreamPart] = [StreamTextDelta(step_index=step, attempt=attempt, text=self.text)] if self.text else []
        if self.refusal:
            text.append(StreamRefusal(step_index=step, attempt=attempt, text=self.refusal))
        return [*text, *(StreamToolCall(step_index=step, attempt=attempt, tool_call_id=c["tool_call_id"],
                                        tool_name=c["tool_name"], input=c["input"]) for c in self.tool_calls)]

    def reset(self) -> None:
        """Forget a failed attempt's output."""
        self.text, self.tool_calls, self.usage, self.finish_reason, self.reasoning = "", [], NO_USAGE, "stop", []
        self.response = {}
        self.refusal, self.raw_finish_reason, self.finished = "", None, False


def decide(policy: RetryPolicy, attempt: int, error: BaseException, now: int,
           chance: Callable[[], float]) -> dict[str, Any]:
    """The decision after attempt `attempt` (1-based, of the current model) failed with `error`.

    ``{"action": "retry", "delay_ms": d, "retry_at": t}`` (same model, not before ``t``) or
    ``{"action": "next-model"}`` (the next fallback, or failing the step when none is left).
    """
    delay = policy.delay_ms(attempt, error, chance)
    if delay is None:
        return {"action": "next-model"}
    return {"action": "retry", "delay_ms": delay, "retry_at": now + delay}


class ModelCaller:
    """Makes the model call of each step of one loop: attempts, backoff, fallbacks (see the module docs)."""

    def __init__(self, options: RunOptions, durability: Durability, run_id: str | None, trace: RunTrace,
                 check_abort: Callable[[], None]) -> None:
        self.options = options
        self.durability = durability
        self.run_id = run_id
        self.keys = RunKeys(run_id or "run")
        self.trace = trace
        self.check_abort = check_abort

    async def call(self, model: LanguageModel, request: ModelRequest, step_index: int,
                   turn: ModelTurn) -> AsyncGenerator[StreamPart, None]:
        """Stream the step's model call into `turn`, retrying and falling back as the policy decides."""
        models: Sequence[LanguageModel] = [model, *self.options.fallback]
        which, tries, attempt = 0, 0, 0  # the model in use, its attempts so far, the step's attempts so far
        while True:
            tries += 1
            turn.step_index, turn.attempt = step_index, attempt
            attempting = self._attempt(models[which], request, step_index, attempt, turn, tries)
            try:
                async for part in attempting:
                    yield part
                return
            except BaseException as error:  # judged below; what is not retried is raised again
                if not isinstance(error, Exception):  # stopped early: close the attempt now (`AgentLoop._step`)
                    await attempting.aclose()
                    raise
                if is_control_error(error):
                    raise
                decision = self._decision_of(error, tries)
                if decision["action"] == "next-model" and which + 1 >= len(models):
                    raise
                turn.reset()
                yield StreamStepRetry(step_index=step_index, attempt=attempt, error=error,
                                      delay_ms=int(decision.get("delay_ms", 0)))
                if decision["action"] == "next-model":
                    which, tries = which + 1, 0
                else:
                    await self._wait_until(int(decision["retry_at"]))
                attempt += 1

    def _decision_of(self, error: BaseException, tries: int) -> dict[str, Any]:
        """A replayed failure's stored decision, or the one taken live (attached to the error when it was)."""
        stored = getattr(error, "durable_decision", None)
        if isinstance(stored, dict) and stored.get("action") in ("retry", "next-model"):
            return stored
        if isinstance(error, StepFailedError):  # a failure recorded without a decision: not retried
            return {"action": "next-model"}
        return decide(self.options.retry, tries, error, self.options.clock(), random.random)

    async def _wait_until(self, retry_at: int) -> None:
        """Wait until `retry_at` (ms on the run's clock): the rest of a wait a crash interrupted, on resume."""
        wait = max(0, retry_at - self.options.clock())
        if self.options.retry.sleep is not None:
            await self.options.retry.sleep(wait)
        else:
            await self.durability.sleep(wait, self.options.signal)
        self.check_abort()

    async def _attempt(self, model: LanguageModel, request: ModelRequest, step_index: int, attempt: int,
                       turn: ModelTurn, tries: int) -> AsyncGenerator[StreamPart, None]:
        """One attempt: a step of the run's durability (on a journal, replayed from its record when it has one)."""
        self.trace.start_model(model)
        called = []

        async def live(context: StepContext) -> AsyncGenerator[StreamPart, None]:
            called.append(True)
            streaming = self._stream(model, request, turn, context)
            try:
                async for part in streaming:
                    yield part
            except GeneratorExit:
                await streaming.aclose()  # stopped early (`AgentLoop._step`)
                raise
            except Exception as error:
                # The decision is stored with the failed attempt, so a replay decides the same way (an
                # attribute set on whatever exception it is: hence the ignore); `call` takes it from there.
                if not is_control_error(error):
                    error.durable_decision = self._decision_of(error, tries)  # type: ignore[attr-defined]
                raise

        step_request = StepRequest(self.keys.key(step_index, MODEL_CALL, attempt), "model", "safe",
                                   {"model": model.model_id})
        stepping = self.durability.streamed_step(step_request, live, turn, DEFER_DONE)
        try:
            async for part in stepping:
                yield part
        except BaseException as error:
            if not isinstance(error, Exception):  # stopped early (`AgentLoop._step`)
                await stepping.aclose()
                raise
            self.trace.end_model(None, None, error=error)
            raise
        self.trace.end_model(turn.usage, turn.finish_reason, replayed=not called, response=turn.response)

    async def _stream(self, model: Any, request: ModelRequest, turn: ModelTurn,
                      context: StepContext) -> AsyncGenerator[StreamPart, None]:
        """The model's events as stream parts, collected into `turn` (`context`: the step's, progress to its journal)."""
        events = model.stream(request)
        try:
            async for event in events:
                self.check_abort()
                if event["type"] == "text-delta":
                    turn.text += event["text"]
                    if context.on_progress is not None:
                        await context.on_progress({"type": "text", "delta": event["text"]})
                    yield StreamTextDelta(step_index=turn.step_index, attempt=turn.attempt, text=event["text"])
                elif event["type"] == "tool-call":
                    call = {"tool_call_id": event["tool_call_id"], "tool_name": event["tool_name"], "input": event["input"]}
                    turn.tool_calls.append(call)
                    yield StreamToolCall(step_index=turn.step_index, attempt=turn.attempt, tool_call_id=event["tool_call_id"],
                                         tool_name=event["tool_name"], input=event["input"])
                elif event["type"] == "finish":
                    turn.usage, turn.finish_reason = event["usage"], event["finish_reason"]
                    turn.raw_finish_reason, turn.finished = event.get("raw_finish_reason"), True
                elif event["type"] == "response-metadata":
                    turn.response = {k: event[k] for k in ("id", "model") if isinstance(event.get(k), str)}
                elif event["type"] == "refusal":
                    turn.refusal += event["text"]
                    yield StreamRefusal(step_index=turn.step_index, attempt=turn.attempt, text=event["text"])
                elif event["type"] == "reasoning":
                    turn.reasoning.append({"type": "reasoning", **{k: event[k] for k in ("text", "provider", "metadata")}})
        except BaseException:
            close = getattr(events, "aclose", None)  # a model's stream (an HTTP response): closed now we stop early
            if close is not None:
                await close()
            raise
