"""An async checkpoint store with a sync face, so one test body checks a sync store and its async twin."""

from __future__ import annotations

import asyncio
from typing import Any


class BlockingStore:
    """Runs each coroutine method of `store` to its end on an event loop of this handle's own.

    One loop for the handle's life: a `redis.asyncio` client's connections belong to the loop
    that opened them. Use a handle from one thread at a time.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self._loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        return lambda *args, **kwargs: self._loop.run_until_complete(method(*args, **kwargs))

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self.store.close())
        finally:
            self._loop.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
