"""A worker process for the crash torture: drives agent sessions on a journal runtime until all are done.

Each session runs `PROMPTS` prompts, one run each; each run does `TURNS` rounds of tool calls,
then answers: a safe read and an unsafe charge in parallel (each done record written as its call
ends), then a charge alone (its done record rides on the checkpoint commit). Every model request and every tool effect is
appended, one JSON line each, to a ledger that is not the journal (one O_APPEND write per
line, in the order they happened; a reader may see a line half written, and a kill may leave
one torn: `torture_supervisor.ledger_entries`). The supervisor (tests/test_crash_journal.py,
benches/soak_crash.py) SIGKILLs and SIGSTOPs workers and starts new ones.

    python tests/torture_worker.py RUNTIME LEDGER PROMPTS SESSION [SESSION ...]

RUNTIME is ``sqlite:<path>`` or ``postgres:<conninfo>``. Deaths the worker aims at itself:

* ``TORTURE_DIE_AFTER_WRITES=k``: SIGKILL itself right after its k-th committed write (claims,
  step records, lifecycle commits...), so a death lands exactly between two commits;
* ``TORTURE_DIE_IN_TOOL=p``: each tool call SIGKILLs itself with probability p, half of the
  time before its effect, half after it (the effect logged, its done record not yet written).

``TORTURE_CONCURRENCY=n`` drives n sessions at once, as a server does (default 1): their writes
then share the SQLite writer's batches and merged statements (`durable_agent.backends.sqlite._group_commit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from durable_agent import (
    Agent,
    DurableOptions,
    ModelRequest,
    RunExistsError,
    RunLeaseHeldError,
    ScriptedModel,
    StaleEpochError,
    Tool,
    call,
    reply,
)
from helpers import maybe_await

TURNS = 2
STALE_AFTER_MS = 1_500


def prompt_text(n: int) -> str:
    return f"Reconcile period {n}."


def final_answer(n: int) -> str:
    return f"Period {n} reconciled."


def log(ledger: str, **entry: Any) -> None:
    line = (json.dumps({**entry, "pid": os.getpid()}) + "\n").encode()
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def build(ledger: str | None, session: str, delay: float, die_in_tool: float = 0.0,
          rng: random.Random | None = None) -> tuple[ScriptedModel, dict[str, Tool]]:
    """The agent. Its answer depends only on the prompt number and the tool rounds since that prompt,
    so an aborted partial turn does not shift it."""

    def answer(request: ModelRequest) -> Any:
        prompt = sum(1 for m in request.messages if m["role"] == "user") - 1
        last_user = max(i for i, m in enumerate(request.messages) if m["role"] == "user")
        turn = sum(1 for m in request.messages[last_user:] if m["role"] == "tool")
        if ledger:
            log(ledger, kind="model", session=session, prompt=prompt, turn=turn)
        args = {"prompt": prompt, "turn": turn}
        if turn == 0:
            return reply(f"Period {prompt}, round {turn}: reading the ledger and charging the fee now.",
                         call("read", args, f"read-{prompt}-{turn}"),
                         call("charge", {**args, "usd": 3}, f"charge-{prompt}-{turn}"))
        if turn < TURNS:
            return reply(f"Period {prompt}, round {turn}: charging the late fee.",
                         call("charge", {**args, "usd": 1}, f"charge-{prompt}-{turn}"))
        return final_answer(prompt)

    async def effect(name: str, args: Any) -> str:
        await asyncio.sleep(0.01)
        dice = rng.random() if rng is not None and die_in_tool else 1.0
        if dice < die_in_tool / 2:
            die()  # before the effect
        if ledger:
            log(ledger, kind="effect", tool=name, session=session, prompt=args["prompt"], turn=args["turn"])
        if dice < die_in_tool:
            die()  # after the effect, before its done record
        return f"{name} {args['prompt']}.{args['turn']} ok"

    async def read(args: Any) -> str:
        return await effect("read", args)

    async def charge(args: Any) -> str:
        return await effect("charge", args)

    tools = {"read": Tool(execute=read, replay="safe"), "charge": Tool(execute=charge, replay="unsafe")}
    return ScriptedModel(answer, delay=delay), tools


@contextlib.contextmanager
def journal_spec(kind: str, workdir: Path, schema_prefix: str) -> Iterator[str]:
    """A RUNTIME argument for the workers: a SQLite file in `workdir` (``sqlite``), or a fresh schema on the
    test Postgres (``postgres``; skipped, or failed under CI, when none is configured)."""
    if kind == "sqlite":
        yield f"sqlite:{workdir / 'journal.db'}"
        return
    from durable_agent.testing.services import postgres_schema

    with postgres_schema(schema_prefix) as conninfo:
        yield "postgres:" + conninfo


def open_runtime(spec: str) -> Any:
    """A runtime from ``sqlite:<path>`` or ``postgres:<conninfo>``."""
    kind, _, where = spec.partition(":")
    if kind == "sqlite":
        from durable_agent.backends.sqlite import SqliteRuntime

        return SqliteRuntime(where)
    if kind == "postgres":
        from durable_agent.backends.postgres import PostgresRuntime

        return PostgresRuntime(where)
    raise ValueError(f"unknown runtime {spec!r}")


def die_after_writes(runtime: Any, writes: int) -> None:
    """SIGKILL this process right after the runtime's `writes`-th committed write."""
    write, count = runtime.backend.write, [0]

    async def counted(plan: Any, merge: Any = None) -> Any:
        value = await write(plan, merge)
        count[0] += 1
        if count[0] >= writes:
            die()
        return value

    runtime.backend.write = counted


