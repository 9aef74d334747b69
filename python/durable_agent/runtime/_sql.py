"""The SQL runtimes' logic, written once for SQLite and Postgres: schema, fenced writes, leases, stores.

Every operation is a plan (a generator yielding `Query` values and receiving their results,
as in `stores._sql`), run by a `SqlDriver` inside ONE transaction. A write of a lease holder
starts with `_fence`, which reads the session's lease row under a lock and raises
`StaleEpochError` when the epoch moved on: the plan stops, the driver rolls the transaction
back, so a stale writer's write is never applied and nothing interleaves with the new owner.

* SQLite: writes run under ``BEGIN IMMEDIATE`` (one writer at a time for the whole file), so
  the plain read in `_fence` cannot race a claim.
* Postgres: `_fence` reads the lease row ``FOR SHARE`` and a claim takes it ``FOR UPDATE``:
  a claim waits for fenced writes in flight to commit, and a fenced write waits for a claim
  in flight, then sees its new epoch (READ COMMITTED re-reads a locked row's latest version).
  Fenced writes of the same owner share the lock and do not serialize on each other.

Values (step results, errors, tool state, awakeable values, queue entries, submission
results) are stored as codec text, so bytes and reserved keys round-trip as in checkpoints.

Tables: ``durable_agent_steps`` (one row per (session, key), ``id`` keeps insertion order),
``durable_agent_partials``, ``durable_agent_awakeables``, ``durable_agent_leases`` (epoch,
owner, renewal, the run marked in progress), ``durable_agent_queues``,
``durable_agent_submissions``, ``durable_agent_tool_state``, ``durable_agent_last_runs``;
``durable_agent_journal_schema_version`` records the schema version.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from .._kernels import kernels
from ..checkpoint import AgentCheckpoint
from ..errors import CheckpointCorruptError, StaleEpochError, SubmissionConflictError, is_control_error
from ..stores._history import PrefixCache
from ..stores._sql import (
    Dialect as StatementDialect,
    Plan,
    Query,
    load_plan,
    migrate_plan,
    save_plan,
    schema_plan as checkpoint_schema_plan,
)
from ..stores._validate import check_checkpoint, check_expected, check_run_id
from .leases import Fences, OwnedRuntime, claimed_row, is_listed_resumable, may_claim
from .records import (
    AwakeableRecord,
    LeaseClaim,
    LeaseRow,
    ResumableRun,
    RunOwner,
    RunTransition,
    StepErrorRecord,
    StepRecord,
    StreamPartialRecord,
    ToolStateOp,
)
from .scope import JournalScope

STEPS = "durable_agent_steps"
PARTIALS = "durable_agent_partials"
AWAKEABLES = "durable_agent_awakeables"
LEASES = "durable_agent_leases"
QUEUES = "durable_agent_queues"
SUBMISSIONS = "durable_agent_submissions"
TOOL_STATE = "durable_agent_tool_state"
LAST_RUNS = "durable_agent_last_runs"
VERSIONS = "durable_agent_journal_schema_version"
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class JournalDialect:
    """What differs between SQLite and Postgres in the journal's SQL."""

    statements: StatementDialect  # placeholders and the checkpoint tables (shared with the session stores)
    serial: str  # an auto-numbered integer primary key column
    lock_shared: str  # suffix of a SELECT that must not race a claim ("" where writes are serialized)
    lock_update: str  # suffix of the SELECT of a claim
    lock_schema: str | None  # statement serializing migrations between processes
    notify: str | None  # statement waking awakeable waiters in other processes, one parameter


def _text(value: Any) -> str:
    return kernels.encode(value)


def _value(text: str | None) -> Any:
    return None if text is None else kernels.decode(text)


# ------------------------------------------------------------------ schema


