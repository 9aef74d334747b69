"""A small JSON-Schema validator for tool inputs (the subset tool schemas use), standard library only.

Supported keywords: type (one or a list), enum, const, properties, required,
additionalProperties (bool or schema), items (schema), minItems, maxItems, minLength,
maxLength, pattern, minimum, maximum, exclusiveMinimum, exclusiveMaximum, anyOf, oneOf,
allOf. Other keywords (format, description, title, $schema, ...) are accepted and ignored.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

_TYPE_CHECKS = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
    or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def validate(value: Any, schema: Mapping[str, Any], path: str = "input") -> list[str]:
    """Every way `value` fails `schema`, as readable messages; empty when it is valid."""
    errors: list[str] = []
    _check(value, schema, path, errors)
    return errors


def _check(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if not isinstance(schema, Mapping):
        return
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_TYPE_CHECKS.get(name, lambda v: True)(value) for name in names):
            errors.append(f"{path}: expected {' or '.join(names)}, got {_kind(value)}")
            return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']!r}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: must be {schema['const']!r}")
    if isinstance(value, dict):
        _check_object(value, schema, path, errors)
    elif isinstance(value, list):
        _check_array(value, schema, path, errors)
    elif isinstance(value, str):
        _check_string(value, schema, path, errors)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_number(value, schema, path, errors)
    _check_combinators(value, schema, path, errors)


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    properties = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            errors.append(f"{path}: missing required property {name!r}")
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            _check(item, properties[name], f"{path}.{name}", errors)
        elif extra is False:
            errors.append(f"{path}: unexpected property {name!r}")
        elif isinstance(extra, Mapping):
            _check(item, extra, f"{path}.{name}", errors)


def _check_array(value: list[Any], schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if "minItems" in schema and len(value) < schema["minItems"]:
        errors.append(f"{path}: needs at least {schema['minItems']} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{path}: allows at most {schema['maxItems']} items")
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            _check(item, items, f"{path}[{i}]", errors)


def _check_string(value: str, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    if "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(f"{path}: shorter than {schema['minLength']} characters")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{path}: longer than {schema['maxLength']} characters")
    if "pattern" in schema and re.search(schema["pattern"], value) is None:
        errors.append(f"{path}: does not match pattern {schema['pattern']!r}")


def _check_number(value: float, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    bounds: tuple[tuple[str, Callable[[float, float], bool], str], ...] = (
        ("minimum", operator.ge, "at least"),
        ("maximum", operator.le, "at most"),
        ("exclusiveMinimum", operator.gt, "greater than"),
        ("exclusiveMaximum", operator.lt, "less than"),
    )
    for keyword, holds, words in bounds:
        if keyword in schema and not holds(value, schema[keyword]):
            errors.append(f"{path}: must be {words} {schema[keyword]!r}")


def _check_combinators(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    for sub in schema.get("allOf", ()):
        _check(value, sub, path, errors)
    if "anyOf" in schema and not any(not validate(value, s, path) for s in schema["anyOf"]):
        errors.append(f"{path}: matches none of the allowed shapes (anyOf)")
    if "oneOf" in schema:
        matches = sum(1 for s in schema["oneOf"] if not validate(value, s, path))
        if matches != 1:
            errors.append(f"{path}: must match exactly one allowed shape (oneOf), matched {matches}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", str: "string", int: "integer", float: "number"}.get(
        type(value), type(value).__name__
    )