async def prompts_answered(runtime: Any, session: str) -> int:
    """How many prompts the session's last run has seen through (its final answer stored and unmarked)."""
    last = await runtime.stores.runs.last(session)
    stored = await maybe_await(runtime.stores.checkpoints.load(last)) if last else None
    if stored is None:
        return 0
    asked = sum(1 for m in stored.messages if m["role"] == "user")
    finished = stored.status == "completed" and await runtime.lease.resumable_run(session) is None
    return asked if finished else asked - 1


async def drive(spec: str, ledger: str, prompts: int, sessions: list[str]) -> None:
    runtime = open_runtime(spec)
    if os.environ.get("TORTURE_DIE_AFTER_WRITES"):
        die_after_writes(runtime, int(os.environ["TORTURE_DIE_AFTER_WRITES"]))
    die_in_tool = float(os.environ.get("TORTURE_DIE_IN_TOOL", "0"))
    rng = random.Random(os.getpid())
    done: set[str] = set()

    async def driver() -> None:
        while len(done) < len(sessions):
            for session in rng.sample(sessions, len(sessions)):
                if session in done or session in busy:
                    continue
                busy.add(session)
                try:
                    await step(session)
                finally:
                    busy.discard(session)
            await asyncio.sleep(0)

    async def step(session: str) -> None:
        model, tools = build(ledger, session, delay=0.003, die_in_tool=die_in_tool, rng=rng)
        agent = Agent(model=model, tools=tools, session_id=session,
                      durable=DurableOptions(runtime, on_interrupted="resume", stale_after_ms=STALE_AFTER_MS))
        try:
            await agent.resume()
            answered = await prompts_answered(runtime, session)
            if answered >= prompts:
                done.add(session)
            else:  # another worker may run this prompt meanwhile: its run id makes the start idempotent
                await agent.run(prompt_text(answered), run_id=f"{session}/{answered}")
        except RunExistsError:
            pass  # started elsewhere (and, if it was interrupted, finished by this call's recovery)
        except (RunLeaseHeldError, StaleEpochError) as exc:
            log(ledger, kind="refused", session=session, error=type(exc).__name__)
            await asyncio.sleep(0.02)  # another worker has it: come back later

    busy: set[str] = set()  # sessions a driver of this process is on
    await asyncio.gather(*(driver() for _ in range(int(os.environ.get("TORTURE_CONCURRENCY", "1")))))


if __name__ == "__main__":
    runtime_spec, ledger_path, prompt_count, *names = sys.argv[1:]
    asyncio.run(drive(runtime_spec, ledger_path, int(prompt_count), names))
