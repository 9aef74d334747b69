"""The step journal's plans (no I/O), for the SQLite and Postgres runtimes: rows in, rows out.

Every write of a lease holder is fenced: it applies only while the session's lease is at
the writer's epoch, and otherwise raises `StaleEpochError` with nothing applied.

What each fenced write changes is described here once, as data (`FencedWrites` of `RowWrite`s:
`transition_writes` for a `RunTransition`, `steps_writes` for a step batch, ...), and rendered
for SQLite (row by row, or many sessions merged) and Postgres (one statement) by
`durable_agent.backends._sql.writes`, which states how each checks the fence. A Postgres lease
change takes the row ``FOR UPDATE``: a claim waits for fenced writes in flight to commit, and a
fenced write waits for a claim in flight, then sees its new epoch (READ COMMITTED re-checks a
locked row's latest version).

The lease rules are not here: `durable_agent._storage.stored` applies them to the rows these
plans read and write (`change_lease_plan` hands it the row under its lock).

Values (step results, errors, tool state, awakeable values, queue entries, submission
results) are stored as codec text, so bytes and reserved keys round-trip as in checkpoints, and
with stream partials' text they pass through the runtime's `RowSealer`
(`durable_agent._storage.sealing`): sealed under its keyring (``encryption=``), each bound to its
row's place (`PLACES`), or plaintext. Ids, keys, kinds, statuses, fingerprints, sequence numbers,
deadlines and the lease rows stay plaintext: the plans select and order by them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..._errors import StaleEpochError
from ..._storage.history import PrefixCache
from ..._storage.records import (
    AwakeableRecord,
    LeaseRow,
    RunOwner,
    RunTransition,
    StepErrorRecord,
    StepRecord,
    StreamPartialRecord,
    ToolStateOp,
)
from ..._storage.sealing import RowSealer
from ...encryption import Place
from .journal_schema import AWAKEABLES, LAST_RUNS, LEASES, PARTIALS, QUEUES, STEPS, SUBMISSIONS, TOOL_STATE
from .plan import Dialect, Plan, Query
from .rekey import SealedColumn
from .writes import FencedWrites, RowWrite, delete, fenced_plan, insert, merged, update, upsert

STEP_RESULT = "step-result"  # a step's result: ("step-result", session_id, key)
STEP_ERROR = "step-error"  # its error: ("step-error", session_id, key)
STEP_TOOL_STATE = "step-tool-state"  # the tool-state ops its done record commits: ("step-tool-state", session_id, key)
PARTIAL_TEXT = "partial-text"  # a stream partial's text: ("partial-text", session_id, step_key, seq)
PARTIAL_THINKING = "partial-thinking"  # its thinking: ("partial-thinking", session_id, step_key, seq)
AWAKEABLE = "awakeable"  # an awakeable's value: ("awakeable", awakeable_id); a resolver knows the id alone
QUEUE = "queue"  # a session's queue: ("queue", session_id)
SUBMISSION = "submission"  # a send's result: ("submission", session_id, request_id)
TOOL_STATE_VALUE = "tool-state"  # a session's tool-state value: ("tool-state", session_id, key)
PLACES = (STEP_RESULT, STEP_ERROR, STEP_TOOL_STATE, PARTIAL_TEXT, PARTIAL_THINKING, AWAKEABLE, QUEUE, SUBMISSION,
          TOOL_STATE_VALUE)
"""The kinds of place the journal's sealed columns are bound to, each followed by its row's key."""

SEALED_COLUMNS = (  # the sealed columns, each value's place as the readers below build it (`rekey_plan`)
    SealedColumn(STEPS, "result", ("id",), STEP_RESULT, ("session_id", "key")),
    SealedColumn(STEPS, "error", ("id",), STEP_ERROR, ("session_id", "key")),
    SealedColumn(STEPS, "tool_state", ("id",), STEP_TOOL_STATE, ("session_id", "key")),
    SealedColumn(PARTIALS, "text", ("id",), PARTIAL_TEXT, ("session_id", "step_key", "seq")),
    SealedColumn(PARTIALS, "thinking", ("id",), PARTIAL_THINKING, ("session_id", "step_key", "seq")),
    SealedColumn(AWAKEABLES, "value", ("id",), AWAKEABLE),
    SealedColumn(QUEUES, "entries", ("session_id",), QUEUE),
    SealedColumn(SUBMISSIONS, "result", ("session_id", "request_id"), SUBMISSION),
    SealedColumn(TOOL_STATE, "value", ("session_id", "key"), TOOL_STATE_VALUE),
)


def _opened(sealer: RowSealer, stored: str | None, place: Place) -> Any:
    return None if stored is None else sealer.open_value(stored, place)


# ------------------------------------------------------------------- steps

_STEP_FIELDS = ("session_id", "run_id", "key", "kind", "replay", "status", "fingerprint", "result", "error", "tool_state")
_STEP_COLUMNS = ", ".join(_STEP_FIELDS)


def _step(row: Sequence[Any], sealer: RowSealer) -> StepRecord:
    session_id, run_id, key, kind, replay, status, fingerprint, result, error, tool_state = row
    result = sealer.open_value(result, (STEP_RESULT, session_id, key))
    error = _opened(sealer, error, (STEP_ERROR, session_id, key))
    tool_state = _opened(sealer, tool_state, (STEP_TOOL_STATE, session_id, key))
    return StepRecord(
        session_id,
        run_id,
        key,
        kind,
        replay,
        status,
        fingerprint,
        result,
        StepErrorRecord(**error) if error is not None else None,
        tuple(tool_state) if tool_state is not None else None,
    )


def get_step_plan(session_id: str, key: str, sealer: RowSealer) -> Plan[StepRecord | None]:
    row = yield Query(
        f"SELECT {_STEP_COLUMNS} FROM {STEPS} WHERE session_id = ? AND key = ?", (session_id, key), "one"
    )
    return None if row is None else _step(row, sealer)


def steps_plan(session_id: str | None, run_id: str | None, sealer: RowSealer) -> Plan[list[StepRecord]]:
    where, params = _where(session_id=session_id, run_id=run_id)
    rows = yield Query(f"SELECT {_STEP_COLUMNS} FROM {STEPS}{where} ORDER BY id", params, "all")
    return [_step(r, sealer) for r in rows]


def put_steps_plan(
    d: Dialect, records: Sequence[StepRecord], epoch: int | None, streamed: Collection[str] | None, sealer: RowSealer
) -> Plan[None]:
    """Write the `records` of one session, fenced, in one transaction (see `_step_writes`)."""
    yield from fenced_plan(d, steps_writes(records, epoch, streamed, sealer))


def _step_row(record: StepRecord, sealer: RowSealer) -> tuple[Any, ...]:
    session_id, key, value = record.session_id, record.key, sealer.value
    return (
        session_id,
        record.run_id,
        key,
        record.kind,
        record.replay,
        record.status,
        record.fingerprint,
        value(record.result, (STEP_RESULT, session_id, key)),
        value(asdict(record.error), (STEP_ERROR, session_id, key)) if record.error is not None else None,
        value(list(record.tool_state), (STEP_TOOL_STATE, session_id, key)) if record.tool_state is not None else None,
    )


@dataclass(frozen=True, slots=True)
class _FoldedSteps:
    """Records of one session folded to what writing them in order leaves: one row per key (in the
    place of its latest record), the tool-state ops their ``done`` records commit, and the keys
    whose partials go (finished, and in `streamed`; None: every finished one)."""

    session_id: str
    rows: list[tuple[Any, ...]]
    ops: list[ToolStateOp]
    dropped_partials: list[str]

    @classmethod
    def of(cls, records: Sequence[StepRecord], streamed: Collection[str] | None, sealer: RowSealer) -> _FoldedSteps:
        last: dict[str, StepRecord] = {}
        finished: set[str] = set()
        ops: list[ToolStateOp] = []
        for record in records:
            last.pop(record.key, None)  # re-inserted: a later record of a key keeps the key's latest place
            last[record.key] = record
            if record.status != "pending":
                finished.add(record.key)
            if record.status == "done" and record.tool_state:
                ops.extend(record.tool_state)
        dropped = [key for key in last if key in finished and (streamed is None or key in streamed)]
        return cls(records[0].session_id, [_step_row(record, sealer) for record in last.values()], ops, dropped)


def _step_writes(records: Sequence[StepRecord], streamed: Collection[str] | None, sealer: RowSealer) -> list[RowWrite]:
    """Upserts of `records` in order; a ``done`` record commits its tool-state ops, a finished one drops
    its step's partials (`_FoldedSteps`). Folded to one row per (table, key)."""
    if not records:
        return []
    folded = _FoldedSteps.of(records, streamed, sealer)
    session_id = folded.session_id
    writes = _tool_state_writes(session_id, folded.ops, sealer)
    writes.append(upsert(STEPS, ("session_id", "key"), _STEP_FIELDS, folded.rows))  # in order: ids keep it
    if folded.dropped_partials:
        writes.append(delete(PARTIALS, ("session_id", "step_key"), [(session_id, key) for key in folded.dropped_partials]))
    return writes


