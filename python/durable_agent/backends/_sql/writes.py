"""A fenced write as data (`FencedWrites`: typed `RowWrite`s and maybe a checkpoint), and its three renderings.

What a write changes is described once (`durable_agent.backends._sql.journal` describes a
`RunTransition`, a step batch, a queue, ...); how it reaches the database is decided here, in
one renderer per dialect and mode, each the only place its SQL is spelled:

* `one_statement` (Postgres): the fence read ``FOR SHARE`` and every write in ONE statement, each
  write a CTE guarded by the fence (a stale fence makes every guard false), run alone: committed as
  it ends, one round trip. A checkpoint joins it when this process's cache vouches for the stored
  run (its head CTE then guards every write too); otherwise, or when the head moved, the writes
  run as one statement again in a transaction that then saves the checkpoint (`save_plan`).
* `serial` (SQLite, writes serialized by ``BEGIN IMMEDIATE``): each row one statement, in order.
  The fence rides on the first row written whenever its guard holds (`RowWrite.certain`), run
  first and counted: no row changed means a stale fence, and the plan stops before anything
  else is written. Without such a row a checkpoint's save carries it (`save_plan`'s `Guard`),
  or the fence is read first.
* `merged` (SQLite's group commit: `durable_agent.backends.sqlite._group_commit`): the writes of
  many sessions, rows of one shape together in a few statements, chunked (`chunks`); the fences
  are read in one statement first, or ride on a certain write every session has rows in.

A renderer writes rows; it does not know what they mean. A new kind of row in a `RunTransition`
is a new `RowWrite` in its description, and every renderer writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..._checkpoint import AgentCheckpoint
from ..._errors import StaleEpochError
from ..._storage.history import PrefixCache
from ..._storage.sealing import PLAINTEXT, RowSealer
from .checkpoints import MESSAGES, RUNS, STEPS as STEP_LOG, SaveRow, merge_row, merged_saves, save_plan
from .journal_schema import LEASES
from .plan import ALONE, MERGE_VARIABLES, Dialect, Guard, Plan, Query, chunks, flat

Kind = Literal["upsert", "insert", "update", "delete"]


@dataclass(frozen=True, slots=True)
class RowWrite:
    """Rows written into one table, as data; build one with `upsert`, `insert`, `update` or `delete`.

    Each row holds the values of `columns`, then (update, delete) of `key`, then (delete) the bound
    of `above`. The rows of one write touch distinct rows of the table (one statement cannot
    change a row twice).
    """

    table: str
    kind: Kind
    columns: tuple[str, ...]  # insert, upsert: the columns inserted; update: the columns set; delete: none
    key: tuple[str, ...]  # upsert: the conflict target; insert: the conflict target kept, or () ; else the row's key
    rows: tuple[tuple[Any, ...], ...]
    certain: bool  # it writes each of its rows whenever its guard holds: the fence may ride on it
    above: str | None = None  # delete: only the rows whose `above` column is greater than the row's bound

    def __post_init__(self) -> None:
        if not self.rows:
            raise ValueError(f"a write into {self.table} without rows")

    @property
    def shape(self) -> tuple[Any, ...]:
        """Writes of one shape are one statement but for their values (`merged` runs them together)."""
        return self.table, self.kind, self.columns, self.key, self.above


def upsert(table: str, key: tuple[str, ...], columns: tuple[str, ...], rows: Sequence[tuple[Any, ...]]) -> RowWrite:
    """Insert `rows`; a row whose `key` is stored already replaces its other columns."""
    return RowWrite(table, "upsert", columns, key, tuple(rows), certain=True)


def insert(
    table: str, columns: tuple[str, ...], rows: Sequence[tuple[Any, ...]], *, keep: tuple[str, ...] = ()
) -> RowWrite:
    """Insert `rows`; with `keep`, a row whose `keep` columns match a stored row's is skipped."""
    return RowWrite(table, "insert", columns, keep, tuple(rows), certain=not keep)


