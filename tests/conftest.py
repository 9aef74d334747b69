"""Shared test setup: an `async def` test runner that works on CPython and under Pyodide, and
the `kernels` fixture: the public codec, run by the kernels DURABLE_AGENT_NATIVE selected (pure or native)."""

from __future__ import annotations

import asyncio
import inspect
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

ON_PYODIDE = sys.platform == "emscripten"


def _needs_sync_loop() -> bool:
    if not ON_PYODIDE:
        return False
    from pyodide.ffi import can_run_sync

    return not can_run_sync()


class _SleepSelector:
    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout:
            time.sleep(timeout)
        return []


class _SyncLoop(asyncio.BaseEventLoop):
    """A pure-Python event loop without real I/O, for Pyodide without stack switching (test only)."""

    def __init__(self) -> None:
        super().__init__()
        self._selector = _SleepSelector()

    def _process_events(self, event_list: Any) -> None:
        pass

    def _write_to_self(self) -> None:
        pass


def run_async(coro: Any) -> Any:
    if not _needs_sync_loop():
        return asyncio.run(coro)
    asyncio.events._set_running_loop(None)  # Pyodide's WebLoop marks itself running forever
    loop = _SyncLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:  # what asyncio.run does before closing: cancel leftovers, finalize async generators
            leftovers = asyncio.all_tasks(loop)
            if leftovers:
                for task in leftovers:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: Any) -> bool | None:
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        kwargs = {n: pyfuncitem.funcargs[n] for n in pyfuncitem._fixtureinfo.argnames}
        run_async(pyfuncitem.obj(**kwargs))
        return True
    return None


# --- Pyodide: what cannot run there is skipped with its reason ------------------------------
#
# `@pytest.mark.host_only(reason)` on a test, or `pytestmark = pytest.mark.host_only(reason)` in a
# module: skipped under Pyodide. A module marked that way is not even imported there (it may
# import what Pyodide lacks at top level: the native extension, psycopg, subprocess helpers);
# it shows as one skipped entry. `@pytest.mark.requires_sqlite`: skipped under Pyodide when the
# runtime has no sqlite3 (0.28 ships it only from its CDN); on CPython a missing sqlite3 fails.

SQLITE_MISSING = "sqlite3 is not importable on this Pyodide (0.28 ships it only from its CDN)"


def _sqlite3_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("sqlite3") is None


def _module_host_only_reason(path: Path) -> str | None:
    """The reason of a module-level `pytestmark = ...host_only(reason)`, read without importing."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError):
        return None  # let the normal collection report it
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            continue
        for mark in value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]:
            call = mark if isinstance(mark, ast.Call) else None
            func = call.func if call is not None else mark
            if isinstance(func, ast.Attribute) and func.attr == "host_only":
                args = call.args if call is not None else []
                if args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
                    return args[0].value
                return "needs the host OS"
    return None


class _HostOnlyModule(pytest.Module):
    """A host-only test module under Pyodide: reported as skipped, never imported."""

    host_only_reason = "needs the host OS"

    def collect(self) -> Any:
        pytest.skip(f"host only: {self.host_only_reason} (all of {self.path.name})")


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> Any:
    if not ON_PYODIDE:
        return None
    reason = _module_host_only_reason(module_path)
    if reason is None:
        return None
    module = _HostOnlyModule.from_parent(parent, path=module_path)
    module.host_only_reason = reason
    return module


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if not ON_PYODIDE:
        return
    sqlite_missing = _sqlite3_missing()
    for item in items:
        marker = item.get_closest_marker("host_only")
        if marker is not None:
            reason = marker.args[0] if marker.args else "needs the host OS"
            item.add_marker(pytest.mark.skip(reason=f"host only: {reason}"))
        elif sqlite_missing and item.get_closest_marker("requires_sqlite") is not None:
            item.add_marker(pytest.mark.skip(reason=SQLITE_MISSING))


@pytest.fixture
def kernels() -> ModuleType:
    """The codec under test: `durable_agent.backends`, whose `encode` and `decode` run the kernels this run selected.

    DURABLE_AGENT_NATIVE selects them, so each kernel meets every test through the public codec:
    scripts/test runs the suite with 1 (the native extension) and with 0 (the pure reference), and
    Pyodide runs the pure ones. The parity tests (test_codec_parity.py) hold the two to each other.
    """
    import durable_agent.backends

    return durable_agent.backends
