"""The problems the JSON Schema validator finds in a value, through the two public things that validate.

A `Tool` validates its arguments (`parse_input`, the value as given: a dict subclass stays one) but
takes only a schema whose root is an object; a run's `output=` takes any schema and checks the final
answer, a JSON text. Both run the one validator, and both report its problems joined by "; ".
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from durable_agent import OutputValidationError, ScriptedModel, Tool, generate_text


def problems(schema: Any, value: Any) -> list[str]:
    """The messages the model would get for `value` (empty when it is valid); any schema may be the root."""
    return problems_of_each(schema, [value])[0]


def problems_of_each(schema: Any, values: list[Any]) -> list[list[str]]:
    """`problems` of each value (one event loop for them all)."""
    if isinstance(schema, dict) and schema.get("type") == "object":
        tool = Tool(parameters=schema)
        found = [tool.parse_input(value)[1] for value in values]
        return [[] if problem is None else problem.removeprefix("Invalid input: ").split("; ") for problem in found]

    async def each() -> list[list[str]]:
        return [await _answer_problems(schema, json.dumps(value)) for value in values]

    return asyncio.run(each())


async def _answer_problems(schema: Any, answer: str) -> list[str]:
    try:
        await generate_text(model=ScriptedModel([answer]), messages=[{"role": "user", "content": "answer"}],
                            output=schema, output_retries=0)
    except OutputValidationError as exc:
        return exc.problem.split("; ")
    return []
