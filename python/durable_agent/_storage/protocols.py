"""The storage seams as Protocols: `CheckpointStore` (checkpoint spec) and the durable runtime (journal spec).

`CheckpointStore` is what a call with ``store=`` needs: save and load by run id.

`DurableRuntime` is what `Agent` uses, and nothing more; `EndpointRuntime` adds what the HTTP endpoint
(`durable_agent.http`) uses on top: the submissions behind its idempotent POST. The memory,
SQLite and Postgres runtimes implement both; a runtime of your own does too when it passes
`durable_agent.testing.runtime_conformance.DurableRuntimeConformance`. Every method is
async: a runtime may sit on a network database.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from .._checkpoint import AgentCheckpoint
from .._errors import StaleEpochError
from .records import (
    AwakeableRecord,
    DeferredSteps,
    LeaseClaim,
    ResumableRun,
    RunOwner,
    RunTransition,
    StepOutcome,
    StepRecord,
    StepRequest,
    StreamPartialRecord,
)
from .scope import DurableAwakeable, StepLive, StepRun


@runtime_checkable
class CheckpointStore(Protocol):
    """Where checkpoints live. Each method may return its value directly or an awaitable of it.

    `save` is called with the latest snapshot at every step boundary; the reference
    semantics are "latest save wins" per run id. `load` returns None for an unknown run.
    Stores may also offer `delete(run_id)` and `list()`; the loop never calls them.
    """

    def save(self, checkpoint: AgentCheckpoint) -> None | Awaitable[None]: ...

    def load(self, run_id: str) -> AgentCheckpoint | None | Awaitable[AgentCheckpoint | None]: ...


@runtime_checkable
class RunScope(Protocol):
    """One run's view of the runtime: its steps, clock, awakeables. Opened per run, closed when it ends."""

    session_id: str
    run_id: str

    async def step(
        self, request: StepRequest, run: StepRun | None = None, live: StepLive | None = None
    ) -> StepOutcome: ...

    async def begin(self, requests: Sequence[StepRequest]) -> None:
        """Make a batch's unsafe intents (and any deferred records) durable before any step of it runs."""
        ...

    async def commit_deferred(self, write: Callable[[DeferredSteps], Awaitable[None]]) -> None:
        """Await `write` (a commit outside the scope) carrying the records deferred to the next write: they are
        durable once it returns; if it fails, the scope's next write carries them."""
        ...

    async def awakeable(
        self, key: str, *, timeout_ms: int | None = None, awakeable_id: str | None = None
    ) -> DurableAwakeable: ...

    async def stored_steps(self) -> list[StepRecord]: ...

    async def stored_partials(self) -> list[StreamPartialRecord]: ...

    def now(self) -> int: ...

    def uuid(self) -> str: ...

    async def sleep(self, ms: int, signal: Any = None) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class DurableLease(Protocol):
    """Who runs each session's run, fenced by an epoch (see `durable_agent._storage.leases` for the rules)."""

    async def claim(self, session_id: str, *, stale_at: int, owner: RunOwner | None = None,
                    on_stale: Callable[[StaleEpochError], None] | None = None) -> LeaseClaim: ...

    async def renew(self, session_id: str, epoch: int) -> bool: ...

    async def release(self, session_id: str, epoch: int) -> None: ...

    async def resumable_run(self, session_id: str) -> str | None: ...

    async def resumable(self, *, stale_at: int, session_id: str | None = None) -> list[ResumableRun]: ...


@runtime_checkable
class DurableSubmissionStore(Protocol):
    """Request ids of sends: a retried send with the same id and input gets the first send's outcome."""

    async def claim(self, session_id: str, request_id: str, fingerprint: str) -> tuple[bool, Any]: ...

    async def complete(self, session_id: str, request_id: str, result: Any) -> None: ...


@runtime_checkable
class DurableRunBook(Protocol):
    """Which run of a session is the latest; its checkpoint holds the session's history."""

    async def last(self, session_id: str) -> str | None: ...


@runtime_checkable
class DurableStores(Protocol):
    """What an `Agent` reads besides the journal, behind one runtime so it commits consistently.

    The runtime writes these itself, inside `DurableRuntime.commit`'s transitions.
    """

    @property
    def checkpoints(self) -> CheckpointStore: ...

    @property
    def runs(self) -> DurableRunBook: ...

    def tool_state(self, session_id: str) -> Any: ...


@runtime_checkable
class EndpointStores(DurableStores, Protocol):
    """`DurableStores` plus the submissions the HTTP endpoint's idempotent POST claims and completes."""

    @property
    def submissions(self) -> DurableSubmissionStore: ...


@runtime_checkable
class DurableInspector(Protocol):
    """Read access to what a runtime stored, for tests and diagnostics."""

    async def steps(self, run_id: str | None = None) -> list[StepRecord]: ...

    async def partials(self, run_id: str | None = None) -> list[StreamPartialRecord]: ...


@runtime_checkable
class DurableRuntime(Protocol):
    """What the agent loop needs from a durable runtime (checkpoint mode)."""

    owner: RunOwner

    @property
    def mode(self) -> Literal["checkpoint", "replay"]: ...

    @property
    def lease(self) -> DurableLease: ...

    @property
    def stores(self) -> DurableStores: ...

    @property
    def inspect(self) -> DurableInspector: ...

    def is_control_error(self, error: BaseException) -> bool: ...

    async def open_run(
        self, *, session_id: str, run_id: str, epoch: int | None = None, fresh: bool = False
    ) -> RunScope:
        """The scope of one leg of `run_id`. `fresh`: the run was started by this leg, under `epoch`, so
        it has no record a step could replay (a checkpoint-mode scope skips reading them)."""
        ...

    async def commit(self, transition: RunTransition) -> None:
        """Apply `transition` in one transaction, fenced by its epoch (`StaleEpochError` when stale)."""
        ...

    async def resolve_awakeable(self, awakeable_id: str, value: Any) -> bool: ...

    async def find_awakeable(self, session_id: str, key: str) -> AwakeableRecord | None: ...


@runtime_checkable
class EndpointRuntime(DurableRuntime, Protocol):
    """What the HTTP endpoint (`durable_agent.http`) needs: a `DurableRuntime` whose stores hold submissions."""

    @property
    def stores(self) -> EndpointStores: ...


__all__: Sequence[str] = [
    "DurableInspector",
    "DurableLease",
    "DurableRunBook",
    "DurableRuntime",
    "DurableStores",
    "DurableSubmissionStore",
    "EndpointRuntime",
    "EndpointStores",
    "RunScope",
]
