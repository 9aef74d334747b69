"""Group commit: SQLite plans run on a connection of their own thread, concurrent writes share one commit.

A server runs many runs at once; if each write were its own transaction on the event loop's
thread, every fsync would stall every run. Here the event loop only queues a plan and awaits
its future. The writer thread takes everything queued, runs the reads in one snapshot, then
the writes in ONE ``BEGIN IMMEDIATE`` transaction, and commits once: one fsync for the whole
batch. A waiter is released only after the commit that made its own write durable; if that
commit fails, every writer of the batch gets the error and nothing of the batch is applied.

A write whose plan raises gets its error and none of its writes is kept, without a
``SAVEPOINT`` per plan (two statements more per write, and every statement is a GIL hand-off
between this thread and the event loop's, the cost that bounds a busy server): a plan that
fails before it wrote anything (a fenced, stale one fails at its first SELECT) needs no undo;
one that fails after writing rolls the transaction back, and the writes of the plans before
it in the batch, kept by `_Recorder`, run again on the state they first ran on.

Waiters are released in one callback per event loop and batch (`_settle_all`): one wake-up of
the loop for the whole batch, not one per write.

Writes that arrive while a commit is in flight wait for the next batch: under load the batches
grow by themselves, with no timer. Pyodide has no threads: `InlineSqlite` runs each plan at
once, in its own transaction, on the caller's thread.

Every statement sqlite3 runs releases the GIL and must take it back, and while the event loop
has work it holds the GIL for up to the interpreter's switch interval (5 ms). A batch of
hundreds of writes at a few statements each then spends most of its time waiting for the
GIL, and every run in the batch waits with it. A write that comes with a `Mergeable` (a
store's checkpoint save, a runtime's step records or lifecycle commit) runs with the ones of its
kind in the batch as one plan of a few statements for the whole group (`Mergeable.merged`),
under a savepoint; when that plan cannot write them all, nothing of it is kept and each runs
its own plan. Writes of one key keep their order (`_groups`).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from .._sql.plan import ALONE, MERGE_VARIABLES, Dialect, Mergeable, Plan, T, run_sync

MAX_BATCH = 512
MERGE_SQLITE = (3, 33, 0)  # UPDATE ... FROM


@dataclass(slots=True)
class _Job:
    plan: Plan
    write: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    merge: Mergeable | None = None
    result: Any = None
    error: BaseException | None = None


def _settle_all(jobs: list[_Job]) -> None:
    """Release the waiters of `jobs` (all of one event loop), on that loop's thread."""
    for job in jobs:
        future = job.future
        if future.done():  # its waiter was cancelled: the write may still have committed
            continue
        if job.error is not None:
            future.set_exception(job.error)
        else:
            future.set_result(job.result)


class GroupCommitSqlite:
    """Runs plans on `conn` (opened with ``isolation_level=None``) on one thread; see the module docs."""

    def __init__(self, conn: Any, statements: Dialect) -> None:
        import sqlite3

        self._conn = conn
        self._statements = statements
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self._merges = (sqlite3.sqlite_version_info >= MERGE_SQLITE
                        and conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) >= MERGE_VARIABLES)

    def run(self, plan: Plan[T], *, write: bool, merge: Mergeable | None = None) -> asyncio.Future[T]:
        """A future of `plan`'s result, settled once its transaction committed (by the connection's
        thread); `merge`: the same write, to run merged with others. Cancelling the future leaves
        the plan queued: a write may still commit, as when any waiter is cancelled."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._ensure_thread()
        self._jobs.put(_Job(plan, write, loop, future, merge if self._merges else None))
        return future

    def _ensure_thread(self) -> None:
        if self._thread is None:
            with self._start:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._serve, name="durable-agent-sqlite", daemon=True)
                    self._thread.start()

    def close(self) -> None:
        """Finish what is queued, stop the thread, close the connection."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
        self._conn.close()

    # ------------------------------------------------------------ the thread

    def _serve(self) -> None:
        while True:
            first = self._jobs.get()
            if first is None:
                return
            batch = [first]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                batch.append(job)
            self._run_batch(batch)
            self._release(batch)
            if stop:
                return

    @staticmethod
    def _release(batch: list[_Job]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        for job in batch:
            by_loop.setdefault(job.loop, []).append(job)
        for loop, jobs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle_all, jobs)
            except RuntimeError:  # that event loop is closed: nobody waits any more
                pass

    def _run_batch(self, batch: list[_Job]) -> None:
        reads = [job for job in batch if not job.write]
        writes = [job for job in batch if job.write]
        if reads:
            self._read(reads)
        if writes:
            self._write(writes)

    def _read(self, jobs: list[_Job]) -> None:
        """Run read plans in one snapshot; one failing costs only its own waiter."""
        cur = self._conn.cursor()
        try:
            cur.execute("BEGIN DEFERRED")
            for job in jobs:
                try:
                    job.result = run_sync(cur, self._statements, job.plan)
                except BaseException as exc:  # noqa: BLE001 - this plan's own failure, for its waiter
                    job.error = exc
            self._conn.rollback()  # a read-only snapshot: nothing to commit
        except BaseException as exc:  # noqa: BLE001 - the database refused: every waiter learns why
            self._fail_all(jobs, exc)
        finally:
            cur.close()

    def _write(self, jobs: list[_Job]) -> None:
        """Run write plans in ONE transaction and commit once; a failed plan's writes are undone (module docs)."""
        raw = self._conn.cursor()
        cur = _Recorder(raw)
        try:
            raw.execute("BEGIN IMMEDIATE")
            for group in _groups(jobs):
                if len(group) == 1 or not self._merged(raw, cur, group):
                    for job in group:
                        self._alone(raw, cur, job)
            raw.execute("COMMIT")
        except BaseException as exc:  # noqa: BLE001 - nothing of the batch is durable
            self._fail_all(jobs, exc)
        finally:
            raw.close()

    def _alone(self, raw: Any, cur: _Recorder, job: _Job) -> None:
        """Run `job`'s own plan; when it fails after writing, undo its writes alone (module docs)."""
        done = len(cur.writes)
        try:
            job.result = run_sync(cur, self._statements, job.plan)
        except BaseException as exc:  # noqa: BLE001 - this plan's own failure, for its waiter
            job.error = exc
            if len(cur.writes) > done:
                del cur.writes[done:]
                self._conn.rollback()
                raw.execute("BEGIN IMMEDIATE")
                cur.replay()

    def _merged(self, raw: Any, cur: _Recorder, group: list[_Job]) -> bool:
        """Run `group` as one merged plan under a savepoint; False, with nothing of it kept, when it could not."""
        merges = [cast(Mergeable, job.merge) for job in group]
        done = len(cur.writes)
        raw.execute("SAVEPOINT merged")
        try:
            results = run_sync(cur, self._statements, type(merges[0]).merged(merges))
        except Exception:  # noqa: BLE001 - each write then runs its own plan and meets its own error
            results = None
        if results is None:
            raw.execute("ROLLBACK TO merged")
            del cur.writes[done:]
        raw.execute("RELEASE merged")
        if results is None:
            return False
        for job, result in zip(group, results, strict=True):
            if result is ALONE:
                self._alone(raw, cur, job)
            else:
                job.result = result
        return True

    def _fail_all(self, jobs: list[_Job], exc: BaseException) -> None:
        if self._conn.in_transaction:
            self._conn.rollback()
        for job in jobs:
            if job.error is None:
                job.error, job.result = exc, None


