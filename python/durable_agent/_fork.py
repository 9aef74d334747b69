"""Fork and time travel: a new run from a step boundary of another, and editing a run before it resumes.

**What "the state at step N" means.** A run's `step_index` starts at 0 and grows by one per
boundary: each model step is one (its assistant message, plus the tool message of the tools
it ran), and settling verdicts on resume is one too (the tool message answering the suspended
calls, saved before the next model call). The state at step N is the checkpoint saved at
boundary N: the history right after that boundary, the run's cumulative usage then, and its
status then (``suspended`` with its pending approvals, ``running`` or ``completed``). A fork at
N continues with boundary N + 1: nothing up to N runs again, nothing after N is kept. Only
saved boundaries exist: a step interrupted before its checkpoint has no state.

**Where it comes from.** The latest step is the run's checkpoint (`load`). An earlier one is
read from the store's step log, `store.load_step(run_id, N)`, which every bundled store keeps
(one small entry per save: the header and the history's length; the messages are the run's
own append-only rows). `durable_agent._storage.step_log` states when a step is dropped: a later
save at an earlier step, a save that rewrote the messages it covered, a JSONL `compact()`.
Runs saved before the step log existed (SQL schema 1) fork at their latest step only. A store
of your own without `load_step` forks at its latest step; an earlier step raises
`StepNotFoundError`, as does a step the log no longer holds.

**Cost.** A fork is one `save` of a new run: its messages are written under the new run id,
so the shared prefix is copied once, O(prefix). No bundled backend shares message rows
between runs: each keys its rows by run id, and a parent pointer would be a stored format
older versions could not read. After the fork the new run saves append-only like any other.

**Editing (LangGraph's update_state).** `edit=` on `fork_run`, or `update_run` on a run in
place, takes the history as a new list and returns the history to continue from (drop a turn,
change the user's question, answer a client tool by appending a ``tool`` message...). The
pending approvals are then recomputed: a request survives only while its call is still
unanswered in the last assistant message. A ``suspended`` run stays suspended while anything
of its parked step still waits (`durable_agent._parked`: a surviving approval, a client call
without a result, a sub-agent) and becomes ``running`` only when nothing does. Pass the run's
`tools=` so its client calls are told from server calls that run when it resumes; without
them every unanswered call without an approval marker counts as waiting. Resume the result
with `resume_from_checkpoint(store, run_id, ...)`.

**Approval ids.** A fork's pending approvals get fresh approval ids (`generate_id`, random by
default), in its requests and in the markers of its last assistant message: no two runs share
an approval id. `resolve_approval(runtime, approval_id)` finds the awakeable by that id alone,
so a fork holding its original's ids would have its verdicts land on the original's awakeable
(approving the original run and leaving the fork parked), and the original's on the fork.
Renaming in the fork keeps `resolve_approval`'s signature and every parked run's journal as
they are. A fork copies the checkpoint, not the journal: it has no awakeable until it parks
again (unless made on the runtime, below), so approve it by resuming it with the verdict
(``agent.resume(run_id=..., approval_responses=...)``); `resolve_approval` of its id answers
False meanwhile. `update_run` keeps the run's ids: they are still that run's own. Forks made
before this rule share their original's ids: approve them by resuming too, never through
`resolve_approval`.

**Forks on a runtime.** ``fork_run(store, run_id, new_run_id=..., runtime=runtime)`` (the CLI's
``runs fork --runtime``) parks the fork like any run of a session: its checkpoint, one awakeable
per pending approval (keyed by the fork's run id, its id the fork's fresh approval id) and an
origin record (``{fork}:0:fork:0``, kind ``fork``: `run_id` and the step) are one transaction,
fenced by the session's lease (`durable_session.commit_fork`). The session is `session_id`, by
default the original's (the session whose journal holds `run_id`): so `resolve_approval(runtime,
fork_approval_id)` (``runs approve FORK ID --runtime``) stores the verdict on the fork's own
awakeable, and that session's ``agent.resume(run_id=fork)`` settles it. The original's
awakeables, mark and checkpoint are untouched, and the fork does not become the session's last
run (its conversation). `store` is read (the runtime's checkpoints, or a store on the runtime's
database for an earlier step: only stores keep a step log).

**Signed approvals.** An approval token binds its run id and approval id, so a token of the
first run is refused in a fork. Pass `approval_signer=` to sign the fork's pending requests
for the new run (under their new ids); without it their tokens are dropped, since a token
cannot be re-signed without the secret (a signed deployment then denies them on resume
unless the verdict comes with a token signed for the fork).
A run suspended inside a durable sub-agent keeps the sub-agent's own checkpoint under the
first run's id (``{run_id}::{name}#{call}``): a fork does not copy it, so resuming the fork
runs that sub-agent call again from its start.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from ._checkpoint import AgentCheckpoint, ToolApprovalRequest
from ._durable_session import STALE_AFTER_MS, commit_fork, session_of
from ._errors import CheckpointConflictError, CheckpointNotFoundError, ConfigurationError, StepNotFoundError
from ._messages import Message
from ._options import random_id
from ._parked import waits_for_calls
from ._signing import ApprovalSigner
from ._storage.protocols import DurableRuntime
from ._storage.validate import check_run_id, check_step_index
from ._tools import Tool
from ._transcript import unresolved_calls
from ._util import maybe_await, wall_clock_ms

MessageEdit = Callable[[list[Message]], Sequence[Message]]
"""Takes the history (a new list the edit may change) and returns the history to continue from."""


async def checkpoint_at_step(store: Any, run_id: str, step_index: int | None = None) -> AgentCheckpoint:
    """The state of `run_id` at boundary `step_index` (the latest when None); see the module docstring.

    Raises `CheckpointNotFoundError` for an unknown run and `StepNotFoundError` for a step the
    store holds no state of (not reached yet, replaced, or not kept by this store).
    """
    check_run_id(run_id)
    if step_index is not None:
        check_step_index(step_index)
    latest: AgentCheckpoint | None = await maybe_await(store.load(run_id))
    if latest is None:
        raise CheckpointNotFoundError(run_id)
    latest.refuse_newer()
    if step_index is None or step_index == latest.step_index:
        return latest
    if step_index > latest.step_index:
        raise StepNotFoundError(run_id, step_index, f"the run's latest step is {latest.step_index}")
    reader = getattr(store, "load_step", None)
    if reader is None:
        raise StepNotFoundError(
            run_id, step_index, f"{type(store).__name__} keeps no step log: only the latest step can be read"
        )
    found: AgentCheckpoint | None = await maybe_await(reader(run_id, step_index))
    if found is None:
        raise StepNotFoundError(
            run_id, step_index, "the store no longer holds it (saved over, history rewritten, or saved before the step log)"
        )
    return found.refuse_newer()


async def fork_run(
    store: Any,
    run_id: str,
    *,
    new_run_id: str,
    at_step: int | None = None,
    edit: MessageEdit | None = None,
    tools: Mapping[str, Tool] | None = None,
    approval_signer: ApprovalSigner | None = None,
    clock: Callable[[], int] = wall_clock_ms,
    generate_id: Callable[[], str] = random_id,
    runtime: DurableRuntime | None = None,
    session_id: str | None = None,
) -> AgentCheckpoint:
    """Start run `new_run_id` from the state of `run_id` at step `at_step` (the latest when None).

    `edit` may change the history first. The new run's checkpoint keeps the step index, usage
    and status of that step (its `created_at` is now; a suspended one is ``running`` when
    nothing of it waits any more, see the module docs: `tools` are the run's tools); it is
    saved and returned. Its pending approvals get fresh ids from `generate_id` (see "Approval
    ids" in the module docs). With `runtime` (an `Agent`'s run), the fork is read from `store` and
    committed through the runtime into session `session_id` (default: `run_id`'s session), parked
    on awakeables of its own: see "Forks on a runtime" in the module docs. Raises
    `CheckpointNotFoundError`, `StepNotFoundError`, and `CheckpointConflictError` when
    `new_run_id` already holds a run (checked before the save: two forks racing to one new id
    are not told apart); with `runtime`, `ConfigurationError` when no session is given and the
    runtime never journaled `run_id`, `RunLeaseHeldError` while a live process holds the session.
    """
    check_run_id(new_run_id, "new_run_id")
    if new_run_id == run_id:
        raise ConfigurationError("new_run_id must differ from run_id (use update_run to edit a run in place)")
    source = await checkpoint_at_step(store, run_id, at_step)
    existing = await maybe_await(store.load(new_run_id))
    if existing is not None:
        raise CheckpointConflictError(
            new_run_id, None, existing.step_index, f"run {new_run_id!r} exists already (at step {existing.step_index})"
        )
    if runtime is None and session_id is not None:
        raise ConfigurationError("session_id= names the fork's session in a runtime: pass runtime= with it")
    if runtime is not None and session_id is None:
        session_id = await session_of(runtime, run_id)
        if session_id is None:
            raise ConfigurationError(f"run {run_id!r} has no journal in the runtime: name the session the fork"
                                     " joins (session_id=, the session of the Agent that resumes it)")
    forked = _edited(source, edit, new_run_id, tools, approval_signer, clock, generate_id)
    if runtime is None or session_id is None:
        await maybe_await(store.save(forked))
    else:
        await commit_fork(runtime, session_id, forked, run_id, stale_at=clock() - STALE_AFTER_MS)
    return forked


async def update_run(
    store: Any,
    run_id: str,
    edit: MessageEdit,
    *,
    tools: Mapping[str, Tool] | None = None,
    approval_signer: ApprovalSigner | None = None,
    clock: Callable[[], int] = wall_clock_ms,
) -> AgentCheckpoint:
    """Edit the history of `run_id`'s latest checkpoint in place, before it resumes.

    A suspended run stays suspended while anything of its parked step waits (see the module
    docs; `tools` are the run's tools, to tell its client calls).

    The edited checkpoint is saved at the same step index with ``expected_step_index`` set,
    so a run that moved on meanwhile raises `CheckpointConflictError` and nothing is written.
    Stores whose `save` takes no `expected_step_index` are saved to without that guard.
    `approval_signer` signs requests left without a token (none is changed otherwise).
    """
    latest = await checkpoint_at_step(store, run_id)
    updated = _edited(latest, edit, run_id, tools, approval_signer, clock, None)
    if _takes_expected(store.save):
        await maybe_await(store.save(updated, expected_step_index=latest.step_index))
    else:
        await maybe_await(store.save(updated))
    return updated


def _takes_expected(save: Any) -> bool:
    try:
        return "expected_step_index" in inspect.signature(save).parameters
    except (TypeError, ValueError):  # a builtin or an object without a signature
        return False


def _edited(
    source: AgentCheckpoint,
    edit: MessageEdit | None,
    run_id: str,
    tools: Mapping[str, Tool] | None,
    signer: ApprovalSigner | None,
    clock: Callable[[], int],
    generate_id: Callable[[], str] | None,
) -> AgentCheckpoint:
    """`source` as run `run_id` after `edit`; `generate_id` mints fresh approval ids (a fork), None keeps them."""
    messages: Sequence[Message] = list(source.messages)
    if edit is not None:
        messages = edit(list(messages))
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise ConfigurationError(f"an edit returns a sequence of messages, got {type(messages).__name__}")
        messages = list(messages)
    pending = _still_pending(source.pending_approvals, messages)
    if pending and generate_id is not None:
        pending, messages = _renamed(pending, messages, generate_id)
    pending = _tokens(pending, source.run_id == run_id, run_id, signer)
    draft = dataclasses.replace(
        source,
        run_id=run_id,
        step_id="",
        messages=messages,
        pending_approvals=pending,
        created_at=clock(),
    )
    if draft.status == "suspended" and not pending and not waits_for_calls(draft, tools):
        draft = dataclasses.replace(draft, status="running")  # nothing of the parked step waits any more
    try:  # the same checks a load applies: a bad edit fails here, not when the run resumes
        AgentCheckpoint.from_dict(draft.to_dict(), run_id=run_id)
    except Exception as exc:  # noqa: BLE001 - any malformed message is the edit's error
        raise ConfigurationError(f"the edited history is not a valid history: {exc}") from None
    return draft


def _still_pending(
    requests: tuple[ToolApprovalRequest, ...] | None, messages: Sequence[Message]
) -> tuple[ToolApprovalRequest, ...] | None:
    if not requests:
        return requests
    calls, approval_ids = unresolved_calls(messages)
    open_calls = {c["tool_call_id"] for c in calls}
    # A sub-agent's request is marked in the sub-agent's history, not here: it waits while the
    # parent's call into the sub-agent is unanswered.
    kept = tuple(
        r
        for r in requests
        if (open_calls if r.agent_path is not None else approval_ids.get(r.tool_call_id) == r.approval_id
            and r.tool_call_id in open_calls)
    )
    return kept or None


def _renamed(
    requests: tuple[ToolApprovalRequest, ...], messages: Sequence[Message], generate_id: Callable[[], str]
) -> tuple[tuple[ToolApprovalRequest, ...], Sequence[Message]]:
    """The requests under fresh approval ids, and the history with its markers of them renamed to match."""
    fresh = [generate_id() for _ in requests]
    if not all(isinstance(i, str) and i for i in fresh) or len({*fresh, *(r.approval_id for r in requests)}) != 2 * len(fresh):
        raise ConfigurationError(f"generate_id must return a new non-empty str per approval, none of the forked run's: got {fresh!r}")
    new = {r.approval_id: approval_id for r, approval_id in zip(requests, fresh, strict=True)}
    index = max(i for i, m in enumerate(messages) if m["role"] == "assistant")  # the parked step's: _still_pending kept
    content = messages[index]["content"]
    if isinstance(content, list):
        parts: list[Any] = [
            {**p, "approval_id": new[p["approval_id"]]}
            if p["type"] == "tool-approval-request" and p["approval_id"] in new else p
            for p in content
        ]
        marked: dict[str, Any] = {**messages[index], "content": parts}
        messages = [*messages[:index], cast(Message, marked), *messages[index + 1:]]
    return tuple(dataclasses.replace(r, approval_id=new[r.approval_id]) for r in requests), messages


def _tokens(
    requests: tuple[ToolApprovalRequest, ...] | None, same_run: bool, run_id: str, signer: ApprovalSigner | None
) -> tuple[ToolApprovalRequest, ...] | None:
    """Tokens bind the run: a copy of another run drops them, and `signer` signs each request left without one."""
    if not requests:
        return requests
    out = []
    for request in requests:
        token = request.token if same_run else None
        if token is None and signer is not None and request.agent_path is None:
            token = signer.sign(request, run_id=run_id)
        out.append(dataclasses.replace(request, token=token))
    return tuple(out)
