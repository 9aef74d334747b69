"""`DurableSession`: one conversation on a durable runtime, its runs, and their lifecycle, phase by phase.

A session is a sequence of runs; each `Agent.run(prompt)` is the next one. Every phase that
changes what is stored is ONE fenced transaction (`DurableRuntime.commit` of a
`RunTransition`, the lease's epoch checked inside it), so a process death between two of them
leaves a state the next call continues from, and a process that lost the lease lands nothing:

1. **claim**: take the session's lease (a new epoch) — every later write is fenced by it;
2. **recover**: a run still marked in progress was interrupted; it is healed (its step in
   flight closed from its records, then completed and unmarked: one commit) or, with
   ``on_interrupted="resume"``, driven on;
3. **start**: the new run's first checkpoint (history plus prompt), the session's last run,
   and the mark: one commit;
4. **drive**: the loop, durable through the run's scope (`JournaledDurability`); each checkpoint
   it saves is one commit (`RunCheckpoints`);
5. **park**: a ``suspended`` checkpoint commits with one awakeable per pending approval and
   the unmark; `resume()` marks the run again (one commit) before it drives the next leg;
6. **finish**: the ``completed`` checkpoint commits with the unmark;
7. **stop** (with ``stop_requests``): a stop asked from any process (`DurableSession.request_stop`
   resolves the run's stop awakeable, which each leg watches) aborts the leg at its next check,
   and the unmark commits; the run stays at its last checkpoint (a leg that watches stops never continues it).

So: before (3) commits, nothing of the run exists and the next `run()` starts it again;
between (3) and (5)/(6), and during every later leg, the run is marked and `resume()`
continues it; after (5)/(6) it is unmarked, and `resume()` settles a parked run once each of
its approvals has a verdict (until then it leaves the run parked: `leave_parked`) or returns
None for a finished one.

The HTTP endpoint's `RunDriver` drives runs through `Agent.run`/`Agent.resume` and asks the
rest of the lifecycle here too: whether a run has more to do (`unfinished`), the lease held
while it rebuilds a taken-over run's missed events (`leased`), and the client tool results a
parked run receives (`edit_parked`: one fenced commit).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from ._checkpoint import AgentCheckpoint, ToolApprovalResponse, Usage, check_verdict
from ._durability import JournaledDurability
from ._errors import (
    ConfigurationError,
    RunAbortedError,
    RunExistsError,
    RunLeaseHeldError,
    RunSuspendedError,
    SessionStateError,
)
from ._generate import PartSink, _consume
from ._interrupted import aborted_turn, healed_step, is_model_call, paid_in_step
from ._loop import AgentLoop
from ._messages import Message
from ._models import LanguageModel
from ._options import AnySignal, RunOptions, logger, random_id
from ._parked import parked_result, unanswered_approvals, waits_for_calls
from ._results import GenerateTextResult
from ._storage.keys import run_key_prefix, step_key
from ._storage.protocols import DurableRuntime, RunScope
from ._storage.records import NO_DEFERRED, DeferredSteps, RunTransition, StepRecord
from ._tools import Tool
from ._util import maybe_await, wall_clock_ms
from .tracing import RunTrace

STALE_AFTER_MS = 30_000
"""`DurableOptions.stale_after_ms`'s default: a lease not renewed for this long counts as lapsed."""


