"""Group commit on a real SQLite file, through the SQLite backend's public entry points (`AsyncSqliteCheckpointStore`,
`SqliteRuntime`): writes queued while another connection holds the file's write lock (as another process's
write holds it) share one transaction once it is let go.

A write that fails after writing is undone alone: the writes before it in the batch keep their effects and
their answers, the ones after it land. A caller cancelled while its write waits does not hold back the
others, and its write still lands. The writes of one run or session keep their order, across kinds of
write, and none crosses a write that does not merge; a batch larger than one merged statement holds lands
whole. What a batch costs is speed, for benches/bench_concurrency.py: its commits, statements and wake-ups
of the event loop per step (one for a whole batch's waiters), and the peak memory that merged statements
of a few sizes keep down (sqlite3 caches a prepared statement per text).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Collection
from pathlib import Path
from typing import Any

import pytest

from durable_agent import CheckpointCorruptError, step_key
from durable_agent.backends import DeferredSteps, RunTransition, StepRecord
from durable_agent.backends.sqlite import AsyncSqliteCheckpointStore, SqliteCheckpointStore, SqliteRuntime
from durable_agent.testing import conversation, make_checkpoint

pytestmark = pytest.mark.host_only("the writer's connection thread over sqlite3 (Pyodide has no threads)")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "g.db"


async def one_batch(db: Path, first: Awaitable[Any], writes: list[Awaitable[Any]],
                    cancel: Collection[int] = ()) -> list[Any]:
    """`writes` (of one store or runtime) in ONE batch: queued while `first`, a write of the same writer,
    waits for the file's write lock, which a connection of the test's own holds; their results or errors,
    in order, once the lock is let go. `cancel`: the indices of the writes whose callers are cancelled
    while they wait."""
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        holding = asyncio.ensure_future(first)
        await asyncio.sleep(0.05)  # the writer thread takes `first` alone and waits for the lock
        pending = [asyncio.ensure_future(write) for write in writes]
        await asyncio.sleep(0)  # each is queued behind it
        for i in cancel:
            pending[i].cancel()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    await holding
    return await asyncio.gather(*pending, return_exceptions=True)


def stray_row(db: Path, run_id: str, seq: int) -> None:
    """A message row where `run_id`'s next message goes, written behind its store's back (damage, a foreign
    writer): the next save of the run writes its header, then meets the row and fails."""
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO durable_agent_messages (run_id, seq, body) VALUES (?, ?, 'stray')", (run_id, seq))


def head(db: Path, run_id: str) -> tuple[int, int]:
    """The step and message count the run's stored header holds."""
    with sqlite3.connect(db) as conn:
        row: tuple[int, int] = conn.execute(
            "SELECT step_index, message_count FROM durable_agent_runs WHERE run_id = ?", (run_id,)).fetchone()
    return row


async def test_a_save_that_fails_after_writing_is_undone_alone_and_the_writes_before_it_keep_their_answers(
    db: Path,
) -> None:
    """Run b's save writes its header, then meets a stray row and fails: the transaction is rolled back and the
    writes before it in the batch applied again. Each prune answers with what the writes before it left
    (the first finds the run saved just before it, the second nothing the first deleted)."""
    async with AsyncSqliteCheckpointStore(db) as store:
        for run_id in ("a", "b"):
            await store.save(make_checkpoint(run_id, 1, conversation(2)))
        await store.save(make_checkpoint("old", 1, conversation(2), status="completed", created_at=1))
        stray_row(db, "b", 2)
        outcomes = await one_batch(db, store.save(make_checkpoint("holder", 0)), [
            store.save(make_checkpoint("a", 2, conversation(3))),
            store.save(make_checkpoint("done", 1, conversation(2), status="completed", created_at=2)),
            store.prune(before=10),
            store.save(make_checkpoint("b", 2, conversation(3))),
            store.save(make_checkpoint("late", 1, conversation(2), status="completed", created_at=3)),
            store.prune(before=10),
            store.save(make_checkpoint("a", 3, conversation(4))),
        ])
    assert isinstance(outcomes[3], CheckpointCorruptError) and outcomes[3].run_id == "b"
    assert outcomes[:3] + outcomes[4:] == [None, None, ["done", "old"], None, ["late"], None]
    assert head(db, "b") == (1, 2)  # its header write was undone
    with SqliteCheckpointStore(db) as fresh:
        assert fresh.list() == ["a", "b", "holder"]
        assert fresh.load("a") == make_checkpoint("a", 3, conversation(4))
        assert fresh.load_step("a", 2) == make_checkpoint("a", 2, conversation(3))
        assert fresh.load_step("b", 1) == make_checkpoint("b", 1, conversation(2))
        assert fresh.load_step("b", 2) is None


