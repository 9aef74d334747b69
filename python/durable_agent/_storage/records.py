"""What a durable runtime stores: step records, awakeables, stream partials, leases (dataclasses of plain data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from collections.abc import Collection

    from .._checkpoint import AgentCheckpoint

StepStatus = Literal["pending", "done", "failed"]
StepReplayPolicy = Literal["safe", "unsafe"]
StepKind = str  # "model", "tool", "gate", "decision", ... an adapter may add its own
ToolStateOp = dict[str, Any]  # {"op": "set", "key": str, "value": Any} or {"op": "delete", "key": str}


@dataclass(frozen=True, slots=True)
class StepErrorRecord:
    """A step's error as stored; a replayed failure is rebuilt from it (`StepFailedError`)."""

    name: str
    message: str
    code: str | None = None
    status: int | None = None
    retryable: bool | None = None
    data: Any = None
    decision: Any = None  # the loop's verdict on this failure, so a resumed run need not judge it again


@dataclass(frozen=True, slots=True)
class StepRequest:
    """A step to run: its key, handler kind, replay policy and a JSON description (not the work itself)."""

    key: str
    kind: StepKind
    replay: StepReplayPolicy
    payload: Any = None
    fingerprint: str | None = None


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One stored step, keyed by (session_id, key)."""

    session_id: str
    run_id: str
    key: str
    kind: StepKind
    replay: StepReplayPolicy
    status: StepStatus
    fingerprint: str | None = None
    result: Any = None
    error: StepErrorRecord | None = None
    tool_state: tuple[ToolStateOp, ...] | None = None


@dataclass(frozen=True, slots=True)
class AwakeableRecord:
    """A durable wait; `id` is what a resumer resolves it with, (session_id, key) finds it again."""

    id: str
    session_id: str
    key: str
    resolved: bool = False
    value: Any = None
    deadline: int | None = None  # absolute epoch ms


@dataclass(frozen=True, slots=True)
class StreamPartialRecord:
    """A slice of model output streamed by an unfinished step (text since the previous slice)."""

    session_id: str
    run_id: str
    step_key: str
    seq: int
    text: str
    thinking: str | None = None


@dataclass(frozen=True, slots=True)
class RunOwner:
    """The process holding a lease: its host, pid and a token unique to that process's runtime."""

    host: str
    pid: int
    token: str


@dataclass(frozen=True, slots=True)
class LeaseClaim:
    """Answer of a lease claim: the new epoch, or who still holds the lease.

    `resumable_run`: the session's run marked in progress as the claim took the lease (a claimed lease
    only). It stays so while the lease is held: only the holder's fenced writes change the mark.
    """

    claimed: bool
    epoch: int | None = None
    owner: RunOwner | None = None
    resumable_run: str | None = None


@dataclass(frozen=True, slots=True)
class ResumableRun:
    """A top-level run whose process stopped renewing its lease while it was still in progress."""

    session_id: str
    run_id: str
    epoch: int


@dataclass(slots=True)
class LeaseRow:
    """A session's lease as stored."""

    epoch: int = 0
    owner: RunOwner | None = None
    renewed_at: int = 0
    released: bool = True
    resumable_run: str | None = None  # the run marked in progress (`DurableLease.mark_resumable`)


@dataclass(frozen=True, slots=True)
class DeferredSteps:
    """The step records a run's scope deferred to its next write, handed to a commit outside it
    (`JournalScope.commit_deferred`); `streamed`: the keys among them whose step may have stream
    partials stored (the others have none, so a finished one deletes none); None: any may."""

    records: tuple[StepRecord, ...] = ()
    streamed: Collection[str] | None = None


NO_DEFERRED = DeferredSteps(streamed=frozenset())


@dataclass(frozen=True, slots=True)
class RunTransition:
    """One step of a session's run lifecycle, committed by `DurableRuntime.commit` as ONE fenced transaction.

    Every part present commits together, with the session's lease `epoch` checked inside the
    same transaction, or nothing does (`StaleEpochError` when the epoch moved on):

    * `checkpoint`: saved as the checkpoint store saves it (append-only);
    * `last_run`: becomes the session's latest run (its checkpoint holds the session's history);
    * `mark`: the run marked in progress (what `resume()` continues); `unmark` clears the mark;
    * `awakeables`: ``(key, awakeable_id)`` pairs opened for the run to park on (no deadline);
    * `deferred`: step records the run's scope deferred to this write (`JournalScope.commit_deferred`).
    """

    session_id: str
    epoch: int
    checkpoint: AgentCheckpoint | None = None
    last_run: str | None = None
    mark: str | None = None
    unmark: bool = False
    awakeables: tuple[tuple[str, str], ...] = ()
    deferred: DeferredSteps = NO_DEFERRED

    def __post_init__(self) -> None:
        if self.mark is not None and self.unmark:
            raise ValueError("a transition either marks a run or unmarks it, not both")


@dataclass(frozen=True, slots=True)
class StepCompleted:
    """A step that has a value: it ran now (`replayed=False`), or its done record answered."""

    status: ClassVar[Literal["completed"]] = "completed"  # a class attribute: not a field each outcome writes
    value: Any
    replayed: bool
    tool_state: tuple[ToolStateOp, ...] = ()


@dataclass(frozen=True, slots=True)
class StepInterrupted:
    """An unsafe step that started before a restart and never finished, or a fingerprint mismatch."""

    status: ClassVar[Literal["interrupted"]] = "interrupted"


StepOutcome = StepCompleted | StepInterrupted


def apply_tool_state(target: dict[str, Any], ops: tuple[ToolStateOp, ...] | list[ToolStateOp]) -> None:
    """Apply tool-state ops in order: ``{"op": "set", "key", "value"}`` or ``{"op": "delete", "key"}``."""
    for op in ops:
        if op.get("op") == "set":
            target[op["key"]] = op.get("value")
        elif op.get("op") == "delete":
            target.pop(op["key"], None)
        else:
            raise ValueError(f"unknown tool-state op {op!r}")