def steps_writes(
    records: Sequence[StepRecord], epoch: int | None, streamed: Collection[str] | None, sealer: RowSealer
) -> FencedWrites:
    """What `put_steps_plan` writes: the `records` of one session (see `_step_writes`), fenced by `epoch`."""
    sessions = {record.session_id for record in records}
    if len(sessions) != 1:
        raise ValueError("put_steps writes the records of one session")
    return FencedWrites(sessions.pop(), epoch, tuple(_step_writes(records, streamed, sealer)))


def mergeable_steps(
    d: Dialect, records: Sequence[StepRecord], epoch: int | None, streamed: Collection[str] | None, sealer: RowSealer
) -> MergeableSteps | None:
    """`put_steps_plan(d, records, epoch, streamed, sealer)` as a `MergeableSteps`, where that is the same write
    (a fenced write of one session's records, on a dialect whose writes are serialized)."""
    if d.fence_in_statement or epoch is None or not records or len({r.session_id for r in records}) != 1:
        return None
    return MergeableSteps(records, epoch, streamed, sealer)


@dataclass(frozen=True, slots=True)
class MergeableSteps:
    """`put_steps_plan`'s fenced write on SQLite, which a group-commit writer may run with the step
    writes of other sessions queued with it (`merged`; why: `durable_agent.backends.sqlite._group_commit`)."""

    records: Sequence[StepRecord]
    epoch: int
    streamed: Collection[str] | None
    sealer: RowSealer

    @property
    def key(self) -> tuple[str, str]:
        return ("session", self.records[0].session_id)

    @staticmethod
    def merged(group: Sequence[MergeableSteps]) -> Plan[list[Any] | None]:
        """Every session's rows in a few statements (`writes.merged`), each step row guarded by its session's
        fence; None when a fence is stale."""
        return (yield from merged([steps_writes(s.records, s.epoch, s.streamed, s.sealer) for s in group],
                                  read_fences=False))


