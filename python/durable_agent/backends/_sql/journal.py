"""The step journal's plans (no I/O), for the SQLite and Postgres runtimes: rows in, rows out.

Every write of a lease holder is fenced: it applies only while the session's lease is at
the writer's epoch, and otherwise raises `StaleEpochError` with nothing applied.

* SQLite: writes run under ``BEGIN IMMEDIATE`` (one writer at a time for the whole file), so
  a fence read inside the transaction cannot race a claim. The fence rides on the first
  write that writes a row whenever its guard holds (`Write.certain`: an upsert), run first
  and counted: no row changed means a stale fence, and the plan stops before any other
  write (`_serial_writes`), or on a checkpoint save's header write (`commit_plan`); a plan
  without such a write reads the fence first (`_fence`).
* Postgres: a fenced write is ONE statement (`fenced_plan`, `_append_plan`) whose writes are
  guarded by the lease row read ``FOR SHARE`` in the same statement, committed as it ends (one
  round trip); a stale fence makes every guard false. A lease change takes the row ``FOR UPDATE``:
  a claim waits for fenced writes in flight to commit, and a fenced write waits for a claim in
  flight, then sees its new epoch (READ COMMITTED re-checks a locked row's latest version).
  Fenced writes of the same owner share the lock and do not serialize on each other.

The lease rules are not here: `durable_agent._storage.stored` applies them to the rows these
plans read and write (`change_lease_plan` hands it the row under its lock).

Values (step results, errors, tool state, awakeable values, queue entries, submission
results) are stored as codec text, so bytes and reserved keys round-trip as in checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..._kernels import kernels
from ..._storage.history import PrefixCache, encode_header, encode_messages, new_revision
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
from ...checkpoint import AgentCheckpoint
from ...errors import StaleEpochError
from .checkpoints import MESSAGES, RUNS, STEPS as STEP_LOG, SaveRow, merge_row, merged_saves, save_plan
from .journal_schema import AWAKEABLES, LAST_RUNS, LEASES, PARTIALS, QUEUES, STEPS, SUBMISSIONS, TOOL_STATE
from .plan import ALONE, Dialect, Guard, Plan, Query, chunks, flat


def _text(value: Any) -> str:
    text: str = kernels.encode(value)
    return text


def _value(text: str | None) -> Any:
    return None if text is None else kernels.decode(text)


# ----------------------------------------------------------------- fencing


@dataclass(frozen=True, slots=True)
class Write:
    """A write statement with a ``{guard}`` hole where a fenced write puts its epoch check.

    `certain`: it writes a row whenever its guard holds (an upsert), and its ``{guard}`` comes
    after every placeholder: SQLite checks the fence inside it (`_serial_writes`).
    """

    sql: str
    params: tuple[Any, ...]
    certain: bool = False

    def guarded(self, guard: str) -> str:
        return self.sql.replace("{guard}", guard)


_FENCE = f"SELECT 1 FROM {LEASES} WHERE session_id = ? AND epoch = ?"
_EXISTS_FENCE = "EXISTS (SELECT 1 FROM fence)"


def _fence(d: Dialect, session_id: str, epoch: int | None) -> Plan[None]:
    """Stop the plan with `StaleEpochError` unless `epoch` is the session's current one (None: unguarded)."""
    if epoch is None:
        return
    row = yield Query(f"SELECT epoch FROM {LEASES} WHERE session_id = ?{d.lock_shared}", (session_id,), "one")
    if row is None or row[0] != epoch:
        raise StaleEpochError(session_id, epoch)


