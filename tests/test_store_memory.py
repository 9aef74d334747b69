"""The in-memory reference store passes the conformance suite."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from durable_agent import InMemorySessionStore
from durable_agent.testing import SessionStoreConformance


class TestInMemoryStore(SessionStoreConformance):
    checks_encoding = False

    @pytest.fixture
    def make_store(self) -> Callable[[], InMemorySessionStore]:
        store = InMemorySessionStore()
        return lambda: store
