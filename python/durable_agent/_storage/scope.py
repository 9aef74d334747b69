"""`JournalScope`: one run's view of a checkpoint-mode runtime, written once over a storage backend.

Every runtime (memory, SQLite, Postgres) supplies a `JournalBackend` (plain storage with
epoch-guarded writes); the rules of `step` live here, once:

* an ``unsafe`` step's ``pending`` record is durable before its handler starts; a ``safe``
  step writes none unless ``mark_started``;
* ``step`` returns only once the ``done``/``failed`` record is durable, with the tool-state
  ops the handler staged committed in the same write;
* a control error (suspension, takeover, cancellation) is not recorded: the step stays as it was;
* a record found answers instead of the handler: ``done`` → completed (replayed, JSON form),
  ``failed`` → the rebuilt error, ``pending``+``safe`` → runs again, ``pending``+``unsafe`` →
  interrupted, another fingerprint → interrupted.

Fewer commits, same rules: a step asked to ``defer_done`` (the model call, and the only tool call
of a batch) keeps its ``done`` record in the scope until the scope's next write, which carries it
in the same transaction: `begin` (the ``pending`` records of a batch of unsafe tools, written
together before any tool of the batch runs) or the checkpoint commit that follows
(`commit_deferred`). Its caller acts on the value only after that write: no tool runs before a
deferred model answer is durable, and the loop streams a deferred tool result only once its
checkpoint committed. A deferred record lost to a process death means a model step runs again
and an unsafe tool call is reported interrupted, as when the death comes before its own write.
The scope reads its run's records, and which of its steps have stream partials stored, once and
then keeps them (its lease makes it their only writer): a finished step that streamed nothing
deletes no partials. Of a record it wrote itself it keeps only the key: a step asked again reads
its record back, so a long run (or a thousand runs at once) does not keep every result alive.

What the scope keeps is true only while its lease is. So a step about to run (no record answers
it) first asks the lease whether it is still trusted (`LeaseGuard`; the rule is `leases`': a
clock read, no round trip) and, when it is not (the process stalled past half of it), confirms
it against storage first: if another process took the run over meanwhile, the step raises
`StaleEpochError` instead of calling the model, or running the tool, for a step the new owner
may have run already.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._errors import CodecError, ScopeClosedError, StepFailedError, is_control_error
from .._kernels import kernels
from .keys import run_key_prefix
from .records import (
    NO_DEFERRED,
    AwakeableRecord,
    DeferredSteps,
    StepCompleted,
    StepErrorRecord,
    StepInterrupted,
    StepOutcome,
    StepRecord,
    StepRequest,
    StepStatus,
    StreamPartialRecord,
    ToolStateOp,
)

logger = logging.getLogger("durable_agent")


@dataclass(slots=True)
class StepContext:
    """What a running step gets: its request, the caller's live half, and a way to stage tool state."""

    request: StepRequest
    signal: Any = None
    on_progress: Callable[[dict[str, str]], Awaitable[None]] | None = None
    staged: list[ToolStateOp] = field(default_factory=list)

    def stage_tool_state(self, ops: Iterable[ToolStateOp]) -> None:
        """Stage ops to commit with this step's done record (a failed step commits none)."""
        self.staged.extend(ops)


@dataclass(frozen=True, slots=True)
class StepLive:
    """The live half of a step: never stored; a replayed step gets a fresh one from the resumed loop."""

    signal: Any = None
    mark_started: bool = False
    on_progress: Callable[[dict[str, str]], None] | None = None
    defer_done: bool = False  # keep the done record for the scope's next write (see the module docs)


DEFER_DONE = StepLive(defer_done=True)
"""The live half of a step whose done record rides on the run's next write, with no commit of its own
(a model call, a lone tool call, a tool listing)."""


StepRun = Callable[[StepContext], Awaitable[Any]]
"""What a step runs when no record answers it: the model call or the tool's own code."""


