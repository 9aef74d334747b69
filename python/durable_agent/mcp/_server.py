"""`Server`, `StdioServer`, `HttpServer`: an MCP server's tools as `Tool`s of a run (see the package docs)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict, Unpack

from .._errors import ConfigurationError, MCPServerError
from .._tool_calls import current_tool_call
from .._tools import Tool, ToolResult
from ._connection import Connection, ServerConnection
from ._results import tool_result

if TYPE_CHECKING:
    from .._transport import HttpTransport
    from ._connection import Progress
    from ._stderr import StderrTail

ApprovalRule = bool | Collection[str] | Callable[[str, Any], "bool | Awaitable[bool]"]
"""Which calls need approval: all or none, the server's names of the tools that do, or a function of
(the server's tool name, the call's input)."""

ToolFilter = Collection[str] | Callable[[Mapping[str, Any]], bool]
"""Which tools the model is offered: the server's names of those, or a function of a tool as the server
lists it (JSON: ``name``, ``description``, ``inputSchema``, ``annotations``, ...)."""

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_CALL_TIMEOUT = 300.0


class ServerOptions(TypedDict, total=False):
    """What every server takes, after its address.

    `name` identifies it in a run's recorded listing (default: `prefix`, else its command or URL);
    `prefix` makes the model call its tool ``t`` as ``<prefix>_t``; `tool_filter` chooses what is
    offered; `replay` overrides per tool whether a call cut by a crash runs again (default: ``safe``
    when the server says ``readOnlyHint: true``, else ``unsafe``); `needs_approval` as for a `Tool`,
    by the server's tool names or a function of (name, input); `connect_timeout` bounds connecting
    and ``initialize`` (default 10 s); `call_timeout` each call (default 300 s; None: no bound).
    """

    name: str | None
    prefix: str | None
    tool_filter: ToolFilter | None
    replay: Mapping[str, Literal["safe", "unsafe"]] | None
    needs_approval: ApprovalRule
    connect_timeout: float
    call_timeout: float | None


class Server:
    """An MCP server whose tools a run offers the model; a `ToolSource` (`mcp_servers=[...]`). Its options:
    `ServerOptions`.

    Open it with ``async with`` (connect, initialize, list the tools), or let each run that
    has it in `mcp_servers` open it for the run. Entering an open server only counts a user;
    the last to leave closes it. A server found broken (it went away) is reconnected when next
    entered. `tools` gives its tools by the name the model calls them.
    """

    def __init__(self, label: str, **options: Unpack[ServerOptions]) -> None:
        unknown = set(options) - set(ServerOptions.__annotations__)
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        name, prefix, tool_filter = options.get("name"), options.get("prefix"), options.get("tool_filter")
        replay, needs_approval = options.get("replay"), options.get("needs_approval", False)
        connect_timeout = options.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
        call_timeout = options.get("call_timeout", DEFAULT_CALL_TIMEOUT)
        if prefix is not None and (not isinstance(prefix, str) or not prefix):
            raise ConfigurationError(f"an MCP server's prefix must be a non-empty str, got {prefix!r}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigurationError(f"an MCP server's name must be a non-empty str, got {name!r}")
        if not (tool_filter is None or callable(tool_filter) or _is_names(tool_filter)):
            raise ConfigurationError("tool_filter must be a collection of tool names or a function of a tool")
        if not (isinstance(needs_approval, bool) or callable(needs_approval) or _is_names(needs_approval)):
            raise ConfigurationError("needs_approval must be a bool, a collection of tool names or a function")
        if replay is not None and (not isinstance(replay, Mapping)
                                   or any(policy not in ("safe", "unsafe") for policy in replay.values())):
            raise ConfigurationError("replay maps tool names to 'safe' or 'unsafe'")
        for what, seconds in (("connect_timeout", connect_timeout), ("call_timeout", call_timeout)):
            if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                                        or seconds <= 0):
                raise ConfigurationError(f"{what} must be a positive number of seconds, got {seconds!r}")
        self._label = label
        self._name = name or prefix or label
        self.prefix = prefix
        self.tool_filter = tool_filter
        self.replay = dict(replay or {})
        self.needs_approval = needs_approval
        self.connect_timeout = float(connect_timeout)
        self.call_timeout = None if call_timeout is None else float(call_timeout)
        self._connection: ServerConnection | None = None
        self._listed: list[dict[str, Any]] = []
        self._users = 0
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._bound: dict[tuple[str, bool], Tool] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._label})"

    @property
    def name(self) -> str:
        """Names this server in a run's recorded tool listing: its `name=`, else its prefix, else its command or URL."""
        return self._name

    def _connect(self) -> ServerConnection:
        """A new, unopened connection to the server."""
        raise NotImplementedError

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Server:
        async with self._guard():
            if self._connection is None or self._connection.broken:
                if self._connection is not None:
                    await self._connection.close()
                    self._connection = None
                connection = self._connect()
                self._listed = await connection.open(self.connect_timeout)
                self._connection = connection
            self._users += 1
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        async with self._guard():
            self._users -= 1
            if self._users == 0 and self._connection is not None:
                connection, self._connection = self._connection, None
                await connection.close()

    @asynccontextmanager
    async def _guard(self) -> AsyncIterator[None]:
        """One lock per event loop (a server object may outlive one `asyncio.run`)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        async with self._lock:
            yield

    # --------------------------------------------------------------- tools

    @property
    def tools(self) -> dict[str, Tool]:
        """The tools offered now, by the name the model calls them (the server must be open)."""
        return self.bind(self.listing())

    @property
    def changed(self) -> bool:
        """The server announced a change of its tools (``notifications/tools/list_changed``) since they were listed."""
        return self._connection is not None and self._connection.tools_changed

    async def refresh(self) -> None:
        """List the tools again (`listing` gives the new ones); bounded by `connect_timeout`."""
        if self._connection is None:
            raise MCPServerError(self._label, "is not open (enter it with `async with`, or pass it in mcp_servers=)")
        self._listed = await self._connection.relist(self.connect_timeout)

    def listing(self) -> list[dict[str, Any]]:
        """The tools offered now, as data: name, the server's name for it, description, input schema, read-only."""
        if self._connection is None:
            raise MCPServerError(self._label, "is not open (enter it with `async with`, or pass it in mcp_servers=)")
        return [
            {
                "name": f"{self.prefix}_{tool['name']}" if self.prefix else tool["name"],
                "tool": tool["name"],
                "description": tool.get("description") or "",
                "parameters": tool.get("inputSchema") or {"type": "object"},
                "read_only": (tool.get("annotations") or {}).get("readOnlyHint") is True,
            }
            for tool in self._listed
            if self._offers(tool)
        ]

    def bind(self, listing: Sequence[Mapping[str, Any]]) -> dict[str, Tool]:
        """Tools for the entries of `listing`; a tool the server no longer lists answers with an error result."""
        live = {tool["name"] for tool in self._listed}
        tools: dict[str, Tool] = {}
        for entry in listing:
            key = (json.dumps(entry, sort_keys=True, default=str), entry["tool"] in live)
            tool = self._bound.get(key)
            if tool is None:
                tool = self._bound[key] = self._tool(entry, live=key[1])
            tools[entry["name"]] = tool
        return tools

    def _offers(self, tool: Mapping[str, Any]) -> bool:
        if self.tool_filter is None:
            return True
        if callable(self.tool_filter):
            return bool(self.tool_filter(tool))
        return tool["name"] in self.tool_filter

    def _tool(self, entry: Mapping[str, Any], *, live: bool) -> Tool:
        name: str = entry["tool"]
        replay = self.replay.get(name, "safe" if entry.get("read_only") else "unsafe")
        try:
            return Tool(description=entry.get("description") or "", parameters=entry["parameters"],
                        execute=self._executor(name) if live else self._vanished(name),
                        needs_approval=self._approval(name), replay=replay)
        except ConfigurationError as exc:
            raise ConfigurationError(f"MCP server {self._label}: tool {name!r}: {exc} "
                                     "(leave the tool out with tool_filter=)") from exc

    def _approval(self, name: str) -> bool | Callable[[Any], bool | Awaitable[bool]]:
        rule = self.needs_approval
        if isinstance(rule, bool):
            return rule
        if callable(rule):
            return lambda arguments: rule(name, arguments)
        return name in rule

    def _vanished(self, name: str) -> Callable[[Any], ToolResult]:
        def execute(_arguments: Any) -> ToolResult:
            return ToolResult(f"The MCP server {self._label} no longer offers the tool {name!r}.", is_error=True)

        return execute

    def _executor(self, name: str) -> Callable[[Any], Awaitable[ToolResult]]:
        async def execute(arguments: Any) -> ToolResult:
            return await self.call(name, arguments)

        return execute

    async def call(self, name: str, arguments: Any) -> ToolResult:
        """Call the server's tool `name` (the server must be open), as a run's tool call does.

        A timeout (`call_timeout`) cancels the call on the server and is an error result; so is an
        MCP error response. The server going away raises `MCPServerError`."""
        connection = self._connection
        if connection is None:
            raise MCPServerError(self._label, "is not open (enter it with `async with`, or pass it in mcp_servers=)")
        if not isinstance(arguments, dict):
            return ToolResult(f"The input of an MCP tool must be an object, not {type(arguments).__name__}.",
                              is_error=True)
        return tool_result(await connection.call(name, arguments, self.call_timeout, _progress_of_current_call()))


