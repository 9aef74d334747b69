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

What replay mode cannot do here: stream partials are not journaled (nothing can be written to
the journal from inside an action), so they reach only the live `on_progress` of the process
running the step; `stored_steps` and `stored_partials` answer empty (the journal
is the engine's, read by the engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .._util import wall_clock_ms
from ..errors import ScopeClosedError, is_control_error
from ..runtime.records import (
    NO_DEFERRED,
    DeferredSteps,
    StepCompleted,
    StepErrorRecord,
    StepInterrupted,
    StepOutcome,
    StepRecord,
    StepRequest,
    StreamPartialRecord,
)
from ..runtime.scope import (
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
from ._sdk import codec_run, decoded, encoded, sdk

if TYPE_CHECKING:
    from .runtime import RestateRuntime


class RestateScope:
    """A `RunScope` in replay mode over one Restate invocation. Open it with `RestateRuntime.open_run`."""

    def __init__(self, runtime: RestateRuntime, *, session_id: str, run_id: str) -> None:
        self.session_id = session_id
        self.run_id = run_id
        self._runtime = runtime
        self._ctx = runtime.ctx
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ScopeClosedError(f"the scope of run {self.run_id!r} is closed")

    # ---------------------------------------------------------------- steps

    async def step(self, request: StepRequest, run: StepRun | None = None, live: StepLive | None = None) -> StepOutcome:
        """Run `run` once for `request` as a journaled action, or take its journaled value (module docs)."""
        self._check_open()
        if run is None:
            raise ScopeClosedError(f"step {request.key!r}: replay mode runs every step through its callable")
        live = live or StepLive()
        may_start = True
        if request.replay == "unsafe":
            intent_ran: list[bool] = []

            async def intent() -> bytes:
                intent_ran.append(True)
                return encoded({"intent": request.key})

            await self._ctx.run_typed(f"intent {request.key}", intent, codec_run())
            may_start = bool(intent_ran)  # replayed intent, no journaled result: it started and never finished
        ran: list[bool] = []

        async def action() -> bytes:
            ran.append(True)
            if not may_start:
                return encoded({"interrupted": True, "at": wall_clock_ms()})
            context = StepContext(request, live.signal, _forwarder(live.on_progress))
            try:
                value = await run(context)
            except Exception as exc:
                if is_control_error(exc) or self._runtime.is_control_error(exc):
                    raise  # not journaled: the engine retries the attempt
                return encoded({"error": asdict(error_record(exc)), "at": wall_clock_ms()})
            return encoded({"value": json_form(value, request.key), "tool_state": list(context.staged),
                            "fingerprint": request.fingerprint, "at": wall_clock_ms()})

        envelope = decoded(await self._ctx.run_typed(request.key, action, codec_run()))
        self._runtime.advance_clock(envelope.get("at"))
        if envelope.get("interrupted"):
            return StepInterrupted()
        if "error" in envelope:
            raise rebuilt_error(StepErrorRecord(**envelope["error"]))
        if envelope.get("fingerprint") != request.fingerprint:
            return StepInterrupted()
        ops = tuple(envelope.get("tool_state") or ())
        if ops:
            await self._runtime.apply_tool_state(ops)
        return StepCompleted(envelope["value"], replayed=not ran, tool_state=ops)

    async def begin(self, requests: Sequence[StepRequest]) -> None:
        """Nothing to do: each unsafe step journals its own intent in `step`, and nothing is deferred."""

    def take_deferred(self) -> DeferredSteps:
        """Always empty: the engine journals every action's result as it completes (`defer_done` is moot)."""
        return NO_DEFERRED

    def give_back(self, deferred: DeferredSteps) -> None:
        """Nothing is ever handed out (`take_deferred`), so nothing comes back."""

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
            self._runtime.settle_awakeable(record, value)
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

