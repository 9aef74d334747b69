"""Opening what the CLI works on: the store and runtime named by URLs, and the user's agent factory."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigurationError
from .._util import maybe_await
from ..backends._open import _file_path, open_store
from ..encryption import Keyring
from ..encryption._keyring import ENV_KEYS


class CliError(Exception):
    """A failure the CLI reports in one line, with its exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def env_keyring() -> Keyring | None:
    """The keyring of ``DURABLE_AGENT_KEYS`` (`Keyring.from_env`) when it is set: the CLI opens every store, runtime
    and event log with it, so it reads and writes an encrypted database as its servers do; else None (plaintext)."""
    return Keyring.from_env() if os.environ.get(ENV_KEYS, "").strip() else None


def open_runtime(url: str, keyring: Keyring | None = None) -> Any:
    """The journal runtime of `url`: ``sqlite:///relative.db``, ``sqlite:////abs.db`` or ``postgresql://...``."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        from ..backends.sqlite._runtime import SqliteRuntime

        return SqliteRuntime(_file_path(url, scheme), encryption=keyring)
    if scheme in ("postgresql", "postgres"):
        from ..backends.postgres._runtime import PostgresRuntime

        return PostgresRuntime(url, encryption=keyring)
    raise ConfigurationError(f"a runtime URL is sqlite:///path or postgresql://..., got {url!r}")


def open_event_log(url: str, keyring: Keyring | None = None) -> Any:
    """The chat endpoint's event log at `url` (``sqlite:///path`` or ``postgresql://...``); None for another scheme.

    Opening it creates its tables when they are missing (empty, in a database the endpoint never used).
    """
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        from ..http._sql_logs import SqliteEventLog

        return SqliteEventLog(_file_path(url, scheme), encryption=keyring)
    if scheme in ("postgresql", "postgres"):
        from ..http._sql_logs import PostgresEventLog

        return PostgresEventLog(url, encryption=keyring)
    return None


def require_file(url: str) -> None:
    """`CliError` (not found) when `url` is a file URL (SQLite, JSONL) naming no file: opening it would create an
    empty database, and a mistyped path would pass for a store without runs. `os.path.exists` only stats the path:
    nothing opens the file (see `durable_agent.backends._files`)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in ("sqlite", "sqlite+async", "jsonl"):
        return
    path = _file_path(url, scheme)
    if not os.path.exists(path):
        where = "" if os.path.isabs(path) else (f" ({os.path.abspath(path)}: {scheme}:///path is relative to the"
                                                f" current directory, {scheme}:////path absolute)")
        raise CliError(3, f"no database file {path!r}{where}")


PROBE_TIMEOUT_S = 5  # how long the CLI waits for a Postgres or Redis server to answer, before any pool is built


def _probe(url: str) -> None:
    """Connect once to the Postgres or Redis server of `url` and close: `CliError` (unreachable) when it does not
    answer within `PROBE_TIMEOUT_S`, before a store's pool retries for 30 s, logging each attempt. Nothing for a
    URL of another scheme, or without the driver (opening the store says it is missing)."""
    scheme, _, rest = url.partition("://")
    base = scheme.lower().removesuffix("+async")
    try:
        if base in ("postgresql", "postgres"):
            import psycopg

            options: dict[str, Any] = {} if "connect_timeout" in rest else {"connect_timeout": PROBE_TIMEOUT_S}
            psycopg.connect(f"{base}://{rest}", **options).close()
        elif base in ("redis", "rediss"):
            import redis

            client = redis.Redis.from_url(f"{base}://{rest}", socket_connect_timeout=PROBE_TIMEOUT_S,
                                          socket_timeout=PROBE_TIMEOUT_S)
            try:
                client.ping()
            finally:
                client.close()
    except ImportError:
        return
    except Exception as exc:  # noqa: BLE001 - a bad URL is left for opening the store to report
        if not is_outage(exc):
            return
        raise CliError(7, f"cannot reach the {'Redis' if base.startswith('redis') else 'Postgres'} server:"
                       f" {' '.join(str(exc).split())}") from None


