"""A real restate-server for the tests (started by `scripts/services`) and the test service's process."""

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

from durable_agent.testing.services import service_url

INGRESS_VAR = "DURABLE_AGENT_TEST_RESTATE_INGRESS"
ADMIN_VAR = "DURABLE_AGENT_TEST_RESTATE_ADMIN"
SERVICE = Path(__file__).resolve().parent / "restate_service.py"


def restate_urls() -> tuple[str, str]:
    """(ingress, admin) of the test server; skips (fails under CI=true) without one."""
    ingress = service_url(INGRESS_VAR, "Restate (DURABLE_AGENT_SERVICES=restate)")
    return ingress, service_url(ADMIN_VAR, "Restate")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def admin_query(admin: str, sql: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(f"{admin}/query", data=json.dumps({"query": sql}).encode(), method="POST",
                                     headers={"content-type": "application/json", "accept": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return list(json.loads(answer.read())["rows"])


def ingress_call(ingress: str, service: str, key: str, handler: str, body: Any) -> Any:
    """Call a handler through the ingress and wait for its answer."""
    request = urllib.request.Request(f"{ingress}/{service}/{key}/{handler}", data=json.dumps(body).encode(),
                                     method="POST", headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


class ServiceProcess:
    """tests/restate_service.py in a process of its own, on a fixed port, registered with the server once."""

    def __init__(self, admin: str, ledger: Path, script: Path = SERVICE) -> None:
        self.admin, self.ledger, self.script = admin, ledger, script
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.registered = False

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(self.script), str(self.port), str(self.ledger)],
                                        stdout=subprocess.DEVNULL, stderr=open(self.ledger / "service.log", "ab"))
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the test service did not start: {(self.ledger / 'service.log').read_text()}")
                time.sleep(0.05)
        if not self.registered:
            body = json.dumps({"uri": f"http://127.0.0.1:{self.port}", "force": True}).encode()
            request = urllib.request.Request(f"{self.admin}/deployments", data=body, method="POST",
                                             headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=30):
                pass
            self.registered = True

    def wait_killed(self, timeout: float = 60) -> int:
        """Wait until the process ends (it SIGKILLs itself at a kill point); its return code."""
        assert self.process is not None
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
