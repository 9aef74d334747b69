"""MCP servers' tools in runs (`durable_agent.mcp`), against the SDK-written test server as a real stdio
subprocess and under uvicorn: results of every content kind, validation, approvals, progress, timeouts with
MCP cancellation, the recorded tool listing, and failures that end in `MCPServerError` without a leaked process."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from durable_agent import (
    Agent,
    ApprovalSigner,
    ConfigurationError,
    DurableOptions,
    InMemoryCheckpointStore,
    Message,
    ModelRequest,
    ScriptedModel,
    StreamToolProgress,
    Tool,
    ToolApprovalResponse,
    call,
    generate_text,
    reply,
    resume_from_checkpoint,
    stream_chat,
)
from durable_agent.mcp import HttpServer, MCPServerError, StdioServer
from mcp_kit import effects, http_server, ledger_entries, processes_naming, stdio_args, wait_until

pytestmark = [
    pytest.mark.host_only("starts MCP servers (the mcp SDK) as subprocesses"),
    pytest.mark.kernel_independent,  # its subject: the MCP protocol and its servers (the rule: pyproject.toml)
]

USER: list[Message] = [{"role": "user", "content": "go"}]
SECRET = "s" * 32
# In every command line of the cannot-start test, so its process-table check sees only this pytest's processes
# (scripts/test runs the native and the pure pass at once, on one process table). Also `sleep`'s argument.
MARK = f"4242.{os.getpid()}"


def server(ledger: Path, **options: Any) -> StdioServer:
    """The test server; importing the SDK's server takes seconds on a loaded machine, hence the timeout."""
    return StdioServer(sys.executable, stdio_args(ledger), **{"connect_timeout": 60, **options})


class Recorder:
    """A scripted model that answers from `turns` in order and keeps every request it was sent."""

    def __init__(self, *turns: Any) -> None:
        self.turns = list(turns)
        self.requests: list[ModelRequest] = []
        self.model = ScriptedModel(self._answer)

    def _answer(self, request: ModelRequest) -> Any:
        self.requests.append(request)
        return self.turns[len(self.requests) - 1]

    def offered(self, n: int = 0) -> dict[str, Any]:
        return {spec.name: spec.parameters for spec in self.requests[n].tools}


def results_of(messages: Any) -> dict[str, dict[str, Any]]:
    return {p["tool_call_id"]: p for m in messages if m["role"] == "tool" for p in m["content"]}


