"""Checkpoint store benchmark: per-step save cost, bytes stored, and load time, for every backend.

    scripts/services run -- .venv/bin/python benches/bench_stores.py [--quick]

The fixture: each step adds an assistant message with a tool call and a tool result (~3 KB,
so 800 steps are ~2.4 MB of history), and every step is saved. Reported side by side, from
one process, for each backend (and LangGraph's SqliteSaver as the anchor, when installed):

* save cost at steps 10, 100, 1,000 and 10,000 of a run. One run per mark is grown to that
  step by saving every step; then 30 rounds each save one more step of every run in turn,
  so a machine load that drifts during the benchmark hits every mark alike. Shown: the
  median per mark and the ratio last/first of the medians and of the minima (goal: flat,
  within 1.5x);
* bytes stored after 800 steps (only that run in the store) divided by the encoded size of
  its final checkpoint (goal: at most 1.5x for SQLite, Postgres and JSONL);
* load (resume) time of the run at 1,000 and 10,000 steps: median and minimum of LOAD_TIMES
  fresh-handle loads (on a shared, noisy machine the minimum is the stable figure).

The fsync-free variants (SQLite synchronous=NORMAL, JSONL fsync=False) show the stores' own
cost without the disk-flush latency, which on a shared disk varies more than the stores do.
Garbage collection is off while a backend runs (as in `timeit`), and the previous step's
history stays alive until after the next save, so freeing it is not billed to the store.
Postgres and Redis are included when DURABLE_AGENT_TEST_POSTGRES_URL / _REDIS_URL are set.
Durability settings are the stores' defaults (SQLite synchronous=FULL, JSONL fsync on, Postgres
fsync on, Redis without persistence: see the Redis store's docs), so the backends are not
equally durable: compare each with itself across steps, not with each other.
"""

from __future__ import annotations

import argparse
import gc
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from durable_agent import AgentCheckpoint, InMemoryCheckpointStore, Usage, serialize_checkpoint
from durable_agent._messages import History, extended

MARKS = (10, 100, 1_000, 10_000)
WINDOW = 30
BYTES_AT = 800
LOAD_AT = (1_000, 10_000)
LOAD_TIMES = 5
ANCHOR_MARKS = (10, 100)  # LangGraph writes ~1 GB by step 800: its deep run stops there
WORDS = "tool result observation alpha beta gamma delta epsilon zeta theta kappa lambda sigma".split()


def step_messages(step: int) -> list[dict[str, Any]]:
    """The two messages step `step` adds (~3 KB): deterministic, varied text, a tool round trip."""
    text = " ".join(WORDS[(step * 7 + i * 3) % len(WORDS)] + str((step * 31 + i) % 997) for i in range(180))
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": text[:600]},
                {
                    "type": "tool-call",
                    "tool_call_id": f"c{step}",
                    "tool_name": "search",
                    "input": {"q": text[:80]},
                },
            ],
        },
        {
            "role": "tool",
            "content": [
                {
                    "type": "tool-result",
                    "tool_call_id": f"c{step}",
                    "tool_name": "search",
                    "output": text,
                    "is_error": False,
                }
            ],
        },
    ]


def checkpoint(run_id: str, step: int, history: list[dict[str, Any]]) -> AgentCheckpoint:
    return AgentCheckpoint(
        run_id=run_id,
        step_index=step,
        status="running",
        messages=history,
        usage=Usage(100 * step, 20 * step, 120 * step),
        created_at=1_700_000_000_000 + step,
    )


class Backend:
    """How to open a store of one kind, and how many bytes it holds."""

    def __init__(self, name: str, open_store: Callable[[], Any], size: Callable[[], int | None]) -> None:
        self.name, self.open_store, self.size = name, open_store, size


def backends(tmp: Path) -> list[Backend]:
    from durable_agent.backends.jsonl import JsonlCheckpointStore
    from durable_agent.backends.sqlite import SqliteCheckpointStore

    memory = InMemoryCheckpointStore()

    def file_size(*paths: Path) -> int:
        return sum(p.stat().st_size for p in paths if p.exists())

    db, db2, jl, jl2 = tmp / "full.db", tmp / "normal.db", tmp / "fsync.jsonl", tmp / "nofsync.jsonl"
    found = [
        Backend("memory", lambda: memory, lambda: None),
        Backend(
            "sqlite synchronous=FULL",
            lambda: SqliteCheckpointStore(db),
            lambda: file_size(db, Path(f"{db}-wal")),
        ),
        Backend(
            "sqlite synchronous=NORMAL",
            lambda: SqliteCheckpointStore(db2, synchronous="NORMAL"),
            lambda: file_size(db2, Path(f"{db2}-wal")),
        ),
        Backend("jsonl fsync", lambda: JsonlCheckpointStore(jl), lambda: file_size(jl)),
        Backend("jsonl no fsync", lambda: JsonlCheckpointStore(jl2, fsync=False), lambda: file_size(jl2)),
    ]
    pg_url = os.environ.get("DURABLE_AGENT_TEST_POSTGRES_URL")
    if pg_url:
        found.append(postgres_backend(pg_url))
    redis_url = os.environ.get("DURABLE_AGENT_TEST_REDIS_URL")
    if redis_url:
        found.append(redis_backend(redis_url))
    return found


