"""The tools of a run's tool sources (`mcp_servers=`): opened for the run, listed, recorded once on a journal.

A run enters each source before its first model call (a source that cannot open fails the run
there, with its own error, `MCPServerError` for an MCP server), binds their tools beside the
run's own, and leaves the sources when it ends (a source the caller opened stays open).

On a durable runtime the sources' listing is one step of the run (kind ``tool-listing``, turn 0):
its record rides on the run's next write (no commit of its own), and a resumed run binds the
recorded listing instead of the live one. So the model is offered on every step what it was
offered when the run started, whichever process continues it and whatever the servers offer
now; a tool a server dropped since stays offered and its call is an error result. A run's
listing is taken once: a server's later changes reach the next run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from ._storage.keys import step_key
from ._storage.records import StepRequest
from ._storage.scope import StepLive
from .errors import ConfigurationError
from .tools import Tool

if TYPE_CHECKING:
    from .durability import Durability
    from .options import RunOptions

TOOL_LISTING = "tool-listing"
"""The kind of the step that records a run's tool listing."""

LISTING_CALL = "@tools"
"""The `call` of that step's key (a model's tool call ids never start with ``@``)."""

_RECORD_WITH_NEXT_WRITE = StepLive(defer_done=True)


@asynccontextmanager
async def run_tools(options: RunOptions, durability: Durability, run_id: str | None) -> AsyncIterator[dict[str, Tool]]:
    """The run's tools: `options.tools` and its sources' tools, the sources open while the body runs."""
    if not options.mcp_servers:
        yield dict(options.tools)
        return
    async with AsyncExitStack() as stack:
        for source in options.mcp_servers:
            await stack.enter_async_context(source)
        listings = await _recorded_listings(durability, run_id, {s.name: s.listing() for s in options.mcp_servers})
        tools: dict[str, Tool] = dict(options.tools)
        for source in options.mcp_servers:
            for name, tool in source.bind(listings.get(source.name, [])).items():
                if name in tools:
                    raise ConfigurationError(
                        f"tool {name!r} of MCP server {source.name} clashes with another tool of the run; "
                        "give the server a prefix= (or leave the tool out with its tool_filter=)"
                    )
                tools[name] = tool
        yield tools


async def _recorded_listings(durability: Durability, run_id: str | None, live: dict[str, Any]) -> Mapping[str, Any]:
    """`live`, recorded as the run's listing step; on a run that recorded one already, the recorded one."""
    request = StepRequest(step_key(run_id or "run", 0, LISTING_CALL), TOOL_LISTING, "safe")

    async def record(_context: Any) -> Any:
        return live

    outcome = await durability.step(request, record, _RECORD_WITH_NEXT_WRITE)
    recorded = getattr(outcome, "value", None)
    return recorded if isinstance(recorded, Mapping) else live