def update(table: str, key: tuple[str, ...], columns: tuple[str, ...], row: tuple[Any, ...], *, certain: bool) -> RowWrite:
    """Set `columns` of the row `key` names (`row`: their values, then the key's); `certain`: it exists."""
    return RowWrite(table, "update", columns, key, (row,), certain)


def delete(table: str, key: tuple[str, ...], rows: Sequence[tuple[Any, ...]], *, above: str | None = None) -> RowWrite:
    """Delete the rows `key` names (each row: the key's values, then the bound of `above`)."""
    return RowWrite(table, "delete", (), key, tuple(rows), certain=False, above=above)


@dataclass(frozen=True, slots=True)
class FencedWrites:
    """What one fenced write changes: `rows` in order, then `checkpoint`'s save, all while the session's
    lease is at `epoch` (None: unguarded), or nothing (`StaleEpochError`)."""

    session_id: str
    epoch: int | None
    rows: tuple[RowWrite, ...] = ()
    checkpoint: AgentCheckpoint | None = None
    cache: PrefixCache | None = field(default=None, compare=False)  # what this process saved last: for the save
    sealer: RowSealer = field(default=PLAINTEXT, compare=False)  # builds the checkpoint's rows (sealed, or not)


def fenced_plan(d: Dialect, writes: FencedWrites) -> Plan[int | None]:
    """`writes` in one transaction, rendered for `d`; returns the checkpoint's revision (None without one)."""
    if d.fence_in_statement:
        return (yield from one_statement(d, writes))
    return (yield from serial(d, writes))


def _cache(writes: FencedWrites) -> PrefixCache:
    if writes.cache is None:
        raise ValueError("a checkpoint's save needs the cache of its process's saves")
    return writes.cache


# ------------------------------------------------------------------- SQL of a write, one row or many

_FENCE = f"SELECT 1 FROM {LEASES} WHERE session_id = ? AND epoch = ?"
_EXISTS_FENCE = "EXISTS (SELECT 1 FROM fence)"


def _conflict(write: RowWrite) -> str:
    if write.kind == "insert":
        return f" ON CONFLICT ({', '.join(write.key)}) DO NOTHING" if write.key else ""
    replaced = [column for column in write.columns if column not in write.key]
    return f" ON CONFLICT ({', '.join(write.key)}) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in replaced)


def _where(write: RowWrite) -> str:
    equal = [f"{column} = ?" for column in write.key]
    return " AND ".join([*equal, f"{write.above} > ?"] if write.above else equal)


def _one_row(write: RowWrite, row: tuple[Any, ...], guard: str | None) -> str:
    """One row of `write` as a statement, `guard` (its placeholders after the row's) the condition it is made under."""
    if write.kind in ("insert", "upsert"):
        values = ", ".join(["?"] * len(write.columns))
        source = f"VALUES ({values})" if guard is None else f"SELECT {values} WHERE {guard}"
        return f"INSERT INTO {write.table} ({', '.join(write.columns)}) {source}{_conflict(write)}"
    where = _where(write) + ("" if guard is None else f" AND {guard}")
    if write.kind == "update":
        return f"UPDATE {write.table} SET {', '.join(f'{c} = ?' for c in write.columns)} WHERE {where}"
    return f"DELETE FROM {write.table} WHERE {where}"


