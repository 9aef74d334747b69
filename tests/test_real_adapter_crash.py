"""Durability with a real adapter over real sockets: a worker process running an `Agent` with
`OpenAIChatModel` against the replay server is SIGKILLed in the middle of a streamed model call, in
the middle of a backoff wait after a 429, or in a tool call before any checkpoint holds the model's
answer; the test process resumes the run on the same journal (SQLite, and Postgres when configured).

The server counts the requests: a model call whose step finished before the kill is never
requested again, and a resumed backoff neither re-sends the failed attempt nor sends the next one
before the time stored with the failed attempt's decision. The kills are placed by state, not by
timing: the server holds the stream part-way and the worker's stream partials are seen in the
journal; the failed attempt's record is seen in the journal. A call killed mid-stream is asked
again with the text it had streamed as an aborted assistant turn (the journal runtimes' rule).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from durable_agent import MODEL_CALL, Agent, DurableOptions, RetryPolicy, Tool, content_parts, parse_step_key
from durable_agent.providers import HttpTransport, HttpxTransport, OpenAIChatModel, StdlibTransport
from helpers import wall_clock_ms
from replay import ReplayServer, load
from test_runtime_postgres import conninfo, opened  # noqa: F401  # fixtures

pytestmark = pytest.mark.host_only("spawns and SIGKILLs a worker process talking to a server on 127.0.0.1")

TESTS_DIR = Path(__file__).resolve().parent
PYTHON_DIR = TESTS_DIR.parent / "python"
SESSION = "chat-1"
PROMPT = "Look up invoices inv-7 and inv-8."
ANSWER = "Invoice inv-7 is 42 € — both invoices are ready."
PATIENCE = 30.0  # seconds a wait on the worker may take before the test fails (never reached when all is well)
T = TypeVar("T")


# ------------------------------------------------------------------ the agent, in both processes

def crash_agent(runtime: Any, base_url: str, ran: Callable[[str], None], transport: str = "default") -> Agent:
    """The agent the worker runs and the test process resumes: one tool, a real adapter, a journal.
    `transport`: ``stdlib``, ``httpx``, or the default one."""

    def lookup(args: Any) -> Any:
        ran(args["id"])
        return {"id": args["id"], "amount": 42}

    tools = {"lookup": Tool(description="Find an invoice.", execute=lookup, replay="safe", parameters={
        "type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]})}
    transports: dict[str, Callable[[], HttpTransport]] = {"stdlib": StdlibTransport, "httpx": HttpxTransport}
    chosen = transports.get(transport)
    model = OpenAIChatModel("gpt-4o-mini", base_url=base_url, api_key="sk-test",
                            transport=chosen() if chosen is not None else None)
    return Agent(model=model, tools=tools, durable=DurableOptions(runtime), session_id=SESSION,
                 retry=RetryPolicy(attempts=3, jitter=False))


def open_runtime(kind: str, target: str) -> Any:
    if kind == "sqlite":
        from durable_agent.backends.sqlite import SqliteRuntime

        return SqliteRuntime(target)
    from durable_agent.backends.postgres import PostgresRuntime

    return PostgresRuntime(target, max_connections=1)


def work() -> None:
    """The worker process (``python -c``): argv is the runtime kind, its target, the base URL, a ledger
    file, ``hang`` to stop in the first tool call, and the transport. The test kills it before the run ends."""
    kind, target, base_url, ledger, hang, transport = sys.argv[1:7]

    def ran(invoice: str) -> None:
        with open(ledger, "a") as f:
            f.write(invoice + "\n")
        if hang == "hang":
            time.sleep(PATIENCE)  # killed here

    asyncio.run(crash_agent(open_runtime(kind, target), base_url, ran, transport).run(PROMPT))
    sys.exit("the run ended: the test should have killed it")


# ------------------------------------------------------------------ fixtures and helpers

@dataclass
class Journal:
    """Where the worker and the test process keep the run: the runtime kind, its target, and the
    test process's own runtime on it."""

    kind: str
    target: str
    runtime: Any


@pytest.fixture(scope="module")
def server() -> Iterator[ReplayServer]:
    with ReplayServer() as running:
        yield running


@pytest.fixture(params=["sqlite", "postgres"])
def journal(request: Any, tmp_path: Path) -> Iterator[Journal]:
    if request.param == "sqlite":
        target = str(tmp_path / "agent.db")
        with open_runtime("sqlite", target) as runtime:
            yield Journal("sqlite", target, runtime)
        return
    target = request.getfixturevalue("conninfo")
    yield Journal("postgres", target, request.getfixturevalue("opened")(clock=wall_clock_ms))


