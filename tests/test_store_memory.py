"""The in-memory reference store passes the conformance suite."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from durable_agent import InMemoryCheckpointStore
from durable_agent.testing import CheckpointStoreConformance


class TestInMemoryStore(CheckpointStoreConformance):
    checks_encoding = False

    @pytest.fixture
    def make_store(self) -> Callable[[], InMemoryCheckpointStore]:
        store = InMemoryCheckpointStore()
        return lambda: store


def test_the_step_log_header_keeps_every_field_but_the_messages() -> None:
    """The header the store logs per step is built field by field: a field added later must not be dropped."""
    import dataclasses

    from durable_agent import AgentCheckpoint, ToolApprovalRequest, Usage
    from durable_agent.backends.memory._store import _header

    checkpoint = AgentCheckpoint(
        run_id="r", step_index=4, status="suspended", messages=[{"role": "user", "content": "hi"}],
        usage=Usage(1, 2, 3), created_at=7, pending_approvals=(ToolApprovalRequest("a", "c", "t", {}),),
        agent_path=("child",), step_id="custom", trace_context={"traceparent": "00-1-2-01"},
    )
    assert _header(checkpoint) == dataclasses.replace(checkpoint, messages=())
    unset = {f.name for f in dataclasses.fields(AgentCheckpoint)} - {"messages", "version"}
    assert all(getattr(checkpoint, name) != getattr(AgentCheckpoint("x", 0, "running", (), Usage(), 0), name)
               for name in unset), "every field is set to a non-default value above"
