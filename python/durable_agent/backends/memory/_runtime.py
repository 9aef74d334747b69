"""The memory runtime: every durable table in a `MemoryDurableState` object, for tests and single processes.

Several runtimes may share one state, standing in for several processes on one database:
each runtime has its own lease owner token and its own fences, the state is the durable part.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..._errors import ConfigurationError, StaleEpochError
from ..._storage.leases import Fences
from ..._storage.records import (
    AwakeableRecord,
    LeaseRow,
    RunTransition,
    StepRecord,
    StreamPartialRecord,
    apply_tool_state,
)
from ..._storage.stored import StoredInspector, StoredRuntime
from ..._util import wall_clock_ms
from ._store import InMemoryCheckpointStore

__all__ = ["MemoryDurableState", "MemoryRuntime"]


@dataclass(slots=True)
class MemoryDurableState:
    """Sessions' steps, partials, awakeables, leases, queues, submissions and tool state.

    Indexed as a database would be, so a step's cost does not grow with the sessions held:
    `steps` by (session, key) with `run_steps` by (session, run); `partials` by session and
    step key, each numbered in the order written; `awakeables` by id with `awakeable_keys`
    by session and key.
    """

    steps: dict[tuple[str, str], StepRecord] = field(default_factory=dict)
    run_steps: dict[tuple[str, str], dict[str, StepRecord]] = field(default_factory=dict)
    partials: dict[str, dict[str, list[tuple[int, StreamPartialRecord]]]] = field(default_factory=dict)
    partials_written: int = 0
    awakeables: dict[str, AwakeableRecord] = field(default_factory=dict)
    awakeable_keys: dict[str, dict[str, str]] = field(default_factory=dict)
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

    async def put_steps(
        self, records: Sequence[StepRecord], *, epoch: int | None, streamed: Collection[str] | None = None
    ) -> None:
        for record in records:
            self.guard(record.session_id, epoch)
        for record in records:
            self._write_step(record, streamed is None or record.key in streamed)

    def _write_step(self, record: StepRecord, streamed: bool = True) -> None:
        state, session_id = self.state, record.session_id
        if record.status == "done" and record.tool_state:
            apply_tool_state(state.tool_state.setdefault(session_id, {}), record.tool_state)
        earlier = state.steps.get((session_id, record.key))
        if earlier is not None and earlier.run_id != record.run_id:
            state.run_steps[(session_id, earlier.run_id)].pop(record.key, None)
        state.steps[(session_id, record.key)] = record
        state.run_steps.setdefault((session_id, record.run_id), {})[record.key] = record
        if record.status != "pending" and streamed and session_id in state.partials:
            by_step = state.partials[session_id]
            by_step.pop(record.key, None)
            if not by_step:
                del state.partials[session_id]

    async def run_steps(self, session_id: str, run_id: str) -> list[StepRecord]:
        return list(self.state.run_steps.get((session_id, run_id), {}).values())

    async def add_partial(self, record: StreamPartialRecord, *, epoch: int | None) -> None:
        self.guard(record.session_id, epoch)
        state = self.state
        state.partials_written += 1
        streamed = state.partials.setdefault(record.session_id, {}).setdefault(record.step_key, [])
        streamed.append((state.partials_written, record))

    def _partials(self, session_id: str | None, run_id: str | None) -> list[StreamPartialRecord]:
        """The stored partials (of one session, of one run), in the order they were written."""
        sessions = self.state.partials.values() if session_id is None else [self.state.partials.get(session_id, {})]
        found = [
            numbered
            for steps in sessions
            for streamed in steps.values()
            for numbered in streamed
            if run_id is None or numbered[1].run_id == run_id
        ]
        found.sort(key=lambda numbered: numbered[0])
        return [record for _, record in found]

    async def run_partials(self, session_id: str, run_id: str) -> list[StreamPartialRecord]:
        return self._partials(session_id, run_id)

    async def awakeable_for(
        self, session_id: str, key: str, new_id: str, deadline: int | None, *, epoch: int | None
    ) -> AwakeableRecord:
        found = await self.find_awakeable(session_id, key)
        if found is not None:
            return found
        self.guard(session_id, epoch)
        record = AwakeableRecord(new_id, session_id, key, deadline=deadline)
        self._add_awakeable(record)
        return record

    def _add_awakeable(self, record: AwakeableRecord) -> None:
        self.state.awakeables[record.id] = record
        self.state.awakeable_keys.setdefault(record.session_id, {})[record.key] = record.id

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
        leases, awakeables = self.state.leases, self.state.awakeables
        if session_id is None:
            rows = sorted(leases.items())
        else:
            rows = [(session_id, leases[session_id])] if session_id in leases else []
        return [
            (sid, replace(row), [
                key for key, awakeable_id in self.state.awakeable_keys.get(sid, {}).items()
                if not awakeables[awakeable_id].resolved
            ])
            for sid, row in rows
            if row.resumable_run is not None and row.epoch > 0
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

    async def complete_submission(self, session_id: str, request_id: str, result: Any) -> None:
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
        return self._partials(None, run_id)

    async def awakeables(self) -> list[AwakeableRecord]:
        return list(self.state.awakeables.values())

    async def find_awakeable(self, session_id: str, key: str) -> AwakeableRecord | None:
        awakeable_id = self.state.awakeable_keys.get(session_id, {}).get(key)
        return None if awakeable_id is None else self.state.awakeables[awakeable_id]

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
        deferred = transition.deferred
        for record in deferred.records:
            self._write_step(record, deferred.streamed is None or record.key in deferred.streamed)
        if transition.checkpoint is not None:
            self.state.checkpoint_store.save(transition.checkpoint)
        if transition.last_run is not None:
            self.state.last_runs[session_id] = transition.last_run
        if transition.mark is not None or transition.unmark:
            self.state.leases.setdefault(session_id, LeaseRow()).resumable_run = transition.mark
        for key, awakeable_id in transition.awakeables:
            if key not in self.state.awakeable_keys.get(session_id, {}):
                self._add_awakeable(AwakeableRecord(awakeable_id, session_id, key))


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

