"""One live MCP session on the official SDK, owned by a task of its own.

The SDK's transports and `ClientSession` are anyio context managers: they must be entered and
left by one task, in order. A run's loop is an async generator the caller drives, so the session
lives in an owner task instead, which opens it, answers `open()` with the tool list, then waits
to be told to close. Calls come from any task. `open()` is bounded (`timeout`), and so is
`close()`: the SDK's stdio transport closes the server's stdin, then SIGTERMs and SIGKILLs its
process group, each step bounded (about 4 s in all), so no child process outlives the connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import MCPServerError
from ._results import error_result, timed_out

if TYPE_CHECKING:
    from mcp import ClientSession, types

    from ._results import Wire
    from ._stderr import StderrTail



class Progress(Protocol):
    """Receives a call's progress notifications."""

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None: ...


logger = logging.getLogger("durable_agent")

Transport = Callable[[], AbstractAsyncContextManager[Any]]
"""Opens the SDK transport: yields its (read stream, write stream) pair."""

CLOSE_TIMEOUT = 8.0
"""How long `close()` waits for the owner task (the SDK bounds the stdio shutdown to about 4 s)."""


class ServerConnection(Protocol):
    """What a `Server` needs of a connection: this module's SDK session, or `_plain_http`'s."""

    label: str
    broken: bool
    tools_changed: bool
    """The server announced ``notifications/tools/list_changed`` since the tools were last listed."""

    async def open(self, timeout: float) -> list[dict[str, Any]]: ...

    async def relist(self, timeout: float) -> list[dict[str, Any]]:
        """List the tools again (within `timeout` seconds; `MCPServerError` otherwise), clearing `tools_changed`."""
        ...

    async def call(self, name: str, arguments: dict[str, Any], timeout: float | None,
                   progress: Progress | None) -> Wire: ...

    async def close(self) -> None: ...


