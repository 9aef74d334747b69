"""The agent loop core, shared by the buffered and the streaming faces.

`AgentLoop.parts()` is an async generator of stream parts (see `results`). `generate_text`
consumes it; `stream_chat` hands it to the caller. After it ends, the loop's attributes hold
the outcome (messages, steps, usage, finish reason, pending approvals).

A run goes step by step: a model call, then the tool calls it asked for. At every step
boundary a durable run saves an `AgentCheckpoint`; saving is best-effort (a failing store
is logged, the run goes on). When a tool needs a verdict from outside (client-mode approval)
or is a client tool, the run *suspends*: the assistant message is kept with its tool calls
unanswered, plus a ``tool-approval-request`` part for each gated call, and the checkpoint
says ``suspended``. The next call on that history *settles* the unanswered calls first.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._util import maybe_await
from .checkpoint import AgentCheckpoint, RunStatus, ToolApprovalRequest, ToolApprovalResponse, Usage, check_verdict
from .errors import (
    CheckpointNotFoundError,
    CheckpointVersionError,
    ConfigurationError,
    RunAbortedError,
    RunSuspendedError,
    is_control_error,
)
from .messages import History, Message, content_parts, extended
from .models import ModelRequest
from .runtime.keys import MODEL_CALL, step_key
from .runtime.records import apply_tool_state
from .runtime.records import StepRequest
from .runtime.scope import StepContext, StepLive
from .options import PrepareStepContext, RunOptions, StepOverrides, logger
from .results import FinishReason, Part, StepResult
from .signing import APPROVAL_TOKEN_DENIED_REASON
from .stop import StopContext
from .tools import Tool
from .tracing import RunLogger, RunTrace

DENIED_REASON = "The user denied this tool call."
UNANSWERED_REASON = "No verdict was given for this tool call, so it was denied."
CLIENT_TOOL_PLACEHOLDER = "No result provided for this client tool."
TOOL_INTERRUPTED_MESSAGE = (
    "This tool call was interrupted: the process running it stopped before it finished, so its effect may or "
    "may not have happened. It was not run again."
)


class SubAgentSuspended(Exception):
    """Control signal: a durable sub-agent suspended; its parent must suspend too. Never recorded."""

    durable_control = True

    def __init__(self, requests: Sequence[ToolApprovalRequest], usage: Usage | None = None) -> None:
        super().__init__("sub-agent suspended")
        self.requests = tuple(requests)
        self.usage = usage or Usage()  # what the child spent before suspending: the parent's too


@dataclass(frozen=True, slots=True)
class ToolCallContext:
    """What a running tool can learn about its call (`current_tool_call()`); sub-agents use it.

    `tool_state` is the session's tool state as this call sees it (read it, don't mutate it);
    `stage_tool_state(ops)` stages changes — ``{"op": "set", "key", "value"}`` or
    ``{"op": "delete", "key"}`` — that take effect only if the call finishes: on a durable
    runtime they commit atomically with the call's step record, and a replayed call brings
    them back without running again.
    """

    options: RunOptions
    run_id: str | None
    tool_call_id: str
    tool_name: str
    staged: list[dict[str, Any]] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)

    def report_usage(self, usage: Usage) -> None:
        """Count `usage` (a sub-agent's tokens) toward the run: it rides on this call's tool result."""
        self.usage.append(usage)

    @property
    def tool_state(self) -> dict[str, Any]:
        return self.options.tool_state

    def stage_tool_state(self, ops: Sequence[dict[str, Any]]) -> None:
        for op in ops:
            if op.get("op") not in ("set", "delete") or not isinstance(op.get("key"), str):
                raise ConfigurationError(f"a tool-state op is {{'op': 'set'|'delete', 'key': str, ...}}, not {op!r}")
        self.staged.extend(ops)


_current_call: contextvars.ContextVar[ToolCallContext] = contextvars.ContextVar("durable_agent_tool_call")


def current_tool_call() -> ToolCallContext | None:
    """The context of the tool call running now, or None outside a tool's `execute`."""
    return _current_call.get(None)


@dataclass(slots=True)
class _Call:
    """One tool call and what the loop decided to do with it."""

    tool_call_id: str
    tool_name: str
    input: Any
    tool: Tool | None = None
    parsed: Any = None
    result: dict[str, Any] | None = None  # decided already (error, denial, placeholder)
    approval: ToolApprovalRequest | None = None  # waits for a client-mode verdict
    client_pending: bool = False  # a client tool waiting for its result

    def outcome(self, output: Any, is_error: bool) -> dict[str, Any]:
        return {
            "type": "tool-result",
            "tool_call_id": self.tool_call_id,
            "tool_name": self.tool_name,
            "output": output,
            "is_error": is_error,
        }

    def as_part(self) -> dict[str, Any]:
        return {"type": "tool-call", "tool_call_id": self.tool_call_id, "tool_name": self.tool_name, "input": self.input}


@dataclass(slots=True)
class _Phase:
    """What a tool phase produced: the results in call order, or the reasons the run suspends."""

    results: list[dict[str, Any]] = field(default_factory=list)
    approvals: list[ToolApprovalRequest] = field(default_factory=list)
    client_calls: list[dict[str, Any]] = field(default_factory=list)
    child_suspended: bool = False  # a sub-agent suspended (maybe on a client tool, with no approvals)
    usage: Usage = field(default_factory=Usage)  # what sub-agents of the phase spent

    @property
    def suspends(self) -> bool:
        return bool(self.approvals or self.client_calls or self.child_suspended)


def tool_message(results: list[dict[str, Any]]) -> Message:
    return {"role": "tool", "content": results}  # type: ignore[typeddict-item]


def assistant_message(
    text: str, tool_calls: Sequence[dict[str, Any]], approvals: Sequence[ToolApprovalRequest] = (),
    reasoning: Sequence[dict[str, Any]] = (),
) -> Message:
    """The assistant message of a step: its reasoning parts, text, tool calls, and a marker per call awaiting a verdict."""
    content: list[Any] = [*reasoning, *([{"type": "text", "text": text}] if text else [])]
    content.extend({"type": "tool-call", **{k: c[k] for k in ("tool_call_id", "tool_name", "input")}}
                   for c in tool_calls)
    content.extend(
        {"type": "tool-approval-request", "approval_id": r.approval_id, "tool_call_id": r.tool_call_id}
        for r in approvals
    )
    return {"role": "assistant", "content": content}


def unresolved_calls(messages: Sequence[Message]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The tool calls of the last assistant message that no later tool message answers.

    Also returns the approval ids that message recorded, by tool call id.
    """
    for index in range(len(messages) - 1, -1, -1):
        if messages[index]["role"] == "assistant":
            break
    else:
        return [], {}
    if any(m["role"] != "tool" for m in messages[index + 1 :]):
        return [], {}  # the conversation moved on: nothing trails
    parts = content_parts(messages[index])
    answered = {
        p["tool_call_id"]
        for m in messages[index + 1 :]
        if m["role"] == "tool"
        for p in content_parts(m)
        if p["type"] == "tool-result"
    }
    calls = [dict(p) for p in parts if p["type"] == "tool-call" and p["tool_call_id"] not in answered]
    approvals = {p["tool_call_id"]: p["approval_id"] for p in parts if p["type"] == "tool-approval-request"}
    return calls, approvals


@dataclass(slots=True)
class _ModelTurn:
    """What one model call produced; its JSON form is the model step's stored result."""

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"
    reasoning: list[dict[str, Any]] = field(default_factory=list)  # reasoning parts, kept in the history

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "tool_calls": self.tool_calls, "usage": self.usage.to_dict(),
                "finish_reason": self.finish_reason, **({"reasoning": self.reasoning} if self.reasoning else {})}

    def replay(self, stored: dict[str, Any]) -> list[Part]:
        """Take a replayed model step's stored result; the parts a live call would have streamed."""
        self.text, self.tool_calls = stored["text"], list(stored["tool_calls"])
        self.usage, self.finish_reason = Usage.from_dict(stored["usage"]), stored["finish_reason"]
        self.reasoning = list(stored.get("reasoning", ()))
        text = [{"type": "text-delta", "text": self.text}] if self.text else []
        return [*text, *({"type": "tool-call", **c} for c in self.tool_calls)]


async def _drain(parts: asyncio.Queue[Part], step: Any, turn: _ModelTurn) -> AsyncIterator[Part]:
    """Yield the parts a journaled model step streams while it runs; for a replayed step, its stored ones."""
    task = asyncio.ensure_future(step)
    try:
        while not task.done() or not parts.empty():
            if not parts.empty():
                yield parts.get_nowait()
                continue
            getter = asyncio.ensure_future(parts.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
        outcome = task.result()
    finally:
        if not task.done():
            task.cancel()
    if outcome.status != "completed":
        raise RuntimeError("a model step cannot be interrupted: it is always safe to run again")
    if outcome.replayed:
        for part in turn.replay(outcome.value):
            yield part


def approval_part(request: ToolApprovalRequest) -> Part:
    """The ``tool-approval-request`` stream part of a request (every field present, None when unset)."""
    return {
        "type": "tool-approval-request",
        "approval_id": request.approval_id,
        "tool_call_id": request.tool_call_id,
        "tool_name": request.tool_name,
        "input": request.input,
        "agent_path": request.agent_path,
        "token": request.token,
    }


class AgentLoop:
    """One call of the loop. Create, iterate `parts()` once, then read the outcome attributes."""

    def __init__(
        self,
        options: RunOptions,
        messages: Sequence[Message] | None,
        *,
        resume_run_id: str | None = None,
    ) -> None:
        if messages is None and resume_run_id is None:
            raise ConfigurationError("messages are required")
        self.options = options
        self._resume = resume_run_id is not None
        self.run_id: str | None = resume_run_id
        if self.run_id is None and options.durable:
            assert options.session is not None
            self.run_id = options.session.run_id or options.generate_id()
        self.messages: list[Message] = History(messages or [])
        self.steps: list[StepResult] = []
        self.usage = Usage()
        self.total_usage = Usage()
        self.finish_reason: FinishReason | None = None
        self.pending_approvals: tuple[ToolApprovalRequest, ...] = ()
        self.client_tool_calls: tuple[dict[str, Any], ...] = ()
        self.error: BaseException | None = None
        self.finished: asyncio.Event | None = None
        self._next_index = 0
        self._recent_batches: list[str] = []
        self._responses = {r.approval_id: r for r in options.approval_responses}
        self.trace = RunTrace()
        self.log = RunLogger(logger, lambda: (self.run_id, self._next_index, getattr(options.scope, "session_id", None)))

    # ----------------------------------------------------------------- driving

    async def parts(self) -> AsyncIterator[Part]:
        """Run the loop, yielding stream parts. Failures become one final ``error`` part."""
        self.finished = asyncio.Event()
        self.trace.start_run(self.run_id, self.options.model.model_id, self.options.agent_path)
        try:
            async for part in self._drive():
                yield part
        except Exception as exc:  # noqa: BLE001 - every failure is reported as an error part
            self.error = exc
            self.log.debug("run %s failed: %r", self.run_id, exc)
            yield {"type": "error", "error": exc}
        finally:
            self.trace.end_run(self.run_id, self.finish_reason, self.usage, self.total_usage, self.error)
            self.finished.set()

    async def _drive(self) -> AsyncIterator[Part]:
        await self._start_from_store()
        calls, approval_ids = unresolved_calls(self.messages)
        if calls:
            async for part in self._settle(calls, approval_ids):
                yield part
            if self.finish_reason is not None:
                return
        while self.finish_reason is None:
            async for part in self._step():
                yield part

    async def _start_from_store(self) -> None:
        if self.run_id is None or self.options.session is None:
            return
        store = self.options.session.store
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
            except Exception:  # noqa: BLE001 - a fresh run must not die of an unreadable old one
                self.log.exception("could not load the stored checkpoint of run %s; starting its counters at 0", self.run_id)
                checkpoint = None
        if checkpoint is not None:
            checkpoint.refuse_newer()
            self._next_index = checkpoint.step_index + 1
            self.total_usage = checkpoint.usage
        self.trace.run_loaded(self.run_id, getattr(self.options.scope, "session_id", None), checkpoint)

    def _check_abort(self) -> None:
        signal = self.options.signal
        if signal is not None and signal.is_set():
            raise RunAbortedError(self.run_id)
        suspend = self.options.suspend_signal
        if suspend is not None and suspend.is_set():
            raise RunSuspendedError()

    # ------------------------------------------------------------------ steps

    async def _step(self) -> AsyncIterator[Part]:
        self._check_abort()
        step_index = self._next_index
        self.trace.start_step(step_index, "model")
        overrides = await self._prepare(step_index)
        model = overrides.model or self.options.model
        yield {"type": "step-start", "step_index": step_index}
        request = ModelRequest(
            messages=tuple(overrides.messages if overrides.messages is not None else self.messages),
            tools=tuple(
                tool.spec(name)
                for name, tool in self.options.tools.items()
                if overrides.active_tools is None or name in overrides.active_tools
            ),
        )
        turn = _ModelTurn()
        async for part in self._call_model(model, request, step_index, turn):
            yield part
        self._check_abort()
        usage, model_finish, text = turn.usage, turn.finish_reason, turn.text
        calls = [_Call(c["tool_call_id"], c["tool_name"], c["input"]) for c in turn.tool_calls]
        self.usage, self.total_usage = self.usage + usage, self.total_usage + usage

        phase = _Phase()
        if calls:
            await self._decide(calls, settling=False)
            phase = self._pending_of(calls)
        assistant = assistant_message(text, [c.as_part() for c in calls], phase.approvals, turn.reasoning)
        self.messages = extended(self.messages, assistant)
        if calls and not phase.suspends:
            phase = await self._execute(calls)
            self.usage, self.total_usage = self.usage + phase.usage, self.total_usage + phase.usage
            if not phase.suspends:
                self.messages = extended(self.messages, tool_message(phase.results))
                for result in phase.results:
                    yield result
        if phase.suspends:
            async for part in self._suspend(phase, step_index):
                yield part
        self.steps.append(
            StepResult(step_index, text, tuple(c.as_part() for c in calls), tuple(phase.results), usage, model_finish)
        )
        finish = self._finish_reason_after(calls, model_finish, phase)
        if not phase.suspends:
            await self._save(step_index, "completed" if finish else "running")
        self.trace.end_step()
        yield {"type": "step-finish", "step_index": step_index, "usage": usage, "finish_reason": model_finish}
        self._next_index = step_index + 1
        if finish is not None:
            yield self._finish(finish)

    async def _call_model(
        self, model: Any, request: ModelRequest, step_index: int, turn: _ModelTurn
    ) -> AsyncIterator[Part]:
        """Stream one model call into `turn`, through the run scope's journal when there is one."""
        scope = self.options.scope
        self.trace.start_model(model.model_id)
        if scope is None:
            async for part in self._stream_model(model, request, turn, None):
                yield part
            self.trace.end_model(turn.usage, turn.finish_reason)
            return
        parts: asyncio.Queue[Part] = asyncio.Queue()
        called = []

        async def live(context: StepContext) -> dict[str, Any]:
            called.append(True)
            async for part in self._stream_model(model, request, turn, context):
                parts.put_nowait(part)
            return turn.to_json()

        step_request = StepRequest(step_key(self.run_id or "run", step_index, MODEL_CALL), "model", "safe",
                                   {"model": model.model_id})
        deferred = StepLive(defer_done=True)  # its done record rides on the next write (scope docs)
        async for part in _drain(parts, scope.step(step_request, live, deferred), turn):
            yield part
        self.trace.end_model(turn.usage, turn.finish_reason, replayed=not called)

    async def _stream_model(self, model: Any, request: ModelRequest, turn: _ModelTurn, context: Any) -> AsyncIterator[Part]:
        async for event in model.stream(request):
            self._check_abort()
            if event["type"] == "text-delta":
                turn.text += event["text"]
                if context is not None and context.on_progress is not None:
                    await context.on_progress({"type": "text", "delta": event["text"]})
                yield {"type": "text-delta", "text": event["text"]}
            elif event["type"] == "tool-call":
                call = {"tool_call_id": event["tool_call_id"], "tool_name": event["tool_name"], "input": event["input"]}
                turn.tool_calls.append(call)
                yield {"type": "tool-call", **call}
            elif event["type"] == "finish":
                turn.usage, turn.finish_reason = event["usage"], event["finish_reason"]
            elif event["type"] == "reasoning":
                turn.reasoning.append({"type": "reasoning", **{k: event[k] for k in ("text", "provider", "metadata")}})

    async def _prepare(self, step_index: int) -> StepOverrides:
        if self.options.prepare_step is None:
            return StepOverrides()
        context = PrepareStepContext(step_index, len(self.steps), tuple(self.messages), self.total_usage, self.usage)
        overrides = await maybe_await(self.options.prepare_step(context))
        if overrides is None:
            return StepOverrides()
        if not isinstance(overrides, StepOverrides):
            raise ConfigurationError("prepare_step must return a StepOverrides or None")
        return overrides

    def _finish_reason_after(self, calls: list[_Call], model_finish: str, phase: _Phase) -> FinishReason | None:
        if phase.suspends:
            return "suspended"
        if not calls:
            return "length" if model_finish == "length" else "stop"
        if len(self.steps) >= self.options.max_steps:
            return "max-steps"
        context = StopContext(len(self.steps), self.total_usage, self.usage, self.options.model.model_id)
        if any(condition(context) for condition in self.options.stop_when):
            return "stop-condition"
        if self._is_runaway(calls):
            self.log.warning("run %s repeated the same tool calls %d times; stopping it", self.run_id, self.options.runaway_limit)
            return "runaway"
        return None

    def _is_runaway(self, calls: list[_Call]) -> bool:
        """The runaway guard: the same batch of tool calls (names and inputs) `runaway_limit` times in a row."""
        from ._kernels import kernels

        try:
            signature = kernels.encode([[c.tool_name, c.input] for c in calls])
        except ValueError:
            signature = repr([[c.tool_name, c.input] for c in calls])
        self._recent_batches = [*self._recent_batches[-(self.options.runaway_limit - 1) :], signature]
        return len(self._recent_batches) >= self.options.runaway_limit and len(set(self._recent_batches)) == 1

    def _finish(self, reason: FinishReason) -> Part:
        self.finish_reason = reason
        return {"type": "finish", "finish_reason": reason, "usage": self.usage, "total_usage": self.total_usage}

    # ------------------------------------------------------------ settle phase

    async def _settle(self, raw_calls: list[dict[str, Any]], approval_ids: dict[str, str]) -> AsyncIterator[Part]:
        """Answer the unanswered calls of the last assistant message, before any new step."""
        calls = [_Call(c["tool_call_id"], c["tool_name"], c["input"]) for c in raw_calls]
        self.trace.start_step(self._next_index, "settle")
        await self._decide(calls, settling=True, approval_ids=approval_ids)
        phase = await self._execute(calls)
        self.usage, self.total_usage = self.usage + phase.usage, self.total_usage + phase.usage
        step_index = self._next_index
        if phase.suspends:
            async for part in self._suspend(phase, step_index):
                yield part
            self.trace.end_step()
            self._next_index = step_index + 1
            yield self._finish("suspended")
            return
        self.messages = extended(self.messages, tool_message(phase.results))
        for result in phase.results:
            yield result
        await self._save(step_index, "running")
        self.trace.end_step()
        self._next_index = step_index + 1

    # -------------------------------------------------------------- decisions

    async def _decide(self, calls: list[_Call], *, settling: bool, approval_ids: dict[str, str] | None = None) -> None:
        """Validate each call and settle its approval, marking what runs, what is refused, what waits."""
        for call in calls:
            tool = self.options.tools.get(call.tool_name)
            if tool is None:
                available = ", ".join(sorted(self.options.tools)) or "none"
                call.result = call.outcome(f"Unknown tool {call.tool_name!r}. Available tools: {available}.", True)
                continue
            call.tool = tool
            call.parsed, problem = tool.parse_input(call.input)
            if problem is not None:
                call.result = call.outcome(problem, True)
                continue
            approval_id = (approval_ids or {}).get(call.tool_call_id)
            if settling and approval_id is not None:
                self._settle_verdict(call, approval_id)
            elif tool.is_client_tool:
                if settling:
                    call.result = call.outcome(CLIENT_TOOL_PLACEHOLDER, True)
                else:
                    call.client_pending = True
            elif await tool.requires_approval(call.input):
                await self._ask_approval(call, settling=settling)

    def _settle_verdict(self, call: _Call, approval_id: str) -> None:
        verdict = self._responses.get(approval_id)
        if verdict is None:
            call.result = call.outcome(UNANSWERED_REASON, True)
        elif not verdict.approved:
            call.result = call.outcome(verdict.reason or DENIED_REASON, True)
        elif not self._token_allows(verdict, call, approval_id):
            call.result = call.outcome(APPROVAL_TOKEN_DENIED_REASON, True)
        elif call.tool is not None and call.tool.is_client_tool:
            call.result = call.outcome(CLIENT_TOOL_PLACEHOLDER, True)

    def _token_allows(self, verdict: ToolApprovalResponse, call: _Call, approval_id: str) -> bool:
        signer = self.options.approval_signer
        if signer is None:
            return True
        return bool(
            signer.check_approval(
                verdict.token,
                approval_id=approval_id,
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                input=call.input,
                run_id=self.run_id,
                max_age_ms=self.options.approval_max_age_ms,
            )
        )

    async def _ask_approval(self, call: _Call, *, settling: bool) -> None:
        approver = self.options.approve_tool_call
        request = ToolApprovalRequest(
            approval_id=self.options.generate_id(),
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            input=call.input,
            agent_path=self.options.agent_path or None,
        )
        if approver is None:
            if settling:
                call.result = call.outcome(UNANSWERED_REASON, True)
            else:
                call.approval = request
            return
        verdict = await maybe_await(approver(request))
        approved = verdict.approved if isinstance(verdict, ToolApprovalResponse) else check_verdict(verdict)
        if not approved:
            reason = verdict.reason if isinstance(verdict, ToolApprovalResponse) else None
            call.result = call.outcome(reason or DENIED_REASON, True)

    def _pending_of(self, calls: list[_Call]) -> _Phase:
        phase = _Phase()
        phase.approvals = [c.approval for c in calls if c.approval is not None]
        phase.client_calls = [c.as_part() for c in calls if c.client_pending]
        return phase

    # -------------------------------------------------------------- execution

    async def _execute(self, calls: list[_Call]) -> _Phase:
        """Run every call not decided yet, in parallel up to `max_tool_concurrency`; results in call order."""
        self._check_abort()
        await self._begin_tools(calls)
        limit = self.options.max_tool_concurrency
        gate = asyncio.Semaphore(limit) if limit else None

        async def run(call: _Call) -> dict[str, Any]:
            if call.result is not None:
                return call.result
            if gate is None:
                return await self._run_tool(call)
            async with gate:
                return await self._run_tool(call)

        outcomes = await asyncio.gather(*(run(c) for c in calls), return_exceptions=True)
        phase = _Phase()
        for outcome in outcomes:
            if isinstance(outcome, SubAgentSuspended):
                phase.approvals.extend(outcome.requests)
                phase.child_suspended = True
                phase.usage += outcome.usage
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                phase.results.append(outcome)
                if "usage" in outcome:
                    phase.usage += Usage.from_dict(outcome["usage"])
        if phase.child_suspended:
            phase.results = []  # a suspended batch writes no tool message; siblings re-run on resume
            phase.client_calls = []
        self._check_abort()
        return phase

    async def _begin_tools(self, calls: list[_Call]) -> None:
        """On a journal: the unsafe calls' intents (and the deferred model answer) durable in one write."""
        scope = self.options.scope
        if scope is not None:
            await scope.begin([self._tool_request(c) for c in calls if c.result is None and c.tool is not None])

    def _tool_request(self, call: _Call) -> StepRequest:
        assert call.tool is not None
        return StepRequest(step_key(self.run_id or "run", self._next_index, call.tool_call_id), "tool",
                           call.tool.replay, {"tool_name": call.tool_name, "tool_call_id": call.tool_call_id})

    async def _run_tool(self, call: _Call) -> dict[str, Any]:
        """Run one tool call, through the run scope's journal when there is one."""
        assert call.tool is not None
        scope = self.options.scope
        if scope is None:
            return await self._execute_tool(call)
        outcome = await scope.step(self._tool_request(call), lambda context: self._execute_tool(call, context))
        if outcome.status == "interrupted":
            return call.outcome(TOOL_INTERRUPTED_MESSAGE, True)
        apply_tool_state(self.options.tool_state, outcome.tool_state)
        return dict(outcome.value)

    async def _execute_tool(self, call: _Call, step: Any = None) -> dict[str, Any]:
        """Run the tool's own code. `step` is the journal's step context, when the call is journaled."""
        assert call.tool is not None and call.tool.execute is not None
        context = ToolCallContext(self.options, self.run_id, call.tool_call_id, call.tool_name)
        token = _current_call.set(context)
        try:
            with self.trace.tool(call.tool_name, call.tool_call_id) as span:
                try:
                    output = await maybe_await(call.tool.execute(call.parsed))
                    if step is not None:
                        step.stage_tool_state(context.staged)  # committed with the done record
                    else:
                        apply_tool_state(self.options.tool_state, context.staged)
                except Exception as exc:  # noqa: BLE001 - a failing tool is a result the model can react to
                    if is_control_error(exc):
                        raise
                    self.trace.tool_failed(span, exc)
                    self.log.info("tool %s (%s) failed: %r", call.tool_name, call.tool_call_id, exc)
                    return call.outcome(f"{type(exc).__name__}: {exc}", True)
        finally:
            _current_call.reset(token)
        if hasattr(output, "model_dump"):
            output = output.model_dump(mode="json")
        result = call.outcome(output, False)
        if context.usage:
            result["usage"] = sum(context.usage, Usage()).to_dict()
        return result

    # ------------------------------------------------------------- suspension

    async def _suspend(self, phase: _Phase, step_index: int) -> AsyncIterator[Part]:
        requests = [self._signed(r) for r in phase.approvals]
        self.pending_approvals = tuple(requests)
        self.client_tool_calls = tuple(phase.client_calls)
        await self._save(step_index, "suspended", tuple(requests))
        for request in requests:
            yield approval_part(request)

    def _signed(self, request: ToolApprovalRequest) -> ToolApprovalRequest:
        signer = self.options.approval_signer
        if signer is None or request.agent_path != (self.options.agent_path or None) or request.token:
            return request  # a sub-agent's request was signed by the sub-agent, bound to its own run
        try:
            token = signer.sign(request, run_id=self.run_id)
        except Exception:  # noqa: BLE001 - signing is best-effort; an unsigned request is denied on resume
            self.log.exception("signing approval %s failed; the request goes out unsigned", request.approval_id)
            return request
        return ToolApprovalRequest(
            request.approval_id, request.tool_call_id, request.tool_name, request.input, request.agent_path, token
        )

    # ------------------------------------------------------------ checkpoints

    async def _save(
        self, step_index: int, status: RunStatus, pending: tuple[ToolApprovalRequest, ...] | None = None
    ) -> None:
        if self.run_id is None or self.options.session is None:
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
        )
        try:
            await maybe_await(self.options.session.store.save(checkpoint))
        except Exception as exc:  # noqa: BLE001 - durability must never kill a run...
            if is_control_error(exc):
                raise  # ...but a writer that lost its lease must stop at once
            self.log.exception("saving checkpoint %s failed; the run continues", checkpoint.step_id)
