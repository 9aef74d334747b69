"""A worker whose event loop stalls past its lease (a slow `prepare_step`, a blocking tool, a GC pause) while
another worker takes its run over and finishes it: on waking it calls no model and runs no tool for a step the
new owner ran. It stops with `StaleEpochError`, as a process that lost its lease does.

The stall is real (`time.sleep` on the event loop's thread, so no renewal is sent), and so is the second
worker: another runtime on the same storage (the memory state, the SQLite file, the Postgres schema) on a
thread with its own event loop, which claims the lapsed lease and resumes the run while the first is blocked.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_agent import (
    Agent,
    DurableOptions,
    GenerateTextResult,
    Message,
    ModelRequest,
    PrepareStepContext,
    ScriptedModel,
    StaleEpochError,
    Tool,
    call,
    content_parts,
    message_text,
    reply,
)
from durable_agent.backends import RunOwner
from durable_agent.backends.memory import MemoryDurableState, MemoryRuntime
from helpers import maybe_await, wall_clock_ms
from test_runtime_postgres import conninfo, opened  # noqa: F401  # fixtures of the postgres case

pytestmark = pytest.mark.host_only("the second worker runs on a thread of its own")

STALE_MS = 300
"""Both workers' `stale_after_ms`: the first renews every 100 ms until its event loop blocks."""


