"""The Pyodide runner seen from the host: pytest's exit code and counts come back out, and a wheel
that fails to load fails the run. (What it guarantees inside the runtime, read-only project and no
network, is checked from there by test_pyodide_runtime.py.) Runs Node.js with a real Pyodide."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYODIDE_DIR = ROOT / "pyodide"
RUNNER = PYODIDE_DIR / "run-pytest.mjs"

pytestmark = [
    pytest.mark.host_only("runs Node.js and Pyodide in a subprocess"),
    pytest.mark.kernel_independent,  # the runner on a project of its own, without durable_agent nor its env
]


@pytest.fixture(scope="module")
def wheels_314() -> Path:
    """The runner's setup, as scripts/test-pyodide does it (each step a no-op when already done)."""
    installed = all((PYODIDE_DIR / "node_modules" / f"pyodide-{rt}" / "package.json").exists() for rt in ("314", "028"))
    if not installed:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=PYODIDE_DIR,
                       check=True, timeout=600)
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run([str(PYODIDE_DIR / "fetch-wheels.sh"), "314"], check=True, timeout=600, env=env)
    return ROOT / ".pyodide-wheels" / "py314"


def run_runner(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DURABLE_AGENT_"))}
    return subprocess.run(["node", str(RUNNER), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env)


def test_pytest_outcome_and_counts_come_back_out_and_no_socket_leaves(tmp_path: Path, wheels_314: Path) -> None:
    # Pyodide in Node turns a Python socket connect into a WebSocket connection from Node (its
    # `ws` dependency): the runner must stop it. A listener on loopback would see the attempt.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    (project / "tests" / "test_four.py").write_text(
        "import socket, sys, time, pytest\n"
        "def test_passes():\n    assert sys.platform == 'emscripten'\n"
        "def test_fails():\n    assert 1 == 2\n"
        "@pytest.mark.skip(reason='because')\ndef test_skipped():\n    pass\n"
        "def test_tries_the_network():\n"
        "    s = socket.socket()\n"
        "    try:\n"
        f"        s.connect(('127.0.0.1', {port}))\n"
        "        s.send(b'x')\n"
        "    except OSError:\n"
        "        pass\n"
        "    time.sleep(0.5)\n"
    )
    wheels = tmp_path / "wheels"  # only pytest and its dependencies: quicker to load
    wheels.mkdir()
    for wheel in wheels_314.glob("*.whl"):
        if wheel.name.split("-")[0] in ("pytest", "iniconfig", "packaging", "pluggy", "pygments"):
            (wheels / wheel.name).symlink_to(wheel)
    summary = tmp_path / "summary.json"
    try:
        done = run_runner("--runtime", "314", "--project", str(project), "--wheels", str(wheels),
                          "--summary-json", str(summary), "--", "-q", cwd=tmp_path)
        listener.settimeout(0.5)
        with pytest.raises(TimeoutError):  # nothing connected (the kernel would have queued it)
            listener.accept()[0].close()
    finally:
        listener.close()
    assert done.returncode == 1, done.stdout + done.stderr  # pytest's own code: tests failed
    assert done.stdout.splitlines()[-1] == "pyodide-314: 2 passed, 1 failed, 1 skipped"
    assert "assert 1 == 2" in done.stdout
    data = json.loads(summary.read_text())
    assert data["pyodide"] == "314.0.7" and data["python"].startswith("3.14.")
    assert data["exit_code"] == 1
    assert data["counts"]["passed"] == 2 and data["counts"]["failed"] == 1 and data["counts"]["skipped"] == 1
    assert data["startup_ms"] > 0 and data["suite_ms"] > 0
    assert not list(project.rglob("__pycache__")) and not (project / ".pytest_cache").exists()


def test_a_wheel_that_fails_to_load_fails_the_run(tmp_path: Path, wheels_314: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip archive")
    done = run_runner("--runtime", "028", "--wheels", str(wheels), "--", "-q", cwd=tmp_path)
    assert done.returncode == 70, done.stdout + done.stderr
    assert "failed to load wheels" in done.stderr and "broken" in done.stderr
    assert "passed" not in done.stdout  # pytest never ran
