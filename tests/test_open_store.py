"""open_store(url): every scheme opens the right backend; bad URLs and options are typed errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from durable_agent import ConfigurationError, FeatureUnavailableError, InMemoryCheckpointStore
from durable_agent.backends import open_store
from durable_agent.testing import make_checkpoint
from durable_agent.testing.services import POSTGRES_URL_VAR, REDIS_URL_VAR, service_url


def test_memory() -> None:
    store = open_store("memory://")
    assert isinstance(store, InMemoryCheckpointStore)
    with pytest.raises(ConfigurationError):
        open_store("memory://somewhere")


@pytest.fixture
def in_tmp(tmp_path: Path) -> Any:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(cwd)


@pytest.mark.requires_sqlite
def test_sqlite_relative_and_absolute_paths(in_tmp: Path) -> None:
    from durable_agent.backends.sqlite import SqliteCheckpointStore

    with open_store("sqlite:///rel.db?synchronous=NORMAL&busy_timeout_ms=500") as store:
        assert isinstance(store, SqliteCheckpointStore)
        store.save(make_checkpoint("r"))
    assert (in_tmp / "rel.db").exists()
    absolute = in_tmp / "sub" / "abs.db"
    absolute.parent.mkdir()
    with open_store(f"sqlite:///{absolute}") as store:
        store.save(make_checkpoint("r"))
    assert absolute.exists()
    with open_store("SQLITE:///rel.db") as store:
        assert store.load("r") == make_checkpoint("r")


@pytest.mark.requires_sqlite
def test_sqlite_async_opens_the_async_store_with_the_url_options(in_tmp: Path) -> None:
    import asyncio

    from durable_agent.backends.sqlite import AsyncSqliteCheckpointStore, SqliteCheckpointStore

    async def scenario() -> None:
        store = open_store("sqlite+async:///rel.db?busy_timeout_ms=500&cache_runs=3", synchronous="NORMAL")
        assert isinstance(store, AsyncSqliteCheckpointStore)
        assert store._cache._capacity == 3
        async with store:
            await store.save(make_checkpoint("r"))

    asyncio.run(scenario())
    with SqliteCheckpointStore(in_tmp / "rel.db") as sync:  # the same file format
        assert sync.load("r") == make_checkpoint("r")
    with pytest.raises(ConfigurationError, match="bogus"):
        open_store("sqlite+async:///x.db?bogus=1")


def test_jsonl(in_tmp: Path) -> None:
    from durable_agent.backends.jsonl import JsonlCheckpointStore

    with open_store("jsonl:///runs.jsonl?fsync=false") as store:
        assert isinstance(store, JsonlCheckpointStore)
        store.save(make_checkpoint("r"))
    assert (in_tmp / "runs.jsonl").read_bytes().count(b"\n") == 1


@pytest.mark.parametrize(
    "url",
    [
        "ftp://x",
        "no-scheme",
        "sqlite:relative.db",
        "sqlite://",
        "sqlite:///x.db?bogus=1",
        "sqlite:///x.db?busy_timeout_ms=soon",
        "jsonl:///x.jsonl?fsync=maybe",
        "jsonl:///x.jsonl?fsync",
    ],
)
def test_bad_urls_are_configuration_errors(in_tmp: Path, url: str) -> None:
    with pytest.raises(ConfigurationError):
        open_store(url)


def test_bad_options_are_configuration_errors(in_tmp: Path) -> None:
    with pytest.raises(ConfigurationError, match="unexpected keyword"):
        open_store("sqlite:///x.db", colour="blue")
    with pytest.raises(ConfigurationError):
        open_store(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "modules"),
    [("postgresql://x/y", ["psycopg"]), ("redis://x", ["redis"]), ("redis+async://x", ["redis", "redis.asyncio"])],
)
def test_a_missing_driver_is_feature_unavailable(
    monkeypatch: pytest.MonkeyPatch, url: str, modules: list[str]
) -> None:
    for module in modules:  # a submodule imported before stays in sys.modules
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(FeatureUnavailableError, match="pip install"):
        open_store(url)


@pytest.mark.host_only("needs Postgres and Redis servers")
def test_server_urls_open_working_stores() -> None:
    import asyncio

    from durable_agent.backends.postgres import AsyncPostgresCheckpointStore, PostgresCheckpointStore
    from durable_agent.backends.redis import AsyncRedisCheckpointStore, RedisCheckpointStore

    pg, redis_url = service_url(POSTGRES_URL_VAR, "Postgres"), service_url(REDIS_URL_VAR, "Redis")
    with open_store(pg, max_size=1) as store:
        assert isinstance(store, PostgresCheckpointStore)
        assert store.load("open-store-never-saved") is None
    assert isinstance(open_store("postgresql+async" + pg[pg.index("://") :]), AsyncPostgresCheckpointStore)
    with open_store(redis_url, prefix="open-store-test:") as store:
        assert isinstance(store, RedisCheckpointStore)
        assert store.load("never-saved") is None

    async def async_redis() -> None:
        async with open_store("redis+async" + redis_url[redis_url.index("://") :], prefix="open-store-test:") as store:
            assert isinstance(store, AsyncRedisCheckpointStore)
            assert await store.load("never-saved") is None

    asyncio.run(async_redis())


@pytest.mark.host_only("spawns a fresh interpreter")
def test_importing_durable_agent_and_stores_imports_no_backend() -> None:
    code = (
        "import sys, durable_agent, durable_agent.backends, durable_agent.backends.memory;"
        "bad = [m for m in ('sqlite3', 'psycopg', 'redis', 'psycopg_pool', 'durable_agent.backends.sqlite',"
        " 'durable_agent.backends.jsonl', 'durable_agent.testing', 'pytest') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    python_dir = str(Path(__file__).resolve().parent.parent / "python")
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": python_dir},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("sqlite:///x.db?busy_timeout_ms=²", {}),  # "²".isdigit(), yet int("²") raises ValueError
        ("sqlite:///x.db?cache_runs=٣", {}),  # an Arabic-Indic digit
        ("sqlite:///nul\x00.db", {}),
        ("jsonl:///nul\x00.jsonl", {}),
        ("sqlite:///x.db", {"cache_runs": -1}),  # wrote, then raised KeyError
        ("sqlite:///x.db", {"cache_runs": "5"}),
        ("jsonl:///x.jsonl", {"cache_runs": 2.5}),
        ("jsonl:///x.jsonl", {"fsync": "false"}),  # bool("false") kept fsync on
        ("jsonl:///x.jsonl", {"fsync": 0}),
    ],
)
def test_bad_file_store_options_are_configuration_errors(in_tmp: Path, url: str, options: dict[str, Any]) -> None:
    if url.startswith("sqlite"):
        pytest.importorskip("sqlite3")
    with pytest.raises(ConfigurationError):
        open_store(url, **options)
    assert sorted(p.name for p in in_tmp.iterdir()) == []  # nothing was created either


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("redis://:notaport", {}),
        ("redis://localhost:99999/0", {}),
        ("redis://localhost/0", {"cache_runs": -1}),
        ("redis://localhost/0", {"cache_runs": "5"}),
        ("redis+async://:notaport", {}),
        ("rediss+async://localhost/0", {"cache_runs": -1}),
        ("redis+async://localhost/0", {"colour": "blue"}),
        ("postgresql://h/db", {"max_size": 0}),
        ("postgresql://h/db", {"min_size": 3, "max_size": 2}),
        ("postgresql://h/db", {"min_size": -1}),
        ("postgresql://h/db", {"max_size": "4"}),
        ("postgresql://h:99999/db", {}),
        ("postgresql://h:port/db", {}),
        ("postgresql+async://h/db", {"max_size": 0}),
        ("postgresql://h/db", {"cache_runs": -1}),
        ("postgresql+async://h/db", {"cache_runs": "5"}),
    ],
)
def test_bad_server_store_options_are_configuration_errors(url: str, options: dict[str, Any]) -> None:
    """Refused when the store is built, before any connection is tried (the hosts do not exist)."""
    pytest.importorskip("redis" if url.startswith("redis") else "psycopg_pool")
    with pytest.raises(ConfigurationError):
        open_store(url, **options)