def _tool_state_writes(session_id: str, ops: Sequence[ToolStateOp], sealer: RowSealer) -> list[RowWrite]:
    """`ops` applied in order, as one row per key: the last op of each key decides."""
    final: dict[str, ToolStateOp] = {}
    for op in ops:
        if op.get("op") not in ("set", "delete"):
            raise ValueError(f"unknown tool-state op {op!r}")
        final[op["key"]] = op
    kept = [(session_id, key, sealer.value(op.get("value"), (TOOL_STATE_VALUE, session_id, key)))
            for key, op in final.items() if op["op"] == "set"]
    gone = [(session_id, key) for key, op in final.items() if op["op"] == "delete"]
    return [
        *([upsert(TOOL_STATE, ("session_id", "key"), ("session_id", "key", "value"), kept)] if kept else []),
        *([delete(TOOL_STATE, ("session_id", "key"), gone)] if gone else []),
    ]


def tool_state_plan(session_id: str, key: str | None, sealer: RowSealer) -> Plan[dict[str, Any]]:
    if key is None:
        rows = yield Query(
            f"SELECT key, value FROM {TOOL_STATE} WHERE session_id = ? ORDER BY key", (session_id,), "all"
        )
    else:
        rows = yield Query(
            f"SELECT key, value FROM {TOOL_STATE} WHERE session_id = ? AND key = ?", (session_id, key), "all"
        )
    return {k: sealer.open_value(v, (TOOL_STATE_VALUE, session_id, k)) for k, v in rows}


# ---------------------------------------------------------------- partials


def add_partial_plan(d: Dialect, record: StreamPartialRecord, epoch: int | None, sealer: RowSealer) -> Plan[None]:
    session_id, step_key, seq = record.session_id, record.step_key, record.seq
    text = sealer.text(record.text, (PARTIAL_TEXT, session_id, step_key, seq))
    thinking = None if record.thinking is None else sealer.text(record.thinking, (PARTIAL_THINKING, session_id, step_key, seq))
    partial = insert(
        PARTIALS, ("session_id", "run_id", "step_key", "seq", "text", "thinking"),
        [(session_id, record.run_id, step_key, seq, text, thinking)],
    )
    yield from fenced_plan(d, FencedWrites(record.session_id, epoch, (partial,)))


