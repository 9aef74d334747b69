"""The checkpoint stores' schema and plans, written once for SQLite, sync Postgres and async Postgres.

Each operation is a plan (`durable_agent.backends._sql.plan`); the checkpoint stores and the SQL runtimes
run them with their drivers. The SQL is the same for SQLite and Postgres except for
placeholders and the per-run write lock, kept in `Dialect`.

Tables (see `MIGRATIONS`): `durable_agent_runs` holds one header row per run
(`message_count`, the `revision` token of its last save, and the columns list/prune
filter on); `durable_agent_messages` one row per message, `(run_id, seq)` unique;
`durable_agent_step_log` (schema 2) the step log: per run and step index, the header saved at
that step and its history's length (`durable_agent._storage.step_log` states the rules). Runs
saved before schema 2 have no step rows: only their latest step can be read back. A load reads
the rows in order and decodes their bodies in batches (`_history.decode_batched`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..._checkpoint import AgentCheckpoint, RunStatus
from ..._errors import CheckpointConflictError, CheckpointCorruptError
from ..._storage.history import PrefixCache, kept_by_encoding, new_revision
from ..._storage.sealing import HEADER, MESSAGE, PLAINTEXT, RowSealer
from ..._storage.validate import page, prunable, readable_id, readable_ids
from .plan import ALONE, Dialect, Guard, Plan, Query, chunks, flat, migrate_plan, run_async, run_sync
from .rekey import SealedColumn

__all__ = [  # the plan machinery too: the checkpoint stores import this module as their `_sql`
    "Dialect",
    "MergeableSave",
    "SaveRow",
    "merge_row",
    "merged_saves",
    "Plan",
    "Query",
    "delete_plan",
    "list_plan",
    "load_plan",
    "load_step_plan",
    "prune_plan",
    "remembered",
    "run_async",
    "run_sync",
    "save_plan",
    "schema_plan",
]

RUNS = "durable_agent_runs"
MESSAGES = "durable_agent_messages"
STEPS = "durable_agent_step_log"
VERSIONS = "durable_agent_schema_version"
SCHEMA_VERSION = 2
SCHEMA_LOCK = 20260  # the migration lock's key (Postgres advisory lock)
ROWS_PER_INSERT = 256  # message rows per INSERT statement (3 placeholders each: far below SQLite's limit)


def _schema_v1(dialect: Dialect) -> list[str]:
    t = dialect.text_type
    return [
        f"CREATE TABLE IF NOT EXISTS {RUNS} ("
        f" run_id {t} PRIMARY KEY, step_index BIGINT NOT NULL, status TEXT NOT NULL,"
        " created_at BIGINT NOT NULL, message_count INTEGER NOT NULL, revision BIGINT NOT NULL,"
        " header TEXT NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS {MESSAGES} ("
        f" run_id {t} NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (run_id, seq))",
        f"CREATE INDEX IF NOT EXISTS {RUNS}_status ON {RUNS} (status, run_id)",
    ]


def _schema_v2(dialect: Dialect) -> list[str]:
    return [
        f"CREATE TABLE IF NOT EXISTS {STEPS} ("
        f" run_id {dialect.text_type} NOT NULL, step_index BIGINT NOT NULL, message_count INTEGER NOT NULL,"
        " header TEXT NOT NULL, PRIMARY KEY (run_id, step_index))",
    ]


MIGRATIONS = {1: _schema_v1, 2: _schema_v2}  # version -> statements that bring the previous version to it

SEALED_COLUMNS = (  # the columns `durable_agent._storage.sealing` seals, and their places (`rekey_plan`)
    SealedColumn(RUNS, "header", ("run_id",), HEADER, ("run_id", "step_index")),
    SealedColumn(MESSAGES, "body", ("run_id", "seq"), MESSAGE, binary=True),
    SealedColumn(STEPS, "header", ("run_id", "step_index"), HEADER),
)


def schema_plan(dialect: Dialect) -> Plan[None]:
    """Create or migrate the store's tables to `SCHEMA_VERSION`."""
    migrations = {version: make(dialect) for version, make in MIGRATIONS.items()}
    yield from migrate_plan(dialect, SCHEMA_LOCK, VERSIONS, SCHEMA_VERSION, migrations, "the store's schema")


