"""The memory runtime: every durable table in a `MemoryDurableState` object, for tests and single processes.

Several runtimes may share one state, standing in for several processes on one database:
each runtime has its own lease owner token and its own fences, the state is the durable part.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._util import wall_clock_ms
from ..errors import StaleEpochError, SubmissionConflictError, is_control_error
from ..session import InMemorySessionStore
from .leases import (
    RUN_OWNER_HOLD_MS,
    Fences,
    OwnedRuntime,
    claimed_row,
    is_listed_resumable,
    is_run_owner_dead,
    is_run_owner_holding,
    may_claim,
)
from .records import (
    AwakeableRecord,
    LeaseClaim,
    LeaseRow,
    ResumableRun,
    RunOwner,
    RunTransition,
    StepRecord,
    StreamPartialRecord,
    apply_tool_state,
)
from .scope import JournalScope

__all__ = [  # the lease helpers stay importable from here, where they first lived
    "RUN_OWNER_HOLD_MS",
    "MemoryDurableState",
    "MemoryRuntime",
    "apply_tool_state",
    "create_memory_durable_state",
    "create_memory_runtime",
    "is_run_owner_dead",
    "is_run_owner_holding",
    "memory_runtime",
]


@dataclass(slots=True)
class MemoryDurableState:
    """Sessions' steps, partials, awakeables, leases, queues, submissions and tool state."""

    steps: dict[tuple[str, str], StepRecord] = field(default_factory=dict)
    partials: list[StreamPartialRecord] = field(default_factory=list)
    awakeables: dict[str, AwakeableRecord] = field(default_factory=dict)
    leases: dict[str, LeaseRow] = field(default_factory=dict)
    queues: dict[str, list[Any]] = field(default_factory=dict)
    submissions: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    tool_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_runs: dict[str, str] = field(default_factory=dict)
    session_store: InMemorySessionStore = field(default_factory=InMemorySessionStore)

    def clone(self) -> MemoryDurableState:
        """A copy of the state as it is now; later writes to either never reach the other."""
        return copy.deepcopy(self)

    @property
    def inspect(self) -> MemoryInspector:
        return MemoryInspector(self)


def create_memory_durable_state() -> MemoryDurableState:
    """An empty state for `memory_runtime`."""
    return MemoryDurableState()


@dataclass(frozen=True, slots=True)
class MemoryInspector:
    """Read access to what the state holds, for tests and diagnostics."""

    state: MemoryDurableState

    async def steps(self, run_id: str | None = None) -> list[StepRecord]:
        return [r for r in self.state.steps.values() if run_id is None or r.run_id == run_id]

    async def partials(self, run_id: str | None = None) -> list[StreamPartialRecord]:
        return [p for p in self.state.partials if run_id is None or p.run_id == run_id]

    async def awakeables(self) -> list[AwakeableRecord]:
        return list(self.state.awakeables.values())


class _MemoryBackend:
    """`JournalBackend` over a `MemoryDurableState`, guarding writes with the session's lease epoch."""

    def __init__(self, state: MemoryDurableState, on_stale: Callable[[StaleEpochError], None]) -> None:
        self.state = state
        self._on_stale = on_stale

    def guard(self, session_id: str, epoch: int | None) -> None:
        if epoch is None:
            return
        lease = self.state.leases.get(session_id)
        if lease is None or lease.epoch != epoch:
            error = StaleEpochError(session_id, epoch)
            self._on_stale(error)
            raise error

    async def get_step(self, session_id: str, key: str) -> StepRecord | None:
        return self.state.steps.get((session_id, key))

    async def put_steps(self, records: Sequence[StepRecord], *, epoch: int | None) -> None:
        for record in records:
            self.guard(record.session_id, epoch)
        for record in records:
            self.write_step(record)

    def write_step(self, record: StepRecord) -> None:
        if record.status == "done" and record.tool_state:
            apply_tool_state(self.state.tool_state.setdefault(record.session_id, {}), record.tool_state)
        self.state.steps[(record.session_id, record.key)] = record
        if record.status != "pending":
            self.state.partials = [
                p for p in self.state.partials if not (p.session_id == record.session_id and p.step_key == record.key)
            ]

    async def run_steps(self, session_id: str, run_id: str) -> list[StepRecord]:
        return [r for r in self.state.steps.values() if r.session_id == session_id and r.run_id == run_id]

    async def add_partial(self, record: StreamPartialRecord, *, epoch: int | None) -> None:
        self.guard(record.session_id, epoch)
        self.state.partials.append(record)

    async def run_partials(self, session_id: str, run_id: str) -> list[StreamPartialRecord]:
        return [p for p in self.state.partials if p.session_id == session_id and p.run_id == run_id]

    async def awakeable_for(
        self, session_id: str, key: str, new_id: str, deadline: int | None, *, epoch: int | None
    ) -> AwakeableRecord:
        for record in self.state.awakeables.values():
            if record.session_id == session_id and record.key == key:
                return record
        self.guard(session_id, epoch)
        record = AwakeableRecord(new_id, session_id, key, deadline=deadline)
        self.state.awakeables[new_id] = record
        return record

    async def get_awakeable(self, awakeable_id: str) -> AwakeableRecord | None:
        return self.state.awakeables.get(awakeable_id)

    async def wait_for_change(self, timeout: float) -> None:
        await asyncio.sleep(min(timeout, 0.01))