def partials_plan(session_id: str | None, run_id: str | None, sealer: RowSealer) -> Plan[list[StreamPartialRecord]]:
    where, params = _where(session_id=session_id, run_id=run_id)
    rows = yield Query(
        f"SELECT session_id, run_id, step_key, seq, text, thinking FROM {PARTIALS}{where} ORDER BY id",
        params,
        "all",
    )
    return [
        StreamPartialRecord(sid, rid, key, seq, sealer.open_text(text, (PARTIAL_TEXT, sid, key, seq)),
                            None if thinking is None else sealer.open_text(thinking, (PARTIAL_THINKING, sid, key, seq)))
        for sid, rid, key, seq, text, thinking in rows
    ]


def _where(**equal: str | None) -> tuple[str, tuple[str, ...]]:
    used = {column: value for column, value in equal.items() if value is not None}
    if not used:
        return "", ()
    return " WHERE " + " AND ".join(f"{column} = ?" for column in used), tuple(used.values())


# -------------------------------------------------------------- awakeables

_AWAKEABLE_FIELDS = ("id", "session_id", "key", "resolved", "value", "deadline")
_AWAKEABLE_COLUMNS = ", ".join(_AWAKEABLE_FIELDS)


def _awakeable(row: Sequence[Any], sealer: RowSealer) -> AwakeableRecord:
    awakeable_id, session_id, key, resolved, value, deadline = row
    return AwakeableRecord(awakeable_id, session_id, key, bool(resolved), sealer.open_value(value, (AWAKEABLE, awakeable_id)),
                           deadline)


def _unresolved(awakeable_id: str, sealer: RowSealer) -> str:
    """The stored value of a new awakeable (None, sealed like any value)."""
    return sealer.value(None, (AWAKEABLE, awakeable_id))


def find_awakeable_plan(session_id: str, key: str, sealer: RowSealer) -> Plan[AwakeableRecord | None]:
    row = yield Query(
        f"SELECT {_AWAKEABLE_COLUMNS} FROM {AWAKEABLES} WHERE session_id = ? AND key = ?",
        (session_id, key),
        "one",
    )
    return None if row is None else _awakeable(row, sealer)


def get_awakeable_plan(awakeable_id: str, sealer: RowSealer) -> Plan[AwakeableRecord | None]:
    row = yield Query(f"SELECT {_AWAKEABLE_COLUMNS} FROM {AWAKEABLES} WHERE id = ?", (awakeable_id,), "one")
    return None if row is None else _awakeable(row, sealer)


def awakeables_plan(sealer: RowSealer) -> Plan[list[AwakeableRecord]]:
    rows = yield Query(f"SELECT {_AWAKEABLE_COLUMNS} FROM {AWAKEABLES} ORDER BY session_id, key", (), "all")
    return [_awakeable(r, sealer) for r in rows]


def awakeable_for_plan(
    d: Dialect, session_id: str, key: str, new_id: str, deadline: int | None, epoch: int | None, sealer: RowSealer
) -> Plan[AwakeableRecord]:
    """The awakeable of (session, key), created (fenced) with `new_id` and `deadline` when there is none."""
    found = yield from find_awakeable_plan(session_id, key, sealer)
    if found is not None:
        return found
    created_now = insert(AWAKEABLES, _AWAKEABLE_FIELDS,
                         [(new_id, session_id, key, 0, _unresolved(new_id, sealer), deadline)], keep=("session_id", "key"))
    yield from fenced_plan(d, FencedWrites(session_id, epoch, (created_now,)))
    created = yield from find_awakeable_plan(session_id, key, sealer)  # ours, or a racing writer's
    assert created is not None  # the insert or its conflict left a row, and nothing deletes one
    return created


def resolve_awakeable_plan(d: Dialect, awakeable_id: str, value: Any, sealer: RowSealer) -> Plan[bool]:
    """True when the id exists; only the first resolution sticks. Not fenced: the resumer resolves."""
    changed = yield Query(
        f"UPDATE {AWAKEABLES} SET resolved = 1, value = ? WHERE id = ? AND resolved = 0 RETURNING id",
        (sealer.value(value, (AWAKEABLE, awakeable_id)), awakeable_id),
        "one",
    )
    if changed is None:
        row = yield Query(f"SELECT 1 FROM {AWAKEABLES} WHERE id = ?", (awakeable_id,), "one")
        return row is not None
    if d.notify is not None:
        yield Query(d.notify, (awakeable_id,), "one")
    return True


# ------------------------------------------------------------------ leases

_LEASE_COLUMNS = "epoch, owner_host, owner_pid, owner_token, renewed_at, released, resumable_run"