def is_outage(error: BaseException) -> bool:
    """True for a driver's failure to reach its server or keep its connection (Postgres, Redis): try again later.
    The drivers are looked up only when already imported: the CLI imports none for a SQLite store."""
    kinds: list[type[BaseException]] = []
    if (psycopg := sys.modules.get("psycopg")) is not None:
        kinds.append(psycopg.OperationalError)
    if (psycopg_pool := sys.modules.get("psycopg_pool")) is not None:
        kinds.append(psycopg_pool.PoolTimeout)
    if (redis_errors := sys.modules.get("redis.exceptions")) is not None:
        kinds += [redis_errors.ConnectionError, redis_errors.TimeoutError]
    return isinstance(error, tuple(kinds))


@dataclass
class Backends:
    """The store (and runtime) of one CLI call, opened with the `keyring` of ``DURABLE_AGENT_KEYS`` when set."""

    store: Any
    runtime: Any = None
    keyring: Keyring | None = None

    @classmethod
    async def open(cls, store_url: str | None, runtime_url: str | None, *, create: bool = False) -> Backends:
        """Without `store_url`, the store is opened on the runtime's database: the runtime keeps its
        checkpoints in the checkpoint store's tables (same URL), which also list, prune and fork.
        A database file is created only when `create` (``import``): see `require_file`."""
        url = store_url or runtime_url
        if not url:
            raise CliError(2, "no store: pass --store URL (or --runtime URL), or set DURABLE_AGENT_STORE")
        for named in dict.fromkeys(u for u in (store_url, runtime_url) if u):
            if not create:
                require_file(named)
            await asyncio.to_thread(_probe, named)
        keyring = env_keyring()
        runtime = open_runtime(runtime_url, keyring) if runtime_url else None
        try:
            store = open_store(url, **({} if keyring is None else {"encryption": keyring}))
        except BaseException:
            if runtime is not None:
                await maybe_await(runtime.close())
            raise
        return cls(store, runtime, keyring)

    def refuse_own_file(self, path: str, option: str) -> None:
        """Refuse `path` (an export's output, an import's input) when it is the store's or the runtime's own file.

        Writing it would destroy the database; even reading it here, in the process that holds SQLite
        connections to it, would drop their locks (see `durable_agent.backends._files`).
        """
        for backend in (self.store, self.runtime):
            own = getattr(backend, "path", None)
            try:
                same = isinstance(own, (str, os.PathLike)) and os.path.samefile(path, own)  # stat only: nothing opened
            except OSError:  # either file missing: not the same
                same = False
            if same:
                raise CliError(2, f"{option} {path!r} is the database the CLI works on: name another file")

    async def close(self) -> None:
        if self.runtime is not None:
            await maybe_await(self.runtime.close())
        close = getattr(self.store, "close", None)
        if close is not None:
            await maybe_await(close())


async def load_factory(spec: str) -> Any:
    """What ``module:factory`` returns (or its awaitable resolves to) when called with no arguments:
    an `Agent`, or a mapping of `resume_from_checkpoint` keyword arguments (``model``, ``tools``,
    and any other call option). The module is looked for in the current directory first, as uvicorn
    looks for its app (``python -m`` puts it on the path; the installed script does not)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CliError(2, f"--agent takes module:factory, got {spec!r}")
    here = os.getcwd()
    if here not in sys.path:  # the console script puts its own directory there, not the current one
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(2, f"cannot import {module_name!r} for --agent (looked in the current directory {here}"
                       f" and on PYTHONPATH): {exc}") from None
    target: Any = module
    for name in attr.split("."):
        if not hasattr(target, name):
            raise CliError(2, f"{module_name!r} has no {attr!r} for --agent")
        target = getattr(target, name)
    if not callable(target):
        raise CliError(2, f"--agent {spec} is not callable")
    made = await maybe_await(target())
    from .._agent import Agent

    if not isinstance(made, (Agent, Mapping)):
        raise CliError(2, f"--agent {spec} returned {type(made).__name__}: expected an Agent or a dict of options")
    return made
