"""Many durable runs on one event loop: throughput, event-loop lag, commits per step, peak memory.

N sessions run at once in one process, each 10 steps (a model call of 20 ms latency, then one
tool call), side by side with the same agent and no durability. Each variant runs in a fresh
subprocess (so peak RSS is its own):

* ``none``: `generate_text` without a store;
* ``sqlite-store``: `generate_text` with a `SqliteCheckpointStore` (checkpoints only, each
  save a transaction on the event loop's thread); ``sqlite-store-async``: the same with an
  `AsyncSqliteCheckpointStore` (saves on its connection's thread, concurrent saves in one commit);
* ``memory``, ``sqlite``, ``postgres``: `Agent` on the memory, SQLite and Postgres runtimes
  (Postgres when DURABLE_AGENT_BENCH_POSTGRES_URL is set);
* ``dbos``: an anchor, the same agent as DBOS async workflows on SQLite (``pip install dbos``);
* ``langgraph-sqlite``, ``langgraph-postgres``: anchors, the same agent as a LangGraph graph (a model
  node and a tool node, one ``thread_id`` per session) checkpointed by ``AsyncSqliteSaver``
  (``pip install langgraph-checkpoint-sqlite``) and ``AsyncPostgresSaver`` (``pip install
  langgraph-checkpoint-postgres``; when DURABLE_AGENT_BENCH_POSTGRES_URL is set), each opened with
  ``from_conn_string``: one connection behind the saver's lock. Invoked with ``durability="sync"``
  (each super-step on disk before the next starts, as our runtimes; LangGraph's default ``"async"``
  overlaps the write with the next step). One of our steps is two super-steps (model, tool; the
  last step has no tool), each a commit of the task's writes (``aput_writes``) and one of the
  checkpoint (``aput``, the whole message list): with the input's checkpoint and the ``__start__``
  task's writes and checkpoint, 41 commits per 10-step run (4.1 per step). Commits count those calls.

A variant whose package is missing prints a one-line skip naming it.

Loop lag: a ticker sleeping 5 ms measures how late it wakes (p50 / p99 / max). Commits: the
transactions a runtime or store wrote, per step. Statements: the SQL statements the SQLite
runtime's connection ran, per step (BEGIN and COMMIT included; each one is a GIL hand-off between
its thread and the event loop's). Wakes: the times another thread handed the event loop work
(`call_soon_threadsafe`, each a wake-up of its selector), per step: a group-commit writer settles a whole
batch's waiters in one. CPU: the process's CPU time (every thread) per step.

With ``sqlite`` among the variants, a last line prices one run alone: the SQLite runtime's
per-step overhead over no durability (N=1, median of 5 runs each) as a multiple of the measured
cost of one commit on the same disk (WAL, ``synchronous=FULL`` as the runtime, one small row).

    .venv/bin/python benches/bench_concurrency.py [--n 1,10,100,1000] [--variants none,sqlite,langgraph-sqlite]
        [--against OTHER_CHECKOUT] [--gc 50000,20,100]

``--gc`` sets the cyclic collector's thresholds (`gc.set_threshold`) in every variant: at N=1,000
the collector is a third or more of every variant's time, and a server holding that many runs
may raise them (README, "Operate it").

Each row's "wall vs none" divides by a ``none`` run made just before that row, so a load that
drifts on a shared machine does not enter the ratio. ``--against`` runs every variant but ``none``
a second time on another checkout's package (its ``python/``), in the same run, one row after the
other: a change's before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.metadata
import json
import operator
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

TREE = os.environ.get("DURABLE_AGENT_BENCH_TREE") or str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(Path(TREE) / "python"))

from durable_agent import (  # noqa: E402
    Agent,
    DurableOptions,
    MemoryRuntime,
    ModelRequest,
    Tool,
    Usage,
    generate_text,
)

STEPS = 10
LATENCY_S = 0.020
TOOLS = {"noop": Tool(parameters={"type": "object"}, execute=lambda args: "ok")}
VARIANTS = ("none", "sqlite-store", "sqlite-store-async", "memory", "sqlite", "postgres", "dbos",
            "langgraph-sqlite", "langgraph-postgres")
NEEDS = {"dbos": "dbos", "langgraph-sqlite": "langgraph-checkpoint-sqlite",
         "langgraph-postgres": "langgraph-checkpoint-postgres"}  # variant -> the package it imports


class SlowModel:
    """A model with a fixed latency: a tool call for the first STEPS-1 turns, then an answer."""

    model_id = "slow"

    async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
        await asyncio.sleep(LATENCY_S)
        turn = sum(1 for m in request.messages if m["role"] == "tool")
        if turn < STEPS - 1:
            yield {"type": "tool-call", "tool_call_id": f"c{turn}", "tool_name": "noop", "input": {"i": turn}}
            yield {"type": "finish", "finish_reason": "tool-calls", "usage": Usage(10, 5, 15)}
        else:
            yield {"type": "text-delta", "text": "done"}
            yield {"type": "finish", "finish_reason": "stop", "usage": Usage(10, 5, 15)}


async def ticker(lags: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        start = loop.time()
        await asyncio.sleep(0.005)
        lags.append(max(0.0, loop.time() - start - 0.005))


async def measure(n: int, one: Callable[[int], Awaitable[None]]) -> dict[str, Any]:
    """Run `one(0)` .. `one(n - 1)` at once beside the lag ticker: wall, throughput, loop lag, the loop's wake-ups
    from other threads, CPU, peak RSS."""
    loop = asyncio.get_running_loop()
    wakes = [0]
    threadsafe = loop.call_soon_threadsafe

    def woken(*args: Any, **kwargs: Any) -> Any:  # another thread hands the loop work: one wake-up of its selector
        wakes[0] += 1
        return threadsafe(*args, **kwargs)

    lags: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.ensure_future(ticker(lags, stop))
    loop.call_soon_threadsafe = woken  # type: ignore[method-assign]
    try:
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        del loop.call_soon_threadsafe
    stop.set()
    await tick
    lags.sort()
    return {
        "wall": wall, "steps_per_s": n * STEPS / wall,
        "lag_p50": statistics.median(lags) if lags else 0.0,
        "lag_p99": lags[int(len(lags) * 0.99) - 1] if lags else 0.0,
        "lag_max": lags[-1] if lags else 0.0,
        "commits_per_step": float("nan"), "statements_per_step": float("nan"),
        "wakes_per_step": wakes[0] / (n * STEPS),
        "cpu_us_per_step": cpu / (n * STEPS) * 1e6,
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def count_commits(runtime: Any, counter: list[int]) -> Any:
    if hasattr(runtime, "backend") and hasattr(runtime.backend, "write"):
        write = runtime.backend.write

        def counted(plan: Any, *merge: Any) -> Any:  # an older tree's write takes the plan alone
            counter[0] += 1
            return write(plan, *merge)  # its coroutine, which the caller awaits: no frame of the bench's own

        runtime.backend.write = counted
    return runtime


def count_store_commits(store: Any, counter: list[int]) -> Any:
    """Count the write transactions of a SQLite checkpoint store (private hooks: a bench's view inside)."""
    runner = store._runner
    if hasattr(runner, "_write"):  # group commit: one transaction per batch of writes
        inner = runner._write

        def batch(jobs: Any) -> None:
            counter[0] += 1
            inner(jobs)

        runner._write = batch
    else:
        transaction = runner.transaction

        def one(plan: Any, *, write: bool) -> Any:
            counter[0] += write
            return transaction(plan, write=write)

        runner.transaction = one
    return store


def count_saver_commits(saver: Any, counter: list[int]) -> Any:
    """Count a LangGraph saver's writes: each `aput` (a checkpoint) and `aput_writes` (a task's writes) commits once."""

    def counted(inner: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counter[0] += 1
            return inner(*args, **kwargs)

        return call

    saver.aput, saver.aput_writes = counted(saver.aput), counted(saver.aput_writes)
    return saver


def count_statements(runtime: Any, counter: list[int]) -> Any:
    """Count the statements the SQLite runtime's connection runs (a private hook: a bench's view inside)."""

    def traced(sql: str) -> None:
        counter[0] += 1

    runtime._executor._conn.set_trace_callback(traced)
    return runtime


async def variant(name: str, n: int, tmp: str) -> dict[str, Any]:
    commits = [0]
    statements = [0]
    runtime: Any = None
    store: Any = None
    if name == "memory":
        runtime = MemoryRuntime()
    elif name == "sqlite":
        from durable_agent.backends.sqlite import SqliteRuntime

        runtime = count_statements(count_commits(SqliteRuntime(Path(tmp) / "journal.db"), commits), statements)
    elif name == "postgres":
        from durable_agent.backends.postgres import PostgresRuntime

        runtime = count_commits(PostgresRuntime(os.environ["DURABLE_AGENT_BENCH_POSTGRES_URL"]), commits)
    elif name == "sqlite-store":
        from durable_agent.backends.sqlite import SqliteCheckpointStore

        store = count_store_commits(SqliteCheckpointStore(Path(tmp) / "store.db"), commits)
    elif name == "sqlite-store-async":
        from durable_agent.backends.sqlite import AsyncSqliteCheckpointStore

        store = count_store_commits(AsyncSqliteCheckpointStore(Path(tmp) / "store.db"), commits)
    elif name != "none":
        raise ValueError(f"unknown variant {name!r}")

    nonce = time.time_ns()  # a shared database (Postgres) keeps earlier runs' sessions

    async def one(i: int) -> None:
        if runtime is not None:
            agent = Agent(model=SlowModel(), tools=TOOLS, max_steps=STEPS + 1, session_id=f"s-{nonce}-{i}",
                          durable=DurableOptions(runtime))
            result = await agent.run("go")
        else:
            run_id = f"r-{i}" if store is not None else None
            result = await generate_text(model=SlowModel(), tools=TOOLS, max_steps=STEPS + 1, store=store,
                                         run_id=run_id, messages=[{"role": "user", "content": "go"}])
        assert len(result.steps) == STEPS, result.finish_reason

    row = await measure(n, one)
    for owner in (runtime, store):
        if owner is not None and hasattr(owner, "close"):
            closed = owner.close()
            if asyncio.iscoroutine(closed):
                await closed
    row["commits_per_step"] = commits[0] / (n * STEPS)
    if name == "sqlite":
        row["statements_per_step"] = statements[0] / (n * STEPS)
    return row


def dbos_variant(n: int, tmp: str) -> dict[str, Any]:
    from dbos import DBOS

    DBOS(config={"name": "bench-concurrency", "system_database_url": f"sqlite:///{tmp}/dbos.sqlite",
                 "log_level": "WARNING"})

    @DBOS.step()
    async def model_step(turn: int) -> dict[str, Any]:
        await asyncio.sleep(LATENCY_S)
        return {"tool": turn < STEPS - 1}

    @DBOS.step()
    async def tool_step(turn: int) -> str:
        return "ok"

    @DBOS.workflow()
    async def agent_workflow() -> int:
        for turn in range(STEPS):
            if (await model_step(turn))["tool"]:
                await tool_step(turn)
        return STEPS

    DBOS.launch()

    async def go() -> dict[str, Any]:
        async def one(i: int) -> None:
            await agent_workflow()

        return await measure(n, one)

    result = asyncio.run(go())
    DBOS.destroy()
    return result


class GraphState(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


async def graph_model(state: GraphState) -> dict[str, Any]:
    """SlowModel as a LangGraph node: 20 ms, then a `noop` call for the first STEPS-1 turns, then an answer."""
    await asyncio.sleep(LATENCY_S)
    turn = sum(1 for m in state["messages"] if m["role"] == "tool")
    if turn < STEPS - 1:
        call = {"id": f"c{turn}", "name": "noop", "input": {"i": turn}}
        return {"messages": [{"role": "assistant", "tool_calls": [call]}]}
    return {"messages": [{"role": "assistant", "content": "done"}]}


async def graph_tools(state: GraphState) -> dict[str, Any]:
    calls = state["messages"][-1]["tool_calls"]
    return {"messages": [{"role": "tool", "tool_call_id": call["id"], "content": TOOLS[call["name"]].execute(call["input"])}
                         for call in calls]}


def graph_route(state: GraphState) -> str:
    return "tools" if "tool_calls" in state["messages"][-1] else "end"


async def langgraph_variant(name: str, n: int, tmp: str) -> dict[str, Any]:
    from langgraph.graph import END, START, StateGraph

    if name == "langgraph-sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        opened: Any = AsyncSqliteSaver.from_conn_string(str(Path(tmp) / "langgraph.db"))
    else:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        opened = AsyncPostgresSaver.from_conn_string(os.environ["DURABLE_AGENT_BENCH_POSTGRES_URL"])
    commits = [0]
    nonce = time.time_ns()  # a shared database (Postgres) keeps earlier runs' threads
    async with opened as saver:
        await saver.setup()
        count_saver_commits(saver, commits)
        builder = StateGraph(GraphState)
        builder.add_node("model", graph_model)
        builder.add_node("tools", graph_tools)
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", graph_route, {"tools": "tools", "end": END})
        builder.add_edge("tools", "model")
        graph = builder.compile(checkpointer=saver)

        async def one(i: int) -> None:
            state = await graph.ainvoke({"messages": [{"role": "user", "content": "go"}]}, durability="sync",
                                        config={"configurable": {"thread_id": f"t-{nonce}-{i}"}})
            assert sum(1 for m in state["messages"] if m["role"] == "assistant") == STEPS

        row = await measure(n, one)
    row["commits_per_step"] = commits[0] / (n * STEPS)
    return row


def commit_cost(tmp: str, rounds: int = 200) -> float:
    """Median seconds of one SQLite commit of one small row (WAL, synchronous=FULL) in `tmp`: the disk's price."""
    import sqlite3

    conn = sqlite3.connect(Path(tmp) / "commit.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL").fetchone()
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE t (v TEXT)")
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES ('x')")
        conn.execute("COMMIT")
        times.append(time.perf_counter() - start)
    conn.close()
    return statistics.median(times)


def single_run_multiple() -> None:
    """Print the SQLite runtime's per-step overhead of one run alone, as a multiple of one commit."""
    walls = {name: [row["wall"] for row in (run_child(name, 1) for _ in range(5)) if row] for name in ("none", "sqlite")}
    commit = run_child("commit", 1)
    if not walls["none"] or not walls["sqlite"] or commit is None:
        return
    overhead = (statistics.median(walls["sqlite"]) - statistics.median(walls["none"])) / STEPS
    print(f"single run: the SQLite runtime costs {overhead * 1000:.2f} ms per step over no durability ="
          f" {overhead / commit['commit_s']:.1f}x one commit on this disk ({commit['commit_s'] * 1000:.2f} ms)")


GC = ""  # --gc: the collector's thresholds in every child ("" leaves Python's defaults)


def run_child(name: str, n: int, tree: str | None = None) -> dict[str, Any] | None:
    env = {**os.environ, "DURABLE_AGENT_BENCH_TREE": tree} if tree else None
    out = subprocess.run([sys.executable, __file__, "--child", name, "--n", str(n), "--gc", GC], capture_output=True,
                         text=True, timeout=1800, env=env)
    if out.returncode != 0:
        print(f"  {name} N={n}: failed: {out.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def runnable(name: str) -> bool:
    """Whether `name` can run here; if not, say why in one line (a missing package, no Postgres URL)."""
    if "postgres" in name and not os.environ.get("DURABLE_AGENT_BENCH_POSTGRES_URL"):
        print(f"{name}: skipped (set DURABLE_AGENT_BENCH_POSTGRES_URL)")
        return False
    if name in NEEDS:
        try:
            importlib.metadata.distribution(NEEDS[name])
        except importlib.metadata.PackageNotFoundError:
            print(f"{name}: skipped (pip install {NEEDS[name]})")
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", default="1,10,100,1000")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--child")
    parser.add_argument("--against", help="another checkout: its rows follow ours, marked '@other'")
    parser.add_argument("--gc", default="", help="gc.set_threshold for every variant, e.g. 50000,20,100")
    args = parser.parse_args()
    unknown = sorted(set(args.variants.split(",")) - set(VARIANTS))
    if unknown:  # an unknown name used to run as `none` and print a row under its name
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    if args.gc:
        gc.set_threshold(*(int(t) for t in args.gc.split(",")))
        global GC
        GC = args.gc
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            n = int(args.n)
            if args.child == "commit":
                result = {"commit_s": commit_cost(tmp)}
            elif args.child == "dbos":
                result = dbos_variant(n, tmp)
            elif args.child.startswith("langgraph-"):
                result = asyncio.run(langgraph_variant(args.child, n, tmp))
            else:
                result = asyncio.run(variant(args.child, n, tmp))
        print(json.dumps(result))
        return
    wanted = [name for name in args.variants.split(",") if runnable(name)]
    print(f"{'N':>5} {'variant':<18} {'steps/s':>9} {'wall vs none':>13} {'lag p50':>9} {'p99':>9} {'max':>9}"
          f" {'commits/step':>13} {'stmts/step':>11} {'wakes/step':>11} {'CPU/step':>10} {'peak RSS':>9}")
    for n in (int(x) for x in args.n.split(",")):
        base = run_child("none", n)
        runs = [(name, None) for name in wanted]
        if args.against:
            runs = [run for name in wanted for run in ((name, None), (name, args.against)) if run[0] != "none" or not run[1]]
        for name, tree in runs:
            if name != "none":  # its own baseline, just before it, on its own tree: a shared machine's load drifts
                base = run_child("none", n, tree)
            row = base if name == "none" else run_child(name, n, tree)
            if row is None or base is None:
                continue
            label = f"{name}@other" if tree else name
            print(f"{n:>5} {label:<18} {row['steps_per_s']:9.0f} {row['wall'] / base['wall']:12.2f}x"
                  f" {row['lag_p50'] * 1000:7.1f}ms {row['lag_p99'] * 1000:7.1f}ms {row['lag_max'] * 1000:7.1f}ms"
                  f" {row['commits_per_step']:13.3f} {row['statements_per_step']:11.2f} {row['wakes_per_step']:11.3f}"
                  f" {row['cpu_us_per_step']:8.0f}µs {row['rss_mb']:7.0f}MB", flush=True)
    if "sqlite" in wanted:
        single_run_multiple()


if __name__ == "__main__":
    main()