@pytest.fixture(params=[
    "memory",
    pytest.param("sqlite", marks=pytest.mark.requires_sqlite),
    "postgres",
])
def worker_on(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Open another worker's runtime (its own connections, the wall clock) on the test's shared storage."""
    if request.param == "postgres":
        opened = request.getfixturevalue("opened")  # test_runtime_postgres: a schema of the test's own
        yield lambda: opened(wall_clock_ms)
        return
    if request.param == "sqlite":
        from durable_agent.backends.sqlite import SqliteRuntime

        runtimes: list[Any] = []

        def open_sqlite() -> Any:
            runtimes.append(SqliteRuntime(tmp_path / "agent.db"))
            return runtimes[-1]

        yield open_sqlite
        for runtime in runtimes:
            runtime.close()
        return
    state = MemoryDurableState()
    yield lambda: MemoryRuntime(state=state)


class StalledWorker:
    """The first worker: a runtime on another host (only staleness ends its lease) that can block its event loop.

    `stall()` blocks the loop past the lease, and meanwhile a second worker resumes the run to its end
    on a thread of its own. It blocks only while no renewal of the first is in flight: a Postgres
    renewal stopped half-way would hold the lease row's lock the second worker's claim waits for.
    """

    def __init__(self, worker_on: Callable[[], Any], model: ScriptedModel, tools: dict[str, Tool]) -> None:
        self.worker_on, self.model, self.tools = worker_on, model, tools
        self.runtime = worker_on()
        self.runtime.owner = RunOwner("elsewhere", 1, self.runtime.owner.token)
        self.renewing = 0
        renew = self.runtime.lease.renew

        async def counted_renew(session_id: str, epoch: int) -> bool:
            self.renewing += 1
            try:
                return bool(await renew(session_id, epoch))
            finally:
                self.renewing -= 1

        self.runtime.lease.renew = counted_renew
        self.stalled = False
        self.taken_over: GenerateTextResult | None = None

    def agent(self, runtime: Any, **options: Any) -> Agent:
        return Agent(model=self.model, tools=self.tools, session_id="chat-1",
                     durable=DurableOptions(runtime, stale_after_ms=STALE_MS), **options)

    async def stall(self) -> None:
        """Once (the second worker's own calls return at once): block the loop while the run is taken over."""
        if self.stalled:
            return
        self.stalled = True
        while self.renewing:
            await asyncio.sleep(0.001)
        time.sleep(2 * STALE_MS / 1000)  # from here until the takeover ends, the event loop runs nothing
        failed: list[BaseException] = []

        def second_worker() -> None:
            async def resume() -> None:
                self.taken_over = await self.agent(self.worker_on()).resume()

            try:
                asyncio.run(resume())
            except BaseException as exc:  # noqa: BLE001 - raised again on the first worker's thread
                failed.append(exc)

        thread = threading.Thread(target=second_worker)
        thread.start()
        thread.join()
        if failed:
            raise failed[0]
        assert self.taken_over is not None and self.taken_over.finish_reason == "stop"

    async def transcript(self) -> list[tuple[Any, ...]]:
        """The stored run's history: each message's role, text, and tool calls or results."""
        run_id = await self.runtime.stores.runs.last("chat-1")
        checkpoint = await maybe_await(self.runtime.stores.checkpoints.load(run_id))
        assert checkpoint.status == "completed"
        return [summary(m) for m in checkpoint.messages]


def summary(message: Message) -> tuple[Any, ...]:
    """A message as its role, its text, then each tool call's id or each tool result's (id, output)."""
    parts: list[dict[str, Any]] = [dict(p) for p in content_parts(message)]
    calls = [p["tool_call_id"] for p in parts if p["type"] == "tool-call"]
    results = [(p["tool_call_id"], p["output"]) for p in parts if p["type"] == "tool-result"]
    return (message["role"], message_text(message), *calls, *results)


def step_of(request: ModelRequest) -> int:
    """Which step of the run (1-based) a model request is for: one more than the assistant turns it holds."""
    return 1 + sum(1 for m in request.messages if m["role"] == "assistant")


async def test_a_stalled_worker_does_not_call_the_model_for_a_step_the_new_owner_finished(
    worker_on: Callable[[], Any],
) -> None:
    asked: list[int] = []

    def answer(request: ModelRequest) -> Any:
        asked.append(step_of(request))
        return reply("", call("look", {}, "c1")) if step_of(request) == 1 else "Done."

    looked: list[int] = []

    def look(args: Any) -> str:
        looked.append(1)
        return "seen"

    worker = StalledWorker(worker_on, ScriptedModel(answer), {"look": Tool(execute=look, replay="safe")})

    async def prepare_step(context: PrepareStepContext) -> None:
        if context.step_count == 1:  # before the model call of step 2
            await worker.stall()

    with pytest.raises(StaleEpochError):
        await worker.agent(worker.runtime, prepare_step=prepare_step).run("go")
    assert asked == [1, 2]  # step 2's model call was made once: by the worker that took over
    assert worker.taken_over is not None and worker.taken_over.text == "Done."
    assert await worker.transcript() == [("user", "go"), ("assistant", "", "c1"), ("tool", "", ("c1", "seen")),
                                         ("assistant", "Done.")]
    assert looked == [1]


async def test_a_stalled_worker_does_not_run_a_safe_tool_the_new_owner_ran(worker_on: Callable[[], Any]) -> None:
    asked: list[int] = []
    ran: list[str] = []

    def answer(request: ModelRequest) -> Any:
        asked.append(step_of(request))
        return reply("", call("slow", {}, "c1"), call("look", {}, "c2")) if step_of(request) == 1 else "Done."

    async def slow(args: Any) -> str:
        ran.append("slow")
        await worker.stall()  # the first worker's loop blocks inside its first tool call
        return "slow ok"

    def look(args: Any) -> str:
        ran.append("look")
        return "seen"

    worker = StalledWorker(worker_on, ScriptedModel(answer), {"slow": Tool(execute=slow, replay="safe"),
                                                              "look": Tool(execute=look, replay="safe")})
    with pytest.raises(StaleEpochError):  # one call at a time: `look` starts after the stall
        await worker.agent(worker.runtime, max_tool_concurrency=1).run("go")
    assert ran.count("look") == 1  # run by the worker that took over only
    assert ran.count("slow") == 2  # in flight when the first worker stalled: a safe tool runs again
    assert asked == [1, 2]  # step 1's answer was durable before its tools ran: the new owner replayed it
    assert await worker.transcript() == [("user", "go"), ("assistant", "", "c1", "c2"),
                                         ("tool", "", ("c1", "slow ok"), ("c2", "seen")), ("assistant", "Done.")]