class MemoryLease:
    """`DurableLease` over the state's lease rows, for one runtime (one "process"); rules in `leases`."""

    def __init__(self, runtime: MemoryRuntime) -> None:
        self._runtime = runtime

    @property
    def _leases(self) -> dict[str, LeaseRow]:
        return self._runtime.state.leases

    async def claim(self, session_id: str, *, stale_at: int, owner: RunOwner | None = None,
                    on_stale: Callable[[StaleEpochError], None] | None = None) -> LeaseClaim:
        me = owner or self._runtime.owner
        row = self._leases.get(session_id) or LeaseRow()
        now = self._runtime.clock()
        if not may_claim(row, me, stale_at=stale_at, now=now):
            return LeaseClaim(False, owner=row.owner)
        row = self._leases[session_id] = claimed_row(row, me, now)
        self._runtime.fences.claimed(session_id, row.epoch, on_stale)
        return LeaseClaim(True, epoch=row.epoch)

    async def renew(self, session_id: str, epoch: int) -> bool:
        row = self._leases.get(session_id)
        if row is None or row.epoch != epoch or row.released:
            return False
        row.renewed_at = self._runtime.clock()
        return True

    async def release(self, session_id: str, epoch: int) -> None:
        row = self._leases.get(session_id)
        if row is not None and row.epoch == epoch:
            row.released = True
        self._runtime.fences.released(session_id, epoch)

    async def epoch(self, session_id: str) -> int | None:
        row = self._leases.get(session_id)
        return row.epoch if row is not None and row.epoch > 0 else None

    async def mark_resumable(self, session_id: str, run_id: str | None, epoch: int | None) -> None:
        """Mark (or with None, unmark) the session's run as in progress, so `resumable` can list it."""
        self._runtime.backend.guard(session_id, epoch)
        self._leases.setdefault(session_id, LeaseRow()).resumable_run = run_id

    async def marked_run(self, session_id: str) -> str | None:
        """The session's run marked in progress, if any."""
        row = self._leases.get(session_id)
        return row.resumable_run if row is not None else None

    async def resumable(self, *, stale_at: int, session_id: str | None = None) -> list[ResumableRun]:
        now = self._runtime.clock()
        runs = []
        for sid, row in self._leases.items():
            if session_id is not None and sid != session_id:
                continue
            unresolved = (a.key for a in self._runtime.state.awakeables.values()
                          if a.session_id == sid and not a.resolved)
            if is_listed_resumable(row, unresolved, stale_at=stale_at, now=now):
                assert row.resumable_run is not None
                runs.append(ResumableRun(sid, row.resumable_run, row.epoch))
        return runs


class MemoryQueueStore:
    def __init__(self, runtime: MemoryRuntime) -> None:
        self._runtime = runtime

    async def read(self, session_id: str) -> list[Any]:
        return list(self._runtime.state.queues.get(session_id, []))

    async def write(self, session_id: str, entries: list[Any]) -> None:
        self._runtime.backend.guard(session_id, self._runtime.fences.epoch(session_id))
        self._runtime.state.queues[session_id] = list(entries)


class MemorySubmissionStore:
    """Client request ids of sends: a retried send with the same id gets the first send's outcome."""

    def __init__(self, runtime: MemoryRuntime) -> None:
        self._runtime = runtime

    async def claim(self, session_id: str, request_id: str, fingerprint: str) -> tuple[bool, Any]:
        """(True, None) when this send is new; (False, earlier result) for a retry of the same input."""
        book = self._runtime.state.submissions
        earlier = book.get((session_id, request_id))
        if earlier is None:
            book[(session_id, request_id)] = {"fingerprint": fingerprint, "result": None, "settled": False}
            return True, None
        if earlier["fingerprint"] != fingerprint:
            raise SubmissionConflictError(session_id, request_id)
        return False, earlier["result"]

    async def settle(self, session_id: str, request_id: str, result: Any) -> None:
        """Store the send's result; None drops the claim so a retry runs again."""
        book = self._runtime.state.submissions
        if result is None:
            book.pop((session_id, request_id), None)
        elif (session_id, request_id) in book:
            book[(session_id, request_id)] = {**book[(session_id, request_id)], "result": result, "settled": True}