def _bodies(rows: Sequence[Sequence[Any]]) -> list[Any]:
    """Message bodies of the contiguous rows numbered 0, 1, 2, ... (stops at the first gap)."""
    bodies = []
    for expected, row in enumerate(rows):
        if row[0] != expected:
            break
        bodies.append(row[1])
    return bodies


def save_plan(
    cache: PrefixCache,
    checkpoint: AgentCheckpoint,
    expected_step_index: int | None,
    dialect: Dialect,
    guard: Guard | None = None,
    sealer: RowSealer = PLAINTEXT,
) -> Plan[int]:
    """Write `checkpoint` appending only its new messages; returns the revision written.

    `guard`: a condition checked inside the save's header write, its first write (the SQLite
    runtime's lease fence): when it fails, the plan raises `guard.refused` having written nothing.
    `sealer`: builds the rows (`durable_agent._storage.sealing`: sealed under the store's keyring, or not).

    The caller runs this inside one transaction and, after the commit, tells the cache
    (`cache.remember(run_id, revision, messages)`). When the plan or the commit fails, the
    caller must `cache.forget(run_id)`: the stored rows are then unknown (a stray row, a
    damaged header), and only a save that re-reads them can heal the run.

    A header whose `message_count` or `revision` is not an int, and rows numbered below 0,
    are healed by the save (the rows are re-read and replaced), never kept.
    """
    run_id = checkpoint.run_id
    messages = checkpoint.messages
    if dialect.lock_run is not None:
        yield Query(dialect.lock_run, (run_id,))
    appended = yield from _append_plan(cache, checkpoint, expected_step_index, guard, sealer)
    if appended is not None:
        return appended
    head = yield Query(
        f"SELECT step_index, message_count, revision FROM {RUNS} WHERE run_id = ?", (run_id,), "one"
    )
    stored_step, stored_count, stored_revision = (None, 0, None) if head is None else head
    if expected_step_index is not None and stored_step != expected_step_index:
        raise CheckpointConflictError(run_id, expected_step_index, stored_step)
    trusted = type(stored_count) is int and type(stored_revision) is int
    keep = cache.kept(run_id, stored_revision, messages) if trusted or head is None else None
    if keep is None:
        rows = yield Query(
            f"SELECT seq, body FROM {MESSAGES} WHERE run_id = ? ORDER BY seq", (run_id,), "all"
        )
        keep = kept_by_encoding(sealer.comparable(run_id, _bodies(rows)), messages)
        stored_count = len(rows)
    bodies = sealer.message_rows(run_id, messages, keep)
    revision = new_revision()
    header = sealer.header_row(checkpoint)
    values = (run_id, checkpoint.step_index, checkpoint.status, checkpoint.created_at, len(messages), revision, header)
    upsert = (
        " ON CONFLICT (run_id) DO UPDATE SET"
        " step_index = excluded.step_index, status = excluded.status, created_at = excluded.created_at,"
        " message_count = excluded.message_count, revision = excluded.revision, header = excluded.header"
    )
    columns = f"INSERT INTO {RUNS} (run_id, step_index, status, created_at, message_count, revision, header)"
    if guard is None:
        yield Query(f"{columns} VALUES (?, ?, ?, ?, ?, ?, ?){upsert}", values)
    elif not (yield Query(f"{columns} SELECT ?, ?, ?, ?, ?, ?, ? WHERE {guard.sql}{upsert}",
                          (*values, *guard.params), "count")):
        raise guard.refused
    if head is None:  # rows left by a corrupt or foreign writer must not collide with ours
        yield Query(f"DELETE FROM {MESSAGES} WHERE run_id = ?", (run_id,))
        yield Query(f"DELETE FROM {STEPS} WHERE run_id = ?", (run_id,))
    if keep < stored_count:
        yield Query(f"DELETE FROM {MESSAGES} WHERE run_id = ? AND (seq >= ? OR seq < 0)", (run_id, keep))
        yield Query(f"DELETE FROM {STEPS} WHERE run_id = ? AND message_count > ?", (run_id, keep))
    yield from _append_rows(run_id, bodies, keep)
    if head is not None and not (type(stored_step) is int and stored_step < checkpoint.step_index):
        # a step saved again (or an unknown head): the entries after it belong to a replaced timeline.
        # Else none exists: every save leaves none after the run's head step (`durable_agent._storage.step_log`)
        yield Query(f"DELETE FROM {STEPS} WHERE run_id = ? AND step_index > ?", (run_id, checkpoint.step_index))
    yield _step_log_row(checkpoint, header)
    return revision


