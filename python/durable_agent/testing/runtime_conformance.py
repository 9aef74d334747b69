"""A reusable pytest conformance suite for durable runtimes.

Subclass `DurableRuntimeConformance` in a test module and provide the `make_runtime`
fixture: a function ``(clock) -> runtime`` whose every call returns a runtime over the
*same* durable state (another "process" on the same database). Every test is ``async def``;
run them with any runner that supports async tests (this project's conftest has one).

It checks every rule of `RunScope.step`, awakeables, stream partials, leases with epoch
fencing, the queue, submissions and tool state. Set `mode = "replay"` for a runtime whose
journal is an engine's (`durable_agent.restate`): the cases that read or restart our own step
records skip, each naming why (`checkpoint_only`), and the rest check the replay-mode forms.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Concatenate, Literal, ParamSpec

import pytest

from .._errors import (
    RunSuspendedError,
    ScopeClosedError,
    StaleEpochError,
    StepFailedError,
    SubmissionConflictError,
)
from .._storage.keys import step_key
from .._storage.records import DeferredSteps, RunOwner, RunTransition, StepKind, StepReplayPolicy, StepRequest
from .._storage.scope import StepContext, StepLive

RuntimeFactory = Callable[[Callable[[], int]], Any]
P = ParamSpec("P")
Case = Callable[Concatenate["DurableRuntimeConformance", P], Awaitable[None]]


CHECKPOINT_ONLY: dict[str, str] = {}
"""The cases that cannot apply in replay mode, by name, with the reason (`checkpoint_only`): a harness
that runs each case elsewhere (e.g. inside a Restate invocation) skips them up front."""


def checkpoint_only(reason: str) -> Callable[[Case[P]], Case[P]]:
    """Mark a case that cannot apply in replay mode; it skips there with `reason`."""

    def mark(case: Case[P]) -> Case[P]:
        CHECKPOINT_ONLY[case.__name__] = reason
        @functools.wraps(case)
        async def run(self: DurableRuntimeConformance, /, *args: P.args, **kwargs: P.kwargs) -> None:
            if self.mode == "replay":
                pytest.skip(f"replay mode: {reason}")
            await case(self, *args, **kwargs)

        return run

    return mark


NO_STEP_RECORDS = "the engine's journal holds the steps; a handler cannot read it (the crash tests check its rules)"
NO_RESTART = ("a journal replays by position within one invocation, so another scope asking for a key runs a new "
              "entry; what a restart answers is checked by SIGKILLing the service")
ENGINE_LOCK = "the engine's per-key lock replaces the lease (one exclusive invocation per session)"


class Clock:
    """A settable millisecond clock."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class ProviderError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = "rate_limited"
        self.status = 429
        self.retryable = True
        self.data = {"retry_after": 2}
        self.durable_decision = {"action": "retry"}


def _ignore(progress: dict[str, str]) -> None:
    """A live half's progress callback that forwards nowhere."""


def _req(
    key: str, replay: StepReplayPolicy = "unsafe", kind: StepKind = "tool", fingerprint: str | None = None
) -> StepRequest:
    return StepRequest(key=key, kind=kind, replay=replay, payload={"what": key}, fingerprint=fingerprint)