def _schema_v1(d: JournalDialect) -> list[str]:
    return [
        f"CREATE TABLE IF NOT EXISTS {STEPS} (id {d.serial}, session_id TEXT NOT NULL, key TEXT NOT NULL,"
        " run_id TEXT NOT NULL, kind TEXT NOT NULL, replay TEXT NOT NULL, status TEXT NOT NULL,"
        " fingerprint TEXT, result TEXT NOT NULL, error TEXT, tool_state TEXT, UNIQUE (session_id, key))",
        f"CREATE INDEX IF NOT EXISTS {STEPS}_run ON {STEPS} (session_id, run_id)",
        f"CREATE TABLE IF NOT EXISTS {PARTIALS} (id {d.serial}, session_id TEXT NOT NULL, run_id TEXT NOT NULL,"
        " step_key TEXT NOT NULL, seq INTEGER NOT NULL, text TEXT NOT NULL, thinking TEXT)",
        f"CREATE INDEX IF NOT EXISTS {PARTIALS}_step ON {PARTIALS} (session_id, step_key)",
        f"CREATE INDEX IF NOT EXISTS {PARTIALS}_run ON {PARTIALS} (session_id, run_id)",
        f"CREATE TABLE IF NOT EXISTS {AWAKEABLES} (id TEXT PRIMARY KEY, session_id TEXT NOT NULL,"
        " key TEXT NOT NULL, resolved INTEGER NOT NULL, value TEXT NOT NULL, deadline BIGINT,"
        " UNIQUE (session_id, key))",
        f"CREATE TABLE IF NOT EXISTS {LEASES} (session_id TEXT PRIMARY KEY, epoch BIGINT NOT NULL,"
        " owner_host TEXT, owner_pid BIGINT, owner_token TEXT, renewed_at BIGINT NOT NULL,"
        " released INTEGER NOT NULL, resumable_run TEXT)",
        f"CREATE TABLE IF NOT EXISTS {QUEUES} (session_id TEXT PRIMARY KEY, entries TEXT NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS {SUBMISSIONS} (session_id TEXT NOT NULL, request_id TEXT NOT NULL,"
        " fingerprint TEXT NOT NULL, result TEXT NOT NULL, settled INTEGER NOT NULL,"
        " PRIMARY KEY (session_id, request_id))",
        f"CREATE TABLE IF NOT EXISTS {TOOL_STATE} (session_id TEXT NOT NULL, key TEXT NOT NULL,"
        " value TEXT NOT NULL, PRIMARY KEY (session_id, key))",
        f"CREATE TABLE IF NOT EXISTS {LAST_RUNS} (session_id TEXT PRIMARY KEY, run_id TEXT NOT NULL)",
    ]


MIGRATIONS = {1: _schema_v1}


def schema_plan(d: JournalDialect) -> Plan:
    """Create or migrate the journal tables to `SCHEMA_VERSION`, and the checkpoint tables the journal writes."""
    yield from checkpoint_schema_plan(d.statements)
    migrations = {version: make(d) for version, make in MIGRATIONS.items()}
    return (yield from migrate_plan(d.lock_schema, VERSIONS, SCHEMA_VERSION, migrations, "the journal schema"))


# ----------------------------------------------------------------- fencing


def _fence(d: JournalDialect, session_id: str, epoch: int | None) -> Plan:
    """Stop the plan with `StaleEpochError` unless `epoch` is the session's current one (None: unguarded)."""
    if epoch is None:
        return
    row = yield Query(f"SELECT epoch FROM {LEASES} WHERE session_id = ?{d.lock_shared}", (session_id,), "one")
    if row is None or row[0] != epoch:
        raise StaleEpochError(session_id, epoch)


# ------------------------------------------------------------------- steps

_STEP_COLUMNS = "session_id, run_id, key, kind, replay, status, fingerprint, result, error, tool_state"


def _step(row: Any) -> StepRecord:
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


def get_step_plan(session_id: str, key: str) -> Plan:
    row = yield Query(
        f"SELECT {_STEP_COLUMNS} FROM {STEPS} WHERE session_id = ? AND key = ?", (session_id, key), "one"
    )
    return None if row is None else _step(row)


def steps_plan(session_id: str | None, run_id: str | None) -> Plan:
    where, params = _where(session_id=session_id, run_id=run_id)
    rows = yield Query(f"SELECT {_STEP_COLUMNS} FROM {STEPS}{where} ORDER BY id", params, "all")
    return [_step(r) for r in rows]


