"""The runtime adapters written once over row-level storage: lease, queue, submissions, run book, tool state.

A runtime supplies `RuntimeRows` (plain reads and epoch-fenced writes of its rows, as
`JournalBackend` is for a run's steps); the rules — who may claim a lease, which runs are
resumable, when a send conflicts, which epoch guards a queue write — live here, once, and
`StoredRuntime` puts them together with a `JournalScope` per run. The memory runtime's rows
are dicts, the SQL runtimes' are tables (`durable_agent.backends._sql.journal`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

from .._errors import StaleEpochError, SubmissionConflictError, is_control_error
from .leases import Fences, OwnedRuntime, claimed_row, is_listed_resumable, may_claim
from .records import (
    AwakeableRecord,
    LeaseClaim,
    LeaseRow,
    ResumableRun,
    RunOwner,
    RunTransition,
    StepRecord,
    StreamPartialRecord,
)
from .scope import JournalBackend, JournalScope


class RuntimeRows(JournalBackend, Protocol):
    """A runtime's durable rows. Writes with an epoch raise `StaleEpochError` when the lease moved on."""

    async def lease_row(self, session_id: str) -> LeaseRow | None: ...

    async def change_lease(
        self, session_id: str, change: Callable[[LeaseRow], LeaseRow | None], *, epoch: int | None = None
    ) -> tuple[LeaseRow, bool]:
        """Apply `change` (pure) to the session's row, read so that no other change interleaves.

        A missing row reads as `LeaseRow()`. `change` returns the new row or None to leave it;
        the answer is the row as it is now and whether it changed.
        """
        ...

    async def marked_leases(self, session_id: str | None) -> list[tuple[str, LeaseRow, list[str]]]:
        """Sessions leased at least once with a run marked, their rows and unresolved awakeable keys."""
        ...

    async def queue(self, session_id: str) -> list[Any]: ...

    async def put_queue(self, session_id: str, entries: list[Any], *, epoch: int | None) -> None: ...

    async def add_submission(self, session_id: str, request_id: str, fingerprint: str) -> tuple[str, Any] | None:
        """Record a send: None when it is new, else the earlier send's (fingerprint, result)."""
        ...

    async def complete_submission(self, session_id: str, request_id: str, result: Any) -> None:
        """Store a send's result; None drops the send."""
        ...

    async def tool_state(self, session_id: str, key: str | None) -> dict[str, Any]: ...

    async def last_run(self, session_id: str) -> str | None: ...

    async def put_last_run(self, session_id: str, run_id: str, *, epoch: int | None) -> None: ...

    async def steps(self, run_id: str | None) -> list[StepRecord]: ...

    async def partials(self, run_id: str | None) -> list[StreamPartialRecord]: ...

    async def awakeables(self) -> list[AwakeableRecord]: ...

    async def find_awakeable(self, session_id: str, key: str) -> AwakeableRecord | None: ...

    async def resolve_awakeable(self, awakeable_id: str, value: Any) -> bool:
        """Resolve once (later resolutions keep the first value); False when there is no such awakeable."""
        ...

    async def commit(self, transition: RunTransition) -> None:
        """Apply `transition` at once, fenced by its epoch."""
        ...


