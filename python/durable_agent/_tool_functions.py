"""`@tool`: a `Tool` from a plain function, its schema read from the type hints and the docstring.

The function's parameters are the tool's arguments (keyword arguments, checked before the
function runs); the docstring's text before its first section is the description, and its
``Args:`` section (Google style; NumPy ``Parameters`` and Sphinx ``:param x:`` are read too)
describes each argument. A parameter with a default is not required. A first parameter
annotated `ToolCallContext` is not an argument: it receives the running call's context
(`current_tool_call()`: run id, tool call id, tool state, progress). The function may be sync
or async.

Two paths build the schema:

- the stdlib path, for plain types (what runs under Pyodide, where pydantic is not installed):
  str, int, float, bool, None, ``X | None``, unions, ``list[X]``, ``tuple[...]``, ``set[X]``,
  ``dict[str, X]``, Literal, Enum, TypedDict, dataclasses, ``Annotated[X, "description"]``, Any.
  The function receives what the model sent, converted where the hint asks for it: an Enum
  member, a dataclass instance, a tuple, a set, a float for ``2`` where the hint is float, an int for
  ``2.0`` where it is int.
- pydantic's, when a hint is anything else (a pydantic model, ``datetime``...) and pydantic is
  installed: the arguments become a pydantic model, which validates and converts them. Without
  pydantic such a hint raises `ConfigurationError` naming the parameter.

Unknown arguments are refused (``additionalProperties: false``), as a Python call would.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, overload

from ._errors import ConfigurationError
from ._tool_calls import ToolCallContext, current_tool_call
from ._tools import ApprovalPredicate, ErrorText, Tool

Convert = Callable[[Any], Any]

_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|See Also)\s*:?\s*$")
_NUMPY_RULE = re.compile(r"^-{3,}\s*$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+):\s*(.*)$")
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_PRIMITIVES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *, description: str | None = None, needs_approval: bool | ApprovalPredicate = False,
    replay: Literal["safe", "unsafe"] = "unsafe", on_error: ErrorText | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None, /, *, description: str | None = None,
    needs_approval: bool | ApprovalPredicate = False, replay: Literal["safe", "unsafe"] = "unsafe",
    on_error: ErrorText | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """A `Tool` running `function` (``@tool``, ``@tool(needs_approval=True)`` or ``tool(f)``).

    `description` replaces the docstring's; the other options are `Tool`'s. See the module docs.
    """

    def build(fn: Callable[..., Any]) -> Tool:
        parameters, execute, summary = _from_function(fn)
        return Tool(description=summary if description is None else description, parameters=parameters,
                    execute=execute, needs_approval=needs_approval, replay=replay, on_error=on_error)

    return build if function is None else build(function)


def _from_function(fn: Callable[..., Any]) -> tuple[Any, Callable[[Any], Any], str]:
    """The parameters, the execute and the description of a tool running `fn`."""
    if not callable(fn):
        raise ConfigurationError(f"@tool needs a function, not {fn!r}")
    name = getattr(fn, "__qualname__", repr(fn))
    hints = _hints(fn, f"@tool {name}")
    params = list(inspect.signature(fn).parameters.values())
    takes_context = bool(params) and _is_context(hints.get(params[0].name))
    if takes_context:
        params = params[1:]
    for param in params:
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise ConfigurationError(f"@tool {name}: parameter {param.name!r} must be one that can be passed by name")
    summary, described = _read_docstring(inspect.getdoc(fn) or "")
    try:
        parameters, converts = _stdlib_schema(params, hints, described)
    except _Unsupported as exc:
        parameters, converts = _pydantic_model(name, params, hints, described, exc), None

    def execute(arguments: Any) -> Any:
        if converts is None:  # a pydantic model instance
            kwargs = {p.name: getattr(arguments, p.name) for p in params}
        else:
            kwargs = {key: converts[key](value) for key, value in arguments.items()}
        if not takes_context:
            return fn(**kwargs)
        context = current_tool_call()
        if context is None:
            raise ConfigurationError(f"tool {name} takes a ToolCallContext: run it as a tool of a run")
        return fn(context, **kwargs)

    return parameters, execute, summary


def _hints(target: Any, label: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(target, include_extras=True)
    except (NameError, TypeError) as exc:
        raise ConfigurationError(f"{label}: its type hints cannot be resolved ({exc})") from exc


def _is_context(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, ToolCallContext)


# --- the docstring ----------------------------------------------------------------------------


def _read_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The text before the first section, and each argument's description (Google, NumPy, Sphinx)."""
    lines = doc.splitlines()
    text: list[str] = []
    described: dict[str, str] = {}
    i = 0
    while i < len(lines):
        heading = _SECTION.match(lines[i].strip())
        numpy = heading is not None and i + 1 < len(lines) and _NUMPY_RULE.match(lines[i + 1].strip()) is not None
        if heading is not None and (numpy or lines[i].rstrip().endswith(":")):
            start = i + (2 if numpy else 1)
            end = start
            while end < len(lines) and not _starts_section(lines, end):
                end += 1
            if heading.group(1) in ("Args", "Arguments", "Parameters", "Params"):
                described.update(_entries(lines[start:end], numpy=numpy))
            i = end
        elif lines[i].lstrip().startswith(":"):  # Sphinx fields: the rest of the docstring
            described.update(_sphinx_fields(lines[i:]))
            break
        else:
            text.append(lines[i])
            i += 1
    return "\n".join(text).strip(), described