def fenced_plan(d: Dialect, session_id: str, epoch: int | None, writes: Sequence[Write]) -> Plan[None]:
    """Apply `writes` only while the session's lease is at `epoch` (None: unguarded), else `StaleEpochError`.

    Where the dialect says so (Postgres) the check and every write are ONE statement, run alone:
    each write is guarded by the fence's row (read ``FOR SHARE``, so a claim waits for it), a stale
    fence makes every guard false, and the statement commits as it ends. Elsewhere (SQLite, whose
    writes are serialized) the fence is read first, then each write runs unguarded. The writes
    must touch distinct rows (one statement cannot change a row twice).
    """
    if not d.fence_in_statement:
        yield from _serial_writes(d, session_id, epoch, writes)
        return
    if epoch is None:
        if not writes:
            return
        ctes, params, guard = [], [], "1 = 1"
    else:
        ctes, params, guard = [f"fence AS ({_FENCE}{d.lock_shared})"], [session_id, epoch], _EXISTS_FENCE
    for i, write in enumerate(writes):
        ctes.append(f"w{i} AS ({write.guarded(guard)})")
        params.extend(write.params)
    answer = "(SELECT count(*) FROM fence)" if epoch is not None else "1"
    row = yield Query(f"WITH {', '.join(ctes)} SELECT {answer}", params, "one", alone=True)
    if epoch is not None and row[0] == 0:
        raise StaleEpochError(session_id, epoch)



def _serial_writes(d: Dialect, session_id: str, epoch: int | None, writes: Sequence[Write]) -> Plan[None]:
    """`writes` one statement after another, fenced by `epoch` (None: unguarded), inside the caller's transaction.

    The first `certain` write runs first, guarded by the fence and counted: no row changed
    means the fence is stale, and `StaleEpochError` stops the plan before anything was written.
    The others follow in order (they touch other rows: the order between them is kept). Without
    a certain write (and on Postgres, whose fence read locks the lease row) the fence is read first.
    """
    first = None
    if epoch is not None and not d.fence_in_statement:  # Postgres: a fence read takes the row's share lock
        first = next((i for i, write in enumerate(writes) if write.certain), None)
    if first is None or epoch is None:
        yield from _fence(d, session_id, epoch)
    else:
        write = writes[first]
        if not (yield Query(write.guarded(f"EXISTS ({_FENCE})"), (*write.params, session_id, epoch), "count")):
            raise StaleEpochError(session_id, epoch)
    for i, write in enumerate(writes):
        if i != first:
            yield Query(write.guarded("1 = 1"), write.params)


# ------------------------------------------------------------------- steps

_STEP_COLUMNS = "session_id, run_id, key, kind, replay, status, fingerprint, result, error, tool_state"


def _step(row: Sequence[Any]) -> StepRecord:
    session_id, run_id, key, kind, replay, status, fingerprint, result, error, tool_state = row
    return StepRecord(
        session_id,
        run_id,
        key,
        kind,
        replay,
        status,
        fingerprint,
        _value(result),
        StepErrorRecord(**_value(error)) if error is not None else None,
        tuple(_value(tool_state)) if tool_state is not None else None,
    )


def get_step_plan(session_id: str, key: str) -> Plan[StepRecord | None]:
    row = yield Query(
        f"SELECT {_STEP_COLUMNS} FROM {STEPS} WHERE session_id = ? AND key = ?", (session_id, key), "one"
    )
    return None if row is None else _step(row)


def steps_plan(session_id: str | None, run_id: str | None) -> Plan[list[StepRecord]]:
    where, params = _where(session_id=session_id, run_id=run_id)
    rows = yield Query(f"SELECT {_STEP_COLUMNS} FROM {STEPS}{where} ORDER BY id", params, "all")
    return [_step(r) for r in rows]


def put_steps_plan(
    d: Dialect, records: Sequence[StepRecord], epoch: int | None, streamed: Collection[str] | None = None
) -> Plan[None]:
    """Write the `records` of one session, fenced, in one transaction (see `_step_writes`)."""
    sessions = {record.session_id for record in records}
    if len(sessions) != 1:
        raise ValueError("put_steps writes the records of one session")
    yield from fenced_plan(d, sessions.pop(), epoch, _step_writes(d, records, streamed))