class StoredLease:
    """`DurableLease` over a runtime's rows, for one runtime (one "process"); the rules are `leases`'."""

    def __init__(self, runtime: StoredRuntime[Any]) -> None:
        self._runtime = runtime
        self._rows = runtime.backend
        self._fences = runtime.fences

    async def claim(
        self,
        session_id: str,
        *,
        stale_at: int,
        owner: RunOwner | None = None,
        on_stale: Callable[[StaleEpochError], None] | None = None,
    ) -> LeaseClaim:
        me, now, fences = owner or self._runtime.owner, self._runtime.clock(), self._runtime.fences
        sent_at = time.monotonic()
        holder = fences.hold(session_id, me)
        if holder is not None:  # this runtime runs the session now: a claim would fence that run out
            return LeaseClaim(False, owner=holder)

        def take(row: LeaseRow) -> LeaseRow | None:
            return claimed_row(row, me, now) if may_claim(row, me, stale_at=stale_at, now=now) else None

        claimed = False
        try:
            row, claimed = await self._rows.change_lease(session_id, take)
        finally:
            if not claimed:
                fences.unheld(session_id)
        if not claimed:
            return LeaseClaim(False, owner=row.owner)
        fences.claimed(session_id, row.epoch, on_stale, sent_at=sent_at, stale_after_ms=max(0, now - stale_at))
        return LeaseClaim(True, epoch=row.epoch, resumable_run=row.resumable_run)

    async def renew(self, session_id: str, epoch: int) -> bool:
        now, sent_at = self._runtime.clock(), time.monotonic()

        def renewed(row: LeaseRow) -> LeaseRow | None:
            return replace(row, renewed_at=now) if row.epoch == epoch and not row.released else None

        if not (await self._rows.change_lease(session_id, renewed))[1]:
            return False
        self._fences.renewed(session_id, epoch, sent_at)
        return True

    def trusted(self, session_id: str, epoch: int) -> bool:
        """True when this runtime confirmed the lease at `epoch` recently enough for a step to run on it
        without asking the storage (the rule: `leases`)."""
        return self._fences.trusted(session_id, epoch, time.monotonic())

    async def confirm(self, session_id: str, epoch: int) -> None:
        """Renew the lease at `epoch` before a step runs on it: `StaleEpochError` when another process took it."""
        if not await self.renew(session_id, epoch):
            error = StaleEpochError(session_id, epoch)
            self._fences.refused(error)
            raise error

    async def release(self, session_id: str, epoch: int) -> None:
        def released(row: LeaseRow) -> LeaseRow | None:
            return replace(row, released=True) if row.epoch == epoch and not row.released else None

        try:
            await self._rows.change_lease(session_id, released)
        finally:
            self._runtime.lease_released(session_id, epoch)

    async def epoch(self, session_id: str) -> int | None:
        row = await self._rows.lease_row(session_id)
        return row.epoch if row is not None and row.epoch > 0 else None

    async def mark_resumable(self, session_id: str, run_id: str | None, epoch: int | None) -> None:
        """Mark (or with None, unmark) the session's run as in progress, so `resumable` can list it."""

        def marked(row: LeaseRow) -> LeaseRow | None:
            return replace(row, resumable_run=run_id)

        await self._rows.change_lease(session_id, marked, epoch=epoch)

    async def resumable_run(self, session_id: str) -> str | None:
        """The session's run marked in progress, if any."""
        row = await self._rows.lease_row(session_id)
        return row.resumable_run if row is not None else None

    async def resumable(self, *, stale_at: int, session_id: str | None = None) -> list[ResumableRun]:
        now = self._runtime.clock()
        return [
            ResumableRun(sid, row.resumable_run, row.epoch)
            for sid, row, unresolved in await self._rows.marked_leases(session_id)
            if row.resumable_run is not None and is_listed_resumable(row, unresolved, stale_at=stale_at, now=now)
        ]


class StoredQueueStore:
    """The session's type-ahead queue; a write is fenced by this runtime's claim of the session."""

    def __init__(self, runtime: StoredRuntime[Any]) -> None:
        self._runtime = runtime

    async def read(self, session_id: str) -> list[Any]:
        return await self._runtime.backend.queue(session_id)

    async def write(self, session_id: str, entries: list[Any]) -> None:
        runtime = self._runtime
        await runtime.backend.put_queue(session_id, list(entries), epoch=runtime.fences.epoch(session_id))


class StoredSubmissionStore:
    """Client request ids of sends: a retried send with the same id gets the first send's outcome."""

    def __init__(self, runtime: StoredRuntime[Any]) -> None:
        self._rows = runtime.backend

    async def claim(self, session_id: str, request_id: str, fingerprint: str) -> tuple[bool, Any]:
        """(True, None) when this send is new; (False, earlier result) for a retry of the same input."""
        earlier = await self._rows.add_submission(session_id, request_id, fingerprint)
        if earlier is None:
            return True, None
        if earlier[0] != fingerprint:
            raise SubmissionConflictError(session_id, request_id)
        return False, earlier[1]

    async def complete(self, session_id: str, request_id: str, result: Any) -> None:
        """Store the send's result; None drops the claim so a retry runs again."""
        await self._rows.complete_submission(session_id, request_id, result)


