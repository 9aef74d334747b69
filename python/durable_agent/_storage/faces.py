"""The public methods of a store whose logic is written once as coroutines, in a sync and an async face.

A store's logic class implements `StoreLogic` (``_save``, ``_load``... as coroutines over its
I/O); `SyncFace` drives them to their end on the caller's thread (`run_now`: its I/O never
suspends), `AsyncFace` awaits them. The SQLite, Redis and Postgres stores each pair one logic with both
faces: `SqliteCheckpointStore(_SqliteStore, SyncFace)`, `AsyncSqliteCheckpointStore(_SqliteStore, AsyncFace)`.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from typing import Self

from .._checkpoint import AgentCheckpoint, RunStatus
from .._util import run_now
from .validate import (
    check_checkpoint,
    check_expected,
    check_list_args,
    check_prune_args,
    check_run_id,
    check_step_index,
)


class StoreLogic(ABC):
    """What a face calls, with the arguments checked (`validate`) by the face."""

    @abstractmethod
    async def _save(self, checkpoint: AgentCheckpoint, expected: int | None) -> None: ...

    @abstractmethod
    async def _load(self, run_id: str) -> AgentCheckpoint | None: ...

    @abstractmethod
    async def _load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None: ...

    @abstractmethod
    async def _delete(self, run_id: str) -> None: ...

    @abstractmethod
    async def _list(self, status: RunStatus | None, limit: int | None, after: str | None) -> builtins.list[str]: ...

    @abstractmethod
    async def _prune(self, before: int, status: RunStatus | None, include_suspended: bool) -> builtins.list[str]: ...


class SyncFace(StoreLogic):
    """The `CheckpointStore` methods, synchronous; `close()` and ``with`` come from the store."""

    def save(self, checkpoint: AgentCheckpoint, *, expected_step_index: int | None = None) -> None:
        """Store `checkpoint` as the latest of its run, writing only the messages not stored yet.

        With `expected_step_index`, raise `CheckpointConflictError` (and write nothing) unless
        the stored checkpoint of this run is at that step.
        """
        run_now(self._save(check_checkpoint(checkpoint), check_expected(expected_step_index)))

    def load(self, run_id: str) -> AgentCheckpoint | None:
        """The latest checkpoint of `run_id`, or None. Raises `CheckpointCorruptError` for a damaged run."""
        return run_now(self._load(check_run_id(run_id)))

    def load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None:
        """The checkpoint saved at `step_index` of `run_id`, or None when the store no longer holds it
        (the step log's rules: `durable_agent._storage.step_log`)."""
        return run_now(self._load_step(check_run_id(run_id), check_step_index(step_index)))

    def delete(self, run_id: str) -> None:
        """Remove the run; an unknown run is not an error."""
        run_now(self._delete(check_run_id(run_id)))

    def list(
        self, *, status: RunStatus | None = None, limit: int | None = None, after: str | None = None
    ) -> builtins.list[str]:
        """Run ids in code-point order, optionally only those whose latest status is `status`.

        Page with `limit` and `after` (the last id of the previous page).
        """
        return run_now(self._list(*check_list_args(status, limit, after)))

    def prune(
        self, *, before: int, status: RunStatus | None = None, include_suspended: bool = False
    ) -> builtins.list[str]:
        """Delete runs whose latest checkpoint was created before `before` (epoch ms); returns their ids.

        Suspended runs (awaiting approval) are kept unless `include_suspended=True`.
        """
        return run_now(self._prune(*check_prune_args(before, status, include_suspended)))

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncFace(StoreLogic):
    """The `CheckpointStore` methods as coroutines (see `SyncFace` for what each does)."""

    async def save(self, checkpoint: AgentCheckpoint, *, expected_step_index: int | None = None) -> None:
        """See `SyncFace.save`; returns once the save is stored."""
        await self._save(check_checkpoint(checkpoint), check_expected(expected_step_index))

    async def load(self, run_id: str) -> AgentCheckpoint | None:
        """See `SyncFace.load`."""
        return await self._load(check_run_id(run_id))

    async def load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None:
        """See `SyncFace.load_step`."""
        return await self._load_step(check_run_id(run_id), check_step_index(step_index))

    async def delete(self, run_id: str) -> None:
        """See `SyncFace.delete`."""
        await self._delete(check_run_id(run_id))

    async def list(
        self, *, status: RunStatus | None = None, limit: int | None = None, after: str | None = None
    ) -> builtins.list[str]:
        """See `SyncFace.list`."""
        return await self._list(*check_list_args(status, limit, after))

    async def prune(
        self, *, before: int, status: RunStatus | None = None, include_suspended: bool = False
    ) -> builtins.list[str]:
        """See `SyncFace.prune`."""
        return await self._prune(*check_prune_args(before, status, include_suspended))

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
