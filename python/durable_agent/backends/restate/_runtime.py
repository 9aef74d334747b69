"""`RestateRuntime`: a `DurableRuntime` in `replay` mode over one Restate Virtual Object invocation.

The engine's journal replaces the step records and the Virtual Object's lock (one exclusive
invocation per key at a time) replaces the lease: a claim always succeeds with epoch 1, renew
and release do nothing, and nothing is ever listed resumable (Restate retries an invocation
itself). What the other runtimes keep in tables — checkpoints, the session's last run, the
run marked in progress, tool state, queue, submissions — is the object's state (``ctx.set``).

A replay re-runs the handler's code and Restate compares what it writes with the journal, so
everything written must come out the same: the clock is journaled (`clock`), ids come from
Restate's deterministic random (`uuid`), and a transition that carries signed approval tokens
(minted by the signer's clock: a custom signer's may be its own) is journaled as an action before
its state is written. A checkpoint is written without its trace context (`stored_text`): a replay's
spans are new ones.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from ..._checkpoint import AgentCheckpoint, deserialize_checkpoint, serialize_checkpoint
from ..._errors import ConfigurationError, SubmissionConflictError, is_control_error
from ..._storage.records import (
    AwakeableRecord,
    LeaseClaim,
    ResumableRun,
    RunOwner,
    RunTransition,
    StepRecord,
    StreamPartialRecord,
    ToolStateOp,
    apply_tool_state,
)
from ..._util import wall_clock_ms
from ._scope import RestateScope
from ._sdk import codec_run, decoded, encoded, raw_serde, sdk

if TYPE_CHECKING:
    import restate

EPOCH = 1
"""The one epoch of every claim: the Virtual Object's lock is the fence."""

CHECKPOINT_PREFIX = "checkpoint/"
LAST_RUN, MARKED, TOOL_STATE, QUEUE, SUBMISSIONS, AWAKEABLES = (
    "last_run", "resumable_run", "tool_state", "queue", "submissions", "awakeables")


async def state_text(ctx: restate.ObjectSharedContext | restate.ObjectContext, name: str) -> str | None:
    """The codec text of a state entry this package wrote (also from a shared handler), None when unset."""
    raw = await ctx.get(name, serde=raw_serde())
    return None if raw is None else bytes(raw).decode()


class RestateLease:
    """The Virtual Object's lock as a `DurableLease`: only the run mark is stored."""

    def __init__(self, runtime: RestateRuntime) -> None:
        self._runtime = runtime

    async def claim(self, session_id: str, *, stale_at: int, owner: RunOwner | None = None,
                    on_stale: Any = None) -> LeaseClaim:
        self._runtime.check_session(session_id)
        return LeaseClaim(True, EPOCH, resumable_run=await self.resumable_run(session_id))

    async def renew(self, session_id: str, epoch: int) -> bool:
        return True

    async def release(self, session_id: str, epoch: int) -> None:
        return None

    async def epoch(self, session_id: str) -> int | None:
        return EPOCH

    async def mark_resumable(self, session_id: str, run_id: str | None, epoch: int | None) -> None:
        self._runtime.check_session(session_id)
        self._runtime.set_state(MARKED, run_id)

    async def resumable_run(self, session_id: str) -> str | None:
        self._runtime.check_session(session_id)
        return await self._runtime.get_state(MARKED)  # type: ignore[no-any-return]  # state is codec data

    async def resumable(self, *, stale_at: int, session_id: str | None = None) -> list[ResumableRun]:
        return []  # Restate retries an interrupted invocation itself


def stored_text(checkpoint: AgentCheckpoint) -> str:
    """The checkpoint's text as the object's state holds it: without its trace context, which names the spans
    of the attempt that wrote it, so a replay (new spans) would write other text than the journal's."""
    if checkpoint.trace_context is not None:
        checkpoint = dataclasses.replace(checkpoint, trace_context=None)
    return serialize_checkpoint(checkpoint)


class RestateCheckpoints:
    """The checkpoint store over the object's state: the latest checkpoint of each run."""

    def __init__(self, runtime: RestateRuntime) -> None:
        self._runtime = runtime

    async def load(self, run_id: str) -> AgentCheckpoint | None:
        text = await state_text(self._runtime.ctx, CHECKPOINT_PREFIX + run_id)
        return None if text is None else deserialize_checkpoint(text, run_id=run_id)

    async def save(self, checkpoint: AgentCheckpoint) -> None:
        self._runtime.set_text(CHECKPOINT_PREFIX + checkpoint.run_id, stored_text(checkpoint))


class RestateQueue:
    def __init__(self, runtime: RestateRuntime) -> None:
        self._runtime = runtime

    async def read(self, session_id: str) -> list[Any]:
        self._runtime.check_session(session_id)
        return list(await self._runtime.get_state(QUEUE) or [])

    async def write(self, session_id: str, entries: list[Any]) -> None:
        self._runtime.check_session(session_id)
        self._runtime.set_state(QUEUE, list(entries))