def _rows_of(write: RowWrite, rows: int, guard: str) -> str:
    """Postgres: `rows` rows of `write` in one statement made under `guard`, the rows named by a VALUES list
    (its columns named after the table's; inserted in their order: the last column ``n`` numbers them)."""
    values = ", ".join([f"({', '.join(['?'] * len(write.rows[0]))}{', ?' if write.kind != 'delete' else ''})"] * rows)
    if write.kind in ("insert", "upsert"):
        columns = ", ".join(write.columns)
        return (f"INSERT INTO {write.table} ({columns}) SELECT {columns} FROM (VALUES {values}) AS v ({columns}, n)"
                f" WHERE {guard} ORDER BY n{_conflict(write)}")
    names = ", ".join((*write.columns, *write.key, *((write.above,) if write.above else ())))
    match = " AND ".join([*(f"{write.table}.{c} = v.{c}" for c in write.key),
                          *((f"{write.table}.{write.above} > v.{write.above}",) if write.above else ())])
    if write.kind == "update":
        sets = ", ".join(f"{c} = v.{c}" for c in write.columns)
        return (f"UPDATE {write.table} SET {sets} FROM (VALUES {values}) AS v ({names}, n)"
                f" WHERE {match} AND {guard}")
    return f"DELETE FROM {write.table} USING (VALUES {values}) AS v ({names}) WHERE {match} AND {guard}"


def _row_params(write: RowWrite) -> tuple[Any, ...]:
    """The parameters of `_rows_of(write, ...)` for all of `write`'s rows."""
    if write.kind == "delete":
        return flat(write.rows)
    return flat((*row, n) for n, row in enumerate(write.rows))


# ------------------------------------------------------------------- Postgres: one statement


def one_statement(d: Dialect, writes: FencedWrites) -> Plan[int | None]:
    """`writes` as ONE statement run alone; with a checkpoint the cache cannot vouch for (or whose stored
    head moved), the rows as one statement then `save_plan`, in one transaction (module docs)."""
    checkpoint = writes.checkpoint
    if checkpoint is None:
        yield from _statement(d, writes, None, alone=True)
        return None
    save = SaveRow.of(_cache(writes), checkpoint, writes.sealer)
    if save is not None and (yield from _statement(d, writes, save, alone=True)):
        return save.revision
    yield from _statement(d, writes, None, alone=False)
    return (yield from save_plan(_cache(writes), checkpoint, None, d, sealer=writes.sealer))


def _statement(d: Dialect, writes: FencedWrites, save: SaveRow | None, *, alone: bool) -> Plan[bool]:
    """Every row of `writes` (and the append `save` makes to the stored run) in one statement; raises
    `StaleEpochError` for a stale fence, answers False when the stored run is not the one `save` follows."""
    session_id, epoch = writes.session_id, writes.epoch
    rows = list(writes.rows)
    if epoch is None:
        if not rows:
            return True
        ctes, params, guard = [], [], "1 = 1"
    else:
        ctes, params, guard = [f"fence AS ({_FENCE}{d.lock_shared})"], [session_id, epoch], _EXISTS_FENCE
    if save is not None:
        run_id = save.header_row[0]
        if d.lock_run is not None:
            ctes.append(f"run_lock AS ({d.lock_run})")
            params.append(run_id)
        ctes.append(  # no row where the new messages go: else the save names the damage (`_append_rows`)
            f"head AS (SELECT 1 FROM {RUNS} WHERE run_id = ? AND revision = ? AND message_count = ?"
            f" AND NOT EXISTS (SELECT 1 FROM {MESSAGES} WHERE run_id = ? AND seq >= ?)"
            f" AND EXISTS (SELECT 1 FROM {'run_lock' if d.lock_run is not None else 'fence'}){d.lock_update})"
        )
        params.extend((run_id, save.stored_revision, save.stored_count, run_id, save.stored_count))
        guard += " AND EXISTS (SELECT 1 FROM head)"
        rows.extend(appended_rows(save))
    for write in rows:
        if len(write.rows) == 1:  # its values typed by the columns they go to (a NULL in a VALUES list is text)
            ctes.append(f"w{len(ctes)} AS ({_one_row(write, write.rows[0], guard)})")
            params.extend(write.rows[0])
        else:
            ctes.append(f"w{len(ctes)} AS ({_rows_of(write, len(write.rows), guard)})")
            params.extend(_row_params(write))
    fenced = "(SELECT count(*) FROM fence)" if epoch is not None else "1"
    fits = "(SELECT count(*) FROM head)" if save is not None else "1"
    answer = yield Query(f"WITH {', '.join(ctes)} SELECT {fenced}, {fits}", params, "one", alone=alone)
    if epoch is not None and answer[0] == 0:
        raise StaleEpochError(session_id, epoch)
    return bool(answer[1] == 1)


