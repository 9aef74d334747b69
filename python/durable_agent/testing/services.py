"""Where the real test servers are: URLs from the environment, with CI-aware failure.

`scripts/services run -- pytest ...` starts Postgres and Redis and exports their URLs. A test
that needs one calls `service_url(...)`: outside CI a missing URL skips the test with the
reason; with `CI=true` it fails, because in CI a missing server is a broken setup.
"""

from __future__ import annotations

import os

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
