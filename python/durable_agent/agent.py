"""`Agent`: a conversation (a session of runs) on a durable runtime, with `run`, `resume` and `suspend`.

Each `run(prompt)` is one run of the session: its model calls and tool calls are steps
journaled by the runtime, so a run a process death interrupted continues where it was:
the finished model call is not requested again, finished tools do not run again, and an
``unsafe`` tool that started and never finished is reported to the model as interrupted.

A run holds its session's lease for as long as it goes (renewed in the background); every
write it makes is fenced by the lease epoch, so a process that lost the lease stops with
`StaleEpochError` instead of interleaving with the new owner.

Without `durable`, the agent keeps its history in memory and nothing survives the process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Unpack

from ._util import maybe_await
from .checkpoint import AgentCheckpoint, ToolApprovalRequest, ToolApprovalResponse, Usage
from .errors import ConfigurationError, RunLeaseHeldError, RunSuspendedError
from .generate import _consume, generate_text
from .loop import TOOL_INTERRUPTED_MESSAGE, AgentLoop, assistant_message, tool_message, unresolved_calls
from .messages import Message
from .models import LanguageModel
from ._util import wall_clock_ms
from .options import CallOptions, RunOptions, logger, random_id
from .results import GenerateTextResult
from .runtime.keys import MODEL_CALL, step_key
from .runtime.protocols import DurableRuntime
from .runtime.records import StepRecord
from .session import Session
from .tools import Tool


@dataclass(frozen=True, slots=True)
class DurableOptions:
    """The runtime every run of an agent goes through, and what `run()` does with an interrupted run.

    ``on_interrupted="heal"`` (default): `run()` answers the interrupted run's open tool
    calls as interrupted and starts the new run (call `resume()` first to continue it
    instead). ``"resume"``: `run()` first continues the interrupted run when its process is
    gone, then runs the prompt unless the resumed run suspended.
    `stale_after_ms`: a lease not renewed for this long counts as lapsed.
    """

    runtime: DurableRuntime
    on_interrupted: Literal["heal", "resume"] = "heal"
    stale_after_ms: int = 30_000

    def __post_init__(self) -> None:
        if self.on_interrupted not in ("heal", "resume"):
            raise ConfigurationError("on_interrupted must be 'heal' or 'resume'")
        if type(self.stale_after_ms) is not int or self.stale_after_ms <= 0:
            raise ConfigurationError("stale_after_ms must be a positive int")


def healed_history(checkpoint: AgentCheckpoint, records: Sequence[StepRecord]) -> list[Message] | None:
    """The history of an interrupted run with its step in flight closed from its records; None if nothing changes."""
    messages = list(checkpoint.messages)
    turn = checkpoint.step_index + 1
    done = {r.key: r.result for r in records if r.status == "done"}
    model_answer = done.get(step_key(checkpoint.run_id, turn, MODEL_CALL))
    if model_answer is not None:
        messages.append(assistant_message(model_answer["text"], model_answer["tool_calls"]))
    calls, _ = unresolved_calls(messages)
    if not calls and model_answer is None:
        return None
    if calls:
        answers = [
            done.get(step_key(checkpoint.run_id, turn, c["tool_call_id"]))
            or {"type": "tool-result", "tool_call_id": c["tool_call_id"], "tool_name": c["tool_name"],
                "output": TOOL_INTERRUPTED_MESSAGE, "is_error": True}
            for c in calls
        ]
        messages.append(tool_message(answers))
    return messages


def approval_key(run_id: str, step_index: int, approval_id: str) -> str:
    """The step key of the awakeable a suspended run parks on for one approval."""
    return step_key(run_id, step_index, f"approval/{approval_id}")


async def resolve_approval(runtime: Any, approval_id: str, *, approved: bool, reason: str | None = None,
                           token: str | None = None) -> bool:
    """Send a verdict to a run parked on an approval, from any process; the next `Agent.resume()` settles it.

    Returns False when no run waits on `approval_id`. With a signer on the agent, an approval
    still needs the request's `token` (it is verified when the run resumes).
    """
    return bool(await runtime.resolve_awakeable(approval_id, {"approved": approved, "reason": reason, "token": token}))


class Agent:
    """A model, its tools and a session: `await agent.run(prompt)`, `await agent.resume()`, `agent.suspend()`."""

    def __init__(  # type: ignore[misc]  # `tools` is a named parameter here, not one of **options
        self,
        *,
        model: LanguageModel,
        tools: dict[str, Tool] | None = None,
        durable: DurableOptions | None = None,
        session_id: str | None = None,
        system: str | None = None,
        **options: Unpack[CallOptions],
    ) -> None:
        if durable is not None and not session_id:
            raise ConfigurationError("a durable Agent needs a session_id")
        if durable is not None and not isinstance(durable, DurableOptions):
            raise ConfigurationError("durable must be a DurableOptions(runtime, ...)")
        self.model = model
        self.tools = dict(tools or {})
        self.durable = durable
        self.session_id = session_id
        self.system = system
        self._options: dict[str, Any] = dict(options)
        RunOptions.build(model, None, {"tools": self.tools, **self._options})  # fail early on bad options
        self.history: list[Message] = [{"role": "system", "content": system}] if system else []
        self._durable = _DurableSession(self, durable, session_id) if durable is not None and session_id else None

    # ------------------------------------------------------------------ public

    def suspend(self) -> None:
        """Stop the run in progress at its next step boundary check; it stays resumable (`RunSuspendedError`)."""
        if self._durable is not None:
            self._durable.suspend()

    async def run(self, prompt: str) -> GenerateTextResult:
        """Run `prompt` as the session's next run and return its outcome."""
        if self._durable is None:
            result = await generate_text(model=self.model, tools=self.tools,
                                         messages=[*self.history, {"role": "user", "content": prompt}],
                                         **self._options)
            self.history = list(result.messages)
            return result
        return await self._durable.run(prompt)

    async def resume(
        self, *, run_id: str | None = None, approval_responses: Sequence[ToolApprovalResponse] = ()
    ) -> GenerateTextResult | None:
        """Continue the session's unfinished run (or `run_id`); None when there is nothing to continue.

        A run suspended on approvals is settled from `approval_responses`.
        """
        if self._durable is None:
            return None
        return await self._durable.resume(run_id, approval_responses)