def put_steps_plan(d: JournalDialect, records: Sequence[StepRecord], epoch: int | None) -> Plan:
    """Write the `records` of one session, fenced, in one transaction (see `_write_step`)."""
    sessions = {record.session_id for record in records}
    if len(sessions) != 1:
        raise ValueError("put_steps writes the records of one session")
    yield from _fence(d, sessions.pop(), epoch)
    for record in records:
        yield from _write_step(record)


def _write_step(record: StepRecord) -> Plan:
    """Upsert `record`; a ``done`` record commits its tool-state ops, a finished one drops its partials."""
    if record.status == "done" and record.tool_state:
        yield from _apply_tool_state(record.session_id, record.tool_state)
    yield Query(
        f"INSERT INTO {STEPS} ({_STEP_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (session_id, key) DO UPDATE SET run_id = excluded.run_id, kind = excluded.kind,"
        " replay = excluded.replay, status = excluded.status, fingerprint = excluded.fingerprint,"
        " result = excluded.result, error = excluded.error, tool_state = excluded.tool_state",
        (
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
        ),
    )
    if record.status != "pending":
        yield Query(
            f"DELETE FROM {PARTIALS} WHERE session_id = ? AND step_key = ?", (record.session_id, record.key)
        )


def _apply_tool_state(session_id: str, ops: tuple[ToolStateOp, ...]) -> Plan:
    for op in ops:
        if op.get("op") == "set":
            yield Query(
                f"INSERT INTO {TOOL_STATE} (session_id, key, value) VALUES (?, ?, ?)"
                " ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value",
                (session_id, op["key"], _text(op.get("value"))),
            )
        elif op.get("op") == "delete":
            yield Query(f"DELETE FROM {TOOL_STATE} WHERE session_id = ? AND key = ?", (session_id, op["key"]))
        else:
            raise ValueError(f"unknown tool-state op {op!r}")


def tool_state_plan(session_id: str, key: str | None) -> Plan:
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


def add_partial_plan(d: JournalDialect, record: StreamPartialRecord, epoch: int | None) -> Plan:
    yield from _fence(d, record.session_id, epoch)
    yield Query(
        f"INSERT INTO {PARTIALS} (session_id, run_id, step_key, seq, text, thinking)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (record.session_id, record.run_id, record.step_key, record.seq, record.text, record.thinking),
    )


def partials_plan(session_id: str | None, run_id: str | None) -> Plan:
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


def _awakeable(row: Any) -> AwakeableRecord:
    awakeable_id, session_id, key, resolved, value, deadline = row
    return AwakeableRecord(awakeable_id, session_id, key, bool(resolved), _value(value), deadline)


def find_awakeable_plan(session_id: str, key: str) -> Plan:
    row = yield Query(
        f"SELECT {_AWAKEABLE_COLUMNS} FROM {AWAKEABLES} WHERE session_id = ? AND key = ?",
        (session_id, key),
        "one",
    )
    return None if row is None else _awakeable(row)


def get_awakeable_plan(awakeable_id: str) -> Plan:
    row = yield Query(f"SELECT {_AWAKEABLE_COLUMNS} FROM {AWAKEABLES} WHERE id = ?", (awakeable_id,), "one")
    return None if row is None else _awakeable(row)


def awakeables_plan() -> Plan:
    rows = yield Query(f"SELECT {_AWAKEABLE_COLUMNS} FROM {AWAKEABLES} ORDER BY session_id, key", (), "all")
    return [_awakeable(r) for r in rows]


def awakeable_for_plan(
    d: JournalDialect, session_id: str, key: str, new_id: str, deadline: int | None, epoch: int | None
) -> Plan:
    """The awakeable of (session, key), created (fenced) with `new_id` and `deadline` when there is none."""
    found = yield from find_awakeable_plan(session_id, key)
    if found is not None:
        return found
    yield from _fence(d, session_id, epoch)
    yield Query(
        f"INSERT INTO {AWAKEABLES} ({_AWAKEABLE_COLUMNS}) VALUES (?, ?, ?, 0, ?, ?)"
        " ON CONFLICT (session_id, key) DO NOTHING",
        (new_id, session_id, key, _text(None), deadline),
    )
    return (yield from find_awakeable_plan(session_id, key))  # ours, or a racing writer's


