"""`RunDriver`: the runs this server process drives, and the events they write to the log.

A run is driven by an `Agent` the app's factory builds for the run's session; every part it
streams becomes keyed events (`durable_agent.http._progress`) appended to the event log before
the loop goes on, so what a reader is sent has been stored first.

A run parked on approvals continues once each has a verdict. A verdict posted to this endpoint
resumes it at once (`approve`); one stored by another process (``durable-agent runs approve
--runtime``, a worker calling `resolve_approval`) is noticed by `watch_parked`: every
`PARKED_CHECK_SECONDS` it looks up the awakeables of the parked runs it watches, and takes over a
run whose verdicts are all in (`ensure_driven`), with no reader needed. It watches the runs its
legs parked, those a reader found parked, and those the shared event log lists parked
(`EventLog.parked`, asked each round: runs parked by another server, or by a server that died
or was restarted), so any live server continues them. A round checks at most
`PARKED_CHECKS_PER_ROUND` runs, one indexed lookup each, taking turns: a verdict is noticed
within a second while a process watches up to 200 parked runs, within parked/200 seconds beyond
(benches/bench_cli_wake.py: one lookup ~0.1 ms on SQLite). Several servers may notice the same
verdict: the session's lease lets one of them resume the run.

The run's lifecycle is `durable_agent._durable_session`'s, through the run's `Agent`: its legs are
`Agent.run`/`Agent.resume`, and the session (`Agent.session`) says whether a run has more to do,
holds the lease while this process rebuilds a run's missed events, and commits the results of
client tool calls; this module claims no lease and commits nothing itself.

Which process drives a run is the lease's business (`durable_agent._storage.leases`): a reader
of a run that no live process drives any more (its server was killed) makes this process take
it over (`ensure_driven`): first the events the stored run proves but the log lacks are
appended (`missing_events`), then the run is resumed from its journal and its new events
follow. Two processes that race for it are decided by the lease: one resumes, the other's claim
is refused and it only reads. A new run of a session whose run was interrupted does the same
rebuild first (`_reconcile_interrupted`): its `Agent.run` recovers that run before it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from .._agent import Agent, resolve_approval
from .._checkpoint import AgentCheckpoint, ToolApprovalRequest
from .._durable_session import DurableSession, approval_key
from .._errors import (
    ConfigurationError,
    RunAbortedError,
    RunLeaseHeldError,
    RunSuspendedError,
    StaleEpochError,
)
from .._generate import PartSink
from .._options import AnySignal
from .._storage.protocols import DurableRuntime
from .._util import maybe_await, wall_clock_ms
from ..stream_parts import StreamFinish, StreamPart
from ._asgi import HttpError
from ._client_tools import ClientResult, answered_history, answers_for
from ._events import EventLog, RunInfo
from ._progress import ProgressKeys, error_event, missing_events, stop_events

logger = logging.getLogger("durable_agent.http")

__all__ = ["AgentFactory", "RunDriver"]

PARKED_CHECK_SECONDS = 0.5
"""How often `RunDriver.watch_parked` looks for verdicts stored by other processes (see the module docs)."""
PARKED_CHECKS_PER_ROUND = 100
"""How many parked runs one round of the watch checks at most (the others wait for their turn)."""

AgentFactory = Callable[[str], Agent]
"""Builds the durable `Agent` of a session (its model, tools, options) for a session id."""


class RunDriver:
    """Starts, resumes and takes over runs in this process; writes their events (see the module docs)."""

    def __init__(self, agent_factory: AgentFactory, runtime: DurableRuntime, log: EventLog) -> None:
        self.agent_factory = agent_factory
        self.runtime = runtime
        self.log = log
        self._tasks: dict[str, asyncio.Task[BaseException | None]] = {}
        self._ending: set[str] = set()  # runs whose leg logged its finish: its task is ending
        self._sessions: dict[str, str] = {}  # session id -> the run this process drives in it
        self._starting: dict[str, asyncio.Future[None]] = {}  # runs whose start is not committed yet
        self._answering = asyncio.Lock()  # one client-result commit at a time: a second claim here would be refused
        self._parked: dict[str, tuple[str, list[str]]] = {}  # run -> its session, the awakeables it may still wait on
        self._listed: dict[str, int] = {}  # run -> seq of the parked finish the log listed last round (taken up)
        self._stops: dict[str, asyncio.Event] = {}  # run -> the abort signal of the leg this process drives

    def agent(self, session_id: str) -> Agent:
        """The session's agent, checked to run on this endpoint's runtime."""
        agent = self.agent_factory(session_id)
        if not isinstance(agent, Agent) or agent.durable is None or agent.durable.runtime is not self.runtime:
            raise ConfigurationError("the agent factory must return a durable Agent on the endpoint's runtime")
        if agent.session_id != session_id:
            raise ConfigurationError(f"the agent factory built an Agent of session {agent.session_id!r} "
                                     f"when asked for {session_id!r}")
        return agent

    def session(self, session_id: str) -> DurableSession:
        """The lifecycle of the session's runs (`durable_agent._durable_session`), through its agent."""
        session = self.agent(session_id).session
        assert session is not None  # a durable agent (`agent`) has its session
        return session

    def driving(self, run_id: str) -> bool:
        """Whether this process drives `run_id` now."""
        return run_id in self._tasks

    async def checkpoint(self, run_id: str) -> AgentCheckpoint | None:
        checkpoint: AgentCheckpoint | None = await maybe_await(self.runtime.stores.checkpoints.load(run_id))
        return checkpoint

    # ------------------------------------------------------------ driving

    async def start(self, run_id: str, session_id: str, prompt: str, meta: Mapping[str, Any]) -> None:
        """Start `run_id` on `prompt` in the background; return once its start is committed.

        Raises what stopped it before that (`RunLeaseHeldError`: the session runs another run; `HttpError` 409
        ``session_parked``: in ``on_interrupted="resume"`` mode, the session's interrupted run went on first and
        parked, and `Agent.run` returned it without starting this one).
        """
        starting = self._starting.get(run_id)
        if starting is not None:  # the same run asked twice at once (a retried request): one start
            await asyncio.shield(starting)
            return
        agent = self.agent(session_id)
        await self._await_ending_leg(session_id, run_id)
        self._check_free(session_id, run_id)
        await self._reconcile_interrupted(session_id, run_id)
        agent = self._abortable(agent, run_id)
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._starting[run_id] = started
        try:
            sink = self._sink(run_id, session_id, meta, started)
            task = self._spawn(run_id, session_id, agent.run(prompt, run_id=run_id, on_part=sink))
            waiting: set[asyncio.Future[Any]] = {started, task}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if not started.done():  # no failure: Agent.run went on with an interrupted run, which parked
                error = task.result() or HttpError(
                    409, "session_parked", f"session {session_id!r} first continued its interrupted run, which "
                    "parked on approvals: nothing was started; answer them, then start this run again")
                started.set_exception(error)  # a duplicate waiting on this start gets it too
                started.exception()  # retrieved: nobody waiting is not an unhandled exception
                raise error  # what ended the run before its start committed
        finally:
            del self._starting[run_id]

    def resume(self, info: RunInfo) -> None:
        """Drive the stored run `info` on from its journal, in the background, after the leg this process drives.

        Raises `RunLeaseHeldError` when this process drives another run of the session (its lease
        claim would be refused; refusing here spawns nothing).
        """
        agent = self.agent(info.session_id)
        self._check_free(info.session_id, info.run_id)
        agent = self._abortable(agent, info.run_id)
        earlier = self._tasks.get(info.run_id)

        async def work() -> None:
            if earlier is not None:
                await asyncio.wait({earlier})  # its lease is released when it ends
            await agent.resume(run_id=info.run_id, on_part=self._sink(info.run_id, info.session_id, info.meta, None))

        self._spawn(info.run_id, info.session_id, work())

    async def ensure_driven(self, info: RunInfo) -> None:
        """Take `info`'s run over when it is unfinished, its log is not at a leg's end, and no live process drives it.

        Unfinished: marked in progress, or a leg resumed after approvals (checkpoint
        ``running``, or ``suspended`` with every approval answered). Whether a live process
        drives it is the lease's answer: this process claims the session's lease, and only
        once it holds it (no one else can write the run) rebuilds the missed events and
        resumes. A parked or finished run only gets its leg's missed end.
        """
        if info.run_id in self._tasks or info.session_id in self._sessions:
            return
        logged = await self.log.read(info.run_id)
        last = logged[-1].data.get("type") if logged else None
        if last == "error":
            return  # a failed leg stays failed: readers do not call a failing model in a loop
        if not await self.continues(info):
            if last != "finish":
                await self.reconcile(info.run_id)  # parked or finished: only its leg's end can be missing
            await self._note_parked(info.run_id)
            return
        # the lease, then handed to Agent.resume's own claim; a process that takes it in between drives the run
        if not await self._reconcile_leased(info.session_id, info.run_id):
            return  # a live process drives it (or this one checks it already): its events arrive through the log
        logger.info("run %s: no live process drives it; taking it over", info.run_id)
        self.resume(info)

    async def sweep(self) -> list[str]:
        """Take over every endpoint run no live process drives (at server start); returns their ids.

        Lists the runs the lease shows lapsed as of now, then lets `ensure_driven` decide each
        with its own agent's `stale_after_ms` (a run a live process still renews is left alone).
        """
        taken = []
        for listed in await self.runtime.lease.resumable(stale_at=wall_clock_ms()):
            info = await self.log.run_info(listed.run_id)
            if info is None:
                continue  # not a run of this endpoint
            try:
                await self.ensure_driven(info)
            except Exception:  # one broken run must not keep the others down
                logger.exception("run %s: taking it over at start failed", info.run_id)
            if self.driving(info.run_id):
                taken.append(info.run_id)
        return taken

    async def watch_parked(self, interval: float = PARKED_CHECK_SECONDS) -> None:
        """Forever: every `interval` seconds, `wake_parked` (see the module docs). The endpoint runs it from startup."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.wake_parked()
            except Exception:  # a database hiccup: the next round tries again
                logger.exception("checking the parked runs for verdicts failed")

    async def wake_parked(self) -> list[str]:
        """Take over the parked runs whose every approval now has a verdict, stored by any process; their ids.

        The watch holds the runs parked here and those the event log lists parked (`EventLog.parked`:
        parked by another server, or before this one started), each taken up once per parked leg. At
        most `PARKED_CHECKS_PER_ROUND` runs are checked, in turn: a run checked goes to the back of
        the line. Each run's awakeables are looked up in order, stopping at the first unresolved one
        (one lookup per run still waiting); a run whose verdicts are all in leaves the watch, and
        `ensure_driven` decides it like a reader's request would.
        """
        await self._take_up_listed()
        woken = []
        for run_id, (session_id, waits) in list(self._parked.items())[:PARKED_CHECKS_PER_ROUND]:
            self._parked[run_id] = self._parked.pop(run_id)  # to the back of the line
            if run_id in self._tasks:
                del self._parked[run_id]  # driven here again (an approval posted here): its leg's end notes it anew
                continue
            while waits:
                record = await self.runtime.find_awakeable(session_id, waits[0])
                if record is not None and not record.resolved:
                    break
                waits.pop(0)  # resolved, or gone with a run that went on elsewhere
            if waits or session_id in self._sessions:
                continue  # still waiting; or this process drives another run of the session: the next round
            del self._parked[run_id]
            info = await self.log.run_info(run_id)
            if info is None:
                continue  # pruned
            try:
                await self.ensure_driven(info)
            except Exception:  # one broken run must not keep the others parked
                logger.exception("run %s: continuing it after its verdicts failed", run_id)
            if self.driving(run_id):
                woken.append(run_id)
        return woken

    async def _take_up_listed(self) -> None:
        """Watch the runs the log lists parked that this round's watch lacks (each parked leg once: a run whose
        verdicts were all in when it was taken up is not taken up again until it parks anew)."""
        listed = await self.log.parked()
        for run_id, seq in listed.items():
            if self._listed.get(run_id) != seq and run_id not in self._parked and run_id not in self._tasks:
                await self._note_parked(run_id)
        self._listed = listed

    async def _note_parked(self, run_id: str) -> None:
        """Watch `run_id` when it is parked on approvals (`wake_parked`)."""
        checkpoint = await self.checkpoint(run_id)
        if checkpoint is None or checkpoint.status != "suspended" or not checkpoint.pending_approvals:
            return
        info = await self.log.run_info(run_id)
        if info is not None:
            self._parked[run_id] = (info.session_id, [approval_key(run_id, checkpoint.step_index, r.approval_id)
                                                      for r in checkpoint.pending_approvals])

    async def _reconcile_leased(self, session_id: str, run_id: str) -> bool:
        """`reconcile` the run holding the session's lease (released after); False, nothing done, when a live
        process holds it."""
        try:
            async with self.session(session_id).leased():
                await self.reconcile(run_id)
        except RunLeaseHeldError:
            return False
        return True

    async def _reconcile_interrupted(self, session_id: str, run_id: str) -> None:
        """Before `run_id` starts: rebuild the missed events of the session's interrupted run, as a reader's takeover
        would (`ensure_driven`).

        The new run's `Agent.run` recovers that run first: it drives it on (``on_interrupted="resume"``),
        its parts logged from the log's end on (`_sink`), or heals it. So the events its dead process
        never logged are appended now, from what that process left, before anything of the run changes;
        a run another live process drives is left to it (its claim refuses this one's run as well), a
        failed run's log is left as it ended, and a run this endpoint never served has no log.
        """
        marked = await self.runtime.lease.resumable_run(session_id)
        if marked is None or marked == run_id or await self.log.run_info(marked) is None:
            return
        logged = await self.log.read(marked)
        if not logged or logged[-1].data.get("type") != "error":
            await self._reconcile_leased(session_id, marked)

    async def reconcile(self, run_id: str) -> None:
        """Append the events the stored run proves but the log lacks (see `missing_events`)."""
        logged = await self.log.read(run_id)
        checkpoint = await self.checkpoint(run_id)
        inspect = self.runtime.inspect
        missing = missing_events(run_id, logged, checkpoint, await inspect.steps(run_id),
                                 await inspect.partials(run_id))
        if missing:
            await self.log.append(run_id, missing)

    async def approve(self, info: RunInfo, request: ToolApprovalRequest, step_index: int, *, approved: bool,
                      reason: str | None, token: str | None) -> bool:
        """Record a verdict; resume the run once every pending approval has one. False: already answered.

        Before it resumes, what the stored run proves but the log lacks is appended, as a reader's takeover
        does (`ensure_driven`): a process that parked the run may have died before logging its requests.

        Raises `RunLeaseHeldError` (nothing recorded) while this process drives another run of the session.
        """
        await self._await_ending_leg(info.session_id, info.run_id)
        self._check_free(info.session_id, info.run_id)
        if await self._ended(info.run_id):
            raise HttpError(409, "run_ended", f"run {info.run_id!r} was stopped (or failed): nothing was recorded")
        key = approval_key(info.run_id, step_index, request.approval_id)
        record = await self.runtime.find_awakeable(info.session_id, key)
        if record is None or record.resolved:
            return False
        if not await resolve_approval(self.runtime, request.approval_id, approved=approved, reason=reason,
                                      token=token):
            return False
        checkpoint = await self.checkpoint(info.run_id)
        session = self.session(info.session_id)
        if checkpoint is not None and checkpoint.status == "suspended" and await session.all_answered(checkpoint):
            await self._reconcile_leased(info.session_id, info.run_id)  # a dead process's unlogged park comes first
            self.resume(info)
        return True

    async def answer_client_calls(self, info: RunInfo, results: Sequence[ClientResult]) -> None:
        """Record the results of client tool calls the parked run waits for; resume it once nothing waits.

        One commit, fenced by the session's lease (claimed for it and released): the results join
        the parked checkpoint's history, all of them or none. Then their ``tool-result`` events
        are logged. Raises `HttpError` 409 (nothing recorded): the run is not parked
        (``not_waiting``), a call has a result already (``already_answered``) or is not a client
        call it waits for (``not_pending``), or another run or process holds the session (``session_busy``).
        """
        await self._await_ending_leg(info.session_id, info.run_id)
        self._check_free(info.session_id, info.run_id)
        agent = self.agent(info.session_id)
        answers_for(info.run_id, await self.checkpoint(info.run_id), agent.tools, results)  # refused before a claim
        task = self._tasks.get(info.run_id)
        if task is not None:  # parked on these calls, and its leg's task is ending: a claim now would be refused
            await asyncio.wait({task})

        def answered(checkpoint: AgentCheckpoint | None) -> AgentCheckpoint:
            answers = answers_for(info.run_id, checkpoint, agent.tools, results)  # again, holding the lease
            assert checkpoint is not None
            return answered_history(checkpoint, answers, wall_clock_ms())

        async with self._answering:
            try:
                await self.session(info.session_id).edit_parked(info.run_id, answered)
            except RunLeaseHeldError:
                raise HttpError(409, "session_busy", f"session {info.session_id!r} is driven by another process; "
                                "nothing was recorded: send the results again") from None
        await self.reconcile(info.run_id)
        if await self.continues(info):
            self.resume(info)

    async def cancel(self, info: RunInfo) -> Literal["aborted", "stopping"] | None:
        """Stop the run for good (a UI's stop button): ``aborted`` once stopped, ``stopping`` when another live
        process drives it and was asked to; None when it has nothing left to do (finished, failed, stopped).

        A leg this process drives is asked (`DurableSession.request_stop`) and gets its abort
        signal at once: the loop stops at its next check (the next streamed chunk, or before the
        step's tools run: a tool is never cut mid-call), the interrupted step is not
        checkpointed, the run is unmarked, and the leg's ``error`` event (code ``run_aborted``)
        ends the log. A leg another live process drives is asked the same way, durably: that
        process stops it within `STOP_CHECK_SECONDS` and logs the event (``stopping``). A run no
        live process drives (parked, or its server died) gets that event under the session's
        lease. A run whose log ends with an ``error`` is never taken over again (`ensure_driven`)
        nor resumed by a verdict (`approve`), and the session is unmarked so its next run can
        start. Raises `RunLeaseHeldError` (nothing done) while another live process holds the
        session for another run, or drives this one without watching for stop requests.
        """
        task, stop = self._tasks.get(info.run_id), self._stops.get(info.run_id)
        if task is not None and (stop is None or info.run_id in self._ending):
            await asyncio.wait({task})  # its leg logged its end already: the run is parked or done when it ends
            task = None
        if task is not None and stop is not None:
            await self.session(info.session_id).request_stop(info.run_id)
            stop.set()
            await asyncio.wait({task})
        elif await self._ended(info.run_id) or not await self._stoppable(info):
            return None
        else:
            try:
                async with self.session(info.session_id).leased():
                    if await self._ended(info.run_id):
                        return None
                    await self.log.append(info.run_id, stop_events(await self.log.read(info.run_id),
                                                                   RunAbortedError(info.run_id),
                                                                   f"{wall_clock_ms()}-abort"))
            except RunLeaseHeldError:
                if await self.runtime.lease.resumable_run(info.session_id) != info.run_id or \
                        not await self.session(info.session_id).request_stop(info.run_id):
                    raise
                return "stopping"
            self._parked.pop(info.run_id, None)
        if await self.runtime.lease.resumable_run(info.session_id) == info.run_id:
            await self.agent(info.session_id).abandon_interrupted()
        return "aborted" if await self._ended(info.run_id) else None

    async def _stoppable(self, info: RunInfo) -> bool:
        checkpoint = await self.checkpoint(info.run_id)
        return checkpoint is None or checkpoint.status != "completed"

    async def _ended(self, run_id: str) -> bool:
        """Whether the run's log ends with an ``error``: a failed or stopped run, which no one continues."""
        logged = await self.log.read(run_id)
        return bool(logged) and logged[-1].data.get("type") == "error"

    async def stop(self) -> None:
        """Cancel the runs in flight (server shutdown): they stay resumable, and the next server takes them over."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    # ----------------------------------------------------------- helpers

    async def continues(self, info: RunInfo) -> bool:
        """Whether the run has more to do (`DurableSession.unfinished`)."""
        return await self.session(info.session_id).unfinished(info.run_id)

    async def _await_ending_leg(self, session_id: str, run_id: str) -> None:
        """Wait for another run of the session whose leg has logged its finish: its task is only ending (releasing
        the lease). A client that read that finish and asks at once must not be refused as busy."""
        busy = self._sessions.get(session_id)
        task = self._tasks.get(busy) if busy is not None and busy != run_id and busy in self._ending else None
        if task is not None:
            await asyncio.wait({task})

    def _check_free(self, session_id: str, run_id: str) -> None:
        busy = self._sessions.get(session_id)
        if busy is not None and busy != run_id:
            raise RunLeaseHeldError(session_id, self.runtime.owner)

    def _abortable(self, agent: Agent, run_id: str) -> Agent:
        """`agent` watching stop requests from any process (`DurableOptions.stop_requests`), with an abort signal
        `cancel` sets for `run_id`'s leg here (besides the app's own ``signal``)."""
        assert agent.durable is not None and agent.session_id is not None  # `agent` checked it
        stop = self._stops[run_id] = asyncio.Event()
        return agent.durable_copy(replace(agent.durable, stop_requests=True), agent.session_id,
                                  signal=AnySignal(stop, agent.options.get("signal")))

    def _spawn(self, run_id: str, session_id: str, work: Any) -> asyncio.Task[BaseException | None]:
        task = asyncio.ensure_future(self._guarded(run_id, work))
        self._tasks[run_id] = task
        self._ending.discard(run_id)  # a new leg: not ending until it logs its own finish
        self._sessions[session_id] = run_id

        def done(_: object) -> None:
            if self._tasks.get(run_id) is task:
                del self._tasks[run_id]
                self._stops.pop(run_id, None)
                self._ending.discard(run_id)
                if self._sessions.get(session_id) == run_id:
                    del self._sessions[session_id]

        task.add_done_callback(done)
        return task

    async def _guarded(self, run_id: str, work: Any) -> BaseException | None:
        """Await a run; returns what stopped it. A failure becomes the leg's ``error`` event; a lost lease does not."""
        try:
            await work
        except (StaleEpochError, RunLeaseHeldError, RunSuspendedError) as exc:
            logger.info("run %s stopped in this process: %s", run_id, exc)
            return exc
        except Exception as exc:  # a failed (or stopped: `cancel`) run is an event its readers get, never a crash
            if isinstance(exc, RunAbortedError):
                logger.info("run %s stopped: %s", run_id, exc)
            else:
                logger.exception("run %s failed", run_id)
            if await self.log.run_info(run_id) is not None:
                attempt = f"{wall_clock_ms()}-{id(exc)}"
                await self.log.append(run_id, stop_events(await self.log.read(run_id), exc, attempt)
                                      if isinstance(exc, RunAbortedError) else [error_event(exc, attempt)])
            return exc
        try:
            await self._note_parked(run_id)
        except Exception:  # the leg is over and stored: a failed look only leaves the run to its readers
            logger.exception("run %s: watching it for verdicts failed", run_id)
        return None

    def _sink(self, run_id: str, session_id: str, meta: Mapping[str, Any],
              started: asyncio.Future[None] | None) -> PartSink:
        keys: dict[str, ProgressKeys] = {}

        async def on_part(part_run_id: str | None, part: StreamPart) -> None:
            rid = part_run_id or run_id
            progress = keys.get(rid)
            if progress is None:
                if await self.log.run_info(rid) is None:
                    if rid != run_id:
                        return  # a run the endpoint never served (recovered by Agent.run first): not logged
                    await self.log.create_run(rid, session_id, meta)
                progress = keys[rid] = ProgressKeys(await self.log.read(rid))
            leg_step = None
            if isinstance(part, StreamFinish):
                checkpoint = await self.checkpoint(rid)
                leg_step = checkpoint.step_index if checkpoint is not None else None
            events = progress.events(part, leg_step=leg_step)
            if events:
                await self.log.append(rid, events)
            if isinstance(part, StreamFinish) and rid == run_id:
                self._ending.add(run_id)
            if started is not None and rid == run_id and not started.done():
                started.set_result(None)

        return on_part
