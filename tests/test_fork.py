"""fork_run / update_run on real runs of the loop: a fork continues from its step, the source is untouched."""

from __future__ import annotations

import asyncio

from durable_agent import (
    InMemoryCheckpointStore,
    ScriptedModel,
    Tool,
    ToolApprovalResponse,
    call,
    generate_text,
    reply,
    resume_from_checkpoint,
)
from durable_agent.fork import checkpoint_at_step, fork_run, update_run

TOOLS = {
    "lookup": Tool(description="Find.", parameters={"type": "object"}, execute=lambda args: {"amount": 42}),
    "pay": Tool(description="Pay.", parameters={"type": "object"}, execute=lambda args: "paid", needs_approval=True),
}


def model() -> ScriptedModel:
    return ScriptedModel([reply("Looking.", call("lookup", {})), reply("Paying.", call("pay", {})), "Done."])


def test_a_fork_resumes_from_its_step_and_the_source_is_untouched() -> None:
    async def main() -> None:
        store = InMemoryCheckpointStore()
        first = await generate_text(model=model(), tools=TOOLS, max_steps=5, store=store, run_id="run",
                                    messages=[{"role": "user", "content": "Pay inv-7."}])
        assert first.finish_reason == "suspended"
        source = await checkpoint_at_step(store, "run")
        assert source.step_index == 1 and source.status == "suspended"

        at0 = await checkpoint_at_step(store, "run", 0)
        assert [m["role"] for m in at0.messages] == ["user", "assistant", "tool"] and at0.status == "running"
        forked = await fork_run(store, "run", new_run_id="fork", at_step=0,
                                edit=lambda h: [{"role": "user", "content": "Pay inv-8 instead."}, *h[1:]])
        assert forked.step_index == 0 and forked.usage == at0.usage

        resumed = await resume_from_checkpoint(store, "fork", model=model(), tools=TOOLS, max_steps=5)
        assert resumed.finish_reason == "suspended"
        assert resumed.steps[0].step_index == 1  # the fork continues with the step after its own
        fork_cp = await checkpoint_at_step(store, "fork")
        assert fork_cp.messages[0]["content"] == "Pay inv-8 instead."
        assert await checkpoint_at_step(store, "run") == source

        # update_run: drop the pending pay call in place; the run is no longer suspended
        updated = await update_run(store, "fork", lambda h: h[:-1])
        assert updated.status == "running" and updated.pending_approvals is None
        done = await resume_from_checkpoint(store, "run", model=model(), tools=TOOLS, max_steps=5,
                                            approval_responses=[ToolApprovalResponse(
                                                first.pending_approvals[0].approval_id, True)])
        assert done.text == "Done."

    asyncio.run(main())


def test_bad_steps_and_ids_are_configuration_errors() -> None:
    import pytest

    from durable_agent import ConfigurationError
    from durable_agent.testing import make_checkpoint

    store = InMemoryCheckpointStore()
    store.save(make_checkpoint("r", 1))
    for bad in (True, "1", -1, 1.0):
        with pytest.raises(ConfigurationError):
            asyncio.run(checkpoint_at_step(store, "r", bad))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        asyncio.run(fork_run(store, "r", new_run_id=""))
    with pytest.raises(ConfigurationError):
        asyncio.run(fork_run(store, "r", new_run_id="s", edit=lambda h: "not a history"))  # type: ignore[arg-type,return-value]
