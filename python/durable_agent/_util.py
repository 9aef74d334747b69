"""Small helpers shared across modules."""

from __future__ import annotations

import inspect
import time
from typing import Any, TypeVar

T = TypeVar("T")


async def maybe_await(value: Any) -> Any:
    """Await `value` when it is awaitable (a store or callback may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value


def wall_clock_ms() -> int:
    """The default clock everywhere: the wall clock in epoch milliseconds."""
    return time.time_ns() // 1_000_000