def resolve_awakeable_plan(d: JournalDialect, awakeable_id: str, value: Any) -> Plan:
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


def _lease(row: Any) -> LeaseRow:
    epoch, host, pid, token, renewed_at, released, resumable_run = row
    owner = RunOwner(host, int(pid), token) if token is not None else None
    return LeaseRow(int(epoch), owner, int(renewed_at), bool(released), resumable_run)


def _ensure_lease(session_id: str) -> Plan:
    yield Query(
        f"INSERT INTO {LEASES} (session_id, epoch, renewed_at, released) VALUES (?, 0, 0, 1)"
        " ON CONFLICT (session_id) DO NOTHING",
        (session_id,),
    )


def claim_plan(d: JournalDialect, session_id: str, claimer: RunOwner, stale_at: int, now: int) -> Plan:
    """Take the session's lease when the rules (`leases.may_claim`) allow it, bumping the epoch."""
    yield from _ensure_lease(session_id)
    row = _lease(
        (
            yield Query(
                f"SELECT {_LEASE_COLUMNS} FROM {LEASES} WHERE session_id = ?{d.lock_update}",
                (session_id,),
                "one",
            )
        )
    )
    if not may_claim(row, claimer, stale_at=stale_at, now=now):
        return LeaseClaim(False, owner=row.owner)
    taken = claimed_row(row, claimer, now)
    yield Query(
        f"UPDATE {LEASES} SET epoch = ?, owner_host = ?, owner_pid = ?, owner_token = ?, renewed_at = ?,"
        " released = 0 WHERE session_id = ?",
        (taken.epoch, claimer.host, claimer.pid, claimer.token, now, session_id),
    )
    return LeaseClaim(True, epoch=taken.epoch)


def renew_plan(session_id: str, epoch: int, now: int) -> Plan:
    row = yield Query(
        f"UPDATE {LEASES} SET renewed_at = ? WHERE session_id = ? AND epoch = ? AND released = 0"
        " RETURNING epoch",
        (now, session_id, epoch),
        "one",
    )
    return row is not None


def release_plan(session_id: str, epoch: int) -> Plan:
    yield Query(f"UPDATE {LEASES} SET released = 1 WHERE session_id = ? AND epoch = ?", (session_id, epoch))


def lease_epoch_plan(session_id: str) -> Plan:
    row = yield Query(f"SELECT epoch FROM {LEASES} WHERE session_id = ?", (session_id,), "one")
    return int(row[0]) if row is not None and row[0] > 0 else None


def mark_resumable_plan(d: JournalDialect, session_id: str, run_id: str | None, epoch: int | None) -> Plan:
    yield from _fence(d, session_id, epoch)
    yield from _mark(session_id, run_id)


def _mark(session_id: str, run_id: str | None) -> Plan:
    yield from _ensure_lease(session_id)
    yield Query(f"UPDATE {LEASES} SET resumable_run = ? WHERE session_id = ?", (run_id, session_id))


def marked_run_plan(session_id: str) -> Plan:
    row = yield Query(f"SELECT resumable_run FROM {LEASES} WHERE session_id = ?", (session_id,), "one")
    return None if row is None else row[0]


def resumable_plan(session_id: str | None, stale_at: int, now: int) -> Plan:
    """Runs `leases.is_listed_resumable` lists, in session order."""
    only = " AND session_id = ?" if session_id is not None else ""
    rows = yield Query(
        f"SELECT session_id, {_LEASE_COLUMNS} FROM {LEASES}"
        f" WHERE resumable_run IS NOT NULL AND epoch > 0{only} ORDER BY session_id",
        (session_id,) if session_id is not None else (),
        "all",
    )
    runs = []
    for sid, *columns in rows:
        row = _lease(columns)
        keys = yield Query(
            f"SELECT key FROM {AWAKEABLES} WHERE session_id = ? AND resolved = 0", (sid,), "all"
        )
        if row.resumable_run is not None and is_listed_resumable(
            row, (k for (k,) in keys), stale_at=stale_at, now=now
        ):
            runs.append(ResumableRun(sid, row.resumable_run, row.epoch))
    return runs


