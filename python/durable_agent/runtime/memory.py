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
from ..checkpoint_store import InMemoryCheckpointStore
from ..errors import ConfigurationError, StaleEpochError
from .leases import RUN_OWNER_HOLD_MS, Fences, is_run_owner_dead, is_run_owner_holding
from .records import (
    AwakeableRecord,
    LeaseRow,
    RunTransition,
    StepRecord,
    StreamPartialRecord,
    apply_tool_state,
)
from .stored import StoredInspector, StoredRuntime

__all__ = [  # the lease helpers stay importable from here, where they first lived
    "RUN_OWNER_HOLD_MS",
    "MemoryDurableState",
    "MemoryRuntime",
    "apply_tool_state",
    "is_run_owner_dead",
    "is_run_owner_holding",
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
    checkpoint_store: InMemoryCheckpointStore = field(default_factory=InMemoryCheckpointStore)

    def clone(self) -> MemoryDurableState:
        """A copy of the state as it is now; later writes to either never reach the other."""
        return copy.deepcopy(self)

    @property
    def inspect(self) -> StoredInspector:
        """Read access to what the state holds, for tests and diagnostics."""
        return StoredInspector(_MemoryRows(self))


class _MemoryRows:
    """`RuntimeRows` over a `MemoryDurableState`, guarding writes with the session's lease epoch.

    Nothing here awaits, so every method is atomic: no other task sees half of a write.
    """

    def __init__(self, state: MemoryDurableState, on_stale: Callable[[StaleEpochError], None] | None = None) -> None:
        self.state = state
        self._on_stale = on_stale

    def guard(self, session_id: str, epoch: int | None) -> None:
        if epoch is None:
            return
        lease = self.state.leases.get(session_id)
        if lease is None or lease.epoch != epoch:
            error = StaleEpochError(session_id, epoch)
            if self._on_stale is not None:
                self._on_stale(error)
            raise error

    async def get_step(self, session_id: str, key: str) -> StepRecord | None:
        return self.state.steps.get((session_id, key))

    async def put_steps(self, records: Sequence[StepRecord], *, epoch: int | None) -> None:
        for record in records:
            self.guard(record.session_id, epoch)
        for record in records:
            self._write_step(record)

    def _write_step(self, record: StepRecord) -> None:
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
        found = await self.find_awakeable(session_id, key)
        if found is not None:
            return found
        self.guard(session_id, epoch)
        record = AwakeableRecord(new_id, session_id, key, deadline=deadline)
        self.state.awakeables[new_id] = record
        return record

    async def get_awakeable(self, awakeable_id: str) -> AwakeableRecord | None:
        return self.state.awakeables.get(awakeable_id)

    async def wait_for_change(self, timeout: float) -> None:
        await asyncio.sleep(min(timeout, 0.01))

    async def lease_row(self, session_id: str) -> LeaseRow | None:
        row = self.state.leases.get(session_id)
        return None if row is None else replace(row)

    async def change_lease(
        self, session_id: str, change: Callable[[LeaseRow], LeaseRow | None], *, epoch: int | None = None
    ) -> tuple[LeaseRow, bool]:
        self.guard(session_id, epoch)
        row = replace(self.state.leases.get(session_id) or LeaseRow())
        new = change(row)
        if new is None:
            return row, False
        self.state.leases[session_id] = new
        return replace(new), True

    async def marked_leases(self, session_id: str | None) -> list[tuple[str, LeaseRow, list[str]]]:
        return [
            (sid, replace(row), [a.key for a in self.state.awakeables.values() if a.session_id == sid and not a.resolved])
            for sid, row in sorted(self.state.leases.items())
            if (session_id is None or sid == session_id) and row.resumable_run is not None and row.epoch > 0
        ]

    async def queue(self, session_id: str) -> list[Any]:
        return list(self.state.queues.get(session_id, []))

    async def put_queue(self, session_id: str, entries: list[Any], *, epoch: int | None) -> None:
        self.guard(session_id, epoch)
        self.state.queues[session_id] = list(entries)

    async def add_submission(self, session_id: str, request_id: str, fingerprint: str) -> tuple[str, Any] | None:
        book = self.state.submissions
        earlier = book.get((session_id, request_id))
        if earlier is None:
            book[(session_id, request_id)] = {"fingerprint": fingerprint, "result": None, "settled": False}
            return None
        return earlier["fingerprint"], earlier["result"]

    async def settle_submission(self, session_id: str, request_id: str, result: Any) -> None:
        book = self.state.submissions
        if result is None:
            book.pop((session_id, request_id), None)
        elif (session_id, request_id) in book:
            book[(session_id, request_id)] = {**book[(session_id, request_id)], "result": result, "settled": True}

    async def tool_state(self, session_id: str, key: str | None) -> dict[str, Any]:
        state = self.state.tool_state.get(session_id, {})
        return dict(state) if key is None else {key: state[key]} if key in state else {}

    async def last_run(self, session_id: str) -> str | None:
        return self.state.last_runs.get(session_id)

    async def put_last_run(self, session_id: str, run_id: str, *, epoch: int | None) -> None:
        self.guard(session_id, epoch)
        self.state.last_runs[session_id] = run_id

    async def steps(self, run_id: str | None) -> list[StepRecord]:
        return [r for r in self.state.steps.values() if run_id is None or r.run_id == run_id]

    async def partials(self, run_id: str | None) -> list[StreamPartialRecord]:
        return [p for p in self.state.partials if run_id is None or p.run_id == run_id]

    async def awakeables(self) -> list[AwakeableRecord]:
        return list(self.state.awakeables.values())

    async def find_awakeable(self, session_id: str, key: str) -> AwakeableRecord | None:
        return next((a for a in self.state.awakeables.values() if a.session_id == session_id and a.key == key), None)

    async def resolve_awakeable(self, awakeable_id: str, value: Any) -> bool:
        record = self.state.awakeables.get(awakeable_id)
        if record is None:
            return False
        if not record.resolved:
            self.state.awakeables[awakeable_id] = replace(record, resolved=True, value=value)
        return True

    async def commit(self, transition: RunTransition) -> None:
        session_id = transition.session_id
        self.guard(session_id, transition.epoch)
        for record in transition.steps:
            self._write_step(record)
        if transition.checkpoint is not None:
            self.state.checkpoint_store.save(transition.checkpoint)
        if transition.last_run is not None:
            self.state.last_runs[session_id] = transition.last_run
        if transition.mark is not None or transition.unmark:
            self.state.leases.setdefault(session_id, LeaseRow()).resumable_run = transition.mark
        for key, awakeable_id in transition.awakeables:
            if not any(a.session_id == session_id and a.key == key for a in self.state.awakeables.values()):
                self.state.awakeables[awakeable_id] = AwakeableRecord(awakeable_id, session_id, key)


class MemoryRuntime(StoredRuntime[InMemoryCheckpointStore]):
    """A checkpoint-mode `DurableRuntime` over a `MemoryDurableState` (a fresh one when `state` is None).

    Several runtimes may share one state: two "processes" on one database.
    """

    def __init__(
        self, state: MemoryDurableState | None = None, *, clock: Callable[[], int] = wall_clock_ms
    ) -> None:
        if state is None:
            state = MemoryDurableState()
        elif not isinstance(state, MemoryDurableState):
            raise ConfigurationError(f"state must be a MemoryDurableState or None, got {type(state).__name__}")
        self.state = state
        fences = Fences()
        super().__init__(_MemoryRows(state, fences.refused), state.checkpoint_store, fences, clock)