class _DurableSession:
    """The durable half of an `Agent`: one session on one runtime (leases, runs, healing, parking)."""

    def __init__(self, agent: Agent, durable: DurableOptions, session_id: str) -> None:
        self._agent = agent
        self.durable = durable
        self.runtime = durable.runtime
        self.session_id = session_id
        self._options = agent._options
        self._suspend: asyncio.Event | None = None  # created inside the running loop of each run

    def suspend(self) -> None:
        if self._suspend is not None:
            self._suspend.set()

    async def run(self, prompt: str) -> GenerateTextResult:
        listed = await self.runtime.lease.resumable(session_id=self.session_id, stale_at=self._stale_at())
        epoch = await self._claim()
        try:
            interrupted = await self._interrupted_run()
            if interrupted is not None and self.durable.on_interrupted == "resume" and any(
                r.run_id == interrupted for r in listed
            ):
                resumed = await self._drive(interrupted, epoch, ())
                if resumed.finish_reason == "suspended":
                    return resumed
            elif interrupted is not None:
                await self._heal(interrupted, epoch)
            history = await self._session_history()
            run_id = self._generate_id()
            runtime = self.runtime
            await runtime.stores.runs.set_last(self.session_id, run_id, epoch)
            await runtime.lease.mark_resumable(self.session_id, run_id, epoch)
            start = AgentCheckpoint(run_id=run_id, step_index=0, status="running", usage=Usage(),
                                    messages=[*history, {"role": "user", "content": prompt}], created_at=self._now())
            await maybe_await(runtime.stores.session.save(start))
            return await self._drive(run_id, epoch, ())
        finally:
            await self._release(epoch)

    async def resume(
        self, run_id: str | None, approval_responses: Sequence[ToolApprovalResponse]
    ) -> GenerateTextResult | None:
        epoch = await self._claim()
        try:
            target = run_id or await self._interrupted_run() or await self._suspended_last_run()
            if target is None:
                return None
            given = {r.approval_id for r in approval_responses}
            sent = [v for v in await self._verdicts_from_awakeables(target) if v.approval_id not in given]
            return await self._drive(target, epoch, [*approval_responses, *sent])
        finally:
            await self._release(epoch)


    # ----------------------------------------------------------------- driving

    async def _drive(self, run_id: str, epoch: int, responses: Sequence[ToolApprovalResponse]) -> GenerateTextResult:
        assert self.durable is not None and self.session_id is not None
        runtime = self.runtime
        self._suspend = asyncio.Event()
        scope = await runtime.open_run(session_id=self.session_id, run_id=run_id, epoch=epoch)
        renewer = asyncio.ensure_future(self._renew(epoch))
        try:
            await self._join_partials(scope, run_id)
            options = {**self._options, "approval_responses": list(responses)} if responses else self._options
            tool_state = dict(await runtime.stores.tool_state(self.session_id).all())
            run_options = RunOptions.build(self._agent.model, Session(runtime.stores.session, run_id),
                                           {"tools": self._agent.tools, **options},
                                           scope=scope, suspend_signal=self._suspend, tool_state=tool_state)
            result = await _consume(AgentLoop(run_options, None, resume_run_id=run_id))
            if result.finish_reason == "suspended":
                await self._park_on_approvals(scope, run_id, result.pending_approvals)
        except RunSuspendedError:
            logger.info("run %s suspended; it stays resumable", run_id)
            raise
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            await scope.close()
        await runtime.lease.mark_resumable(self.session_id, None, epoch)
        return result

    async def _park_on_approvals(self, scope: Any, run_id: str, requests: Sequence[ToolApprovalRequest]) -> None:
        """Open one awakeable per pending approval, with the approval id as its id, for `resolve_approval`."""
        checkpoint = await maybe_await(self.runtime.stores.session.load(run_id))
        for request in requests:
            await scope.awakeable(approval_key(run_id, checkpoint.step_index, request.approval_id),
                                  awakeable_id=request.approval_id)

    async def _verdicts_from_awakeables(self, run_id: str) -> list[ToolApprovalResponse]:
        """The verdicts other processes sent (`resolve_approval`) for the pending approvals of `run_id`."""
        runtime = self.runtime
        checkpoint = await maybe_await(runtime.stores.session.load(run_id))
        if checkpoint is None or checkpoint.status != "suspended":
            return []
        verdicts = []
        for request in checkpoint.pending_approvals or ():
            record = await runtime.find_awakeable(self.session_id,
                                                  approval_key(run_id, checkpoint.step_index, request.approval_id))
            if record is not None and record.resolved and isinstance(record.value, dict):
                value = record.value
                verdicts.append(ToolApprovalResponse(request.approval_id, value.get("approved") is True,
                                                     reason=value.get("reason"), token=value.get("token")))
        return verdicts

    async def _join_partials(self, scope: Any, run_id: str) -> None:
        """Turn the text a crashed model step had streamed into an aborted assistant turn of the history."""
        store = self.runtime.stores.session
        checkpoint = await maybe_await(store.load(run_id))
        if checkpoint is None:
            return
        key = step_key(run_id, checkpoint.step_index + 1, MODEL_CALL)
        partials = [p for p in await scope.stored_partials() if p.step_key == key]
        if not partials or any(r.key == key and r.status == "done" for r in await scope.stored_steps()):
            return
        text = "".join(p.text for p in sorted(partials, key=lambda p: p.seq))
        aborted: Message = {"role": "assistant", "content": [{"type": "text", "text": text}]}
        await maybe_await(store.save(AgentCheckpoint(
            run_id=run_id, step_index=checkpoint.step_index + 1, status="running", usage=checkpoint.usage,
            messages=[*checkpoint.messages, aborted], created_at=self._now(),
        )))

    async def _heal(self, run_id: str, epoch: int) -> None:
        """Close an interrupted run without running anything: finish its step in flight from its records.

        The model answer of that step (if its call finished) joins the history; each of its
        tool calls gets its recorded result, or an interrupted marker when it never finished.
        """
        runtime = self.runtime
        store = runtime.stores.session
        checkpoint = await maybe_await(store.load(run_id))
        if checkpoint is not None:
            scope = await runtime.open_run(session_id=self.session_id, run_id=run_id, epoch=epoch)
            try:
                healed = healed_history(checkpoint, await scope.stored_steps())
            finally:
                await scope.close()
            if healed is not None:
                await maybe_await(store.save(AgentCheckpoint(
                    run_id=run_id, step_index=checkpoint.step_index + 1, status="completed", usage=checkpoint.usage,
                    messages=healed, created_at=self._now(),
                )))
        await runtime.lease.mark_resumable(self.session_id, None, epoch)

    # ------------------------------------------------------------ bookkeeping

    async def _session_history(self) -> list[Message]:
        runtime = self.runtime
        last = await runtime.stores.runs.last(self.session_id)
        checkpoint = await maybe_await(runtime.stores.session.load(last)) if last else None
        if checkpoint is not None:
            return list(checkpoint.messages)
        return list(self._agent.history)

    async def _interrupted_run(self) -> str | None:
        """The session's run still marked in progress: a process died (or suspended) while running it."""
        return await self.runtime.lease.marked_run(self.session_id)  

    async def _suspended_last_run(self) -> str | None:
        runtime = self.runtime
        last = await runtime.stores.runs.last(self.session_id)
        checkpoint = await maybe_await(runtime.stores.session.load(last)) if last else None
        return last if checkpoint is not None and checkpoint.status == "suspended" else None

    async def _claim(self) -> int:
        assert self.durable is not None and self.session_id is not None
        lease = self.runtime.lease
        claim = await lease.claim(self.session_id, stale_at=self._stale_at())
        if not claim.claimed:
            raise RunLeaseHeldError(self.session_id, claim.owner)
        assert claim.epoch is not None
        return claim.epoch

    async def _release(self, epoch: int) -> None:
        with contextlib.suppress(Exception):
            await self.runtime.lease.release(self.session_id, epoch)

    async def _renew(self, epoch: int) -> None:
        interval = self.durable.stale_after_ms / 3000
        while True:
            await asyncio.sleep(interval)
            if not await self.runtime.lease.renew(self.session_id, epoch):
                return  # lost: the next fenced write raises StaleEpochError and stops the run

    def _stale_at(self) -> int:
        return self._now() - self.durable.stale_after_ms

    def _now(self) -> int:
        clock = self._options.get("clock") or wall_clock_ms
        return int(clock())

    def _generate_id(self) -> str:
        generate = self._options.get("generate_id") or random_id
        return str(generate())