class RestateSubmissions:
    """Request ids of sends, in the object's state (same rules as the other runtimes)."""

    def __init__(self, runtime: RestateRuntime) -> None:
        self._runtime = runtime

    async def claim(self, session_id: str, request_id: str, fingerprint: str) -> tuple[bool, Any]:
        self._runtime.check_session(session_id)
        book = dict(await self._runtime.get_state(SUBMISSIONS) or {})
        earlier = book.get(request_id)
        if earlier is None:
            book[request_id] = {"fingerprint": fingerprint, "result": None}
            self._runtime.set_state(SUBMISSIONS, book)
            return True, None
        if earlier["fingerprint"] != fingerprint:
            raise SubmissionConflictError(session_id, request_id)
        return False, earlier["result"]

    async def complete(self, session_id: str, request_id: str, result: Any) -> None:
        self._runtime.check_session(session_id)
        book = dict(await self._runtime.get_state(SUBMISSIONS) or {})
        if result is None:
            book.pop(request_id, None)
        elif request_id in book:
            book[request_id] = {**book[request_id], "result": result}
        self._runtime.set_state(SUBMISSIONS, book)


class RestateRunBook:
    def __init__(self, runtime: RestateRuntime) -> None:
        self._runtime = runtime

    async def last(self, session_id: str) -> str | None:
        self._runtime.check_session(session_id)
        return await self._runtime.get_state(LAST_RUN)  # type: ignore[no-any-return]  # state is codec data

    async def set_last(self, session_id: str, run_id: str, epoch: int | None) -> None:
        self._runtime.check_session(session_id)
        self._runtime.set_state(LAST_RUN, run_id)


class RestateToolState:
    def __init__(self, runtime: RestateRuntime) -> None:
        self._runtime = runtime

    async def all(self) -> dict[str, Any]:
        return dict(await self._runtime.get_state(TOOL_STATE) or {})

    async def get(self, key: str, default: Any = None) -> Any:
        return (await self.all()).get(key, default)


class RestateStores:
    """Everything a run persists, in the Virtual Object's state."""

    def __init__(self, runtime: RestateRuntime) -> None:
        self._runtime = runtime

    @property
    def checkpoints(self) -> RestateCheckpoints:
        return RestateCheckpoints(self._runtime)

    @property
    def queue(self) -> RestateQueue:
        return RestateQueue(self._runtime)

    @property
    def submissions(self) -> RestateSubmissions:
        return RestateSubmissions(self._runtime)

    @property
    def runs(self) -> RestateRunBook:
        return RestateRunBook(self._runtime)

    def tool_state(self, session_id: str) -> RestateToolState:
        self._runtime.check_session(session_id)
        return RestateToolState(self._runtime)


class RestateInspector:
    """What replay mode can show: the awakeables of this invocation. Steps and partials are the engine's."""

    def __init__(self, runtime: RestateRuntime) -> None:
        self._runtime = runtime

    async def steps(self, run_id: str | None = None) -> list[StepRecord]:
        return []

    async def partials(self, run_id: str | None = None) -> list[StreamPartialRecord]:
        return []

    async def awakeables(self) -> list[AwakeableRecord]:
        return list(self._runtime.awakeable_records.values())