class Connection:
    """An MCP session over `transport`, named `label` in errors. `open()` once, `call` any number of times,
    `close()` once."""

    def __init__(self, label: str, transport: Transport, stderr: StderrTail | None = None) -> None:
        """`stderr`: the server process's stderr, whose end explains its failures (a stdio server)."""
        self.label = label
        self._transport = transport
        self._stderr = stderr
        self._session: ClientSession | None = None
        self._closing = asyncio.Event()
        self._owner: asyncio.Task[None] | None = None
        self.broken = False  # the server went away: the next run opens a new connection
        self.tools_changed = False

    async def open(self, timeout: float) -> list[dict[str, Any]]:
        """Connect, initialize and list the tools, within `timeout` seconds; `MCPServerError` otherwise.

        On failure the owner task is gone (and any process it started) before this raises."""
        ready: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._owner = asyncio.ensure_future(self._own(ready, timeout))
        try:
            return await asyncio.wait_for(asyncio.shield(ready), timeout + CLOSE_TIMEOUT)
        except TimeoutError:  # the transport itself hung (the owner's deadline covers the rest)
            await self.close()
            raise await self._explained(MCPServerError(self.label, f"did not connect within {timeout:g} s")) from None
        except MCPServerError as exc:
            await self.close()
            raise await self._explained(exc) from exc.__cause__
        except BaseException:
            await self.close()
            raise

    async def _own(self, ready: asyncio.Future[list[dict[str, Any]]], timeout: float) -> None:
        """The owner task. The deadline covers initialize and the listing only, inside the transport and
        session contexts, so on a timeout those unwind in order (the SDK's shielded, bounded shutdown)."""
        import anyio
        from mcp import ClientSession

        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write, message_handler=self._notified))
                try:
                    with anyio.fail_after(timeout):
                        await session.initialize()
                        tools = [_wire(tool) async for tool in _listed(session)]
                        self.tools_changed = False
                except TimeoutError:
                    raise MCPServerError(self.label, f"did not answer initialize within {timeout:g} s") from None
                self._session = session
                if not ready.done():
                    ready.set_result(tools)
                await self._closing.wait()
        except BaseException as exc:  # noqa: BLE001 - handed to `open()`, or logged once connected
            self.broken = True
            if not ready.done():
                ready.set_exception(_server_error(self.label, "could not connect", exc))
            elif not isinstance(exc, asyncio.CancelledError):
                logger.warning("MCP server %s: the connection ended: %r", self.label, _leaf(exc))
        finally:
            self._session = None

    async def _notified(self, message: Any) -> None:
        """The session's message handler: notes a change of the server's tools (other messages need nothing)."""
        from mcp.types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self.tools_changed = True

    async def relist(self, timeout: float) -> list[dict[str, Any]]:
        """List the tools again, after the server announced a change (`ServerConnection.relist`)."""
        session = self._session
        if session is None:
            self.broken = True
            raise MCPServerError(self.label, "is not connected (its tools could not be listed again)")
        self.tools_changed = False  # a change announced while listing lists again at the next step
        try:
            async with asyncio.timeout(timeout):
                return [_wire(tool) async for tool in _listed(session)]
        except TimeoutError:
            raise MCPServerError(self.label, f"did not list its tools within {timeout:g} s") from None
        except Exception as exc:
            self.broken = True
            raise await self._explained(_server_error(self.label, "failed listing its tools again", exc)) from exc

    async def call(self, name: str, arguments: dict[str, Any], timeout: float | None,
                   progress: Progress | None) -> Wire:
        """Call tool `name`: its result, as JSON. An MCP error response is an error result, and so is a
        timeout (the SDK then sends the server ``notifications/cancelled``); the server going away raises
        `MCPServerError`."""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        session = self._session
        if session is None:
            self.broken = True
            raise MCPServerError(self.label, f"is not connected (tool {name!r} was not called)")
        try:
            result = await session.call_tool(name, arguments, read_timeout_seconds=timeout, progress_callback=progress)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT and timeout is not None:
                return timed_out(name, timeout)
            if exc.code != CONNECTION_CLOSED:
                return error_result(f"MCP error {exc.code}: {exc.message}")
            self.broken = True
            closed = MCPServerError(self.label, f"closed the connection during a call of tool {name!r}")
            raise await self._explained(closed) from exc
        except Exception as exc:
            # a pipe or socket error, or anyio's closed or broken stream: the server is gone
            if not isinstance(exc, OSError | EOFError) and not type(exc).__module__.startswith("anyio"):
                raise
            self.broken = True
            raise await self._explained(_server_error(self.label, f"failed during a call of tool {name!r}", exc)) from exc
        return _wire(result)

    async def _explained(self, error: MCPServerError) -> MCPServerError:
        """`error`, with the end of the server's stderr when it wrote some (a stdio server)."""
        stderr = await self._stderr.tail() if self._stderr is not None else ""
        return MCPServerError(error.server, error.problem, stderr=stderr) if stderr else error

    async def close(self) -> None:
        """End the session and its transport (the server process, for stdio); bounded, idempotent. A caller
        cancelled meanwhile leaves the owner task to finish the shutdown on its own (cancelling it could cut
        the SDK's process cleanup short)."""
        self._closing.set()
        owner = self._owner
        if owner is None or owner.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(owner), CLOSE_TIMEOUT)
        except TimeoutError:
            owner.cancel()
            logger.warning("MCP server %s did not close within %g s; its connection was cancelled",
                           self.label, CLOSE_TIMEOUT)


async def _listed(session: ClientSession) -> AsyncIterator[types.Tool]:
    """Every tool the server lists, page by page."""
    from mcp.types import PaginatedRequestParams

    cursor: str | None = None
    while True:
        page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
        for tool in page.tools:
            yield tool
        cursor = page.next_cursor
        if not cursor:
            return


def _wire(model: Any) -> dict[str, Any]:
    """An SDK model as its JSON form (camelCase keys), what `_results` reads."""
    wire: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return wire


def _leaf(exc: BaseException) -> BaseException:
    """The first error inside (anyio task groups wrap a failure in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _server_error(label: str, what: str, exc: BaseException) -> MCPServerError:
    from mcp.types import CONNECTION_CLOSED

    leaf = _leaf(exc)
    if isinstance(leaf, MCPServerError):
        return leaf
    detail = str(leaf) or type(leaf).__name__
    if isinstance(leaf, FileNotFoundError):
        detail = f"the command was not found ({detail})"
    elif getattr(leaf, "code", None) == CONNECTION_CLOSED:
        detail = "it closed the connection (exited?) before answering"
    error = MCPServerError(label, f"{what}: {detail}")
    error.__cause__ = leaf
    return error
