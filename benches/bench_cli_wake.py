"""How soon a serving process continues a run approved from the CLI, and what its watch of parked runs costs.

A real uvicorn server (tests/http_kit.py, the SQLite runtime) parks a run on an approval; the
``durable-agent runs approve --runtime`` subprocess stores the verdict; the time measured runs
from the CLI's exit to the run's ``completed`` status (``GET /runs/{id}`` polled every 10 ms;
nobody reads /events). The watch looks every `PARKED_CHECK_SECONDS` (0.5 s), so the wait is at
most that plus the resumed leg. The same again with the run parked by another server that is
SIGKILLed before the verdict: the measured server never saw the run and finds it in the shared
log (`EventLog.parked`). Then the cost of one round of the watch: one awakeable lookup per
parked run (`SqliteRuntime.find_awakeable`), timed over many parked runs, and the log's listing
of parked runs (`SqliteEventLog.parked`) with many runs in the log. Last, a stop sent to another
server than the one driving the run (``POST /runs/{id}/cancel``): from the request to the
``run_aborted`` event at a reader of the driving server (the model streams a word per 0.2 s, so
up to 0.2 s of it is the wait for the loop's next check).

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


def wake_ups(tmp: Path, *, elsewhere: bool) -> list[float]:
    """CLI approve -> completed on `server`; `elsewhere`: each run parked by a server SIGKILLed before the verdict."""
    db, ledger = tmp / f"agent-{elsewhere}.db", tmp / "ledger.jsonl"
    server = Server(db, ledger).start()
    waits = []
    try:
        for n in range(RUNS):
            parker = Server(db, ledger).start() if elsewhere else server
            _, _, body = parker.request("POST", "/runs", {"session_id": f"s-{n}", "prompt": "deploy it"})
            run_id = body["run_id"]
            leg1 = list(parker.events(f"/runs/{run_id}/events").frames())
            if elsewhere:
                parker.kill()
            approval = next(f.data for f in leg1 if f.data["type"] == "tool-approval-request")["approval_id"]
            done = cli("--runtime", f"sqlite:///{db}", "runs", "approve", run_id, approval)
            assert done.returncode == 0, done.stderr
            approved = time.perf_counter()
            while server.request("GET", f"/runs/{run_id}")[2]["status"] != "completed":
                time.sleep(0.01)
            waits.append(time.perf_counter() - approved)
    finally:
        server.stop()
    return waits


def remote_stops(tmp: Path) -> list[float]:
    """Seconds from ``POST /runs/{id}/cancel`` on server B to the ``run_aborted`` event at a reader of server A."""
    db, ledger = tmp / "stops.db", tmp / "ledger.jsonl"
    driver, other = Server(db, ledger, delay=0.2).start(), Server(db, ledger).start()
    waits = []
    try:
        for n in range(RUNS // 2):
            _, _, body = driver.request("POST", "/runs", {"session_id": f"stop-{n}", "prompt": "please lookup"})
            frames = driver.events(f"/runs/{body['run_id']}/events").frames()
            next(f for f in frames if f.data["type"] == "text-delta" and f.data["step_index"] == 2)
            asked = time.perf_counter()
            status, _, answer = other.request("POST", f"/runs/{body['run_id']}/cancel")
            assert status == 202 and answer["status"] == "stopping", answer
            next(f for f in frames if f.data["type"] == "error")
            waits.append(time.perf_counter() - asked)
    finally:
        driver.stop()
        other.stop()
    return waits


async def listing_cost(tmp: Path, runs: int) -> float:
    """Seconds for one `SqliteEventLog.parked()` with `runs` runs of 20 events in the log, one in 100 parked."""
    from durable_agent.http import SqliteEventLog

    log = SqliteEventLog(tmp / f"events-{runs}.db")
    try:
        for i in range(runs):
            await log.create_run(f"r{i}", "s", {})
            reason = "suspended" if i % 100 == 0 else "stop"
            await log.append(f"r{i}", [*((f"step/1/text/{k}", {"type": "text-delta", "text": "x"}) for k in range(19)),
                                       ("finish/1", {"type": "finish", "finish_reason": reason})])
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            listed = await log.parked()
            best = min(best, time.perf_counter() - start)
        assert len(listed) == runs // 100
        return best
    finally:
        log.close()


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


def _spread(waits: list[float]) -> str:
    return (f"min {min(waits) * 1000:.0f} ms, median {statistics.median(waits) * 1000:.0f} ms,"
            f" max {max(waits) * 1000:.0f} ms")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        print(f"CLI approve -> run completed, no reader ({RUNS} runs): {_spread(wake_ups(Path(tmp), elsewhere=False))}")
        print(f"the same, parked by another server SIGKILLed before the verdict: "
              f"{_spread(wake_ups(Path(tmp), elsewhere=True))}")
        cost = asyncio.run(round_cost(Path(tmp)))
        print(f"one watch round over {PARKED} parked runs (SQLite): {cost * 1000:.1f} ms")
        for runs in (1_000, 10_000):
            listing = asyncio.run(listing_cost(Path(tmp), runs))
            print(f"EventLog.parked() with {runs} runs in the log (SQLite): {listing * 1000:.2f} ms")
        print(f"cancel on another server -> run_aborted at the driver's reader ({RUNS // 2} runs): "
              f"{_spread(remote_stops(Path(tmp)))}")


if __name__ == "__main__":
    main()
