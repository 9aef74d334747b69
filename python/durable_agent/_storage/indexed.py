"""The store rules written once for the stores that read their run index in Python.

The memory, JSONL and Durable Object stores each keep a per-run index entry (the latest
checkpoint, a `_Run` of the file, an index key) and apply the store rules to it in Python; the
SQLite, Postgres and Redis stores say the same rules in SQL and Lua. The rules are here, once:
the `expected_step_index` guard (`guard`), `list`'s order, filter and paging (`listing`) and
`prune`'s choice of runs (`pruning`). `IndexedStore` is the synchronous `CheckpointStore` surface
of the memory and JSONL stores over them, with the argument checks (`validate`). A store supplies
its I/O: ``_save``, ``_load``, ``_load_step`` and ``_delete`` with checked arguments, and
``_select``/``_prune_runs``, which read every run's `RunSummary` under whatever lock the store
needs and hand them to the rule. The Durable Object store, which has a sync and an async face
(`faces`), applies the same three rules.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Protocol

from .._checkpoint import AgentCheckpoint, RunStatus
from .._errors import CheckpointConflictError
from .validate import (
    check_checkpoint,
    check_expected,
    check_list_args,
    check_prune_args,
    check_run_id,
    check_step_index,
    page,
    prunable,
)


class RunSummary(Protocol):
    """What the rules read of a run's latest checkpoint."""

    @property
    def status(self) -> str: ...

    @property
    def step_index(self) -> int: ...

    @property
    def created_at(self) -> int: ...


Runs = Iterable[tuple[str, RunSummary]]
"""Every run of a store, as ``(run_id, summary)`` pairs in any order."""

Choose = Callable[[Runs], list[str]]
"""A rule that picks run ids from a store's runs (in code-point order)."""


def guard(run_id: str, expected: int | None, stored: RunSummary | None) -> None:
    """The `expected_step_index` guard: `CheckpointConflictError` unless the run's stored
    checkpoint (None: never saved) is at step `expected`; no guard when `expected` is None."""
    if expected is not None:
        actual = None if stored is None else stored.step_index
        if actual != expected:
            raise CheckpointConflictError(run_id, expected, actual)


def listing(status: RunStatus | None, limit: int | None, after: str | None) -> Choose:
    """`list`'s rule (arguments checked): the ids whose run is at `status` (any when None), paged."""
    return lambda runs: page((r for r, s in runs if status is None or s.status == status), limit, after)


def pruning(before: int, status: RunStatus | None, include_suspended: bool) -> Choose:
    """`prune`'s rule (arguments checked): the ids of the runs it deletes."""
    return lambda runs: page(
        (r for r, s in runs if prunable(s.status, s.created_at, before, status, include_suspended)), None, None
    )


class IndexedStore(ABC):
    """A synchronous `CheckpointStore` over an index of runs its subclass reads (see the module docs)."""

    def save(self, checkpoint: AgentCheckpoint, *, expected_step_index: int | None = None) -> None:
        """Store `checkpoint` as the latest of its run ("latest save wins").

        With `expected_step_index`, raise `CheckpointConflictError` (storing nothing) unless
        the stored checkpoint of this run is at that step (a run never saved is at None).
        """
        self._save(check_checkpoint(checkpoint), check_expected(expected_step_index))

    def load(self, run_id: str) -> AgentCheckpoint | None:
        """The latest checkpoint of `run_id`, or None. Raises `CheckpointCorruptError` for a damaged run."""
        return self._load(check_run_id(run_id))

    def load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None:
        """The checkpoint saved at `step_index` of `run_id`, or None when the store no longer holds it
        (the step log's rules: `durable_agent._storage.step_log`)."""
        return self._load_step(check_run_id(run_id), check_step_index(step_index))

    def delete(self, run_id: str) -> None:
        """Remove the run; an unknown run is not an error."""
        self._delete(check_run_id(run_id))

    def list(
        self, *, status: RunStatus | None = None, limit: int | None = None, after: str | None = None
    ) -> builtins.list[str]:
        """Run ids in code-point order, optionally only those whose latest status is `status`.

        Page with `limit` and `after` (the last id of the previous page).
        """
        return self._select(listing(*check_list_args(status, limit, after)))

    def prune(
        self, *, before: int, status: RunStatus | None = None, include_suspended: bool = False
    ) -> builtins.list[str]:
        """Delete runs whose latest checkpoint was created before `before` (epoch ms); returns their ids.

        Suspended runs (awaiting approval) are kept unless `include_suspended=True`.
        """
        return self._prune_runs(pruning(*check_prune_args(before, status, include_suspended)))

    @abstractmethod
    def _save(self, checkpoint: AgentCheckpoint, expected: int | None) -> None:
        """Store the checked `checkpoint`, under `guard` of `expected` against the stored run."""

    @abstractmethod
    def _load(self, run_id: str) -> AgentCheckpoint | None: ...

    @abstractmethod
    def _load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None: ...

    @abstractmethod
    def _delete(self, run_id: str) -> None: ...

    @abstractmethod
    def _select(self, choose: Choose) -> builtins.list[str]:
        """What `choose` picks from every run the store holds now."""

    @abstractmethod
    def _prune_runs(self, choose: Choose) -> builtins.list[str]:
        """Delete the runs `choose` picks from every run the store holds, as one step; returns their ids."""
