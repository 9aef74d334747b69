"""`SqliteSessionStore`: an append-only checkpoint store in one SQLite file (standard library).

Layout and save algorithm: `durable_agent.stores._history` and `_sql`. Per save, one
`BEGIN IMMEDIATE` transaction writes the messages added since the last save of that run
plus its header row, so the cost of a save does not grow with the history.

The file is opened in WAL mode with a busy timeout, so several processes (and threads) may
use one file: writers queue on SQLite's write lock, readers never block. `synchronous`
defaults to FULL: a save that returned survives a power loss; NORMAL is faster and survives
a crash of the process but may lose the last saves on a power loss.

The file is created 0600 when missing (it holds conversations and approval tokens); SQLite
gives its -wal and -shm files the same mode. Damage: text that is not UTF-8, rows out of
place or a damaged page of the file raise `CheckpointCorruptError` naming the run on load; a
failed save makes the store forget its view of the run, and the next save re-reads the rows
and replaces what it cannot trust (`_sql.save_plan`).

`sqlite3` is imported when a store is opened; where it is missing (Pyodide 0.28 without its
CDN package) opening raises `FeatureUnavailableError`.
"""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Literal

from ..checkpoint import AgentCheckpoint, RunStatus
from ..errors import CheckpointCorruptError, ConfigurationError, FeatureUnavailableError
from . import _sql
from ._files import create_private, file_path
from ._history import PrefixCache
from ._validate import (
    check_checkpoint,
    check_expected,
    check_list_args,
    check_prune_args,
    check_run_id,
    check_step_index,
)

_DIALECT = _sql.Dialect(placeholder="?", text_type="TEXT", lock_run=None, lock_schema=None)
_CORRUPT = ("SQLITE_CORRUPT", "SQLITE_NOTADB")