def _lease(row: Sequence[Any]) -> LeaseRow:
    epoch, host, pid, token, renewed_at, released, resumable_run = row
    owner = RunOwner(host, int(pid), token) if token is not None else None
    return LeaseRow(int(epoch), owner, int(renewed_at), bool(released), resumable_run)


def lease_row_plan(session_id: str) -> Plan[LeaseRow | None]:
    row = yield Query(f"SELECT {_LEASE_COLUMNS} FROM {LEASES} WHERE session_id = ?", (session_id,), "one")
    return None if row is None else _lease(row)


def change_lease_plan(
    d: Dialect, session_id: str, change: Callable[[LeaseRow], LeaseRow | None], epoch: int | None
) -> Plan[tuple[LeaseRow, bool]]:
    """Apply `change` to the session's lease row read under its lock (`LeaseRow()` when there is none).

    `change` returns the new row, or None to leave it. With `epoch`, a row at another epoch
    raises `StaleEpochError`. Returns the row as it is now and whether it changed. A missing
    row is created (and locked) before `change` sees it only when `change` would change it,
    so two first claims of a session queue on one row instead of both inserting.
    """
    lock = f"SELECT {_LEASE_COLUMNS} FROM {LEASES} WHERE session_id = ?{d.lock_update}"
    found = yield Query(lock, (session_id,), "one")
    if found is None and epoch is None and change(LeaseRow()) is not None:
        yield Query(
            f"INSERT INTO {LEASES} (session_id, epoch, renewed_at, released) VALUES (?, 0, 0, 1)"
            " ON CONFLICT (session_id) DO NOTHING",
            (session_id,),
        )
        found = yield Query(lock, (session_id,), "one")
    row = LeaseRow() if found is None else _lease(found)
    if epoch is not None and (found is None or row.epoch != epoch):
        raise StaleEpochError(session_id, epoch)
    new = change(row) if found is not None else None
    if new is None:
        return row, False
    owner = new.owner
    yield Query(
        f"UPDATE {LEASES} SET epoch = ?, owner_host = ?, owner_pid = ?, owner_token = ?, renewed_at = ?,"
        " released = ?, resumable_run = ? WHERE session_id = ?",
        (
            new.epoch,
            owner.host if owner else None,
            owner.pid if owner else None,
            owner.token if owner else None,
            new.renewed_at,
            int(new.released),
            new.resumable_run,
            session_id,
        ),
    )
    return new, True


def marked_leases_plan(session_id: str | None) -> Plan[list[tuple[str, LeaseRow, list[str]]]]:
    """Sessions (all, or `session_id`) leased at least once with a run marked in progress, in session order,
    each with its lease row and the keys of its unresolved awakeables."""
    only = " AND session_id = ?" if session_id is not None else ""
    rows = yield Query(
        f"SELECT session_id, {_LEASE_COLUMNS} FROM {LEASES}"
        f" WHERE resumable_run IS NOT NULL AND epoch > 0{only} ORDER BY session_id",
        (session_id,) if session_id is not None else (),
        "all",
    )
    marked = []
    for sid, *columns in rows:
        keys = yield Query(f"SELECT key FROM {AWAKEABLES} WHERE session_id = ? AND resolved = 0", (sid,), "all")
        marked.append((sid, _lease(columns), [k for (k,) in keys]))
    return marked


# ---------------------------------------------- queue, submissions, runs


def queue_read_plan(session_id: str, sealer: RowSealer) -> Plan[list[Any]]:
    row = yield Query(f"SELECT entries FROM {QUEUES} WHERE session_id = ?", (session_id,), "one")
    return [] if row is None else list(sealer.open_value(row[0], (QUEUE, session_id)))


def queue_write_plan(d: Dialect, session_id: str, entries: list[Any], epoch: int | None, sealer: RowSealer) -> Plan[None]:
    stored = sealer.value(list(entries), (QUEUE, session_id))
    queue = upsert(QUEUES, ("session_id",), ("session_id", "entries"), [(session_id, stored)])
    yield from fenced_plan(d, FencedWrites(session_id, epoch, (queue,)))


