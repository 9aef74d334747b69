"""The durable event log of the HTTP endpoint: every event of a run, numbered, stored before it is sent.

A run's events are stored in order, each with a ``seq`` (1, 2, ...: the SSE ``id``) and a
``key`` that names the event by the run's durable progress (``step/3/text/12``: the text of
step 3 from character 12; ``result/<tool_call_id>``; see `durable_agent.http._progress`). The
log holds a key once: a process that resumes a run after a crash re-emits the parts of the
step in flight, and the ones already stored are dropped instead of sent twice.

A reader asks for the events after the last ``seq`` it saw (``Last-Event-ID``) and waits for
more (`EventLog.wait`); writers and readers may be different processes. Two logs ship:
`MemoryEventLog` (one process, tests) here, and in `durable_agent.http._sql_logs` the
`SqliteEventLog` (a file shared by processes, e.g. the SQLite runtime's own file) and the
`PostgresEventLog` (many servers on many hosts). Event data is stored as codec text, so a
tool output holding bytes round-trips.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .._errors import ConfigurationError
from .._kernels import kernels
from .._util import wall_clock_ms

__all__ = ["EventLog", "MemoryEventLog", "RunEvent", "RunInfo", "Wakeups"]


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One stored event of a run: its position (`seq`, the SSE id), its progress `key` and its JSON `data`."""

    seq: int
    key: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run the endpoint knows: its session, when it was registered, and what the app attached (`meta`)."""

    run_id: str
    session_id: str
    created_at: int
    meta: Mapping[str, Any]


class EventLog(Protocol):
    """Where the endpoint keeps runs and their events (async: a log may sit on a network database)."""

    async def create_run(self, run_id: str, session_id: str, meta: Mapping[str, Any]) -> bool:
        """Register `run_id`; False (and nothing changes) when it is registered already."""
        ...

    async def run_info(self, run_id: str) -> RunInfo | None: ...

    async def append(self, run_id: str, events: Sequence[tuple[str, dict[str, Any]]]) -> list[RunEvent]:
        """Store `(key, data)` events in order, skipping keys the run holds already; returns what was stored."""
        ...

    async def read(self, run_id: str, after: int = 0) -> list[RunEvent]:
        """The run's events with a seq above `after`, in order."""
        ...

    async def wait(self, run_id: str, after: int, timeout: float) -> None:
        """Return when the run may have events above `after`, or after `timeout` seconds."""
        ...

    async def forget(self, run_ids: Sequence[str]) -> list[str]:
        """Drop these runs and all their events; returns the ids the log held (the others are ignored)."""
        ...

    async def prune(self, *, before: int) -> list[str]:
        """Drop the runs registered before `before` (epoch ms) whose log ends finished; returns their ids.

        Finished: the last event is a ``finish`` that is not ``suspended``, or an ``error``. A
        parked run, a run still streaming, and a run that never logged an event are kept.
        """
        ...

    async def parked(self) -> dict[str, int]:
        """The runs whose log ends with a ``suspended`` ``finish`` (parked, by any process): run id → that event's seq.

        What a server watches for verdicts stored elsewhere (`RunDriver.wake_parked`).
        """
        ...


def finished(last: RunEvent | None) -> bool:
    """Whether a run whose last logged event is `last` has ended for good (what `EventLog.prune` drops)."""
    if last is None:
        return False
    kind = last.data.get("type")
    return kind == "error" or (kind == "finish" and last.data.get("finish_reason") != "suspended")


def parks(last: RunEvent | None) -> bool:
    """Whether a run whose last logged event is `last` is parked (what `EventLog.parked` lists)."""
    return last is not None and last.data.get("type") == "finish" and last.data.get("finish_reason") == "suspended"


def check_prune(before: Any) -> int:
    if type(before) is not int:
        raise ConfigurationError(f"before must be an int (epoch ms), got {before!r}")
    return int(before)


def check_run_ids(run_ids: Any) -> list[str]:
    if isinstance(run_ids, (str, bytes)) or not isinstance(run_ids, Sequence) or \
            not all(isinstance(r, str) for r in run_ids):
        raise ConfigurationError(f"run_ids must be a sequence of str, got {run_ids!r}")
    return list(dict.fromkeys(run_ids))


class Wakeups:
    """Readers of a run waiting in this process, woken when a writer of this process appends."""

    def __init__(self) -> None:
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    def notify(self, run_id: str) -> None:
        for waiter in self._waiters.pop(run_id, []):
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, run_id: str, timeout: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(run_id, []).append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(run_id, [])
            if waiter in waiters:
                waiters.remove(waiter)


class MemoryEventLog:
    """An `EventLog` in this process's memory: waiting readers wake at once on an append."""

    def __init__(self, *, clock: Any = wall_clock_ms) -> None:
        self._clock = clock
        self._runs: dict[str, RunInfo] = {}
        self._events: dict[str, list[RunEvent]] = {}
        self._keys: dict[str, set[str]] = {}
        self._wakeups = Wakeups()

    async def create_run(self, run_id: str, session_id: str, meta: Mapping[str, Any]) -> bool:
        if run_id in self._runs:
            return False
        self._runs[run_id] = RunInfo(run_id, session_id, int(self._clock()), dict(meta))
        self._events[run_id], self._keys[run_id] = [], set()
        return True

    async def run_info(self, run_id: str) -> RunInfo | None:
        return self._runs.get(run_id)

    async def append(self, run_id: str, events: Sequence[tuple[str, dict[str, Any]]]) -> list[RunEvent]:
        if run_id not in self._runs:
            raise KeyError(run_id)
        stored, keys, added = self._events[run_id], self._keys[run_id], []
        for key, data in events:
            if key in keys:
                continue
            keys.add(key)
            event = RunEvent(len(stored) + 1, key, kernels.decode(kernels.encode(data)))
            stored.append(event)
            added.append(event)
        if added:
            self._wakeups.notify(run_id)
        return added

    async def read(self, run_id: str, after: int = 0) -> list[RunEvent]:
        return list(self._events.get(run_id, [])[max(after, 0):])

    async def wait(self, run_id: str, after: int, timeout: float) -> None:
        if len(self._events.get(run_id, [])) <= after:
            await self._wakeups.wait(run_id, timeout)

    async def forget(self, run_ids: Sequence[str]) -> list[str]:
        gone = [r for r in check_run_ids(run_ids) if self._runs.pop(r, None) is not None]
        for run_id in gone:
            del self._events[run_id], self._keys[run_id]
            self._wakeups.notify(run_id)  # a waiting reader finds the run gone
        return gone

    async def prune(self, *, before: int) -> list[str]:
        before = check_prune(before)
        return await self.forget([r.run_id for r in self._runs.values() if r.created_at < before
                                  and finished(self._events[r.run_id][-1] if self._events[r.run_id] else None)])

    async def parked(self) -> dict[str, int]:
        return {run_id: events[-1].seq for run_id, events in self._events.items() if events and parks(events[-1])}
