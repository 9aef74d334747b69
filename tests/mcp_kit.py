"""What the MCP tests share: the test server's command, its ledger, the process table, an HTTP server process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from durable_agent.testing.processes import stop_process

SERVER = str(Path(__file__).resolve().parent / "mcp_test_server.py")


def stdio_args(ledger: Path) -> list[str]:
    """`args` of a StdioServer running the test server (command: `sys.executable`) on `ledger`."""
    return [SERVER, str(ledger)]


def ledger_entries(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines() if line.endswith("}")]


def effects(ledger: Path, event: str) -> list[dict[str, Any]]:
    return [e for e in ledger_entries(ledger) if e["event"] == event]


def processes_naming(text: str) -> list[int]:
    """The live (not zombie) processes whose command line contains `text`: the process table, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def wait_until(condition: Any, seconds: float = 20.0) -> bool:
    """Poll `condition` until it holds (True) or `seconds` pass (False): a bound, not a timed assertion."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def http_server(ledger: Path, **env: str) -> Iterator[str]:
    """The test server under uvicorn (streamable HTTP) in a subprocess; yields its URL."""
    port = free_port()
    process = subprocess.Popen([sys.executable, SERVER, str(ledger), "--http", str(port)],
                               env={**os.environ, **env})
    try:
        def listening() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        assert wait_until(listening, 60), "the MCP test server did not start listening"
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_process(process)
