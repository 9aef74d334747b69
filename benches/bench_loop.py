"""The loop's own overhead per step: no store vs. a checkpoint store (memory, SQLite), against LangGraph.

Each run is N steps of a scripted model that calls one trivial tool per step, then answers
(`_loop_agent.py`). The anchor is the same agent as a LangGraph StateGraph with its SqliteSaver
checkpointer (install `langgraph` and `langgraph-checkpoint-sqlite` for this bench only; without
them the anchor rows are skipped and say so). Everything runs side by side in one process.

    .venv/bin/python benches/bench_loop.py [--steps 10,100,1000] [--repeat 3]

With ``--against REV`` (a commit, or the path of another checkout) it instead compares the
no-store step of this tree with that tree's: one worker process per tree (`_loop_worker.py`),
asked in alternating rounds, each round `--repeat` runs of `--steps` steps per tree; it prints
each tree's best and median ms/step and the median of the per-round ratios (this tree / REV),
which is what to read on a shared machine.

    .venv/bin/python benches/bench_loop.py --against cf851f4 [--face generate,agent] [--rounds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _loop_agent import generate_run
from _report import per_step, print_header, print_rows

from durable_agent import InMemoryCheckpointStore
from durable_agent.backends.sqlite import SqliteCheckpointStore

BENCHES = Path(__file__).resolve().parent
TREE = BENCHES.parent


def langgraph_runner(db_path: str) -> Callable[[int], None] | None:
    try:
        import sqlite3

        from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, MessagesState, StateGraph
    except ImportError:
        return None
    saver = SqliteSaver(sqlite3.connect(db_path, check_same_thread=False))

    def run(steps: int) -> None:
        def agent(state: MessagesState) -> dict[str, Any]:
            turn = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
            if turn < steps - 1:
                tool_call = {"name": "noop", "args": {"i": turn}, "id": f"c{turn}"}
                return {"messages": [AIMessage(content="", tool_calls=[tool_call])]}
            return {"messages": [AIMessage(content="done")]}

        def tools(state: MessagesState) -> dict[str, Any]:
            last = state["messages"][-1]
            return {"messages": [ToolMessage(content="ok", tool_call_id=c["id"]) for c in last.tool_calls]}

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", tools)
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", lambda s: "tools" if s["messages"][-1].tool_calls else END)
        graph.add_edge("tools", "agent")
        app = graph.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": f"t-{time.perf_counter_ns()}"}, "recursion_limit": 4 * steps + 10}
        app.invoke({"messages": [HumanMessage(content="go")]}, config)

    return run


def against_tree(against: str, tmp: str) -> Path:
    """The directory holding `durable_agent` of `against`: a checkout's path, or a commit's python/ exported."""
    path = Path(against)
    if path.is_dir():
        return path / "python" if (path / "python" / "durable_agent").is_dir() else path
    tar = subprocess.run(["git", "-C", str(TREE), "archive", "--format=tar", against, "python"],
                         check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(tmp, filter="data")
    return Path(tmp) / "python"


class Worker:
    """A `_loop_worker.py` process timing one tree's runs on request."""

    def __init__(self, python_dir: Path) -> None:
        self.process = subprocess.Popen([sys.executable, str(BENCHES / "_loop_worker.py"), str(python_dir)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        self.imported = self.stdout.readline().strip()

    def time(self, face: str, steps: int, runs: int) -> float:
        self.stdin.write(f"{face} {steps} {runs}\n")
        self.stdin.flush()
        return float(self.stdout.readline())

    def close(self) -> None:
        self.stdin.close()
        self.process.wait()


def compare(against: str, faces: list[str], steps: int, runs: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": TREE / "python", against: against_tree(against, tmp)}
        workers = {name: Worker(path) for name, path in trees.items()}
        try:
            for name, worker in workers.items():
                print(f"{name}: {worker.imported}")
            print(f"{rounds} rounds x {runs} runs x {steps} steps per tree, alternating; "
                  f"DURABLE_AGENT_NATIVE={os.environ.get('DURABLE_AGENT_NATIVE', 'auto')}")
            print(f"{'face':<9} {'tree':<14} {'best ms/step':>13} {'median':>9} {'ratio of best':>14} "
                  f"{'median ratio':>13}")
            for face in faces:
                times: dict[str, list[float]] = {name: [] for name in workers}
                order = list(workers)
                for _ in range(rounds):
                    for name in order:
                        times[name].append(workers[name].time(face, steps, runs))
                    order.reverse()  # neither tree always runs first
                mine, theirs = times["this tree"], times[against]
                ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
                for name, values in times.items():
                    tail = (f"{min(mine) / min(theirs):13.3f}x {statistics.median(ratios):12.3f}x"
                            if name == "this tree" else "")
                    print(f"{face:<9} {name[:14]:<14} {min(values) * 1000:13.4f} "
                          f"{statistics.median(values) * 1000:9.4f} {tail}")
        finally:
            for worker in workers.values():
                worker.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", default=None, help="steps per run (default 10,100,1000; with --against 50)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (the best counts)")
    parser.add_argument("--against", help="a commit or checkout path to compare the no-store step with")
    parser.add_argument("--face", default="generate,agent", help="with --against: generate, agent or both")
    parser.add_argument("--rounds", type=int, default=60, help="with --against: alternating rounds")
    args = parser.parse_args()
    if args.against:
        compare(args.against, args.face.split(","), int(args.steps or 50), args.repeat, args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_store = SqliteCheckpointStore(str(Path(tmp) / "bench.db"))
        graph = langgraph_runner(str(Path(tmp) / "langgraph.db"))
        print_header(28, "no store", "LangGraph")
        for steps in (int(s) for s in (args.steps or "10,100,1000").split(",")):
            repeat = args.repeat if steps <= 1000 else 1
            rows: dict[str, float] = {}
            variants = {
                "durable-agent, no store": None,
                "durable-agent, memory store": InMemoryCheckpointStore(),
                "durable-agent, SQLite store": sqlite_store,
            }
            for name, store in variants.items():
                rows[name] = per_step(steps, repeat, lambda store=store: asyncio.run(generate_run(steps, store)))
            if graph is not None:
                rows["LangGraph + SqliteSaver"] = per_step(steps, repeat, lambda: graph(steps))
            print_rows(steps, rows, 28, "durable-agent, no store", "LangGraph + SqliteSaver")
        if graph is None:
            print("LangGraph is not installed: pip install langgraph langgraph-checkpoint-sqlite")
        sqlite_store.close()


if __name__ == "__main__":
    main()