class RestateRuntime:
    """A replay-mode `DurableRuntime` bound to one exclusive Virtual Object invocation (``ctx``).

    Build one per invocation, `await start()` it, and hand it to `DurableOptions`; pass
    `clock` and `uuid` as the agent's ``clock`` and ``generate_id`` so everything the run
    writes is the same on a replay (`durable_agent.restate._service` does all of this).
    `approvals` names the Virtual Object that maps approval ids to awakeable ids (None: parked
    approvals are not registered, so only the awakeable ids resolve them).
    """

    mode: Literal["checkpoint", "replay"] = "replay"

    def __init__(self, ctx: restate.ObjectContext, *, approvals: str | None = None) -> None:
        self.ctx = ctx
        self.session_id = ctx.key()
        self.owner = RunOwner(socket.gethostname(), 0, f"restate:{self.session_id}")
        self.awakeable_records: dict[str, AwakeableRecord] = {}  # by key
        self.parked: list[tuple[AwakeableRecord, restate.RestateDurableFuture[Any]]] = []
        self._approvals = approvals
        self._futures: dict[str, restate.RestateDurableFuture[Any]] = {}
        self._now = 0
        self._started = False

    async def start(self) -> RestateRuntime:
        """Journal the invocation's start time (the clock's first reading). Idempotent."""
        if not self._started:
            self._now = int(await self.ctx.time() * 1000)
            self._started = True
        return self

    # ----------------------------------------------------------- protocol

    @property
    def lease(self) -> RestateLease:
        return RestateLease(self)

    @property
    def stores(self) -> RestateStores:
        return RestateStores(self)

    @property
    def inspect(self) -> RestateInspector:
        return RestateInspector(self)

    def is_control_error(self, error: BaseException) -> bool:
        return is_control_error(error)

    async def open_run(
        self, *, session_id: str, run_id: str, epoch: int | None = None, fresh: bool = False
    ) -> RestateScope:
        """`fresh` changes nothing here: the invocation's journal answers replays by itself."""
        self.check_session(session_id)
        if not self._started:
            await self.start()
        return RestateScope(self, session_id=session_id, run_id=run_id)

    async def commit(self, transition: RunTransition) -> None:
        """Write `transition` to the object's state (the invocation's journal makes it all-or-replayed).

        A checkpoint with pending approvals carries tokens the signer minted with its own
        clock: it is journaled as an action first, so a replay writes the recorded text. Each
        pending approval opens a Restate awakeable, registered under its approval id.
        """
        self.check_session(transition.session_id)
        checkpoint = transition.checkpoint
        if checkpoint is not None:
            text = stored_text(checkpoint)
            if checkpoint.pending_approvals:
                async def signed() -> bytes:
                    return text.encode()

                text = (await self.ctx.run_typed(f"checkpoint {checkpoint.step_id}", signed, codec_run())).decode()
            self.set_text(CHECKPOINT_PREFIX + checkpoint.run_id, text)
        if transition.last_run is not None:
            self.set_state(LAST_RUN, transition.last_run)
        if transition.mark is not None or transition.unmark:
            self.set_state(MARKED, transition.mark)
        parked: dict[str, str] = {}
        for key, approval_id in transition.awakeables:
            record, future = self.open_awakeable(key)
            self.parked.append((record, future))
            parked[approval_id] = record.id
            if self._approvals is not None:
                self.ctx.generic_send(self._approvals, "register", json.dumps(record.id).encode(), key=approval_id)
        if parked:  # what `status` shows: approval id -> Restate awakeable id
            self.set_state(AWAKEABLES, parked)

    async def resolve_awakeable(self, awakeable_id: str, value: Any) -> bool:
        """Resolve an awakeable through the journal (never from the run that waits on it). Always True:
        the journal keeps no table to tell an unknown id."""
        self.ctx.resolve_awakeable(awakeable_id, value)
        return True

    async def find_awakeable(self, session_id: str, key: str) -> AwakeableRecord | None:
        self.check_session(session_id)
        return self.awakeable_records.get(key)

    # ------------------------------------------------------------ helpers

    def clock(self) -> int:
        """Wall-clock ms as journaled (see `RestateScope.now`)."""
        return self._now or wall_clock_ms()

    def advance_clock(self, at: Any) -> None:
        if isinstance(at, int) and at > self._now:
            self._now = at

    def uuid(self) -> str:
        return str(self.ctx.uuid())

    def check_session(self, session_id: str) -> None:
        if session_id != self.session_id:
            raise ConfigurationError(
                f"this Restate runtime serves session {self.session_id!r} (its object key), not {session_id!r}")

    async def get_state(self, name: str) -> Any:
        """A state value (codec data), None when unset."""
        text = await state_text(self.ctx, name)
        return None if text is None else decoded(text.encode())

    def set_state(self, name: str, value: Any) -> None:
        """Set a state value (codec data); None clears it."""
        self.set_text(name, None if value is None else encoded(value).decode())

    def set_text(self, name: str, text: str | None) -> None:
        if text is None:
            self.ctx.clear(name)
        else:
            self.ctx.set(name, text.encode(), serde=raw_serde())

    async def apply_tool_state(self, ops: Sequence[ToolStateOp]) -> None:
        state = dict(await self.get_state(TOOL_STATE) or {})
        apply_tool_state(state, list(ops))
        self.set_state(TOOL_STATE, state)

    def open_awakeable(self, key: str) -> tuple[AwakeableRecord, restate.RestateDurableFuture[Any]]:
        """The awakeable of `key` in this invocation: a new Restate awakeable the first time it is asked for."""
        record = self.awakeable_records.get(key)
        if record is None:
            awakeable_id, future = self.ctx.awakeable(type_hint=dict)
            record = AwakeableRecord(awakeable_id, self.session_id, key)
            self.awakeable_records[key], self._futures[key] = record, future
        return record, self._futures[key]

    def record_resolved(self, record: AwakeableRecord, value: Any) -> None:
        self.awakeable_records[record.key] = AwakeableRecord(record.id, record.session_id, record.key, True, value)

    async def wait_parked(self) -> int:
        """Wait (suspended, no process holding the run) until every parked awakeable is resolved; how many."""
        parked, self.parked = self.parked, []
        if parked:
            await sdk().gather(*(future for _, future in parked))
            for record, future in parked:
                self.record_resolved(record, await future)
            self.advance_clock(int(await self.ctx.time() * 1000))  # the verdicts came now, not when the run parked
        return len(parked)
