"""MCP servers' tools as durable steps (the official `mcp` SDK, extra ``durable-agent[mcp]``).

    async with StdioServer("python", ["files_server.py"], prefix="fs") as files:
        result = await generate_text(model=model, messages=..., mcp_servers=[files])

or `Agent(model=..., mcp_servers=[StdioServer(...), HttpServer("https://.../mcp")])`: each run
opens the servers it is given (a server opened by the caller stays open), offers their tools
beside its own, and closes what it opened when it ends. Each server tool is a `Tool`: its input
is checked against the server's JSON Schema before the server sees it, and every call is a
step of the run like a local tool's:

| the tool | after a crash mid-call | approval |
| --- | --- | --- |
| default | unsafe: not run again; the model is told it was interrupted | `needs_approval=` (names or a function) |
| ``readOnlyHint: true`` on the server | safe: run again | same, with signed tokens as for any tool |
| ``replay={"name": "safe"/"unsafe"}`` | as said, whatever the server hints | same |

* a result with ``isError: true``, an MCP error response, or a call past `call_timeout`
  (default 300 s; the SDK sends the server ``notifications/cancelled``) is an error result the
  model sees; text, structured content, images, audio and resources are kept (`_results`);
* the server's progress notifications stream to the caller as ``tool-progress`` parts;
* a server's ``notifications/tools/list_changed`` makes the run list its tools again before
  its next step; a durable run records its tool listing at its start and at each change, and a
  resumed run (in any process) offers the last recorded one (`durable_agent._tool_sources`); a
  tool the server dropped since answers with an error result, and a server the recorded listing
  names that the resuming run is not given is a `ConfigurationError`;
* a server that cannot be started, exits, or does not answer ``initialize`` within
  `connect_timeout` (default 10 s) raises `MCPServerError` (naming the command or URL, and
  carrying the last 2 KB of a stdio server's stderr, which still reaches ours) before the model
  is called, once its process is gone: at once for a server that exits when its stdin
  closes, else the SDK SIGTERMs its process group 2 s later (and SIGKILLs it 2 s after that);
  a server that goes away during a call stops the run the same way, as a process death would,
  so resuming it (which reconnects) reports an unsafe call interrupted and re-runs a safe one.

Nothing here is imported by ``import durable_agent``; the SDK is imported when a server is used.
Without the SDK (Pyodide, Workers), `HttpServer` uses the package's own streamable-HTTP client over
its HTTP transport (`_plain_http`: fetch there); `StdioServer` needs the SDK.
"""

from __future__ import annotations

from .._errors import MCPServerError
from ._server import ApprovalRule, HttpServer, Server, ServerOptions, StdioServer, ToolFilter

__all__ = ["ApprovalRule", "HttpServer", "MCPServerError", "Server", "ServerOptions", "StdioServer", "ToolFilter"]
