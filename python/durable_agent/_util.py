"""Small helpers shared across modules."""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

T = TypeVar("T")


async def maybe_await(value: Any) -> Any:
    """Await `value` when it is awaitable (a store or callback may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value
