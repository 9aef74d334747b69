"""The agents tests/test_restate.py serves on Restate, in a process of their own (hypercorn in-process).

    python tests/restate_service.py PORT LEDGER_DIR

Every effect and every model request is appended to a ledger file under LEDGER_DIR (the counts
the tests check survive SIGKILLs). A kill point named in LEDGER_DIR/kill-points fires once: the
process SIGKILLs itself there and writes ``killed <point>`` first, so its successor goes on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

import restate

from durable_agent import (
    Agent,
    ApprovalSigner,
    ModelCallError,
    ModelRequest,
    RetryPolicy,
    ScriptedModel,
    Tool,
    call,
    current_tool_call,
    reply,
)
from durable_agent.mcp import StdioServer
from durable_agent.restate import RestateRuntime, agent_services, serve
from durable_agent.testing.runtime_conformance import Clock, DurableRuntimeConformance

SECRET = "restate-test-secret-0123456789abcdef0123456789"
LEDGER = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(".")
RETRY = restate.InvocationRetryPolicy(initial_interval=timedelta(milliseconds=50),
                                      max_interval=timedelta(milliseconds=500), exponentiation_factor=2.0)
INACTIVITY = timedelta(seconds=2)
SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}


def note(*words: Any) -> None:
    """Append one line to the ledger, durably (it must survive this process's SIGKILL)."""
    fd = os.open(LEDGER / "ledger", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (" ".join(str(w) for w in words) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def kill_point(name: str) -> None:
    """SIGKILL this process here, once per point listed in LEDGER/kill-points."""
    points = (LEDGER / "kill-points").read_text().split() if (LEDGER / "kill-points").exists() else []
    ledger = (LEDGER / "ledger").read_text() if (LEDGER / "ledger").exists() else ""
    if name in points and f"killed {name}\n" not in ledger:
        note("killed", name)
        os.kill(os.getpid(), signal.SIGKILL)


def session_of(request: ModelRequest) -> str:
    first = next(m for m in request.messages if m["role"] == "user")
    return str(first["content"]).split()[0]


class LedgerModel(ScriptedModel):
    """A scripted model that writes ``model <session> <turn> begin|end`` around every request."""

    async def stream(self, request: ModelRequest) -> Any:
        turn = sum(1 for m in request.messages if m["role"] == "assistant")
        who = session_of(request)
        note("model", who, turn, "begin")
        async for event in super().stream(request):
            yield event
        note("model", who, turn, "end")


def pay(invoice: str) -> str:
    note("effect", "pay", invoice)
    return "paid"


# The README's invoice agent: lookup, then pay (needs a client-mode approval), then a final answer.
readme = Agent(
    model=LedgerModel([
        reply("Looking it up.", call("lookup", {"id": "inv-7"})),
        reply("It is 42 EUR; paying it needs your approval.", call("pay", {"id": "inv-7"})),
        "Invoice inv-7 is paid.",
    ]),
    tools={
        "lookup": Tool(description="Find an invoice.", parameters=SCHEMA, replay="safe",
                       execute=lambda args: {"id": args["id"], "amount": 42}),
        "pay": Tool(description="Pay an invoice.", parameters=SCHEMA, needs_approval=True,
                    execute=lambda args: pay(args["id"])),
    },
    max_steps=10,
    approval_signer=ApprovalSigner(SECRET),
)


async def slow_stream(request: ModelRequest) -> Any:
    """Turn 0 streams words (a kill point after the second), then asks for the unsafe `charge`."""
    turn = sum(1 for m in request.messages if m["role"] == "assistant")
    if turn == 0:
        return reply("one two three four", call("charge", {"id": session_of(request)}))
    return reply("finished")


class KilledMidStream(LedgerModel):
    async def stream(self, request: ModelRequest) -> Any:
        count = 0
        async for event in super().stream(request):
            yield event
            if event["type"] == "text-delta":
                count += 1
                if count == 2:
                    kill_point("model-stream")


def charge(args: dict[str, Any]) -> str:
    note("effect", "charge", args["id"])
    kill_point("unsafe-tool")
    return "charged"


crashy = Agent(model=KilledMidStream(slow_stream), tools={"charge": Tool(parameters=SCHEMA, execute=charge)},
               max_steps=5)


async def echo(request: ModelRequest) -> Any:
    await asyncio.sleep(0.3)  # long enough that two unserialised runs would overlap
    return reply(f"seen {sum(1 for m in request.messages if m['role'] == 'user')} prompts")


serial = Agent(model=LedgerModel(echo), max_steps=2)


async def fan_out(request: ModelRequest) -> Any:
    """Turn 0: three unsafe tools at once (slow, finishing out of order); turn 1: a tool that kills the
    process once (so everything before is replayed); then an answer."""
    turn = sum(1 for m in request.messages if m["role"] == "assistant")
    who = session_of(request)
    if turn == 0:
        return reply("", *(call("work", {"id": f"{who}-{n}", "delay": d}) for n, d in ((1, 0.3), (2, 0.0), (3, 0.15))))
    if turn == 1:
        return reply("", call("halt", {"id": who}))
    return reply("fanned out")


async def work(args: dict[str, Any]) -> str:
    await asyncio.sleep(args["delay"])
    note("effect", "work", args["id"])
    return f"worked {args['id']}"


def halt(args: dict[str, Any]) -> str:
    kill_point("after-fan-out")
    return "halted"


WORK_SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}, "delay": {"type": "number"}}}
parallel = Agent(model=LedgerModel(fan_out), max_steps=5,
                 tools={"work": Tool(parameters=WORK_SCHEMA, execute=work),
                        "halt": Tool(parameters=SCHEMA, execute=halt, replay="safe")})


