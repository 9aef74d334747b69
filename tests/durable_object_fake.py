"""A stand-in for a SQLite-backed Durable Object's `ctx.storage`, enforcing the real storage's limits.

Shaped like the real `ctx.storage` as Python sees it through Pyodide's bridge (workerd cannot
run offline here):

* `storage.kv` (`SyncKvStorage`): `get(key)` -> value or None (JS undefined), `put(key, value)`,
  `delete(key)` -> bool, `list(**options)` -> an iterator of `[key, value]` pairs in key order
  (UTF-8 byte order, i.e. code-point order), options `start` (inclusive), `end`, `prefix`,
  `reverse`, `limit` (Python keyword arguments become the JS options object);
* the limit Cloudflare documents for SQLite-backed objects: "Key and value combined cannot
  exceed 2 MB" (2,097,152 bytes, counted here in UTF-8, which is never less than the storage's
  own count);
* `transactionSync(callback)`: runs the callback; if it raises, every write it made is undone
  and the error propagates;
* `setAlarm(ms)`, `getAlarm()`, `deleteAlarm()`: awaitables (JS Promises).

Pure Python: runs under CPython and under Pyodide (the project's Pyodide runner).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

ENTRY_LIMIT = 2 * 1024 * 1024


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class FakeSyncKv:
    """`ctx.storage.kv` of a SQLite-backed Durable Object."""

    LIST_OPTIONS = frozenset({"start", "end", "prefix", "reverse", "limit"})

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.writes = 0
        self.largest_entry = 0

    @staticmethod
    def _check_key(key: Any) -> None:
        if not isinstance(key, str):
            raise TypeError(f"Durable Object keys are strings, got {type(key).__name__}")

    def get(self, key: str) -> Any:
        self._check_key(key)
        return self.data.get(key)

    def put(self, key: str, value: Any) -> None:
        self._check_key(key)
        if value is None:
            raise TypeError("undefined is not a storable value")
        size = _size(key) + (_size(value) if isinstance(value, str) else len(json.dumps(value)))
        if size > ENTRY_LIMIT:
            raise RuntimeError(f"Error: Values cannot be larger than {ENTRY_LIMIT} bytes (key and value combined).")
        self.largest_entry = max(self.largest_entry, size)
        self.data[key] = value
        self.writes += 1

    def delete(self, key: str) -> bool:
        self._check_key(key)
        return self.data.pop(key, None) is not None

    def list(self, **options: Any) -> Iterator[list[Any]]:
        unknown = set(options) - self.LIST_OPTIONS
        if unknown:
            raise TypeError(f"unknown list() options {sorted(unknown)}")
        def order(k: str) -> bytes:
            return k.encode("utf-8", "surrogatepass")

        keys = sorted(self.data, key=order, reverse=bool(options.get("reverse")))
        prefix, start, end = options.get("prefix"), options.get("start"), options.get("end")
        picked = [
            k
            for k in keys
            if (prefix is None or k.startswith(prefix))
            and (start is None or order(k) >= order(start))
            and (end is None or order(k) < order(end))
        ]
        if options.get("limit") is not None:
            picked = picked[: options["limit"]]
        return iter([[k, self.data[k]] for k in picked])  # a JS iterator of [key, value] arrays


class FakeDurableObjectStorage:
    """`ctx.storage`: the synchronous KV API, `transactionSync`, and the (async) alarm API."""

    def __init__(self) -> None:
        self.kv = FakeSyncKv()
        self.alarm: int | None = None
        self.transactions = 0

    def transactionSync(self, callback: Callable[[], Any]) -> Any:  # the JS name
        snapshot = dict(self.kv.data)
        self.transactions += 1
        try:
            return callback()
        except BaseException:
            self.kv.data = snapshot
            raise

    async def setAlarm(self, scheduled_ms: int) -> None:  # the JS name
        self.alarm = int(scheduled_ms)

    async def getAlarm(self) -> int | None:
        return self.alarm

    async def deleteAlarm(self) -> None:
        self.alarm = None
