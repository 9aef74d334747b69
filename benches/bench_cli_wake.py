"""How soon a serving process continues a run approved from the CLI, and what its watch of parked runs costs.

A real uvicorn server (tests/http_kit.py, the SQLite runtime) parks a run on an approval; the
``durable-agent runs approve --runtime`` subprocess stores the verdict; the time measured runs
from the CLI's exit to the run's ``completed`` status (``GET /runs/{id}`` polled every 10 ms;
nobody reads /events). The watch looks every `PARKED_CHECK_SECONDS` (0.5 s), so the wait is at
most that plus the resumed leg. Then the cost of one round of the watch: one awakeable lookup
per parked run (`SqliteRuntime.find_awakeable`), timed over many parked runs.

Run: ``.venv/bin/python benches/bench_cli_wake.py`` (needs uvicorn).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests")]

from cli_kit import cli  # noqa: E402
from http_kit import Server  # noqa: E402

RUNS = 10
PARKED = 1000


def wake_ups(tmp: Path) -> list[float]:
    server = Server(tmp / "agent.db", tmp / "ledger.jsonl").start()
    waits = []
    try:
        for n in range(RUNS):
            _, _, body = server.request("POST", "/runs", {"session_id": f"s-{n}", "prompt": "deploy it"})
            run_id = body["run_id"]
            leg1 = list(server.events(f"/runs/{run_id}/events").frames())
            approval = next(f.data for f in leg1 if f.data["type"] == "tool-approval-request")["approval_id"]
            done = cli("--runtime", f"sqlite:///{tmp / 'agent.db'}", "runs", "approve", run_id, approval)
            assert done.returncode == 0, done.stderr
            approved = time.perf_counter()
            while server.request("GET", f"/runs/{run_id}")[2]["status"] != "completed":
                time.sleep(0.01)
            waits.append(time.perf_counter() - approved)
    finally:
        server.stop()
    return waits


async def round_cost(tmp: Path) -> float:
    """Seconds for one lookup of each of `PARKED` unresolved awakeables: a round of the watch with that many parked."""
    from durable_agent._storage.records import RunTransition
    from durable_agent._util import maybe_await
    from durable_agent.backends.sqlite import SqliteRuntime

    runtime = SqliteRuntime(str(tmp / "parked.db"))
    try:
        claim = await runtime.lease.claim("s", stale_at=0)
        assert claim.epoch is not None
        keys = [f"r{i}:1:approval/a{i}" for i in range(PARKED)]
        await runtime.commit(RunTransition("s", claim.epoch, awakeables=tuple((k, f"a{i}") for i, k in enumerate(keys))))
        first = await runtime.find_awakeable("s", keys[0])
        assert first is not None and not first.resolved
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for key in keys:
                await runtime.find_awakeable("s", key)
            best = min(best, time.perf_counter() - start)
        return best
    finally:
        await maybe_await(runtime.close())


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        waits = wake_ups(Path(tmp))
        print(f"CLI approve -> run completed, no reader ({RUNS} runs): min {min(waits) * 1000:.0f} ms,"
              f" median {statistics.median(waits) * 1000:.0f} ms, max {max(waits) * 1000:.0f} ms")
        cost = asyncio.run(round_cost(Path(tmp)))
        print(f"one watch round over {PARKED} parked runs (SQLite): {cost * 1000:.1f} ms")


if __name__ == "__main__":
    main()
