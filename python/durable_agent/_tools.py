"""Tools: what the model may call, how its input is checked, and how a call is executed.

A tool has a description, a JSON-Schema `parameters` (or a pydantic model class, which
then also validates and converts the input), an optional `execute` (sync or async; without
one the tool is a *client tool* whose result the caller supplies), and an optional
`needs_approval` (a bool, or a function of the input, sync or async). `@tool`
(`tool_functions`) builds one from a plain function, its schema from the type hints.

`replay` tells a durable runtime what to do with a call that started and never finished
(its process died): ``"unsafe"`` (the default: a tool with side effects must not run twice
by accident) reports it to the model as interrupted; ``"safe"`` (reads, pure computations)
runs it again.

Input that fails validation never reaches `execute`: the model gets an `is_error` result
describing what was wrong (``path: reason``, e.g. ``input.items[2].qty: must be at least 1``),
and can try again.

`parameters` must describe an object (``"type": "object"`` at its root, or a root ``$ref`` to a
definition that has it): providers pass a tool its arguments by name and refuse any other
schema, so ``{"type": "string"}`` raises `ConfigurationError` when the `Tool` is built.

A JSON-Schema `parameters` is checked and compiled when the `Tool` is built (see `_schema`):
draft 2020-12 keywords are enforced (type, enum, const; properties, required,
additionalProperties, patternProperties, propertyNames, min/maxProperties, dependentRequired,
dependentSchemas; items, prefixItems, min/maxItems, uniqueItems, contains, min/maxContains;
min/maxLength, pattern; minimum, maximum, exclusiveMinimum/Maximum, multipleOf; allOf, anyOf,
oneOf, not, if/then/else; $ref to ``#``/``#/$defs/...``/``#/definitions/...`` inside the schema).
title, description, default, examples, deprecated, readOnly, writeOnly, $comment, $schema, $id
(root), format, content*, discriminator and ``x-`` keywords are annotations. Anything else raises
`ConfigurationError` naming the keyword and its JSON pointer: a keyword is never silently ignored.
A bool is not an integer or a number; 1.0 is an integer; multipleOf is exact on the decimal a
number was written as (0.3 is a multiple of 0.1); pattern is a Python regular expression.
A pydantic model validates its own input (and converts it).

When `execute` raises, the model gets an `is_error` result and can react. By default its text is
the exception's type and message (``RuntimeError: database is down``), which may say more than
the model should read; `on_error` chooses the text instead: a fixed one
(``on_error="The lookup failed; try again later."``) or a function of the exception returning
it. The text is stored with the call like any result: a resumed run replays it unchanged.

`execute` may return a `ToolResult` instead of a plain output: an error result the model sees
without an exception, or images and files beside the output. A `ToolSource` (an MCP server,
`durable_agent.mcp`) is a set of tools opened for a run (`mcp_servers=`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeGuard, runtime_checkable

from ._errors import ConfigurationError
from ._models import ToolSpec
from ._schema import Validator, compile_schema
from ._util import maybe_await

if TYPE_CHECKING:
    from ._messages import FilePart, ImagePart

ApprovalPredicate = Callable[[Any], bool | Awaitable[bool]]
ErrorText = str | Callable[[Exception], str]
"""What the model reads when a tool's `execute` raises: a fixed text, or a function of the exception."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model can call. See the module docstring (which JSON Schema keywords are supported)."""

    description: str = ""
    parameters: Any = field(default_factory=lambda: {"type": "object"})
    execute: Callable[[Any], Any] | None = None
    needs_approval: bool | ApprovalPredicate = False
    replay: Literal["safe", "unsafe"] = "unsafe"
    on_error: ErrorText | None = None
    _validator: Validator | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.replay not in ("safe", "unsafe"):
            raise ConfigurationError("Tool replay must be 'safe' or 'unsafe'")
        if not (isinstance(self.parameters, Mapping) or _is_pydantic_model(self.parameters)):
            raise ConfigurationError("Tool parameters must be a JSON-Schema dict or a pydantic model class")
        if self.execute is not None and not callable(self.execute):
            raise ConfigurationError("Tool execute must be callable")
        if self.on_error is not None and not (isinstance(self.on_error, str) or callable(self.on_error)):
            raise ConfigurationError("Tool on_error must be a text or a function of the exception returning one")
        if not _is_pydantic_model(self.parameters):
            object.__setattr__(self, "_validator", compile_schema(self.parameters))
        if not _describes_object(self.json_schema()):
            raise ConfigurationError(
                'Tool parameters must describe an object (a JSON Schema with "type": "object" at its root): '
                "providers pass a tool its arguments by name, and refuse any other schema"
            )

    @property
    def is_client_tool(self) -> bool:
        """True when the caller, not the server, produces this tool's result."""
        return self.execute is None

    def json_schema(self) -> Mapping[str, Any]:
        if _is_pydantic_model(self.parameters):
            return self.parameters.model_json_schema()
        schema: Mapping[str, Any] = self.parameters  # __post_init__ refused anything else
        return schema

    def spec(self, name: str) -> ToolSpec:
        return ToolSpec(name=name, description=self.description, parameters=self.json_schema())

    def parse_input(self, raw: Any) -> tuple[Any, str | None]:
        """The input `execute` receives, or an error message for the model when it is invalid."""
        if self._validator is None:  # a pydantic model: it validates and converts
            try:
                return self.parameters.model_validate(raw), None
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                return None, f"Invalid input: {exc}"
        problems = self._validator(raw)
        if problems:
            return None, "Invalid input: " + "; ".join(problems)
        return raw, None

    def error_text(self, exc: Exception) -> str:
        """What the model reads when `execute` raised `exc` (see the module docs: `on_error`)."""
        if self.on_error is None:
            return f"{type(exc).__name__}: {exc}"
        if isinstance(self.on_error, str):
            return self.on_error
        return str(self.on_error(exc))

    async def requires_approval(self, raw_input: Any) -> bool:
        if callable(self.needs_approval):
            return bool(await maybe_await(self.needs_approval(raw_input)))
        return bool(self.needs_approval)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What an `execute` may return instead of a plain output.

    `output` is what the model reads; `is_error` makes it an error result (the model sees it
    and can react, as when `execute` raises); `attachments` are images or files beside it
    (``{"type": "image", "data": bytes, "media_type": ...}``, or a ``file`` part), which the
    provider adapters send the way their API takes them.
    """

    output: Any
    is_error: bool = False
    attachments: Sequence[ImagePart | FilePart] = ()


@runtime_checkable
class ToolSource(Protocol):
    """Tools from outside the process (an MCP server), opened for as long as a run uses them.

    A run enters each source (``async with``; entering one already open only counts a user),
    asks its `listing` (plain data: what the model is offered), and turns a listing into tools
    with `bind`. When the source says its tools `changed`, the run's next step `refresh`es it and
    offers the new listing. A durable run records the listing at its start and at each change, and
    a resumed run binds the last recorded one: the model is offered what it was offered before the
    crash, and a call to a tool the source no longer has is an error result.
    """

    @property
    def name(self) -> str:
        """Names the source in a recorded listing (unique among a run's sources)."""
        ...

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc_info: object) -> Any: ...

    @property
    def changed(self) -> bool:
        """The source's tools changed since it last listed them (a run then calls `refresh` before its next step)."""
        ...

    async def refresh(self) -> None:
        """Take the source's tools again: `listing` answers with the new ones."""
        ...

    def listing(self) -> list[dict[str, Any]]:
        """The tools offered now, as JSON-compatible data `bind` takes back."""
        ...

    def bind(self, listing: Sequence[Mapping[str, Any]]) -> dict[str, Tool]:
        """The tools of `listing` (this one's or a recorded one), by the name the model calls them."""
        ...


def _describes_object(schema: Mapping[str, Any]) -> bool:
    """True when `schema`'s root is ``"type": "object"``, or a ``$ref`` to a local definition that
    is (what pydantic writes for a recursive model)."""
    if schema.get("type") == "object":
        return True
    ref = schema.get("$ref")
    for section in ("$defs", "definitions"):
        prefix = f"#/{section}/"
        if isinstance(ref, str) and ref.startswith(prefix):
            definitions = schema.get(section)
            target = definitions.get(ref.removeprefix(prefix)) if isinstance(definitions, Mapping) else None
            return isinstance(target, Mapping) and target.get("type") == "object"
    return False


class _PydanticModelClass(Protocol):
    """What this module uses of a pydantic model class (pydantic itself is an optional extra)."""

    def model_json_schema(self) -> dict[str, Any]: ...
    def model_validate(self, obj: Any) -> Any: ...


def _is_pydantic_model(candidate: object) -> TypeGuard[_PydanticModelClass]:
    return isinstance(candidate, type) and hasattr(candidate, "model_validate") and hasattr(
        candidate, "model_json_schema"
    )