def add_submission_plan(
    session_id: str, request_id: str, fingerprint: str, sealer: RowSealer
) -> Plan[tuple[str, Any] | None]:
    """Record a new send: None when it is new, else the stored (fingerprint, result) of the earlier one."""
    place = (SUBMISSION, session_id, request_id)
    new = yield Query(
        f"INSERT INTO {SUBMISSIONS} (session_id, request_id, fingerprint, result, settled)"
        " VALUES (?, ?, ?, ?, 0) ON CONFLICT (session_id, request_id) DO NOTHING RETURNING settled",
        (session_id, request_id, fingerprint, sealer.value(None, place)),
        "one",
    )
    if new is not None:
        return None
    stored, result = yield Query(
        f"SELECT fingerprint, result FROM {SUBMISSIONS} WHERE session_id = ? AND request_id = ?",
        (session_id, request_id),
        "one",
    )
    return stored, sealer.open_value(result, place)


def complete_submission_plan(session_id: str, request_id: str, result: Any, sealer: RowSealer) -> Plan[None]:
    if result is None:
        yield Query(
            f"DELETE FROM {SUBMISSIONS} WHERE session_id = ? AND request_id = ?", (session_id, request_id)
        )
    else:
        yield Query(
            f"UPDATE {SUBMISSIONS} SET result = ?, settled = 1 WHERE session_id = ? AND request_id = ?",
            (sealer.value(result, (SUBMISSION, session_id, request_id)), session_id, request_id),
        )


def last_run_plan(session_id: str) -> Plan[str | None]:
    row = yield Query(f"SELECT run_id FROM {LAST_RUNS} WHERE session_id = ?", (session_id,), "one")
    return None if row is None else str(row[0])


def set_last_run_plan(d: Dialect, session_id: str, run_id: str, epoch: int | None) -> Plan[None]:
    yield from fenced_plan(d, FencedWrites(session_id, epoch, (_last_run(session_id, run_id),)))


def _last_run(session_id: str, run_id: str) -> RowWrite:
    return upsert(LAST_RUNS, ("session_id",), ("session_id", "run_id"), [(session_id, run_id)])


def transition_writes(transition: RunTransition, cache: PrefixCache, sealer: RowSealer) -> FencedWrites:
    """What `transition` writes, as data: the one place a `RunTransition`'s parts become rows (rendered by
    `durable_agent.backends._sql.writes`, per dialect). `cache`: this process's saves, for the checkpoint's;
    `sealer`: the runtime's, for every sealed column and the checkpoint's rows."""
    session_id = transition.session_id
    rows = _step_writes(transition.deferred.records, transition.deferred.streamed, sealer)
    if transition.last_run is not None:
        rows.append(_last_run(session_id, transition.last_run))
    if transition.mark is not None or transition.unmark:  # certain: the fence holds, so the lease row exists
        rows.append(update(LEASES, ("session_id",), ("resumable_run",), (transition.mark, session_id), certain=True))
    if transition.awakeables:  # no deadline: the column's NULL
        rows.append(insert(
            AWAKEABLES, ("id", "session_id", "key", "resolved", "value"),
            [(awakeable_id, session_id, key, 0, _unresolved(awakeable_id, sealer))
             for key, awakeable_id in transition.awakeables],
            keep=("session_id", "key"),
        ))
    return FencedWrites(session_id, transition.epoch, tuple(rows), transition.checkpoint, cache, sealer)


def commit_plan(d: Dialect, transition: RunTransition, cache: PrefixCache, sealer: RowSealer) -> Plan[int | None]:
    """A `RunTransition` as one fenced transaction; returns the checkpoint's revision (None without one)."""
    return (yield from fenced_plan(d, transition_writes(transition, cache, sealer)))


def mergeable_commit(
    d: Dialect, transition: RunTransition, cache: PrefixCache, sealer: RowSealer
) -> MergeableCommit | None:
    """`commit_plan(d, transition, cache, sealer)` as a `MergeableCommit`, on a dialect whose writes are serialized."""
    return None if d.fence_in_statement else MergeableCommit(transition, cache, sealer)


@dataclass(frozen=True, slots=True)
class MergeableCommit:
    """`commit_plan`'s transition on SQLite, which a group-commit writer may run with the transitions of
    other sessions queued with it (`merged`; why: `durable_agent.backends.sqlite._group_commit`)."""

    transition: RunTransition
    cache: PrefixCache
    sealer: RowSealer

    @property
    def key(self) -> tuple[str, str]:
        return ("session", self.transition.session_id)

    @staticmethod
    def merged(group: Sequence[MergeableCommit]) -> Plan[list[Any] | None]:
        """The transitions of `group` as a few statements (`writes.merged`), their fences read first: most
        carry a checkpoint, whose save cannot carry a fence."""
        return (yield from merged([transition_writes(c.transition, c.cache, c.sealer) for c in group], read_fences=True))

