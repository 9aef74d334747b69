"""Several components on one SQLite file in one process, while other processes come and go.

The README's server keeps `SqliteRuntime` and `SqliteEventLog` on one file; the CLI opens a runtime and
a checkpoint store on it. POSIX locks belong to the process: had any of them opened and closed the
file outside SQLite (to create it 0600), the close would drop the locks of the connections the process
already holds, and the next process to close the file would take itself for the last user, checkpoint
and delete the WAL under them: every later write of this process, invisible to every other one.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from durable_agent.backends.sqlite import AsyncSqliteCheckpointStore, SqliteCheckpointStore, SqliteRuntime
from durable_agent.http import SqliteEventLog
from durable_agent.testing import conversation, make_checkpoint
from helpers import maybe_await

pytestmark = [pytest.mark.host_only("spawns processes"), pytest.mark.requires_sqlite]

PYTHON_DIR = Path(__file__).resolve().parent.parent / "python"

OPENERS: dict[str, Any] = {
    "runtime": SqliteRuntime,
    "event log": SqliteEventLog,
    "store": SqliteCheckpointStore,
    "async store": AsyncSqliteCheckpointStore,
}

PAIRS = [
    ("runtime", "event log"),
    ("runtime", "store"),
    ("store", "store"),
    ("runtime", "runtime"),
    ("event log", "store"),
    ("event log", "event log"),
    ("async store", "runtime"),
    ("runtime", "event log", "store"),
]

# Another process using the file for a moment (as the sqlite3 shell or `durable-agent runs list` do): it
# reads, so its SQLite opens the WAL, and on close deletes it if it can lock the file exclusively.
OPEN_AND_CLOSE = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT 1 FROM sqlite_master'); c.close()"

# What a fresh process sees of the runs: the checkpoint store's ids and the event log's ids.
SEEN = textwrap.dedent("""
    import asyncio, json, sys
    from durable_agent.http import SqliteEventLog
    from durable_agent.backends.sqlite import SqliteCheckpointStore
    path, names = sys.argv[1], sys.argv[2:]
    with SqliteCheckpointStore(path) as store:
        saved = store.list()
    log = SqliteEventLog(path)
    logged = [n for n in names if asyncio.run(log.run_info(n)) is not None]
    log.close()
    print(json.dumps({"saved": saved, "logged": logged}))
""")


async def _write(kind: str, component: Any, name: str) -> None:
    """One acknowledged write through `component`: a run in the event log, or a checkpoint."""
    if kind == "event log":
        assert await component.create_run(name, "session", {})
        await component.append(name, [("text", {"text": name})])
    elif kind == "runtime":
        await component.stores.checkpoints.save(make_checkpoint(name, 1, conversation(2)))
    else:
        await maybe_await(component.save(make_checkpoint(name, 1, conversation(2))))


def _python(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(PYTHON_DIR), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("kinds", PAIRS, ids=["+".join(p) for p in PAIRS])
async def test_writes_after_another_process_opens_and_closes_the_file_stay_visible(
        tmp_path: Path, kinds: tuple[str, ...]) -> None:
    path = tmp_path / "agent.db"
    wal = Path(f"{path}-wal")
    opened = [(f"c{i}", kind, OPENERS[kind](path)) for i, kind in enumerate(kinds)]
    try:
        for name, kind, component in opened:
            await _write(kind, component, f"{name}-before")
        _python("-c", OPEN_AND_CLOSE, str(path))
        assert wal.exists(), "another process deleted the WAL under open connections"
        for name, kind, component in opened:
            await _write(kind, component, f"{name}-after")
        assert wal.exists()

        written = {f"{name}-{when}": kind for name, kind, _ in opened for when in ("before", "after")}
        seen = json.loads(_python("-c", SEEN, str(path), *written))
        assert seen == {"saved": sorted(n for n, kind in written.items() if kind != "event log"),
                        "logged": [n for n, kind in written.items() if kind == "event log"]}
    finally:
        for _, _, component in opened:
            await maybe_await(component.close())


def test_only_the_files_module_connects_to_a_sqlite_file() -> None:
    """The rule has one home (`durable_agent.backends._files.connect_sqlite`): a new component that opened its
    file another way could create it with an open() and close() again."""
    package = PYTHON_DIR / "durable_agent"

    def connects(path: Path) -> bool:
        return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "connect"
                   and isinstance(node.func.value, ast.Name) and "sqlite" in node.func.value.id
                   for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))

    assert sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if connects(p)) == ["backends/_files.py"]