async def mixed_round(request: ModelRequest) -> Any:
    """Turn 0: the safe `lookup` and `tag` and the unsafe `charge` in one round, in the order the prompt
    names them (``<session> <first> <second> <third>``); then an answer."""
    turn = sum(1 for m in request.messages if m["role"] == "assistant")
    if turn == 0:
        who, *order = str(next(m for m in request.messages if m["role"] == "user")["content"]).split()
        return reply("", *(call(name, {"id": who}) for name in order))
    return reply("round done")


async def lookup(args: dict[str, Any]) -> dict[str, Any]:
    """Slow and safe: still running when `charge` kills the process (kill point ``charge-mid-round:<id>``),
    or killing it after `charge` finished (``lookup-mid-round:<id>``)."""
    note("effect", "lookup", args["id"])
    await asyncio.sleep(0.5)
    kill_point(f"lookup-mid-round:{args['id']}")
    return {"id": args["id"], "amount": 42}


def charge_once(args: dict[str, Any]) -> str:
    """Unsafe, and it stages tool state: the state write must not depend on which call of the round ends first."""
    note("effect", "charge", args["id"])
    context = current_tool_call()
    assert context is not None
    context.stage_tool_state([{"op": "set", "key": "charged", "value": args["id"]}])
    kill_point(f"charge-mid-round:{args['id']}")
    return "charged"


async def tag(args: dict[str, Any]) -> str:
    """Safe, ending between `charge` and `lookup`: its completion is input that makes the process send what
    it wrote after `charge` ended before `lookup` kills it."""
    await asyncio.sleep(0.1)
    return "tagged"


ROUND_TOOLS = {"lookup": Tool(parameters=SCHEMA, execute=lookup, replay="safe"),
               "charge": Tool(parameters=SCHEMA, execute=charge_once),
               "tag": Tool(parameters=SCHEMA, execute=tag, replay="safe")}
rounds = Agent(model=LedgerModel(mixed_round), max_steps=5, tools=ROUND_TOOLS)
gated = Agent(model=LedgerModel(mixed_round), max_steps=5, tools=ROUND_TOOLS, max_tool_concurrency=2)


async def model_down(request: ModelRequest) -> Any:
    """Down for a prompt that says "fail"; otherwise it tells how many prompts it sees."""
    last = [m for m in request.messages if m["role"] == "user"][-1]
    if "fail" in str(last["content"]):
        raise ValueError("model down")
    return reply(f"fine, {sum(1 for m in request.messages if m['role'] == 'user')} prompts")


failing = Agent(model=LedgerModel(model_down), max_steps=2)


async def overloaded_once(request: ModelRequest) -> Any:
    """Overloaded (a retryable provider error) on the session's first request, then it answers."""
    who = session_of(request)
    begun = [line for line in (LEDGER / "ledger").read_text().splitlines() if line.startswith(f"model {who} ")]
    if len([line for line in begun if line.endswith("begin")]) == 1:
        raise ModelCallError("overloaded", provider="test", kind="overloaded", retryable=True, status=529,
                             retry_after_ms=300)
    return reply("answered after a retry")


busy = Agent(model=LedgerModel(overloaded_once), max_steps=2,
             retry=RetryPolicy(attempts=3, initial_delay_ms=100, max_delay_ms=100, jitter=False))


MCP_LEDGER = LEDGER / "mcp-ledger.jsonl"
"""The MCP test server's own ledger (tests/mcp_test_server.py): its effects, counted across SIGKILLs."""