@dataclass(frozen=True, slots=True)
class DurableOptions:
    """The runtime every run of an agent goes through, and what `run()` does with an interrupted run.

    ``on_interrupted="heal"`` (default): `run()` ends the interrupted run where it stopped
    (`DurableSession.heal`: its open tool calls answered as interrupted) and starts the new
    run (call `resume()` first to continue it instead). ``"resume"``: `run()` first continues
    the interrupted run when its process is gone, then runs the prompt unless the resumed run
    suspended.
    `stale_after_ms`: a lease not renewed for this long counts as lapsed. The run renews it every
    third of that; a step about to run after the run's process stalled for half of it (a blocked
    event loop, a GC pause, SIGSTOP) renews it first, and stops with `StaleEpochError` when another
    process took the run over meanwhile.
    `stop_requests`: each leg watches its run's stop awakeable (`StopRequests`), so a stop asked
    from any process (`DurableSession.request_stop`) ends the run for good within
    `STOP_CHECK_SECONDS`; costs one awakeable write on a run's first leg and one indexed read per
    check. Checkpoint-mode runtimes only (the HTTP endpoint turns it on for the runs it drives).
    """

    runtime: DurableRuntime
    on_interrupted: Literal["heal", "resume"] = "heal"
    stale_after_ms: int = STALE_AFTER_MS
    stop_requests: bool = False

    def __post_init__(self) -> None:
        if self.on_interrupted not in ("heal", "resume"):
            raise ConfigurationError("on_interrupted must be 'heal' or 'resume'")
        if type(self.stale_after_ms) is not int or self.stale_after_ms <= 0:
            raise ConfigurationError("stale_after_ms must be a positive int")
        if self.stop_requests and self.runtime.mode != "checkpoint":
            raise ConfigurationError("stop_requests needs a checkpoint-mode runtime (memory, SQLite, Postgres, ...)")


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """What runs on a session: the model, the tools, the call options, and the history a new session starts with."""

    model: LanguageModel
    tools: Mapping[str, Tool]
    options: Mapping[str, Any]
    history: Sequence[Message] = ()


def verdict_value(approved: bool, *, reason: str | None, token: str | None) -> dict[str, Any]:
    """What an approval's awakeable is resolved with (`resolve_approval`); read back on resume."""
    return {"approved": check_verdict(approved), "reason": reason, "token": token}


def approval_key(run_id: str, step_index: int, approval_id: str) -> str:
    """The step key of the awakeable a suspended run parks on for one approval."""
    return step_key(run_id, step_index, f"approval/{approval_id}")


STOP_CHECK_SECONDS = 0.25
"""How often a leg watching stop requests (`DurableOptions.stop_requests`) looks for one."""


def stop_key(run_id: str) -> str:
    """The key of a run's stop awakeable: the escaped run id holds no ':', so the key is no step key of any run
    (an unresolved one never makes a run look parked, `durable_agent._storage.leases`)."""
    return "stop/" + run_key_prefix(run_id)[:-1]


def stop_id(run_id: str) -> str:
    """The id of a run's stop awakeable: what `DurableSession.request_stop` resolves, from any process."""
    return f"stop/{run_id}"


class StopRequests:
    """One leg's watch on its run's stop awakeable: `requested` is set once any process asked the run to stop.

    `open` creates the awakeable (fenced by the leg's lease, once per run) and starts a check
    every `STOP_CHECK_SECONDS` (one indexed read); `requested` goes into the loop's abort signal,
    so the leg stops at the loop's next check, as it does for the caller's own ``signal``.
    """

    def __init__(self, runtime: DurableRuntime, session_id: str, run_id: str) -> None:
        self.runtime, self.session_id, self.run_id = runtime, session_id, run_id
        self.requested = asyncio.Event()
        self._checks: asyncio.Future[None] | None = None

    async def open(self, scope: RunScope) -> None:
        awakeable = await scope.awakeable(stop_key(self.run_id), awakeable_id=stop_id(self.run_id))
        if awakeable.settled is not None:
            self.requested.set()  # asked before this leg began
        self._checks = asyncio.ensure_future(self._check_every())

    async def confirmed(self) -> bool:
        """Whether a stop was asked (looked up now if the checks have not seen it): an abort that is not one is
        the caller's own ``signal``, which leaves the run resumable."""
        if not self.requested.is_set() and await self._asked():
            self.requested.set()
        return self.requested.is_set()

    async def close(self) -> None:
        if self._checks is not None:
            self._checks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checks

    async def _asked(self) -> bool:
        record = await self.runtime.find_awakeable(self.session_id, stop_key(self.run_id))
        return record is not None and record.resolved

    async def _check_every(self) -> None:
        while not self.requested.is_set():
            await asyncio.sleep(STOP_CHECK_SECONDS)
            try:
                if await self._asked():
                    self.requested.set()
            except Exception:  # noqa: BLE001 - a database hiccup: the next check asks again
                logger.exception("run %s: looking for a stop request failed", self.run_id)