def postgres_backend(url: str) -> Backend:
    import psycopg
    from psycopg.conninfo import make_conninfo

    from durable_agent.backends.postgres import PostgresCheckpointStore

    schema = "bench_" + secrets.token_hex(4)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    conninfo = make_conninfo(url, options=f"-c search_path={schema}")

    def size() -> int:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("VACUUM durable_agent_runs")  # header rows are updated in place: count live data
            row = conn.execute(
                "SELECT pg_total_relation_size('durable_agent_runs') + pg_total_relation_size('durable_agent_messages')"
            ).fetchone()
        return int(row[0]) if row else 0

    return Backend("postgres", lambda: PostgresCheckpointStore(conninfo, max_size=2), size)


def redis_backend(url: str) -> Backend:
    import redis

    from durable_agent.backends.redis import RedisCheckpointStore

    prefix = f"bench{secrets.token_hex(4)}:"
    client = redis.Redis.from_url(url)

    def size() -> int:
        return sum(client.memory_usage(key) or 0 for key in client.scan_iter(match=prefix + "*"))

    return Backend("redis (memory)", lambda: RedisCheckpointStore(url, prefix=prefix), size)


def close(store: Any) -> None:
    if hasattr(store, "close") and not isinstance(store, InMemoryCheckpointStore):
        store.close()


class Runs:
    """The growing histories of the runs of one benchmark (a new list per step, as the loop builds them)."""

    def __init__(self) -> None:
        self.histories: dict[str, list[dict[str, Any]]] = {}

    def grow(self, run_id: str, step: int) -> list[dict[str, Any]]:
        history = self.histories.get(run_id) or History([{"role": "user", "content": "start the long task"}])
        for message in step_messages(step):  # as the agent loop builds a tool step's history: one append each
            history = extended(history, message)
        self.histories[run_id] = history
        return history


def measure(
    marks: tuple[int, ...],
    make: Callable[[str, int, list[dict[str, Any]]], Any],
    save: Callable[[Any], Any],
    at_step: Callable[[int, Any], None],
) -> dict[int, tuple[float, float]]:
    """Save cost at each of `marks`, measured so that a drifting machine load hits every mark alike.

    One run per mark is first grown to that many steps, saving at every step (the deepest run
    also goes to `BYTES_AT`, and `at_step(step, payload)` sees its every step). Then WINDOW
    rounds each save one more step of every run in turn, timed. Returns (median, min) per mark.
    """
    runs = Runs()
    alive: dict[str, Any] = {}  # each run's previous payload stays alive: freeing it is the caller's cost
    deepest = max(marks)
    deep_id = f"run-{deepest}" if deepest >= BYTES_AT else "deep"
    for step in range(1, max(deepest, BYTES_AT) + 1):
        payload = make(deep_id, step, runs.grow(deep_id, step))
        save(payload)
        alive[deep_id] = payload
        at_step(step, payload)
    for mark in marks:
        run_id = f"run-{mark}"
        if run_id == deep_id:
            continue
        for step in range(1, mark + 1):
            payload = make(run_id, step, runs.grow(run_id, step))
            save(payload)
            alive[run_id] = payload
    samples: dict[int, list[float]] = {mark: [] for mark in marks}
    perf = time.perf_counter
    for offset in range(1, WINDOW + 1):
        for mark in marks:
            run_id = f"run-{mark}"
            payload = make(run_id, mark + offset, runs.grow(run_id, mark + offset))
            t0 = perf()
            save(payload)
            samples[mark].append(perf() - t0)
            alive[run_id] = payload
    return {mark: (statistics.median(times), min(times)) for mark, times in samples.items()}


def run_backend(backend: Backend, marks: tuple[int, ...], final_size: dict[int, int]) -> dict[str, Any]:
    holder = [backend.open_store()]
    result: dict[str, Any] = {"load": {}}

    def at_step(step: int, cp: AgentCheckpoint) -> None:
        if step == BYTES_AT:
            close(holder[0])
            result["bytes"] = backend.size()
            final_size.setdefault(step, len(serialize_checkpoint(cp).encode()))
            holder[0] = backend.open_store()
        if step in LOAD_AT:
            result["load"][step] = time_load(backend, cp)

    result["cost"] = measure(marks, checkpoint, lambda cp: holder[0].save(cp), at_step)
    close(holder[0])
    return result