class StoredToolStateStore:
    """Tool state of one session, as committed with the ``done`` records of its steps."""

    def __init__(self, runtime: StoredRuntime[Any], session_id: str) -> None:
        self._rows, self._session_id = runtime.backend, session_id

    async def all(self) -> dict[str, Any]:
        return await self._rows.tool_state(self._session_id, None)

    async def get(self, key: str, default: Any = None) -> Any:
        return (await self._rows.tool_state(self._session_id, key)).get(key, default)


class StoredRunBook:
    """Which run of each session is the latest (its checkpoint holds the session's history)."""

    def __init__(self, runtime: StoredRuntime[Any]) -> None:
        self._rows = runtime.backend

    async def last(self, session_id: str) -> str | None:
        return await self._rows.last_run(session_id)

    async def set_last(self, session_id: str, run_id: str, epoch: int | None) -> None:
        await self._rows.put_last_run(session_id, run_id, epoch=epoch)


@dataclass(frozen=True, slots=True)
class StoredInspector:
    """Read access to the stored steps, partials and awakeables, for tests and diagnostics."""

    rows: RuntimeRows

    async def steps(self, run_id: str | None = None) -> list[StepRecord]:
        return await self.rows.steps(run_id)

    async def partials(self, run_id: str | None = None) -> list[StreamPartialRecord]:
        return await self.rows.partials(run_id)

    async def awakeables(self) -> list[AwakeableRecord]:
        return await self.rows.awakeables()


Checkpoints = TypeVar("Checkpoints")


@dataclass(frozen=True, slots=True)
class StoredStores(Generic[Checkpoints]):
    """Everything a run persists, behind one runtime."""

    runtime: StoredRuntime[Checkpoints]

    @property
    def checkpoints(self) -> Checkpoints:
        return self.runtime.checkpoints

    @property
    def queue(self) -> StoredQueueStore:
        return StoredQueueStore(self.runtime)

    @property
    def submissions(self) -> StoredSubmissionStore:
        return StoredSubmissionStore(self.runtime)

    @property
    def runs(self) -> StoredRunBook:
        return StoredRunBook(self.runtime)

    def tool_state(self, session_id: str) -> StoredToolStateStore:
        return StoredToolStateStore(self.runtime, session_id)


class StoredRuntime(OwnedRuntime, Generic[Checkpoints]):
    """A checkpoint-mode `DurableRuntime` over `RuntimeRows` and a checkpoint store.

    One instance is one "process": its own owner token and fences. Several instances over
    one storage are several processes on it. `backend` must tell `fences.refused` of every
    write it refuses as stale.
    """

    mode = "checkpoint"

    def __init__(self, backend: RuntimeRows, checkpoints: Checkpoints, fences: Fences, clock: Callable[[], int]) -> None:
        self.backend = backend
        self.checkpoints = checkpoints
        self.fences = fences
        self.clock = clock
        self.lease = StoredLease(self)
        self.stores = StoredStores(self)
        self.inspect = StoredInspector(backend)

    def is_control_error(self, error: BaseException) -> bool:
        return is_control_error(error)

    def lease_released(self, session_id: str, epoch: int) -> None:
        """This runtime let go of the session's lease at `epoch` (its writes are no longer fenced by it)."""
        self.fences.released(session_id, epoch)

    async def open_run(
        self, *, session_id: str, run_id: str, epoch: int | None = None, fresh: bool = False
    ) -> JournalScope:
        """A run's scope; its writes are guarded by `epoch`, by default this runtime's claim of the session.

        `fresh`: the run was started by this leg, so the scope does not read its (absent) records.
        A step confirms the lease against storage before it runs once this runtime's last claim or
        renewal of it is no longer trusted (`leases`).
        """
        return JournalScope(
            self.backend,
            session_id=session_id,
            run_id=run_id,
            epoch=epoch if epoch is not None else self.fences.epoch(session_id),
            is_control_error=self.is_control_error,
            clock=self.clock,
            fresh=fresh,
            lease=self.lease,
        )

    async def commit(self, transition: RunTransition) -> None:
        """Apply `transition` at once, with the lease's epoch checked inside it (`StaleEpochError` when stale)."""
        await self.backend.commit(transition)

    async def resolve_awakeable(self, awakeable_id: str, value: Any) -> bool:
        """Resolve from the resumer's side, also while no process runs the run. False: no such id."""
        return await self.backend.resolve_awakeable(awakeable_id, value)

    async def find_awakeable(self, session_id: str, key: str) -> AwakeableRecord | None:
        return await self.backend.find_awakeable(session_id, key)