# ---------------------------------------------- queue, submissions, runs


def queue_read_plan(session_id: str) -> Plan:
    row = yield Query(f"SELECT entries FROM {QUEUES} WHERE session_id = ?", (session_id,), "one")
    return [] if row is None else list(_value(row[0]))


def queue_write_plan(d: JournalDialect, session_id: str, entries: list[Any], epoch: int | None) -> Plan:
    yield from _fence(d, session_id, epoch)
    yield Query(
        f"INSERT INTO {QUEUES} (session_id, entries) VALUES (?, ?)"
        " ON CONFLICT (session_id) DO UPDATE SET entries = excluded.entries",
        (session_id, _text(list(entries))),
    )


def submission_claim_plan(session_id: str, request_id: str, fingerprint: str) -> Plan:
    new = yield Query(
        f"INSERT INTO {SUBMISSIONS} (session_id, request_id, fingerprint, result, settled)"
        " VALUES (?, ?, ?, ?, 0) ON CONFLICT (session_id, request_id) DO NOTHING RETURNING settled",
        (session_id, request_id, fingerprint, _text(None)),
        "one",
    )
    if new is not None:
        return True, None
    stored, result = yield Query(
        f"SELECT fingerprint, result FROM {SUBMISSIONS} WHERE session_id = ? AND request_id = ?",
        (session_id, request_id),
        "one",
    )
    if stored != fingerprint:
        raise SubmissionConflictError(session_id, request_id)
    return False, _value(result)


def submission_settle_plan(session_id: str, request_id: str, result: Any) -> Plan:
    if result is None:
        yield Query(
            f"DELETE FROM {SUBMISSIONS} WHERE session_id = ? AND request_id = ?", (session_id, request_id)
        )
    else:
        yield Query(
            f"UPDATE {SUBMISSIONS} SET result = ?, settled = 1 WHERE session_id = ? AND request_id = ?",
            (_text(result), session_id, request_id),
        )


def last_run_plan(session_id: str) -> Plan:
    row = yield Query(f"SELECT run_id FROM {LAST_RUNS} WHERE session_id = ?", (session_id,), "one")
    return None if row is None else row[0]


def set_last_run_plan(d: JournalDialect, session_id: str, run_id: str, epoch: int | None) -> Plan:
    yield from _fence(d, session_id, epoch)
    yield from _set_last_run(session_id, run_id)


def _set_last_run(session_id: str, run_id: str) -> Plan:
    yield Query(
        f"INSERT INTO {LAST_RUNS} (session_id, run_id) VALUES (?, ?)"
        " ON CONFLICT (session_id) DO UPDATE SET run_id = excluded.run_id",
        (session_id, run_id),
    )


def commit_plan(d: JournalDialect, transition: RunTransition, cache: PrefixCache) -> Plan:
    """A `RunTransition` as one plan: the fence, then each part it holds; returns the checkpoint's revision."""
    session_id = transition.session_id
    yield from _fence(d, session_id, transition.epoch)
    for record in transition.steps:
        yield from _write_step(record)
    revision = None
    if transition.checkpoint is not None:
        revision = yield from save_plan(cache, transition.checkpoint, None, d.statements)
    if transition.last_run is not None:
        yield from _set_last_run(session_id, transition.last_run)
    if transition.mark is not None or transition.unmark:
        yield from _mark(session_id, transition.mark)
    for key, awakeable_id in transition.awakeables:
        yield Query(
            f"INSERT INTO {AWAKEABLES} ({_AWAKEABLE_COLUMNS}) VALUES (?, ?, ?, 0, ?, NULL)"
            " ON CONFLICT (session_id, key) DO NOTHING",
            (awakeable_id, session_id, key, _text(None)),
        )
    return revision


