"""The agent loop core, shared by the buffered and the streaming faces.

`AgentLoop.parts()` is an async generator of stream parts (`stream_parts`). `generate_text`
consumes it; `stream_chat` hands it to the caller. After it ends, the loop's attributes hold
the outcome (messages, steps, usage, finish reason, pending approvals).

A run goes step by step: a model call (`model_call.ModelCaller`: attempts, retries,
fallbacks), then the tool calls it asked for (`tool_calls.ToolDecider` decides each,
`tool_calls.ToolRunner` runs them), each a step of the run's `Durability` (`durability`: a
pass-through, or a durable leg's journal). At every step boundary a durable run saves an
`AgentCheckpoint` to the durability's checkpoints; saving is best-effort (a failing store is logged, the run goes on). When a tool needs a verdict from outside (client-mode approval)
or is a client tool, the run *suspends*: the assistant message is kept with its tool calls
unanswered, plus a ``tool-approval-request`` part for each gated call, and the checkpoint
says ``suspended``. The next call on that history *settles* the unanswered calls first.

A call naming a stored run (`run_id=`) is that run's next leg: its step indices and usage go on
from the checkpoint. So its messages must begin with the stored history (the checkpoint spec's
escape hatch appends to it); any other history is other work under a taken id, refused with
`RunExistsError` before the model is called, as `Agent.run` refuses a stored run id.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

from ._checkpoint import AgentCheckpoint, RunStatus, ToolApprovalRequest, Usage
from ._durability import Durability
from ._errors import (
    CheckpointNotFoundError,
    CheckpointVersionError,
    CodecError,
    ConfigurationError,
    OutputValidationError,
    RunAbortedError,
    RunExistsError,
    RunSuspendedError,
    is_control_error,
)
from ._kernels import kernels
from ._messages import History, Message, extended
from ._model_call import ModelCaller, ModelTurn
from ._models import ModelRequest
from ._options import PrepareStepContext, RunOptions, StepOverrides, logger
from ._results import FinishReason, StepResult
from ._stop import StopContext
from ._structured_output import REPAIR_PROMPT, OutputSpec
from ._tool_calls import ToolCall, ToolDecider, ToolPhase, ToolRunner
from ._tool_sources import RunTools, run_tools
from ._transcript import assistant_message, tool_message, unresolved_calls
from ._util import maybe_await
from .stream_parts import (
    StreamError,
    StreamFinish,
    StreamPart,
    StreamStepFinish,
    StreamStepStart,
    StreamToolApprovalRequest,
    StreamToolProgress,
    StreamToolResult,
)
from .tracing import RunLogger, RunTrace

_NOT_ITS_HISTORY = (
    "these messages do not begin with its stored history, so they are another piece of work (or a retry of the "
    "started run): continue the run with resume_from_checkpoint, or by passing its stored history plus what you "
    "add; start new work under another run id"
)


def _begins_with(messages: Sequence[Message], stored: Sequence[Message]) -> bool:
    """True when `messages` begin with the `stored` history, message for message: equal, or equal as stored."""
    if len(messages) < len(stored):
        return False
    for i, old in enumerate(stored):
        new = messages[i]
        if new is old or new == old:
            continue
        try:
            if kernels.encode(new) == kernels.encode(old):
                continue
        except CodecError:
            pass
        return False
    return True


# A model's finish reasons that are also the run's (any other ends the run as "stop").
_ENDING_REASONS: dict[str, FinishReason] = {"length": "length", "refusal": "refusal", "content-filter": "content-filter"}

_NO_OVERRIDES = StepOverrides()  # a step without prepare_step (frozen: one serves every step)


class AgentLoop:
    """One call of the loop. Create, iterate `parts()` once, then read the outcome attributes.

    `durability`: how the run is durable (`durability`); by default the pass-through that saves
    its checkpoints to the call's `store=`, if any.
    """

    def __init__(
        self,
        options: RunOptions,
        messages: Sequence[Message] | None,
        *,
        durability: Durability | None = None,
        resume_run_id: str | None = None,
        trace: RunTrace | None = None,
    ) -> None:
        if messages is None and resume_run_id is None:
            raise ConfigurationError("messages are required")
        self.options = options
        self.durability = durability if durability is not None else Durability(options.store)
        self._resume = resume_run_id is not None
        self.run_id: str | None = resume_run_id
        if self.run_id is None and options.durable:
            self.run_id = options.run_id or options.generate_id()
        self.messages: list[Message] = History(messages or [])
        self.steps: list[StepResult] = []
        self.usage = Usage()
        self.total_usage = Usage()
        self.finish_reason: FinishReason | None = None
        self.raw_finish_reason: str | None = None  # the provider's, of the last model call
        self.pending_approvals: tuple[ToolApprovalRequest, ...] = ()
        self.client_tool_calls: tuple[dict[str, Any], ...] = ()
        self.error: BaseException | None = None
        self.finished: asyncio.Event | None = None
        self._next_index = 0
        self._turn = ModelTurn(step_index=-1)  # the model call of the step in progress: places an error part
        self._last_batch: list[tuple[str, Any]] = []  # the runaway guard's: the last step's tool calls,
        self._repeats = 0  # and how many steps in a row made them
        self.trace = trace if trace is not None else RunTrace()  # `trace`: a leg whose span started before its loop (`DurableSession.run`)
        self.log = RunLogger(logger, lambda: (self.run_id, self._next_index, self.durability.session_id))
        self._output = OutputSpec.build(options.output) if options.output is not None else None
        self._repairs = 0
        self.output: Any = None
        self._tool_set: RunTools | None = None
        self._bind(options)

    def _bind(self, options: RunOptions) -> None:
        """Use `options` from now on (a run with tool sources rebinds once their tools are known)."""
        self.options = options
        self._specs = tuple(tool.spec(name) for name, tool in options.tools.items())  # what the model is offered
        self._models = ModelCaller(options, self.durability, self.run_id, self.trace, self._check_abort)
        self._decider = ToolDecider(options, self.run_id)
        self._runner = ToolRunner(options, self.durability, self.run_id, self.trace, self.log, self._check_abort)

    # ----------------------------------------------------------------- driving

    async def parts(self) -> AsyncGenerator[StreamPart, None]:
        """Run the loop, yielding stream parts. Failures become one final ``error`` part."""
        self.finished = asyncio.Event()
        if not self.trace.started:
            self.trace.start_run(self.run_id, self.options.model, self.options.agent_name, self.options.agent_path)
        try:
            async with run_tools(self.options, self.durability, self.run_id) as tools:
                if self.options.mcp_servers:  # only a run with tool sources has tools that may change
                    self._bind(replace(self.options, tools=tools.tools))
                    self._tool_set = tools
                driving = self._drive()
                try:
                    async for part in driving:
                        yield part
                except BaseException:
                    await driving.aclose()  # stopped early: close the steps, and the model's stream, now (`_step`)
                    raise
        except Exception as exc:  # noqa: BLE001 - every failure is reported as an error part
            self.error = exc
            self.log.debug("run %s failed: %r", self.run_id, exc)
            attempt = self._turn.attempt if self._turn.step_index == self._next_index else 0
            yield StreamError(step_index=self._next_index, attempt=attempt, error=exc)
        finally:
            self.trace.end_run(self.run_id, self.finish_reason, self.usage, self.total_usage, self.error)
            self.finished.set()

    async def _drive(self) -> AsyncGenerator[StreamPart, None]:
        await self._start_from_store()
        calls, approval_ids = unresolved_calls(self.messages)
        if calls:
            async for part in self._settle(calls, approval_ids):
                yield part
            if self.finish_reason is not None:
                return
        while self.finish_reason is None:
            step = self._step()
            try:
                async for part in step:
                    yield part
            except BaseException:
                await step.aclose()  # as in `parts`
                raise

    async def _start_from_store(self) -> None:
        store = self.durability.checkpoints
        if self.run_id is None or store is None:
            return
        if self._resume:
            checkpoint = await maybe_await(store.load(self.run_id))
            if checkpoint is None:
                raise CheckpointNotFoundError(self.run_id)
            self.messages = History(checkpoint.refuse_newer().messages)
        else:
            try:
                checkpoint = await maybe_await(store.load(self.run_id))
            except CheckpointVersionError:
                raise  # a newer durable-agent's run: never overwrite it with an older schema
            except Exception:  # a fresh run must not die of an unreadable old one
                self.log.exception("could not load the stored checkpoint of run %s; starting its counters at 0", self.run_id)
                checkpoint = None
        if checkpoint is not None:
            checkpoint.refuse_newer()
            if not self._resume and not _begins_with(self.messages, checkpoint.messages):
                raise RunExistsError(self.run_id, _NOT_ITS_HISTORY)
            self._next_index = checkpoint.step_index + 1
            self.total_usage = checkpoint.usage
        self.trace.run_loaded(self.run_id, self.durability.session_id, checkpoint)

    def _check_abort(self) -> None:
        signal = self.options.signal
        if signal is not None and signal.is_set():
            raise RunAbortedError(self.run_id)
        suspend = self.durability.suspend_signal
        if suspend is not None and suspend.is_set():
            raise RunSuspendedError()

    # ------------------------------------------------------------------ steps

    async def _step(self) -> AsyncGenerator[StreamPart, None]:
        self._check_abort()
        step_index = self._next_index
        if self._tool_set is not None and (tools := await self._tool_set.at_step(step_index)) is not None:
            self._bind(replace(self.options, tools=tools))  # a tool source changed its tools
        self.trace.start_step(step_index, "model")
        overrides = await self._prepare(step_index)
        model = overrides.model or self.options.model
        yield StreamStepStart(step_index=step_index)
        request = ModelRequest(
            messages=tuple(overrides.messages if overrides.messages is not None else self.messages),
            tools=self._specs if overrides.active_tools is None else tuple(
                spec for spec in self._specs if spec.name in overrides.active_tools
            ),
            output_schema=self._output.schema if self._output is not None else None,
            output_name=self._output.name if self._output is not None else "output",
            settings=self.options.model_settings,
        )
        turn = self._turn = ModelTurn(step_index=step_index)
        call = self._models.call(model, request, step_index, turn)
        try:
            async for part in call:
                yield part
        except BaseException:
            # Stopped while the model streams (a listener raised, the run was cancelled or closed): each level
            # closes the one it reads, down to the model's own stream (an HTTP response), now rather than
            # whenever the collector finalizes the generators, one event-loop turn per level.
            await call.aclose()
            raise
        self._check_abort()
        usage, model_finish, text = turn.usage, turn.finish_reason, turn.text
        self.raw_finish_reason = turn.raw_finish_reason
        calls = [ToolCall(c["tool_call_id"], c["tool_name"], c["input"]) for c in turn.tool_calls]
        self.usage, self.total_usage = self.usage + usage, self.total_usage + usage

        phase = ToolPhase()
        if calls:
            await self._decider.decide(calls, settling=False)
            phase = self._decider.pending_of(calls)
        assistant = assistant_message(text, [c.as_part() for c in calls], phase.approvals, turn.reasoning,
                                      turn.refusal)
        self.messages = extended(self.messages, assistant)
        if calls and not phase.suspends:
            ran: list[ToolPhase] = []
            async for part in self._execute(calls, self._next_index, ran, turn.attempt):
                yield part
            phase = ran[0]
            self.usage, self.total_usage = self.usage + phase.usage, self.total_usage + phase.usage
            if not phase.suspends:
                self.messages = extended(self.messages, tool_message(phase.results))
        if phase.suspends:
            async for part in self._suspend(phase, step_index, turn.attempt):
                yield part
        self.steps.append(
            StepResult(step_index, text, tuple(c.as_part() for c in calls), tuple(phase.results), usage, model_finish,
                       turn.raw_finish_reason)
        )
        finish = self._finish_reason_after(calls, model_finish, phase)
        if finish == "stop" and self._output is not None:
            finish = self._take_output(text)
        if not phase.suspends:
            await self._save(step_index, "completed" if finish else "running")
            for result in phase.results:  # once saved: a tool's done record may ride on the save (ToolRunner)
                yield StreamToolResult.of(result, step_index=step_index, attempt=turn.attempt)
        self.trace.end_step()
        yield StreamStepFinish(step_index=step_index, attempt=turn.attempt, usage=usage, finish_reason=model_finish,
                               raw_finish_reason=turn.raw_finish_reason)
        self._next_index = step_index + 1
        if finish is not None:
            yield self._finish(finish, step_index, turn.attempt)

    async def _prepare(self, step_index: int) -> StepOverrides:
        if self.options.prepare_step is None:
            return _NO_OVERRIDES
        context = PrepareStepContext(step_index, len(self.steps), tuple(self.messages), self.total_usage, self.usage)
        overrides = await maybe_await(self.options.prepare_step(context))
        if overrides is None:
            return _NO_OVERRIDES
        if not isinstance(overrides, StepOverrides):
            raise ConfigurationError("prepare_step must return a StepOverrides or None")
        return overrides

    def _finish_reason_after(self, calls: list[ToolCall], model_finish: str, phase: ToolPhase) -> FinishReason | None:
        if phase.suspends:
            return "suspended"
        if not calls:
            return _ENDING_REASONS.get(model_finish, "stop")
        if len(self.steps) >= self.options.max_steps:
            return "max-steps"
        if self.options.stop_when:  # a StopContext only for a run that has conditions
            context = StopContext(len(self.steps), self.total_usage, self.usage, self.options.model.model_id)
            if any(condition(context) for condition in self.options.stop_when):
                return "stop-condition"
        if self._is_runaway(calls):
            self.log.warning("run %s repeated the same tool calls %d times; stopping it", self.run_id, self.options.runaway_limit)
            return "runaway"
        return None

    def _take_output(self, text: str) -> FinishReason | None:
        """Check the final answer against `output=`: keep it, send it back for a repair, or fail the run."""
        assert self._output is not None
        value, problem = self._output.check(text)
        if problem is None:
            self.output = value
            return "stop"
        if self._repairs >= self.options.output_retries:
            raise OutputValidationError(problem, text)
        self._repairs += 1
        self.log.info("run %s: the answer does not match the output (%s); asking again", self.run_id, problem)
        self.messages = extended(self.messages, {"role": "user", "content": REPAIR_PROMPT.format(problem=problem)})
        return None

    def _is_runaway(self, calls: list[ToolCall]) -> bool:
        """The runaway guard: the same batch of tool calls (names and inputs) `runaway_limit` times in a row.

        Batches compare as values (`==`: an input's key order is no difference, a list's order is), which
        costs a step far less than encoding each batch to compare its text."""
        batch = [(c.tool_name, c.input) for c in calls]
        if batch == self._last_batch:
            self._repeats += 1
        else:
            self._last_batch, self._repeats = batch, 1
        return self._repeats >= self.options.runaway_limit

    def _finish(self, reason: FinishReason, step_index: int, attempt: int) -> StreamFinish:
        self.finish_reason = reason
        return StreamFinish(step_index=step_index, attempt=attempt, finish_reason=reason, usage=self.usage,
                            total_usage=self.total_usage)

    # ------------------------------------------------------------ settle phase

    async def _settle(self, raw_calls: list[dict[str, Any]], approval_ids: dict[str, str]) -> AsyncIterator[StreamPart]:
        """Answer the unanswered calls of the last assistant message, before any new step."""
        calls = [ToolCall(c["tool_call_id"], c["tool_name"], c["input"]) for c in raw_calls]
        self.trace.start_step(self._next_index, "settle")
        await self._decider.decide(calls, settling=True, approval_ids=approval_ids)
        ran: list[ToolPhase] = []
        async for part in self._execute(calls, self._next_index, ran):
            yield part
        phase = ran[0]
        self.usage, self.total_usage = self.usage + phase.usage, self.total_usage + phase.usage
        step_index = self._next_index
        if phase.suspends:
            async for part in self._suspend(phase, step_index, 0):
                yield part
            self.trace.end_step()
            self._next_index = step_index + 1
            yield self._finish("suspended", step_index, 0)
            return
        self.messages = extended(self.messages, tool_message(phase.results))
        await self._save(step_index, "running")
        for result in phase.results:
            yield StreamToolResult.of(result, step_index=step_index, attempt=0)
        self.trace.end_step()
        self._next_index = step_index + 1

    # -------------------------------------------------------------- decisions

    # -------------------------------------------------------------- execution

    async def _execute(self, calls: list[ToolCall], step_index: int, ran: list[ToolPhase],
                       attempt: int = 0) -> AsyncIterator[StreamPart]:
        """Run the tool phase into `ran`. With tool sources, the phase runs in a task and the ``tool-progress``
        parts its calls report are yielded while it runs; without, it runs in place (nothing reports)."""
        if not self.options.mcp_servers:
            ran.append(await self._runner.execute(calls, step_index, attempt=attempt))
            return
        reported: asyncio.Queue[StreamToolProgress] = asyncio.Queue()
        phase = asyncio.ensure_future(self._runner.execute(calls, step_index, reported.put_nowait, attempt=attempt))
        next_part: asyncio.Future[StreamToolProgress] | None = None
        try:
            while not phase.done():
                next_part = asyncio.ensure_future(reported.get())
                await asyncio.wait((phase, next_part), return_when=asyncio.FIRST_COMPLETED)
                if next_part.done():
                    yield next_part.result()
                else:
                    next_part.cancel()  # before it takes a part: the drain below gets them all
            while not reported.empty():
                yield reported.get_nowait()
            ran.append(phase.result())
        finally:
            if next_part is not None:
                next_part.cancel()
            if not phase.done():  # the consumer left mid-phase: the calls stop with it
                phase.cancel()
                await asyncio.gather(phase, return_exceptions=True)

    # ------------------------------------------------------------- suspension

    async def _suspend(self, phase: ToolPhase, step_index: int, attempt: int) -> AsyncIterator[StreamPart]:
        requests = [self._signed(r) for r in phase.approvals]
        self.pending_approvals = tuple(requests)
        self.client_tool_calls = tuple(phase.client_calls)
        await self._save(step_index, "suspended", tuple(requests))
        for request in requests:
            yield StreamToolApprovalRequest.of(request, step_index=step_index, attempt=attempt)

    def _signed(self, request: ToolApprovalRequest) -> ToolApprovalRequest:
        signer = self.options.approval_signer
        if signer is None or request.agent_path != (self.options.agent_path or None) or request.token:
            return request  # a sub-agent's request was signed by the sub-agent, bound to its own run
        try:
            token = signer.sign(request, run_id=self.run_id)
        except Exception:  # signing is best-effort; an unsigned request is denied on resume
            self.log.exception("signing approval %s failed; the request goes out unsigned", request.approval_id)
            return request
        return ToolApprovalRequest(
            request.approval_id, request.tool_call_id, request.tool_name, request.input, request.agent_path, token
        )

    # ------------------------------------------------------------ checkpoints

    async def _save(
        self, step_index: int, status: RunStatus, pending: tuple[ToolApprovalRequest, ...] | None = None
    ) -> None:
        store = self.durability.checkpoints
        if self.run_id is None or store is None:
            return
        checkpoint = AgentCheckpoint(
            run_id=self.run_id,
            step_index=step_index,
            status=status,
            messages=self.messages,
            usage=self.total_usage,
            created_at=self.options.clock(),
            pending_approvals=pending,
            agent_path=self.options.agent_path or None,
            trace_context=self.trace.origin,
        )
        try:
            await maybe_await(store.save(checkpoint))
        except Exception as exc:  # durability must never kill a run...
            if is_control_error(exc):
                raise  # ...but a writer that lost its lease must stop at once
            self.log.exception("saving checkpoint %s failed; the run continues", checkpoint.step_id)
