"""The in-memory reference store passes the conformance suite."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from durable_agent import AsyncInMemoryCheckpointStore, InMemoryCheckpointStore
from durable_agent.testing import CheckpointStoreConformance


class TestInMemoryStore(CheckpointStoreConformance):
    checks_encoding = False

    @pytest.fixture
    def make_store(self) -> Callable[[], InMemoryCheckpointStore]:
        store = InMemoryCheckpointStore()
        return lambda: store


def test_an_earlier_step_loads_with_every_field_it_was_saved_with() -> None:
    """The store logs a header per step (the checkpoint without its messages), built field by field: a field added
    later must not be dropped. `load_step` of a step the run has moved past gives back the whole checkpoint."""
    import dataclasses

    from durable_agent import AgentCheckpoint, ToolApprovalRequest, Usage

    checkpoint = AgentCheckpoint(
        run_id="r", step_index=4, status="suspended", messages=[{"role": "user", "content": "hi"}],
        usage=Usage(1, 2, 3), created_at=7, pending_approvals=(ToolApprovalRequest("a", "c", "t", {}),),
        agent_path=("child",), step_id="custom", trace_context={"traceparent": "00-1-2-01"},
    )
    unset = {f.name for f in dataclasses.fields(AgentCheckpoint)} - {"messages", "version"}
    assert all(getattr(checkpoint, name) != getattr(AgentCheckpoint("x", 0, "running", (), Usage(), 0), name)
               for name in unset), "every field is set to a non-default value above"
    store = InMemoryCheckpointStore()
    store.save(checkpoint)
    store.save(AgentCheckpoint("r", 5, "completed", [*checkpoint.messages, {"role": "assistant", "content": "yo"}],
                               Usage(2, 3, 5), 8))
    assert store.load_step("r", 4) == checkpoint


class TestAsyncInMemoryStore(CheckpointStoreConformance):
    """The async flavour passes the same suite, every method awaited."""

    checks_encoding = False

    @pytest.fixture
    def make_store(self) -> Callable[[], AsyncInMemoryCheckpointStore]:
        store = AsyncInMemoryCheckpointStore()
        return lambda: store


async def test_the_async_flavour_is_awaited_where_the_sync_store_is_a_type_error() -> None:
    """``await InMemoryCheckpointStore().load(...)`` is a TypeError (a sync store's methods are plain calls); code
    written for the async stores takes `AsyncInMemoryCheckpointStore`, also by URL (``memory+async://``)."""
    from durable_agent import AgentCheckpoint, Usage, open_store

    checkpoint = AgentCheckpoint("r", 0, "completed", ({"role": "user", "content": "hi"},), Usage(), 1)
    with pytest.raises(TypeError):
        await InMemoryCheckpointStore().load("r")  # type: ignore[misc]
    async with open_store("memory+async://") as store:
        assert isinstance(store, AsyncInMemoryCheckpointStore)
        await store.save(checkpoint)
        assert await store.load("r") == checkpoint
        assert await store.list() == ["r"] and store.runs.load("r") == checkpoint