# ------------------------------------------------------- the runtime itself


class SqlDriver(Protocol):
    """Runs plans on one database: each plan in one transaction, rolled back when the plan raises."""

    dialect: JournalDialect

    async def run(self, plan: Plan, *, write: bool) -> Any: ...

    async def wait_for_change(self, timeout: float) -> None: ...


class SqlJournal:
    """`JournalBackend` over a `SqlDriver`; a refused fenced write also tells the runtime's `Fences`."""

    def __init__(self, driver: SqlDriver, fences: Fences) -> None:
        self._driver = driver
        self._d = driver.dialect
        self._fences = fences

    async def read(self, plan: Plan) -> Any:
        return await self._driver.run(plan, write=False)

    async def write(self, plan: Plan) -> Any:
        try:
            return await self._driver.run(plan, write=True)
        except StaleEpochError as error:
            self._fences.refused(error)
            raise

    async def get_step(self, session_id: str, key: str) -> StepRecord | None:
        return await self.read(get_step_plan(session_id, key))  # type: ignore[no-any-return]

    async def put_steps(self, records: Sequence[StepRecord], *, epoch: int | None) -> None:
        await self.write(put_steps_plan(self._d, records, epoch))

    async def run_steps(self, session_id: str, run_id: str) -> list[StepRecord]:
        return await self.read(steps_plan(session_id, run_id))  # type: ignore[no-any-return]

    async def add_partial(self, record: StreamPartialRecord, *, epoch: int | None) -> None:
        await self.write(add_partial_plan(self._d, record, epoch))

    async def run_partials(self, session_id: str, run_id: str) -> list[StreamPartialRecord]:
        return await self.read(partials_plan(session_id, run_id))  # type: ignore[no-any-return]

    async def awakeable_for(
        self, session_id: str, key: str, new_id: str, deadline: int | None, *, epoch: int | None
    ) -> AwakeableRecord:
        return await self.write(  # type: ignore[no-any-return]
            awakeable_for_plan(self._d, session_id, key, new_id, deadline, epoch)
        )

    async def get_awakeable(self, awakeable_id: str) -> AwakeableRecord | None:
        return await self.read(get_awakeable_plan(awakeable_id))  # type: ignore[no-any-return]

    async def wait_for_change(self, timeout: float) -> None:
        await self._driver.wait_for_change(timeout)


class SqlLease:
    """`DurableLease` over the leases table; the rules are `leases`', the fences this runtime's."""

    def __init__(self, runtime: SqlRuntime) -> None:
        self._runtime = runtime
        self._journal = runtime.backend
        self._d = runtime.backend._d

    async def claim(
        self,
        session_id: str,
        *,
        stale_at: int,
        owner: RunOwner | None = None,
        on_stale: Callable[[StaleEpochError], None] | None = None,
    ) -> LeaseClaim:
        claim: LeaseClaim = await self._journal.write(
            claim_plan(self._d, session_id, owner or self._runtime.owner, stale_at, self._runtime.clock())
        )
        if claim.claimed:
            assert claim.epoch is not None
            self._runtime.fences.claimed(session_id, claim.epoch, on_stale)
        return claim

    async def renew(self, session_id: str, epoch: int) -> bool:
        return await self._journal.write(renew_plan(session_id, epoch, self._runtime.clock()))  # type: ignore[no-any-return]

    async def release(self, session_id: str, epoch: int) -> None:
        try:
            await self._journal.write(release_plan(session_id, epoch))
        finally:
            self._runtime.fences.released(session_id, epoch)

    async def epoch(self, session_id: str) -> int | None:
        return await self._journal.read(lease_epoch_plan(session_id))  # type: ignore[no-any-return]

    async def mark_resumable(self, session_id: str, run_id: str | None, epoch: int | None) -> None:
        """Mark (or with None, unmark) the session's run as in progress, so `resumable` can list it."""
        await self._journal.write(mark_resumable_plan(self._d, session_id, run_id, epoch))

    async def marked_run(self, session_id: str) -> str | None:
        return await self._journal.read(marked_run_plan(session_id))  # type: ignore[no-any-return]

    async def resumable(self, *, stale_at: int, session_id: str | None = None) -> list[ResumableRun]:
        return await self._journal.read(  # type: ignore[no-any-return]
            resumable_plan(session_id, stale_at, self._runtime.clock())
        )


