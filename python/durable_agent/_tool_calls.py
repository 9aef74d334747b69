"""Tool calls: what the loop decides for each call of a step, and how the calls that run are run.

`ToolDecider` validates each call and decides its approval: it runs, it is refused (an error
result the model sees), it waits for a client-mode verdict, or it waits for a client tool's
result. `ToolRunner` runs the calls that run, in parallel up to `max_tool_concurrency`, each
a step of the run's `Durability` (on a journal, an unsafe call that started and never
finished comes back as interrupted), and collects a phase: the results in call order, or the
reasons the run suspends.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._checkpoint import NO_USAGE, ToolApprovalRequest, ToolApprovalResponse, Usage, check_verdict
from ._durability import Durability
from ._errors import ConfigurationError, is_control_error
from ._options import RunOptions
from ._signing import APPROVAL_TOKEN_DENIED_REASON
from ._storage.keys import RunKeys
from ._storage.records import StepRequest, apply_tool_state
from ._storage.scope import DEFER_DONE, StepContext
from ._tools import Tool, ToolResult
from ._util import maybe_await
from .stream_parts import StreamToolProgress
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
    them back without running again. `report_progress` streams a ``tool-progress`` part to
    the caller while the call runs (an MCP server's progress notifications come this way).
    `step_index` and `attempt` are the step's and its model call attempt's, the ones its stream parts carry.
    """

    options: RunOptions
    run_id: str | None
    tool_call_id: str
    tool_name: str
    staged: list[dict[str, Any]] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)
    progress_sink: Callable[[StreamToolProgress], None] | None = None
    step_index: int = 0
    attempt: int = 0
    durability: Durability = field(default_factory=Durability, repr=False)  # the run's (a sub-agent's store)

    def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Stream a `StreamToolProgress` part to the caller now (not stored: a replayed call reports nothing). Only a run with MCP servers
        (`mcp_servers=`) runs its tool phases apart from its stream; any other run drops the report."""
        if self.progress_sink is not None:
            self.progress_sink(StreamToolProgress(step_index=self.step_index, attempt=self.attempt,
                                                  tool_call_id=self.tool_call_id, tool_name=self.tool_name,
                                                  progress=progress, total=total, message=message))

    def report_usage(self, usage: Usage) -> None:
        """Count `usage` (a sub-agent's tokens) toward the run: it rides on this call's tool result."""
        self.usage.append(usage)

    @property
    def tool_state(self) -> dict[str, Any]:
        return self.durability.tool_state

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
class ToolCall:
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

    def denied(self, reason: str) -> dict[str, Any]:
        """The error result of a call whose approval was refused (or never given): ``denied`` marks it, so a UI can
        show a denial apart from a failure (the AI SDK's ``output-denied``)."""
        return {**self.outcome(reason, True), "denied": True}

    def as_part(self) -> dict[str, Any]:
        return {"type": "tool-call", "tool_call_id": self.tool_call_id, "tool_name": self.tool_name, "input": self.input}


@dataclass(slots=True)
class ToolPhase:
    """What a tool phase produced: the results in call order, or the reasons the run suspends."""

    results: list[dict[str, Any]] = field(default_factory=list)
    approvals: list[ToolApprovalRequest] = field(default_factory=list)
    client_calls: list[dict[str, Any]] = field(default_factory=list)
    child_suspended: bool = False  # a sub-agent suspended (maybe on a client tool, with no approvals)
    usage: Usage = NO_USAGE  # what sub-agents of the phase spent

    @property
    def suspends(self) -> bool:
        return bool(self.approvals or self.client_calls or self.child_suspended)


class ToolDecider:
    """Decides, for each tool call of a step (or of a settle phase), what happens to it."""

    def __init__(self, options: RunOptions, run_id: str | None) -> None:
        self.options = options
        self.run_id = run_id
        self._responses = {r.approval_id: r for r in options.approval_responses}

    async def decide(self, calls: list[ToolCall], *, settling: bool, approval_ids: dict[str, str] | None = None) -> None:
        """Validate each call and decide its approval, marking what runs, what is refused, what waits."""
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

    def _settle_verdict(self, call: ToolCall, approval_id: str) -> None:
        verdict = self._responses.get(approval_id)
        if verdict is None:
            call.result = call.denied(UNANSWERED_REASON)
        elif not verdict.approved:
            call.result = call.denied(verdict.reason or DENIED_REASON)
        elif not self._token_allows(verdict, call, approval_id):
            call.result = call.outcome(APPROVAL_TOKEN_DENIED_REASON, True)
        elif call.tool is not None and call.tool.is_client_tool:
            call.result = call.outcome(CLIENT_TOOL_PLACEHOLDER, True)

    def _token_allows(self, verdict: ToolApprovalResponse, call: ToolCall, approval_id: str) -> bool:
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

    async def _ask_approval(self, call: ToolCall, *, settling: bool) -> None:
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
                call.result = call.denied(UNANSWERED_REASON)
            else:
                call.approval = request
            return
        verdict = await maybe_await(approver(request))
        approved = verdict.approved if isinstance(verdict, ToolApprovalResponse) else check_verdict(verdict)
        if not approved:
            reason = verdict.reason if isinstance(verdict, ToolApprovalResponse) else None
            call.result = call.denied(reason or DENIED_REASON)

    def pending_of(self, calls: list[ToolCall]) -> ToolPhase:
        phase = ToolPhase()
        phase.approvals = [c.approval for c in calls if c.approval is not None]
        phase.client_calls = [c.as_part() for c in calls if c.client_pending]
        return phase


async def _each(runs: Iterable[Awaitable[dict[str, Any]]]) -> list[dict[str, Any] | BaseException]:
    """Await `runs` at once, each in its own task (its own copy of the context), outcomes or errors in order.

    A lone run is awaited as its task: what `asyncio.gather` adds for it (a gathering future and its
    callbacks) is most of a plain step's scheduling cost."""
    tasks = [asyncio.ensure_future(run) for run in runs]
    if len(tasks) != 1:
        return await asyncio.gather(*tasks, return_exceptions=True)
    try:
        return [await tasks[0]]
    except Exception as error:  # noqa: BLE001 - an outcome, as gather(return_exceptions=True) gives it
        return [error]


class ToolRunner:
    """Runs the calls a `ToolDecider` let through, and collects their phase."""

    def __init__(self, options: RunOptions, durability: Durability, run_id: str | None, trace: RunTrace,
                 log: RunLogger, check_abort: Callable[[], None]) -> None:
        self.options = options
        self.durability = durability
        self.run_id = run_id
        self.keys = RunKeys(run_id or "run")
        self.trace = trace
        self.log = log
        self.check_abort = check_abort
        self._progress: Callable[[StreamToolProgress], None] | None = None
        self._step_index = self._attempt = 0

    async def execute(self, calls: list[ToolCall], step_index: int,
                      progress: Callable[[StreamToolProgress], None] | None = None, *, attempt: int = 0) -> ToolPhase:
        """Run every call not decided yet, in parallel up to `max_tool_concurrency`; results in call order.

        `progress` receives the ``tool-progress`` parts the calls report while they run (placed at
        `step_index` and the model call's `attempt`)."""
        self._progress, self._step_index, self._attempt = progress, step_index, attempt
        self.check_abort()
        requests = [self._tool_request(c, step_index) if c.result is None else None for c in calls]
        runs = [r for r in requests if r is not None]
        await self.durability.begin(runs)  # on a journal: the unsafe calls' intents (and a deferred model answer)
        limit = self.options.max_tool_concurrency
        gate = asyncio.Semaphore(limit) if limit else None
        lone = len(runs) == 1

        async def run(call: ToolCall, request: StepRequest | None) -> dict[str, Any]:
            if request is None:
                assert call.result is not None
                return call.result
            if gate is None:
                return await self._run_tool(call, request, lone)
            async with gate:
                return await self._run_tool(call, request, lone)

        outcomes = await _each(run(c, r) for c, r in zip(calls, requests, strict=True))
        phase = ToolPhase()
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
        self.check_abort()
        return phase

    def _tool_request(self, call: ToolCall, step_index: int) -> StepRequest:
        assert call.tool is not None
        return StepRequest(self.keys.key(step_index, call.tool_call_id), "tool",
                           call.tool.replay, {"tool_name": call.tool_name, "tool_call_id": call.tool_call_id})

    async def _run_tool(self, call: ToolCall, request: StepRequest, lone: bool) -> dict[str, Any]:
        """Run one tool call: a step of the run's durability (on a journal, answered by its record when it has one).

        The done record of the batch's only call rides on the checkpoint commit that follows it
        (`StepLive.defer_done`): nothing acts on its result before that commit, which the loop
        makes before it hands the result on. In a batch of several, each done record is written
        as its call ends: a call still running must not hold back a finished sibling's result.
        """
        outcome = await self.durability.step(request, lambda context: self._execute_tool(call, context),
                                             DEFER_DONE if lone else None)
        if outcome.status == "interrupted":
            return call.outcome(TOOL_INTERRUPTED_MESSAGE, True)
        apply_tool_state(self.durability.tool_state, outcome.tool_state)
        return dict(outcome.value)

    async def _execute_tool(self, call: ToolCall, step: StepContext) -> dict[str, Any]:
        """Run the tool's own code as the step `step` (the tool-state ops it stages are the step's)."""
        assert call.tool is not None and call.tool.execute is not None
        context = ToolCallContext(self.options, self.run_id, call.tool_call_id, call.tool_name,
                                  progress_sink=self._progress, step_index=self._step_index,
                                  attempt=self._attempt, durability=self.durability)
        token = _current_call.set(context)
        try:
            with self.trace.tool(call.tool_name, call.tool_call_id) as span:
                try:
                    output = await maybe_await(call.tool.execute(call.parsed))
                    step.stage_tool_state(context.staged)  # committed with the done record, on a journal
                except Exception as exc:  # a failing tool is a result the model can react to
                    if is_control_error(exc):
                        raise
                    self.trace.tool_failed(span, exc)
                    self.log.info("tool %s (%s) failed: %r", call.tool_name, call.tool_call_id, exc)
                    return call.outcome(call.tool.error_text(exc), True)
        finally:
            _current_call.reset(token)
        if isinstance(output, ToolResult):
            result = call.outcome(output.output, output.is_error)
            if output.attachments:
                result["attachments"] = list(output.attachments)
        else:
            if hasattr(output, "model_dump"):
                output = output.model_dump(mode="json")
            result = call.outcome(output, False)
        if context.usage:
            result["usage"] = sum(context.usage, Usage()).to_dict()
        return result
