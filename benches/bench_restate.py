"""The journal's replay mode on Restate next to the checkpoint-mode runtimes and DBOS, side by side.

* per-step overhead: the same N-step agent (bench_journal.py's: a scripted model calling one
  tool per step), one run, on the SQLite runtime, the Postgres runtime, a DBOS workflow on
  SQLite, and served on Restate (`durable_agent.restate`, called through the ingress);
* restart-to-resumed after a SIGKILL: the served process kills itself inside a tool; a new
  process is started at once; the time from the kill to the run's next model request in the
  new process (process start, Restate's retry, the replay of the journal), best of `--repeat`.

Needs a restate-server: run it under the services script, e.g.

    DURABLE_AGENT_SERVICES="postgres restate" scripts/services run -- .venv/bin/python benches/bench_restate.py

(Postgres from DURABLE_AGENT_TEST_POSTGRES_URL or DURABLE_AGENT_BENCH_POSTGRES_URL; DBOS when
installed, see benches/requirements.txt; the rows without theirs are left out and say so.)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import per_step, print_header, print_rows
from bench_journal import DbosAnchor, agent_run

from durable_agent.restate import RestateIngress
from durable_agent.testing.restate import ADMIN_VAR, INGRESS_VAR, ServiceProcess

SERVICE = Path(__file__).resolve().parent / "_restate_service.py"
ANCHOR = "DBOS workflow on SQLite"


def checkpoint_runtimes(tmp: str) -> dict[str, Callable[[], Any]]:
    from durable_agent.backends.sqlite import SqliteRuntime

    path = str(Path(tmp) / "journal.db")
    factories: dict[str, Callable[[], Any]] = {"Agent + SQLite runtime": lambda: SqliteRuntime(path)}
    url = os.environ.get("DURABLE_AGENT_BENCH_POSTGRES_URL") or os.environ.get("DURABLE_AGENT_TEST_POSTGRES_URL")
    if url:
        from durable_agent.backends.postgres import PostgresRuntime

        factories["Agent + Postgres runtime"] = lambda: PostgresRuntime(url)
    else:
        print("no Postgres URL: the Postgres row is left out")
    return factories


def restate_run(ingress: RestateIngress, steps: int) -> None:
    result = asyncio.run(ingress.run(f"b-{uuid.uuid4().hex}", f"go {steps}"))
    assert result["steps"] == steps, result


def restart_to_resumed(service: ServiceProcess, ingress: str, workdir: Path) -> tuple[float, float]:
    """(kill → resumed, of which: new process start to listening), seconds, for one run of 10 steps."""
    for name in ("killed", "resumed"):
        (workdir / name).unlink(missing_ok=True)
    client = RestateIngress(ingress, name="crash")
    invocation = asyncio.run(client.send(f"c-{uuid.uuid4().hex}", "go 10"))
    service.wait_killed()
    started = service.start()
    result = asyncio.run(client.output(invocation))
    assert result["steps"] == 10, result
    return float((workdir / "resumed").read_text()) - float((workdir / "killed").read_text()), started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", default="10,100")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ingress, admin = os.environ.get(INGRESS_VAR), os.environ.get(ADMIN_VAR)
    if not ingress or not admin:
        sys.exit("no restate-server: run under DURABLE_AGENT_SERVICES=restate scripts/services run -- ...")
    with tempfile.TemporaryDirectory() as tmp:
        service = ServiceProcess(admin, Path(tmp), SERVICE)
        service.start()
        anchor = DbosAnchor() if importlib.util.find_spec("dbos") is not None else None
        try:
            dbos = None if anchor is None else anchor.on(f"sqlite:///{tmp}/dbos.sqlite")
            if dbos is None:
                print("DBOS is not installed: pip install dbos (bench only); its row is left out")
            client = RestateIngress(ingress, name="bench")
            restate_run(client, 2)  # warm: the first call of a deployment
            print_header(32, "Agent + SQLite runtime", "DBOS")
            for steps in (int(s) for s in args.steps.split(",")):
                rows: dict[str, float] = {}
                for name, factory in checkpoint_runtimes(tmp).items():
                    rows[name] = per_step(steps, args.repeat, lambda factory=factory: agent_run(steps, factory))
                if dbos is not None:
                    rows[ANCHOR] = per_step(steps, args.repeat, lambda: dbos(steps))
                rows["Agent on Restate (ingress)"] = per_step(steps, args.repeat, lambda: restate_run(client, steps))
                print_rows(steps, rows, 32, "Agent + SQLite runtime", ANCHOR)
            timings = [restart_to_resumed(service, ingress, Path(tmp)) for _ in range(args.repeat)]
            best = min(timings)
            print(f"\nrestart-to-resumed after a SIGKILL (best of {args.repeat}): {best[0] * 1000:.0f} ms "
                  f"(new process listening after {best[1] * 1000:.0f} ms; the rest is Restate's retry and the "
                  f"replay of the journal); all: {', '.join(f'{t * 1000:.0f}' for t, _ in timings)} ms")
        finally:
            service.stop()
            if anchor is not None:
                anchor.close()


if __name__ == "__main__":
    main()
