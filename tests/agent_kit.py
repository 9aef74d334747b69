"""Tools, models and stores shared by the loop tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durable_agent import InMemoryCheckpointStore, Message, Tool, ToolResultPart, content_parts

NUMBERS = {
    "type": "object",
    "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


class Ledger:
    """Records every side effect a tool performs, in order."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, Any]] = []

    def tool(self, name: str, *, needs_approval: Any = False, result: Any = "ok") -> Tool:
        def execute(args: Any) -> Any:
            self.entries.append((name, args))
            return result

        return Tool(description=f"the {name} tool", parameters={"type": "object"}, execute=execute,
                    needs_approval=needs_approval)


def add_tool() -> Tool:
    return Tool(description="Add two numbers.", parameters=NUMBERS, execute=lambda x: x["a"] + x["b"])


class FailingStore(InMemoryCheckpointStore):
    """A store whose saves raise; loads work (what a flaky database looks like to the loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def save(self, checkpoint: Any) -> None:  # type: ignore[override]
        self.attempts += 1
        raise ConnectionError("database went away")


def recording(into: list[Any], result: Any) -> Callable[[Any], Any]:
    """A tool's execute that appends its input to `into` and returns `result`."""

    def execute(args: Any) -> Any:
        into.append(args)
        return result

    return execute


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def tool_results(message: Message) -> list[ToolResultPart]:
    """The parts of a tool message, each checked to be a tool result."""
    results: list[ToolResultPart] = []
    for part in content_parts(message):
        assert part["type"] == "tool-result", part
        results.append(part)
    return results
