"""The in-memory backend: the reference checkpoint store and runtime, for tests and one process.

`InMemoryCheckpointStore` (a dict of run id to checkpoints; `AsyncInMemoryCheckpointStore` is its async
flavour) and `MemoryRuntime` over a
`MemoryDurableState` (one state can be shared by several runtimes in a process, to play a
restart). Both are also importable from `durable_agent`.
"""

from __future__ import annotations

from ._runtime import MemoryDurableState, MemoryRuntime
from ._store import AsyncInMemoryCheckpointStore, InMemoryCheckpointStore

__all__ = ["AsyncInMemoryCheckpointStore", "InMemoryCheckpointStore", "MemoryDurableState", "MemoryRuntime"]
