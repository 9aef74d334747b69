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