def _progress_of_current_call() -> Progress | None:
    """Forwards the server's progress notifications to the run's stream, when someone listens."""
    context = current_tool_call()
    if context is None or context.progress_sink is None:
        return None

    async def forward(progress: float, total: float | None, message: str | None) -> None:
        context.report_progress(progress, total, message)

    return forward


def _is_names(value: object) -> bool:
    return isinstance(value, Collection) and not isinstance(value, str | bytes) and all(
        isinstance(n, str) for n in value)


class StdioServer(Server):
    """An MCP server started as a subprocess (`command` with `args`), spoken to over its stdin/stdout.

    `env` is added to the few variables the SDK passes on (HOME, PATH, ...); `cwd` is where it
    runs. Its stderr goes on to ours, and its last 2 KB explain an `MCPServerError` (`.stderr`):
    a server that fails to start or dies shows why (a Python server's traceback). The process is started in its own process group, and the whole
    group is ended when the connection closes.
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        **options: Unpack[ServerOptions],
    ) -> None:
        if not isinstance(command, str) or not command:
            raise ConfigurationError(f"StdioServer needs a command (a non-empty str), got {command!r}")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ConfigurationError("StdioServer args must be a sequence of str (not one str)")
        self.command = command
        self.args = list(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        super().__init__(f"`{shlex.join([command, *self.args])}`", **options)

    def _connect(self) -> ServerConnection:
        from ._stderr import StderrTail

        stderr = StderrTail()
        return Connection(self._label, lambda: self._stdio_transport(stderr), stderr)

    @asynccontextmanager
    async def _stdio_transport(self, stderr: StderrTail) -> AsyncIterator[Any]:
        from mcp import StdioServerParameters, stdio_client

        parameters = StdioServerParameters(command=self.command, args=self.args, env=self.env, cwd=self.cwd)
        try:
            async with stdio_client(parameters, errlog=stderr.writer) as streams:
                stderr.spawned()
                yield streams
        finally:
            stderr.spawned()


class HttpServer(Server):
    """An MCP server at `url`, spoken to over streamable HTTP, with `headers` on every request.

    `transport`: None uses the SDK's client when the `mcp` SDK is installed, else (under Pyodide, in a
    Worker) durable-agent's own client over the package's HTTP transport (`_plain_http`: fetch there);
    an `HttpTransport` (``durable_agent._transport``) always uses the own client, over it.
    """

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        transport: HttpTransport | None = None,
        **options: Unpack[ServerOptions],
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"HttpServer needs an http:// or https:// url, got {url!r}")
        if transport is not None and not callable(getattr(transport, "handle_async_request", None)):
            raise ConfigurationError("transport must be an HttpTransport (with handle_async_request)")
        self.url = url
        self.headers = dict(headers or {})
        self.transport = transport
        super().__init__(url, **options)

    def _connect(self) -> ServerConnection:
        if self.transport is None and importlib.util.find_spec("mcp") is not None:
            return Connection(self._label, self._sdk_transport)
        from .._transport import default_transport
        from ._plain_http import PlainHttpConnection

        return PlainHttpConnection(self._label, self.url, self.headers, self.transport or default_transport())

    @asynccontextmanager
    async def _sdk_transport(self) -> AsyncIterator[Any]:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        timeout = httpx2.Timeout(self.connect_timeout, read=self.call_timeout)
        async with httpx2.AsyncClient(headers=self.headers, timeout=timeout) as client, \
                streamable_http_client(self.url, http_client=client) as streams:
            yield streams
