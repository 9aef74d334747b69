"""`RestateScope`: one run's view of a Restate invocation — the journal's `replay` mode.

Every step is an entry of the engine's journal (``ctx.run_typed``), named by its step key:

* a ``safe`` step is one action; after a crash the engine re-runs it unless it finished;
* an ``unsafe`` step first journals an intent action and waits for the engine to acknowledge
  it, then runs its handler as a second action. When the intent comes back from the journal
  and the handler's action did not (the process died while the handler ran), the second
  action journals ``interrupted`` instead of running the handler again;
* the value a step returns is always its recorded form (the checkpoint codec's data: JSON that
  keeps bytes), live or replayed, so a replay takes the same branches as the first execution;
* a handler's error is journaled as the step's value and raised rebuilt (`StepFailedError`),
  live and replayed alike; a control error is not journaled (the engine retries the attempt);
* tool-state ops staged by a handler come back with its value and are written to the Virtual
  Object's state after the entry, so a replay writes the same.

A round of parallel steps (`begin`) journals everything in call order before any of its steps
waits on an action: first the intents of its unsafe steps (acknowledged together), then one
action entry per step; the steps then run concurrently, and the round's tool-state ops are
written once its last step ends, in call order. A replay reads a journal positionally and must
not wait on an action whose result the journal lacks while later entries are still to replay (the
engine fails such an attempt with "journal mismatch 570"), so no entry of a round may depend on
which of its steps happened to finish first.

What replay mode cannot do here: stream partials are not journaled (nothing can be written to
the journal from inside an action), so they reach only the live `on_progress` of the process
running the step; `stored_steps` and `stored_partials` answer empty (the journal
is the engine's, read by the engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..._errors import ScopeClosedError, is_control_error
from ..._storage.records import (
    NO_DEFERRED,
    DeferredSteps,
    StepCompleted,
    StepErrorRecord,
    StepInterrupted,
    StepOutcome,
    StepRecord,
    StepRequest,
    StreamPartialRecord,
    ToolStateOp,
)
from ..._storage.scope import (
    AwakeableOutcome,
    DurableAwakeable,
    JournalScope,
    StepContext,
    StepLive,
    StepRun,
    error_record,
    json_form,
    rebuilt_error,
)
from ..._util import wall_clock_ms
from ._sdk import codec_run, decoded, encoded, sdk

if TYPE_CHECKING:
    from ._runtime import RestateRuntime


class RestateScope:
    """A `RunScope` in replay mode over one Restate invocation. Open it with `RestateRuntime.open_run`."""

    def __init__(self, runtime: RestateRuntime, *, session_id: str, run_id: str) -> None:
        self.session_id = session_id
        self.run_id = run_id
        self._runtime = runtime
        self._ctx = runtime.ctx
        self._closed = False
        self._begun: dict[str, _Entry] = {}  # journaled by `begin`, not stepped yet
        self._round: dict[str, tuple[ToolStateOp, ...] | None] = {}  # the round's ops by key, in call order

    def _check_open(self) -> None:
        if self._closed:
            raise ScopeClosedError(f"the scope of run {self.run_id!r} is closed")

    # ---------------------------------------------------------------- steps

    async def step(self, request: StepRequest, run: StepRun | None = None, live: StepLive | None = None) -> StepOutcome:
        """Run `run` once for `request` as a journaled action, or take its journaled value (module docs)."""
        self._check_open()
        if run is None:
            raise ScopeClosedError(f"step {request.key!r}: replay mode runs every step through its callable")
        entry = self._begun.pop(request.key, None)
        if entry is None:
            (may_start,) = await self._intents([request])
            entry = self._entry(request, may_start)
        entry.run, entry.live = run, live or StepLive()
        envelope = decoded(await entry.future)
        self._runtime.advance_clock(envelope.get("at"))
        current = "value" in envelope and envelope.get("fingerprint") == request.fingerprint
        ops = tuple(envelope.get("tool_state") or ()) if current else ()
        await self._write_tool_state(request.key, ops)
        if envelope.get("interrupted"):
            return StepInterrupted()
        if "error" in envelope:
            raise rebuilt_error(StepErrorRecord(**envelope["error"]))
        if not current:
            return StepInterrupted()
        return StepCompleted(envelope["value"], replayed=not entry.ran, tool_state=ops)

    async def begin(self, requests: Sequence[StepRequest]) -> None:
        """Journal a round of parallel steps in call order before any of them runs (module docs): the
        unsafe steps' intents, acknowledged together, then each step's action entry, which `step` runs."""
        self._check_open()
        for request, may_start in zip(requests, await self._intents(requests), strict=True):
            self._begun[request.key] = self._entry(request, may_start)
            self._round[request.key] = None

    async def _intents(self, requests: Sequence[StepRequest]) -> list[bool]:
        """Journal the intent of each unsafe step of `requests` and wait until the engine acknowledged them all.

        For each request, whether its handler may start: False for an unsafe step whose intent came
        back from the journal (it started before and its handler's entry may be unfinished).
        """
        started: dict[str, bool] = {}
        intents = []
        for request in requests:
            if request.replay == "unsafe":
                started[request.key] = False

                async def intent(key: str = request.key) -> bytes:
                    started[key] = True
                    return encoded({"intent": key})

                intents.append(self._ctx.run_typed(f"intent {request.key}", intent, codec_run()))
        for future in await sdk().gather(*intents):
            await future
        return [started.get(request.key, True) for request in requests]

    def _entry(self, request: StepRequest, may_start: bool) -> _Entry:
        """Journal the action entry of `request`; it runs (once awaited) the callable `step` hands it."""
        entry = _Entry()

        async def action() -> bytes:
            entry.ran = True
            if not may_start:
                return encoded({"interrupted": True, "at": wall_clock_ms()})
            assert entry.run is not None and entry.live is not None, "an action runs once its step awaits it"
            context = StepContext(request, entry.live.signal, _forwarder(entry.live.on_progress))
            try:
                value = await entry.run(context)
            except Exception as exc:
                if is_control_error(exc) or self._runtime.is_control_error(exc):
                    raise  # not journaled: the engine retries the attempt
                return encoded({"error": asdict(error_record(exc)), "at": wall_clock_ms()})
            return encoded({"value": json_form(value, request.key), "tool_state": list(context.staged),
                            "fingerprint": request.fingerprint, "at": wall_clock_ms()})

        entry.future = self._ctx.run_typed(request.key, action, codec_run())
        return entry

    async def _write_tool_state(self, key: str, ops: tuple[ToolStateOp, ...]) -> None:
        """Write a step's tool-state ops to the object's state: at once, or, for a step of a round, with
        the round's ops in call order once its last step ended (which step ends last is timing, not journal)."""
        if key not in self._round:
            if ops:
                await self._runtime.apply_tool_state(ops)
            return
        self._round[key] = ops
        if any(settled is None for settled in self._round.values()):
            return
        round_ops = [op for settled in self._round.values() for op in settled or ()]
        self._round.clear()
        if round_ops:
            await self._runtime.apply_tool_state(round_ops)

    async def commit_deferred(self, write: Callable[[DeferredSteps], Awaitable[None]]) -> None:
        """`write` with nothing deferred: the engine journals every action's result as it completes
        (`defer_done` is moot)."""
        await write(NO_DEFERRED)

    async def stored_steps(self) -> list[StepRecord]:
        return []

    async def stored_partials(self) -> list[StreamPartialRecord]:
        return []

    # --------------------------------------------------------- awakeables

    async def awakeable(
        self, key: str, *, timeout_ms: int | None = None, awakeable_id: str | None = None
    ) -> DurableAwakeable:
        """A Restate awakeable for `key`; its id is minted by Restate (`awakeable_id` cannot name it).

        With `timeout_ms`, the wait races a durable timer. `settled` is never set: a journal
        cannot tell before the wait (the replayed wait returns at once instead).
        """
        self._check_open()
        record, future = self._runtime.open_awakeable(key)

        async def wait() -> AwakeableOutcome:
            if timeout_ms is None or timeout_ms <= 0:
                value = await future
            else:
                which, value = await sdk().select(value=future, timeout=self._ctx.sleep(timedelta(milliseconds=timeout_ms)))
                if which == "timeout":
                    return AwakeableOutcome(True)
            self._runtime.record_resolved(record, value)
            return AwakeableOutcome(False, value)

        return DurableAwakeable(record.id, wait)

    # ------------------------------------------------------------- helpers

    def now(self) -> int:
        """Wall-clock ms as journaled: the invocation's start, moved on by each step's completion time."""
        return self._runtime.clock()

    def uuid(self) -> str:
        """An RFC 4122 v4 uuid from Restate's deterministic random, the same on every replay."""
        return self._runtime.uuid()

    async def sleep(self, ms: int, signal: Any = None) -> None:
        """A durable timer (``ctx.sleep``): a crash or a suspension does not restart it.

        A `signal` already set skips the sleep; one set during it does not cut it short (the
        timer is the engine's). A model retry policy waits between attempts through this.
        """
        if signal is not None and signal.is_set():
            return
        await self._ctx.sleep(timedelta(milliseconds=ms))

    @staticmethod
    async def gather(*aws: Awaitable[Any]) -> list[Any]:
        """All of `aws`, in order (`Promise.all`): the engine's combinator when all are journal futures."""
        if _durable(aws):
            done = await sdk().gather(*aws)
            return [await f for f in done]
        return await JournalScope.gather(*aws)

    @staticmethod
    async def gather_settled(*aws: Awaitable[Any]) -> list[Any]:
        """Every outcome, value or exception, in order (`Promise.allSettled`)."""
        if _durable(aws):
            done = await sdk().gather(*aws)
            return list(await asyncio.gather(*(_awaited(f) for f in done), return_exceptions=True))
        return await JournalScope.gather_settled(*aws)

    @staticmethod
    async def race(*aws: Awaitable[Any]) -> Any:
        """The first to settle (`Promise.race`): Restate's `select` when all are journal futures."""
        if _durable(aws):
            _, value = await sdk().select(**{str(i): f for i, f in enumerate(aws)})
            return value
        return await JournalScope.race(*aws)

    async def close(self) -> None:
        """End the scope: later steps raise. Idempotent."""
        self._closed = True


@dataclass(slots=True)
class _Entry:
    """A step's action entry in the journal, and the callable its action runs (handed over by `step`)."""

    future: Any = None
    run: StepRun | None = None
    live: StepLive | None = None
    ran: bool = False  # the action ran in this attempt (not a replayed result)


def _durable(aws: tuple[Awaitable[Any], ...]) -> bool:
    return bool(aws) and all(isinstance(a, sdk().RestateDurableFuture) for a in aws)


async def _awaited(future: Awaitable[Any]) -> Any:
    return await future


def _forwarder(
    forward: Callable[[dict[str, str]], None] | None,
) -> Callable[[dict[str, str]], Awaitable[None]]:
    async def on_progress(progress: dict[str, str]) -> None:
        if forward is not None:
            forward(progress)

    return on_progress