def _starts_section(lines: Sequence[str], i: int) -> bool:
    stripped = lines[i].strip()
    if _SECTION.match(stripped) is None:
        return stripped.startswith(":")
    return stripped.endswith(":") or (i + 1 < len(lines) and _NUMPY_RULE.match(lines[i + 1].strip()) is not None)


def _entries(block: Sequence[str], *, numpy: bool) -> dict[str, str]:
    """The arguments of an ``Args:`` block (Google: ``x (int): text``) or a ``Parameters`` one
    (NumPy: ``x : int``, the text indented below): an entry starts at the block's least indent."""
    filled = [line for line in block if line.strip()]
    indent = min((len(line) - len(line.lstrip()) for line in filled), default=0)
    described: dict[str, str] = {}
    current: str | None = None
    for line in filled:
        entry = _ARG_LINE.match(line.strip()) if len(line) - len(line.lstrip()) == indent else None
        if entry is not None:
            current = entry.group(1)
            described[current] = "" if numpy else entry.group(3).strip()
        elif current is not None:
            described[current] = f"{described[current]} {line.strip()}".strip()
    return described


def _sphinx_fields(block: Sequence[str]) -> dict[str, str]:
    """``:param x: text`` (or ``:param int x: text``) fields; other fields end a description."""
    described: dict[str, str] = {}
    current: str | None = None
    for line in block:
        stripped = line.strip()
        if stripped.startswith(":"):
            field = _SPHINX_PARAM.match(stripped)
            current = None if field is None else str(field.group(1))
            if current is not None and field is not None:
                described[current] = field.group(2).strip()
        elif current is not None and stripped:
            described[current] = f"{described[current]} {stripped}"
    return described


# --- the stdlib path ----------------------------------------------------------------------------


class _Unsupported(Exception):
    """A hint the stdlib path cannot describe (the pydantic path may)."""

    def __init__(self, hint: Any) -> None:
        super().__init__(repr(hint))
        self.hint = hint
        self.parameter = ""  # set by the parameter's own description


def _stdlib_schema(
    params: Sequence[inspect.Parameter], hints: Mapping[str, Any], described: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Convert]]:
    properties: dict[str, Any] = {}
    converts: dict[str, Convert] = {}
    required: list[str] = []
    for param in params:
        hint = hints.get(param.name, Any)
        try:
            schema, convert = _describe(hint, ())
        except _Unsupported as exc:
            exc.parameter = param.name
            raise
        if described.get(param.name):
            schema = {**schema, "description": described[param.name]}
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
        elif _is_json_scalar(param.default):
            schema = {**schema, "default": param.default}
        properties[param.name] = schema
        converts[param.name] = convert
    root: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        root["required"] = required
    return root, converts


def _is_json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _same(value: Any) -> Any:
    return value