@dataclass(frozen=True, slots=True)
class AwakeableOutcome:
    """How an awakeable settled: resolved with `value` (which may be None), or timed out."""

    timed_out: bool
    value: Any = None


@dataclass(frozen=True, slots=True)
class DurableAwakeable:
    """A wait a resumer ends: hand `id` to it; await `wait()` for the outcome.

    `settled` is set when the awakeable was already resolved as it was asked for (a resumed
    run whose answer arrived meanwhile): the caller may skip announcing the wait.
    """

    id: str
    wait: Callable[[], Awaitable[AwakeableOutcome]]
    settled: AwakeableOutcome | None = None


class JournalBackend(Protocol):
    """Storage a checkpoint-mode runtime provides. Writes with an epoch raise `StaleEpochError` when fenced."""

    async def get_step(self, session_id: str, key: str) -> StepRecord | None: ...

    async def put_steps(
        self, records: Sequence[StepRecord], *, epoch: int | None, streamed: Collection[str] | None = None
    ) -> None:
        """Upsert `records`; a finished one drops its step's stream partials.

        `streamed`: the keys among `records` whose step may have partials stored (the others
        have none: their delete is skipped); None: any of them may.
        """
        ...

    async def run_steps(self, session_id: str, run_id: str) -> list[StepRecord]: ...

    async def add_partial(self, record: StreamPartialRecord, *, epoch: int | None) -> None: ...

    async def run_partials(self, session_id: str, run_id: str) -> list[StreamPartialRecord]: ...

    async def awakeable_for(self, session_id: str, key: str, new_id: str, deadline: int | None,
                            *, epoch: int | None) -> AwakeableRecord: ...

    async def get_awakeable(self, awakeable_id: str) -> AwakeableRecord | None: ...

    async def wait_for_change(self, timeout: float) -> None: ...


class LeaseGuard(Protocol):
    """A run's lease as its steps see it (the rule is `durable_agent._storage.leases`')."""

    def trusted(self, session_id: str, epoch: int) -> bool:
        """True when the lease at `epoch` was confirmed recently enough that a step may run without asking."""
        ...

    async def confirm(self, session_id: str, epoch: int) -> None:
        """Confirm (renew) the lease at `epoch` against storage; `StaleEpochError` when another process took it."""
        ...


def json_form(value: Any, key: str) -> Any:
    """The value as it is stored (the codec's data model); what the form loses is logged."""
    try:
        stored = kernels.decode(kernels.encode(value))
    except CodecError as exc:
        logger.warning("step %s: its result cannot be stored as data (%s); storing its repr", key, exc)
        return repr(value)
    if stored != value:
        logger.warning("step %s: its result changes when stored as data (tuples become lists)", key)
    return stored


def _typed(exc: BaseException, name: str, kind: type) -> Any:
    value = getattr(exc, name, None)
    if kind is bool:
        return value if isinstance(value, bool) else None
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def error_record(exc: BaseException) -> StepErrorRecord:
    """What is stored of a handler's error: its class name, message, and the fields the loop classifies on."""
    rebuilt = isinstance(exc, StepFailedError)
    data = getattr(exc, "data", None)
    return StepErrorRecord(
        name=exc.name if isinstance(exc, StepFailedError) else type(exc).__name__,
        message=str(exc),
        code=_typed(exc, "error_code" if rebuilt else "code", str),
        status=_typed(exc, "status", int),
        retryable=_typed(exc, "retryable", bool),
        data=json_form(data, "error data") if data is not None else None,
        decision=getattr(exc, "durable_decision", None),
    )


def rebuilt_error(record: StepErrorRecord) -> StepFailedError:
    return StepFailedError(record.name, record.message, error_code=record.code, status=record.status,
                           retryable=record.retryable, data=record.data, durable_decision=record.decision)


