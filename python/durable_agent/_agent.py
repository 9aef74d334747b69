"""`Agent`: a conversation (a session of runs) on a durable runtime, with `run`, `resume` and `suspend`.

Each `run(prompt)` is one run of the session: its model calls and tool calls are steps
journaled by the runtime, so a run a process death interrupted continues where it was:
the finished model call is not requested again, finished tools do not run again, and an
``unsafe`` tool that started and never finished is reported to the model as interrupted.

A run holds its session's lease for as long as it goes (renewed in the background); every
write it makes is fenced by the lease epoch, so a process that lost the lease stops with
`StaleEpochError` instead of interleaving with the new owner. The run's lifecycle (start,
each checkpoint, park, finish) is committed phase by phase, each phase one transaction:
see `durable_agent._durable_session`.

Without `durable`, the agent keeps its history in memory and nothing survives the process.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import Any, Protocol, Unpack

from ._checkpoint import ToolApprovalResponse
from ._durable_session import AgentSpec, DurableOptions, DurableSession, verdict_value
from ._errors import ConfigurationError
from ._generate import PartSink, _consume
from ._loop import AgentLoop
from ._messages import Message
from ._models import LanguageModel, ModelSettings
from ._options import AgentOptions, RunOptions
from ._results import GenerateTextResult
from ._tools import Tool

__all__ = ["Agent", "DurableOptions", "resolve_approval"]


class AwakeableResolver(Protocol):
    """Whatever resolves awakeables by id: a `DurableRuntime`, or a client of a served agent (`RestateIngress`)."""

    async def resolve_awakeable(self, awakeable_id: str, value: Any) -> bool: ...


async def resolve_approval(runtime: AwakeableResolver, approval_id: str, *, approved: bool, reason: str | None = None,
                           token: str | None = None) -> bool:
    """Send a verdict to a run parked on an approval, from any process; the next `Agent.resume()` settles it.

    Returns False when no run waits on `approval_id`. With a signer on the agent, an approval
    still needs the request's `token` (it is verified when the run resumes). `approved` must
    be a real bool (`ConfigurationError` otherwise).
    """
    return bool(await runtime.resolve_awakeable(approval_id, verdict_value(approved, reason=reason, token=token)))


class Agent:
    """A model, its tools and a session: `await agent.run(prompt)`, `await agent.resume()`, `agent.suspend()`."""

    def __init__(
        self,
        *,
        model: LanguageModel,
        tools: dict[str, Tool] | None = None,
        durable: DurableOptions | None = None,
        session_id: str | None = None,
        system: str | None = None,
        **options: Unpack[AgentOptions],
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
        RunOptions.build(model, {"tools": self.tools, **self._options})  # fail early on bad options
        self.history: list[Message] = [{"role": "system", "content": system}] if system else []
        self.session = DurableSession(durable, session_id, self._spec) if durable is not None and session_id else None
        self._servers_open: AsyncExitStack | None = None

    async def __aenter__(self) -> Agent:
        """Open the agent's `mcp_servers` for every run until the block ends (each run opens them otherwise)."""
        stack = AsyncExitStack()
        try:
            for server in self._options.get("mcp_servers", ()):
                await stack.enter_async_context(server)
        except BaseException:
            await stack.aclose()
            raise
        self._servers_open = stack
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        stack, self._servers_open = self._servers_open, None
        if stack is not None:
            await stack.aclose()

    @property
    def options(self) -> dict[str, Any]:
        """The call options this agent was built with (a copy)."""
        return dict(self._options)

    def durable_copy(self, durable: DurableOptions, session_id: str, **overrides: Any) -> Agent:
        """This agent (model, tools, system, options) on `durable` as session `session_id`; `overrides`
        replace call options (a runtime in replay mode passes its journaled ``clock`` and ``generate_id``)."""
        options: dict[str, Any] = {**self._options, **overrides}
        return Agent(model=self.model, tools=self.tools, durable=durable, session_id=session_id,
                     system=self.system, **options)

    def _spec(self) -> AgentSpec:
        return AgentSpec(self.model, self.tools, self._options, self.history)

    def suspend(self) -> None:
        """Stop the run in progress at its next step boundary check; it stays resumable (`RunSuspendedError`)."""
        if self.session is not None:
            self.session.suspend()

    async def run(self, prompt: str, *, run_id: str | None = None, on_part: PartSink | None = None,
                  model_settings: ModelSettings | None = None) -> GenerateTextResult:
        """Run `prompt` as the session's next run and return its outcome.

        `run_id` names the new run (durable agents only; default: a fresh id); a run id that is
        already stored raises `RunExistsError`, so one id per piece of work makes starting it
        idempotent across crashes and retries. (`generate_text(store=, run_id=)` refuses a stored
        id the same way unless its messages begin with the run's stored history: then the call
        is the run's next leg, `durable_agent._loop`.) `on_part(run_id, part)`
        is awaited with every stream part as the run produces it (the run waits for it), e.g.
        to write an event log; a run recovered first (``on_interrupted="resume"``) reports its
        parts under its own id. `model_settings` replace the agent's for this run (not stored with
        it: a resumed run uses the agent's).
        """
        call = self._options if model_settings is None else {**self._options, "model_settings": model_settings}
        if self.session is None:
            if run_id is not None:
                raise ConfigurationError("run_id= needs a durable Agent (a run of a plain Agent is not stored)")
            options = RunOptions.build(self.model, {"tools": self.tools, **call})
            loop = AgentLoop(options, [*self.history, {"role": "user", "content": prompt}])
            result = await _consume(loop, on_part)
            self.history = list(result.messages)
            return result
        spec = self._spec() if model_settings is None else AgentSpec(self.model, self.tools, call, self.history)
        return await self.session.run(prompt, spec, run_id=run_id, on_part=on_part)

    async def resume(
        self, *, run_id: str | None = None, approval_responses: Sequence[ToolApprovalResponse] = (),
        on_part: PartSink | None = None,
    ) -> GenerateTextResult | None:
        """Continue the session's unfinished run (or `run_id`); None when there is nothing to continue.

        A run suspended on approvals is settled from `approval_responses` and the verdicts sent
        with `resolve_approval`, once every pending approval has one. Until then the run stays
        parked and is returned as it parked: ``finish_reason`` ``"suspended"``, the same
        `pending_approvals` (tokens included), no model call, nothing settled or denied; the
        verdicts given are kept for the resume that has them all. So a start-up loop may resume
        every session. A completed run is never driven again (None). `on_part` as in `run`.
        """
        if self.session is None:
            return None
        return await self.session.resume(self._spec(), run_id, approval_responses, on_part=on_part)

    async def abandon_interrupted(self) -> str | None:
        """Unmark the session's interrupted run (kept as stored) so the next run can start; returns its id.

        The documented way out of a `SessionStateError`; None when no run is marked.
        """
        if self.session is None:
            return None
        return await self.session.abandon_interrupted(self._spec())