def time_load(backend: Backend, expected: AgentCheckpoint) -> tuple[float, float]:
    """(median, min) seconds of LOAD_TIMES loads of `expected`'s run, each from a freshly opened store."""
    times = []
    for _ in range(LOAD_TIMES):
        store = backend.open_store()
        t0 = time.perf_counter()
        loaded = store.load(expected.run_id)
        times.append(time.perf_counter() - t0)
        close(store)
        if loaded != expected:
            raise SystemExit(f"{backend.name}: the loaded checkpoint differs from the saved one")
    return statistics.median(times), min(times)


def langgraph_anchor(tmp: Path, marks: tuple[int, ...]) -> dict[str, Any] | None:
    """LangGraph's SqliteSaver.put() with the full history as the channel value, at every step."""
    try:
        import sqlite3

        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:
        return None
    path = tmp / "langgraph.db"
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    configs: dict[str, Any] = {}
    result: dict[str, Any] = {"load": {}}

    def make(run_id: str, step: int, history: list[dict[str, Any]]) -> tuple[str, int, Any]:
        cp = empty_checkpoint()
        cp["channel_values"] = {"messages": history}
        cp["channel_versions"] = {"messages": step}
        return run_id, step, cp

    def save(payload: tuple[str, int, Any]) -> None:
        run_id, step, cp = payload
        config = configs.get(run_id) or {"configurable": {"thread_id": run_id, "checkpoint_ns": ""}}
        configs[run_id] = saver.put(config, cp, {"source": "loop", "step": step}, {"messages": step})

    def at_step(step: int, payload: Any) -> None:
        if step == BYTES_AT:
            conn.commit()
            result["bytes"] = sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())

    result["cost"] = measure(marks, make, save, at_step)
    conn.close()
    return result


def report(results: dict[str, dict[str, Any]], final_size: dict[int, int], marks: tuple[int, ...]) -> None:
    print(
        f"\nper-step save cost: median of the {WINDOW} saves from each step, ms; last/first ratio of medians and of minima"
    )
    print(f"{'backend':<26}" + "".join(f"{'@' + str(m):>10}" for m in marks) + f"{'median':>9}{'min':>8}")
    for name, r in results.items():
        cost = r["cost"]
        cells = "".join(f"{cost[m][0] * 1e3:>10.3f}" if m in cost else f"{'-':>10}" for m in marks)
        last = max(cost)
        ratios = f"{cost[last][0] / cost[10][0]:>8.2f}x{cost[last][1] / cost[10][1]:>7.2f}x"
        print(f"{name:<26}{cells}{ratios}")
    size = final_size.get(BYTES_AT)
    if size:
        print(f"\nbytes stored after {BYTES_AT} steps vs the encoded final checkpoint ({size / 1e6:.2f} MB)")
        for name, r in results.items():
            if r.get("bytes"):
                print(f"{name:<26}{r['bytes'] / 1e6:>10.2f} MB {r['bytes'] / size:>9.2f}x")
    print(f"\nload (resume) time, ms: median (min) of {LOAD_TIMES} loads")
    print(f"{'backend':<26}" + "".join(f"{'@' + str(s):>17}" for s in LOAD_AT if s <= max(marks)))
    for name, r in results.items():
        if not r["load"]:
            continue
        cells = (f"{r['load'][s][0] * 1e3:.1f} ({r['load'][s][1] * 1e3:.1f})" for s in LOAD_AT if s in r["load"])
        print(f"{name:<26}" + "".join(f"{cell:>17}" for cell in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="marks up to 1,000 steps only")
    parser.add_argument("--only", default="", help="only the backends whose name contains this text (no anchor)")
    args = parser.parse_args()
    marks = tuple(m for m in MARKS if not args.quick or m <= 1_000)
    final_size: dict[int, int] = {}
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-stores-") as tmp:
        for backend in backends(Path(tmp)):
            if args.only not in backend.name:
                continue
            t0 = time.perf_counter()
            gc.collect()
            gc.disable()  # as timeit does: the benchmark's own growing heap must not bill its GC pauses to a store
            try:
                results[backend.name] = run_backend(backend, marks, final_size)
            finally:
                gc.enable()
            print(f"{backend.name}: done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        anchor = None if args.only else langgraph_anchor(Path(tmp), ANCHOR_MARKS)
        if anchor is not None:
            results["langgraph SqliteSaver"] = anchor
        elif not args.only:
            print("langgraph not installed: no SqliteSaver anchor", file=sys.stderr)
    report(results, final_size, marks)


if __name__ == "__main__":
    main()