def spawn(journal: Journal, base_url: str, ledger: Path, *, hang_in_tool: bool = False,
          transport: str = "default") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from test_real_adapter_crash import work; work()",
         journal.kind, journal.target, base_url, str(ledger), "hang" if hang_in_tool else "run", transport],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=TESTS_DIR,
        env={"PYTHONPATH": os.pathsep.join([str(PYTHON_DIR), str(TESTS_DIR)]), "PATH": "/usr/bin:/bin"},
    )


async def until(probe: Callable[[], Awaitable[T | None]], worker: subprocess.Popen[str], what: str) -> T:
    """Poll `probe` until it finds something; fails if the worker exits first."""
    deadline = time.monotonic() + PATIENCE
    while (found := await probe()) is None:
        if worker.poll() is not None:
            pytest.fail(f"the worker exited ({worker.returncode}) before {what}: {worker.stderr.read()}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            worker.kill()
            pytest.fail(f"no {what} after {PATIENCE} s")
        await asyncio.sleep(0.01)
    return found


def sigkill(worker: subprocess.Popen[str]) -> None:
    """SIGKILL the worker and reap it (a zombie's pid still looks alive to the lease's owner check)."""
    os.kill(worker.pid, signal.SIGKILL)
    assert worker.wait(PATIENCE) == -signal.SIGKILL


def model_step(key: str, turn: int, attempt: int = 0) -> bool:
    parts = parse_step_key(key)
    return (parts.turn, parts.call, parts.attempt) == (turn, MODEL_CALL, attempt)


def text_sent(name: str, pieces: int) -> str:
    """The text of the complete events among the first `pieces` chunks of a recorded chat stream."""
    sent = b"".join(load(name).pieces()[:pieces])
    events = sent[: sent.rfind(b"\n\n")].split(b"\n")
    chunks = [json.loads(line[len(b"data: "):]) for line in events if line.startswith(b"data: {")]
    return "".join(c["delta"].get("content") or "" for chunk in chunks for c in chunk["choices"])


def per_turn(requests: list[dict[str, Any]]) -> list[int]:
    """How many messages each request sent: 1 is the first model call, 4 the one after the tool results."""
    return [len(r["body"]["messages"]) for r in requests]


def observe_waits(runtime: Any) -> list[int]:
    """Record the backoff waits of the runs `runtime` opens (they still wait)."""
    waits: list[int] = []
    open_run = runtime.open_run

    async def observed_open_run(**kwargs: Any) -> Any:
        scope = await open_run(**kwargs)
        sleep = scope.sleep

        async def recorded(ms: int, signal: Any = None) -> None:
            waits.append(ms)
            await sleep(ms, signal)

        scope.sleep = recorded
        return scope

    runtime.open_run = observed_open_run
    return waits


# ------------------------------------------------------------------ the kills

@pytest.mark.parametrize("transport", ["httpx", "stdlib"])
async def test_a_worker_killed_mid_stream_resumes_without_asking_for_the_finished_call_again(
    server: ReplayServer, journal: Journal, tmp_path: Path, transport: str
) -> None:
    base = server.base_url("openai_chat/tools", "openai_chat/text")
    half = len(load("openai_chat/text").pieces()) // 2
    held = server.hold(base, 1, after=half)  # the answer, half sent
    partial = text_sent("openai_chat/text", half)
    assert partial and ANSWER.startswith(partial) and partial != ANSWER
    ledger = tmp_path / "ledger.txt"
    worker = spawn(journal, base, ledger, transport=transport)
    inspect = journal.runtime.inspect

    async def streamed() -> bool | None:  # the worker stored all the text it was sent of the answer
        text = "".join(p.text for p in await inspect.partials() if model_step(p.step_key, 2))
        return True if text == partial else None

    try:
        await until(streamed, worker, f"the streamed text {partial!r} in the journal")
        assert held.reached.is_set() and not held.released.is_set()  # the rest of the stream is not sent
        sigkill(worker)
    finally:
        held.release()
        if worker.poll() is None:
            worker.kill()
    assert per_turn(server.requests_to(base)) == [1, 4]

    ran: list[str] = []
    resumed = await crash_agent(journal.runtime, base, ran.append).resume()

    assert resumed is not None and resumed.text == ANSWER and resumed.finish_reason == "stop"
    requests = server.requests_to(base)
    assert per_turn(requests) == [1, 4, 5]  # the finished first call was not requested again
    # The killed call is asked again with what it had streamed as an aborted assistant turn.
    again = requests[2]["body"]["messages"]
    assert again[:4] == requests[1]["body"]["messages"] and again[4] == {"role": "assistant", "content": partial}
    assert ran == [] and ledger.read_text().split() == ["inv-7", "inv-8"]  # the tools ran once, in the worker
    assert [m["role"] for m in resumed.messages] == ["user", "assistant", "tool", "assistant", "assistant"]
    assert [c["input"] for c in content_parts(resumed.messages[1]) if c["type"] == "tool-call"] == [
        {"id": "inv-7"}, {"id": "inv-8"}]
    assert [m["content"] for m in resumed.messages[3:]] == [[{"type": "text", "text": partial}],
                                                            [{"type": "text", "text": ANSWER}]]


async def test_a_worker_killed_during_a_backoff_wait_resumes_the_rest_of_the_wait(
    server: ReplayServer, journal: Journal, tmp_path: Path
) -> None:
    base = server.base_url("openai_chat/tools", "openai_chat/rate_limited_briefly", "openai_chat/text")
    ledger = tmp_path / "ledger.txt"
    worker = spawn(journal, base, ledger)
    inspect = journal.runtime.inspect

    async def failed_attempt() -> Any:
        return next((r for r in await inspect.steps() if model_step(r.key, 2) and r.status == "failed"), None)

    try:
        failed = await until(failed_attempt, worker, "the failed attempt's record in the journal")
        sigkill(worker)  # the 429 was served and its decision stored: the worker is waiting to retry
    finally:
        if worker.poll() is None:
            worker.kill()
    decision = failed.error.decision
    assert (failed.error.status, failed.error.retryable) == (429, True)
    assert decision["action"] == "retry" and decision["delay_ms"] == 2_000  # the server's Retry-After: 2
    assert per_turn(server.requests_to(base)) == [1, 4]

    waits = observe_waits(journal.runtime)
    ran: list[str] = []
    before = wall_clock_ms()
    resumed = await crash_agent(journal.runtime, base, ran.append).resume()

    assert resumed is not None and resumed.text == ANSWER
    requests = server.requests_to(base)
    assert per_turn(requests) == [1, 4, 4]  # neither the first call nor the rate-limited attempt was sent again
    assert requests[2]["at"] >= decision["retry_at"]  # the retry kept the stored time
    assert len(waits) == 1 and waits[0] <= decision["retry_at"] - before  # only what was left of the wait
    assert ran == [] and ledger.read_text().split() == ["inv-7", "inv-8"]
    done = [r for r in await inspect.steps() if model_step(r.key, 2, attempt=1)]
    assert [r.status for r in done] == ["done"]
    assert [m["role"] for m in resumed.messages] == ["user", "assistant", "tool", "assistant"]


async def test_a_worker_killed_in_a_tool_takes_the_finished_model_call_from_the_journal(
    server: ReplayServer, journal: Journal, tmp_path: Path
) -> None:
    """Killed after the model call finished and before a checkpoint holds its answer: only the
    step's record (written with the tool batch) keeps the call from being requested again."""
    base = server.base_url("openai_chat/tools", "openai_chat/text")
    ledger = tmp_path / "ledger.txt"
    worker = spawn(journal, base, ledger, hang_in_tool=True)

    async def in_tool() -> bool | None:
        return True if ledger.exists() and ledger.read_text() else None

    try:
        await until(in_tool, worker, "a tool call in the worker")
        sigkill(worker)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert per_turn(server.requests_to(base)) == [1]
    checkpoint = await journal.runtime.stores.checkpoints.load(await journal.runtime.stores.runs.last(SESSION))
    assert [m["role"] for m in checkpoint.messages] == ["user"]  # the answer is in the journal only

    ran: list[str] = []
    resumed = await crash_agent(journal.runtime, base, ran.append).resume()

    assert resumed is not None and resumed.text == ANSWER
    assert per_turn(server.requests_to(base)) == [1, 4]  # the finished call was not requested again
    assert ledger.read_text().split() == ["inv-7"]  # sync tools run on the loop: the first one hung
    assert ran == ["inv-7", "inv-8"]  # safe tools without a done record run again
    assert [m["role"] for m in resumed.messages] == ["user", "assistant", "tool", "assistant"]