def _groups(jobs: list[_Job]) -> Iterator[list[_Job]]:
    """`jobs` in groups to run together, in an order that keeps the order of the writes of each key.

    A write without `merge` (its key unknown) is a group of its own and stays in its place.
    Between two such, the n-th writes of every key form round n, run after round n - 1, and the
    writes of one type in a round form one group: writes of distinct keys touch distinct rows.
    """
    segment: list[_Job] = []
    for job in jobs:
        if job.merge is None:
            yield from _rounds(segment)
            segment = []
            yield [job]
        else:
            segment.append(job)
    yield from _rounds(segment)


def _rounds(segment: list[_Job]) -> Iterator[list[_Job]]:
    rounds: list[dict[type, list[_Job]]] = []
    seen: dict[Hashable, int] = {}
    for job in segment:
        key = cast(Mergeable, job.merge).key
        n = seen.get(key, 0)
        seen[key] = n + 1
        if n == len(rounds):
            rounds.append({})
        rounds[n].setdefault(type(job.merge), []).append(job)
    for groups in rounds:
        yield from groups.values()


class _Recorder:
    """A cursor that keeps the writes it ran (a SELECT changes nothing), to apply them again after a rollback.

    Replaying them on the state they first ran on (the transaction's start) gives the same
    effects and the same answers, so the plans that ran them keep their results.
    """

    __slots__ = ("_cur", "writes")

    def __init__(self, cur: Any) -> None:
        self._cur = cur
        self.writes: list[tuple[bool, str, Any]] = []

    def execute(self, sql: str, params: Any = ()) -> Any:
        if not sql.startswith("SELECT"):
            self.writes.append((False, sql, params))
        return self._cur.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> Any:
        rows = rows if isinstance(rows, (list, tuple)) else list(rows)  # replayable
        self.writes.append((True, sql, rows))
        return self._cur.executemany(sql, rows)

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()  # type: ignore[no-any-return]

    def replay(self) -> None:
        for many, sql, params in self.writes:
            if many:
                self._cur.executemany(sql, params)
            else:
                self._cur.execute(sql, params).fetchall()  # stepped to its end (``RETURNING``)


class InlineSqlite:
    """Runs each plan at once, in its own transaction, on the caller's thread (where there are no threads)."""

    def __init__(self, conn: Any, statements: Dialect) -> None:
        self._conn = conn
        self._statements = statements

    def transaction(self, plan: Plan, *, write: bool) -> Any:
        cur = self._conn.cursor()
        cur.execute("BEGIN IMMEDIATE" if write else "BEGIN DEFERRED")
        try:
            result = run_sync(cur, self._statements, plan)
        except BaseException:
            self._conn.rollback()
            raise
        else:
            cur.execute("COMMIT")
        finally:
            cur.close()
        return result

    async def run(self, plan: Plan[T], *, write: bool, merge: Mergeable | None = None) -> T:
        return cast(T, self.transaction(plan, write=write))

    def close(self) -> None:
        self._conn.close()
