"""The backends, one room each, and what you need to write your own.

Each room offers its checkpoint store and, where the backend can hold a journal, its runtime;
a driver is imported when a store or runtime is built, never by ``import``:

* `durable_agent.backends.memory` — `InMemoryCheckpointStore`, `MemoryRuntime` (also in `durable_agent`)
* `durable_agent.backends.sqlite` — `SqliteCheckpointStore`, `AsyncSqliteCheckpointStore`, `SqliteRuntime`
* `durable_agent.backends.postgres` — `PostgresCheckpointStore`, `AsyncPostgresCheckpointStore`,
  `PostgresRuntime` (psycopg 3)
* `durable_agent.backends.jsonl` — `JsonlCheckpointStore` (one append-only file)
* `durable_agent.backends.redis` — `RedisCheckpointStore`, `AsyncRedisCheckpointStore` (redis-py)
* `durable_agent.backends.durable_object` — `DurableObjectCheckpointStore`, `AsyncDurableObjectCheckpointStore`
  (a Cloudflare Durable Object; the async one encrypts through WebCrypto)
* `durable_agent.backends.restate` — `RestateRuntime`, `RestateScope` (served by `durable_agent.restate`)

The two SQL backends share their statements (`_sql`: tables, plans and the SQL runtime, without
I/O). Every room stands on the storage core (`durable_agent._storage`) and on nothing above it:
docs/layers.md states the rule, tests/test_layers.py checks it.

A backend of your own implements the Protocols below (`CheckpointStore` for checkpoints,
`DurableRuntime` for the journal, whose `commit` takes a `RunTransition` carrying `DeferredSteps`)
and passes the conformance suites in `durable_agent.testing`. It stores what `encode` gives (the
codec of docs/codec.md: JSON-compatible data and bytes as text, losslessly) and reads it with `decode`.
"""

from __future__ import annotations

from typing import Any

from .._kernels import kernels
from .._storage.keys import MODEL_CALL, StepKeyParts, nested_call, parse_step_key, step_key
from .._storage.leases import RUN_OWNER_HOLD_MS, is_run_owner_dead, is_run_owner_holding
from .._storage.protocols import (
    CheckpointStore,
    DurableInspector,
    DurableLease,
    DurableRunBook,
    DurableRuntime,
    DurableStores,
    DurableSubmissionStore,
    EndpointRuntime,
    EndpointStores,
    RunScope,
)
from .._storage.records import (
    AwakeableRecord,
    DeferredSteps,
    LeaseClaim,
    ResumableRun,
    RunOwner,
    RunTransition,
    StepCompleted,
    StepErrorRecord,
    StepInterrupted,
    StepRecord,
    StepRequest,
    StreamPartialRecord,
)
from .._storage.scope import AwakeableOutcome, DurableAwakeable, JournalScope, StepContext, StepLive, StepRun
from ._open import SCHEMES, open_store

__all__ = [
    "MODEL_CALL",
    "RUN_OWNER_HOLD_MS",
    "SCHEMES",
    "AwakeableOutcome",
    "AwakeableRecord",
    "CheckpointStore",
    "DeferredSteps",
    "DurableAwakeable",
    "DurableInspector",
    "DurableLease",
    "DurableRunBook",
    "DurableRuntime",
    "DurableStores",
    "DurableSubmissionStore",
    "EndpointRuntime",
    "EndpointStores",
    "JournalScope",
    "LeaseClaim",
    "ResumableRun",
    "RunOwner",
    "RunScope",
    "RunTransition",
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
    "decode",
    "encode",
    "is_run_owner_dead",
    "is_run_owner_holding",
    "nested_call",
    "open_store",
    "parse_step_key",
    "step_key",
]


def encode(value: Any) -> str:
    """`value` (JSON-compatible data, bytes anywhere in it) as codec text: compact JSON, bytes as ``{"$bytes": ...}``.

    The codec every backend stores (docs/codec.md), run by the active kernels (`durable_agent.NATIVE`).
    Raises `CodecError` for a value it cannot write (a set, a non-`str` key, NaN, an object).
    """
    return kernels.encode(value)


def decode(text: str) -> Any:
    """The value `encode` wrote as `text` (tuples come back as lists); `CodecError` for text it cannot read."""
    return kernels.decode(text)
