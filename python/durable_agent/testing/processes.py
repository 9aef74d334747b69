"""Server processes the tests and benchmarks start (standard library only: a benchmark imports it without pytest)."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen[bytes] | None, timeout: float = 10) -> None:
    """End a server process: SIGTERM, then SIGKILL when it has not exited after `timeout` seconds."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)
