"""An MCP server for the tests, written with the SDK's `MCPServer`: every effect is a line of a ledger file.

    python tests/mcp_test_server.py LEDGER                 # over stdio
    python tests/mcp_test_server.py LEDGER --http PORT     # streamable HTTP under uvicorn, at /mcp

The ledger (one JSON line per event, one O_APPEND write each) is the server's own record,
independent of any journal: a crash test counts effects in it. ``MCP_TEST_PAUSE`` (seconds,
default 0) is how long `charge` waits before its effect and again after it, so a test can
kill the client in either window; `balance` (read-only) takes three times as long, so it is
still running in both. ``MCP_TEST_TOOLS=extra`` offers one more tool (a server
that changed its tools); so does a call of `grow`, which also announces the change.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

LEDGER = sys.argv[1]
PAUSE = float(os.environ.get("MCP_TEST_PAUSE", "0"))
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(24))

server = MCPServer("ledger")


def log(**entry: Any) -> None:
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps({**entry, "pid": os.getpid()}) + "\n").encode())
    finally:
        os.close(fd)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def balance(account: str) -> str:
    """Read an account's balance (read-only)."""
    log(event="read", account=account)
    await anyio.sleep(3 * PAUSE)
    return f"{account}: 100"


@server.tool()
async def charge(account: str, amount: int) -> str:
    """Charge an account (a side effect: must not run twice)."""
    log(event="charge-start", account=account, amount=amount)
    await anyio.sleep(PAUSE)
    log(event="charge", account=account, amount=amount)
    await anyio.sleep(PAUSE)
    return f"charged {amount} to {account}"


@server.tool()
async def refuse(reason: str) -> str:
    """Always fails: its result has isError true."""
    raise ToolError(f"refused: {reason}")


@server.tool()
async def slow(seconds: float, ctx: Context) -> str:
    """Report progress every 0.1 s for `seconds`; logs when it is cancelled."""
    steps = max(1, int(seconds * 10))
    try:
        for step in range(steps):
            await ctx.report_progress(step + 1, steps, f"step {step + 1}")
            await anyio.sleep(0.1)
    except anyio.get_cancelled_exc_class():
        log(event="cancelled", tool="slow")
        raise
    return "slept"


@server.tool(structured_output=False)
async def snapshot() -> list[Any]:
    """An image and a text."""
    return [Image(data=PNG, format="png"), "a screenshot"]


@server.tool(structured_output=True)
async def stats(account: str) -> dict[str, int]:
    """Structured content."""
    return {"charges": 2, "refunds": 0}


@server.tool()
async def exit_now() -> str:
    """The server process dies mid-call, saying why on its stderr."""
    log(event="exit")
    os.write(2, b"exit_now: the ledger server gives up\n")
    os._exit(3)


async def extra() -> str:
    """Only offered when MCP_TEST_TOOLS=extra, or once `grow` ran."""
    log(event="extra")
    return "extra"


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds the tool `extra` and announces the change (``notifications/tools/list_changed``)."""
    if "extra" not in {tool.name for tool in await server.list_tools()}:
        server.add_tool(extra)
    await ctx.session.send_tool_list_changed()
    log(event="grow")
    return "grown"


if os.environ.get("MCP_TEST_TOOLS") == "extra":
    server.add_tool(extra)


if __name__ == "__main__":
    log(event="server-start")
    if "--http" in sys.argv:
        import uvicorn

        port = int(sys.argv[sys.argv.index("--http") + 1])
        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")
    else:
        server.run()
