"""The SQL event log's statements as plans (no I/O): one SQLite executor runs them synchronously, a Postgres one
asynchronously (`durable_agent.backends._sql.plan` runs the plans; placeholders are written ``?``).

Appends to one run are serialized: SQLite's ``BEGIN IMMEDIATE`` keeps other writers out, and
Postgres locks the run's row (``FOR UPDATE``) before reading the last ``seq``, so two processes
appending at once number their events one after the other instead of colliding.

A run's `meta` and each event's data are stored as codec text through the log's `RowSealer`
(`durable_agent._storage.sealing`): sealed under its keyring, bound to ``("event-run", run_id)`` and
``("event", run_id, seq)``, or plaintext. Run ids, sessions, times, seqs and keys stay plaintext.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._kernels import kernels
from .._storage.sealing import RowSealer
from ..backends._sql.plan import Dialect, Plan, Query
from ..backends._sql.rekey import SealedColumn
from ._events import RunEvent, RunInfo, finished, parks

RUNS = "durable_agent_http_runs"
EVENTS = "durable_agent_http_events"
PARKED = "durable_agent_http_parked"  # the runs whose last event is a suspended finish, and its seq (`parked_plan`)
SCHEMA_LOCK = 20263  # the schema lock's key (Postgres advisory lock)
RUN_META = "event-run"  # a run's meta: ("event-run", run_id)
EVENT = "event"  # an event's data: ("event", run_id, seq)
SEALED_COLUMNS = (  # the sealed columns and their places (`rekey_plan`: `rekey_async(log)`)
    SealedColumn(RUNS, "meta", ("run_id",), RUN_META),
    SealedColumn(EVENTS, "data", ("run_id", "seq"), EVENT),
)


def schema_plan(dialect: Dialect) -> Plan[None]:
    if dialect.lock_schema:
        yield Query(dialect.lock_schema, (SCHEMA_LOCK,), fetch="one")
    yield Query(f"CREATE TABLE IF NOT EXISTS {RUNS} (run_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, "
                "created_at BIGINT NOT NULL, meta TEXT NOT NULL)")
    yield Query(f"CREATE TABLE IF NOT EXISTS {EVENTS} (run_id TEXT NOT NULL, seq BIGINT NOT NULL, key TEXT NOT NULL, "
                "data TEXT NOT NULL, PRIMARY KEY (run_id, seq), UNIQUE (run_id, key))")
    yield Query(f"CREATE TABLE IF NOT EXISTS {PARKED} (run_id TEXT PRIMARY KEY, seq BIGINT NOT NULL)")


def create_run_plan(
    run_id: str, session_id: str, created_at: int, meta: Mapping[str, Any], sealer: RowSealer
) -> Plan[bool]:
    row = yield Query(f"INSERT INTO {RUNS} (run_id, session_id, created_at, meta) VALUES (?, ?, ?, ?) "
                      "ON CONFLICT DO NOTHING RETURNING run_id",
                      (run_id, session_id, created_at, sealer.value(dict(meta), (RUN_META, run_id))), fetch="one")
    return row is not None


def run_info_plan(run_id: str, sealer: RowSealer) -> Plan[RunInfo | None]:
    row = yield Query(f"SELECT session_id, created_at, meta FROM {RUNS} WHERE run_id = ?", (run_id,), fetch="one")
    return None if row is None else RunInfo(run_id, row[0], int(row[1]), sealer.open_value(row[2], (RUN_META, run_id)))


def _event(run_id: str, seq: Any, key: str, data: Any, sealer: RowSealer) -> RunEvent:
    return RunEvent(int(seq), key, sealer.open_value(data, (EVENT, run_id, int(seq))))


def append_plan(
    dialect: Dialect, run_id: str, events: Sequence[tuple[str, dict[str, Any]]], sealer: RowSealer
) -> Plan[list[RunEvent]]:
    """Store `events` after the run's last, skipping keys the run holds; each is sealed for the seq it is
    offered (a skipped event's seq goes to the next one, sealed again for it)."""
    encoded = [(key, kernels.encode(data)) for key, data in events]
    if (yield Query(f"SELECT run_id FROM {RUNS} WHERE run_id = ?{dialect.lock_update}", (run_id,), fetch="one")) is None:
        raise KeyError(run_id)
    (last,) = yield Query(f"SELECT COALESCE(MAX(seq), 0) FROM {EVENTS} WHERE run_id = ?", (run_id,), fetch="one")
    added = []
    for key, text in encoded:
        stored = sealer.text(text, (EVENT, run_id, last + 1))
        row = yield Query(f"INSERT INTO {EVENTS} (run_id, seq, key, data) VALUES (?, ?, ?, ?) "
                          "ON CONFLICT DO NOTHING RETURNING seq", (run_id, last + 1, key, stored), fetch="one")
        if row is not None:
            last += 1
            added.append(RunEvent(int(last), key, kernels.decode(text)))
    if added and parks(added[-1]):
        yield Query(f"INSERT INTO {PARKED} (run_id, seq) VALUES (?, ?) ON CONFLICT (run_id) DO UPDATE SET seq = "
                    "excluded.seq", (run_id, added[-1].seq))
    elif any(e.data.get("type") != "text-delta" for e in added):  # a leg after a park starts with another event
        yield Query(f"DELETE FROM {PARKED} WHERE run_id = ?", (run_id,))
    return added


def read_plan(run_id: str, after: int, sealer: RowSealer) -> Plan[list[RunEvent]]:
    rows = yield Query(f"SELECT seq, key, data FROM {EVENTS} WHERE run_id = ? AND seq > ? ORDER BY seq",
                       (run_id, after), fetch="all")
    return [_event(run_id, seq, key, data, sealer) for seq, key, data in rows]


def latest_plan(run_id: str) -> Plan[int]:
    (last,) = yield Query(f"SELECT COALESCE(MAX(seq), 0) FROM {EVENTS} WHERE run_id = ?", (run_id,), fetch="one")
    return int(last)


def forget_plan(run_ids: Sequence[str]) -> Plan[list[str]]:
    gone = []
    for run_id in run_ids:
        if (yield Query(f"DELETE FROM {RUNS} WHERE run_id = ? RETURNING run_id", (run_id,), fetch="one")) is not None:
            gone.append(run_id)
        yield Query(f"DELETE FROM {EVENTS} WHERE run_id = ?", (run_id,))
        yield Query(f"DELETE FROM {PARKED} WHERE run_id = ?", (run_id,))
    return gone


def prune_plan(before: int, sealer: RowSealer) -> Plan[list[str]]:
    """Forget the runs registered before `before` whose last event ends them for good (`events.finished`)."""
    rows = yield Query(f"SELECT e.run_id, e.seq, e.key, e.data FROM {RUNS} r JOIN {EVENTS} e ON e.run_id = r.run_id "
                       f"WHERE r.created_at < ? AND e.seq = (SELECT MAX(seq) FROM {EVENTS} WHERE run_id = r.run_id) "
                       "ORDER BY e.run_id", (before,), fetch="all")
    doomed = [run_id for run_id, seq, key, data in rows
              if finished(_event(run_id, seq, key, data, sealer))]
    return (yield from forget_plan(doomed))


def parked_plan() -> Plan[dict[str, int]]:
    """The runs whose last event is a suspended finish (`events.parks`): run id → its seq, as `append_plan` keeps
    them in their own table (a read of the parked runs only, however long the log). A run parked by a version
    without the table is not listed until it parks again."""
    rows = yield Query(f"SELECT run_id, seq FROM {PARKED}", (), fetch="all")
    return {run_id: int(seq) for run_id, seq in rows}