async def test_a_runtime_write_that_fails_after_writing_leaves_the_answers_around_it_as_if_it_never_ran(
    db: Path,
) -> None:
    """None of these writes merges. A send's claim answers from the claims and results written before it in
    the batch (its ``INSERT ... RETURNING`` is applied again after the failed save's rollback, then stepped
    to its end so the batch can commit), and a claim after the failed save sees the same."""
    with SqliteRuntime(db) as runtime:
        sends, checkpoints = runtime.stores.submissions, runtime.stores.checkpoints
        await checkpoints.save(make_checkpoint("b", 1, conversation(2)))
        stray_row(db, "b", 2)
        outcomes = await one_batch(db, checkpoints.save(make_checkpoint("holder", 0)), [
            sends.claim("s", "send-1", "fp"),
            sends.complete("s", "send-1", {"n": 1}),
            sends.claim("s", "send-1", "fp"),
            checkpoints.save(make_checkpoint("b", 2, conversation(3))),
            sends.claim("s", "send-1", "fp"),
            sends.claim("s", "send-2", "fp"),
        ])
        assert isinstance(outcomes[3], CheckpointCorruptError) and outcomes[3].run_id == "b"
        assert outcomes[:3] + outcomes[4:] == [(True, None), None, (False, {"n": 1}), (False, {"n": 1}), (True, None)]
        assert await sends.claim("s", "send-2", "fp") == (False, None)
    assert head(db, "b") == (1, 2)


async def test_a_lone_save_that_fails_after_writing_leaves_nothing_and_the_next_save_heals_the_run(db: Path) -> None:
    async with AsyncSqliteCheckpointStore(db) as store:
        await store.save(make_checkpoint("b", 1, conversation(2)))
        stray_row(db, "b", 2)
        with pytest.raises(CheckpointCorruptError):
            await store.save(make_checkpoint("b", 2, conversation(3)))
        assert head(db, "b") == (1, 2)
        # the writer's connection left no transaction open, and the save, reading the rows back, replaces the stray one
        await store.save(make_checkpoint("b", 2, conversation(3)))
        assert await store.load("b") == make_checkpoint("b", 2, conversation(3))


async def test_a_cancelled_caller_does_not_hold_back_the_others_and_its_save_still_lands(db: Path) -> None:
    async with AsyncSqliteCheckpointStore(db) as store:
        outcomes = await one_batch(db, store.save(make_checkpoint("holder", 0)), [
            store.save(make_checkpoint("gone", 0, conversation(1))),
            store.save(make_checkpoint("kept", 0, conversation(1))),
        ], cancel=[0])
    assert isinstance(outcomes[0], asyncio.CancelledError) and outcomes[1] is None
    with SqliteCheckpointStore(db) as fresh:
        assert fresh.load("gone") == make_checkpoint("gone", 0, conversation(1))  # cancelling cannot take it back
        assert fresh.load("kept") == make_checkpoint("kept", 0, conversation(1))


