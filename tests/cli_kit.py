"""The ``durable-agent`` CLI run as a subprocess, as a user's shell runs it (tests/cli_agent.py importable for `--agent`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests")]), **(env or {})}
    environ.pop("DURABLE_AGENT_STORE", None)
    return subprocess.run([sys.executable, "-m", "durable_agent.cli", *args], capture_output=True, text=True,
                          env=environ, input=stdin, timeout=120, cwd=cwd)


def cli_on_terminal(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The CLI with stdout and stderr on a pseudo-terminal, as in an interactive shell: its exit code and all it wrote."""
    import pty

    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests")]),
               "TERM": "xterm", **(env or {})}
    for name in ("DURABLE_AGENT_STORE", *(() if "NO_COLOR" in (env or {}) else ("NO_COLOR",))):
        environ.pop(name, None)
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen([sys.executable, "-m", "durable_agent.cli", *args], stdin=subprocess.DEVNULL,
                                   stdout=follower, stderr=follower, env=environ)
    finally:
        os.close(follower)
    chunks = []
    try:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the process closed the terminal's last descriptor
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(leader)
    return process.wait(timeout=120), b"".join(chunks).decode()
