"""A fork never shares an approval id with its original, on every runtime (memory, a SQLite file, a Postgres schema):
`resolve_approval(runtime, approval_id)` finds the awakeable by that id alone, so a verdict for the fork's approval
must never approve the original run, and the original's verdict must never reach the fork.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import startup_loop
from durable_agent import (
    ConfigurationError,
    GenerateTextResult,
    RunLeaseHeldError,
    ToolApprovalResponse,
    fork_run,
    resolve_approval,
)
from helpers import maybe_await
from test_agent import runtime_on  # noqa: F401  # fixtures: memory, SQLite, Postgres
from test_parked_resume import ledger_of, stored
from test_runtime_postgres import conninfo, opened  # noqa: F401

SESSION = "parked"  # startup_loop's script: pay and ship inv-7, each needing a signed approval


async def parked_and_forked(open_runtime: Callable[[], Any], ledger: Path) -> tuple[GenerateTextResult, Any]:
    """The original run parked on its two approvals, and its fork ``fork-1`` (signed for the fork)."""
    first = await startup_loop.agent(open_runtime(), SESSION, ledger).run("Pay and ship inv-7.")
    assert first.finish_reason == "suspended" and first.run_id is not None
    forked = await fork_run(open_runtime().stores.checkpoints, first.run_id, new_run_id="fork-1",
                            approval_signer=startup_loop.SIGNER)
    assert forked.status == "suspended"
    return first, forked


async def awakeables(runtime: Any) -> dict[str, bool]:
    return {a.id: a.resolved for a in await runtime.inspect.awakeables()}


def verdicts(requests: Any) -> list[ToolApprovalResponse]:
    return [ToolApprovalResponse(r.approval_id, True, token=r.token) for r in requests]


async def test_resolving_a_forks_approval_leaves_the_original_parked(
    runtime_on: Callable[[], Any], tmp_path: Path  # noqa: F811
) -> None:
    ledger = tmp_path / "ledger.txt"
    first, forked = await parked_and_forked(runtime_on, ledger)
    original_ids = {r.approval_id for r in first.pending_approvals}
    parked = await stored(runtime_on(), first.run_id)

    for request in forked.pending_approvals:  # the fork has no awakeable yet: nothing waits on its ids
        assert not await resolve_approval(runtime_on(), request.approval_id, approved=True, token=request.token)
    assert await awakeables(runtime_on()) == dict.fromkeys(original_ids, False)
    assert not original_ids & {r.approval_id for r in forked.pending_approvals}
    again = await startup_loop.agent(runtime_on(), SESSION, ledger).resume()
    assert again is not None and again.finish_reason == "suspended" and again.run_id == first.run_id
    assert await stored(runtime_on(), first.run_id) == parked and ledger_of(ledger) == []

    # the fork is approved by resuming it with its verdicts (its tokens were signed for it) and runs each tool once
    done = await startup_loop.agent(runtime_on(), SESSION, ledger).resume(
        run_id="fork-1", approval_responses=verdicts(forked.pending_approvals))
    assert done is not None and done.text == "Paid and shipped." and done.run_id == "fork-1"
    assert ledger_of(ledger) == ["pay inv-7", "ship inv-7"]
    assert await stored(runtime_on(), first.run_id) == parked  # the original still waits, unapproved
    assert await awakeables(runtime_on()) == dict.fromkeys(original_ids, False)


async def test_approving_the_original_never_touches_its_fork(
    runtime_on: Callable[[], Any], tmp_path: Path  # noqa: F811
) -> None:
    ledger = tmp_path / "ledger.txt"
    first, forked = await parked_and_forked(runtime_on, ledger)
    for request in first.pending_approvals:
        assert await resolve_approval(runtime_on(), request.approval_id, approved=True, token=request.token)
    done = await startup_loop.agent(runtime_on(), SESSION, ledger).resume()
    assert done is not None and done.text == "Paid and shipped." and done.run_id == first.run_id
    assert ledger_of(ledger) == ["pay inv-7", "ship inv-7"]

    assert await maybe_await(runtime_on().stores.checkpoints.load("fork-1")) == forked  # still parked, as forked
    left = await startup_loop.agent(runtime_on(), SESSION, ledger).resume(run_id="fork-1")
    assert left is not None and left.finish_reason == "suspended"  # no verdict of its own: it waits
    assert left.pending_approvals == forked.pending_approvals and ledger_of(ledger) == ["pay inv-7", "ship inv-7"]


async def test_a_fork_made_on_the_runtime_is_approved_through_its_own_awakeables(
    runtime_on: Callable[[], Any], tmp_path: Path  # noqa: F811
) -> None:
    """`fork_run(..., runtime=)` parks the fork in its original's session on awakeables of its own: `resolve_approval`
    of the fork's ids answers the fork alone, and the session's `resume(run_id=fork)` settles it with no verdict
    passed; the original keeps its checkpoint and its unresolved awakeables, and stays the session's parked run."""
    ledger = tmp_path / "ledger.txt"
    first = await startup_loop.agent(runtime_on(), SESSION, ledger).run("Pay and ship inv-7.")
    assert first.finish_reason == "suspended" and first.run_id is not None
    parked = await stored(runtime_on(), first.run_id)
    forked = await fork_run(runtime_on().stores.checkpoints, first.run_id, new_run_id="fork-1",
                            approval_signer=startup_loop.SIGNER, runtime=runtime_on())
    original_ids = {r.approval_id for r in first.pending_approvals}
    fork_ids = {r.approval_id for r in forked.pending_approvals or ()}
    assert await awakeables(runtime_on()) == dict.fromkeys(original_ids | fork_ids, False)
    (origin,) = await runtime_on().inspect.steps("fork-1")  # what names the fork's session to a CLI
    assert (origin.session_id, origin.kind, origin.result) == (SESSION, "fork", {"run_id": first.run_id,
                                                                                  "step_index": parked.step_index})

    for request in forked.pending_approvals or ():
        assert await resolve_approval(runtime_on(), request.approval_id, approved=True, token=request.token)
    assert await awakeables(runtime_on()) == {**dict.fromkeys(original_ids, False), **dict.fromkeys(fork_ids, True)}
    again = await startup_loop.agent(runtime_on(), SESSION, ledger).resume()  # the session's parked run: the original
    assert again is not None and again.finish_reason == "suspended" and again.run_id == first.run_id
    assert ledger_of(ledger) == []

    done = await startup_loop.agent(runtime_on(), SESSION, ledger).resume(run_id="fork-1")
    assert done is not None and done.text == "Paid and shipped." and done.run_id == "fork-1"
    assert ledger_of(ledger) == ["pay inv-7", "ship inv-7"]
    assert await stored(runtime_on(), first.run_id) == parked
    assert await awakeables(runtime_on()) == {**dict.fromkeys(original_ids, False), **dict.fromkeys(fork_ids, True)}


