"""The one seam through which a run's loop is durable: `Durability`, and `JournaledDurability` of an `Agent`'s leg.

The loop (`loop`, `model_call`, `tool_calls`, `tool_sources`) never asks whether its run is
durable: it hands every step, every checkpoint and every wait to the `Durability` it was given,
and the implementation decides what that means.

* `Durability` itself is the pass-through of a run without a journal (`generate_text`,
  `stream_chat`, a plain `Agent`, a sub-agent): a step runs its work at once and returns its
  value, a model step's parts stream as the model sends them, a batch begins with no write, a
  wait is `asyncio.sleep`. Its `checkpoints` are the caller's `store=` (None: nothing is saved).
* `JournaledDurability` is a leg of a durable `Agent` run (`durable_session`): every step goes
  through the run's `RunScope` (recorded, replayed, interrupted), waits are the scope's, and
  `checkpoints` is the fenced committer of the run (`RunCheckpoints`), whose saves carry the
  step records the scope deferred.

Besides steps, the seam carries what only a durable leg has: the session's id (on log lines
and spans), the session's tool state as the run sees it, and the signal `Agent.suspend()` sets.
"""

from __future__ import annotations

import asyncio
import types
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ._storage.records import StepCompleted, StepOutcome, StepRecord, StepRequest
from ._storage.scope import JournalScope, StepContext, StepLive, StepRun

if TYPE_CHECKING:
    from ._options import AbortSignal
    from ._storage.protocols import CheckpointStore, RunScope
    from .stream_parts import StreamPart


class StreamedResult(Protocol):
    """What a streamed step fills as it streams (a model step's `ModelTurn`): stored as `to_json()`, and
    filled again from that stored form on a replay (`replay` returns the parts a live call would have streamed)."""

    finished: bool
    """True once the stream has put its last part: what its step still awaits is cleanup and its record's commit."""

    def to_json(self) -> Any: ...

    def replay(self, stored: Any) -> list[StreamPart]: ...


StreamRun = Callable[[StepContext], AsyncGenerator["StreamPart", None]]
"""A streamed step's work: its parts, as they come (filling its `StreamedResult` meanwhile)."""


class Durability:
    """How a run's loop is durable; this class is the pass-through of a run without a journal (module docs)."""

    def __init__(
        self,
        checkpoints: CheckpointStore | None = None,
        *,
        session_id: str | None = None,
        tool_state: dict[str, Any] | None = None,
        suspend_signal: AbortSignal | None = None,
    ) -> None:
        self.checkpoints = checkpoints  # where the loop loads and saves its checkpoints (None: nowhere)
        self.session_id = session_id
        self.tool_state: dict[str, Any] = {} if tool_state is None else tool_state  # tools read it, steps change it
        self.suspend_signal = suspend_signal  # set: the run stops at its next boundary check (`RunSuspendedError`)

    async def step(self, request: StepRequest, run: StepRun, live: StepLive | None = None) -> StepOutcome:
        """Run `run` for `request` and return its value, with the tool-state ops it staged."""
        context = StepContext(request, live.signal if live is not None else None)
        value = await run(context)
        return StepCompleted(value, False, tuple(context.staged))

    def streamed_step(self, request: StepRequest, stream: StreamRun, result: StreamedResult,
                      live: StepLive | None = None) -> AsyncGenerator[StreamPart, None]:
        """The parts of `stream`, each as it comes."""
        return stream(StepContext(request, live.signal if live is not None else None))

    replays_by_position = False
    """True on a journal that replays its entries by position (Restate): a replay must meet the same steps in
    the same order, so a step that only sometimes happens (a tool-listing change) is recorded every time."""

    async def recorded_steps(self) -> list[StepRecord]:
        """The run's step records so far (none without a journal)."""
        return []

    async def begin(self, requests: Sequence[StepRequest]) -> None:
        """Announce a batch of steps about to run concurrently (a journal makes their intents durable first)."""

    async def sleep(self, ms: int, signal: AbortSignal | None = None) -> None:
        """Wait `ms` milliseconds (a retry's backoff)."""
        if ms:
            await asyncio.sleep(ms / 1000)