def _append_plan(
    cache: PrefixCache,
    checkpoint: AgentCheckpoint,
    expected_step_index: int | None,
    guard: Guard | None,
    sealer: RowSealer,
) -> Plan[int | None]:
    """`save_plan` for the common case, in one statement fewer: its revision, or None (nothing written).

    When this process saved the run last (the cache vouches for its revision and message count),
    the new history only appends to that, and the step moves forward, the header's update itself
    checks all of it (and the guard) and says whether it applied; only then are the new messages
    and the step-log row written. Anything else, `save_plan` reads the head and decides.
    """
    append = SaveRow.of(cache, checkpoint, sealer)
    if append is None:
        return None
    checks = " AND step_index = ?" if expected_step_index is not None else ""
    params: tuple[Any, ...] = (*append.header_row[1:], checkpoint.run_id, append.stored_revision, append.stored_count,
                               checkpoint.step_index)
    if expected_step_index is not None:
        params += (expected_step_index,)
    if guard is not None:
        checks += f" AND {guard.sql}"
        params += guard.params
    if not (yield Query(
        f"UPDATE {RUNS} SET step_index = ?, status = ?, created_at = ?, message_count = ?, revision = ?, header = ?"
        f" WHERE run_id = ? AND revision = ? AND message_count = ? AND step_index < ?{checks}",
        params, "count",
    )):
        return None
    yield from _append_rows(checkpoint.run_id, append.bodies, append.stored_count)
    yield _step_log_row(checkpoint, append.header_row[6])
    return append.revision


@dataclass(frozen=True, slots=True)
class SaveRow:
    """What a save writes for one run: its header row, the message bodies it adds, and the stored head it
    follows (`stored_revision` None: a new run's first save, `merge_row`)."""

    header_row: tuple[Any, ...]  # run_id, step_index, status, created_at, message_count, revision, header
    bodies: list[str]
    stored_revision: int | None  # None: a new run's first save (`merge_row`)
    stored_count: int

    @property
    def revision(self) -> int:
        return int(self.header_row[5])

    @classmethod
    def following(
        cls, checkpoint: AgentCheckpoint, stored_revision: int | None, stored_count: int, sealer: RowSealer = PLAINTEXT
    ) -> SaveRow:
        """`checkpoint` written after the stored head (`stored_revision`, `stored_count`), at a fresh revision."""
        messages = checkpoint.messages
        row = (checkpoint.run_id, checkpoint.step_index, checkpoint.status, checkpoint.created_at, len(messages),
               new_revision(), sealer.header_row(checkpoint))
        return cls(row, sealer.message_rows(checkpoint.run_id, messages, stored_count), stored_revision, stored_count)

    @classmethod
    def of(cls, cache: PrefixCache, checkpoint: AgentCheckpoint, sealer: RowSealer = PLAINTEXT) -> SaveRow | None:
        """The append `checkpoint` makes to this process's last save of its run; None when the cache cannot vouch."""
        vouched = cache.appended(checkpoint.run_id, checkpoint.messages)
        return None if vouched is None else cls.following(checkpoint, *vouched, sealer)


