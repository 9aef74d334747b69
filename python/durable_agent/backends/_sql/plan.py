"""Plans: database work written once without I/O, as generators of `Query` values, and their drivers.

A plan yields each statement as a `Query` and receives its result (the first row or None
for ``fetch="one"``, every row for ``"all"``, the number of rows it changed for ``"count"``,
None otherwise); its return value is the operation's answer. An executor runs a plan inside
one transaction: `run_sync` on a DB-API cursor (sqlite3, psycopg), `run_async` on psycopg's
async cursor. Plans take no locks of their own and touch no connection, so an executor may
batch them (SQLite's group commit) or pipeline them (Postgres). A write may also come as a
`Mergeable`: the same write in a form a batching executor runs together with others of its
kind, in a few statements for all of them.

`Plan[T]` is a plan returning T; a bare `Plan` returns Any. Statements are written with ``?``
placeholders; `Dialect` holds what differs between SQLite and Postgres.
"""

from __future__ import annotations

from collections.abc import Generator, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..._errors import FeatureUnavailableError

if TYPE_CHECKING:  # a bare `Plan` is `Plan[Any]` (PEP 696 defaults; `typing` has them from Python 3.13)
    from typing_extensions import TypeVar

    T = TypeVar("T", default=Any)
else:
    from typing import TypeVar

    T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Query:
    """One statement of a plan; `many` runs it once per parameter row (``executemany``).

    ``fetch="count"`` (rows changed) checks a conditional write in one step of the statement,
    where ``RETURNING`` takes two more (each a GIL hand-off in sqlite3: `durable_agent.backends.sqlite._group_commit`).

    `alone`: when this is the first query of a write plan, an executor may run it as a transaction
    of its own (on Postgres one round trip: the statement commits as it ends); the queries the
    plan yields after it, if any, then run in a new transaction. The plan must make such a
    statement all-or-nothing, and continue only when it wrote nothing.
    """

    sql: str
    params: Sequence[Any] | Sequence[Sequence[Any]] = ()
    fetch: Literal["one", "all", "count", None] = None
    many: bool = False
    alone: bool = False


Plan = Generator[Query, Any, T]


class Mergeable(Protocol):
    """A write that a batching executor may run together with writes of its type queued right after it
    (SQLite's group commit: `durable_agent.backends.sqlite._group_commit`)."""

    @property
    def key(self) -> Hashable:
        """Writes of one key never merge: they run one after the other, in order."""

    @staticmethod
    def merged(group: Sequence[Any]) -> Plan[list[Any] | None]:
        """The writes of `group` (one type, distinct keys) as one plan: each write's result (`ALONE` for one
        it left for its own plan), or None when it failed (the writer then undoes it and runs each
        write's own plan)."""


ALONE: Any = object()  # what `Mergeable.merged` answers for a write it did not make
MERGE_VARIABLES = 4096  # placeholders a merged statement may use (a batching executor merges only where that many fit)

R = TypeVar("R")


def flat(rows: Iterable[Iterable[Any]]) -> tuple[Any, ...]:
    """The values of `rows`, one after the other: the parameters of a statement that writes many rows."""
    return tuple(chain.from_iterable(rows))


def chunks(rows: Sequence[R], largest: int) -> Iterator[Sequence[R]]:
    """`rows` in consecutive chunks of `largest` rows, then of the powers of 2 below it that the rest
    holds, largest first (`largest` a power of 2): 700 rows by 256 are 256, 256, 128, 32, 16, 8, 4.

    A merged statement's text depends on its number of rows, and sqlite3 keeps a prepared
    statement per text (128 of them; ~100 KB each for the largest): a few fixed sizes keep
    that cache small, where one text per row count grew a busy process by ~20 MB.
    """
    start, size = 0, largest
    while start < len(rows):
        while size > len(rows) - start:
            size //= 2
        yield rows[start : start + size]
        start += size


