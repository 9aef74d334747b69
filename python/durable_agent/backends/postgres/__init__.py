"""The Postgres backend (psycopg 3, ``pip install 'durable-agent[postgres]'``): checkpoint stores and a runtime.

`PostgresCheckpointStore` / `AsyncPostgresCheckpointStore` keep checkpoints; `PostgresRuntime`
adds the step journal, leases, awakeables and the endpoint's submissions. The driver is imported
when a store or runtime is built (`FeatureUnavailableError` without it), not by this import.
"""

from __future__ import annotations

from ._runtime import PostgresRuntime
from ._store import AsyncPostgresCheckpointStore, PostgresCheckpointStore

__all__ = ["AsyncPostgresCheckpointStore", "PostgresCheckpointStore", "PostgresRuntime"]