def _step_row(record: StepRecord) -> tuple[Any, ...]:
    return (
        record.session_id,
        record.run_id,
        record.key,
        record.kind,
        record.replay,
        record.status,
        record.fingerprint,
        _text(record.result),
        _text(asdict(record.error)) if record.error is not None else None,
        _text(list(record.tool_state)) if record.tool_state is not None else None,
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
    def of(cls, records: Sequence[StepRecord], streamed: Collection[str] | None) -> _FoldedSteps:
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
        return cls(records[0].session_id, [_step_row(record) for record in last.values()], ops, dropped)


_STEP_UPSERT = (
    " ON CONFLICT (session_id, key) DO UPDATE SET run_id = excluded.run_id, kind = excluded.kind,"
    " replay = excluded.replay, status = excluded.status, fingerprint = excluded.fingerprint,"
    " result = excluded.result, error = excluded.error, tool_state = excluded.tool_state"
)


def _step_writes(d: Dialect, records: Sequence[StepRecord], streamed: Collection[str] | None = None) -> list[Write]:
    """Upserts of `records` in order; a ``done`` record commits its tool-state ops, a finished one drops
    its step's partials (`_FoldedSteps`). Folded to one write per row."""
    if not records:
        return []
    folded = _FoldedSteps.of(records, streamed)
    session_id, rows = folded.session_id, folded.rows
    writes = _tool_state_writes(session_id, folded.ops)
    if d.fence_in_statement:  # one statement: ONE insert, so the rows take their ids in order
        values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS INTEGER))"] * len(rows))
        writes.append(Write(
            f"INSERT INTO {STEPS} ({_STEP_COLUMNS}) SELECT {_STEP_COLUMNS} FROM (VALUES {values})"
            f" AS v ({_STEP_COLUMNS}, n) WHERE {{guard}} ORDER BY n{_STEP_UPSERT}",
            flat((*row, n) for n, row in enumerate(rows)),
        ))
    else:
        writes.extend(
            Write(f"INSERT INTO {STEPS} ({_STEP_COLUMNS}) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE {{guard}}{_STEP_UPSERT}",
                  row, certain=True)
            for row in rows
        )
    writes.extend(
        Write(f"DELETE FROM {PARTIALS} WHERE session_id = ? AND step_key = ? AND {{guard}}", (session_id, key))
        for key in folded.dropped_partials
    )
    return writes


MERGED_STEP_ROWS = 256  # rows per merged statement (a power of 2: `chunks`): 12 parameters each


def mergeable_steps(
    d: Dialect, records: Sequence[StepRecord], epoch: int | None, streamed: Collection[str] | None
) -> MergeableSteps | None:
    """`put_steps_plan(d, records, epoch, streamed)` as a `MergeableSteps`, where that is the same write
    (a fenced write of one session's records, on a dialect whose writes are serialized)."""
    if d.fence_in_statement or epoch is None or not records or len({r.session_id for r in records}) != 1:
        return None
    return MergeableSteps(records, epoch, streamed)


@dataclass(frozen=True, slots=True)
class MergeableSteps:
    """`put_steps_plan`'s fenced write on SQLite, which a group-commit writer may run with the step
    writes of other sessions queued with it (`merged`; why: `durable_agent.backends.sqlite._group_commit`)."""

    records: Sequence[StepRecord]
    epoch: int
    streamed: Collection[str] | None

    @property
    def key(self) -> tuple[str, str]:
        return ("session", self.records[0].session_id)

    @staticmethod
    def merged(group: Sequence[MergeableSteps]) -> Plan[list[Any] | None]:
        """Every session's rows in one upsert, each row guarded by its session's fence, and their dropped
        partials in one delete. A write that commits tool state is left `ALONE`; None when a fence
        is stale."""
        folded = [_FoldedSteps.of(steps.records, steps.streamed) for steps in group]
        merged = [(f, steps.epoch) for steps, f in zip(group, folded, strict=True) if not f.ops]
        if not (yield from _merged_steps(merged)):
            return None
        return [ALONE if f.ops else None for f in folded]


