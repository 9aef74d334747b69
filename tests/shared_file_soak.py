"""The README's server setup on one SQLite file, soaked (tests/test_shared_file_soak.py, benches/soak_shared_file.py).

On one file: two uvicorn servers of tests/http_server_app.py, each with a `SqliteRuntime` and a
`SqliteEventLog` on it as the README's app.py has them (a second server is what a second
uvicorn worker is); a torture worker (tests/torture_worker.py) driving sessions of its own; a
`durable-agent` CLI process per command (``runs list/show/approve/deny/prune``). Each round
starts a run on a server and settles it one way (`ROUNDS`): over HTTP, by a CLI verdict that
a server's reader then carries on, or with the slow server SIGKILLed in a tool, right after the
start or after a CLI verdict, the other server taking the run over and the killed one started
again. After each round a CLI process shows the run; halfway, ``runs prune`` deletes the runs of
the first rounds. At the end every server is SIGKILLed and a fresh process reads the file.

Every list of `Findings` must be empty:

* `lost`: a run a server reported completed that a fresh process (the CLI at once, or a reader
  after the last SIGKILL) does not see completed;
* `not_pruned`: a run ``runs prune`` did not delete, or reported deleted and a server or the
  fresh process still has;
* `twice`: a tool effect (a ticket) in the ledger more than once; `wrong_effects`: an approved
  deploy that never ran, or a denied one that did;
* `io_errors`: "disk I/O error" or a damaged file in the output of any process;
* `failed`: a round that could not go on: a server refused a call, a CLI command failed, or a run
  did not reach the status awaited within `WAIT_S`;
* `worker`: what the torture worker's own checks (`torture_supervisor.check`) found.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torture_supervisor
from cli_kit import cli
from durable_agent.backends.sqlite import SqliteCheckpointStore
from http_kit import Server

ROUNDS = ("http-approve", "cli-approve", "kill-in-tool", "cli-deny", "kill-after-start", "kill-after-cli-verdict",
          "lookup")
FIRST = 2  # rounds of plain lookups before the worker starts: what the prune deletes
WAIT_S = 30.0
DAMAGE = ("disk I/O error", "database disk image is malformed", "file is not a database")
WORKER_SESSIONS = ["w-0", "w-1"]


class RoundFailed(Exception):
    """A round cannot go on; what happened goes to `Findings.failed`."""


@dataclass
class Findings(torture_supervisor.Checked):
    """What the soak found (see the module docs); every list must be empty."""

    lost: list[str] = field(default_factory=list)
    not_pruned: list[str] = field(default_factory=list)
    twice: list[Any] = field(default_factory=list)
    wrong_effects: list[str] = field(default_factory=list)
    io_errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    worker: list[str] = field(default_factory=list)
    runs: int = 0
    kills: int = 0
    cli_calls: int = 0
    seconds: float = 0.0


@dataclass
class Soak:
    """One soak in `workdir`: `run(cycles)` plays `ROUNDS` `cycles` times and returns the findings.

    `worker_prompts`: the runs of each torture worker session (it works alongside, at its own pace).
    """

    workdir: Path
    worker_prompts: int = 3
    found: Findings = field(default_factory=Findings)
    completed: list[str] = field(default_factory=list)  # runs a server reported completed
    pruned: set[str] = field(default_factory=set)
    approved: dict[str, bool] = field(default_factory=dict)  # deploy ticket -> approved
    outputs: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.db, self.ledger = self.workdir / "agent.db", self.workdir / "ledger.jsonl"
        self.url = f"sqlite:///{self.db}"
        # the slow server: a tool takes 0.4 s, long enough to be killed in it; the fast one takes runs over
        self.servers = [Server(self.db, self.ledger, delay=0.02), Server(self.db, self.ledger)]

    def run(self, cycles: int) -> Findings:
        began = time.monotonic()
        worker: subprocess.Popen[bytes] | None = None
        worker_log = self.workdir / "worker.log"
        try:
            for server in self.servers:
                server.start()
            first = [self.play(i, "lookup") for i in range(FIRST)]
            before = int(time.time() * 1000) + 1
            time.sleep(0.01)  # every later checkpoint is saved after `before`
            with open(worker_log, "wb") as out:
                worker = subprocess.Popen(
                    [sys.executable, str(torture_supervisor.WORKER), f"sqlite:{self.db}",
                     str(self.workdir / "worker-ledger.jsonl"), str(self.worker_prompts), *WORKER_SESSIONS],
                    stdout=out, stderr=subprocess.STDOUT)
            plan = [kind for _ in range(cycles) for kind in ROUNDS]
            for i, kind in enumerate(plan, FIRST):
                self.play(i, kind)
                try:
                    if i == FIRST + len(plan) // 2:
                        self.prune(before, [r for r in first if r is not None])
                    if i % 3 == 0:
                        self.check_listed()
                except RoundFailed as exc:
                    self.found.failed.append(f"after round {i}: {exc}")
            try:
                worker.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                self.found.failed.append("the torture worker did not finish its sessions")
        finally:
            for server in self.servers:
                if server.process is not None:
                    server.kill()  # the harshest end: nothing flushed, nothing closed
            if worker is not None and worker.poll() is None:
                worker.kill()
                worker.wait()
        self.check_on_disk()
        worker_found = asyncio.run(torture_supervisor.check(f"sqlite:{self.db}", self.workdir / "worker-ledger.jsonl",
                                                            WORKER_SESSIONS, self.worker_prompts))
        self.found.worker = [f"{name}: {value}" for name, value in worker_found.failures.items()]
        self.outputs += [worker_log.read_text(errors="replace")]
        self.outputs += [p.read_text(errors="replace") for p in self.workdir.glob("server-*.log")]
        self.found.io_errors = [line for text in self.outputs for line in text.splitlines()
                                if any(d in line for d in DAMAGE)]
        self.found.seconds = round(time.monotonic() - began, 1)
        return self.found

    # ------------------------------------------------------------ rounds

    def play(self, i: int, kind: str) -> str | None:
        """Round `i`: the id of its run once a server reported it completed; None when the round failed."""
        self.found.runs += 1
        try:
            return self.round(i, kind)
        except RoundFailed as exc:
            self.found.failed.append(f"round {i} ({kind}): {exc}")
            return None

    def round(self, i: int, kind: str) -> str:
        """Start a run and settle it as `kind` says (see the module docs)."""
        slow, fast = self.servers
        here, there = (slow, fast) if i % 2 == 0 else (fast, slow)
        session, ticket = f"s-{i}", f"#{i}"
        if kind == "lookup":
            return self.finish(here, self.start(here, session, f"please lookup {ticket}"))
        if kind == "kill-after-start":
            run_id = self.start(slow, session, f"please lookup {ticket}")
            self.kill(slow)
            return self.finish(fast, run_id, take_over=True)
        server = slow if kind == "kill-in-tool" else fast if kind == "kill-after-cli-verdict" else here
        run_id = self.start(server, session, f"deploy {ticket}")
        (request,) = self.wait(server, run_id, "suspended")["pending_approvals"]
        self.approved[ticket] = kind != "cli-deny"
        if kind in ("http-approve", "kill-in-tool"):
            self.http(server, "POST", f"/runs/{run_id}/approvals", 202, {
                "approval_id": request["approval_id"], "approved": True, "token": request["token"]})
            if kind == "http-approve":
                return self.finish(server, run_id)
            deadline = time.monotonic() + WAIT_S
            while ticket not in self.effects():  # the deploy started: kill the server in it
                if time.monotonic() > deadline:
                    raise RoundFailed(f"{run_id}: the approved deploy did not start")
                time.sleep(0.01)
            self.kill(server)
            return self.finish(fast, run_id, take_over=True)
        self.cli("runs", "approve" if self.approved[ticket] else "deny", run_id, request["approval_id"])
        if kind == "kill-after-cli-verdict":
            self.kill(server)
            return self.finish(server, run_id, take_over=True)  # the same server, started again
        return self.finish(there, run_id, take_over=True)

    def start(self, server: Server, session: str, prompt: str) -> str:
        return str(self.http(server, "POST", "/runs", 201, {"session_id": session, "prompt": prompt})["run_id"])

    def kill(self, server: Server) -> None:
        server.kill()
        self.found.kills += 1
        server.start()

    def finish(self, server: Server, run_id: str, *, take_over: bool = False) -> str:
        """Wait until `server` reports `run_id` completed, then check a fresh CLI process sees it completed too.

        `take_over`: a reader of the events after the last one logged makes the server carry the run on.
        """
        reader = None
        if take_over:
            last = self.http(server, "GET", f"/runs/{run_id}", 200)["last_event_id"]
            reader = server.events(f"/runs/{run_id}/events", {"last-event-id": str(last)})
        try:
            self.wait(server, run_id, "completed")
        finally:
            if reader is not None:
                reader.close()
        self.completed.append(run_id)
        shown = self.cli("runs", "show", run_id)["checkpoint"]["status"]
        if shown != "completed":
            self.found.lost.append(f"{run_id}: a server reported completed, a CLI process at once saw {shown}")
        return run_id

    def wait(self, server: Server, run_id: str, status: str) -> dict[str, Any]:
        """The server's view of `run_id` once it shows `status`."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            view = self.http(server, "GET", f"/runs/{run_id}", 200)
            if view["status"] == status:
                return dict(view)
            time.sleep(0.02)
        raise RoundFailed(f"{run_id}: not {status} after {WAIT_S} s")

    def http(self, server: Server, method: str, path: str, expect: int, body: Any = None) -> Any:
        status, _, answer = server.request(method, path, body)
        if status != expect:
            raise RoundFailed(f"{method} {path}: {status} {answer}")
        return answer

    # ------------------------------------------------------------ the CLI and the checks

    def cli(self, *args: str) -> Any:
        """A CLI command on the runtime's URL, its JSON output (its error output kept for the checks)."""
        self.found.cli_calls += 1
        done = cli("--runtime", self.url, "--json", *args)
        self.outputs.append(done.stderr)
        if done.returncode != 0:
            raise RoundFailed(f"durable-agent {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
        return json.loads(done.stdout)

    def prune(self, before: int, first: list[str]) -> None:
        deleted = set(self.cli("runs", "prune", "--before", str(before), "--status", "completed")["deleted"])
        if deleted != set(first):
            self.found.not_pruned.append(f"runs prune deleted {sorted(deleted)}, wanted {sorted(first)}")
        self.pruned |= deleted
        for run_id in sorted(deleted):
            for server in self.servers:
                status, _, _ = server.request("GET", f"/runs/{run_id}")
                if status != 404:
                    self.found.not_pruned.append(f"{run_id}: pruned, and a server still answers {status}")

    def check_listed(self) -> None:
        statuses = {r["run_id"]: r["status"] for r in self.cli("runs", "list")}
        self.found.lost += [f"{run_id}: completed, and runs list shows {statuses.get(run_id)}"
                            for run_id in self.completed if run_id not in self.pruned
                            and statuses.get(run_id) != "completed"]

    def effects(self) -> list[str]:
        """The tickets of the tool effects in the ledger so far (a line still being written left out)."""
        lines = self.ledger.read_text().split("\n")[:-1] if self.ledger.exists() else []
        return [json.loads(line)[1].get("ticket", "") for line in lines]

    def check_on_disk(self) -> None:
        """A fresh process, after the last SIGKILL of every server: every completed run is there, the pruned are not."""
        with SqliteCheckpointStore(self.db) as store:
            for run_id in self.completed:
                stored = store.load(run_id)
                if run_id in self.pruned:
                    if stored is not None:
                        self.found.not_pruned.append(f"{run_id}: pruned, and still on disk")
                elif stored is None or stored.status != "completed":
                    self.found.lost.append(f"{run_id}: completed, and on disk {stored and stored.status}")
        counts = Counter(self.effects())
        self.found.twice = sorted((ticket, n) for ticket, n in counts.items() if n > 1)
        self.found.wrong_effects = [f"deploy {ticket}: approved={ok}, ran {counts[ticket]} times"
                                    for ticket, ok in self.approved.items() if counts[ticket] != int(ok)]
