"""The storage seam (`SessionStore`), the reference in-memory store, and the `Session` option."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .checkpoint import AgentCheckpoint


@runtime_checkable
class SessionStore(Protocol):
    """Where checkpoints live. Each method may return its value directly or an awaitable of it.

    `save` is called with the latest snapshot at every step boundary; the reference
    semantics are "latest save wins" per run id. `load` returns None for an unknown run.
    Stores may also offer `delete(run_id)` and `list()`; the loop never calls them.
    """

    def save(self, checkpoint: AgentCheckpoint) -> None | Awaitable[None]: ...

    def load(self, run_id: str) -> AgentCheckpoint | None | Awaitable[AgentCheckpoint | None]: ...


class InMemorySessionStore:
    """The reference store: a dict of run id to its latest checkpoint. Not shared across processes."""

    def __init__(self) -> None:
        self._runs: dict[str, AgentCheckpoint] = {}

    def save(self, checkpoint: AgentCheckpoint) -> None:
        self._runs[checkpoint.run_id] = checkpoint

    def load(self, run_id: str) -> AgentCheckpoint | None:
        return self._runs.get(run_id)

    def delete(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def list(self) -> list[str]:
        return sorted(self._runs)


@dataclass(frozen=True, slots=True)
class Session:
    """Opt-in durability for one call: the store to checkpoint into and the run's id.

    Without `run_id`, the call mints one with its `generate_id` when the run starts.
    """

    store: SessionStore
    run_id: str | None = None