def checkpoint_transition(
    session_id: str, epoch: int, run_id: str, checkpoint: AgentCheckpoint, deferred: DeferredSteps = NO_DEFERRED
) -> RunTransition:
    """What saving `checkpoint` commits with it (and the `deferred` step records), for the run `run_id`. In order:

    * a checkpoint of another run (a sub-agent's) → the checkpoint alone;
    * ``completed`` → the checkpoint and the unmark (finish);
    * ``suspended`` → the checkpoint, an awakeable per pending approval (its id the approval
      id, for `resolve_approval`), and the unmark (park);
    * ``running`` → the checkpoint alone.
    """
    own = checkpoint.run_id == run_id
    parked = parked_awakeables(checkpoint) if own else ()
    finishes = own and checkpoint.status in ("completed", "suspended")
    return RunTransition(session_id, epoch, checkpoint=checkpoint, unmark=finishes, awakeables=parked,
                         deferred=deferred)


def parked_awakeables(checkpoint: AgentCheckpoint) -> tuple[tuple[str, str], ...]:
    """The ``(key, awakeable_id)`` pairs a ``suspended`` checkpoint parks on: one per pending approval, its id the
    approval id (for `resolve_approval`); none for a checkpoint of another status."""
    if checkpoint.status != "suspended":
        return ()
    return tuple((approval_key(checkpoint.run_id, checkpoint.step_index, r.approval_id), r.approval_id)
                 for r in checkpoint.pending_approvals or ())


FORK_CALL = "fork"
"""The `call` of a fork's origin record (turn 0, which no step of the loop uses: its first model call is turn 1)."""


async def session_of(runtime: DurableRuntime, run_id: str) -> str | None:
    """The session whose journal holds `run_id` (its steps, or the origin record of a fork made on the runtime);
    None for a run the runtime never journaled (a store's run, a fork made without the runtime)."""
    steps = await runtime.inspect.steps(run_id)
    return steps[0].session_id if steps else None


async def commit_fork(runtime: DurableRuntime, session_id: str, forked: AgentCheckpoint, source_run: str,
                      *, stale_at: int) -> None:
    """Commit the new run `forked` (a fork of `source_run`, `durable_agent._fork`) into session `session_id`: its
    checkpoint, the awakeables of its pending approvals and its origin record, one transaction fenced by the
    session's lease (held for the commit only: `RunLeaseHeldError`, nothing done, while a live process holds it).

    So the fork is parked like any run of the session: `resolve_approval` of its ids lands on its own awakeables, and
    the session's `resume(run_id=...)` settles them. The origin record (``{run}:0:fork:0``, kind ``fork``) is what
    names the fork's session to a process that knows only its run id (`session_of`). The session's mark and last
    run are left alone: the fork is not the session's conversation, and a run in progress stays resumable.
    """
    epoch, _ = await claim_lease(runtime, session_id, stale_at)
    origin = StepRecord(session_id, forked.run_id, step_key(forked.run_id, 0, FORK_CALL), FORK_CALL, "safe", "done",
                        result={"run_id": source_run, "step_index": forked.step_index})
    try:
        await runtime.commit(RunTransition(session_id, epoch, checkpoint=forked, awakeables=parked_awakeables(forked),
                                           deferred=DeferredSteps((origin,), streamed=frozenset())))
    finally:
        await release_lease(runtime, session_id, epoch)


async def claim_lease(runtime: DurableRuntime, session_id: str, stale_at: int) -> tuple[int, str | None]:
    """Take `session_id`'s lease: its epoch, which fences every later write of the caller, and the run marked in
    progress (which only the caller's writes change from now on). `RunLeaseHeldError` when a live process holds it."""
    claim = await runtime.lease.claim(session_id, stale_at=stale_at)
    if not claim.claimed:
        raise RunLeaseHeldError(session_id, claim.owner)
    assert claim.epoch is not None
    return claim.epoch, claim.resumable_run


async def release_lease(runtime: DurableRuntime, session_id: str, epoch: int) -> None:
    """Hand `session_id`'s lease back (a failure is left to the lease's staleness)."""
    with contextlib.suppress(Exception):
        await runtime.lease.release(session_id, epoch)


