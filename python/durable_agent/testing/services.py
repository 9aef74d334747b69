"""Where the real test servers are: URLs from the environment, with CI-aware failure.

`scripts/services run -- pytest ...` starts Postgres and Redis and exports their URLs. A test
that needs one calls `service_url(...)`: outside CI a missing URL skips the test with the
reason; with `CI=true` it fails, because in CI a missing server is a broken setup.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

POSTGRES_URL_VAR = "DURABLE_AGENT_TEST_POSTGRES_URL"
REDIS_URL_VAR = "DURABLE_AGENT_TEST_REDIS_URL"


def service_url(var: str, what: str) -> str:
    """The URL in env `var`, or skip (fail under CI=true) naming `what` and how to start it."""
    url = os.environ.get(var, "").strip()
    if url:
        return url
    reason = f"{what} tests need {var} (run them under `scripts/services run -- ...`)"
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"{reason}; CI=true, so a missing server is a failure", pytrace=False)
    pytest.skip(reason)


@contextmanager
def postgres_schema(prefix: str = "t") -> Iterator[str]:
    """A conninfo for the test Postgres whose search_path is a fresh schema, dropped afterwards.

    Skips (or fails under CI=true) like `service_url` when no server is configured.
    """
    import psycopg
    from psycopg.conninfo import make_conninfo

    url = service_url(POSTGRES_URL_VAR, "Postgres")
    schema = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield make_conninfo(url, options=f"-c search_path={schema}")
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
