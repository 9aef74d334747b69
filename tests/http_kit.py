"""A real uvicorn server process and a real HTTP client (stdlib http.client) for the endpoint tests."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_agent.testing.processes import stop_process

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """``uvicorn --factory http_server_app:create`` on a free port, over `db`; `kill()` is a SIGKILL.

    `app` (a ``module:attribute`` in `app_dir`, a factory unless `factory=False`) serves another app;
    the process runs in `db`'s directory.
    """

    db: Path
    ledger: Path
    delay: float = 0.0
    postgres: str | None = None  # a conninfo: serve on the Postgres runtime and event log
    origin: str | None = None  # a browser origin the CORS allows besides http://allowed.example
    app: str = "http_server_app:create"
    app_dir: Path = ROOT / "tests"
    factory: bool = True
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def start(self) -> Server:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "HTTP_TEST_DB": str(self.db),
               "HTTP_TEST_LEDGER": str(self.ledger), "HTTP_TEST_DELAY": str(self.delay),
               "HTTP_TEST_POSTGRES": self.postgres or "", "HTTP_TEST_ORIGIN": self.origin or ""}
        self.log = self.db.with_name(f"server-{self.port}.log")
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", *(["--factory"] if self.factory else []), self.app, "--app-dir",
                 str(self.app_dir), "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.db.parent,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the server did not start listening")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        stop_process(self.process)

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                raw: bytes | None = None) -> tuple[int, dict[str, str], Any]:
        """One request; the JSON body decoded (None when empty)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            conn.request(method, path, body=payload, headers={"content-type": "application/json", **(headers or {})})
            response = conn.getresponse()
            data = response.read()
            heads = {k.lower(): v for k, v in response.getheaders()}
            return response.status, heads, json.loads(data) if data else None
        finally:
            conn.close()

    def events(self, path: str, headers: dict[str, str] | None = None) -> EventStream:
        return EventStream(self.port, path, headers or {})


@dataclass
class Frame:
    id: str | None
    data: Any


@dataclass
class EventStream:
    """A GET of a server-sent event stream, read frame by frame; `close()` drops the connection."""

    port: int
    path: str
    headers: dict[str, str]
    status: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        self._conn.request("GET", self.path, headers=self.headers)
        self._response = self._conn.getresponse()
        self.status = self._response.status
        self.response_headers = {k.lower(): v for k, v in self._response.getheaders()}

    def frames(self) -> Iterator[Frame]:
        """Every frame until the server ends the stream, or the connection drops (comments skipped).

        Read through the response, which decodes the chunked body: its end is the stream's end. (Reading
        the socket under it would also take the chunk sizes for lines, and wait past the end until the
        server closes the kept-alive connection: uvicorn's 5 s.)
        """
        event_id: str | None = None
        data: list[str] = []
        while True:
            try:
                line = self._response.readline()
            except http.client.IncompleteRead:  # the server died mid-stream
                return
            if not line:
                return
            text = line.decode("utf-8").rstrip("\r\n")
            if text == "":
                if data:
                    joined = "\n".join(data)
                    yield Frame(event_id, joined if joined == "[DONE]" else json.loads(joined))
                event_id, data = None, []
            elif text.startswith("id: "):
                event_id = text[4:]
            elif text.startswith("data: "):
                data.append(text[6:])

    def close(self) -> None:
        if self._conn.sock is not None:
            self._conn.sock.close()  # drop the TCP connection mid-stream
        self._conn.close()