class DurableRuntimeConformance:
    """Every rule a durable runtime must keep. Provide the `make_runtime` fixture (and `mode`)."""

    session = "session-1"
    run = "run-1"
    mode: ClassVar[Literal["checkpoint", "replay"]] = "checkpoint"

    @pytest.fixture
    def clock(self) -> Clock:
        return Clock()

    async def _scope(self, runtime: Any, run: str | None = None, epoch: int | None = None) -> Any:
        return await runtime.open_run(session_id=self.session, run_id=run or self.run, epoch=epoch)

    async def _leased_scope(self, runtime: Any) -> tuple[Any, int]:
        """A scope of the case's run under a lease of its session just claimed, and the lease's epoch."""
        epoch = (await runtime.lease.claim(self.session, stale_at=0)).epoch
        return await self._scope(runtime, epoch=epoch), epoch

    async def test_implements_the_runtime_protocols(self, make_runtime: RuntimeFactory, clock: Clock) -> None:
        from .._storage.protocols import (
            DurableInspector,
            DurableLease,
            DurableRuntime,
            DurableStores,
            RunScope,
        )

        runtime = make_runtime(clock)
        assert isinstance(runtime, DurableRuntime) and runtime.mode == self.mode
        assert isinstance(runtime.lease, DurableLease) and isinstance(runtime.stores, DurableStores)
        assert isinstance(runtime.inspect, DurableInspector)
        scope = await self._scope(runtime)
        assert isinstance(scope, RunScope)
        await scope.close()

    async def test_scope_clock_ids_sleep_and_combinators(self, make_runtime: RuntimeFactory, clock: Clock) -> None:
        import asyncio

        scope = await self._scope(make_runtime(clock))
        if self.mode == "checkpoint":
            assert scope.now() == clock.now
        else:  # journaled: the engine's recorded wall clock, not the test's
            assert type(scope.now()) is int and scope.now() > 1_600_000_000_000
        ids = {scope.uuid() for _ in range(50)}
        assert len(ids) == 50 and all(len(i) == 36 and i[14] == "4" for i in ids)  # RFC 4122 v4
        stop = asyncio.Event()
        stop.set()
        await asyncio.wait_for(scope.sleep(60_000, stop), timeout=5)  # a set signal ends the wait early

        async def value(v: int, delay: float = 0) -> int:
            await asyncio.sleep(delay)
            return v

        async def boom() -> int:
            raise ValueError("no")

        assert await scope.gather(value(1), value(2)) == [1, 2]
        settled = await scope.gather_settled(value(1), boom())
        assert settled[0] == 1 and isinstance(settled[1], ValueError)
        assert await scope.race(value(1, 0.2), value(2)) == 2

    # ------------------------------------------------------------- step timing

    @checkpoint_only(NO_STEP_RECORDS)
    async def test_unsafe_step_writes_pending_before_its_handler_runs(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)
        seen: list[Any] = []
        key = step_key(self.run, 0, "call-1")

        async def handler(ctx: StepContext) -> str:
            seen.extend(r.status for r in await runtime.inspect.steps(self.run) if r.key == key)
            return "ok"

        scope = await self._scope(runtime)
        outcome = await scope.step(_req(key), handler)
        assert seen == ["pending"]
        assert (outcome.status, outcome.value, outcome.replayed) == ("completed", "ok", False)
        assert [(r.key, r.status, r.result) for r in await runtime.inspect.steps(self.run)] == [
            (key, "done", "ok")
        ]

    @checkpoint_only(NO_STEP_RECORDS)
    async def test_safe_step_writes_nothing_until_done_unless_marked_started(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)
        seen: list[int] = []

        async def handler(ctx: StepContext) -> str:
            seen.append(len(await runtime.inspect.steps(self.run)))
            return "ok"

        scope = await self._scope(runtime)
        await scope.step(_req(step_key(self.run, 0, "model"), "safe", "model"), handler)
        await scope.step(
            _req(step_key(self.run, 1, "model"), "safe", "model"), handler, StepLive(mark_started=True)
        )
        assert seen == [0, 2]  # the second one's own pending record was there

    @checkpoint_only(NO_RESTART)
    async def test_a_done_record_answers_without_running_the_handler(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)
        calls: list[str] = []

        async def handler(ctx: StepContext) -> Any:
            calls.append(ctx.request.payload["what"])
            return {"pair": (1, 2)}

        key = step_key(self.run, 0, "t1")
        first = await (await self._scope(runtime)).step(_req(key), handler)
        assert first.value == {"pair": (1, 2)} and not first.replayed  # live: the handler's own value
        again = await (await self._scope(make_runtime(clock))).step(_req(key), handler)
        assert calls == [key]
        assert again.replayed and again.value == {"pair": [1, 2]}  # replayed: the JSON form

    async def test_a_live_step_answers_in_the_form_of_its_mode(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        async def handler(ctx: StepContext) -> Any:
            return {"pair": (1, 2), "raw": b"\x00\xff"}

        scope = await self._scope(make_runtime(clock))
        outcome = await scope.step(_req(step_key(self.run, 0, "t9")), handler)
        # checkpoint: the handler's own value; replay: the recorded form, so a replay takes the same branches
        # (the stored form keeps bytes)
        expected: dict[str, Any] = {"pair": (1, 2) if self.mode == "checkpoint" else [1, 2], "raw": b"\x00\xff"}
        assert outcome.value == expected and type(outcome.value["pair"]) is type(expected["pair"])
        assert outcome.replayed is False

    @checkpoint_only(NO_RESTART)
    async def test_pending_safe_runs_again_and_pending_unsafe_is_interrupted(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)

        async def dies(ctx: StepContext) -> Any:
            raise RunSuspendedError()  # the process stops mid-step: a control error, not recorded

        scope = await self._scope(runtime)
        safe_key, unsafe_key = step_key(self.run, 0, "model"), step_key(self.run, 0, "t1")
        with pytest.raises(RunSuspendedError):
            await scope.step(_req(safe_key, "safe", "model"), dies, StepLive(mark_started=True))
        with pytest.raises(RunSuspendedError):
            await scope.step(_req(unsafe_key), dies)
        assert {r.status for r in await runtime.inspect.steps(self.run)} == {"pending"}

        ran: list[str] = []

        async def works(ctx: StepContext) -> str:
            ran.append(ctx.request.payload["what"])
            return "again"

        resumed = await self._scope(make_runtime(clock))
        assert (await resumed.step(_req(safe_key, "safe", "model"), works)).value == "again"
        assert (await resumed.step(_req(unsafe_key), works)).status == "interrupted"
        assert ran == [safe_key]

    @checkpoint_only(NO_STEP_RECORDS)
    async def test_a_deferred_done_record_rides_on_the_next_write(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)
        model_key, tool_key = step_key(self.run, 0, "model"), step_key(self.run, 0, "t1")
        ran: list[str] = []

        async def answer(ctx: StepContext) -> str:
            return "call t1"

        async def tool(ctx: StepContext) -> str:
            ran.append(next(r.status for r in await runtime.inspect.steps(self.run) if r.key == tool_key))
            return "done"

        scope = await self._scope(runtime)
        first = await scope.step(_req(model_key, "safe", "model"), answer, StepLive(defer_done=True))
        assert first.value == "call t1" and await runtime.inspect.steps(self.run) == []  # not written yet
        assert (await scope.step(_req(model_key, "safe", "model"), answer)).replayed  # the scope knows it
        await scope.begin([_req(tool_key)])  # one write: the deferred answer and the tool's intent
        assert [(r.key, r.status) for r in await runtime.inspect.steps(self.run)] == [
            (model_key, "done"), (tool_key, "pending")
        ]
        outcome = await scope.step(_req(tool_key), tool)  # begun: it runs (not interrupted), pending already there
        assert (outcome.status, outcome.value, ran) == ("completed", "done", ["pending"])
        again = await (await self._scope(make_runtime(clock))).step(_req(model_key, "safe", "model"), answer)
        assert again.replayed and again.value == "call t1"

        later = step_key(self.run, 1, "model")
        await scope.step(_req(later, "safe", "model"), answer, StepLive(defer_done=True))
        handed: list[DeferredSteps] = []

        async def hand(deferred: DeferredSteps) -> None:
            handed.append(deferred)

        await scope.commit_deferred(hand)
        await scope.commit_deferred(hand)
        assert [r.key for r in handed[0].records] == [later] and handed[1].records == ()
        await scope.step(_req(step_key(self.run, 2, "model"), "safe", "model"), answer, StepLive(defer_done=True))
        await scope.close()  # a closing scope writes what it still defers
        assert step_key(self.run, 2, "model") in [r.key for r in await runtime.inspect.steps(self.run)]

    @checkpoint_only("a key asked twice within one scope: the checkpoint runtimes' own map of a run's records")
    async def test_a_step_asked_again_in_its_scope_is_answered_by_its_record_however_it_was_written(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)
        scope, epoch = await self._leased_scope(runtime)
        calls: list[str] = []

        async def handler(ctx: StepContext) -> dict[str, int]:
            calls.append(ctx.request.key)
            return {"n": len(calls)}

        written, flushed, committed, later = (step_key(self.run, i, "t1") for i in range(4))
        await scope.step(_req(written), handler)  # its own write
        await scope.step(_req(flushed, "safe"), handler, StepLive(defer_done=True))
        await scope.begin([])  # the deferred record rides on the scope's next write
        await scope.step(_req(committed, "safe"), handler, StepLive(defer_done=True))
        await scope.commit_deferred(  # handed to a checkpoint commit
            lambda deferred: runtime.commit(RunTransition(self.session, epoch, deferred=deferred)))
        await scope.step(_req(later), handler)
        for n, key in enumerate((written, flushed, committed, later), 1):
            again = await scope.step(_req(key), handler)
            assert (again.status, again.replayed, again.value) == ("completed", True, {"n": n})
        assert calls == [written, flushed, committed, later]

    @checkpoint_only(NO_RESTART)
    async def test_another_fingerprint_is_interrupted(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)

        async def handler(ctx: StepContext) -> str:
            return "ran"

        key = nested_call_key = step_key(self.run, 0, "cm1/1")
        scope = await self._scope(runtime)
        await scope.step(_req(key, fingerprint="search:abc"), handler)
        assert (await scope.step(_req(nested_call_key, fingerprint="search:abc"), handler)).replayed
        assert (await scope.step(_req(key, fingerprint="delete:xyz"), handler)).status == "interrupted"

    async def test_a_failure_is_recorded_and_replayed_with_its_fields(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)

        async def fails(ctx: StepContext) -> Any:
            ctx.stage_tool_state([{"op": "set", "key": "never", "value": 1}])
            raise ProviderError("slow down")

        key = step_key(self.run, 0, "model")
        live_error = ProviderError if self.mode == "checkpoint" else StepFailedError  # replay: the recorded form
        with pytest.raises(live_error):  # live: the handler's own error
            await (await self._scope(runtime)).step(_req(key, "safe", "model"), fails)
        with pytest.raises(StepFailedError) as info:
            await (await self._scope(make_runtime(clock))).step(_req(key, "safe", "model"), fails)
        error = info.value
        assert (error.name, str(error), error.error_code, error.status, error.retryable) == (
            "ProviderError",
            "slow down",
            "rate_limited",
            429,
            True,
        )
        assert error.data == {"retry_after": 2} and error.durable_decision == {"action": "retry"}
        assert (
            await runtime.stores.tool_state(self.session).all() == {}
        )  # a failed step commits no tool state

    async def test_tool_state_commits_with_the_done_record_and_comes_back_on_replay(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)

        async def handler(ctx: StepContext) -> str:
            ctx.stage_tool_state(
                [{"op": "set", "key": "cwd", "value": "/src"}, {"op": "set", "key": "tmp", "value": 1}]
            )
            ctx.stage_tool_state([{"op": "delete", "key": "tmp"}])
            return "ok"

        key = step_key(self.run, 0, "t1")
        live = await (await self._scope(runtime)).step(_req(key), handler)
        assert await runtime.stores.tool_state(self.session).all() == {"cwd": "/src"}
        replayed = await (await self._scope(make_runtime(clock))).step(_req(key), handler)
        assert list(replayed.tool_state) == list(live.tool_state) and len(live.tool_state) == 3

    async def test_close_is_idempotent_and_later_steps_raise(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        async def handler(ctx: StepContext) -> str:
            return "ok"

        scope = await self._scope(make_runtime(clock))
        await scope.close()
        await scope.close()
        with pytest.raises(ScopeClosedError):
            await scope.step(_req(step_key(self.run, 0, "t1")), handler)

    # --------------------------------------------------------------- partials

    @checkpoint_only("nothing can be journaled from inside an action, so stream partials are not kept")
    async def test_stream_partials_are_kept_until_the_step_finishes(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)
        forwarded: list[str] = []
        key = step_key(self.run, 0, "model")

        async def streams_then_dies(ctx: StepContext) -> Any:
            assert ctx.on_progress is not None  # a scope always gives its steps one
            for delta in ("Hel", "lo"):
                await ctx.on_progress({"type": "text", "delta": delta})
            raise RunSuspendedError()

        scope = await self._scope(runtime)
        with pytest.raises(RunSuspendedError):
            await scope.step(
                _req(key, "safe", "model"),
                streams_then_dies,
                StepLive(on_progress=lambda p: forwarded.append(p["delta"])),
            )
        partials = await scope.stored_partials()
        assert [(p.seq, p.text) for p in partials] == [(0, "Hel"), (1, "lo")] and forwarded == ["Hel", "lo"]

        async def finishes(ctx: StepContext) -> str:
            return "Hello"

        await (await self._scope(make_runtime(clock))).step(_req(key, "safe", "model"), finishes)
        assert await runtime.inspect.partials(self.run) == []

    @checkpoint_only("nothing can be journaled from inside an action, so stream partials are not kept")
    async def test_interleaved_partials_keep_their_order_and_a_finished_step_drops_only_its_own(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)
        scopes = [await self._scope(runtime), await runtime.open_run(session_id="other", run_id="r-other")]
        keys = [step_key(self.run, 0, "model"), step_key(self.run, 0, "t1"), step_key("r-other", 0, "model")]
        emitters: dict[int, Any] = {}
        finish = [asyncio.Event() for _ in keys]

        def streams(i: int) -> Any:
            async def handler(ctx: StepContext) -> str:
                emitters[i] = ctx.on_progress
                await finish[i].wait()
                return "ok"
            return handler

        steps = [asyncio.ensure_future(scope.step(_req(key, "safe", "model"), streams(i), StepLive(on_progress=_ignore)))
                 for i, (scope, key) in enumerate(zip([scopes[0], scopes[0], scopes[1]], keys, strict=True))]
        while len(emitters) < 3:
            await asyncio.sleep(0)
        for n, (i, delta) in enumerate([(0, "a"), (2, "x"), (1, "b"), (0, "c")]):
            await emitters[i]({"type": "text", "delta": f"{n}{delta}"})
        assert [p.text for p in await runtime.inspect.partials()] == ["0a", "1x", "2b", "3c"]
        assert [p.text for p in await scopes[0].stored_partials()] == ["0a", "2b", "3c"]
        finish[0].set()
        await steps[0]
        assert [p.text for p in await runtime.inspect.partials()] == ["1x", "2b"]
        for event in finish:
            event.set()
        await asyncio.gather(*steps)
        assert await runtime.inspect.partials() == []

    @checkpoint_only("nothing is deferred: the engine journals every action as it completes")
    async def test_deferred_records_committed_with_a_checkpoint_drop_the_partials_of_the_steps_that_streamed(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)
        scope, epoch = await self._leased_scope(runtime)
        spoke, quiet = step_key(self.run, 0, "model"), step_key(self.run, 1, "t1")

        async def speaks(ctx: StepContext) -> str:
            assert ctx.on_progress is not None
            await ctx.on_progress({"type": "text", "delta": "Hi"})
            return "Hi"

        async def works(ctx: StepContext) -> str:
            return "done"

        await scope.step(_req(spoke, "safe", "model"), speaks, StepLive(defer_done=True))
        await scope.step(_req(quiet, "safe"), works, StepLive(defer_done=True))  # no intent: nothing flushes
        assert [p.text for p in await runtime.inspect.partials(self.run)] == ["Hi"]
        async def commit(deferred: DeferredSteps) -> None:
            assert [r.key for r in deferred.records] == [spoke, quiet] and deferred.streamed == {spoke}
            await runtime.commit(RunTransition(self.session, epoch, deferred=deferred))

        await scope.commit_deferred(commit)
        assert await runtime.inspect.partials(self.run) == []
        assert {r.key: r.status for r in await runtime.inspect.steps(self.run)} == {spoke: "done", quiet: "done"}

    # ------------------------------------------------------------- awakeables

    @checkpoint_only("an awakeable resolved while no process runs the run is checked through the ingress (tests/test_restate.py)")
    async def test_awakeables_survive_a_restart_and_get_values_sent_meanwhile(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)
        key = step_key(self.run, 2, "approval")
        first = await (await self._scope(runtime)).awakeable(key)
        assert first.settled is None
        resolver = make_runtime(clock)  # another process, while no process runs the run
        assert await resolver.resolve_awakeable(first.id, {"approved": True}) is True
        assert await resolver.resolve_awakeable("no-such-id", 1) is False
        assert (await resolver.find_awakeable(self.session, key)).id == first.id
        again = await (await self._scope(make_runtime(clock))).awakeable(key)
        assert again.id == first.id
        assert again.settled is not None and again.settled.value == {"approved": True}
        outcome = await again.wait()
        assert (outcome.timed_out, outcome.value) == (False, {"approved": True})

    @checkpoint_only("a deadline is a durable timer of the engine, not a stored time the test clock can move")
    async def test_an_awakeable_deadline_is_absolute_and_kept(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)
        key = step_key(self.run, 0, "wait")
        waiting = await (await self._scope(runtime)).awakeable(key, timeout_ms=5_000)
        clock.now += 4_000
        again = await (await self._scope(make_runtime(clock))).awakeable(key, timeout_ms=60_000)
        assert again.id == waiting.id
        clock.now += 1_000  # the stored deadline, not the second call's
        assert (await again.wait()).timed_out is True

    # ----------------------------------------------------------------- leases

    @checkpoint_only(ENGINE_LOCK)
    async def test_leases_fence_a_stale_writer(self, make_runtime: RuntimeFactory, clock: Clock) -> None:
        old, new = make_runtime(clock), make_runtime(clock)
        told: list[StaleEpochError] = []
        # The old owner is named as on another host, so only staleness (not liveness) decides.
        quiet_owner = RunOwner("elsewhere", 1, old.owner.token)
        first = await old.lease.claim(
            self.session, stale_at=clock.now - 10_000, owner=quiet_owner, on_stale=told.append
        )
        assert first.claimed and await old.lease.epoch(self.session) == first.epoch

        refused = await new.lease.claim(self.session, stale_at=clock.now - 10_000)
        assert not refused.claimed and refused.owner == quiet_owner  # RunLeaseHeldError names it

        async def handler(ctx: StepContext) -> str:
            return "ok"

        old_scope = await self._scope(old)
        await old_scope.step(_req(step_key(self.run, 0, "t1")), handler)

        clock.now += 60_000  # the old owner stopped renewing
        taken = await new.lease.claim(self.session, stale_at=clock.now - 1)
        assert taken.claimed and taken.epoch == first.epoch + 1
        with pytest.raises(StaleEpochError) as info:
            await old_scope.step(_req(step_key(self.run, 1, "t2")), handler)
        assert info.value.epoch == first.epoch and told and told[-1].session_id == self.session
        assert await old.lease.renew(self.session, first.epoch) is False
        assert await new.lease.renew(self.session, taken.epoch) is True
        assert [r.key for r in await new.inspect.steps(self.run)] == [
            step_key(self.run, 0, "t1")
        ]  # nothing interleaved

    @checkpoint_only(ENGINE_LOCK)
    async def test_a_step_confirms_a_lease_its_process_stalled_past_before_it_runs(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        """A holder whose process stalled (no renewal) for half its lease or more confirms the lease before
        a step runs: renewed when it is still its own, else the step does not run (the new owner may have
        run it already; the records this scope read say nothing of that)."""
        old, new = make_runtime(clock), make_runtime(clock)
        quiet_owner = RunOwner("elsewhere", 1, old.owner.token)  # only staleness decides
        first = await old.lease.claim(self.session, stale_at=clock.now - 20, owner=quiet_owner)  # a 20 ms lease
        ran: list[str] = []

        async def handler(ctx: StepContext) -> str:
            ran.append(ctx.request.key)
            return "ok"

        old_scope = await self._scope(old)
        await asyncio.sleep(0.03)  # stalled, and nobody took the lease: the step renews it, then runs
        clock.now += 1_000
        await old_scope.step(_req(step_key(self.run, 0, "t1"), "safe"), handler)
        assert not (await new.lease.claim(self.session, stale_at=clock.now - 20)).claimed  # renewed just now

        await asyncio.sleep(0.03)  # stalled again, and this time the lease is taken over meanwhile
        clock.now += 1_000
        assert (await new.lease.claim(self.session, stale_at=clock.now - 20)).claimed
        with pytest.raises(StaleEpochError) as info:
            await old_scope.step(_req(step_key(self.run, 1, "t2"), "safe"), handler)
        assert info.value.epoch == first.epoch
        assert ran == [step_key(self.run, 0, "t1")]

    @checkpoint_only(ENGINE_LOCK)
    async def test_a_live_claim_refuses_its_own_runtime_and_release_frees_the_session(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime, other = make_runtime(clock), make_runtime(clock)
        first = await runtime.lease.claim(self.session, stale_at=0)
        second = await runtime.lease.claim(self.session, stale_at=0)  # a second run through this runtime
        assert first.claimed and not second.claimed and second.owner == runtime.owner
        assert await runtime.lease.epoch(self.session) == first.epoch  # the first claim is not fenced out
        assert not (await other.lease.claim(self.session, stale_at=0)).claimed
        await runtime.lease.release(self.session, first.epoch)
        again = await runtime.lease.claim(self.session, stale_at=0)
        assert again.claimed and again.epoch == first.epoch + 1
        await runtime.lease.release(self.session, again.epoch)
        assert (await other.lease.claim(self.session, stale_at=0)).claimed

    async def test_a_claim_reports_the_run_marked_in_progress(self, make_runtime: RuntimeFactory, clock: Clock) -> None:
        """What the claimer would read next (`resumable_run`), handed over by the claim itself."""
        runtime = make_runtime(clock)
        first = await runtime.lease.claim(self.session, stale_at=0)
        assert first.claimed and first.resumable_run is None
        await runtime.commit(RunTransition(self.session, first.epoch, mark="r-marked"))
        await runtime.lease.release(self.session, first.epoch)
        again = await runtime.lease.claim(self.session, stale_at=0)
        assert again.claimed and again.resumable_run == "r-marked" == await runtime.lease.resumable_run(self.session)
        await runtime.commit(RunTransition(self.session, again.epoch, unmark=True))
        await runtime.lease.release(self.session, again.epoch)
        assert (await runtime.lease.claim(self.session, stale_at=0)).resumable_run is None

    @checkpoint_only(ENGINE_LOCK)
    async def test_racing_claims_of_one_runtime_take_the_lease_once(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime = make_runtime(clock)
        claims = await asyncio.gather(*(runtime.lease.claim(self.session, stale_at=0) for _ in range(3)))
        taken = [c for c in claims if c.claimed]
        assert len(taken) == 1 and await runtime.lease.epoch(self.session) == taken[0].epoch

    @checkpoint_only(ENGINE_LOCK)
    async def test_own_token_reclaims_a_lease_no_live_claim_of_it_holds(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        """The same owner token in a runtime that holds no claim of the session (a process that kept its
        token, or whose release never landed) takes the lease at once, without waiting for it to lapse."""
        runtime = make_runtime(clock)
        first = await runtime.lease.claim(self.session, stale_at=0)
        same = make_runtime(clock)
        same.owner = runtime.owner
        taken = await same.lease.claim(self.session, stale_at=0)
        assert taken.claimed and taken.epoch == first.epoch + 1

    @checkpoint_only("the engine retries an interrupted invocation itself; nothing is listed resumable")
    async def test_resumable_lists_lapsed_unparked_marked_runs(
        self, make_runtime: RuntimeFactory, clock: Clock
    ) -> None:
        runtime, scanner = make_runtime(clock), make_runtime(clock)
        assert await scanner.lease.resumable(stale_at=clock.now) == []  # never leased: never listed
        claim = await runtime.lease.claim(
            self.session, stale_at=0, owner=RunOwner("elsewhere", 1, runtime.owner.token)
        )
        await runtime.lease.mark_resumable(self.session, self.run, claim.epoch)
        assert await scanner.lease.resumable(stale_at=clock.now - 1) == []  # renewed since stale_at
        clock.now += 10
        listed = await scanner.lease.resumable(stale_at=clock.now - 1)
        assert [(r.session_id, r.run_id, r.epoch) for r in listed] == [(self.session, self.run, claim.epoch)]
        await (await self._scope(runtime)).awakeable(step_key(self.run, 3, "approval"))
        assert await scanner.lease.resumable(stale_at=clock.now - 1) == []  # parked on an awakeable
        await runtime.lease.mark_resumable(self.session, None, claim.epoch)

    # ---------------------------------------------------- queue, submissions (beyond what Agent uses)

    async def test_queue_outlives_the_process(self, make_runtime: RuntimeFactory, clock: Clock) -> None:
        runtime = make_runtime(clock)
        if not hasattr(runtime.stores, "queue"):
            pytest.skip("no type-ahead queue: nothing in durable-agent uses one (it is in no Protocol)")
        await runtime.stores.queue.write(self.session, [{"id": "q1", "text": "next"}])
        assert await make_runtime(clock).stores.queue.read(self.session) == [{"id": "q1", "text": "next"}]

    async def test_submissions_and_their_rules(self, make_runtime: RuntimeFactory, clock: Clock) -> None:
        from .._storage.protocols import EndpointStores

        runtime = make_runtime(clock)
        if not isinstance(runtime.stores, EndpointStores):
            pytest.skip("not an EndpointRuntime: enough for Agent; the HTTP endpoint needs submissions")
        submissions = runtime.stores.submissions
        assert await submissions.claim(self.session, "req-1", "fp-a") == (True, None)
        await submissions.complete(self.session, "req-1", {"run_id": "r9"})
        assert await submissions.claim(self.session, "req-1", "fp-a") == (False, {"run_id": "r9"})
        with pytest.raises(SubmissionConflictError):
            await submissions.claim(self.session, "req-1", "fp-b")
        await submissions.claim(self.session, "req-2", "fp")
        await submissions.complete(self.session, "req-2", None)  # dropped: a retry runs again
        assert await submissions.claim(self.session, "req-2", "fp") == (True, None)