def merge_row(
    cache: PrefixCache, checkpoint: AgentCheckpoint, expected_step_index: int | None, sealer: RowSealer = PLAINTEXT
) -> SaveRow | None:
    """What a merged save writes for `checkpoint` (`merged_saves`): an append to this process's last save
    of its run, or a new run's first save (the cache knows nothing of it); None when the save
    must run its own plan (the cache knows the run but the history is rewritten, or a new run
    is saved with an expected step)."""
    append = SaveRow.of(cache, checkpoint, sealer)
    if append is not None or cache.revision(checkpoint.run_id) is not None or expected_step_index is not None:
        return append
    return SaveRow.following(checkpoint, None, 0, sealer)


MERGED_SAVES = 256  # saves per merged header statement (a power of 2: `chunks`): 10 parameters each
MERGED_ROWS = 1024  # rows per merged INSERT (a power of 2): at most 4 parameters each


def merged_saves(saves: Sequence[tuple[SaveRow, int | None]]) -> Plan[bool]:
    """Write `saves` (`merge_row`s of distinct runs, each with its expected step index) in a few statements
    for all; False when a run is not as its row expects (another writer, a conflict, a new run
    that exists): the caller then undoes the plan's writes (a savepoint).

    As `save_plan`, a new run first drops rows a corrupt or foreign writer left under its id.
    VALUES names its columns column1, column2, ...: run_id, step_index, status, created_at,
    message_count, revision, header, then the stored revision and count an append follows and
    the expected step index. (No ``WITH v (names)``: sqlite3 counts rows only for a statement
    that begins with UPDATE or INSERT.)
    """
    appended = [(row, expected) for row, expected in saves if row.stored_revision is not None]
    created = [row for row, _ in saves if row.stored_revision is None]
    for chunk in chunks(appended, MERGED_SAVES):
        changed = yield Query(
            f"UPDATE {RUNS} SET step_index = v.column2, status = v.column3, created_at = v.column4,"
            " message_count = v.column5, revision = v.column6, header = v.column7"
            f" FROM (VALUES {', '.join(['(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)'] * len(chunk))}) AS v"
            f" WHERE {RUNS}.run_id = v.column1 AND {RUNS}.revision = v.column8 AND {RUNS}.message_count = v.column9"
            f" AND {RUNS}.step_index < v.column2 AND (v.column10 IS NULL OR {RUNS}.step_index = v.column10)",
            flat((*row.header_row, row.stored_revision, row.stored_count, expected) for row, expected in chunk),
            "count",
        )
        if changed != len(chunk):
            return False
    for runs in chunks(created, MERGED_SAVES):
        changed = yield Query(
            f"INSERT INTO {RUNS} (run_id, step_index, status, created_at, message_count, revision, header) VALUES "
            + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(runs)) + " ON CONFLICT (run_id) DO NOTHING",
            flat(row.header_row for row in runs), "count",
        )
        if changed != len(runs):
            return False
        ids = ", ".join(["(?)"] * len(runs))
        for table in (MESSAGES, STEPS):
            yield Query(f"DELETE FROM {table} WHERE run_id IN (VALUES {ids})", tuple(row.header_row[0] for row in runs))
    written = [row for row, _ in saves]
    messages = [(row.header_row[0], seq, body) for row in written for seq, body in enumerate(row.bodies, row.stored_count)]
    yield from _insert_rows(f"INSERT INTO {MESSAGES} (run_id, seq, body) VALUES ", "(?, ?, ?)", messages, "")
    yield from _insert_rows(
        f"INSERT INTO {STEPS} (run_id, step_index, message_count, header) VALUES ", "(?, ?, ?, ?)",
        [(h[0], h[1], h[4], h[6]) for h in (row.header_row for row in written)], _STEP_LOG_UPSERT,
    )
    return True