def _merged_steps(sessions: Sequence[tuple[_FoldedSteps, int]]) -> Plan[bool]:
    """The rows of `sessions` (each folded with its lease epoch) in one upsert per chunk, each row guarded
    by its session's fence, then their dropped partials in one delete; False when a fence is stale
    (the row count tells). VALUES names its columns column1, column2, ...: the step columns, the
    epoch, the row's place."""
    rows: list[tuple[Any, ...]] = []
    for folded, epoch in sessions:
        rows.extend((*row, epoch, len(rows) + i) for i, row in enumerate(folded.rows))
    columns = ", ".join(f"column{i}" for i in range(1, 11))
    for chunk in chunks(rows, MERGED_STEP_ROWS):
        changed = yield Query(
            f"INSERT INTO {STEPS} ({_STEP_COLUMNS}) SELECT {columns} FROM (VALUES"
            f" {', '.join(['(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)'] * len(chunk))})"
            f" WHERE EXISTS (SELECT 1 FROM {LEASES} WHERE session_id = column1 AND epoch = column11)"
            f" ORDER BY column12{_STEP_UPSERT}",
            flat(chunk), "count",
        )
        if changed != len(chunk):
            return False
    dropped = [(folded.session_id, key) for folded, _ in sessions for key in folded.dropped_partials]
    for pairs in chunks(dropped, MERGED_STEP_ROWS):
        yield Query(f"DELETE FROM {PARTIALS} WHERE (session_id, step_key) IN (VALUES {', '.join(['(?, ?)'] * len(pairs))})",
                    flat(pairs))
    return True


def _tool_state_writes(session_id: str, ops: Sequence[ToolStateOp]) -> list[Write]:
    """`ops` applied in order, as one write per key: the last op of each key decides."""
    final: dict[str, ToolStateOp] = {}
    for op in ops:
        if op.get("op") not in ("set", "delete"):
            raise ValueError(f"unknown tool-state op {op!r}")
        final[op["key"]] = op
    return [
        Write(
            f"INSERT INTO {TOOL_STATE} (session_id, key, value) SELECT ?, ?, ? WHERE {{guard}}"
            " ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value",
            (session_id, key, _text(op.get("value"))),
            certain=True,
        )
        if op["op"] == "set"
        else Write(f"DELETE FROM {TOOL_STATE} WHERE session_id = ? AND key = ? AND {{guard}}", (session_id, key))
        for key, op in final.items()
    ]


def tool_state_plan(session_id: str, key: str | None) -> Plan[dict[str, Any]]:
    if key is None:
        rows = yield Query(
            f"SELECT key, value FROM {TOOL_STATE} WHERE session_id = ? ORDER BY key", (session_id,), "all"
        )
    else:
        rows = yield Query(
            f"SELECT key, value FROM {TOOL_STATE} WHERE session_id = ? AND key = ?", (session_id, key), "all"
        )
    return {k: _value(v) for k, v in rows}


# ---------------------------------------------------------------- partials


def add_partial_plan(d: Dialect, record: StreamPartialRecord, epoch: int | None) -> Plan[None]:
    write = Write(
        f"INSERT INTO {PARTIALS} (session_id, run_id, step_key, seq, text, thinking)"
        " SELECT ?, ?, ?, ?, ?, ? WHERE {guard}",
        (record.session_id, record.run_id, record.step_key, record.seq, record.text, record.thinking),
        certain=True,
    )
    yield from fenced_plan(d, record.session_id, epoch, [write])


def partials_plan(session_id: str | None, run_id: str | None) -> Plan[list[StreamPartialRecord]]:
    where, params = _where(session_id=session_id, run_id=run_id)
    rows = yield Query(
        f"SELECT session_id, run_id, step_key, seq, text, thinking FROM {PARTIALS}{where} ORDER BY id",
        params,
        "all",
    )
    return [StreamPartialRecord(*r) for r in rows]