async def test_a_fork_on_the_runtime_needs_a_session_and_the_sessions_lease(
    runtime_on: Callable[[], Any], tmp_path: Path  # noqa: F811
) -> None:
    first = await startup_loop.agent(runtime_on(), SESSION, tmp_path / "ledger.txt").run("Pay and ship inv-7.")
    assert first.run_id is not None
    store = runtime_on().stores.checkpoints
    await fork_run(store, first.run_id, new_run_id="plain")  # in the store: no journal, no awakeable
    with pytest.raises(ConfigurationError, match="no journal in the runtime"):
        await fork_run(store, "plain", new_run_id="fork-0", runtime=runtime_on())
    with pytest.raises(ConfigurationError, match="pass runtime="):
        await fork_run(store, first.run_id, new_run_id="fork-0", session_id=SESSION)

    holder = runtime_on()
    claim = await holder.lease.claim(SESSION, stale_at=0)  # a live process runs the session
    with pytest.raises(RunLeaseHeldError):
        await fork_run(store, first.run_id, new_run_id="fork-1", runtime=runtime_on())
    await holder.lease.release(SESSION, claim.epoch)
    assert await maybe_await(store.load("fork-1")) is None and await maybe_await(store.load("fork-0")) is None
    forked = await fork_run(store, "plain", new_run_id="fork-2", runtime=runtime_on(), session_id="another")
    assert {a.session_id for a in await runtime_on().inspect.awakeables()
            if a.id in {r.approval_id for r in forked.pending_approvals or ()}} == {"another"}
