"""Shared test setup: an `async def` test runner that works on CPython and under Pyodide, and
the `kernels` fixture that runs a test once per kernel implementation (pure, native)."""

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
    from pyodide.ffi import can_run_sync  # type: ignore[import-not-found]

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
        loop.close()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: Any) -> bool | None:
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        kwargs = {n: pyfuncitem.funcargs[n] for n in pyfuncitem._fixtureinfo.argnames}
        run_async(pyfuncitem.obj(**kwargs))
        return True
    return None


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if not ON_PYODIDE:
        return
    for item in items:
        marker = item.get_closest_marker("host_only")
        if marker is not None:
            reason = marker.args[0] if marker.args else "needs the host OS"
            item.add_marker(pytest.mark.skip(reason=f"host only: {reason}"))


def _kernel_params() -> list[Any]:
    params: list[Any] = [pytest.param("pure", id="pure")]
    if not ON_PYODIDE:
        params.append(pytest.param("native", id="native"))
    return params


@pytest.fixture(params=_kernel_params())
def kernels(request: Any) -> ModuleType:
    """The kernel module under test: `durable_agent._pure`, or the native extension.

    The native case fails (it does not skip) when the extension is missing, unless the
    suite runs with DURABLE_AGENT_NATIVE=0 (the pure-only run).
    """
    import os

    if request.param == "pure":
        from durable_agent import _pure

        return _pure
    if os.environ.get("DURABLE_AGENT_NATIVE", "auto") == "0":
        pytest.skip("native kernels disabled by DURABLE_AGENT_NATIVE=0")
    import durable_agent_native  # noqa: PLC0415

    return durable_agent_native