def _where(**equal: str | None) -> tuple[str, tuple[str, ...]]:
    used = {column: value for column, value in equal.items() if value is not None}
    if not used:
        return "", ()
    return " WHERE " + " AND ".join(f"{column} = ?" for column in used), tuple(used.values())


# -------------------------------------------------------------- awakeables

_AWAKEABLE_COLUMNS = "id, session_id, key, resolved, value, deadline"


def _awakeable(row: Sequence[Any]) -> AwakeableRecord:
    awakeable_id, session_id, key, resolved, value, deadline = row
    return AwakeableRecord(awakeable_id, session_id, key, bool(resolved), _value(value), deadline)


def find_awakeable_plan(session_id: str, key: str) -> Plan[AwakeableRecord | None]:
    row = yield Query(
        f"SELECT {_AWAKEABLE_COLUMNS} FROM {AWAKEABLES} WHERE session_id = ? AND key = ?",
        (session_id, key),
        "one",
    )
    return None if row is None else _awakeable(row)


def get_awakeable_plan(awakeable_id: str) -> Plan[AwakeableRecord | None]:
    row = yield Query(f"SELECT {_AWAKEABLE_COLUMNS} FROM {AWAKEABLES} WHERE id = ?", (awakeable_id,), "one")
    return None if row is None else _awakeable(row)


def awakeables_plan() -> Plan[list[AwakeableRecord]]:
    rows = yield Query(f"SELECT {_AWAKEABLE_COLUMNS} FROM {AWAKEABLES} ORDER BY session_id, key", (), "all")
    return [_awakeable(r) for r in rows]


def awakeable_for_plan(
    d: Dialect, session_id: str, key: str, new_id: str, deadline: int | None, epoch: int | None
) -> Plan[AwakeableRecord]:
    """The awakeable of (session, key), created (fenced) with `new_id` and `deadline` when there is none."""
    found = yield from find_awakeable_plan(session_id, key)
    if found is not None:
        return found
    yield from fenced_plan(d, session_id, epoch, [_awakeable_write(session_id, key, new_id, deadline)])
    created = yield from find_awakeable_plan(session_id, key)  # ours, or a racing writer's
    assert created is not None  # the insert or its conflict left a row, and nothing deletes one
    return created


def _awakeable_write(session_id: str, key: str, awakeable_id: str, deadline: int | None) -> Write:
    return Write(
        f"INSERT INTO {AWAKEABLES} ({_AWAKEABLE_COLUMNS}) SELECT ?, ?, ?, 0, ?, ? WHERE {{guard}}"
        " ON CONFLICT (session_id, key) DO NOTHING",
        (awakeable_id, session_id, key, _text(None), deadline),
    )


def resolve_awakeable_plan(d: Dialect, awakeable_id: str, value: Any) -> Plan[bool]:
    """True when the id exists; only the first resolution sticks. Not fenced: the resumer resolves."""
    changed = yield Query(
        f"UPDATE {AWAKEABLES} SET resolved = 1, value = ? WHERE id = ? AND resolved = 0 RETURNING id",
        (_text(value), awakeable_id),
        "one",
    )
    if changed is None:
        return (yield from get_awakeable_plan(awakeable_id)) is not None
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


def queue_read_plan(session_id: str) -> Plan[list[Any]]:
    row = yield Query(f"SELECT entries FROM {QUEUES} WHERE session_id = ?", (session_id,), "one")
    return [] if row is None else list(_value(row[0]))


def queue_write_plan(d: Dialect, session_id: str, entries: list[Any], epoch: int | None) -> Plan[None]:
    write = Write(
        f"INSERT INTO {QUEUES} (session_id, entries) SELECT ?, ? WHERE {{guard}}"
        " ON CONFLICT (session_id) DO UPDATE SET entries = excluded.entries",
        (session_id, _text(list(entries))),
        certain=True,
    )
    yield from fenced_plan(d, session_id, epoch, [write])