class JournalScope:
    """A `RunScope` in checkpoint mode over a `JournalBackend`. Open it with `DurableRuntime.open_run`."""

    def __init__(
        self,
        backend: JournalBackend,
        *,
        session_id: str,
        run_id: str,
        epoch: int | None,
        is_control_error: Callable[[BaseException], bool],
        clock: Callable[[], int],
        fresh: bool = False,
        lease: LeaseGuard | None = None,
    ) -> None:
        """`fresh`: a run started by this leg, whose records are known to be none (not read). `lease`: the
        lease `epoch` is of, confirmed before a step runs once it is no longer trusted (module docs)."""
        self.session_id = session_id
        self.run_id = run_id
        self.epoch = epoch
        self._backend = backend
        self._lease = lease
        self._is_control_error = is_control_error
        self._clock = clock
        self._closed = False
        self._prefix = run_key_prefix(run_id)
        # What the scope keeps of its run, and what each is true for. All of it holds only while the
        # lease does (no other process writes the run meanwhile), and each is changed by this class's
        # own methods alone, whatever order the loop calls them in:
        # * `_records`: the run's step records, read at the first step asked (`fresh`: known to be none),
        #   then kept as this scope changes them: a record only this scope has (deferred) is kept whole;
        #   one it wrote durably is dropped, its key going to `_stored` (`_remember`).
        # * `_stored`: keys this scope wrote durably; a step asked again reads its record back.
        # * `_earlier_partials`: keys with stream partials stored before this scope (read with
        #   `_records`); a finished step's write deletes its partials only when it may have some.
        # * `_partial_seq`: the next partial's number of each step that streamed in this scope.
        # * `_deferred`: done records no write carried yet; the next write takes them (`_write`,
        #   `commit_deferred`), and `close` writes what is left.
        # * `_begun`: unsafe steps whose pending record `begin` wrote; their `step` writes none.
        self._records: dict[str, StepRecord] | None = {} if fresh else None
        self._stored: set[str] = set()
        self._earlier_partials: set[str] = set()
        self._partial_seq: dict[str, int] = {}
        self._deferred: list[StepRecord] = []
        self._begun: set[str] = set()

    # ---------------------------------------------------------------- steps

    async def step(self, request: StepRequest, run: StepRun | None = None, live: StepLive | None = None) -> StepOutcome:
        """Run `run` once for `request`, or answer from its record (see the module docs).

        `run` may be None only where a record must answer (a replay-only caller); without a
        record it raises `ScopeClosedError`.
        """
        if self._closed:
            raise ScopeClosedError(f"the scope of run {self.run_id!r} is closed")
        live = live or StepLive()
        begun = request.key in self._begun  # its pending record is this leg's: nothing to answer
        record = None if begun else await self._record(request.key)
        if record is not None:
            if request.fingerprint is not None and record.fingerprint != request.fingerprint:
                return StepInterrupted()
            if record.status == "done":
                return StepCompleted(record.result, replayed=True, tool_state=record.tool_state or ())
            if record.status == "failed":
                assert record.error is not None
                raise rebuilt_error(record.error)
            if record.replay == "unsafe":
                return StepInterrupted()
        if run is None:
            raise ScopeClosedError(f"step {request.key!r} of run {self.run_id!r} has no record and nothing to run")
        lease, epoch = self._lease, self.epoch
        if lease is not None and epoch is not None and not lease.trusted(self.session_id, epoch):
            await lease.confirm(self.session_id, epoch)
        if (request.replay == "unsafe" or live.mark_started) and not begun:
            await self._put(request, "pending")
        self._begun.discard(request.key)
        context = StepContext(request, live.signal, self._progress_writer(request.key, live.on_progress))
        try:
            value = await run(context)
        except BaseException as exc:
            if not isinstance(exc, Exception) or is_control_error(exc) or self._is_control_error(exc):
                raise
            await self._put(request, "failed", error=error_record(exc))
            raise
        ops = tuple(context.staged)
        result = json_form(value, request.key)
        if live.defer_done:
            done = self._record_of(request, "done", result=result, tool_state=ops)
            self._deferred.append(done)
            self._remember(done, durable=False)
        else:
            await self._put(request, "done", result=result, tool_state=ops)
        return StepCompleted(value, replayed=False, tool_state=ops)

    async def begin(self, requests: Sequence[StepRequest]) -> None:
        """Write the pending records of a batch of unsafe steps, and the deferred records, in one transaction.

        Call it before any step of the batch runs (every tool phase of the loop does, so a
        deferred model answer is durable before a tool acts on it). A step begun here skips its
        own pending write. Steps that already have a record are left to `step` to answer.
        """
        fresh = [r for r in requests if r.replay == "unsafe" and await self._record(r.key) is None]
        if not fresh and not self._deferred:
            return
        await self._write([self._record_of(r, "pending") for r in fresh])
        self._begun.update(r.key for r in fresh)

    async def commit_deferred(self, write: Callable[[DeferredSteps], Awaitable[None]]) -> None:
        """Await `write`, a commit outside the scope (the checkpoint's), carrying the records deferred so far.

        They are durable once it returns. If it fails (a save that fails is logged and the run goes
        on), the scope's next write carries them, ahead of any deferred since; if it lost the lease,
        the run stops, and they are left as they are.
        """
        taken, self._deferred = tuple(self._deferred), []
        try:
            await write(DeferredSteps(taken, self._streamed(taken)) if taken else NO_DEFERRED)
        except Exception as exc:
            if taken and not is_control_error(exc):
                self._deferred[:0] = taken  # written again, if the commit did land: the same upserts
            raise
        self._written(taken)

    async def _record(self, key: str) -> StepRecord | None:
        if not key.startswith(self._prefix):  # another run's step: ask the backend
            return await self._backend.get_step(self.session_id, key)
        if self._records is None:
            self._records = {r.key: r for r in await self._backend.run_steps(self.session_id, self.run_id)}
            self._earlier_partials = {p.step_key for p in await self._backend.run_partials(self.session_id, self.run_id)}
        record = self._records.get(key)
        if record is None and key in self._stored:  # written by this scope, asked again: rare
            return await self._backend.get_step(self.session_id, key)
        return record

    def _streamed(self, records: Sequence[StepRecord]) -> set[str] | None:
        """The keys of `records` whose step may have partials stored; None when the scope cannot tell."""
        if self._records is None:
            return None
        return {
            r.key for r in records
            if r.key in self._partial_seq or r.key in self._earlier_partials or not r.key.startswith(self._prefix)
        }

    def _remember(self, record: StepRecord, *, durable: bool) -> None:
        """Keep what the map of this run's records must answer for `record`, once that map was read (never
        start one empty): the record while only this scope has it; once `durable`, only its key (a step
        asked again reads its record back). Every result kept alive would grow a long run, and a server
        holding a thousand runs, by another record at every step."""
        if self._records is None or not record.key.startswith(self._prefix):
            return
        if durable:
            self._records.pop(record.key, None)
            self._stored.add(record.key)
        else:
            self._records[record.key] = record

    def _record_of(self, request: StepRequest, status: StepStatus, **fields: Any) -> StepRecord:
        return StepRecord(self.session_id, self.run_id, request.key, request.kind, request.replay,
                          status, request.fingerprint, **fields)

    async def _put(self, request: StepRequest, status: StepStatus, **fields: Any) -> None:
        await self._write([self._record_of(request, status, **fields)])

    async def _write(self, records: list[StepRecord]) -> None:
        """Write `records` with the deferred ones, in one transaction."""
        batch, self._deferred = [*self._deferred, *records], []
        if not batch:
            return
        await self._backend.put_steps(batch, epoch=self.epoch, streamed=self._streamed(batch))
        self._written(batch)

    def _written(self, records: Iterable[StepRecord]) -> None:
        """`records` are durable now: a finished one's partials were deleted with it."""
        for record in records:
            self._remember(record, durable=True)
            if record.status != "pending":
                self._earlier_partials.discard(record.key)

    def _progress_writer(
        self, key: str, forward: Callable[[dict[str, str]], None] | None
    ) -> Callable[[dict[str, str]], Awaitable[None]]:
        async def on_progress(progress: dict[str, str]) -> None:
            seq = self._partial_seq.get(key, 0)
            self._partial_seq[key] = seq + 1
            is_text = progress["type"] == "text"
            await self._backend.add_partial(
                StreamPartialRecord(self.session_id, self.run_id, key, seq,
                                    progress["delta"] if is_text else "", None if is_text else progress["delta"]),
                epoch=self.epoch,
            )
            if forward is not None:
                forward(progress)

        return on_progress

    async def stored_steps(self) -> list[StepRecord]:
        return await self._backend.run_steps(self.session_id, self.run_id)

    async def stored_partials(self) -> list[StreamPartialRecord]:
        return await self._backend.run_partials(self.session_id, self.run_id)

    # --------------------------------------------------------- awakeables

    async def awakeable(
        self, key: str, *, timeout_ms: int | None = None, awakeable_id: str | None = None
    ) -> DurableAwakeable:
        """Park on an awakeable keyed by `key`; a resumed run asking with the same key gets the same one.

        `awakeable_id` names a new awakeable (default: a fresh uuid), e.g. an approval id the
        resumer already knows; it is ignored when the key already has one.
        """
        if self._closed:
            raise ScopeClosedError(f"the scope of run {self.run_id!r} is closed")
        deadline = self._clock() + timeout_ms if timeout_ms and timeout_ms > 0 else None
        new_id = awakeable_id or self.uuid()
        record = await self._backend.awakeable_for(self.session_id, key, new_id, deadline, epoch=self.epoch)
        settled = AwakeableOutcome(False, record.value) if record.resolved else None

        async def wait() -> AwakeableOutcome:
            while True:
                current = await self._backend.get_awakeable(record.id)
                if current is not None and current.resolved:
                    return AwakeableOutcome(False, current.value)
                now = self._clock()
                if record.deadline is not None and now >= record.deadline:
                    return AwakeableOutcome(True)
                if self._closed:
                    raise ScopeClosedError(f"the scope of run {self.run_id!r} closed while waiting")
                remaining = (record.deadline - now) / 1000 if record.deadline is not None else 1.0
                await self._backend.wait_for_change(min(1.0, max(0.001, remaining)))

        return DurableAwakeable(record.id, wait, settled)

    # ------------------------------------------------------------- helpers

    def now(self) -> int:
        return self._clock()

    def uuid(self) -> str:
        return str(uuid.uuid4())

    async def sleep(self, ms: int, signal: Any = None) -> None:
        """Wait `ms` milliseconds; a set `signal` (anything with `is_set()`) ends the wait early."""
        end = asyncio.get_running_loop().time() + ms / 1000
        while (left := end - asyncio.get_running_loop().time()) > 0:
            if signal is not None and signal.is_set():
                return
            await asyncio.sleep(min(left, 0.05) if signal is not None else left)

    @staticmethod
    async def gather(*aws: Awaitable[Any]) -> list[Any]:
        """All of `aws`, in order; the first failure propagates (`Promise.all`)."""
        return list(await asyncio.gather(*aws))

    @staticmethod
    async def gather_settled(*aws: Awaitable[Any]) -> list[Any]:
        """Every outcome, value or exception, in order (`Promise.allSettled`)."""
        return list(await asyncio.gather(*aws, return_exceptions=True))

    @staticmethod
    async def race(*aws: Awaitable[Any]) -> Any:
        """The first to finish; the others are cancelled (`Promise.race`)."""
        tasks = [asyncio.ensure_future(a) for a in aws]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            return next(iter(done)).result()
        finally:
            for task in tasks:
                task.cancel()

    async def close(self) -> None:
        """End the scope: deferred records are written (best effort), later steps raise, waits stop. Idempotent."""
        if self._deferred and not self._closed:
            try:
                await self._write([])
            except Exception as exc:  # noqa: BLE001 - a deferred record lost only means its step runs again
                logger.info("run %s: deferred step records not written (%r)", self.run_id, exc)
        self._closed = True
