"""`open_store(url)`: a checkpoint store from a URL, its backend imported only when asked for.

``+async`` in the scheme picks the async flavour (coroutine methods that never block the event loop).
"""

from __future__ import annotations

import inspect
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .._errors import ConfigurationError

SCHEMES = (
    "memory",
    "memory+async",
    "sqlite",
    "sqlite+async",
    "jsonl",
    "postgresql",
    "postgres",
    "postgresql+async",
    "redis",
    "rediss",
    "redis+async",
    "rediss+async",
)

_BOOL = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def _file_path(url: str, scheme: str) -> str:
    """The path of a file URL, SQLAlchemy style: three slashes relative, four absolute."""
    rest = url[len(scheme) + 1 :].split("?", 1)[0]
    if not rest.startswith("//"):
        raise ConfigurationError(
            f"{scheme} URL must look like {scheme}:///relative/path or {scheme}:////abs/path"
        )
    path = rest[2:]
    if path.startswith("/"):
        path = path[1:]
    if not path:
        raise ConfigurationError(f"{scheme} URL names no file: {url!r}")
    return path


def _file_options(query: str, allowed: dict[str, type]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ConfigurationError(f"malformed store URL query {query!r}: {exc}") from None
    for key, value in pairs:
        kind = allowed.get(key)
        if kind is None:
            raise ConfigurationError(f"unknown store option {key!r}; known: {sorted(allowed)}")
        if kind is bool:
            if value.lower() not in _BOOL:
                raise ConfigurationError(f"option {key!r} must be true or false, got {value!r}")
            options[key] = _BOOL[value.lower()]
        elif kind is int:
            if not (value.isascii() and value.isdigit()):  # "²".isdigit() is True, int("²") fails
                raise ConfigurationError(f"option {key!r} must be a non-negative int, got {value!r}")
            options[key] = int(value)
        else:
            options[key] = value
    return options


def _construct(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """`cls(*args, **kwargs)`, with an unknown or missing option reported as `ConfigurationError`."""
    try:
        inspect.signature(cls).bind(*args, **kwargs)
    except TypeError as exc:
        raise ConfigurationError(f"{cls.__name__}: {exc}") from None
    return cls(*args, **kwargs)


def open_store(url: str, **options: Any) -> Any:
    """A checkpoint store for `url`; keyword `options` go to the store's constructor.

    * ``memory://`` — `InMemoryCheckpointStore` (this process only); ``memory+async://`` —
      `AsyncInMemoryCheckpointStore`
    * ``sqlite:///runs.db`` (relative) or ``sqlite:////var/lib/app/runs.db`` (absolute);
      options in the query: ``?synchronous=NORMAL&busy_timeout_ms=5000``; ``sqlite+async:///...`` —
      `AsyncSqliteCheckpointStore` (its own connection thread, concurrent saves in one commit)
    * ``jsonl:///runs.jsonl`` / ``jsonl:////abs/runs.jsonl``; ``?fsync=false``
    * ``postgresql://user@host:5432/db`` — `PostgresCheckpointStore` (the URL is libpq's);
      ``postgresql+async://...`` — `AsyncPostgresCheckpointStore`
    * ``redis://host:6379/0`` or ``rediss://...`` — `RedisCheckpointStore` (the URL is redis-py's);
      ``redis+async://...`` / ``rediss+async://...`` — `AsyncRedisCheckpointStore` (`redis.asyncio`)

    Raises `ConfigurationError` for an unknown scheme or option, and `FeatureUnavailableError`
    when the backend's driver is not installed.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"a store URL looks like scheme://..., got {url!r}; schemes: {', '.join(SCHEMES)}"
        )
    scheme = url.split("://", 1)[0].lower()
    query = urlsplit(url).query if scheme in ("sqlite", "sqlite+async", "jsonl") else ""
    if scheme in ("memory", "memory+async"):
        if url.lower() != f"{scheme}://" or options:
            raise ConfigurationError(f"{scheme}:// takes no path or options, got {url!r}")
        from .memory._store import AsyncInMemoryCheckpointStore, InMemoryCheckpointStore

        return InMemoryCheckpointStore() if scheme == "memory" else AsyncInMemoryCheckpointStore()
    if scheme in ("sqlite", "sqlite+async"):
        from .sqlite._store import AsyncSqliteCheckpointStore, SqliteCheckpointStore

        opts = _file_options(query, {"synchronous": str, "busy_timeout_ms": int, "cache_runs": int})
        cls = SqliteCheckpointStore if scheme == "sqlite" else AsyncSqliteCheckpointStore
        return _construct(cls, _file_path(url, scheme), **{**opts, **options})
    if scheme == "jsonl":
        from .jsonl import JsonlCheckpointStore

        opts = _file_options(query, {"fsync": bool, "cache_runs": int})
        return _construct(JsonlCheckpointStore, _file_path(url, scheme), **{**opts, **options})
    if scheme in ("postgresql", "postgres"):
        from .postgres._store import PostgresCheckpointStore

        return _construct(PostgresCheckpointStore, url, **options)
    if scheme == "postgresql+async":
        from .postgres._store import AsyncPostgresCheckpointStore

        return _construct(AsyncPostgresCheckpointStore, "postgresql" + url[len(scheme) :], **options)
    if scheme in ("redis", "rediss"):
        from .redis import RedisCheckpointStore

        return _construct(RedisCheckpointStore, url, **options)
    if scheme in ("redis+async", "rediss+async"):
        from .redis import AsyncRedisCheckpointStore

        return _construct(AsyncRedisCheckpointStore, scheme.split("+", 1)[0] + url[len(scheme) :], **options)
    raise ConfigurationError(f"unknown store URL scheme {scheme!r}; schemes: {', '.join(SCHEMES)}")


__all__ = ["SCHEMES", "open_store"]
