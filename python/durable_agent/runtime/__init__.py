"""The step-journal runtime: step records, leases with epoch fencing, awakeables, stream partials.

With a runtime, a resumed run replays the step in flight from its records instead of
running it again: a finished model call is not requested again, a finished tool does not
run again, and an ``unsafe`` tool that started and never finished is reported as
interrupted. See `JournalScope` for the exact rules, and `leases` for the lease rules.

Runtimes with a driver live in their own modules, imported on demand:
`durable_agent.runtime.sqlite` (standard-library sqlite3) and `durable_agent.runtime.postgres`
(psycopg 3).
"""

from __future__ import annotations

from .keys import MODEL_CALL, StepKeyParts, nested_call, parse_step_key, step_key
from .leases import RUN_OWNER_HOLD_MS, is_run_owner_dead, is_run_owner_holding
from .memory import MemoryDurableState, MemoryRuntime
from .records import (
    AwakeableRecord,
    LeaseClaim,
    ResumableRun,
    RunOwner,
    StepCompleted,
    StepErrorRecord,
    StepInterrupted,
    StepRecord,
    StepRequest,
    StreamPartialRecord,
)
from .scope import AwakeableOutcome, DurableAwakeable, JournalScope, StepContext, StepLive, StepRun

__all__ = [
    "MODEL_CALL",
    "RUN_OWNER_HOLD_MS",
    "AwakeableOutcome",
    "AwakeableRecord",
    "DurableAwakeable",
    "JournalScope",
    "LeaseClaim",
    "MemoryDurableState",
    "MemoryRuntime",
    "ResumableRun",
    "RunOwner",
    "StepCompleted",
    "StepContext",
    "StepErrorRecord",
    "StepInterrupted",
    "StepKeyParts",
    "StepLive",
    "StepRecord",
    "StepRequest",
    "StepRun",
    "StreamPartialRecord",
    "is_run_owner_dead",
    "is_run_owner_holding",
    "nested_call",
    "parse_step_key",
    "step_key",
]
