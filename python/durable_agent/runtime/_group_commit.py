"""Group commit: SQLite plans run on a connection of their own thread, concurrent writes share one commit.

A server runs many runs at once; if each write were its own transaction on the event loop's
thread, every fsync would stall every run. Here the event loop only queues a plan and awaits
its future. The writer thread takes everything queued, runs the reads in one snapshot, then
the writes in ONE ``BEGIN IMMEDIATE`` transaction, each inside a ``SAVEPOINT`` of its own (a
write whose plan raises — a fenced, stale one — is rolled back alone and its waiter gets the
error), and commits once: one fsync for the whole batch. A waiter is released only after the
commit that made its own write durable; if that commit fails, every writer of the batch gets
the error and nothing of the batch is applied.

Writes that arrive while a commit is in flight wait for the next batch: under load the batches
grow by themselves, with no timer. Pyodide has no threads: `InlineSqlite` runs each plan at
once, in its own transaction, on the caller's thread.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass
from typing import Any

from ..sql.plan import Dialect, Plan, run_sync

MAX_BATCH = 512


@dataclass(slots=True)
class _Job:
    plan: Plan
    write: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = None


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # its waiter was cancelled: the write may still have committed
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class GroupCommitSqlite:
    """Runs plans on `conn` (opened with ``isolation_level=None``) on one thread; see the module docs."""

    def __init__(self, conn: Any, statements: Dialect) -> None:
        self._conn = conn
        self._statements = statements
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    async def run(self, plan: Plan, *, write: bool) -> Any:
        loop = asyncio.get_running_loop()
        job = _Job(plan, write, loop, loop.create_future())
        self._ensure_thread()
        self._jobs.put(job)
        return await job.future

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
            for job in batch:
                try:
                    job.loop.call_soon_threadsafe(_settle, job.future, job.result, job.error)
                except RuntimeError:  # that event loop is closed: nobody waits any more
                    pass
            if stop:
                return

    def _run_batch(self, batch: list[_Job]) -> None:
        reads = [job for job in batch if not job.write]
        writes = [job for job in batch if job.write]
        if reads:
            self._in_transaction("DEFERRED", reads, savepoints=False)
        if writes:
            self._in_transaction("IMMEDIATE", writes, savepoints=True)

    def _in_transaction(self, mode: str, jobs: list[_Job], *, savepoints: bool) -> None:
        cur = self._conn.cursor()
        try:
            try:
                cur.execute(f"BEGIN {mode}")
            except BaseException as exc:  # noqa: BLE001 - the database refused: every waiter learns why
                for job in jobs:
                    job.error = exc
                return
            for job in jobs:
                if savepoints:
                    cur.execute("SAVEPOINT plan")
                try:
                    job.result = run_sync(cur, self._statements, job.plan)
                except BaseException as exc:  # noqa: BLE001 - this plan's own failure, for its waiter
                    job.error = exc
                    if savepoints:
                        cur.execute("ROLLBACK TO plan")
                if savepoints:
                    cur.execute("RELEASE plan")
            try:
                cur.execute("COMMIT")
            except BaseException as exc:  # noqa: BLE001 - nothing of the batch is durable
                if self._conn.in_transaction:
                    self._conn.rollback()
                for job in jobs:
                    if job.error is None:
                        job.error, job.result = exc, None
        except BaseException as exc:  # noqa: BLE001 - a savepoint statement failed: roll the batch back
            if self._conn.in_transaction:
                self._conn.rollback()
            for job in jobs:
                if job.error is None:
                    job.error, job.result = exc, None
        finally:
            cur.close()


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

    async def run(self, plan: Plan, *, write: bool) -> Any:
        return self.transaction(plan, write=write)

    def close(self) -> None:
        self._conn.close()