async def mcp_turns(request: ModelRequest) -> Any:
    """The MCP server adds the tool `extra` (announcing it), then the unsafe `charge` (the test SIGKILLs the
    process while it runs), then the new tool, then an answer. Notes whether each request offered `extra`."""
    who = session_of(request)
    note("offered", who, "extra" in {spec.name for spec in request.tools})
    parts: list[Any] = [p for m in request.messages if m["role"] == "tool" for p in m["content"]]
    answered = {p["tool_call_id"] for p in parts}
    if "grow-1" not in answered:
        return reply("", call("grow", {}, "grow-1"))
    if "charge-1" not in answered:
        return reply("", call("charge", {"account": who, "amount": 7}, "charge-1"))
    if "extra-1" not in answered:
        return reply("", call("extra", {}, "extra-1"))
    return reply("mcp done")


bank = StdioServer(sys.executable, [str(Path(__file__).resolve().parent / "mcp_test_server.py"), str(MCP_LEDGER)],
                   name="bank", connect_timeout=60, env={"MCP_TEST_PAUSE": "1.5"})
mcp_agent = Agent(model=LedgerModel(mcp_turns), max_steps=6, mcp_servers=[bank])


class ReplayConformance(DurableRuntimeConformance):
    mode = "replay"


conformance = restate.VirtualObject("conformance")


@conformance.handler()
async def case(ctx: restate.ObjectContext, name: str) -> dict[str, Any]:
    """Run one case of the runtime conformance suite inside this invocation; its outcome as data."""
    suite = ReplayConformance()
    suite.session = ctx.key()
    try:
        await getattr(suite, name)(lambda clock: RestateRuntime(ctx), Clock())
    except Exception:  # noqa: BLE001 - the failure goes back to the test as text
        return {"failed": traceback.format_exc()}
    return {"passed": name}


@conformance.handler()
async def durable_sleep(ctx: restate.ObjectContext, ms: int) -> int:
    """`RunScope.sleep` in replay mode: what a model retry policy waits through between attempts."""
    scope = await RestateRuntime(ctx).open_run(session_id=ctx.key(), run_id="r")
    before = scope.now()
    await scope.sleep(ms)
    return before


@conformance.handler()
async def awakeable_outcomes(ctx: restate.ObjectContext, timeout_ms: int) -> list[Any]:
    """An awakeable nobody resolves times out on a durable timer; one resolved through the journal is answered."""
    scope = await RestateRuntime(ctx).open_run(session_id=ctx.key(), run_id="r")
    lonely = await scope.awakeable("r:0:lonely:0", timeout_ms=timeout_ms)
    answered = await scope.awakeable("r:0:answered:0", timeout_ms=60_000)
    ctx.resolve_awakeable(answered.id, {"approved": True})  # as another process would, through Restate
    return [(await lonely.wait()).timed_out, (await answered.wait()).value]


def app() -> Any:
    services = [conformance, *agent_services(readme, name="readme", retry_policy=RETRY, inactivity_timeout=INACTIVITY),
                # The README agent again, its parked run kept on its stream (not suspended) for a minute.
                *agent_services(readme, name="patient", retry_policy=RETRY, inactivity_timeout=timedelta(minutes=1)),
                *agent_services(crashy, name="crashy", retry_policy=RETRY, inactivity_timeout=INACTIVITY),
                *agent_services(serial, name="serial", retry_policy=RETRY, inactivity_timeout=INACTIVITY),
                *agent_services(failing, name="failing", retry_policy=RETRY, inactivity_timeout=INACTIVITY),
                *agent_services(busy, name="busy", retry_policy=RETRY, inactivity_timeout=INACTIVITY),
                *agent_services(parallel, name="parallel", retry_policy=RETRY, inactivity_timeout=INACTIVITY),
                *agent_services(rounds, name="rounds", retry_policy=RETRY, inactivity_timeout=INACTIVITY),
                *agent_services(gated, name="gated", retry_policy=RETRY, inactivity_timeout=INACTIVITY),
                # An MCP server connects and calls for seconds on a loaded machine: the attempt is kept meanwhile.
                *agent_services(mcp_agent, name="mcp", retry_policy=RETRY, inactivity_timeout=timedelta(minutes=1))]
    return restate.app(services)


def traced() -> None:
    """Trace every run (an SDK provider, no exporter): a replay's spans are new ones, and what a run writes
    must still come out as the journal has it."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())


if __name__ == "__main__":
    traced()
    asyncio.run(serve(app(), port=int(sys.argv[1])))
