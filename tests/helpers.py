"""Two small helpers the tests and their worker scripts share (the library keeps its own copies private)."""

from __future__ import annotations

import inspect
import time
from typing import Any


async def maybe_await(value: Any) -> Any:
    """Await `value` when it is awaitable: a store's method returns a value (sync store) or an awaitable (async)."""
    if inspect.isawaitable(value):
        return await value
    return value


def wall_clock_ms() -> int:
    """The wall clock in epoch milliseconds: the library's default clock, which a test compares stamps with."""
    return time.time_ns() // 1_000_000
