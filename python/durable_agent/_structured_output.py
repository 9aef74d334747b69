"""Structured output: `output=` (a JSON Schema or a pydantic model) that a run's final answer must match.

The model is asked for it natively where its adapter knows how (`ModelRequest.output`: OpenAI's
``response_format``/``text.format`` with a JSON schema). Whatever the provider, the loop checks the
final answer itself: it must be JSON (a fenced ```json block is accepted) matching the schema.
An answer that does not is sent back to the model as a user message naming the problem, at most
`output_retries` times; then the run fails with `OutputValidationError`. The parsed value (a
pydantic model's instance for a model) is the result's ``output``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._errors import ConfigurationError
from ._schema import compile_schema

_FENCED = re.compile(r"^\s*```(?:json)?\s*\n(.*)\n\s*```\s*$", re.S)
REPAIR_PROMPT = "Your answer does not match the required output: {problem}. Reply with only the corrected JSON."


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """What `output=` asks of the final answer: its JSON Schema, and how an answer is checked."""

    name: str
    schema: Mapping[str, Any]
    _parse: Callable[[Any], tuple[Any, str | None]]

    @classmethod
    def build(cls, output: Any) -> OutputSpec:
        """From a JSON-Schema dict or a pydantic model class (`ConfigurationError` otherwise)."""
        if isinstance(output, type) and hasattr(output, "model_validate") and hasattr(output, "model_json_schema"):
            model: Any = output

            def parse_model(value: Any) -> tuple[Any, str | None]:
                try:
                    return model.model_validate(value), None
                except ValueError as exc:  # pydantic's ValidationError is a ValueError
                    return None, str(exc)

            return cls(output.__name__, model.model_json_schema(), parse_model)
        if isinstance(output, Mapping):
            validate = compile_schema(output)

            def parse_json(value: Any) -> tuple[Any, str | None]:
                problems = validate(value)
                return (None, "; ".join(problems)) if problems else (value, None)

            return cls(str(output.get("title") or "output"), output, parse_json)
        raise ConfigurationError("output must be a JSON-Schema dict or a pydantic model class")

    def check(self, text: str) -> tuple[Any, str | None]:
        """The answer's value, or what is wrong with it."""
        fenced = _FENCED.match(text)
        try:
            value = json.loads(fenced.group(1) if fenced else text)
        except ValueError as exc:
            return None, f"it is not JSON ({exc})"
        return self._parse(value)
