"""Small helpers shared across modules."""

from __future__ import annotations

import inspect
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def maybe_await(value: Any) -> Any:
    """Await `value` when it is awaitable (a store or callback may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """The result of `coro`, which must finish without suspending.

    A sync API over a logic written once as coroutines (the SQLite and Redis checkpoint stores):
    its sync flavour awaits only I/O that is done at once, on the caller's thread.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]  # typeshed: StopIteration.value is Any
    coro.close()
    raise RuntimeError("run_now: the coroutine suspended (it awaited real asynchronous I/O)")


def wall_clock_ms() -> int:
    """The default clock everywhere: the wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000