def _describe(hint: Any, seen: tuple[Any, ...]) -> tuple[dict[str, Any], Convert]:
    """The JSON Schema of values of `hint`, and how a valid JSON value becomes one."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is inspect.Parameter.empty:
        return {}, _same
    if hint in _PRIMITIVES:
        return {"type": _PRIMITIVES[hint]}, (hint if hint in (int, float) else _same)  # JSON's 2.0 is an integer
    if hint is None:
        return {"type": "null"}, _same
    if origin is typing.Annotated:
        schema, convert = _describe(args[0], seen)
        notes = [a for a in args[1:] if isinstance(a, str)]
        return ({**schema, "description": " ".join(notes)} if notes else schema), convert
    if origin is Literal:
        return _literal(args), _same
    if origin is typing.Union or origin is types.UnionType:
        return _union(args, seen)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _literal(tuple(m.value for m in hint)), hint
    if hint in seen:
        raise _Unsupported(hint)  # recursive: pydantic writes $defs for it
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass(hint, (*seen, hint))
    if typing.is_typeddict(hint):
        return _typed_dict(hint, (*seen, hint))
    return _container(hint, origin, args, seen)


def _literal(values: Sequence[Any]) -> dict[str, Any]:
    if not all(_is_json_scalar(v) for v in values):
        raise _Unsupported(values)
    kinds = {_PRIMITIVES[type(v)] for v in values if type(v) in _PRIMITIVES}
    return {"type": kinds.pop(), "enum": list(values)} if len(kinds) == 1 else {"enum": list(values)}


def _union(args: Sequence[Any], seen: tuple[Any, ...]) -> tuple[dict[str, Any], Convert]:
    described = [_describe(a, seen) for a in args]
    options = [a for a in args if a is not type(None)]
    schema = {"anyOf": [s for s, _ in described]}
    if len(options) != 1:  # which branch a value belongs to is not known: passed as sent
        return schema, _same
    convert = described[args.index(options[0])][1]
    return schema, lambda value: None if value is None else convert(value)


def _container(hint: Any, origin: Any, args: Sequence[Any], seen: tuple[Any, ...]) -> tuple[dict[str, Any], Convert]:
    kind = origin or hint
    if kind in (list, Sequence, set, frozenset) or kind is typing.Sequence:
        item, convert = _describe(args[0], seen) if args else ({}, _same)
        make: Callable[[Any], Any] = kind if kind in (set, frozenset) else list
        schema = {"type": "array", "items": item, **({"uniqueItems": True} if make is not list else {})}
        return schema, lambda value: make(convert(v) for v in value)
    if kind is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item, convert = _describe(args[0], seen)
            return {"type": "array", "items": item}, lambda value: tuple(convert(v) for v in value)
        parts = [_describe(a, seen) for a in args]
        schema = {"type": "array", "prefixItems": [s for s, _ in parts], "minItems": len(parts), "items": False}
        return schema, lambda value: tuple(c(v) for (_, c), v in zip(parts, value, strict=True))
    if kind in (dict, Mapping):
        if args and args[0] is not str:
            raise _Unsupported(hint)  # JSON object keys are strings
        value_schema, convert = _describe(args[1], seen) if args else ({}, _same)
        return ({"type": "object", "additionalProperties": value_schema},
                lambda value: {k: convert(v) for k, v in value.items()})
    raise _Unsupported(hint)


def _fields(names_hints: Mapping[str, Any], required: Sequence[str], seen: tuple[Any, ...]
            ) -> tuple[dict[str, Any], dict[str, Convert]]:
    properties: dict[str, Any] = {}
    converts: dict[str, Convert] = {}
    for key, hint in names_hints.items():
        properties[key], converts[key] = _describe(hint, seen)
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema, converts


def _dataclass(cls: type, seen: tuple[Any, ...]) -> tuple[dict[str, Any], Convert]:
    hints = _hints(cls, f"dataclass {cls.__qualname__}")
    fields = [f for f in dataclasses.fields(cls) if f.init]
    required = [f.name for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    schema, converts = _fields({f.name: hints.get(f.name, Any) for f in fields}, required, seen)
    return schema, lambda value: cls(**{k: converts[k](v) for k, v in value.items()})


def _typed_dict(cls: Any, seen: tuple[Any, ...]) -> tuple[dict[str, Any], Convert]:
    hints = _hints(cls, f"TypedDict {cls.__qualname__}")
    required = [key for key in hints if key in cls.__required_keys__]
    schema, converts = _fields(hints, required, seen)
    return schema, lambda value: {k: converts[k](v) for k, v in value.items()}


# --- the pydantic path ------------------------------------------------------------------------


def _pydantic_model(name: str, params: Sequence[inspect.Parameter], hints: Mapping[str, Any],
                    described: Mapping[str, str], why: _Unsupported) -> Any:
    """A pydantic model of the arguments (validating and converting them), for hints only pydantic describes."""
    try:
        import pydantic
    except ImportError:
        raise ConfigurationError(
            f"@tool {name}: parameter {why.parameter!r} is typed {why.hint!r}, which needs pydantic (not installed); "
            "the stdlib path takes str, int, float, bool, None, unions, list/tuple/set/dict, Literal, Enum, "
            "TypedDict and dataclasses"
        ) from None
    fields: dict[str, Any] = {}
    for param in params:
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hints.get(param.name, Any),
                              pydantic.Field(default, description=described.get(param.name) or None))
    try:
        return pydantic.create_model(name.replace(".", "_").replace("<", "").replace(">", ""),
                                     __config__=pydantic.ConfigDict(extra="forbid"), **fields)
    except (TypeError, ValueError, pydantic.PydanticUserError) as exc:
        raise ConfigurationError(f"@tool {name}: pydantic cannot describe its parameters ({exc})") from exc
