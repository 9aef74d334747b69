"""`InMemoryCheckpointStore`: the reference checkpoint store (a dict in this process).

A call is made durable by passing a store and, optionally, a run id:
``generate_text(..., store=store, run_id="run-1")``; every other store behaves like this one
(`durable_agent.testing.conformance`).
"""

from __future__ import annotations

import builtins
import dataclasses

from ..._storage.step_log import StepLog, common_prefix
from ..._storage.validate import (
    check_checkpoint,
    check_expected,
    check_list_args,
    check_prune_args,
    check_run_id,
    check_step_index,
    page,
    prunable,
)
from ...checkpoint import AgentCheckpoint, RunStatus
from ...errors import CheckpointConflictError


class InMemoryCheckpointStore:
    """The reference store: a dict of run id to its latest checkpoint. Not shared across processes.

    It passes `durable_agent.testing.CheckpointStoreConformance`, so it also shows the full store
    surface the persistent backends offer: the optimistic `expected_step_index` guard,
    paged and filtered `list`, `prune`, and `load_step` (the state at an earlier step
    boundary, for `durable_agent.fork`).
    """

    def __init__(self) -> None:
        self._runs: dict[str, AgentCheckpoint] = {}
        self._steps: dict[str, StepLog[AgentCheckpoint]] = {}

    def save(self, checkpoint: AgentCheckpoint, *, expected_step_index: int | None = None) -> None:
        """Store `checkpoint` as the latest of its run ("latest save wins").

        With `expected_step_index`, raise `CheckpointConflictError` (storing nothing) unless
        the stored checkpoint of this run is at that step (a run never saved is at None).
        """
        checkpoint = check_checkpoint(checkpoint)
        expected = check_expected(expected_step_index)
        if expected is not None:
            current = self._runs.get(checkpoint.run_id)
            actual = None if current is None else current.step_index
            if actual != expected:
                raise CheckpointConflictError(checkpoint.run_id, expected, actual)
        previous = self._runs.get(checkpoint.run_id)
        if previous is None:
            log = self._steps[checkpoint.run_id] = StepLog()
            kept = 0
        else:
            log = self._steps[checkpoint.run_id]
            kept = common_prefix(previous.messages, checkpoint.messages)
        log.record(checkpoint.step_index, len(checkpoint.messages), kept, _header(checkpoint))
        self._runs[checkpoint.run_id] = checkpoint

    def load(self, run_id: str) -> AgentCheckpoint | None:
        return self._runs.get(check_run_id(run_id))

    def load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None:
        """The checkpoint saved at `step_index` of `run_id`, or None when the store no longer holds
        it (see `durable_agent._storage.step_log` for when a step is dropped)."""
        check_run_id(run_id)
        latest, log = self._runs.get(run_id), self._steps.get(run_id)
        found = None if log is None else log.at(check_step_index(step_index))
        if latest is None or found is None:
            return None
        count, header = found
        return dataclasses.replace(header, messages=list(latest.messages[:count]))

    def delete(self, run_id: str) -> None:
        self._runs.pop(check_run_id(run_id), None)
        self._steps.pop(run_id, None)

    def list(
        self, *, status: RunStatus | None = None, limit: int | None = None, after: str | None = None
    ) -> builtins.list[str]:
        """Run ids in code-point order, optionally only those whose latest status is `status`.

        Page with `limit` and `after` (the last id of the previous page).
        """
        status, limit, after = check_list_args(status, limit, after)
        return page(
            (r for r, cp in self._runs.items() if status is None or cp.status == status), limit, after
        )

    def prune(
        self, *, before: int, status: RunStatus | None = None, include_suspended: bool = False
    ) -> builtins.list[str]:
        """Delete runs whose latest checkpoint was created before `before` (epoch ms); returns their ids.

        Suspended runs (awaiting approval) are kept unless `include_suspended=True`.
        """
        before, status, include_suspended = check_prune_args(before, status, include_suspended)
        doomed = page(
            (
                r
                for r, cp in self._runs.items()
                if prunable(cp.status, cp.created_at, before, status, include_suspended)
            ),
            None,
            None,
        )
        for run_id in doomed:
            del self._runs[run_id]
            del self._steps[run_id]
        return doomed


def _header(checkpoint: AgentCheckpoint) -> AgentCheckpoint:
    """`checkpoint` without its messages, built directly (`dataclasses.replace` costs about 7x more, at every save)."""
    c = checkpoint
    return AgentCheckpoint(c.run_id, c.step_index, c.status, (), c.usage, c.created_at, c.pending_approvals,
                           c.agent_path, c.version, c.step_id, c.trace_context)