class RunCheckpoints:
    """The checkpoint store the loop of one run saves through: every save is one fenced commit.

    Reads go to the runtime's checkpoint store; a save commits `checkpoint_transition`'s
    transition, with the step records the run's scope deferred (a final model answer), so
    finishing and parking are atomic with their checkpoint, and a process that lost the lease
    gets `StaleEpochError` instead of landing the save.
    """

    def __init__(
        self, runtime: DurableRuntime, scope: RunScope, run_id: str, epoch: int, latest: AgentCheckpoint | None = None
    ) -> None:
        self._runtime = runtime
        self._scope = scope
        self._run_id = run_id
        self._epoch = epoch
        self._latest = latest  # the run's stored checkpoint, committed by this leg (None: read it)

    def load(self, run_id: str) -> Any:
        if run_id == self._run_id and self._latest is not None:
            return self._latest
        return self._runtime.stores.checkpoints.load(run_id)

    async def save(self, checkpoint: AgentCheckpoint) -> None:
        """Commit `checkpoint` with the deferred step records. If the commit fails (the loop logs it and
        goes on), the records go back to the scope for its next write; a lost lease stops the run."""
        self._latest = None  # until this commit's outcome is known, the store holds the truth

        async def commit(deferred: DeferredSteps) -> None:
            await self._runtime.commit(
                checkpoint_transition(self._scope.session_id, self._epoch, self._run_id, checkpoint, deferred)
            )

        await self._scope.commit_deferred(commit)