@dataclass(frozen=True, slots=True)
class MergeableSave:
    """A checkpoint store's save that a group-commit writer may run together with others (`merged`).

    Every SQL statement the writer runs hands the GIL to the event loop and waits to get it
    back; a batch of hundreds of saves at three statements each waits most of its time on the
    GIL, and every run in the batch waits with it (`durable_agent.backends.sqlite._group_commit`). Saves of distinct
    runs that append to this process's last save of their run, or start a run, are written
    together in a few statements for the whole group.
    """

    cache: PrefixCache
    checkpoint: AgentCheckpoint
    expected_step_index: int | None
    sealer: RowSealer = PLAINTEXT

    @property
    def key(self) -> str:
        return self.checkpoint.run_id

    @staticmethod
    def merged(saves: Sequence[MergeableSave]) -> Plan[list[Any] | None]:
        """`saves` as a few statements: their revisions (`ALONE` for one `merge_row` leaves to its own plan),
        or None when `merged_saves` found a run not as expected."""
        rows = [merge_row(save.cache, save.checkpoint, save.expected_step_index, save.sealer) for save in saves]
        merged = [(row, save.expected_step_index) for row, save in zip(rows, saves, strict=True) if row is not None]
        if not (yield from merged_saves(merged)):
            return None
        return [ALONE if row is None else row.revision for row in rows]


def _insert_rows(insert: str, row: str, rows: Sequence[tuple[Any, ...]], suffix: str) -> Plan[None]:
    """`rows` inserted `MERGED_ROWS` per statement."""
    for chunk in chunks(rows, MERGED_ROWS):
        yield Query(insert + ", ".join([row] * len(chunk)) + suffix, flat(chunk))


def _append_rows(run_id: str, bodies: Sequence[str], first: int) -> Plan[None]:
    """Insert message `bodies` numbered from `first`, one statement per chunk, not one per row.

    A row already stored where a new message goes (damage, or a foreign writer, behind the back
    of a cache that vouched for the stored rows) raises `CheckpointCorruptError`: the caller's
    transaction is undone and its store forgets the run, so the next save re-reads the rows and
    replaces it. Counting the rows inserted costs nothing; the unique-key error it replaces was
    the driver's own (`sqlite3.IntegrityError`, psycopg's `UniqueViolation`).
    """
    for start in range(0, len(bodies), ROWS_PER_INSERT):
        chunk = bodies[start : start + ROWS_PER_INSERT]
        inserted = yield Query(
            f"INSERT INTO {MESSAGES} (run_id, seq, body) VALUES " + ", ".join(["(?, ?, ?)"] * len(chunk))
            + " ON CONFLICT (run_id, seq) DO NOTHING",
            flat((run_id, i, body) for i, body in enumerate(chunk, first + start)), "count",
        )
        if inserted != len(chunk):
            raise CheckpointCorruptError(
                f"a row is stored already where this save appends message {first + start} or a later one"
                " (no save of this run wrote it); the next save rewrites the run", run_id=run_id,
            )


_STEP_LOG_UPSERT = (
    " ON CONFLICT (run_id, step_index) DO UPDATE SET message_count = excluded.message_count, header = excluded.header"
)


def _step_log_row(checkpoint: AgentCheckpoint, header: str) -> Query:
    return Query(
        f"INSERT INTO {STEPS} (run_id, step_index, message_count, header) VALUES (?, ?, ?, ?){_STEP_LOG_UPSERT}",
        (checkpoint.run_id, checkpoint.step_index, len(checkpoint.messages), header),
    )