def add_submission_plan(session_id: str, request_id: str, fingerprint: str) -> Plan[tuple[str, Any] | None]:
    """Record a new send: None when it is new, else the stored (fingerprint, result) of the earlier one."""
    new = yield Query(
        f"INSERT INTO {SUBMISSIONS} (session_id, request_id, fingerprint, result, settled)"
        " VALUES (?, ?, ?, ?, 0) ON CONFLICT (session_id, request_id) DO NOTHING RETURNING settled",
        (session_id, request_id, fingerprint, _text(None)),
        "one",
    )
    if new is not None:
        return None
    stored, result = yield Query(
        f"SELECT fingerprint, result FROM {SUBMISSIONS} WHERE session_id = ? AND request_id = ?",
        (session_id, request_id),
        "one",
    )
    return stored, _value(result)


def settle_submission_plan(session_id: str, request_id: str, result: Any) -> Plan[None]:
    if result is None:
        yield Query(
            f"DELETE FROM {SUBMISSIONS} WHERE session_id = ? AND request_id = ?", (session_id, request_id)
        )
    else:
        yield Query(
            f"UPDATE {SUBMISSIONS} SET result = ?, settled = 1 WHERE session_id = ? AND request_id = ?",
            (_text(result), session_id, request_id),
        )


def last_run_plan(session_id: str) -> Plan[str | None]:
    row = yield Query(f"SELECT run_id FROM {LAST_RUNS} WHERE session_id = ?", (session_id,), "one")
    return None if row is None else str(row[0])


def set_last_run_plan(d: Dialect, session_id: str, run_id: str, epoch: int | None) -> Plan[None]:
    yield from fenced_plan(d, session_id, epoch, [_last_run_write(session_id, run_id)])


def _last_run_write(session_id: str, run_id: str) -> Write:
    return Write(
        f"INSERT INTO {LAST_RUNS} (session_id, run_id) SELECT ?, ? WHERE {{guard}}"
        " ON CONFLICT (session_id) DO UPDATE SET run_id = excluded.run_id",
        (session_id, run_id),
        certain=True,
    )


def commit_plan(d: Dialect, transition: RunTransition, cache: PrefixCache) -> Plan[int | None]:
    """A `RunTransition` as one fenced transaction; returns the checkpoint's revision (None without one).

    Where the fence is checked inside the statement (Postgres) and this process knows the stored
    checkpoint (its cache holds the revision stored, and the new checkpoint only appends to it),
    the whole transition is ONE statement (`_append_plan`); otherwise the fence, then each part.
    """
    if d.fence_in_statement:
        done, revision = yield from _append_plan(d, transition, cache)
        if done:
            return revision
    session_id, epoch, writes = transition.session_id, transition.epoch, _transition_writes(d, transition)
    if transition.checkpoint is not None and not writes and not d.fence_in_statement:  # SQLite: the save is fenced
        guard = Guard(f"EXISTS ({_FENCE})", (session_id, epoch), StaleEpochError(session_id, epoch))
        return (yield from save_plan(cache, transition.checkpoint, None, d, guard))
    yield from _serial_writes(d, session_id, epoch, writes)
    if transition.checkpoint is not None:
        return (yield from save_plan(cache, transition.checkpoint, None, d))
    return None


def mergeable_commit(d: Dialect, transition: RunTransition, cache: PrefixCache) -> MergeableCommit | None:
    """`commit_plan(d, transition, cache)` as a `MergeableCommit`, on a dialect whose writes are serialized."""
    return None if d.fence_in_statement else MergeableCommit(transition, cache)