def appended_rows(save: SaveRow) -> list[RowWrite]:
    """The rows `save_plan` writes for a checkpoint that appends to the stored run `save` follows."""
    run_id, step_index, status, created_at, count, revision, header = save.header_row
    messages = [(run_id, seq, body) for seq, body in enumerate(save.bodies, save.stored_count)]
    return [
        *([insert(MESSAGES, ("run_id", "seq", "body"), messages)] if messages else []),
        delete(STEP_LOG, ("run_id",), [(run_id, step_index)], above="step_index"),
        upsert(STEP_LOG, ("run_id", "step_index"), ("run_id", "step_index", "message_count", "header"),
               [(run_id, step_index, count, header)]),
        update(RUNS, ("run_id",), ("step_index", "status", "created_at", "message_count", "revision", "header"),
               (step_index, status, created_at, count, revision, header, run_id), certain=False),
    ]


# ------------------------------------------------------------------- SQLite: row by row


def serial(d: Dialect, writes: FencedWrites) -> Plan[int | None]:
    """`writes` one row per statement, in order, inside the caller's transaction (module docs)."""
    session_id, epoch, checkpoint = writes.session_id, writes.epoch, writes.checkpoint
    rows = [(write, row) for write in writes.rows for row in write.rows]
    fence = None if epoch is None else Guard(f"EXISTS ({_FENCE})", (session_id, epoch), StaleEpochError(session_id, epoch))
    if checkpoint is not None and not rows:  # the save's header write carries the fence
        return (yield from save_plan(_cache(writes), checkpoint, None, d, fence, writes.sealer))
    first = next((i for i, (write, _) in enumerate(rows) if write.certain), None) if fence is not None else None
    if fence is not None and first is None:
        lease = yield Query(f"SELECT epoch FROM {LEASES} WHERE session_id = ?{d.lock_shared}", (session_id,), "one")
        if lease is None or lease[0] != epoch:
            raise fence.refused
    elif fence is not None and first is not None:
        write, row = rows[first]
        if not (yield Query(_one_row(write, row, fence.sql), (*row, *fence.params), "count")):
            raise fence.refused
    for i, (write, row) in enumerate(rows):
        if i != first:
            yield Query(_one_row(write, row, None), row)
    if checkpoint is None:
        return None
    return (yield from save_plan(_cache(writes), checkpoint, None, d, sealer=writes.sealer))


# ------------------------------------------------------------------- SQLite: many sessions merged


def merged(group: Sequence[FencedWrites], *, read_fences: bool) -> Plan[list[Any] | None]:
    """The writes of `group` (distinct sessions, each fenced) as a few statements for all of them.

    Rows of one shape go together, shapes in the order they first appear; the checkpoints follow
    (`merged_saves`). The fences are read in one statement first when `read_fences` (or when no
    certain insert has rows of every session); else they ride on such an insert, each row guarded
    by its session's fence and the rows changed counted. Answers each write's checkpoint revision
    (None without one; `ALONE` for a save `merge_row` leaves to its own plan), or None when a fence
    is stale or a run changed (the writer then undoes the plan and runs each write's own).
    """
    saves = [None if w.checkpoint is None else merge_row(_cache(w), w.checkpoint, None, w.sealer) for w in group]
    members = [w for w, save in zip(group, saves, strict=True) if w.checkpoint is None or save is not None]
    shapes: dict[tuple[Any, ...], list[tuple[RowWrite, FencedWrites]]] = {}
    for member in members:
        for write in member.rows:
            shapes.setdefault(write.shape, []).append((write, member))
    sessions = {member.session_id for member in members}
    riding = None if read_fences else next(
        (shape for shape, writes in shapes.items()
         if writes[0][0].kind in ("insert", "upsert") and writes[0][0].certain and "session_id" in writes[0][0].columns
         and {member.session_id for _, member in writes} == sessions),
        None,
    )
    if riding is None:
        for fences in chunks([(m.session_id, m.epoch) for m in members], _rows_per_statement(2)):
            held = yield Query(
                f"SELECT count(*) FROM (VALUES {', '.join(['(?, ?)'] * len(fences))}) AS v"
                f" JOIN {LEASES} AS l ON l.session_id = v.column1 AND l.epoch = v.column2",
                flat(fences), "one",
            )
            if held[0] != len(fences):
                return None
    else:
        shapes = {riding: shapes.pop(riding), **shapes}
    for shape, writes in shapes.items():
        if not (yield from _merged_shape(writes, fenced=shape == riding)):
            return None
    if not (yield from merged_saves([(save, None) for save in saves if save is not None])):
        return None
    return [
        ALONE if w.checkpoint is not None and save is None else None if save is None else save.revision
        for w, save in zip(group, saves, strict=True)
    ]


