"""Recorded provider traffic, replayed: an in-memory transport (pure, runs under Pyodide) and a
local HTTP server on 127.0.0.1 (real sockets, host only).

A recording (``tests/recordings/<api>/<name>.http``) is an HTTP response as bytes: a status
line, header lines, a blank line, then the body exactly as the provider streams it. Headers
starting with ``x-replay-`` direct the replay and are never sent:

* ``x-replay-cut: true`` — the connection is dropped after the body, without ending the
  chunked encoding (a stream cut by the network);
* ``x-replay-stall: <seconds>`` — the server goes silent that long after the first chunk;
* ``x-replay-hang-up: true`` — the server closes the connection after a complete response,
  without saying so (a kept-alive connection the server dropped while it sat idle).

The body is sent in small chunks (`CHUNK` bytes), so events, JSON and UTF-8 sequences split
across chunk boundaries as they do on a real network. `ReplayServer.hold` pauses one response
part-way (a test kills its client mid-stream), and each request is kept with the time it arrived;
`connections` counts the connections it accepted and `open_connections` those still open.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from durable_agent.providers import HttpRequest, HttpResponse
from helpers import wall_clock_ms

RECORDINGS = Path(__file__).resolve().parent / "recordings"
CHUNK = 37
HOLD_LIMIT = 30.0  # seconds a held response waits for its release at most, so a forgotten hold cannot hang


@dataclass(frozen=True)
class Recording:
    status: int
    headers: dict[str, str]
    body: bytes
    directives: dict[str, str]

    def pieces(self, size: int = CHUNK) -> list[bytes]:
        return [self.body[i : i + size] for i in range(0, len(self.body), size)]


def load(name: str) -> Recording:
    """``load("openai_chat/text")``: a recording, parsed."""
    raw = (RECORDINGS / f"{name}.http").read_bytes()
    head, _, body = raw.partition(b"\n\n")
    status_line, *lines = head.decode("ascii").split("\n")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    directives: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        (directives if key.lower().startswith("x-replay-") else headers)[key.strip().lower()] = value.strip()
    return Recording(status, headers, body, directives)


@dataclass
class ReplayTransport:
    """An in-memory transport serving recordings in order (the last one repeats); keeps the requests."""

    names: list[str]
    chunk: int = CHUNK
    requests: list[HttpRequest] = field(default_factory=list)

    async def handle_async_request(self, request: HttpRequest) -> HttpResponse:
        recording = load(self.names[min(len(self.requests), len(self.names) - 1)])
        self.requests.append(request)

        async def stream() -> AsyncIterator[bytes]:
            for piece in recording.pieces(self.chunk):
                yield piece
            if recording.directives.get("x-replay-cut") == "true":
                raise ConnectionError("connection reset by peer (replayed)")

        async def aclose() -> None:
            return None

        return HttpResponse(recording.status, recording.headers, stream(), aclose)

    def bodies(self) -> list[Any]:
        return [json.loads(r.body) for r in self.requests]


@dataclass
class Hold:
    """One response paused part-way: `reached` is set once `after` chunks of its body are sent;
    the rest follows when `release()` is called (the client may be gone by then)."""

    after: int
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client dropping its kept-alive connection is not news; a real fault fails the test


class ReplayServer:
    """A threaded HTTP server on 127.0.0.1. The first path segment of a request names the
    recordings to serve, comma-separated, ``/`` replaced by ``~``, then ``@`` and a nonce
    (``openai_chat~tools,openai_chat~text@3``): the n-th request under that segment gets the n-th
    recording (the last repeats). `base_url` builds such URLs. Each request is kept with its
    arrival time (``at``, epoch ms on the library's wall clock)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._counts: dict[str, int] = {}
        self._holds: dict[tuple[str, int], Hold] = {}
        self._urls = 0
        self._lock = threading.Lock()
        self.connections = 0
        self.open_connections = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # as providers stream: else each small chunk waits for a delayed ACK

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server.connections += 1
                    server.open_connections += 1

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    with server._lock:
                        server.open_connections -= 1

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                at = wall_clock_ms()
                segment = self.path.lstrip("/").split("/", 1)[0]
                with server._lock:
                    n = server._counts.get(segment, 0)
                    server._counts[segment] = n + 1
                    server.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                            "body": json.loads(body) if body else None, "at": at})
                    hold = server._holds.get((segment, n))
                names = segment.split("@")[0].split(",")
                recording = load(names[min(n, len(names) - 1)].replace("~", "/"))
                self.send_response(recording.status)
                for key, value in recording.headers.items():
                    self.send_header(key, value)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                stall = float(recording.directives.get("x-replay-stall", 0))
                for i, piece in enumerate(recording.pieces()):
                    if hold is not None and i == hold.after:
                        hold.reached.set()
                        hold.released.wait(HOLD_LIMIT)
                    self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.flush()
                    if i == 0 and stall:
                        threading.Event().wait(stall)
                if recording.directives.get("x-replay-cut") == "true":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                if recording.directives.get("x-replay-hang-up") == "true":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def base_url(self, *names: str, suffix: str = "/v1") -> str:
        """A base URL serving `names` in order, counted apart from every other base URL."""
        with self._lock:
            self._urls += 1
            nonce = self._urls
        return f"http://127.0.0.1:{self.port}/{','.join(n.replace('/', '~') for n in names)}@{nonce}{suffix}"

    def hold(self, base_url: str, request: int, after: int) -> Hold:
        """Pause the `request`-th response (0-based) under `base_url` once `after` chunks of its body are sent."""
        held = Hold(after)
        with self._lock:
            self._holds[(base_url.split("/")[3], request)] = held
        return held

    def requests_to(self, base_url: str) -> list[dict[str, Any]]:
        """The requests received under `base_url` (from `base_url()`), in order."""
        segment = base_url.split("/")[3]
        return [r for r in self.requests if r["path"].split("/")[1] == segment]

    def __enter__(self) -> ReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