@dataclass(frozen=True, slots=True)
class MergeableCommit:
    """`commit_plan`'s transition on SQLite, which a group-commit writer may run with the transitions of
    other sessions queued with it (`merged`; why: `durable_agent.backends.sqlite._group_commit`)."""

    transition: RunTransition
    cache: PrefixCache

    @property
    def key(self) -> tuple[str, str]:
        return ("session", self.transition.session_id)

    @staticmethod
    def merged(group: Sequence[MergeableCommit]) -> Plan[list[Any] | None]:
        """The transitions of `group` as a few statements: one fence check for all, then each kind of write
        (steps, latest runs, marks, checkpoints) once for all. A transition that opens awakeables,
        commits tool state, or whose checkpoint `merge_row` leaves alone is `ALONE`. Answers each
        checkpoint's revision (None without one), or None when a fence is stale or a run changed."""
        parts = [_CommitParts.of(commit) for commit in group]
        merged = [(commit.transition, part) for commit, part in zip(group, parts, strict=True) if part is not None]
        if merged:
            for fences in chunks([(t.session_id, t.epoch) for t, _ in merged], MERGED_STEP_ROWS):
                held = yield Query(
                    f"SELECT count(*) FROM (VALUES {', '.join(['(?, ?)'] * len(fences))}) AS v"
                    f" JOIN {LEASES} AS l ON l.session_id = v.column1 AND l.epoch = v.column2",
                    flat(fences), "one",
                )
                if held[0] != len(fences):
                    return None
            steps = [(part.steps, transition.epoch) for transition, part in merged if part.steps is not None]
            if not (yield from _merged_steps(steps)):
                return None
            for last_runs in chunks([(t.session_id, t.last_run) for t, _ in merged if t.last_run is not None],
                                    MERGED_STEP_ROWS):
                yield Query(
                    f"INSERT INTO {LAST_RUNS} (session_id, run_id) VALUES {', '.join(['(?, ?)'] * len(last_runs))}"
                    " ON CONFLICT (session_id) DO UPDATE SET run_id = excluded.run_id",
                    flat(last_runs),
                )
            for marks in chunks([(t.session_id, t.mark) for t, _ in merged if t.mark is not None or t.unmark],
                                MERGED_STEP_ROWS):
                yield Query(
                    f"UPDATE {LEASES} SET resumable_run = v.column2 FROM (VALUES {', '.join(['(?, ?)'] * len(marks))})"
                    f" AS v WHERE {LEASES}.session_id = v.column1",
                    flat(marks),
                )
            if not (yield from merged_saves([(part.save, None) for _, part in merged if part.save is not None])):
                return None
        return [ALONE if part is None else None if part.save is None else part.save.revision for part in parts]


@dataclass(frozen=True, slots=True)
class _CommitParts:
    """What a merged transition writes besides its fence and its lease columns: its folded steps, its checkpoint."""

    steps: _FoldedSteps | None
    save: SaveRow | None  # the checkpoint's `merge_row`, or None without a checkpoint

    @classmethod
    def of(cls, commit: MergeableCommit) -> _CommitParts | None:
        """None when the transition must run its own plan."""
        transition = commit.transition
        if transition.awakeables:
            return None
        deferred = transition.deferred
        steps = _FoldedSteps.of(deferred.records, deferred.streamed) if deferred.records else None
        if steps is not None and steps.ops:
            return None
        save = None
        if transition.checkpoint is not None:
            save = merge_row(commit.cache, transition.checkpoint, None)
            if save is None:
                return None
        return cls(steps, save)


def _transition_writes(d: Dialect, transition: RunTransition) -> list[Write]:
    """The writes of `transition` but its checkpoint, to run once the fence holds."""
    session_id = transition.session_id
    writes = _step_writes(d, transition.deferred.records, transition.deferred.streamed)
    if transition.last_run is not None:
        writes.append(_last_run_write(session_id, transition.last_run))
    if transition.mark is not None or transition.unmark:  # the fence holds: the lease row exists
        writes.append(Write(
            f"UPDATE {LEASES} SET resumable_run = ? WHERE session_id = ? AND {{guard}}", (transition.mark, session_id),
            certain=True,
        ))
    writes.extend(_awakeable_write(session_id, key, awakeable_id, None) for key, awakeable_id in transition.awakeables)
    return writes