async def test_a_run_offers_the_servers_tools_and_keeps_every_kind_of_result(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    model = Recorder(reply("", call("bank_balance", {"account": "a"}, "b"), call("bank_charge", {"account": "a", "amount": 3}, "c"),
                           call("bank_refuse", {"reason": "no"}, "r"), call("bank_snapshot", {}, "s"),
                           call("bank_stats", {"account": "a"}, "st"),
                           call("bank_charge", {"account": "a", "amount": "three"}, "bad")),
                     reply("done"))
    local = Tool(execute=lambda _input: "local", description="a local tool")
    result = await generate_text(model=model.model, messages=USER, tools={"local": local},
                                 mcp_servers=[server(ledger, prefix="bank", tool_filter=lambda t: t["name"] != "exit_now")])

    offered = model.offered()
    assert "local" in offered and "bank_exit_now" not in offered
    assert offered["bank_charge"]["properties"]["amount"]["type"] == "integer"  # the server's own schema
    got = results_of(result.messages)
    assert got["b"]["output"] == {"result": "a: 100"} and not got["b"]["is_error"]
    assert got["c"]["output"] == {"result": "charged 3 to a"}
    assert got["r"]["is_error"] and "refused: no" in got["r"]["output"]  # isError: true, seen by the model
    assert got["s"]["output"] == "a screenshot"
    (image,) = got["s"]["attachments"]
    assert image["media_type"] == "image/png" and image["data"].startswith(b"\x89PNG")
    assert got["st"]["output"] == {"charges": 2, "refunds": 0}  # structuredContent
    assert got["bad"]["is_error"] and "Invalid input" in got["bad"]["output"]  # never reached the server
    assert [e["amount"] for e in effects(ledger, "charge")] == [3]
    assert result.text == "done"
    assert processes_naming(str(ledger)) == []  # the run opened the server, and closed it


async def test_concurrent_runs_share_one_connection_and_the_last_to_leave_closes_it(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    shared = server(ledger)

    async def one(account: str) -> str:
        model = ScriptedModel([reply("", call("charge", {"account": account, "amount": 1}, "c")), f"{account} done"])
        return (await generate_text(model=model, messages=USER, mcp_servers=[shared])).text

    assert await asyncio.gather(*(one(a) for a in "abc")) == ["a done", "b done", "c done"]
    assert len(effects(ledger, "server-start")) == 1 and sorted(e["account"] for e in effects(ledger, "charge")) == [
        "a", "b", "c"]
    assert processes_naming(str(ledger)) == []


async def test_an_agent_used_as_a_context_manager_keeps_its_servers_open_across_runs(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    model = Recorder(reply("", call("balance", {"account": "a"}, "b1")), reply("one"),
                     reply("", call("balance", {"account": "b"}, "b2")), reply("two"))
    async with Agent(model=model.model, mcp_servers=[server(ledger)]) as agent:
        assert (await agent.run("first")).text == "one" and (await agent.run("second")).text == "two"
        assert processes_naming(str(ledger)) != []
    assert len(effects(ledger, "server-start")) == 1 and len(effects(ledger, "read")) == 2
    assert processes_naming(str(ledger)) == []


@pytest.mark.parametrize("command, args, why", [
    (f"no-such-mcp-command-{MARK}", [], "command was not found"),
    ("sleep", [MARK], "did not answer initialize within 1 s"),
    (sys.executable, ["-c", f"import sys; sys.exit(42)  # {MARK}"],
     "closed the connection (exited?) before answering"),
])
async def test_a_server_that_cannot_start_fails_the_run_before_the_model_is_called(
        command: str, args: list[str], why: str) -> None:
    model = Recorder(reply("never"))
    mcp = StdioServer(command, args, connect_timeout=1)
    with pytest.raises(MCPServerError) as caught:
        await asyncio.wait_for(generate_text(model=model.model, messages=USER, mcp_servers=[mcp]), 60)
    assert why in str(caught.value) and command in str(caught.value)
    assert caught.value.code == "mcp_server"
    assert model.requests == []
    assert processes_naming(MARK) == []


async def test_a_stdio_server_that_crashes_at_start_shows_the_end_of_its_stderr_in_the_error() -> None:
    crash = "import sys; sys.stderr.write('x' * 10_000 + '\\n'); raise RuntimeError('no database configured (4244)')"
    model = Recorder(reply("never"))
    with pytest.raises(MCPServerError) as caught:
        await asyncio.wait_for(generate_text(model=model.model, messages=USER,
                                             mcp_servers=[StdioServer(sys.executable, ["-c", crash])]), 60)
    error = caught.value
    assert error.stderr.endswith("RuntimeError: no database configured (4244)")  # the server's traceback, its end
    assert "Traceback (most recent call last)" in error.stderr and len(error.stderr.encode()) <= 2048  # bounded
    assert str(error).endswith(error.stderr) and sys.executable in str(error)
    assert model.requests == [] and processes_naming("4244") == []


async def test_a_server_that_dies_mid_call_stops_the_run_with_a_typed_error(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    model = Recorder(reply("", call("exit_now", {}, "x")), reply("never"))
    with pytest.raises(MCPServerError, match="closed the connection during a call of tool 'exit_now'") as caught:
        await asyncio.wait_for(generate_text(model=model.model, messages=USER, mcp_servers=[server(ledger)]), 60)
    assert caught.value.stderr.endswith("exit_now: the ledger server gives up")  # why, from the server's stderr
    assert len(effects(ledger, "exit")) == 1 and len(model.requests) == 1
    assert processes_naming(str(ledger)) == []


@pytest.mark.requires_sqlite
async def test_a_durable_run_stopped_by_a_dying_server_resumes_with_the_call_reported_interrupted(tmp_path: Path) -> None:
    from durable_agent import TOOL_INTERRUPTED_MESSAGE
    from durable_agent.backends.sqlite import SqliteRuntime

    ledger = tmp_path / "ledger.jsonl"
    turns = [reply("", call("exit_now", {}, "x"), call("balance", {"account": "a"}, "b")), reply("done")]
    with SqliteRuntime(tmp_path / "runs.db") as runtime:
        agent = Agent(model=Recorder(*turns).model, durable=DurableOptions(runtime), session_id="s",
                      mcp_servers=[server(ledger, name="bank")])
        with pytest.raises(MCPServerError, match="exit_now"):
            await agent.run("go")
        assert processes_naming(str(ledger)) == []
        again = Recorder(*turns[1:])
        resumed = Agent(model=again.model, durable=DurableOptions(runtime), session_id="s",
                        mcp_servers=[server(ledger, name="bank")])
        done = await resumed.resume()  # reconnects (a new server process)
    assert done is not None and done.text == "done"
    got = results_of(done.messages)
    assert got["x"] == {**got["x"], "output": TOOL_INTERRUPTED_MESSAGE, "is_error": True}
    assert got["b"]["output"] == {"result": "a: 100"}
    assert len(effects(ledger, "exit")) == 1 and len(effects(ledger, "server-start")) == 2


async def test_a_call_past_its_timeout_is_cancelled_on_the_server_and_is_an_error_result(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    model = Recorder(reply("", call("slow", {"seconds": 30}, "s")), reply("done"))
    async with server(ledger, call_timeout=0.5) as mcp:
        result = await generate_text(model=model.model, messages=USER, mcp_servers=[mcp])
        assert wait_until(lambda: effects(ledger, "cancelled"))  # the server got notifications/cancelled
        assert processes_naming(str(ledger)) != []  # ...while it is still open: it was not just killed
    got = results_of(result.messages)["s"]
    assert got["is_error"] and "did not finish within 0.5 s and was cancelled" in got["output"]


async def test_progress_notifications_stream_as_parts_while_the_call_runs(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    model = Recorder(reply("", call("slow", {"seconds": 0.3}, "s")), reply("done"))
    stream = stream_chat(model=model.model, messages=USER, mcp_servers=[server(ledger)])
    parts = [part async for part in stream.full_stream]
    kinds = [p.type for p in parts]
    progress = [p for p in parts if isinstance(p, StreamToolProgress)]
    assert [(p.progress, p.total, p.message) for p in progress] == [(1, 3, "step 1"), (2, 3, "step 2"),
                                                                             (3, 3, "step 3")]
    assert {(p.tool_call_id, p.tool_name, p.step_index, p.attempt) for p in progress} == {("s", "slow", 0, 0)}
    assert kinds.index("tool-progress") < kinds.index("tool-result")


async def test_approvals_per_mcp_tool_carry_signed_tokens(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    model = Recorder(reply("", call("balance", {"account": "a"}, "b"), call("charge", {"account": "a", "amount": 500}, "c")),
                     reply("done"))
    signer, store = ApprovalSigner(SECRET), InMemoryCheckpointStore()
    rule = lambda name, args: name == "charge" and args["amount"] > 100  # noqa: E731
    async with server(ledger, needs_approval=rule) as mcp:
        first = await generate_text(model=model.model, messages=USER, mcp_servers=[mcp], store=store, run_id="r",
                                    approval_signer=signer)
        (request,) = first.pending_approvals
        assert first.finish_reason == "suspended" and request.tool_name == "charge" and request.token
        assert effects(ledger, "charge") == []
        forged = await resume_from_checkpoint(store, "r", model=model.model, mcp_servers=[mcp], approval_signer=signer,
                                              approval_responses=[ToolApprovalResponse(request.approval_id, True)])
        assert results_of(forged.messages)["c"]["is_error"] and effects(ledger, "charge") == []  # no token: denied
    store, model = InMemoryCheckpointStore(), Recorder(*model.turns)
    async with server(ledger, needs_approval=["charge"]) as mcp:
        first = await generate_text(model=model.model, messages=USER, mcp_servers=[mcp], store=store, run_id="r",
                                    approval_signer=signer)
        (request,) = first.pending_approvals
        done = await resume_from_checkpoint(store, "r", model=model.model, mcp_servers=[mcp], approval_signer=signer,
                                            approval_responses=[ToolApprovalResponse(request.approval_id, True,
                                                                                     token=request.token)])
    assert done.text == "done" and [e["amount"] for e in effects(ledger, "charge")] == [500]


async def test_read_only_tools_are_safe_unless_the_user_says_otherwise_and_names_must_not_clash(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    async with server(ledger, replay={"charge": "safe", "balance": "unsafe"}, prefix="x") as overridden, \
            server(ledger, tool_filter=["balance", "charge"]) as plain:
        assert {n: t.replay for n, t in plain.tools.items()} == {"balance": "safe", "charge": "unsafe"}
        assert overridden.tools["x_charge"].replay == "safe" and overridden.tools["x_balance"].replay == "unsafe"
        with pytest.raises(ConfigurationError, match=r"'balance' of MCP server .* clashes"):
            await generate_text(model=ScriptedModel(["hi"]), messages=USER, mcp_servers=[plain],
                                tools={"balance": Tool(execute=lambda _input: 1)})
    with pytest.raises(TypeError, match="timeout"):
        StdioServer("python", timeout=5)  # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="prefix"):
        StdioServer("python", prefix="")
    with pytest.raises(ConfigurationError, match="replay maps"):
        StdioServer("python", replay=["charge"])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="call_timeout"):
        HttpServer("http://127.0.0.1:9/mcp", call_timeout=0)
    with pytest.raises(ConfigurationError, match="distinct names"):
        await generate_text(model=ScriptedModel(["hi"]), messages=USER, mcp_servers=[server(ledger), server(ledger)])
    with pytest.raises(ConfigurationError, match="mcp_servers must be"):
        await generate_text(model=ScriptedModel(["hi"]), messages=USER, mcp_servers=["python server.py"])  # type: ignore[list-item, unused-ignore]


@pytest.mark.requires_sqlite
async def test_a_resumed_run_offers_the_recorded_listing_and_a_vanished_tool_is_an_error_result(tmp_path: Path) -> None:
    from durable_agent.backends.sqlite import SqliteRuntime

    ledger = tmp_path / "ledger.jsonl"
    turns = [reply("", call("charge", {"account": "a", "amount": 1}, "c")),
             reply("", call("extra", {}, "e")), reply("done")]
    with SqliteRuntime(tmp_path / "runs.db") as runtime:
        first = Recorder(*turns)
        changed = server(ledger, env={"MCP_TEST_TOOLS": "extra"}, name="bank", needs_approval=["charge"])
        agent = Agent(model=first.model, durable=DurableOptions(runtime), session_id="s", mcp_servers=[changed])
        parked = await agent.run("go")
        assert parked.finish_reason == "suspended" and "extra" in first.offered()
        (request,) = parked.pending_approvals

        second = Recorder(*turns[1:])
        now = server(ledger, name="bank", needs_approval=["charge"])  # no `extra`
        resumed = Agent(model=second.model, durable=DurableOptions(runtime), session_id="s", mcp_servers=[now])
        done = await resumed.resume(approval_responses=[ToolApprovalResponse(request.approval_id, True)])
    assert done is not None and done.text == "done"
    assert "extra" in second.offered(0) and second.offered(0) == first.offered(0)  # what the model saw before
    vanished = results_of(done.messages)["e"]
    assert vanished["is_error"] and "no longer offers the tool 'extra'" in vanished["output"]
    assert len(effects(ledger, "charge")) == 1


@pytest.mark.requires_sqlite
async def test_a_server_that_announces_new_tools_offers_them_from_the_next_step_recorded_once_per_change(
        tmp_path: Path) -> None:
    from durable_agent import parse_step_key
    from durable_agent.backends.sqlite import SqliteRuntime

    ledger = tmp_path / "ledger.jsonl"
    model = Recorder(reply("", call("grow", {}, "g")), reply("", call("extra", {}, "e")),
                     reply("", call("balance", {"account": "a"}, "b")), reply("done"))
    with SqliteRuntime(tmp_path / "runs.db") as runtime:
        agent = Agent(model=model.model, durable=DurableOptions(runtime), session_id="s",
                      mcp_servers=[server(ledger, name="bank")])
        done = await agent.run("go", run_id="r")
        listings = [(parse_step_key(r.key).turn, r.result["bank"]) for r in await runtime.inspect.steps("r")
                    if r.kind == "tool-listing"]
    assert done.text == "done" and results_of(done.messages)["e"]["output"] == {"result": "extra"}
    assert "extra" not in model.offered(0)
    assert all("extra" in model.offered(n) for n in (1, 2, 3))  # from the step after the announcement on
    assert [sorted(t["name"] for t in listing) for _turn, listing in sorted(listings)] == [
        sorted(model.offered(0)), sorted(model.offered(1))]  # once per change, not per step


async def test_generate_text_offers_a_servers_new_tools_from_the_next_step(tmp_path: Path) -> None:
    model = Recorder(reply("", call("grow", {}, "g")), reply("", call("extra", {}, "e")), reply("done"))
    done = await generate_text(model=model.model, messages=USER, mcp_servers=[server(tmp_path / "ledger.jsonl")])
    assert done.text == "done" and results_of(done.messages)["e"]["output"] == {"result": "extra"}
    assert "extra" not in model.offered(0) and "extra" in model.offered(1)


async def test_a_run_with_only_a_checkpoint_store_resumes_on_the_live_listing(tmp_path: Path) -> None:
    """Documented: without a runtime nothing is journaled, the listing included; `resume_from_checkpoint` offers what
    the servers offer now, and a pending call to a tool a server dropped is an error result, not a crash."""
    ledger, store = tmp_path / "ledger.jsonl", InMemoryCheckpointStore()
    first = Recorder(reply("", call("extra", {}, "e")))
    grown = server(ledger, env={"MCP_TEST_TOOLS": "extra"}, needs_approval=["extra"])
    parked = await generate_text(model=first.model, messages=USER, mcp_servers=[grown], store=store, run_id="r")
    (request,) = parked.pending_approvals
    second = Recorder(reply("done"))
    done = await resume_from_checkpoint(store, "r", model=second.model, mcp_servers=[server(ledger)],
                                        approval_responses=[ToolApprovalResponse(request.approval_id, True)])
    assert done.text == "done" and "extra" in first.offered() and "extra" not in second.offered()
    dropped = results_of(done.messages)["e"]
    assert dropped["is_error"] and "Unknown tool 'extra'" in dropped["output"] and effects(ledger, "extra") == []


@pytest.mark.requires_sqlite
async def test_a_run_resumed_without_a_server_its_listing_names_is_a_configuration_error(tmp_path: Path) -> None:
    from durable_agent.backends.sqlite import SqliteRuntime

    ledger = tmp_path / "ledger.jsonl"
    with SqliteRuntime(tmp_path / "runs.db") as runtime:
        agent = Agent(model=Recorder(reply("", call("charge", {"account": "a", "amount": 1}, "c"))).model,
                      durable=DurableOptions(runtime), session_id="s",
                      mcp_servers=[server(ledger, name="bank", needs_approval=True)])
        parked = await agent.run("go")
        assert parked.finish_reason == "suspended"
        other = Agent(model=Recorder(reply("never")).model, durable=DurableOptions(runtime), session_id="s",
                      mcp_servers=[server(ledger, name="shop")])
        with pytest.raises(ConfigurationError, match=r"MCP server\(s\) 'bank'.*lacks"):
            await other.resume(approval_responses=[ToolApprovalResponse(parked.pending_approvals[0].approval_id, True)])
    assert effects(ledger, "charge") == []


def http_transport(client: str) -> Any:
    """None: the SDK's client; else durable-agent's own client over the package's stdlib transport (what
    runs under Pyodide, over fetch)."""
    from durable_agent.providers import StdlibTransport

    return None if client == "sdk" else StdlibTransport()


@pytest.mark.parametrize("client", ["sdk", "plain"])
async def test_streamable_http_server_under_uvicorn(tmp_path: Path, client: str) -> None:
    ledger = tmp_path / "ledger.jsonl"
    model = Recorder(reply("", call("web_balance", {"account": "h"}, "b"), call("web_slow", {"seconds": 0.2}, "s"),
                           call("web_charge", {"account": "h", "amount": 2}, "c"),
                           call("web_refuse", {"reason": "no"}, "r"), call("web_snapshot", {}, "p")), reply("done"))
    with http_server(ledger) as url:
        mcp = HttpServer(url, headers={"X-Test": "1"}, prefix="web", connect_timeout=60,
                         transport=http_transport(client))
        stream = stream_chat(model=model.model, messages=USER, mcp_servers=[mcp])
        parts = [part async for part in stream.full_stream]
        result = await stream.result()
    got = results_of(result.messages)
    assert got["b"]["output"] == {"result": "h: 100"} and got["c"]["output"] == {"result": "charged 2 to h"}
    assert got["r"]["is_error"] and "refused: no" in got["r"]["output"]
    assert got["p"]["attachments"][0]["data"].startswith(b"\x89PNG")
    assert [p.progress for p in parts if isinstance(p, StreamToolProgress)] == [1, 2]
    assert [e["amount"] for e in effects(ledger, "charge")] == [2]
    assert len([e for e in ledger_entries(ledger) if e["event"] == "server-start"]) == 1


@pytest.mark.parametrize("client", ["sdk", "plain"])
async def test_an_http_server_that_is_not_there_is_a_typed_error(client: str) -> None:
    from mcp_kit import free_port

    url = f"http://127.0.0.1:{free_port()}/mcp"
    model = Recorder(reply("never"))
    with pytest.raises(MCPServerError, match=url.replace(".", r"\.")):
        await asyncio.wait_for(generate_text(model=model.model, messages=USER, mcp_servers=[
            HttpServer(url, connect_timeout=2, transport=http_transport(client))]), 60)
    assert model.requests == []


def test_http_servers_work_without_the_sdk_over_the_package_transport(tmp_path: Path) -> None:
    """What runs under Pyodide: `python -S` has no site-packages (no mcp, no httpx), only the standard library."""
    import subprocess

    import durable_agent

    probe = (
        "import asyncio, sys\n"
        "from durable_agent.mcp import HttpServer\n"
        "async def main(url):\n"
        "    async with HttpServer(url, connect_timeout=60) as server:\n"
        "        print((await server.call('balance', {'account': 'p'})).output)\n"
        "    assert not [m for m in sys.modules if m.split('.')[0] in ('mcp', 'httpx', 'httpx2', 'anyio')]\n"
        "asyncio.run(main(sys.argv[1]))\n"
    )
    with http_server(tmp_path / "ledger.jsonl") as url:
        done = subprocess.run([sys.executable, "-S", "-c", probe, url], capture_output=True, text=True, timeout=120,
                              env={"PYTHONPATH": str(Path(durable_agent.__file__).parent.parent)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'result': 'p: 100'}"


async def test_the_plain_http_client_cancels_a_call_past_its_timeout_on_the_server(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    model = Recorder(reply("", call("slow", {"seconds": 30}, "s")), reply("done"))
    with http_server(ledger) as url:
        mcp = HttpServer(url, call_timeout=0.5, connect_timeout=60, transport=http_transport("plain"))
        result = await generate_text(model=model.model, messages=USER, mcp_servers=[mcp])
        assert wait_until(lambda: effects(ledger, "cancelled"))  # notifications/cancelled reached the server
    got = results_of(result.messages)["s"]
    assert got["is_error"] and "did not finish within 0.5 s and was cancelled" in got["output"]


def test_the_readme_mcp_example_runs(tmp_path: Path) -> None:
    import subprocess

    example = Path(__file__).resolve().parent.parent / "examples" / "mcp_agent.py"
    done = subprocess.run([sys.executable, str(example), str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["needs approval: fs_write_file summary.txt",
                                        "summary.txt now lists the 2 notes. | 2 notes: milk, bread."]
    assert processes_naming(str(tmp_path)) == []


def test_the_plain_http_client_runs_inside_pyodide(tmp_path: Path) -> None:
    """The Pyodide claim, checked: the run above inside Pyodide in Node (fetch, no SDK), against uvicorn."""
    import json
    import shutil
    import subprocess

    root = Path(__file__).resolve().parent.parent
    if shutil.which("node") is None:
        pytest.fail("needs Node.js (and Pyodide: `npm ci` in pyodide/, as scripts/test-pyodide does)")
    if not (root / "pyodide" / "node_modules" / "pyodide-314" / "package.json").exists():  # as test_pyodide_runner
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=root / "pyodide",
                       check=True, timeout=600)
    with http_server(tmp_path / "ledger.jsonl") as url:
        done = subprocess.run(["node", str(root / "tests" / "mcp_pyodide.mjs"), url], capture_output=True, text=True,
                              timeout=300)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {"platform": "emscripten", "sdk_loaded": False, "text": "done", "balance": {"result": "w: 100"},
                       "refused": [True, "Error executing tool refuse: refused: no"], "image": "89504e47",
                       "progress": [1, 2]}
