"""Group commit (`durable_agent.backends.sqlite._group_commit.GroupCommitSqlite`) on a real SQLite file: writes that queue while
the writer thread is busy share one transaction, a plan that fails is undone alone, and the waiters
of a batch are released together."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durable_agent.backends._sql.plan import SQLITE, Plan, Query, chunks
from durable_agent.backends.sqlite._group_commit import GroupCommitSqlite

pytestmark = pytest.mark.host_only("a connection thread over sqlite3 (Pyodide has no threads: InlineSqlite)")

DIALECT = SQLITE


class Refused(Exception):
    pass


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[GroupCommitSqlite]:
    conn = sqlite3.connect(tmp_path / "g.db", isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL").fetchone()
    conn.execute("CREATE TABLE t (v TEXT NOT NULL)")
    runner = GroupCommitSqlite(conn, DIALECT)
    yield runner
    runner.close()


def insert(*values: str, then_fail: bool = False) -> Plan:
    for value in values:
        yield Query("INSERT INTO t (v) VALUES (?)", (value,))
    if then_fail:
        raise Refused(values)


def stored() -> Plan:
    rows = yield Query("SELECT v FROM t ORDER BY rowid", (), "all")
    return [row[0] for row in rows]


def blocking(started: threading.Event, go: threading.Event) -> Plan:
    """Holds the writer thread until `go`, so the writes queued meanwhile form the next batch."""
    started.set()
    go.wait(10)
    yield Query("INSERT INTO t (v) VALUES ('first')")


@dataclass(frozen=True)
class Appended:
    """A write that merges: `plan` inserts its value; `merged`, one INSERT for the whole group."""

    key: str
    value: str

    def plan(self) -> Plan:
        yield Query("INSERT INTO t (v) VALUES (?)", (self.value,))
        return self.value

    @staticmethod
    def merged(group: Sequence[Appended]) -> Plan:
        yield Query("INSERT INTO t (v) VALUES " + ", ".join(["(?)"] * len(group)), tuple(w.value for w in group))
        return [w.value for w in group]


class Tagged(Appended):
    """Another type of write: it never merges with `Appended`."""


async def batched(writer: GroupCommitSqlite, plans: list[Plan | Appended]) -> list[Any]:
    """Run `plans` as ONE batch: queued while the writer thread is held by another write."""
    started, go = threading.Event(), threading.Event()
    first = asyncio.ensure_future(writer.run(blocking(started, go), write=True))
    while not started.is_set():
        await asyncio.sleep(0.001)
    waiting = [asyncio.ensure_future(writer.run(plan.plan(), write=True, merge=plan) if isinstance(plan, Appended)
                                     else writer.run(plan, write=True)) for plan in plans]
    await asyncio.sleep(0)  # every job is queued before the thread is let go
    go.set()
    await first
    return list(await asyncio.gather(*waiting, return_exceptions=True))


async def test_a_failed_plan_of_a_batch_is_undone_alone(writer: GroupCommitSqlite) -> None:
    outcomes = await batched(writer, [insert("a"), insert("b", "c", then_fail=True), insert("d")])
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], Refused)
    assert await writer.run(stored(), write=False) == ["first", "a", "d"]


def counted(name: str) -> Plan:
    """Inserts `name` + the number of rows it saw: its result depends on the writes before it."""
    row = yield Query("SELECT count(*) FROM t", (), "one")
    yield Query("INSERT INTO t (v) VALUES (?)", (f"{name}{row[0]}",))
    return row[0]


def rewrite_then_fail() -> Plan:
    yield Query("INSERT INTO t (v) VALUES ('c')")
    yield Query("UPDATE t SET v = 'changed' WHERE v = 'a' RETURNING v", (), "one")
    yield Query("INSERT INTO t (v) VALUES (?)", [("many1",), ("many2",)], many=True)
    raise Refused("c")


async def test_the_writes_before_a_failed_plan_keep_their_effects_and_results(writer: GroupCommitSqlite) -> None:
    outcomes = await batched(writer, [insert("a"), counted("b"), rewrite_then_fail(), counted("d"), insert("e")])
    assert outcomes[0] is None and outcomes[1] == 2 and outcomes[3] == 3 and outcomes[4] is None
    assert isinstance(outcomes[2], Refused)
    assert await writer.run(stored(), write=False) == ["first", "a", "b2", "d3", "e"]


async def test_a_lone_write_that_fails_after_writing_leaves_nothing(writer: GroupCommitSqlite) -> None:
    with pytest.raises(Refused):
        await writer.run(insert("x", "y", then_fail=True), write=True)
    await writer.run(insert("z"), write=True)  # the connection is usable: no transaction was left open
    assert await writer.run(stored(), write=False) == ["z"]


async def test_the_waiters_of_a_batch_are_woken_once(writer: GroupCommitSqlite) -> None:
    loop = asyncio.get_running_loop()
    wakeups = []
    original = loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> Any:
        wakeups.append(args[0])
        return original(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]
    try:
        outcomes = await batched(writer, [insert(str(i)) for i in range(20)])
    finally:
        del loop.call_soon_threadsafe
    assert outcomes == [None] * 20
    assert len(wakeups) == 2  # the holding write's batch, then the batch of twenty
    assert await writer.run(stored(), write=False) == ["first", *map(str, range(20))]


async def test_a_cancelled_waiter_does_not_stop_the_others(writer: GroupCommitSqlite) -> None:
    started, go = threading.Event(), threading.Event()
    first = asyncio.ensure_future(writer.run(blocking(started, go), write=True))
    while not started.is_set():
        await asyncio.sleep(0.001)
    gone = asyncio.ensure_future(writer.run(insert("gone"), write=True))
    kept = asyncio.ensure_future(writer.run(insert("kept"), write=True))
    await asyncio.sleep(0)
    gone.cancel()
    go.set()
    await first
    assert await kept is None
    assert await writer.run(stored(), write=False) == ["first", "gone", "kept"]  # queued writes still commit


async def test_writes_that_merge_keep_each_keys_order_and_stay_behind_a_write_that_does_not(
    writer: GroupCommitSqlite,
) -> None:
    """Between two writes without `merge`, the n-th writes of every key form round n, and a round's
    writes of one type run as one merged plan: k1's writes keep their order across types, and
    none moves across the plain write."""
    statements: list[str] = []
    writer._conn.set_trace_callback(statements.append)
    outcomes = await batched(writer, [
        Appended("k1", "a1"), Appended("k2", "b1"), insert("p"),
        Appended("k1", "a2"), Tagged("k1", "c"), Appended("k2", "b2"), Appended("k1", "a3"),
    ])
    assert outcomes == ["a1", "b1", None, "a2", "c", "b2", "a3"]
    assert await writer.run(stored(), write=False) == ["first", "a1", "b1", "p", "a2", "b2", "c", "a3"]
    assert len([sql for sql in statements if sql.startswith("INSERT")]) == 6  # first, a1+b1, p, a2+b2, c, a3


def test_merged_statements_come_in_a_few_sizes() -> None:
    """sqlite3 caches a prepared statement per text: merged rows go in chunks of a few fixed sizes."""
    sizes = [len(chunk) for chunk in chunks(list(range(700)), 256)]
    assert sizes == [256, 256, 128, 32, 16, 8, 4]
    assert [list(chunk) for chunk in chunks(list(range(7)), 4)] == [[0, 1, 2, 3], [4, 5], [6]]
    assert list(chunks([], 256)) == []