class JournaledDurability(Durability):
    """A leg of a durable run: its steps go through `scope`; `checkpoints` commit them (module docs)."""

    def __init__(self, scope: RunScope, checkpoints: CheckpointStore, *, tool_state: dict[str, Any],
                 suspend_signal: AbortSignal | None) -> None:
        super().__init__(checkpoints, session_id=scope.session_id, tool_state=tool_state,
                         suspend_signal=suspend_signal)
        self.scope = scope
        self.replays_by_position = not isinstance(scope, JournalScope)  # Restate's scope (`backends.restate`)

    async def recorded_steps(self) -> list[StepRecord]:
        return await self.scope.stored_steps()

    async def step(self, request: StepRequest, run: StepRun, live: StepLive | None = None) -> StepOutcome:
        """Run `run` once for `request`, or answer from its record: the scope's rules (`_storage.scope`)."""
        return await self.scope.step(request, run, live)

    def streamed_step(self, request: StepRequest, stream: StreamRun, result: StreamedResult,
                      live: StepLive | None = None) -> AsyncGenerator[StreamPart, None]:
        """The parts of `stream` as the journaled step puts them (`drain`); a replayed step's, from its record."""
        parts: deque[StreamPart] = deque()

        async def run(context: StepContext) -> Any:
            async for part in stream(context):
                parts.append(part)
            return result.to_json()

        return drain(parts, self.scope.step(request, run, live), result)

    async def begin(self, requests: Sequence[StepRequest]) -> None:
        await self.scope.begin(requests)

    async def sleep(self, ms: int, signal: AbortSignal | None = None) -> None:
        await self.scope.sleep(ms, signal)


@types.coroutine
def _forward(awaited: Any) -> Generator[Any, None, None]:
    """Hand what a driven coroutine awaits on to the task awaiting this (`drain`)."""
    yield awaited


async def _close(driven: Generator[Any, None, Any], awaited: Any, *, finished: bool) -> None:
    """End a step `drain` drives whose caller stopped reading; `awaited` is what the step waits on now.

    A step whose stream has put its last part (`finished`) runs to its end: what it has left is the stream's
    cleanup (an adapter closing its HTTP response) and the commit of its record, so the model call it paid for is
    kept. Any other is stopped as a cancellation does: CancelledError is thrown in where it waits. Either way
    what the step awaits is forwarded as its own awaits are, and a cancellation of the caller meanwhile is
    thrown in where the step waits. Not ``close()``: GeneratorExit thrown through the async generators the step is
    inside (the model's stream) skips their cleanup, and an await in a cleanup makes ``close()`` raise."""
    stop = None if finished else asyncio.CancelledError()
    try:
        if stop is not None:
            awaited = driven.throw(stop)
        while True:
            try:
                await _forward(awaited)
            except BaseException as exc:  # noqa: BLE001 - the caller's cancellation, for the step to meet
                awaited = driven.throw(exc)
            else:
                awaited = driven.send(None)
    except StopIteration:
        pass
    except asyncio.CancelledError as cancelled:
        if cancelled is not stop:
            raise
    finally:
        driven.close()  # a no-op once it ended


async def drain(parts: deque[StreamPart], step: Awaitable[StepOutcome], result: StreamedResult) -> AsyncGenerator[StreamPart, None]:
    """Yield the parts a journaled step streams while it runs; for a replayed step, its stored ones.

    The step runs in the caller's own task, driven here the way a task drives a coroutine: what
    it awaits, the caller's task awaits (`_forward`), and the parts it put on `parts` meanwhile
    are yielded in between. A task per model step, with a hand-off per part, had cost a tenth of
    the event loop's time at a thousand concurrent runs. A cancellation of the caller reaches the
    step where it waits; a caller that stops iterating closes it.
    """
    driven = step.__await__()
    thrown: BaseException | None = None
    failure: BaseException | None = None
    ended = False
    try:
        while True:
            try:
                awaited = driven.send(None) if thrown is None else driven.throw(thrown)
            except StopIteration as stop:
                outcome: StepOutcome = stop.value
                ended = True
                break
            except BaseException as exc:  # noqa: BLE001 - the step's own failure, raised once the parts before it are out
                failure, ended = exc, True
                break
            thrown = None
            while parts:
                yield parts.popleft()
            try:
                await _forward(awaited)  # a task sends None when what it awaited is done: so do we
            except BaseException as exc:  # noqa: BLE001 - the caller's cancellation, for the step to meet
                thrown = exc
    finally:
        if not ended:  # the caller stopped iterating
            await _close(driven, awaited, finished=result.finished)
    while parts:
        yield parts.popleft()
    if failure is not None:
        raise failure
    if outcome.status != "completed":
        raise RuntimeError("a streamed step cannot be interrupted: it is always safe to run again")
    if outcome.replayed:
        for part in result.replay(outcome.value):
            yield part