class DurableSession:
    """One session on one runtime: `run`, `resume`, `suspend`, `abandon_interrupted`, in named phases.

    `agent`: the spec of the session's agent now, for the phases a call does not hand one to
    (the endpoint's: `unfinished`, `leased`, `edit_parked`).
    """

    def __init__(self, durable: DurableOptions, session_id: str, agent: Callable[[], AgentSpec]) -> None:
        if not session_id or not isinstance(session_id, str):
            raise ConfigurationError("a durable session needs a non-empty str session_id")
        self.durable = durable
        self.runtime: DurableRuntime = durable.runtime
        self.session_id = session_id
        self._agent = agent
        self._suspend: asyncio.Event | None = None  # created inside the running loop of each run

    # ------------------------------------------------------------------ public

    def suspend(self) -> None:
        """Stop the run in progress at its next step boundary check (`RunSuspendedError`); it stays resumable."""
        if self._suspend is not None:
            self._suspend.set()

    async def run(self, prompt: str, spec: AgentSpec, *, run_id: str | None = None,
                  on_part: PartSink | None = None) -> GenerateTextResult:
        """Recover an interrupted run, then start and drive the session's next run (`run_id`) on `prompt`."""
        epoch, marked, resumable = await self._claim_listed(spec)
        try:
            recovered = await self.recover(epoch, marked, spec, resume=self.durable.on_interrupted == "resume",
                                           resumable=resumable, on_part=on_part)
            if recovered is not None and recovered.finish_reason == "suspended":
                return recovered
            trace = RunTrace()
            try:
                start = await self.start_run(epoch, prompt, spec, run_id=run_id, trace=trace)
                return await self.drive(start.run_id, epoch, (), spec, on_part=on_part, started=start, trace=trace)
            except BaseException as exc:
                trace.end_run(run_id, None, Usage(), Usage(), exc)  # a leg that failed before its loop ended it
                raise
        finally:
            await self._release(epoch)

    async def resume(
        self, spec: AgentSpec, run_id: str | None = None, approval_responses: Sequence[ToolApprovalResponse] = (),
        *, on_part: PartSink | None = None,
    ) -> GenerateTextResult | None:
        """Continue the interrupted or parked run (or `run_id`); None when there is nothing to continue.

        A parked run goes on only with a verdict for each pending approval (given here or on its
        awakeable); otherwise it stays parked and is returned as it parked (`leave_parked`).
        """
        async with self.leased(spec) as (epoch, marked):
            target = run_id or marked or await self._parked_last_run()
            if target is None:
                return None
            checkpoint = await self._load(target)
            if checkpoint is None:
                raise SessionStateError(self.session_id, target, "has no checkpoint")
            if checkpoint.status == "completed":
                if target == marked:  # finished, but left marked by an older durable-agent: finish it now
                    await self.runtime.commit(RunTransition(self.session_id, epoch, unmark=True))
                return None
            given = {r.approval_id for r in approval_responses}
            sent = [v for v in await self.verdicts_from_awakeables(checkpoint) if v.approval_id not in given]
            if unanswered_approvals(checkpoint, {*given, *(v.approval_id for v in sent)}):
                return await self.leave_parked(epoch, checkpoint, approval_responses, spec, marked=target == marked)
            if target != marked:  # a parked run goes on: marked again, so a crash in this leg is resumable
                await self.runtime.commit(RunTransition(self.session_id, epoch, mark=target))
            return await self.drive(target, epoch, [*approval_responses, *sent], spec, on_part=on_part)

    async def request_stop(self, run_id: str) -> bool:
        """Ask `run_id` to stop for good, whichever process drives it: resolves its stop awakeable (no lease needed).

        A leg watching stop requests (`DurableOptions.stop_requests`) stops at its next check,
        commits the run's unmark (the session's next run may start) and raises `RunAbortedError`; a
        later leg (a takeover, a resume) stops before its first step. False when the run has no stop
        awakeable (no leg of it watched for stops): nothing was recorded.
        """
        return bool(await self.runtime.resolve_awakeable(stop_id(run_id), {"stop": True}))

    async def abandon_interrupted(self, spec: AgentSpec) -> str | None:
        """Unmark the session's interrupted run without running or changing anything of it; returns its id.

        The way out of a `SessionStateError`: the run's stored data is kept for inspection,
        and the session's next run starts from the session's last readable history.
        """
        async with self.leased(spec) as (epoch, marked):
            if marked is not None:
                await self.runtime.commit(RunTransition(self.session_id, epoch, unmark=True))
                logger.warning("session %s: run %s abandoned (unmarked; its data is kept)", self.session_id, marked)
            return marked

    async def unfinished(self, run_id: str) -> bool:
        """Whether the run has more to do: marked in progress, ``running``, or parked with nothing it waits for
        missing (`all_answered`). What the endpoint takes a run over for (`RunDriver.ensure_driven`)."""
        checkpoint = await self._stored(run_id)
        if checkpoint is None or checkpoint.status == "completed":
            return False
        if checkpoint.status == "running" or await self.runtime.lease.resumable_run(self.session_id) == run_id:
            return True
        return await self.all_answered(checkpoint)

    async def all_answered(self, checkpoint: AgentCheckpoint) -> bool:
        """Whether nothing the parked run waits for is missing (`durable_agent._parked`): no client call or sub-agent
        waits, and each pending approval's awakeable holds a verdict (the rule `resume` goes on by)."""
        if waits_for_calls(checkpoint, self._agent().tools):
            return False
        verdicts = await self.verdicts_from_awakeables(checkpoint)
        return not unanswered_approvals(checkpoint, {v.approval_id for v in verdicts})

    async def edit_parked(self, run_id: str, edit: Callable[[AgentCheckpoint | None], AgentCheckpoint]) -> None:
        """Commit `edit` of the run's stored checkpoint as its checkpoint (one fenced commit), holding the lease.

        How a parked run receives the results of its client tool calls: `edit` checks them against
        the checkpoint read under the lease, and refuses by raising (nothing is committed).
        Raises `RunLeaseHeldError` (nothing done) when another live process holds the session.
        """
        async with self.leased() as (epoch, _):
            edited = edit(await self._stored(run_id))
            await self.runtime.commit(RunTransition(self.session_id, epoch, checkpoint=edited))

    # ----------------------------------------------------------------- phases

    @contextlib.asynccontextmanager
    async def leased(self, spec: AgentSpec | None = None) -> AsyncIterator[tuple[int, str | None]]:
        """Hold the session's lease for the block: its epoch and the run marked in progress (`claim`); released
        after. `RunLeaseHeldError` (nothing done) when a live process holds it. `spec`: the call's (default: the
        agent's), whose clock judges the lease's staleness."""
        epoch, marked = await self.claim(spec or self._agent())
        try:
            yield epoch, marked
        finally:
            await self._release(epoch)

    async def claim(self, spec: AgentSpec) -> tuple[int, str | None]:
        """Take the session's lease: its epoch, which fences every later write of this call, and the run marked
        in progress (which only this call's writes change from now on)."""
        return await claim_lease(self.runtime, self.session_id, self._stale_at(spec))

    async def _claim_listed(self, spec: AgentSpec) -> tuple[int, str | None, set[str]]:
        """Claim the lease, with the session's runs that were resumable just before the claim (``"resume"``
        mode only: ``"heal"`` heals a marked run without asking).

        The listing can only be taken before the claim (after it, the lease is ours). When the
        claim took over a marked run the listing did not name, that run's owner went away between
        the two: in ``"resume"`` mode, hand the lease back and list and claim once more, so the
        run is resumed instead of being healed on the word of a stale listing.
        """
        if self.durable.on_interrupted != "resume":  # a marked run is healed whatever a listing says
            return (*await self.claim(spec), set())
        for attempt in (1, 2):
            listed = await self.runtime.lease.resumable(session_id=self.session_id, stale_at=self._stale_at(spec))
            epoch, marked = await self.claim(spec)
            resumable = {r.run_id for r in listed}
            if attempt == 2 or marked is None or marked in resumable:
                break
            await self._release(epoch)
        return epoch, marked, resumable

    async def recover(
        self, epoch: int, interrupted: str | None, spec: AgentSpec, *, resume: bool, resumable: set[str],
        on_part: PartSink | None = None,
    ) -> GenerateTextResult | None:
        """Deal with the run an earlier process left marked (`interrupted`, as the claim found it): drive it on
        (`resume`, when listed) or heal it.

        A parked run marked again (its resumed leg died before it settled) is driven on with the
        verdicts its approvals' awakeables hold, as `resume` would (one still waiting for a verdict
        is not listed resumable: `durable_agent._storage.leases`; it is healed).
        """
        if interrupted is None:
            return None
        checkpoint = await self._load(interrupted)
        if checkpoint is None:
            raise SessionStateError(self.session_id, interrupted, "is marked in progress but has no checkpoint")
        if checkpoint.status == "completed":
            await self.runtime.commit(RunTransition(self.session_id, epoch, unmark=True))
            return None
        if resume and interrupted in resumable:
            verdicts = await self.verdicts_from_awakeables(checkpoint)
            return await self.drive(interrupted, epoch, verdicts, spec, on_part=on_part)
        await self.heal(epoch, checkpoint, spec)
        return None

    async def heal(self, epoch: int, checkpoint: AgentCheckpoint, spec: AgentSpec) -> None:
        """Close an interrupted run without running anything: its step in flight finished from its records.

        The model answer of that step (if its call finished) joins the history, or else the text
        the call streamed, as an aborted turn (as a resumed run joins it); each of its tool calls
        gets its recorded result, or an interrupted marker when it never finished. The run's usage
        counts the tokens those records were paid (`healed_step`). The run is completed even when
        nothing of the step was recorded: nothing continues a healed run later (a reader of the
        endpoint would otherwise take it over). The healed checkpoint and the unmark are one commit.
        """
        scope = await self.runtime.open_run(session_id=self.session_id, run_id=checkpoint.run_id, epoch=epoch)
        try:
            messages, usage = healed_step(checkpoint, await scope.stored_steps(), await scope.stored_partials())
        finally:
            await scope.close()
        closed = AgentCheckpoint(
            run_id=checkpoint.run_id, step_index=checkpoint.step_index + 1, status="completed", usage=usage,
            messages=messages, created_at=self._now(spec), trace_context=checkpoint.trace_context,
        )
        await self.runtime.commit(RunTransition(self.session_id, epoch, checkpoint=closed, unmark=True))

    async def start_run(
        self, epoch: int, prompt: str, spec: AgentSpec, *, run_id: str | None = None, trace: RunTrace | None = None
    ) -> AgentCheckpoint:
        """Commit the new run's first checkpoint, make it the session's last run, and mark it: one transaction.

        `run_id` names the run (a caller that must know it up front, e.g. an idempotent HTTP
        request); a run id that already has a checkpoint is refused (`RunExistsError`). `trace`:
        the leg's spans, started here, so the first checkpoint already carries the leg's trace
        context (a leg resumed after a crash in its first step links to it).
        """
        history = await self._session_history(spec)
        if run_id is not None and await self._load(run_id) is not None:
            raise RunExistsError(run_id)
        run_id = run_id or str((spec.options.get("generate_id") or random_id)())
        if trace is not None:
            trace.start_run(run_id, spec.model, spec.options.get("agent_name"), ())
        start = AgentCheckpoint(run_id=run_id, step_index=0, status="running", usage=Usage(),
                                messages=[*history, {"role": "user", "content": prompt}], created_at=self._now(spec),
                                trace_context=trace.context if trace is not None else None)
        await self.runtime.commit(RunTransition(self.session_id, epoch, checkpoint=start, last_run=run_id,
                                                mark=run_id))
        return start

    async def drive(
        self, run_id: str, epoch: int, responses: Sequence[ToolApprovalResponse], spec: AgentSpec,
        *, on_part: PartSink | None = None, started: AgentCheckpoint | None = None, trace: RunTrace | None = None,
    ) -> GenerateTextResult:
        """Run the loop on `run_id` from its checkpoint; its saves park or finish the run (see the module docs).

        `started`: the first checkpoint of a run `start_run` committed under this same `epoch`.
        No leg ran it before, so nothing a crashed leg leaves (streamed text) can exist, and the
        loop starts from it without reading it back. `trace`: the leg's spans, when `start_run` started them.
        """
        runtime = self.runtime
        self._suspend = asyncio.Event()
        scope = await runtime.open_run(session_id=self.session_id, run_id=run_id, epoch=epoch,
                                       fresh=started is not None)
        checkpoints = RunCheckpoints(runtime, scope, run_id, epoch, started)
        stops = StopRequests(runtime, self.session_id, run_id) if self.durable.stop_requests else None
        leg_over = asyncio.Event()
        renewer = asyncio.ensure_future(self._renew(epoch, leg_over))
        try:
            if started is None:
                await self._join_partials(scope, checkpoints, run_id, spec)
            options = {**spec.options, "approval_responses": list(responses)} if responses else spec.options
            if stops is not None:
                await stops.open(scope)
                options = {**options, "signal": AnySignal(stops.requested, options.get("signal"))}
            tool_state = dict(await runtime.stores.tool_state(self.session_id).all())
            durability = JournaledDurability(scope, checkpoints, tool_state=tool_state, suspend_signal=self._suspend)
            run_options = RunOptions.build(spec.model, {"tools": spec.tools, **options})
            loop = AgentLoop(run_options, None, durability=durability, resume_run_id=run_id, trace=trace)
            return await _consume(loop, on_part)
        except RunSuspendedError:
            logger.info("run %s suspended; it stays resumable", run_id)
            raise
        except RunAbortedError:
            if stops is not None and await stops.confirmed():  # stopped for good: unmarked, at its last checkpoint
                await self._stop_for_good(scope, run_id, epoch, spec)
                logger.info("run %s stopped on request", run_id)
            raise
        finally:
            leg_over.set()
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            if stops is not None:
                await stops.close()
            await scope.close()

    # ----------------------------------------------------------------- helpers

    async def _stop_for_good(self, scope: RunScope, run_id: str, epoch: int, spec: AgentSpec) -> None:
        """Unmark a run stopped for good. It stays at its last checkpoint's step and history; its usage counts
        what the step it stopped in was paid (`paid_in_step`: a model answer whose tools never ran), which no
        later leg counts. One commit, carrying the step records the scope deferred (that answer's)."""
        checkpoint = await self._load(run_id)

        async def commit(deferred: DeferredSteps) -> None:
            counted = None
            if checkpoint is not None:
                records = {r.key: r for r in [*await scope.stored_steps(), *deferred.records]}
                paid = paid_in_step(run_id, checkpoint.step_index + 1, list(records.values()))
                if paid != Usage():
                    counted = replace(checkpoint, usage=checkpoint.usage + paid, step_id="",
                                      created_at=self._now(spec))
            await self.runtime.commit(RunTransition(self.session_id, epoch, checkpoint=counted, unmark=True,
                                                    deferred=deferred))

        await scope.commit_deferred(commit)

    async def _join_partials(self, scope: RunScope, checkpoints: RunCheckpoints, run_id: str,
                             spec: AgentSpec) -> None:
        """Turn the text a crashed model step had streamed into an aborted assistant turn of the history."""
        checkpoint = await self._load(run_id)
        if checkpoint is None:
            return
        turn = checkpoint.step_index + 1
        partials = await scope.stored_partials()
        if not any(is_model_call(p.step_key, run_id, turn) for p in partials):
            return  # the call streamed nothing (the usual resume): its records need no read
        aborted = aborted_turn(run_id, turn, partials, await scope.stored_steps())
        if aborted is None:
            return
        await checkpoints.save(AgentCheckpoint(
            run_id=run_id, step_index=checkpoint.step_index + 1, status="running", usage=checkpoint.usage,
            messages=[*checkpoint.messages, aborted], created_at=self._now(spec), trace_context=checkpoint.trace_context,
        ))

    async def leave_parked(self, epoch: int, checkpoint: AgentCheckpoint, given: Sequence[ToolApprovalResponse],
                           spec: AgentSpec, *, marked: bool) -> GenerateTextResult:
        """Leave a parked run parked while an approval of it has no verdict: a resume would deny it by default, and
        a user's pending decision is never taken for them (the journal spec's "parked on an unanswered awakeable").

        The verdicts `given` are kept on their approvals' awakeables (as `resolve_approval` sends them), for the
        resume that has them all. A run still `marked` (a leg died before it settled anything) is unmarked:
        parked again, exactly as it was before that leg.
        """
        pending = {r.approval_id for r in checkpoint.pending_approvals or ()}
        for response in given:
            if response.approval_id in pending:
                await self.runtime.resolve_awakeable(response.approval_id, verdict_value(
                    response.approved, reason=response.reason, token=response.token))
        if marked:
            await self.runtime.commit(RunTransition(self.session_id, epoch, unmark=True))
        logger.info("run %s waits for a verdict; left parked", checkpoint.run_id)
        return parked_result(checkpoint, spec.tools)

    async def verdicts_from_awakeables(self, checkpoint: AgentCheckpoint) -> list[ToolApprovalResponse]:
        """The verdicts other processes sent (`resolve_approval`) for the pending approvals of a parked run."""
        if checkpoint.status != "suspended":
            return []
        verdicts = []
        for request in checkpoint.pending_approvals or ():
            key = approval_key(checkpoint.run_id, checkpoint.step_index, request.approval_id)
            record = await self.runtime.find_awakeable(self.session_id, key)
            if record is None or not record.resolved or not isinstance(record.value, dict):
                continue
            value = record.value
            if type(value.get("approved")) is not bool:  # resolve_approval refuses these: a damaged row
                logger.warning("approval %s: stored verdict %r is not a bool; treated as unanswered",
                               request.approval_id, value.get("approved"))
                continue
            verdicts.append(ToolApprovalResponse(request.approval_id, value["approved"],
                                                 reason=value.get("reason"), token=value.get("token")))
        return verdicts

    async def _load(self, run_id: str) -> AgentCheckpoint | None:
        checkpoint = await self._stored(run_id)
        return None if checkpoint is None else checkpoint.refuse_newer()

    async def _stored(self, run_id: str) -> AgentCheckpoint | None:
        """The run's checkpoint as stored (even one of a newer durable-agent: `_load` refuses those)."""
        checkpoint: AgentCheckpoint | None = await maybe_await(self.runtime.stores.checkpoints.load(run_id))
        return checkpoint

    async def _session_history(self, spec: AgentSpec) -> list[Message]:
        last = await self.runtime.stores.runs.last(self.session_id)
        checkpoint = await self._load(last) if last else None
        return list(checkpoint.messages) if checkpoint is not None else list(spec.history)

    async def _parked_last_run(self) -> str | None:
        last = await self.runtime.stores.runs.last(self.session_id)
        checkpoint = await self._load(last) if last else None
        return last if checkpoint is not None and checkpoint.status == "suspended" else None

    async def _release(self, epoch: int) -> None:
        await release_lease(self.runtime, self.session_id, epoch)

    async def _renew(self, epoch: int, leg_over: asyncio.Event) -> None:
        """Renew the lease every third of `stale_after_ms` until `leg_over` is set (or the lease is lost).

        The leg also cancels this task, but a cancellation can be lost inside a renewal (Python
        3.11's `asyncio.wait_for`, which a connection pool's wait uses, drops one that arrives as
        its wait ends): the flag still ends the loop, where the leg awaits it.
        """
        interval = self.durable.stale_after_ms / 3000
        while not leg_over.is_set():
            await asyncio.sleep(interval)
            if leg_over.is_set() or not await self.runtime.lease.renew(self.session_id, epoch):
                return  # lost: the next fenced write (or step: `leases`) raises StaleEpochError and stops the run

    def _stale_at(self, spec: AgentSpec) -> int:
        return self._now(spec) - self.durable.stale_after_ms

    @staticmethod
    def _now(spec: AgentSpec) -> int:
        return int((spec.options.get("clock") or wall_clock_ms)())
