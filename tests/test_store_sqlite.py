"""SqliteCheckpointStore: the conformance suite, plus what only a file store can show."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durable_agent import (
    CheckpointConflictError,
    CheckpointCorruptError,
    ConfigurationError,
    FeatureUnavailableError,
)
from durable_agent.backends.sqlite import AsyncSqliteCheckpointStore, SqliteCheckpointStore
from durable_agent.testing import (
    CheckpointStoreConformance,
    conversation,
    hammer_one_run,
    make_checkpoint,
    message,
)
from store_kit import BlockingStore, queued_together

try:
    import sqlite3
except ImportError:  # Pyodide 0.28 ships sqlite3 only as a CDN package
    sqlite3 = None  # type: ignore[assignment]

needs_sqlite3 = pytest.mark.requires_sqlite  # skipped only under a Pyodide without sqlite3 (conftest)


@needs_sqlite3
class TestSqliteStore(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Callable[[], SqliteCheckpointStore]:
        return lambda: SqliteCheckpointStore(tmp_path / "runs.db")


@needs_sqlite3
class TestAsyncSqliteStore(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Callable[[], AsyncSqliteCheckpointStore]:
        return lambda: AsyncSqliteCheckpointStore(tmp_path / "runs.db")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


@pytest.fixture(params=["sync", "async"])
def Store(request: pytest.FixtureRequest) -> Callable[..., Any]:  # capitalised: it stands for a class
    """Each store class with a sync face: the rules of damage and healing hold for both."""
    if request.param == "sync":
        return SqliteCheckpointStore
    return lambda *args, **kwargs: BlockingStore(AsyncSqliteCheckpointStore(*args, **kwargs))


def _rows(db: Path, run_id: str) -> list[tuple[int, str]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT seq, body FROM durable_agent_messages WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()


@needs_sqlite3
def test_a_save_writes_only_the_new_messages(db: Path) -> None:
    with SqliteCheckpointStore(db) as store:
        history = conversation(10)
        store.save(make_checkpoint("r", 1, history))
        rowids_before = _rowids(db, "r")
        store.save(make_checkpoint("r", 2, [*history, message(10), message(11)]))
        rowids_after = _rowids(db, "r")
    assert rowids_after[:10] == rowids_before  # the stored rows were not rewritten
    assert len(rowids_after) == 12


def _rowids(db: Path, run_id: str) -> list[int]:
    with sqlite3.connect(db) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT rowid FROM durable_agent_messages WHERE run_id = ? ORDER BY seq", (run_id,)
            )
        ]


@needs_sqlite3
def test_wal_mode_and_schema_version(db: Path) -> None:
    SqliteCheckpointStore(db).close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 8192
        assert conn.execute("SELECT version FROM durable_agent_schema_version").fetchall() == [(1,), (2,)]


@needs_sqlite3
def test_a_newer_schema_is_refused(db: Path) -> None:
    SqliteCheckpointStore(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO durable_agent_schema_version VALUES (99)")
    with pytest.raises(FeatureUnavailableError, match="version 99"):
        SqliteCheckpointStore(db)


@needs_sqlite3
def test_not_a_database_is_a_configuration_error(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ConfigurationError, match=r"garbage\.db"):
        SqliteCheckpointStore(bad)
    with pytest.raises(ConfigurationError):
        SqliteCheckpointStore(tmp_path / "missing-dir" / "x.db")
    with pytest.raises(ConfigurationError):
        SqliteCheckpointStore(tmp_path / "ok.db", synchronous="OFF")  # type: ignore[arg-type]


@needs_sqlite3
@pytest.mark.parametrize(
    ("sql", "params", "match"),
    [
        (
            "UPDATE durable_agent_messages SET body = ? WHERE run_id = 'bad' AND seq = 2",
            ('{"role":"us',),
            "message 2",
        ),
        (
            "UPDATE durable_agent_messages SET body = ? WHERE run_id = 'bad' AND seq = 1",
            (b"\x00\x01",),
            "message 1",
        ),
        ("DELETE FROM durable_agent_messages WHERE run_id = 'bad' AND seq = ?", (3,), "counts 5 messages"),
        ("UPDATE durable_agent_runs SET header = ? WHERE run_id = 'bad'", ("garbage",), "header"),
        (
            "UPDATE durable_agent_runs SET header = ? WHERE run_id = 'bad'",
            ("[1,2]",),
            "header is not an object",
        ),
        ("UPDATE durable_agent_runs SET message_count = ? WHERE run_id = 'bad'", ("five",), "message_count"),
        (
            "UPDATE durable_agent_runs SET header = replace(header, '\"version\":1', '\"version\":0')"
            " WHERE run_id = 'bad' AND ? = 1",
            (1,),
            "schema version",
        ),
        (
            'UPDATE durable_agent_runs SET header = replace(header, \'"step_index":2\', \'"step_index":"2"\')'
            " WHERE run_id = 'bad' AND ? = 1",
            (1,),
            "step_index",
        ),
        (
            "UPDATE durable_agent_messages SET body = ? WHERE run_id = 'bad' AND seq = 0",
            ('{"role":"robot","content":"x"}',),
            "known role",
        ),
    ],
)
def test_corrupt_rows_raise_a_typed_error_naming_the_run(
    Store: Callable[..., Any], db: Path, sql: str, params: tuple[object, ...], match: str
) -> None:
    with Store(db) as store:
        store.save(make_checkpoint("bad", 2, conversation(5)))
        good = make_checkpoint("good", 1, conversation(3))
        store.save(good)
        with sqlite3.connect(db) as conn:  # damaged behind the back of a live handle
            assert conn.execute(sql, params).rowcount == 1
        with pytest.raises(CheckpointCorruptError, match=match) as caught:
            store.load("bad")
        assert caught.value.run_id == "bad"
        assert store.load("good") == good
        healed = make_checkpoint("bad", 3, conversation(6))
        store.save(healed)  # a save repairs the run from the stored rows it can trust
        assert store.load("bad") == healed


@needs_sqlite3
def test_a_failed_transaction_leaves_no_partial_save(Store: Callable[..., Any], db: Path) -> None:
    """A save that dies mid-transaction (here: the write lock is held too long) writes nothing."""
    store = Store(db, busy_timeout_ms=50)
    store.save(make_checkpoint("r", 1, conversation(4)))
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        store.save(make_checkpoint("r", 2, conversation(8)))
    blocker.execute("ROLLBACK")
    blocker.close()
    assert store.load("r") == make_checkpoint("r", 1, conversation(4))
    store.save(make_checkpoint("r", 3, conversation(9)))
    assert store.load("r") == make_checkpoint("r", 3, conversation(9))
    assert [seq for seq, _ in _rows(db, "r")] == list(range(9))
    store.close()


_WRITER = """
import sys
sys.path.insert(0, {python!r})
from durable_agent.backends.sqlite import AsyncSqliteCheckpointStore, SqliteCheckpointStore
from durable_agent.testing import make_checkpoint, conversation
store = SqliteCheckpointStore({db!r})
worker = int(sys.argv[1])
for step in range(40):
    store.save(make_checkpoint(f"w{{worker}}", step, conversation(step + 1)))
    store.save(make_checkpoint("shared", step, conversation(step % 7 + 1)))
