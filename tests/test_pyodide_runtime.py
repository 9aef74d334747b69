"""What the project's Pyodide runner (pyodide/run-pytest.mjs) guarantees, checked from inside the
runtime: a pinned Pyodide, the project mounted read-only, no network; and the package's behaviour
where the runtime lacks a module (sqlite3 on Pyodide 0.28): a clear error at the point of use,
never at import. Skipped on CPython (the runner-specific ones also under other Pyodide harnesses).
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ON_PYODIDE = sys.platform == "emscripten"
UNDER_RUNNER = ON_PYODIDE and os.environ.get("PYODIDE_TEST_RUNNER") == "durable-agent"
PINNED = {"314.0.7": (3, 14), "0.28.2": (3, 13)}
PROJECT = Path(__file__).resolve().parent.parent

runner_only = pytest.mark.skipif(not UNDER_RUNNER, reason="checks pyodide/run-pytest.mjs; runs only under it")


@runner_only
def test_the_runtime_is_one_of_the_pinned_pyodides() -> None:
    import pyodide

    assert pyodide.__version__ in PINNED
    assert sys.version_info[:2] == PINNED[pyodide.__version__]


@runner_only
def test_the_project_is_mounted_read_only(tmp_path: Path) -> None:
    assert (PROJECT / "pyproject.toml").read_text(encoding="utf-8").startswith("[build-system]")
    probe = PROJECT / "tests" / ".pyodide-write-probe"
    attempts: dict[str, Callable[[], object]] = {
        "create": lambda: probe.write_text("x"),
        "append": lambda: open(PROJECT / "pyproject.toml", "a").close(),
        "truncate": lambda: open(PROJECT / "pyproject.toml", "r+").close(),
        "mkdir": lambda: (PROJECT / ".pyodide-probe-dir").mkdir(),
        "rename": lambda: (PROJECT / "pyproject.toml").rename(PROJECT / "pyproject.renamed"),
        "unlink": lambda: (PROJECT / "pyproject.toml").unlink(),
        "chmod": lambda: os.chmod(PROJECT / "pyproject.toml", 0o777),
        "utime": lambda: os.utime(PROJECT / "pyproject.toml", (0, 0)),
    }
    for name, attempt in attempts.items():
        with pytest.raises(OSError) as caught:
            attempt()
        assert caught.value.errno == errno.EROFS, name
    assert not probe.exists() and (PROJECT / "pyproject.toml").exists()
    (tmp_path / "scratch.txt").write_text("tmp stays writable")  # /tmp is Pyodide's in-memory FS
    assert (tmp_path / "scratch.txt").read_text() == "tmp stays writable"


@runner_only
def test_the_runner_allows_no_network() -> None:
    import js
    from pyodide.ffi import JsException

    with pytest.raises(JsException, match="network access is disabled"):
        js.fetch("http://127.0.0.1:9/")  # loopback discard port: harmless even if the guard were gone


@pytest.mark.skipif(not ON_PYODIDE or importlib.util.find_spec("sqlite3") is not None,
                    reason="needs a runtime that really lacks sqlite3 (Pyodide 0.28); "
                           "test_store_sqlite and test_runtime_sqlite simulate it everywhere")
def test_without_sqlite3_the_sqlite_backends_import_and_fail_when_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from durable_agent import FeatureUnavailableError

    for name in ("durable_agent.backends.sqlite", "durable_agent.backends.sqlite._store",
                 "durable_agent.backends.sqlite._runtime"):
        if name in sys.modules:
            monkeypatch.delitem(sys.modules, name)
    sqlite_backend = importlib.import_module("durable_agent.backends.sqlite")  # import: fine
    from durable_agent.backends import open_store

    with pytest.raises(FeatureUnavailableError, match="sqlite3"):
        sqlite_backend.SqliteCheckpointStore(tmp_path / "s.db")
    with pytest.raises(FeatureUnavailableError, match="sqlite3"):
        sqlite_backend.SqliteRuntime(tmp_path / "r.db")
    with pytest.raises(FeatureUnavailableError, match="sqlite3"):
        open_store(f"sqlite:///{tmp_path / 'u.db'}")
    assert "sqlite3" not in sys.modules


@pytest.mark.requires_sqlite  # conftest: skipped where the Pyodide lacks sqlite3 (0.28), runs elsewhere
def test_the_sqlite_store_round_trips_on_this_runtime(tmp_path: Path) -> None:
    from durable_agent.backends.sqlite import SqliteCheckpointStore
    from durable_agent.testing import conversation, make_checkpoint

    checkpoint = make_checkpoint("r-1", 3, conversation(4), pending=True)
    with SqliteCheckpointStore(tmp_path / "runs.db") as store:  # under Pyodide: its in-memory /tmp
        store.save(checkpoint)
    with SqliteCheckpointStore(tmp_path / "runs.db") as store:
        assert store.load("r-1") == checkpoint
