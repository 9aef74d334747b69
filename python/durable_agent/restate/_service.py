"""Serve an `Agent` on Restate: `agent_app(agent)` is the whole setup (an ASGI app for any ASGI server).

Two Virtual Objects are served, named after `name` (default ``"agent"``):

* ``<name>``, keyed by session id: ``run`` (exclusive: one run at a time per session, queued by
  the engine) takes a prompt and returns the run's outcome; a run that asks for client-mode
  approvals parks on one Restate awakeable per approval and suspends with no process holding
  it, and goes on once every verdict is in. ``status`` (shared: answers while a run is
  parked) tells the session's last run and the approvals it waits on, with their tokens;
* ``<name>Approvals``, keyed by approval id: maps the approval id to its Restate awakeable id,
  so ``resolve`` (what `RestateIngress.resolve_awakeable` calls) can complete it from any process.

Register the app's URL with the Restate admin API (``POST /deployments``).

(No ``from __future__ import annotations`` here: the SDK reads the handlers' annotations,
which name the SDK's own types, imported when the services are built.)
"""

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .._agent import Agent
from .._checkpoint import check_verdict
from .._durable_session import DurableOptions
from .._errors import ConfigurationError, is_control_error
from .._results import GenerateTextResult
from .._signing import ApprovalSigner
from ..backends.restate._runtime import AWAKEABLES, CHECKPOINT_PREFIX, LAST_RUN, RestateRuntime, state_text
from ..backends.restate._sdk import decoded, sdk

if TYPE_CHECKING:
    import restate


def approvals_name(name: str) -> str:
    """The name of the Virtual Object that maps approval ids of agent `name` to awakeable ids."""
    return f"{name}Approvals"


def result_json(result: GenerateTextResult) -> dict[str, Any]:
    """What the ``run`` handler returns: the run's outcome as JSON."""
    return {
        "run_id": result.run_id,
        "text": result.text,
        "finish_reason": result.finish_reason,
        "messages": list(result.messages),
        "usage": result.total_usage.to_dict(),
        "steps": len(result.steps),
        "pending_approvals": [r.to_dict() for r in result.pending_approvals],
        "client_tool_calls": list(result.client_tool_calls),
    }


async def run_agent(ctx: "restate.ObjectContext", agent: Agent, prompt: str, *, approvals: str | None) -> dict[str, Any]:
    """One ``run`` invocation: the session's next run, waiting out its approvals (parked, suspended)."""
    runtime = await RestateRuntime(ctx, approvals=approvals).start()
    overrides: dict[str, Any] = {"clock": runtime.clock, "generate_id": runtime.uuid}
    signer = agent.options.get("approval_signer")
    if isinstance(signer, ApprovalSigner):  # tokens and their age judged on the journaled clock
        overrides["approval_signer"] = signer.with_clock(runtime.clock)
    durable = agent.durable_copy(DurableOptions(runtime), ctx.key(), **overrides)
    try:
        result: GenerateTextResult | None = await durable.run(prompt)
        while result is not None and result.finish_reason == "suspended" and await runtime.wait_parked():
            result = await durable.resume() or result
    except Exception as exc:
        if is_control_error(exc):
            raise
        # A failure here comes back the same from the journal on every retry: fail the invocation for good.
        raise sdk().TerminalError(f"{type(exc).__name__}: {exc}", status_code=500) from exc
    assert result is not None
    return result_json(result)


async def session_status(ctx: "restate.ObjectSharedContext") -> dict[str, Any]:
    """The session's last run, its status, and the approvals it waits on (tokens and Restate awakeable ids
    included: Restate's own ``/restate/awakeables/{id}/resolve`` completes one too)."""
    from .._checkpoint import deserialize_checkpoint

    last_text = await state_text(ctx, LAST_RUN)
    last = None if last_text is None else str(decoded(last_text.encode()))
    text = await state_text(ctx, CHECKPOINT_PREFIX + last) if last else None
    if text is None:
        return {"run_id": last, "status": None, "step_index": None, "pending_approvals": []}
    checkpoint = deserialize_checkpoint(text, run_id=last)
    pending = [r.to_dict() for r in checkpoint.pending_approvals or ()]
    awakeables_text = await state_text(ctx, AWAKEABLES) if pending else None
    awakeables = {} if awakeables_text is None else decoded(awakeables_text.encode())
    for request in pending:
        request["awakeable_id"] = awakeables.get(request["approval_id"])
    return {"run_id": last, "status": checkpoint.status, "step_index": checkpoint.step_index,
            "pending_approvals": pending}