def _text(data: bytes) -> str | bytes:
    """A TEXT value as str, or its raw bytes when they are not UTF-8 (a damaged row): bytes
    reach the plans, which report the run as corrupt on load and rewrite the row on save."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def _sqlite3() -> ModuleType:
    try:
        import sqlite3
    except ImportError as exc:
        raise FeatureUnavailableError(
            "SqliteSessionStore needs the sqlite3 module, which this Python lacks "
            "(on Pyodide 0.28 it is a separate package): " + str(exc)
        ) from exc
    return sqlite3


@contextmanager
def sqlite_transaction(conn: Any, lock: Any, mode: Literal["DEFERRED", "IMMEDIATE"]) -> Iterator[Any]:
    """A cursor inside ``BEGIN <mode>`` on `conn` (autocommit mode), holding `lock`: committed, or rolled back."""
    with lock:
        cur = conn.cursor()
        cur.execute(f"BEGIN {mode}")
        try:
            yield cur
        except BaseException:
            conn.rollback()
            raise
        else:
            conn.commit()
        finally:
            cur.close()


class SqliteSessionStore:
    """Checkpoints in one SQLite file; synchronous methods, safe for several processes.

    `path` is a file path (created when missing) or ":memory:". `busy_timeout_ms` is how long
    a writer waits for another process's write transaction before failing.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = 10_000,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        cache_runs: int = 256,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ConfigurationError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        if type(busy_timeout_ms) is not int or busy_timeout_ms < 0:
            raise ConfigurationError(f"busy_timeout_ms must be a non-negative int, got {busy_timeout_ms!r}")
        sqlite3 = _sqlite3()
        self.path = file_path(path, "SQLite database")
        self._cache = PrefixCache(cache_runs)
        try:
            if self.path != ":memory:":
                create_private(self.path)
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
            )
        except (sqlite3.Error, OSError) as exc:
            raise ConfigurationError(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        self._sqlite3 = sqlite3
        self._lock = threading.RLock()
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            # Only takes effect on a new, empty file. Message rows are ~1-3 KB: 8 KiB pages pack
            # them with ~7% overhead where the default 4 KiB pages waste ~35% (benches/bench_stores.py).
            self._conn.execute("PRAGMA page_size = 8192")
            self._conn.execute("PRAGMA journal_mode = WAL").fetchone()
            self._conn.execute(f"PRAGMA synchronous = {synchronous}")
            self._migrate()
        except sqlite3.Error as exc:
            self._conn.close()
            raise ConfigurationError(f"cannot use SQLite database {self.path!r}: {exc}") from exc
        except BaseException:
            self._conn.close()
            raise

    def _migrate(self) -> None:
        self._run_once("IMMEDIATE", _sql.schema_plan(_DIALECT))

    def _run(
        self, mode: Literal["DEFERRED", "IMMEDIATE"], make_plan: Callable[[], _sql.Plan], run_id: str | None = None
    ) -> Any:
        """Run a fresh plan in one transaction, the damage of a run's data reported as that run's.

        Text that is not UTF-8 makes sqlite3 raise `OperationalError` for the whole query; the
        plan then runs once more with such text read as bytes (`_text`), which `load` reports as
        corruption of the run and `save` replaces. Only that retry pays for the Python-level
        text decoding. A damaged page (SQLITE_CORRUPT, SQLITE_NOTADB) is `CheckpointCorruptError`
        naming `run_id`.
        """
        with self._lock:
            try:
                try:
                    return self._run_once(mode, make_plan())
                except self._sqlite3.OperationalError as exc:
                    if "Could not decode to UTF-8" not in str(exc):
                        raise
                self._conn.text_factory = _text
                try:
                    return self._run_once(mode, make_plan())
                finally:
                    self._conn.text_factory = str
            except self._sqlite3.DatabaseError as exc:
                if run_id is None or getattr(exc, "sqlite_errorname", None) not in _CORRUPT:
                    raise
                raise CheckpointCorruptError(f"the database file is damaged ({exc})", run_id=run_id) from exc

    def _run_once(self, mode: Literal["DEFERRED", "IMMEDIATE"], plan: _sql.Plan) -> Any:
        with self._transaction(mode) as cur:
            return _sql.run_sync(cur, _DIALECT, plan)

    @contextmanager
    def _transaction(self, mode: Literal["DEFERRED", "IMMEDIATE"]) -> Iterator[Any]:
        with sqlite_transaction(self._conn, self._lock, mode) as cur:
            yield cur

    def save(self, checkpoint: AgentCheckpoint, *, expected_step_index: int | None = None) -> None:
        """Store `checkpoint` as the latest of its run, writing only the messages not stored yet.

        With `expected_step_index`, raise `CheckpointConflictError` (and write nothing) unless
        the stored checkpoint of this run is at that step.
        """
        checkpoint = check_checkpoint(checkpoint)
        expected = check_expected(expected_step_index)
        try:
            revision = self._run(
                "IMMEDIATE", lambda: _sql.save_plan(self._cache, checkpoint, expected, _DIALECT), checkpoint.run_id
            )
        except BaseException:
            self._cache.forget(checkpoint.run_id)  # the rows are unknown now: the next save re-reads them
            raise
        self._cache.remember(checkpoint.run_id, revision, checkpoint.messages)

    def load(self, run_id: str) -> AgentCheckpoint | None:
        """The latest checkpoint of `run_id`, or None. Raises `CheckpointCorruptError` for a damaged run."""
        check_run_id(run_id)
        try:
            found = self._run("DEFERRED", lambda: _sql.load_plan(run_id), run_id)
        except CheckpointCorruptError:
            self._cache.forget(run_id)  # so the next save re-reads the rows and repairs the run
            raise
        if found is None:
            return None
        checkpoint, revision = found
        if type(revision) is int:
            self._cache.remember(run_id, revision, checkpoint.messages)
        return checkpoint  # type: ignore[no-any-return]

    def load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None:
        """The checkpoint saved at `step_index` of `run_id`, or None when the store no longer holds it
        (the step log's rules: `durable_agent.stores._steps`)."""
        check_run_id(run_id)
        check_step_index(step_index)
        return self._run("DEFERRED", lambda: _sql.load_step_plan(run_id, step_index), run_id)  # type: ignore[no-any-return]

    def delete(self, run_id: str) -> None:
        check_run_id(run_id)
        self._run("IMMEDIATE", lambda: _sql.delete_plan(run_id))
        self._cache.forget(run_id)

    def list(
        self, *, status: RunStatus | None = None, limit: int | None = None, after: str | None = None
    ) -> builtins.list[str]:
        """Run ids in code-point order, optionally only those whose latest status is `status`.

        Page with `limit` and `after` (the last id of the previous page).
        """
        status, limit, after = check_list_args(status, limit, after)
        return self._run("DEFERRED", lambda: _sql.list_plan(status, limit, after))  # type: ignore[no-any-return]

    def prune(
        self, *, before: int, status: RunStatus | None = None, include_suspended: bool = False
    ) -> builtins.list[str]:
        """Delete runs whose latest checkpoint was created before `before` (epoch ms); returns their ids.

        Suspended runs (awaiting approval) are kept unless `include_suspended=True`.
        """
        before, status, include_suspended = check_prune_args(before, status, include_suspended)
        doomed: builtins.list[str] = self._run("IMMEDIATE", lambda: _sql.prune_plan(before, status, include_suspended))
        for run_id in doomed:
            self._cache.forget(run_id)
        return doomed

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            self._cache.clear()

    def __enter__(self) -> SqliteSessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteSessionStore({self.path!r})"
