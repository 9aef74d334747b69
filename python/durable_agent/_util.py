"""Small helpers shared across modules."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def maybe_await(value: Any) -> Any:
    """Await `value` when it is awaitable (a store or callback may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """The result of `coro`, which must finish without suspending.

    A sync API over a logic written once as coroutines (the SQLite, Redis and Postgres checkpoint stores):
    its sync flavour awaits only I/O that is done at once, on the caller's thread.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]  # typeshed: StopIteration.value is Any
    coro.close()
    raise RuntimeError("run_now: the coroutine suspended (it awaited real asynchronous I/O)")


@contextlib.asynccontextmanager
async def pool_connection(pool: Any) -> AsyncIterator[Any]:
    """`pool.connection()` of an async connection pool (psycopg_pool's), cancelled if the task was.

    The pool waits for a connection through `asyncio.wait_for`, which on Python 3.11 can return
    what it waited for and drop a cancellation that arrives as the wait ends (fixed in 3.12): a
    run whose client is gone, or whose timeout fired, would go on to its end. A cancellation
    asked while waiting (the task's `cancelling()` count grew) and not raised is raised here,
    the connection going back to the pool.
    """
    task = asyncio.current_task()
    asked = task.cancelling() if task is not None else 0
    async with pool.connection() as conn:
        if task is not None and task.cancelling() > asked:
            raise asyncio.CancelledError
        yield conn


def wall_clock_ms() -> int:
    """The default clock everywhere: the wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000
