"""The public faces of the loop: buffered (`generate_text`) and streaming (`stream_chat`), and their resume twins.

All four share `AgentLoop`; the buffered faces consume the same stream of parts the
streaming faces hand out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, Unpack

from ._checkpoint import ToolApprovalRequest, Usage
from ._loop import AgentLoop
from ._messages import Message, final_text
from ._models import LanguageModel
from ._options import CallOptions, RunOptions
from ._results import FinishReason, GenerateTextResult
from ._storage.protocols import CheckpointStore
from .stream_parts import StreamError, StreamPart


def _result_of(loop: AgentLoop) -> GenerateTextResult:
    assert loop.finish_reason is not None
    return GenerateTextResult(
        text=final_text(loop.messages),
        messages=tuple(loop.messages),
        steps=tuple(loop.steps),
        usage=loop.usage,
        total_usage=loop.total_usage,
        finish_reason=loop.finish_reason,
        pending_approvals=loop.pending_approvals,
        client_tool_calls=loop.client_tool_calls,
        run_id=loop.run_id,
        output=loop.output,
        raw_finish_reason=loop.raw_finish_reason,
    )


PartSink = Callable[[str | None, StreamPart], Awaitable[None]]
"""Receives every part of a run as it streams, with the run's id; the run waits for it (`Agent.run(on_part=)`)."""


async def _consume(loop: AgentLoop, on_part: PartSink | None = None) -> GenerateTextResult:
    """Drive `loop` to its end; an ``error`` part is raised (never handed to `on_part`)."""
    async with aclosing(loop.parts()) as parts:  # on_part may raise: the model's stream closes at once
        async for part in parts:
            if isinstance(part, StreamError):
                raise part.error
            if on_part is not None:
                await on_part(loop.run_id, part)
    return _result_of(loop)


class StreamChatResult:
    """A streaming call. Returned synchronously; the run starts when it is first consumed.

    `run_id` is known at once (before the first part). Iterate `full_stream` once for every
    part; `await` `usage`, `total_usage`, `finish_reason` or `result()` for the outcome (they
    drive the run themselves when nobody iterates the stream). A failure never raises from
    the iteration: it arrives as an ``error`` part (`StreamError`), and the awaitables raise it.
    The parts are the typed dataclasses of `durable_agent.stream_parts`.
    """

    def __init__(self, loop: AgentLoop) -> None:
        self._loop = loop
        self._started = False
        self.run_id: str | None = loop.run_id

    @property
    def full_stream(self) -> AsyncIterator[StreamPart]:
        if self._started:
            raise RuntimeError("a StreamChatResult's full_stream can be consumed only once")
        self._started = True
        return self._loop.parts()

    async def _settled(self) -> AgentLoop:
        if not self._started:
            async for _ in self.full_stream:
                pass
        elif self._loop.finished is not None:
            await self._loop.finished.wait()
        if self._loop.error is not None:
            raise self._loop.error
        return self._loop

    async def _usage(self) -> Usage:
        return (await self._settled()).usage

    async def _total_usage(self) -> Usage:
        return (await self._settled()).total_usage

    async def _finish_reason(self) -> FinishReason:
        reason = (await self._settled()).finish_reason
        assert reason is not None
        return reason

    @property
    def usage(self) -> Any:
        """Awaitable: the usage of this call."""
        return self._usage()

    @property
    def total_usage(self) -> Any:
        """Awaitable: the whole run's usage, across every leg."""
        return self._total_usage()

    @property
    def finish_reason(self) -> Any:
        """Awaitable: why the call ended."""
        return self._finish_reason()

    async def result(self) -> GenerateTextResult:
        """The same outcome `generate_text` would have returned."""
        return _result_of(await self._settled())

    async def pending_approvals(self) -> tuple[ToolApprovalRequest, ...]:
        return (await self._settled()).pending_approvals


async def generate_text(
    *,
    model: LanguageModel,
    messages: Sequence[Message],
    store: CheckpointStore | None = None,
    run_id: str | None = None,
    **options: Unpack[CallOptions],
) -> GenerateTextResult:
    """Run the agent loop to its end and return the outcome.

    With `store` and tools, the run checkpoints into `store` at every step boundary under
    `run_id` (minted with `generate_id` when None; a `run_id` without `store` is a
    `ConfigurationError`). A stored `run_id` continues that run (step indices and usage go on)
    when `messages` begin with its stored history, and raises `RunExistsError` otherwise, before
    the model is called: one run id per piece of work, as `Agent.run`. Trailing unanswered tool
    calls in `messages` (a suspended run's history) are settled first, from `approval_responses`.
    """
    return await _consume(AgentLoop(RunOptions.build(model, options, store=store, run_id=run_id), messages))


def stream_chat(
    *,
    model: LanguageModel,
    messages: Sequence[Message],
    store: CheckpointStore | None = None,
    run_id: str | None = None,
    **options: Unpack[CallOptions],
) -> StreamChatResult:
    """The streaming twin of `generate_text`; returns at once with `run_id` set."""
    return StreamChatResult(AgentLoop(RunOptions.build(model, options, store=store, run_id=run_id), messages))


async def resume_from_checkpoint(
    store: CheckpointStore, run_id: str, *, model: LanguageModel, **options: Unpack[CallOptions]
) -> GenerateTextResult:
    """Continue a stored run: settle its pending calls from `approval_responses`, then go on.

    Takes every option of `generate_text` except `messages` (the checkpoint's history),
    `store` and `run_id` (given here positionally). Raises `CheckpointNotFoundError` for an unknown run.
    """
    return await _consume(_resume_loop(store, run_id, model, options))


def resume_stream_from_checkpoint(
    store: CheckpointStore, run_id: str, *, model: LanguageModel, **options: Unpack[CallOptions]
) -> StreamChatResult:
    """The streaming twin of `resume_from_checkpoint`. An unknown run arrives as an ``error`` part."""
    return StreamChatResult(_resume_loop(store, run_id, model, options))


def _resume_loop(store: CheckpointStore, run_id: str, model: LanguageModel, options: CallOptions) -> AgentLoop:
    if not isinstance(run_id, str) or not run_id:
        raise TypeError("run_id must be a non-empty str")
    return AgentLoop(RunOptions.build(model, options, store=store, run_id=run_id), None, resume_run_id=run_id)
