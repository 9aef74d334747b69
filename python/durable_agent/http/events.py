"""The durable event log of the HTTP endpoint: every event of a run, numbered, stored before it is sent.

A run's events are stored in order, each with a ``seq`` (1, 2, ...: the SSE ``id``) and a
``key`` that names the event by the run's durable progress (``step/3/text/12``: the text of
step 3 from character 12; ``result/<tool_call_id>``; see `durable_agent.http.progress`). The
log holds a key once: a process that resumes a run after a crash re-emits the parts of the
step in flight, and the ones already stored are dropped instead of sent twice.

A reader asks for the events after the last ``seq`` it saw (``Last-Event-ID``) and waits for
more (`EventLog.wait`); writers and readers may be different processes. Two logs ship:
`MemoryEventLog` (one process, tests) and `SqliteEventLog` (a file shared by processes, e.g. the
SQLite runtime's own file). Event data is stored as codec text (`durable_agent.codec`), so a
tool output holding bytes round-trips.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .._kernels import kernels
from .._util import wall_clock_ms
from ..errors import ConfigurationError, FeatureUnavailableError

__all__ = ["EventLog", "MemoryEventLog", "RunEvent", "RunInfo", "SqliteEventLog"]


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


class _Wakeups:
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
        self._wakeups = _Wakeups()

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


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS durable_agent_http_runs (run_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, "
    "created_at INTEGER NOT NULL, meta TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS durable_agent_http_events (run_id TEXT NOT NULL, seq INTEGER NOT NULL, "
    "key TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run_id, seq), UNIQUE (run_id, key))",
)


class SqliteEventLog:
    """An `EventLog` in a SQLite file (WAL mode), shared by every server process that opens it.

    An append is one ``BEGIN IMMEDIATE`` transaction. A reader in the writing process wakes
    at once; a reader in another process polls every `poll_interval_ms` (SQLite cannot
    announce a change to another connection). The calls are short and synchronous, like
    `SqliteRuntime`'s. Pass the SQLite runtime's own path to keep one file per deployment.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_ms: int = 10_000,
                 poll_interval_ms: int = 50, clock: Any = wall_clock_ms) -> None:
        try:
            import sqlite3
        except ImportError as exc:  # Pyodide 0.28 without its sqlite3 package
            raise FeatureUnavailableError(f"SqliteEventLog needs the sqlite3 module: {exc}") from exc
        from ..stores._files import create_private

        self.path = os.fspath(path)
        self._clock = clock
        self._poll = poll_interval_ms / 1000
        self._lock = threading.RLock()
        self._wakeups = _Wakeups()
        try:
            if self.path != ":memory:":
                create_private(self.path)
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_ms / 1000, isolation_level=None,
                                         check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode = WAL").fetchone()
            for statement in _SCHEMA:
                self._conn.execute(statement)
        except (sqlite3.Error, OSError) as exc:
            raise ConfigurationError(f"cannot open the event log {self.path!r}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _write(self, work: Any) -> Any:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(self._conn)
            except BaseException:
                self._conn.rollback()
                raise
            self._conn.commit()
            return result

    async def create_run(self, run_id: str, session_id: str, meta: Mapping[str, Any]) -> bool:
        def work(conn: Any) -> bool:
            cursor = conn.execute(
                "INSERT OR IGNORE INTO durable_agent_http_runs (run_id, session_id, created_at, meta) "
                "VALUES (?, ?, ?, ?)", (run_id, session_id, int(self._clock()), kernels.encode(dict(meta))))
            return bool(cursor.rowcount)

        return bool(self._write(work))

    async def run_info(self, run_id: str) -> RunInfo | None:
        with self._lock:
            row = self._conn.execute("SELECT session_id, created_at, meta FROM durable_agent_http_runs "
                                     "WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else RunInfo(run_id, row[0], row[1], kernels.decode(row[2]))

    async def append(self, run_id: str, events: Sequence[tuple[str, dict[str, Any]]]) -> list[RunEvent]:
        encoded = [(key, kernels.encode(data)) for key, data in events]

        def work(conn: Any) -> list[RunEvent]:
            (last,) = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM durable_agent_http_events WHERE run_id = ?",
                                   (run_id,)).fetchone()
            added = []
            for key, text in encoded:
                cursor = conn.execute("INSERT OR IGNORE INTO durable_agent_http_events (run_id, seq, key, data) "
                                      "VALUES (?, ?, ?, ?)", (run_id, last + 1, key, text))
                if cursor.rowcount:
                    last += 1
                    added.append(RunEvent(last, key, kernels.decode(text)))
            return added

        added: list[RunEvent] = self._write(work)
        if added:
            self._wakeups.notify(run_id)
        return added

    async def read(self, run_id: str, after: int = 0) -> list[RunEvent]:
        with self._lock:
            rows = self._conn.execute("SELECT seq, key, data FROM durable_agent_http_events "
                                      "WHERE run_id = ? AND seq > ? ORDER BY seq", (run_id, after)).fetchall()
        return [RunEvent(seq, key, kernels.decode(data)) for seq, key, data in rows]

    async def wait(self, run_id: str, after: int, timeout: float) -> None:
        if await self._latest(run_id) <= after:
            await self._wakeups.wait(run_id, min(timeout, self._poll))

    async def _latest(self, run_id: str) -> int:
        with self._lock:
            (last,) = self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM durable_agent_http_events "
                                         "WHERE run_id = ?", (run_id,)).fetchone()
        return int(last)