class MemoryToolStateStore:
    def __init__(self, runtime: MemoryRuntime, session_id: str) -> None:
        self._runtime, self._session_id = runtime, session_id

    async def all(self) -> dict[str, Any]:
        return dict(self._runtime.state.tool_state.get(self._session_id, {}))

    async def get(self, key: str, default: Any = None) -> Any:
        return self._runtime.state.tool_state.get(self._session_id, {}).get(key, default)


class MemoryRunBook:
    """Which run of each session is the latest (its checkpoint holds the session's history)."""

    def __init__(self, runtime: MemoryRuntime) -> None:
        self._runtime = runtime

    async def last(self, session_id: str) -> str | None:
        return self._runtime.state.last_runs.get(session_id)

    async def set_last(self, session_id: str, run_id: str, epoch: int | None) -> None:
        self._runtime.backend.guard(session_id, epoch)
        self._runtime.state.last_runs[session_id] = run_id


@dataclass(frozen=True, slots=True)
class MemoryStores:
    """Everything a run persists, behind one runtime."""

    runtime: MemoryRuntime

    @property
    def session(self) -> InMemorySessionStore:
        return self.runtime.state.session_store

    @property
    def queue(self) -> MemoryQueueStore:
        return MemoryQueueStore(self.runtime)

    @property
    def submissions(self) -> MemorySubmissionStore:
        return MemorySubmissionStore(self.runtime)

    @property
    def runs(self) -> MemoryRunBook:
        return MemoryRunBook(self.runtime)

    def tool_state(self, session_id: str) -> MemoryToolStateStore:
        return MemoryToolStateStore(self.runtime, session_id)


class MemoryRuntime(OwnedRuntime):
    """A checkpoint-mode `DurableRuntime` over a `MemoryDurableState`."""

    mode = "checkpoint"

    def __init__(self, state: MemoryDurableState, *, clock: Callable[[], int] = wall_clock_ms) -> None:
        self.state = state
        self.clock = clock
        self.fences = Fences()
        self.backend = _MemoryBackend(state, self.fences.refused)
        self.lease = MemoryLease(self)
        self.stores = MemoryStores(self)

    def is_control_error(self, error: BaseException) -> bool:
        return is_control_error(error)

    async def open_run(self, *, session_id: str, run_id: str, epoch: int | None = None) -> JournalScope:
        return JournalScope(self.backend, session_id=session_id, run_id=run_id,
                            epoch=epoch if epoch is not None else self.fences.epoch(session_id),
                            is_control_error=self.is_control_error, clock=self.clock)

    async def commit(self, transition: RunTransition) -> None:
        """Apply `transition` at once (nothing awaits in between, so no other task sees half of it)."""
        session_id = transition.session_id
        self.backend.guard(session_id, transition.epoch)
        for record in transition.steps:
            self.backend.write_step(record)
        if transition.checkpoint is not None:
            self.state.session_store.save(transition.checkpoint)
        if transition.last_run is not None:
            self.state.last_runs[session_id] = transition.last_run
        if transition.mark is not None or transition.unmark:
            self.state.leases.setdefault(session_id, LeaseRow()).resumable_run = transition.mark
        for key, awakeable_id in transition.awakeables:
            if not any(a.session_id == session_id and a.key == key for a in self.state.awakeables.values()):
                self.state.awakeables[awakeable_id] = AwakeableRecord(awakeable_id, session_id, key)

    async def resolve_awakeable(self, awakeable_id: str, value: Any) -> bool:
        """Resolve from the resumer's side, also while no process runs the run. False: no such id."""
        record = self.state.awakeables.get(awakeable_id)
        if record is None:
            return False
        if not record.resolved:
            self.state.awakeables[awakeable_id] = replace(record, resolved=True, value=value)
        return True

    async def find_awakeable(self, session_id: str, key: str) -> AwakeableRecord | None:
        return next((a for a in self.state.awakeables.values() if a.session_id == session_id and a.key == key), None)

    @property
    def inspect(self) -> MemoryInspector:
        return self.state.inspect


def memory_runtime(*, state: MemoryDurableState, clock: Callable[[], int] = wall_clock_ms) -> MemoryRuntime:
    """A memory runtime over `state`; several may share one state (two "processes" on one database)."""
    return MemoryRuntime(state, clock=clock)


def create_memory_runtime(*, clock: Callable[[], int] = wall_clock_ms) -> MemoryRuntime:
    """A memory runtime over a fresh state."""
    return MemoryRuntime(create_memory_durable_state(), clock=clock)