def agent_services(
    agent: Agent,
    *,
    name: str = "agent",
    retry_policy: "restate.InvocationRetryPolicy | None" = None,
    inactivity_timeout: timedelta | None = None,
) -> "list[restate.VirtualObject]":
    """The Virtual Objects serving `agent` (a template: not durable itself) — see the module docs.

    `retry_policy` and `inactivity_timeout` are Restate's, for the ``run`` handler's object:
    how soon a crashed invocation is retried, and how long a parked run stays ``running`` on
    its HTTP/2 stream before Restate asks it to suspend.
    """
    if not isinstance(agent, Agent):
        raise ConfigurationError("agent_services needs an Agent")
    if agent.durable is not None:
        raise ConfigurationError("serve a non-durable Agent: on Restate its runtime is the engine's journal")
    if not name or not name.isidentifier():
        raise ConfigurationError(f"a Restate service name must be an identifier, not {name!r}")
    sdk()  # a clear FeatureUnavailableError without the SDK
    import restate

    obj = restate.VirtualObject(name, invocation_retry_policy=retry_policy, inactivity_timeout=inactivity_timeout)
    approvals = restate.VirtualObject(approvals_name(name))

    @obj.handler()
    async def run(ctx: restate.ObjectContext, prompt: str) -> dict[str, Any]:
        return await run_agent(ctx, agent, prompt, approvals=approvals_name(name))

    @obj.handler(kind="shared")
    async def status(ctx: restate.ObjectSharedContext) -> dict[str, Any]:
        return await session_status(ctx)

    @approvals.handler()
    async def register(ctx: restate.ObjectContext, awakeable_id: str) -> None:
        ctx.set("awakeable", awakeable_id)

    @approvals.handler()
    async def resolve(ctx: restate.ObjectContext, verdict: dict[str, Any]) -> bool:
        awakeable_id = await ctx.get("awakeable", type_hint=str)
        if awakeable_id is None:
            return False
        try:
            check_verdict(verdict.get("approved"))
        except ConfigurationError as exc:
            raise restate.TerminalError(str(exc), status_code=400) from exc
        if not await ctx.get("resolved", type_hint=bool):
            ctx.resolve_awakeable(awakeable_id, verdict)
            ctx.set("resolved", True)
        return True

    return [obj, approvals]


def agent_app(agent: Agent, *, name: str = "agent", retry_policy: "restate.InvocationRetryPolicy | None" = None,
              inactivity_timeout: timedelta | None = None) -> Any:
    """An ASGI app serving `agent` on Restate (`agent_services`), for hypercorn or any ASGI server."""
    return sdk().app(agent_services(agent, name=name, retry_policy=retry_policy,
                                      inactivity_timeout=inactivity_timeout))


async def serve(app: Any, *, host: str = "127.0.0.1", port: int = 9080) -> None:
    """Serve an ASGI app (`agent_app`) with hypercorn (HTTP/2, what Restate speaks) until SIGTERM.

    The SDK installs its own SIGTERM handler; the stop is hooked into it, so SIGTERM stops the
    server here too (a bare in-process hypercorn would ignore it).
    """
    import asyncio

    sdk()
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config
    from restate.server import install_shutdown_hook

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.loglevel = "WARNING"
    stop = asyncio.Event()
    install_shutdown_hook(asyncio.get_running_loop(), stop.set)
    await hypercorn_serve(app, config, shutdown_trigger=stop.wait)