class SqlQueueStore:
    """The session's type-ahead queue; a write is fenced by this runtime's claim of the session."""

    def __init__(self, runtime: SqlRuntime) -> None:
        self._runtime = runtime

    async def read(self, session_id: str) -> list[Any]:
        return await self._runtime.backend.read(queue_read_plan(session_id))  # type: ignore[no-any-return]

    async def write(self, session_id: str, entries: list[Any]) -> None:
        runtime = self._runtime
        await runtime.backend.write(
            queue_write_plan(runtime.dialect, session_id, entries, runtime.fences.epoch(session_id))
        )


class SqlSubmissionStore:
    """Client request ids of sends: a retried send with the same id gets the first send's outcome."""

    def __init__(self, runtime: SqlRuntime) -> None:
        self._journal = runtime.backend

    async def claim(self, session_id: str, request_id: str, fingerprint: str) -> tuple[bool, Any]:
        """(True, None) when this send is new; (False, earlier result) for a retry of the same input."""
        return await self._journal.write(  # type: ignore[no-any-return]
            submission_claim_plan(session_id, request_id, fingerprint)
        )

    async def settle(self, session_id: str, request_id: str, result: Any) -> None:
        """Store the send's result; None drops the claim so a retry runs again."""
        await self._journal.write(submission_settle_plan(session_id, request_id, result))


class SqlToolStateStore:
    """Tool state of one session, as committed with the ``done`` records of its steps."""

    def __init__(self, runtime: SqlRuntime, session_id: str) -> None:
        self._journal, self._session_id = runtime.backend, session_id

    async def all(self) -> dict[str, Any]:
        return await self._journal.read(tool_state_plan(self._session_id, None))  # type: ignore[no-any-return]

    async def get(self, key: str, default: Any = None) -> Any:
        return (await self._journal.read(tool_state_plan(self._session_id, key))).get(key, default)


class SqlRunBook:
    """Which run of each session is the latest (its checkpoint holds the session's history)."""

    def __init__(self, runtime: SqlRuntime) -> None:
        self._runtime = runtime

    async def last(self, session_id: str) -> str | None:
        return await self._runtime.backend.read(last_run_plan(session_id))  # type: ignore[no-any-return]

    async def set_last(self, session_id: str, run_id: str, epoch: int | None) -> None:
        await self._runtime.backend.write(set_last_run_plan(self._runtime.dialect, session_id, run_id, epoch))


class SqlInspector:
    """Read access to the stored steps, partials and awakeables, for tests and diagnostics."""

    def __init__(self, runtime: SqlRuntime) -> None:
        self._journal = runtime.backend

    async def steps(self, run_id: str | None = None) -> list[StepRecord]:
        return await self._journal.read(steps_plan(None, run_id))  # type: ignore[no-any-return]

    async def partials(self, run_id: str | None = None) -> list[StreamPartialRecord]:
        return await self._journal.read(partials_plan(None, run_id))  # type: ignore[no-any-return]

    async def awakeables(self) -> list[AwakeableRecord]:
        return await self._journal.read(awakeables_plan())  # type: ignore[no-any-return]