@dataclass(frozen=True, slots=True)
class Guard:
    """A condition a plan's write is made under, inside the write's own statement (SQL after ``WHERE``).

    `params` fill its placeholders; `refused` is what the plan raises when the condition fails.
    """

    sql: str
    params: tuple[Any, ...]
    refused: Exception


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between SQLite and Postgres, for every SQL schema of the package."""

    placeholder: str  # "?" or "%s"
    text_type: str  # column type of run ids: byte-ordered so list() pages in code-point order
    lock_run: str | None  # statement taking a per-run write lock inside a checkpoint save (one parameter)
    lock_schema: str | None  # statement serializing a schema's migrations; one parameter: the schema's key
    serial: str = "INTEGER PRIMARY KEY"  # an auto-numbered integer primary key column
    lock_shared: str = ""  # suffix of a SELECT that must not race a claim ("" where writes are serialized)
    lock_update: str = ""  # suffix of the SELECT of a row about to be changed ("" where writes are serialized)
    notify: str | None = None  # statement waking awakeable waiters in other processes, one parameter
    fence_in_statement: bool = False  # a fenced write checks the lease epoch inside its own statement
    secure_delete: str | None = None  # statement making the rows a transaction rewrites leave no old bytes behind
    # a TEXT column keeps bytes as they are (SQLite stores them as a BLOB), so the message rows of an encrypted
    # checkpoint are binary envelopes: no base64 to write or read (docs/encryption.md, "The binary form")
    binary_envelopes: bool = False

    def sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)


SQLITE = Dialect(
    placeholder="?", text_type="TEXT", lock_run=None, lock_schema=None, secure_delete="PRAGMA secure_delete = ON",
    binary_envelopes=True,
)
POSTGRES = Dialect(
    placeholder="%s",
    text_type='TEXT COLLATE "C"',
    lock_run="SELECT pg_advisory_xact_lock(hashtextextended(?, 20260))",
    lock_schema="SELECT pg_advisory_xact_lock(?)",
    serial="BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    lock_shared=" FOR SHARE",
    lock_update=" FOR UPDATE",
    notify="SELECT pg_notify('durable_agent_journal', ?)",
    fence_in_statement=True,
)


def migrate_plan(
    dialect: Dialect, key: int, versions: str, target: int, migrations: Mapping[int, Sequence[str]], what: str
) -> Plan[None]:
    """Bring a schema recorded in table `versions` up to `target`, one migration at a time.

    `key` names the schema's migration lock (Postgres: an advisory lock). Raises
    `FeatureUnavailableError` for a database migrated by a newer durable-agent (`what` names
    the schema in the message).
    """
    if dialect.lock_schema is not None:
        yield Query(dialect.lock_schema, (key,))
    yield Query(f"CREATE TABLE IF NOT EXISTS {versions} (version INTEGER NOT NULL)")
    row = yield Query(f"SELECT max(version) FROM {versions}", (), "one")
    current = row[0] or 0
    if current > target:
        raise FeatureUnavailableError(f"{what} is version {current}, newer than {target}: upgrade durable-agent")
    for version in range(current + 1, target + 1):
        for statement in migrations[version]:
            yield Query(statement)
        yield Query(f"INSERT INTO {versions} (version) VALUES (?)", (version,))


def _answer(rows: list[Any], fetch: str | None) -> Any:
    """What a plan receives for a query: its first row (or None) for ``"one"``, every row for ``"all"``."""
    if fetch == "one":
        return rows[0] if rows else None
    return rows if fetch == "all" else None


def run_sync(cursor: Any, dialect: Dialect, plan: Plan[T]) -> T:
    """Drive `plan` on a DB-API cursor; returns the plan's result."""
    try:
        query = plan.send(None)
        while True:
            query = plan.send(execute_sync(cursor, dialect, query))
    except StopIteration as stop:
        value: T = stop.value
        return value


def execute_sync(cursor: Any, dialect: Dialect, query: Query) -> Any:
    """Run one query on a DB-API cursor; returns what its plan receives for it.

    A ``"one"`` query is fetched to its end too: SQLite keeps an ``UPDATE ... RETURNING``
    in progress (and refuses to commit) until its cursor is exhausted.
    """
    sql = dialect.sql(query.sql)
    if query.many:
        cursor.executemany(sql, query.params)
        return None
    ran = cursor.execute(sql, query.params)
    if query.fetch == "count":
        return ran.rowcount
    return _answer(cursor.fetchall(), query.fetch) if query.fetch else None


async def run_async(cursor: Any, dialect: Dialect, plan: Plan[T], first: Query | None = None) -> T:
    """`run_sync` for an async cursor (psycopg's AsyncCursor).

    `first`: for a plan already started, the query it yielded last (not run yet).
    """
    try:
        query = first if first is not None else plan.send(None)
        while True:
            query = plan.send(await execute_async(cursor, dialect, query))
    except StopIteration as stop:
        value: T = stop.value
        return value


async def execute_async(cursor: Any, dialect: Dialect, query: Query) -> Any:
    """Run one query on an async cursor; returns what its plan receives for it."""
    sql = dialect.sql(query.sql)
    if query.many:
        await cursor.executemany(sql, query.params)
        return None
    ran = await cursor.execute(sql, query.params)
    if query.fetch == "count":
        return ran.rowcount
    return _answer(await cursor.fetchall(), query.fetch) if query.fetch else None
