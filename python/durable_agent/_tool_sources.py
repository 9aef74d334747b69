"""The tools of a run's tool sources (`mcp_servers=`): opened for the run, listed, recorded on a journal at each change.

A run enters each source before its first model call (a source that cannot open fails the run
there, with its own error, `MCPServerError` for an MCP server), binds their tools beside the
run's own, and leaves the sources when it ends (a source the caller opened stays open).

A source whose tools changed (an MCP server's ``notifications/tools/list_changed``) is listed
again before the run's next step, and the model is offered the new tools from that step on.

On a durable runtime the listing is a step of the run (kind ``tool-listing``): at the run's start
(turn 0, call ``@tools``) and again at each change (the turn of the step it applies from, call
``@tools-changed``), each record the whole listing of every source; it rides on the run's next
write (no commit of its own). A resumed run binds the last recorded listing instead of the live
one, so the model is offered on every step what it was offered before the crash, whichever
process continues it and whatever the servers offer now: a tool a server dropped since stays
offered and its call is an error result, and a server the recorded listing names that the
resuming process does not give is a `ConfigurationError` (its tools cannot be offered).

Without a runtime (a checkpoint store alone) nothing is journaled, the listing neither: a checkpoint
keeps messages only, so a run resumed from one offers its sources' live listing, and a pending call
to a tool a source dropped is an unknown tool's error result.

A checkpoint-mode journal looks records up by key, so only a change is recorded. A replay-mode
journal (Restate) replays its entries by position, so a run with sources records a change check
at every step (an empty value when nothing changed): a replay must meet the same entries
whatever the servers announce in the replaying process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError
from ._storage.keys import parse_step_key, step_key
from ._storage.records import StepRecord, StepRequest
from ._storage.scope import DEFER_DONE
from ._tools import Tool, ToolSource

if TYPE_CHECKING:
    from ._durability import Durability
    from ._options import RunOptions

TOOL_LISTING = "tool-listing"
"""The kind of the steps that record a run's tool listing."""

LISTING_CALL = "@tools"
"""The `call` of the key of the listing a run starts with (a model's tool call ids never start with ``@``)."""

CHANGE_CALL = "@tools-changed"
"""The `call` of the key of a listing taken after a change, at the turn it applies from."""

Listings = Mapping[str, Sequence[Mapping[str, Any]]]
"""Each source's listing, by the source's name."""


class RunTools:
    """A run's tools: its own and its sources', bound to the listing the model is offered now."""

    def __init__(self, options: RunOptions, durability: Durability, run_id: str | None, listings: Listings) -> None:
        self._options = options
        self._durability = durability
        self._run_id = run_id
        self._listings = dict(listings)
        self.tools = self._bound()

    def _bound(self) -> dict[str, Tool]:
        tools: dict[str, Tool] = dict(self._options.tools)
        for source in self._options.mcp_servers:
            for name, tool in source.bind(self._listings.get(source.name, [])).items():
                if name in tools:
                    raise ConfigurationError(
                        f"tool {name!r} of MCP server {source.name} clashes with another tool of the run; "
                        "give the server a prefix= (or leave the tool out with its tool_filter=)"
                    )
                tools[name] = tool
        return tools

    async def at_step(self, turn: int) -> dict[str, Tool] | None:
        """The run's tools from step `turn` on, when a source changed them (recorded); None when unchanged."""
        sources = self._options.mcp_servers
        if not sources:
            return None
        changed = [source for source in sources if source.changed]
        if not changed and not self._durability.replays_by_position:
            return None

        async def relist(_context: Any) -> Any:
            for source in changed:
                await source.refresh()
            return {**self._listings, **{source.name: source.listing() for source in changed}} if changed else None

        request = StepRequest(step_key(self._run_id or "run", turn, CHANGE_CALL), TOOL_LISTING, "safe")
        listings = getattr(await self._durability.step(request, relist, DEFER_DONE), "value", None)
        if not isinstance(listings, Mapping):
            return None
        self._listings = dict(listings)
        self.tools = self._bound()
        return self.tools


@asynccontextmanager
async def run_tools(options: RunOptions, durability: Durability, run_id: str | None) -> AsyncIterator[RunTools]:
    """The run's tools (`RunTools`), its sources open while the body runs."""
    if not options.mcp_servers:
        yield RunTools(options, durability, run_id, {})
        return
    async with AsyncExitStack() as stack:
        for source in options.mcp_servers:
            await stack.enter_async_context(source)
        live = {source.name: source.listing() for source in options.mcp_servers}
        yield RunTools(options, durability, run_id, await _recorded_listings(options, durability, run_id, live))


async def _recorded_listings(options: RunOptions, durability: Durability, run_id: str | None,
                             live: Listings) -> Listings:
    """`live`, recorded as the run's first listing; on a run that recorded one already, its last recorded one."""
    request = StepRequest(step_key(run_id or "run", 0, LISTING_CALL), TOOL_LISTING, "safe")

    async def record(_context: Any) -> Any:
        return live

    outcome = await durability.step(request, record, DEFER_DONE)
    recorded = getattr(outcome, "value", None)
    if not isinstance(recorded, Mapping):
        return live
    if getattr(outcome, "replayed", False):
        recorded = _last_listing(await durability.recorded_steps(), recorded)
        _check_sources(options.mcp_servers, recorded, run_id or "run")
    return recorded


def _last_listing(records: Sequence[StepRecord], first: Listings) -> Listings:
    """The listing of the last change among `records` (a run's steps), else `first`."""
    changes = [
        (parse_step_key(record.key).turn, record.result) for record in records
        if record.kind == TOOL_LISTING and record.status == "done" and isinstance(record.result, Mapping)
        and parse_step_key(record.key).call == CHANGE_CALL
    ]
    return max(changes, key=lambda change: change[0])[1] if changes else first


def _check_sources(sources: Sequence[ToolSource], recorded: Listings, run_id: str) -> None:
    missing = sorted(set(recorded) - {source.name for source in sources})
    if missing:
        raise ConfigurationError(
            f"run {run_id!r} offered the model the tools of MCP server(s) {', '.join(map(repr, missing))}, "
            "which this process's mcp_servers= lacks; give it the same servers (matched by name=) to resume the run"
        )