def _rows_per_statement(width: int) -> int:
    """Rows per merged statement of `width` parameters a row: 256, or the power of 2 that keeps it within
    the placeholders a merged statement may use."""
    largest = 256
    while largest * width > MERGE_VARIABLES:
        largest //= 2
    return largest


def _merged_shape(writes: Sequence[tuple[RowWrite, FencedWrites]], *, fenced: bool) -> Plan[bool]:
    """The rows of `writes` (one shape; each write with its session's), a chunk per statement; with
    `fenced`, each row guarded by its session's fence (an insert), False when one is stale.

    VALUES names its columns column1, column2, ...: the row's values, then (fenced) the epoch and the row's place.
    """
    write = writes[0][0]
    table, width = write.table, len(write.rows[0])
    if fenced:
        rows = [(*row, member.epoch) for w, member in writes for row in w.rows]
        rows = [(*row, n) for n, row in enumerate(rows)]
    else:
        rows = [row for w, _ in writes for row in w.rows]
    values = f"({', '.join(['?'] * len(rows[0]))})"
    for chunk in chunks(rows, _rows_per_statement(len(rows[0]))):
        listed = ", ".join([values] * len(chunk))
        if write.kind in ("insert", "upsert"):
            into = f"INSERT INTO {table} ({', '.join(write.columns)})"
            if not fenced:
                yield Query(f"{into} VALUES {listed}{_conflict(write)}", flat(chunk))
                continue
            session = write.columns.index("session_id") + 1
            changed = yield Query(
                f"{into} SELECT {', '.join(f'column{i}' for i in range(1, width + 1))} FROM (VALUES {listed})"
                f" WHERE EXISTS (SELECT 1 FROM {LEASES} WHERE session_id = column{session} AND epoch = column{width + 1})"
                f" ORDER BY column{width + 2}{_conflict(write)}",
                flat(chunk), "count",
            )
            if changed != len(chunk):
                return False
        elif write.kind == "update":
            sets = ", ".join(f"{c} = v.column{i}" for i, c in enumerate(write.columns, 1))
            match = " AND ".join(f"{table}.{c} = v.column{i}" for i, c in enumerate(write.key, len(write.columns) + 1))
            yield Query(f"UPDATE {table} SET {sets} FROM (VALUES {listed}) AS v WHERE {match}", flat(chunk))
        elif write.above is None:
            yield Query(f"DELETE FROM {table} WHERE ({', '.join(write.key)}) IN (VALUES {listed})", flat(chunk))
        else:
            match = " AND ".join(f"{table}.{c} = v.column{i}" for i, c in enumerate(write.key, 1))
            yield Query(
                f"DELETE FROM {table} WHERE EXISTS (SELECT 1 FROM (VALUES {listed}) AS v"
                f" WHERE {match} AND {table}.{write.above} > v.column{width})",
                flat(chunk),
            )
    return True