async def test_saves_of_one_run_keep_their_order_and_none_crosses_a_write_that_does_not_merge(db: Path) -> None:
    """The saves of k1 and k2 merge (one plan for a round of distinct runs); the delete of k1 does not. k1's
    first save lands before the delete, which drops it; its later saves land after it, in order."""
    async with AsyncSqliteCheckpointStore(db) as store:
        for run_id in ("k1", "k2"):
            await store.save(make_checkpoint(run_id, 0, conversation(1)))
        outcomes = await one_batch(db, store.save(make_checkpoint("holder", 0)), [
            store.save(make_checkpoint("k1", 1, conversation(2))),
            store.save(make_checkpoint("k2", 1, conversation(2))),
            store.delete("k1"),
            store.save(make_checkpoint("k1", 2, conversation(3))),
            store.save(make_checkpoint("k2", 2, conversation(3))),
            store.save(make_checkpoint("k1", 3, conversation(4))),
        ])
    assert outcomes == [None] * 6
    with SqliteCheckpointStore(db) as fresh:
        assert fresh.load("k1") == make_checkpoint("k1", 3, conversation(4))
        assert [fresh.load_step("k1", step) for step in (0, 1)] == [None, None]  # deleted, then saved anew
        assert fresh.load_step("k1", 2) == make_checkpoint("k1", 2, conversation(3))
        assert fresh.load("k2") == make_checkpoint("k2", 2, conversation(3))
        assert fresh.load_step("k2", 1) == make_checkpoint("k2", 1, conversation(2))


async def test_a_sessions_step_records_and_commits_keep_their_order_across_kinds(db: Path) -> None:
    """A session's step-record writes and its lifecycle commits are two kinds of write, each merged with its
    kind's writes of other sessions; the n-th writes of every session run after the (n-1)-th. Each session
    writes one step's record twice, in a different order of kinds: the second write stays last."""

    def done(session: str, result: str) -> StepRecord:
        run = f"r-{session}"
        return StepRecord(session, run, step_key(run, 1, "t1"), "tool", "unsafe", "done", result=result)

    def committed(session: str, epoch: int, result: str) -> Awaitable[None]:
        return runtime.commit(RunTransition(session, epoch, deferred=DeferredSteps((done(session, result),))))

    with SqliteRuntime(db) as runtime:
        e0, e1 = [(await runtime.lease.claim(session, stale_at=0)).epoch or 0 for session in ("s0", "s1")]
        outcomes = await one_batch(db, runtime.stores.checkpoints.save(make_checkpoint("holder", 0)), [
            committed("s1", e1, "first"),
            runtime.backend.put_steps([done("s0", "first")], epoch=e0),
            committed("s0", e0, "second"),
            runtime.backend.put_steps([done("s1", "second")], epoch=e1),
        ])
        assert outcomes == [None] * 4
        assert [r.result for r in await runtime.inspect.steps()] == ["second", "second"]


async def test_a_batch_of_more_runs_than_one_merged_statement_holds_lands_whole(db: Path) -> None:
    """Merged statements write at most 256 runs' headers and 1,024 message rows each, in chunks."""
    runs = [f"r{i:03}" for i in range(300)]
    async with AsyncSqliteCheckpointStore(db) as store:
        started = await one_batch(db, store.save(make_checkpoint("holder", 0)),
                                  [store.save(make_checkpoint(run_id, 0, conversation(4))) for run_id in runs])
        appended = await one_batch(db, store.save(make_checkpoint("holder", 1)),
                                   [store.save(make_checkpoint(run_id, 1, conversation(5 + i % 2)))
                                    for i, run_id in enumerate(runs)])
    assert started == appended == [None] * len(runs)
    with SqliteCheckpointStore(db) as fresh:
        for i, run_id in enumerate(runs):
            assert fresh.load(run_id) == make_checkpoint(run_id, 1, conversation(5 + i % 2)), run_id
            assert fresh.load_step(run_id, 0) == make_checkpoint(run_id, 0, conversation(4)), run_id