class SqlCheckpoints:
    """The runtime's checkpoints, read through its own connection (off the event loop's thread on SQLite).

    The runtime writes them itself, fenced, in its lifecycle commits (`SqlRuntime.commit`);
    `save` here is the plain, unfenced store save (with the optional `expected_step_index` guard).
    """

    def __init__(self, runtime: SqlRuntime) -> None:
        self._runtime = runtime

    async def load(self, run_id: str) -> AgentCheckpoint | None:
        check_run_id(run_id)
        try:
            found = await self._runtime.backend.read(load_plan(run_id))
        except CheckpointCorruptError:
            raise
        except Exception as exc:
            if "decode" in str(exc):  # SQLite text that is not UTF-8: a damaged row
                raise CheckpointCorruptError(f"stored text is not UTF-8 ({exc})", run_id=run_id) from None
            raise
        if found is None:
            return None
        checkpoint, revision = found
        if type(revision) is int:
            self._runtime.checkpoint_cache.remember(run_id, revision, checkpoint.messages)
        return checkpoint  # type: ignore[no-any-return]

    async def save(self, checkpoint: AgentCheckpoint, *, expected_step_index: int | None = None) -> None:
        checked, expected = check_checkpoint(checkpoint), check_expected(expected_step_index)
        cache = self._runtime.checkpoint_cache
        try:
            revision = await self._runtime.backend.write(
                save_plan(cache, checked, expected, self._runtime.dialect.statements)
            )
        except BaseException:
            cache.forget(checked.run_id)
            raise
        cache.remember(checked.run_id, revision, checked.messages)


@dataclass(frozen=True, slots=True)
class SqlStores:
    """Everything a run persists, behind one runtime, in its one database."""

    runtime: SqlRuntime

    @property
    def session(self) -> SqlCheckpoints:
        return SqlCheckpoints(self.runtime)

    @property
    def queue(self) -> SqlQueueStore:
        return SqlQueueStore(self.runtime)

    @property
    def submissions(self) -> SqlSubmissionStore:
        return SqlSubmissionStore(self.runtime)

    @property
    def runs(self) -> SqlRunBook:
        return SqlRunBook(self.runtime)

    def tool_state(self, session_id: str) -> SqlToolStateStore:
        return SqlToolStateStore(self.runtime, session_id)


class SqlRuntime(OwnedRuntime):
    """A checkpoint-mode `DurableRuntime` over a `SqlDriver`: what the SQLite and Postgres runtimes share.

    One instance is one "process": its own owner token and fences. Several instances (in
    one process or many) over one database are several processes on that database.
    """

    mode = "checkpoint"

    def __init__(self, driver: SqlDriver, *, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.fences = Fences()
        self.dialect = driver.dialect
        self.checkpoint_cache = PrefixCache()  # what this "process" last wrote or read of each run
        self.backend = SqlJournal(driver, self.fences)
        self.lease = SqlLease(self)
        self.stores = SqlStores(self)
        self.inspect = SqlInspector(self)

    def is_control_error(self, error: BaseException) -> bool:
        return is_control_error(error)

    async def open_run(
        self, *, session_id: str, run_id: str, epoch: int | None = None
    ) -> JournalScope:
        """A run's scope; its writes are guarded by `epoch`, by default this runtime's claim of the session."""
        return JournalScope(
            self.backend,
            session_id=session_id,
            run_id=run_id,
            epoch=epoch if epoch is not None else self.fences.epoch(session_id),
            is_control_error=self.is_control_error,
            clock=self.clock,
        )

    async def commit(self, transition: RunTransition) -> None:
        """Apply `transition` in one transaction with the lease's epoch checked inside it."""
        checkpoint = transition.checkpoint
        if checkpoint is not None:
            check_checkpoint(checkpoint)
        try:
            revision = await self.backend.write(commit_plan(self.dialect, transition, self.checkpoint_cache))
        except BaseException:
            if checkpoint is not None:
                self.checkpoint_cache.forget(checkpoint.run_id)  # unknown outcome: the next save re-reads
            raise
        if checkpoint is not None:
            self.checkpoint_cache.remember(checkpoint.run_id, revision, checkpoint.messages)

    async def resolve_awakeable(self, awakeable_id: str, value: Any) -> bool:
        """Resolve from the resumer's side, also while no process runs the run. False: no such id."""
        return await self.backend.write(  # type: ignore[no-any-return]
            resolve_awakeable_plan(self.dialect, awakeable_id, value)
        )

    async def find_awakeable(self, session_id: str, key: str) -> AwakeableRecord | None:
        return await self.backend.read(find_awakeable_plan(session_id, key))  # type: ignore[no-any-return]