store.close()
"""


@pytest.mark.host_only("spawns processes")
def test_several_processes_write_one_file(db: Path) -> None:
    SqliteCheckpointStore(db).close()
    python_dir = str(Path(__file__).resolve().parent.parent / "python")
    script = _WRITER.format(python=python_dir, db=str(db))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(w)]) for w in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    with SqliteCheckpointStore(db) as store:
        for w in range(3):
            assert store.load(f"w{w}") == make_checkpoint(f"w{w}", 39, conversation(40))
        shared = store.load("shared")
        assert shared is not None and shared.step_index == 39
        assert shared.messages == conversation(39 % 7 + 1)
        assert store.list() == ["shared", "w0", "w1", "w2"]


@needs_sqlite3
@pytest.mark.host_only("threads")
def test_concurrent_writers_of_one_run_through_separate_connections(db: Path) -> None:
    stores = [SqliteCheckpointStore(db) for _ in range(3)]
    try:
        loaded = hammer_one_run(stores)
    finally:
        for s in stores:
            s.close()
    assert [seq for seq, _ in _rows(db, "hot")] == list(range(len(loaded.messages)))


@needs_sqlite3
def test_loading_primes_the_cache_so_a_resumed_run_appends(Store: Callable[..., Any], db: Path) -> None:
    with Store(db) as store:
        store.save(make_checkpoint("r", 1, conversation(5)))
    with Store(db) as store:
        loaded = store.load("r")
        assert loaded is not None
        before = _rowids(db, "r")
        store.save(make_checkpoint("r", 2, [*loaded.messages, message(5)]))
        assert _rowids(db, "r")[:5] == before


def test_sqlite_missing_raises_feature_unavailable(monkeypatch: pytest.MonkeyPatch, db: Path) -> None:
    monkeypatch.setitem(sys.modules, "sqlite3", None)
    with pytest.raises(FeatureUnavailableError, match="sqlite3"):
        SqliteCheckpointStore(db)


def _damage(db: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    with sqlite3.connect(db) as conn:
        assert conn.execute(sql, params).rowcount == 1


@needs_sqlite3
@pytest.mark.parametrize(
    ("sql", "refused"),
    [
        # a raw sqlite3.IntegrityError before; the loop logs a failed save and goes on either way
        ("INSERT INTO durable_agent_messages (run_id, seq, body) VALUES ('r', 3, 'stray')",
         "stored already where this save appends message 3"),
        ("UPDATE durable_agent_runs SET message_count = 'three' WHERE run_id = 'r'", None),  # the save re-reads
    ],
)
def test_damage_behind_a_trusting_cache_fails_at_most_one_save_as_corruption_and_the_next_save_heals(
    Store: Callable[..., Any], db: Path, sql: str, refused: str | None
) -> None:
    with Store(db) as store:
        store.save(make_checkpoint("r", 1, conversation(3)))
        _damage(db, sql)  # behind the back of a handle whose cache trusts the stored rows
        second = make_checkpoint("r", 2, conversation(4))
        if refused is None:
            store.save(second)
        else:
            with pytest.raises(CheckpointCorruptError, match=refused) as caught:
                store.save(second)
            assert caught.value.run_id == "r"
        latest = make_checkpoint("r", 3, conversation(5))
        store.save(latest)
        assert store.load("r") == latest
    assert [seq for seq, _ in _rows(db, "r")] == list(range(5))


@needs_sqlite3
def test_a_row_numbered_below_zero_is_removed_by_the_heal(Store: Callable[..., Any], db: Path) -> None:
    with Store(db) as store:
        store.save(make_checkpoint("r", 1, conversation(3)))
        _damage(db, "INSERT INTO durable_agent_messages (run_id, seq, body) VALUES ('r', -1, 'stray')")
        with pytest.raises(CheckpointCorruptError, match="contiguous"):
            store.load("r")
        healed = make_checkpoint("r", 2, conversation(4))
        store.save(healed)
        assert store.load("r") == healed
    with Store(db) as fresh:  # a new process, no cache: it heals on its first save
        fresh.save(make_checkpoint("r", 3, conversation(4)))
        _damage(db, "INSERT INTO durable_agent_messages (run_id, seq, body) VALUES ('r', -5, 'stray')")
    with Store(db) as fresh:
        fresh.save(make_checkpoint("r", 4, conversation(4)))
        assert fresh.load("r") == make_checkpoint("r", 4, conversation(4))
    assert [seq for seq, _ in _rows(db, "r")] == list(range(4))


@needs_sqlite3
@pytest.mark.parametrize(
    ("sql", "match"),
    [
        ("UPDATE durable_agent_messages SET body = CAST(x'7b22ff' AS TEXT) WHERE run_id = 'r' AND seq = 1",
         "message 1 is not text"),
        ("UPDATE durable_agent_runs SET header = CAST(x'c328' AS TEXT) WHERE run_id = 'r'", "header is not text"),
    ],
)
def test_text_that_is_not_utf8_is_corruption_of_its_run_and_a_save_heals_it(
    Store: Callable[..., Any], db: Path, sql: str, match: str
) -> None:
    with Store(db) as store:
        store.save(make_checkpoint("r", 1, conversation(3)))
        other = make_checkpoint("other", 1, conversation(2))
        store.save(other)
        _damage(db, sql)
        with pytest.raises(CheckpointCorruptError, match=match) as caught:
            store.load("r")
        assert caught.value.run_id == "r"
        assert store.load("other") == other and store.list() == ["other", "r"]
        healed = make_checkpoint("r", 2, conversation(4))
        store.save(healed)
        assert store.load("r") == healed


@needs_sqlite3
def test_a_run_id_that_is_not_utf8_is_skipped_by_list_and_prune(Store: Callable[..., Any], db: Path, caplog: pytest.LogCaptureFixture) -> None:
    with Store(db) as store:
        store.save(make_checkpoint("a", 1, conversation(1), created_at=5))
        store.save(make_checkpoint("b", 1, conversation(1), created_at=5))
        _damage(db, "UPDATE durable_agent_runs SET run_id = CAST(x'62ff' AS TEXT) WHERE run_id = 'b'")
        assert store.list() == ["a"]
        assert store.prune(before=10) == ["a"]
    assert "unreadable run id" in caplog.text


@needs_sqlite3
def test_overwritten_file_pages_are_corruption_naming_the_run(Store: Callable[..., Any], db: Path) -> None:
    with Store(db) as store:
        store.save(make_checkpoint("r", 1, conversation(400)))
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    with open(db, "r+b") as f:  # garbage over the later pages: message rows, not the schema
        for n in range(pages // 2, pages):
            f.seek(n * page)
            f.write(b"\xa5" * page)
    with Store(db) as store:
        with pytest.raises(CheckpointCorruptError, match="damaged") as caught:
            store.load("r")
        assert caught.value.run_id == "r"


@needs_sqlite3
@pytest.mark.host_only("POSIX file modes")
def test_database_files_are_created_owner_only(tmp_path: Path) -> None:
    """Conversations and approval tokens: the file and its -wal/-shm are 0600 even under umask 022."""
    import os

    from durable_agent.backends.sqlite import SqliteRuntime

    old = os.umask(0o022)
    try:
        with SqliteCheckpointStore(tmp_path / "runs.db") as store:
            store.save(make_checkpoint("r", 1, conversation(2)))
            names = ["runs.db", "runs.db-wal", "runs.db-shm"]
            assert {n: oct((tmp_path / n).stat().st_mode & 0o777) for n in names} == dict.fromkeys(names, "0o600")
        with SqliteRuntime(tmp_path / "journal.db"):
            names = ["journal.db", "journal.db-wal", "journal.db-shm"]
            assert {n: oct((tmp_path / n).stat().st_mode & 0o777) for n in names} == dict.fromkeys(names, "0o600")
    finally:
        os.umask(old)
    existing = tmp_path / "shared.db"
    existing.touch(mode=0o640)
    existing.chmod(0o640)
    SqliteCheckpointStore(existing).close()
    assert existing.stat().st_mode & 0o777 == 0o640  # a mode the operator chose is kept
    target, link = tmp_path / "volume.db", tmp_path / "linked.db"
    link.symlink_to(target)  # a deployment's link to where the file is to be: created there, owner-only
    SqliteRuntime(link).close()
    assert target.stat().st_mode & 0o777 == 0o600


@needs_sqlite3
def test_a_schema_1_file_migrates_and_its_runs_fork_at_their_latest_step(db: Path) -> None:
    """A file written before the step log: its runs load, fork at the latest step, and log new steps."""
    import asyncio

    from durable_agent import StepNotFoundError, fork_run

    with SqliteCheckpointStore(db) as store:
        for step in range(3):
            store.save(make_checkpoint("old", step, conversation(2 + step)))
    with sqlite3.connect(db) as conn:  # what schema 1 left: no step table, version 1 only
        conn.execute("DROP TABLE durable_agent_step_log")
        conn.execute("DELETE FROM durable_agent_schema_version WHERE version = 2")
    with SqliteCheckpointStore(db) as store:
        assert store.load("old") == make_checkpoint("old", 2, conversation(4))
        assert store.load_step("old", 1) is None
        with pytest.raises(StepNotFoundError):
            asyncio.run(fork_run(store, "old", new_run_id="new", at_step=1))
        forked = asyncio.run(fork_run(store, "old", new_run_id="new"))
        assert store.load_step("new", 2) == forked
        store.save(make_checkpoint("old", 3, conversation(5)))
        assert store.load_step("old", 3) == make_checkpoint("old", 3, conversation(5))


@needs_sqlite3
@pytest.mark.host_only("threads: under Pyodide the store runs each plan inline")
def test_a_save_waiting_for_the_write_lock_does_not_block_the_event_loop(db: Path) -> None:
    """Another connection holds the write lock; a heartbeat task keeps ticking while the save waits,
    and only the heartbeat releases the lock. A store that blocked the loop would wait out its busy
    timeout with the heartbeat stopped, and fail with "database is locked"."""

    async def scenario() -> tuple[int, bool]:
        async with AsyncSqliteCheckpointStore(db, busy_timeout_ms=5_000) as store:
            await store.save(make_checkpoint("r", 1, conversation(2)))
            blocker = sqlite3.connect(db, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
            save = asyncio.ensure_future(store.save(make_checkpoint("r", 2, conversation(3))))
            ticks = 0
            for _ in range(10):
                await asyncio.sleep(0.001)
                ticks += 1
            pending = not save.done()
            blocker.execute("ROLLBACK")
            blocker.close()
            await save
            assert await store.load("r") == make_checkpoint("r", 2, conversation(3))
        return ticks, pending

    assert asyncio.run(scenario()) == (10, True)


@needs_sqlite3
@pytest.mark.host_only("threads")
def test_concurrent_async_saves_are_each_durable_when_awaited(db: Path) -> None:
    """Many runs saving at once (their saves share commits): every awaited save is in the file,
    and a save that conflicts fails alone, leaving the others of its commit applied."""

    async def scenario() -> None:
        async with AsyncSqliteCheckpointStore(db) as store:
            await store.save(make_checkpoint("fenced", 3, conversation(1)))
            saves = [store.save(make_checkpoint(f"r{i}", i, conversation(i % 5 + 1))) for i in range(50)]
            conflict = store.save(make_checkpoint("fenced", 4, conversation(2)), expected_step_index=2)
            results = await asyncio.gather(*saves, conflict, return_exceptions=True)
            assert results[:50] == [None] * 50
            assert isinstance(results[50], CheckpointConflictError)

    asyncio.run(scenario())
    with SqliteCheckpointStore(db) as fresh:  # another handle: what reached the file
        assert [fresh.load(f"r{i}") for i in range(50)] == [
            make_checkpoint(f"r{i}", i, conversation(i % 5 + 1)) for i in range(50)
        ]
        assert fresh.load("fenced") == make_checkpoint("fenced", 3, conversation(1))


@needs_sqlite3
@pytest.mark.host_only("threads")
def test_appending_saves_of_a_batch_share_their_statements(db: Path) -> None:
    """Every statement the writer thread runs is a GIL hand-off (`durable_agent.backends.sqlite._group_commit`): twenty runs'
    appending saves in one batch write their headers, messages and step rows in a few statements,
    not three each."""
    statements: list[str] = []

    async def scenario() -> list[Any]:
        async with AsyncSqliteCheckpointStore(db) as store:
            for i in range(20):
                await store.save(make_checkpoint(f"r{i}", 1, conversation(2)))
            store._conn.set_trace_callback(statements.append)
            return await queued_together(
                db, [store.save(make_checkpoint(f"r{i}", 2, conversation(4 + i % 3))) for i in range(20)])

    assert asyncio.run(scenario()) == [None] * 20
    updates = [sql for sql in statements if sql.startswith("UPDATE durable_agent_runs")]
    inserts = [sql for sql in statements if sql.startswith("INSERT INTO durable_agent_messages")]
    # one each per save, written one by one; merged, at most half that: the writer may split the saves into two
    # batches, and writes each batch's rows in power-of-2 chunks (`sql.plan.chunks`)
    assert 1 <= len(updates) <= 10 and 1 <= len(inserts) <= 10, (len(updates), len(inserts))
    with SqliteCheckpointStore(db) as fresh:
        for i in range(20):
            assert fresh.load(f"r{i}") == make_checkpoint(f"r{i}", 2, conversation(4 + i % 3))
            assert fresh.load_step(f"r{i}", 1) == make_checkpoint(f"r{i}", 1, conversation(2))
        assert [seq for seq, _ in _rows(db, "r19")] == list(range(5))


@needs_sqlite3
@pytest.mark.host_only("threads")
def test_a_merged_batch_leaves_a_changed_run_a_conflict_and_a_stray_row_to_their_own_saves(db: Path) -> None:
    """In one batch: a run another handle saved since (this handle's cache no longer vouches for it),
    a save expecting a step the run is not at, and a run with a stray message row where the
    next message goes. The merged write fails as a whole and each save runs alone: the changed
    run is saved, the conflict and the stray row fail only their own saves, the rest land."""

    async def scenario() -> list[Any]:
        async with AsyncSqliteCheckpointStore(db) as store:
            for i in range(8):
                await store.save(make_checkpoint(f"r{i}", 1, conversation(2)))
            with SqliteCheckpointStore(db) as other:
                other.save(make_checkpoint("r3", 1, conversation(3)))
            _damage(db, "INSERT INTO durable_agent_messages (run_id, seq, body) VALUES ('r6', 2, 'stray')")
            return await queued_together(db, [
                store.save(make_checkpoint(f"r{i}", 2, conversation(4)), expected_step_index=7 if i == 5 else None)
                for i in range(8)
            ])

    results = asyncio.run(scenario())
    assert isinstance(results[5], CheckpointConflictError)
    assert isinstance(results[6], CheckpointCorruptError) and results[6].run_id == "r6"
    assert [r for i, r in enumerate(results) if i not in (5, 6)] == [None] * 6
    with SqliteCheckpointStore(db) as fresh:
        for i in (0, 1, 2, 3, 4, 7):
            assert fresh.load(f"r{i}") == make_checkpoint(f"r{i}", 2, conversation(4)), i
        assert fresh.load("r5") == make_checkpoint("r5", 1, conversation(2))
        with pytest.raises(CheckpointCorruptError, match="r6"):  # its damage is still there: its save failed
            fresh.load("r6")


@needs_sqlite3
@pytest.mark.host_only("threads")
def test_saves_of_one_run_in_a_batch_apply_in_order(db: Path) -> None:
    async def scenario() -> list[Any]:
        async with AsyncSqliteCheckpointStore(db) as store:
            for i in range(3):
                await store.save(make_checkpoint(f"r{i}", 1, conversation(2)))
            return await queued_together(db, [
                store.save(make_checkpoint("r0", 2, conversation(3))),
                store.save(make_checkpoint("r1", 2, conversation(3))),
                store.save(make_checkpoint("r0", 3, conversation(4))),
                store.save(make_checkpoint("r2", 2, conversation(3))),
            ])

    assert asyncio.run(scenario()) == [None] * 4
    with SqliteCheckpointStore(db) as fresh:
        assert fresh.load("r0") == make_checkpoint("r0", 3, conversation(4))
        assert fresh.load_step("r0", 2) == make_checkpoint("r0", 2, conversation(3))
        assert [fresh.load(f"r{i}") for i in (1, 2)] == [make_checkpoint(f"r{i}", 2, conversation(3)) for i in (1, 2)]


@needs_sqlite3
@pytest.mark.host_only("threads")
def test_first_saves_of_a_batch_share_their_statements_and_a_taken_id_saves_alone(db: Path) -> None:
    """New runs' first saves in one batch insert their heads in one statement; a run another handle
    saved meanwhile (unknown to this handle's cache) makes that insert write nothing, and each
    save then runs its own plan, which replaces the stored run as a save does."""
    statements: list[str] = []

    async def scenario() -> list[Any]:
        async with AsyncSqliteCheckpointStore(db) as store:
            store._conn.set_trace_callback(statements.append)
            first = await queued_together(db, [store.save(make_checkpoint(f"a{i}", 0, conversation(2)))
                                               for i in range(10)])
            heads = [sql for sql in statements if sql.startswith("INSERT INTO durable_agent_runs")]
            assert 1 <= len(heads) <= 5, len(heads)  # ten one by one; two batches of power-of-2 chunks at most
            with SqliteCheckpointStore(db) as other:
                other.save(make_checkpoint("b3", 4, conversation(6)))
            return first + await queued_together(db, [store.save(make_checkpoint(f"b{i}", 0, conversation(2)))
                                                      for i in range(10)])

    assert asyncio.run(scenario()) == [None] * 20
    with SqliteCheckpointStore(db) as fresh:
        for name in [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)]:
            assert fresh.load(name) == make_checkpoint(name, 0, conversation(2)), name


@needs_sqlite3
@pytest.mark.host_only("threads")
def test_a_full_disk_fails_every_save_of_the_batch_with_its_cause_and_the_next_saves_heal(db: Path) -> None:
    """The merged write and then each save alone meet the full file: every waiter learns why, nothing of
    the batch is kept, and once there is room the runs save again (their cache was dropped)."""
    big = [{"role": "user", "content": "x" * 200_000}]

    async def scenario() -> list[Any]:
        async with AsyncSqliteCheckpointStore(db) as store:
            for i in range(6):
                await store.save(make_checkpoint(f"r{i}", 1, conversation(2)))
            pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
            store._conn.execute(f"PRAGMA max_page_count = {pages + 2}")
            full = await queued_together(db, [store.save(make_checkpoint(f"r{i}", 2, [*conversation(2), *big]))
                                              for i in range(6)])
            store._conn.execute("PRAGMA max_page_count = 1073741823")
            healed = await queued_together(db, [store.save(make_checkpoint(f"r{i}", 2, conversation(3)))
                                                for i in range(6)])
            return [*full, *healed]

    results = asyncio.run(scenario())
    assert all(isinstance(r, sqlite3.OperationalError) and "full" in str(r) for r in results[:6]), results[:6]
    assert results[6:] == [None] * 6
    with SqliteCheckpointStore(db) as fresh:
        assert [fresh.load(f"r{i}") for i in range(6)] == [make_checkpoint(f"r{i}", 2, conversation(3)) for i in range(6)]


@needs_sqlite3
@pytest.mark.host_only("threads")
@pytest.mark.parametrize("opener", ["store", "runtime", "event log"])
def test_opening_a_new_file_another_process_is_writing_waits_for_it(tmp_path: Path, opener: str) -> None:
    """Workers started together open one new file at once. Turning it to WAL needs an exclusive lock,
    and SQLite refuses that at once, without its busy handler, while another connection writes:
    the open waits within its busy timeout instead of failing."""
    import threading

    from durable_agent.backends.sqlite import SqliteRuntime
    from durable_agent.http import SqliteEventLog

    path = tmp_path / "new.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE elsewhere (x)")
    writer.execute("BEGIN IMMEDIATE")  # still in rollback-journal mode: nothing opened it as WAL yet
    writer.execute("INSERT INTO elsewhere VALUES (1)")
    done = threading.Timer(0.3, lambda: writer.execute("COMMIT"))
    done.start()
    try:
        opened = {"store": SqliteCheckpointStore, "runtime": SqliteRuntime, "event log": SqliteEventLog}[opener](
            path, busy_timeout_ms=5_000)
        opened.close()
    finally:
        done.join()
        writer.close()
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",)
