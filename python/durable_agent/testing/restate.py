"""A served agent's process for tests and benchmarks on a real restate-server (standard library only).

`scripts/services run` (with ``DURABLE_AGENT_SERVICES`` naming ``restate``) exports the server's
ingress and admin URLs; `restate_urls()` reads them (skip, or fail under CI=true, without).
`ServiceProcess` runs a script that serves agents (`durable_agent.restate.serve`) in a
process of its own — so a test can SIGKILL it — and registers it with the server once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from .processes import stop_process

INGRESS_VAR = "DURABLE_AGENT_TEST_RESTATE_INGRESS"
ADMIN_VAR = "DURABLE_AGENT_TEST_RESTATE_ADMIN"


def restate_urls() -> tuple[str, str]:
    """(ingress, admin) of the test server; skips (fails under CI=true) without one."""
    from .services import service_url

    ingress = service_url(INGRESS_VAR, "Restate (DURABLE_AGENT_SERVICES=restate)")
    return ingress, service_url(ADMIN_VAR, "Restate")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: Any, headers: dict[str, str] | None = None, timeout: float = 120) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        text = answer.read()
    return json.loads(text) if text else None


def admin_query(admin: str, sql: str) -> list[dict[str, Any]]:
    """Rows of a SQL query on the server's introspection tables (``sys_invocation``, ``sys_journal``...)."""
    return list(_post(f"{admin}/query", {"query": sql}, {"accept": "application/json"}, 10)["rows"])


def ingress_call(ingress: str, service: str, key: str, handler: str, body: Any) -> Any:
    """Call a Virtual Object's handler through the ingress and wait for its answer."""
    return _post(f"{ingress}/{service}/{key}/{handler}", body)


class ServiceProcess:
    """``python SCRIPT PORT WORKDIR`` in a process of its own, on a fixed port, registered once."""

    def __init__(self, admin: str, workdir: Path, script: Path) -> None:
        self.admin, self.workdir, self.script = admin, Path(workdir), Path(script)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.registered = False

    def start(self, timeout: float = 30) -> float:
        """Start the process and wait until it listens (registering it the first time); seconds taken."""
        began = time.monotonic()
        with open(self.workdir / "service.log", "ab") as log:
            self.process = subprocess.Popen([sys.executable, str(self.script), str(self.port), str(self.workdir)],
                                            stdout=subprocess.DEVNULL, stderr=log)
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() - began > timeout:
                    raise RuntimeError(
                        f"the service did not start: {(self.workdir / 'service.log').read_text()}"
                    ) from None
                time.sleep(0.01)
        if not self.registered:
            _post(f"{self.admin}/deployments", {"uri": f"http://127.0.0.1:{self.port}", "force": True})
            self.registered = True
        return time.monotonic() - began

    def wait_killed(self, timeout: float = 60) -> int:
        """Wait until the process ends (e.g. it SIGKILLed itself at a kill point); its return code."""
        assert self.process is not None
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        stop_process(self.process)