def load_plan(run_id: str, sealer: RowSealer = PLAINTEXT) -> Plan[tuple[AgentCheckpoint, Any] | None]:
    """The stored checkpoint of `run_id` (None when absent); run inside one read snapshot."""
    head = yield Query(
        f"SELECT header, message_count, revision, step_index FROM {RUNS} WHERE run_id = ?", (run_id,), "one"
    )
    if head is None:
        return None
    header, count, revision, step_index = head
    rows = yield Query(f"SELECT seq, body FROM {MESSAGES} WHERE run_id = ? ORDER BY seq", (run_id,), "all")
    if type(count) is not int or count < 0:
        raise CheckpointCorruptError(f"message_count is {count!r}", run_id=run_id)
    if len(rows) != count or [row[0] for row in rows] != list(range(count)):  # C-speed form of `_bodies`
        raise CheckpointCorruptError(
            f"header counts {count} messages, rows hold {len(rows)} (contiguous from 0: {len(_bodies(rows))})",
            run_id=run_id,
        )
    return sealer.rebuild(run_id, step_index, header, [row[1] for row in rows]), revision


def remembered(cache: PrefixCache, run_id: str, found: tuple[AgentCheckpoint, Any] | None) -> AgentCheckpoint | None:
    """The checkpoint `load_plan` found, told to `cache` (when its revision is sound) so the next save appends."""
    if found is None:
        return None
    checkpoint, revision = found
    if type(revision) is int:
        cache.remember(run_id, revision, checkpoint.messages)
    return checkpoint


def load_step_plan(run_id: str, step_index: int, sealer: RowSealer = PLAINTEXT) -> Plan[AgentCheckpoint | None]:
    """The checkpoint saved at `step_index` of `run_id` (None when no step row holds it)."""
    head = yield Query(f"SELECT message_count FROM {RUNS} WHERE run_id = ?", (run_id,), "one")
    row = yield Query(
        f"SELECT header, message_count FROM {STEPS} WHERE run_id = ? AND step_index = ?", (run_id, step_index), "one"
    )
    if head is None or row is None:
        return None
    header, count = row
    if type(count) is not int or type(head[0]) is not int or not 0 <= count <= head[0]:
        raise CheckpointCorruptError(f"step {step_index} counts {count!r} messages", run_id=run_id)
    rows = yield Query(
        f"SELECT seq, body FROM {MESSAGES} WHERE run_id = ? AND seq >= 0 AND seq < ? ORDER BY seq", (run_id, count), "all"
    )
    bodies = _bodies(rows)
    if len(bodies) != count:
        raise CheckpointCorruptError(f"step {step_index} needs {count} messages, rows hold {len(bodies)}", run_id=run_id)
    return sealer.rebuild(run_id, step_index, header, bodies)


def delete_plan(run_id: str) -> Plan[None]:
    yield Query(f"DELETE FROM {STEPS} WHERE run_id = ?", (run_id,))
    yield Query(f"DELETE FROM {MESSAGES} WHERE run_id = ?", (run_id,))
    yield Query(f"DELETE FROM {RUNS} WHERE run_id = ?", (run_id,))


def list_plan(status: RunStatus | None, limit: int | None, after: str | None) -> Plan[list[str]]:
    where: list[str] = []
    params: list[Any] = []
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if after is not None:
        where.append("run_id > ?")
        params.append(after)
    sql = f"SELECT run_id FROM {RUNS}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY run_id"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    rows = yield Query(sql, params, "all")
    return readable_ids(row[0] for row in rows)


def prune_plan(before: int, status: RunStatus | None, include_suspended: bool) -> Plan[list[str]]:
    """Delete the runs `prunable` selects; returns their ids (sorted)."""
    rows = yield Query(
        f"SELECT run_id, status, created_at FROM {RUNS} WHERE created_at < ?", (before,), "all"
    )
    doomed = page(
        (
            run_id
            for run_id, st, created in rows
            if type(created) is int
            and readable_id(run_id) is not None
            and prunable(st, created, before, status, include_suspended)
        ),
        None,
        None,
    )
    if doomed:
        yield Query(f"DELETE FROM {STEPS} WHERE run_id = ?", [(r,) for r in doomed], many=True)
        yield Query(f"DELETE FROM {MESSAGES} WHERE run_id = ?", [(r,) for r in doomed], many=True)
        yield Query(f"DELETE FROM {RUNS} WHERE run_id = ?", [(r,) for r in doomed], many=True)
    return doomed