def _append_plan(d: Dialect, transition: RunTransition, cache: PrefixCache) -> Plan[tuple[bool, int | None]]:
    """Try `transition` as ONE statement; (False, None) when it wrote nothing and must be committed in parts.

    The checkpoint part is the append-only save `save_plan` would do when the stored run is the
    one this process saved last: its new messages, its step-log row and its header. The statement
    checks that (the run's row at the remembered revision and message count, locked as the store's
    saves lock it) together with the fence; when either fails, none of its writes apply.
    """
    checkpoint = transition.checkpoint
    session_id, epoch = transition.session_id, transition.epoch
    ctes = [f"fence AS ({_FENCE}{d.lock_shared})"]
    params: list[Any] = [session_id, epoch]
    guard = _EXISTS_FENCE
    writes = _transition_writes(d, transition)
    revision = None
    if checkpoint is not None:
        run_id = checkpoint.run_id
        vouched = cache.appended(run_id, checkpoint.messages)
        if vouched is None:
            return False, None  # not known to be an append: the save reads the head and decides
        stored_revision, stored_count = vouched
        if d.lock_run is not None:
            ctes.append(f"run_lock AS ({d.lock_run})")
            params.append(run_id)
        ctes.append(  # no row where the new messages go: else the parts' save names the damage (`_append_rows`)
            f"head AS (SELECT 1 FROM {RUNS} WHERE run_id = ? AND revision = ? AND message_count = ?"
            f" AND NOT EXISTS (SELECT 1 FROM {MESSAGES} WHERE run_id = ? AND seq >= ?)"
            f" AND EXISTS (SELECT 1 FROM {'run_lock' if d.lock_run is not None else 'fence'}){d.lock_update})"
        )
        params.extend((run_id, stored_revision, stored_count, run_id, stored_count))
        guard = f"{_EXISTS_FENCE} AND EXISTS (SELECT 1 FROM head)"
        revision = new_revision()
        writes.extend(_append_writes(checkpoint, stored_count, revision))
    for i, write in enumerate(writes):
        ctes.append(f"w{i} AS ({write.guarded(guard)})")
        params.extend(write.params)
    fits = "(SELECT count(*) FROM head)" if checkpoint is not None else "1"
    fenced, fitted = yield Query(
        f"WITH {', '.join(ctes)} SELECT (SELECT count(*) FROM fence), {fits}", params, "one", alone=True
    )
    if fenced == 0:
        raise StaleEpochError(session_id, epoch)
    return fitted == 1, revision


def _append_writes(checkpoint: AgentCheckpoint, stored_count: int, revision: int) -> list[Write]:
    """`save_plan`'s writes for a checkpoint that appends to `stored_count` stored messages."""
    run_id, messages = checkpoint.run_id, checkpoint.messages
    bodies = encode_messages(messages, stored_count)
    header = encode_header(checkpoint)
    writes = []
    if bodies:
        writes.append(Write(
            f"INSERT INTO {MESSAGES} (run_id, seq, body) SELECT * FROM (VALUES "
            + ", ".join(["(?, CAST(? AS INTEGER), ?)"] * len(bodies))
            + ") AS v (run_id, seq, body) WHERE {guard}",
            flat((run_id, stored_count + i, body) for i, body in enumerate(bodies)),
        ))
    writes += [
        Write(f"DELETE FROM {STEP_LOG} WHERE run_id = ? AND step_index > ? AND {{guard}}", (run_id, checkpoint.step_index)),
        Write(
            f"INSERT INTO {STEP_LOG} (run_id, step_index, message_count, header) SELECT ?, ?, ?, ? WHERE {{guard}}"
            " ON CONFLICT (run_id, step_index) DO UPDATE SET"
            " message_count = excluded.message_count, header = excluded.header",
            (run_id, checkpoint.step_index, len(messages), header),
        ),
        Write(
            f"UPDATE {RUNS} SET step_index = ?, status = ?, created_at = ?, message_count = ?, revision = ?,"
            " header = ? WHERE run_id = ? AND {guard}",
            (checkpoint.step_index, checkpoint.status, checkpoint.created_at, len(messages), revision, header, run_id),
        ),
    ]
    return writes
