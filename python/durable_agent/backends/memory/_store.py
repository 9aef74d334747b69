"""`InMemoryCheckpointStore`: the reference checkpoint store (a dict in this process); `AsyncInMemoryCheckpointStore`
its async flavour.

A call is made durable by passing a store and, optionally, a run id:
``generate_text(..., store=store, run_id="run-1")``; every other store behaves like this one
(`durable_agent.testing.conformance`).
"""

from __future__ import annotations

import builtins
import dataclasses

from ..._checkpoint import AgentCheckpoint, RunStatus
from ..._storage.faces import AsyncFace
from ..._storage.indexed import Choose, IndexedStore, guard
from ..._storage.step_log import StepLog, common_prefix


class InMemoryCheckpointStore(IndexedStore):
    """The reference store: a dict of run id to its latest checkpoint. Not shared across processes.

    It passes `durable_agent.testing.CheckpointStoreConformance`, so it also shows the full store
    surface the persistent backends offer: the optimistic `expected_step_index` guard,
    paged and filtered `list`, `prune`, and `load_step` (the state at an earlier step
    boundary, for `durable_agent._fork`). The rules of that surface are `IndexedStore`'s; this
    class keeps the dicts.
    """

    def __init__(self) -> None:
        self._runs: dict[str, AgentCheckpoint] = {}
        self._steps: dict[str, StepLog[AgentCheckpoint]] = {}

    def _save(self, checkpoint: AgentCheckpoint, expected: int | None) -> None:
        previous = self._runs.get(checkpoint.run_id)
        guard(checkpoint.run_id, expected, previous)
        if previous is None:
            log = self._steps[checkpoint.run_id] = StepLog()
            kept = 0
        else:
            log = self._steps[checkpoint.run_id]
            kept = common_prefix(previous.messages, checkpoint.messages)
        log.record(checkpoint.step_index, len(checkpoint.messages), kept, _header(checkpoint))
        self._runs[checkpoint.run_id] = checkpoint

    def _load(self, run_id: str) -> AgentCheckpoint | None:
        return self._runs.get(run_id)

    def _load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None:
        latest, log = self._runs.get(run_id), self._steps.get(run_id)
        found = None if log is None else log.at(step_index)
        if latest is None or found is None:
            return None
        count, header = found
        return dataclasses.replace(header, messages=list(latest.messages[:count]))

    def _delete(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        self._steps.pop(run_id, None)

    def _select(self, choose: Choose) -> builtins.list[str]:
        return choose(self._runs.items())

    def _prune_runs(self, choose: Choose) -> builtins.list[str]:
        doomed = choose(self._runs.items())
        for run_id in doomed:
            del self._runs[run_id]
            del self._steps[run_id]
        return doomed


def _header(checkpoint: AgentCheckpoint) -> AgentCheckpoint:
    """`checkpoint` without its messages, built directly (`dataclasses.replace` costs about 7x more, at every save)."""
    c = checkpoint
    return AgentCheckpoint(c.run_id, c.step_index, c.status, (), c.usage, c.created_at, c.pending_approvals,
                           c.agent_path, c.version, c.step_id, c.trace_context)


class AsyncInMemoryCheckpointStore(AsyncFace):
    """The reference store's async flavour: the runs of an `InMemoryCheckpointStore` behind coroutine methods.

    For code written against the async stores (``await store.load(...)``, ``async with``), and
    for its tests in place of `AsyncSqliteCheckpointStore` and the like: `InMemoryCheckpointStore`'s
    methods are plain calls, as every sync store's are, so awaiting them is a `TypeError`. Not
    shared across processes.
    """

    def __init__(self) -> None:
        self.runs = InMemoryCheckpointStore()  # the same runs through the sync face

    async def _save(self, checkpoint: AgentCheckpoint, expected: int | None) -> None:
        self.runs.save(checkpoint, expected_step_index=expected)

    async def _load(self, run_id: str) -> AgentCheckpoint | None:
        return self.runs.load(run_id)

    async def _load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None:
        return self.runs.load_step(run_id, step_index)

    async def _delete(self, run_id: str) -> None:
        self.runs.delete(run_id)

    async def _list(self, status: RunStatus | None, limit: int | None, after: str | None) -> builtins.list[str]:
        return self.runs.list(status=status, limit=limit, after=after)

    async def _prune(self, before: int, status: RunStatus | None, include_suspended: bool) -> builtins.list[str]:
        return self.runs.prune(before=before, status=status, include_suspended=include_suspended)

    async def close(self) -> None:
        """Nothing to release (the runs stay readable through `runs`)."""
