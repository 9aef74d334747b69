"""An agent whose tools come from an MCP server (examples/mcp_files_server.py), durable on SQLite.

    python examples/mcp_agent.py [WORKDIR]

The scripted model (a stand-in for a real one) lists the files, reads the notes, and writes a summary;
`write_file` needs an approval, signed, which this script grants from "another process" (a second
`Agent` on the same database). Every MCP call is a journaled step: a crash mid-write would be reported
to the model as interrupted, never written twice; the reads would simply run again.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from durable_agent import (
    Agent,
    ApprovalSigner,
    DurableOptions,
    ModelRequest,
    ScriptedModel,
    ToolApprovalResponse,
    call,
    reply,
)
from durable_agent.backends.sqlite import SqliteRuntime
from durable_agent.mcp import StdioServer

SERVER = str(Path(__file__).resolve().parent / "mcp_files_server.py")


def model() -> ScriptedModel:
    def answer(request: ModelRequest) -> Any:
        done = sum(1 for m in request.messages if m["role"] == "tool")
        if done == 0:
            return reply("Let me look.", call("fs_list_files", {}, "ls"))
        if done == 1:
            return reply("Reading the notes.", call("fs_read_file", {"name": "notes.txt"}, "cat"))
        if done == 2:
            return reply("Writing the summary.",
                         call("fs_write_file", {"name": "summary.txt", "text": "2 notes: milk, bread."}, "w"))
        return reply("summary.txt now lists the 2 notes.")

    return ScriptedModel(answer)


def agent(runtime: SqliteRuntime, root: Path) -> Agent:
    files = StdioServer(sys.executable, [SERVER, str(root)], prefix="fs", needs_approval=["write_file"])
    return Agent(model=model(), mcp_servers=[files], approval_signer=ApprovalSigner("a-secret-of-at-least-32-bytes!!!"),
                 durable=DurableOptions(runtime), session_id="notes")


async def main(workdir: Path) -> None:
    root = workdir / "files"
    root.mkdir(parents=True, exist_ok=True)
    (root / "notes.txt").write_text("milk\nbread\n", encoding="utf-8")
    with SqliteRuntime(workdir / "runs.db") as runtime:
        parked = await agent(runtime, root).run("Summarize my notes into summary.txt.")
        for request in parked.pending_approvals:
            print(f"needs approval: {request.tool_name} {request.input['name']}")
        verdicts = [ToolApprovalResponse(r.approval_id, True, token=r.token) for r in parked.pending_approvals]
        done = await agent(runtime, root).resume(approval_responses=verdicts)  # e.g. in another process
        assert done is not None
        print(done.text, "|", (root / "summary.txt").read_text(encoding="utf-8"))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp)))
