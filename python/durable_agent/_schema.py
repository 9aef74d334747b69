"""Tool input validation: JSON Schema (draft 2020-12) for tool inputs, standard library only.

`compile_schema(schema)` checks a schema once, when a `Tool` is built, and returns a `Validator`;
calling the validator on an input gives every way the input fails as short ``path: reason``
messages (empty when it is valid). Every keyword is either enforced or refused by
`compile_schema` with a `ConfigurationError` naming it and where it is (a JSON pointer such as
``#/properties/to``): nothing is silently ignored.

Enforced: type, enum, const; properties, required, additionalProperties, patternProperties,
propertyNames, minProperties, maxProperties, dependentRequired, dependentSchemas; items,
prefixItems, minItems, maxItems, uniqueItems, contains, minContains, maxContains; minLength,
maxLength, pattern; minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf; allOf,
anyOf, oneOf, not, if/then/else; $ref to a JSON pointer inside the schema (``#``, ``#/$defs/A``,
``#/definitions/A``, with ``~0``/``~1`` and percent escapes), $defs and definitions.
Annotations (accepted, not checked): title, description, default, examples, deprecated,
readOnly, writeOnly, $comment, $schema, $id (root only), format, contentEncoding,
contentMediaType, contentSchema, discriminator, and any ``x-`` keyword.
Refused: everything else, notably a remote or anchor $ref, $anchor, $dynamicRef,
unevaluatedProperties/unevaluatedItems, and the older drafts' array `items`, additionalItems
and dependencies.

Where JSON Schema and Python differ, the rules are:
1. A bool is neither an integer nor a number; 1.0 is an integer.
2. enum, const and uniqueItems compare as JSON: 1 equals 1.0, true does not equal 1, key
   order does not matter.
3. multipleOf is exact on the decimal a number was written as: a float is read as its
   shortest repr (the digits of the JSON text), so 0.3 is a multiple of 0.1 where binary
   division would give 2.9999999999999996.
4. pattern and patternProperties are Python regular expressions, searched (not anchored).
5. A $ref cycle must pass through a keyword that descends into the input (properties, items,
   ...): one that does not would loop forever on any input, and is refused.
6. anyOf, oneOf, not, if and contains decide a subschema on a value once per validation, so
   overlapping branches cost linear time, not exponential; an input nested deeper than the
   recursion limit allows gets "input: nested too deeply to validate".
"""

from __future__ import annotations

import operator
import re
import reprlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any
from urllib.parse import unquote

from ._errors import ConfigurationError

Check = Callable[[Any, str, "_Errors"], None]  # (value, path, errors): appends what is wrong
Where = tuple[str, ...]  # a JSON pointer's tokens

ROOT_PATH = "input"

_MISSING = object()  # what a $ref pointing nowhere finds
_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment",
    "$schema", "$id", "format", "contentEncoding", "contentMediaType", "contentSchema", "discriminator",
})
_ENFORCED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
    "propertyNames", "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "items",
    "prefixItems", "minItems", "maxItems", "uniqueItems", "contains", "minContains", "maxContains",
    "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$defs", "definitions",
})
_HINTS = {
    "additionalItems": " (draft 2020-12 uses prefixItems with items)",
    "dependencies": " (draft 2020-12 uses dependentRequired or dependentSchemas)",
    "nullable": " (write the type as [..., 'null'] or anyOf with {'type': 'null'})",
}
_KINDS: dict[type, str] = {
    dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
    type(None): "null",
}
_REPR = reprlib.Repr()  # (keyword arguments need Python 3.12)
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 8, 60, 60
_TYPE_NAMES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_BOUNDS: tuple[tuple[str, Callable[[Any, Any], bool], str], ...] = (
    ("minimum", operator.ge, "at least"),
    ("maximum", operator.le, "at most"),
    ("exclusiveMinimum", operator.gt, "greater than"),
    ("exclusiveMaximum", operator.lt, "less than"),
)


class Validator:
    """A compiled schema: call it on an input to get its problems (empty when valid)."""

    __slots__ = ("_check",)

    def __init__(self, check: Check) -> None:
        self._check = check

    def __call__(self, value: Any) -> list[str]:
        errors = _Errors()
        try:
            self._check(value, ROOT_PATH, errors)
        except RecursionError:
            return [f"{ROOT_PATH}: nested too deeply to validate"]
        return list(errors) if errors else []


def compile_schema(schema: Any) -> Validator:
    """Check `schema` and compile it; `ConfigurationError` names the first keyword that cannot be enforced."""
    compiler = _Compiler(schema)
    try:
        root = compiler.target((), schema)
    except RecursionError:
        raise ConfigurationError("JSON Schema: nested too deeply") from None
    compiler.refuse_cycles()
    return Validator(root)


def _pointer(where: Where) -> str:
    return "#" + "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in where)


def _pointer_tokens(ref: str) -> Where:
    """The tokens of a '#/...' $ref: percent-decoded, then split, then ~1 and ~0 unescaped."""
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in unquote(ref[1:]).split("/")[1:])


def _refuse(where: Where, reason: str) -> ConfigurationError:
    return ConfigurationError(f"JSON Schema {_pointer(where)}: {reason}")


class _Compiler:
    """Compiles one schema document. `frame` collects the $ref targets a node reaches without
    descending into the input; `refuse_cycles` finds a cycle among them (rule 5)."""

    def __init__(self, root: Any) -> None:
        self._root = root  # the document a $ref points into
        self._targets: dict[Where, Check] = {}
        self._in_place: dict[Where, set[Where]] = {}

    def target(self, where: Where, schema: Any) -> Check:
        """The compiled check of `schema`, found at `where`: compiled once, and callable before it is
        compiled (a recursive schema reaches itself)."""
        ref = self._targets.get(where)
        if ref is None:
            compiled: list[Check] = []

            def ref(value: Any, path: str, errors: _Errors) -> None:
                compiled[0](value, path, errors)

            self._targets[where] = ref
            frame: set[Where] = set()
            compiled.append(self._node(schema, where, frame))
            self._in_place[where] = frame
        return ref

    def refuse_cycles(self) -> None:
        done: set[Where] = set()

        def visit(node: Where, stack: list[Where]) -> None:
            if node in stack:
                raise _refuse(node, "$ref cycle that never descends into the input")
            if node in done:
                return
            stack.append(node)
            for nxt in sorted(self._in_place.get(node, ())):
                visit(nxt, stack)
            stack.pop()
            done.add(node)

        for node in sorted(self._in_place):
            visit(node, [])

    def _ref(self, ref: Any, where: Where, frame: set[Where]) -> Check:
        if not isinstance(ref, str):
            raise _refuse(where, "$ref must be a string")
        if not ref.startswith("#"):
            raise _refuse(where, f"remote $ref {ref!r} is not supported (only '#/...' inside the schema)")
        fragment = unquote(ref[1:])
        if fragment and not fragment.startswith("/"):
            raise _refuse(where, f"anchor $ref {ref!r} is not supported (only '#/...' JSON pointers)")
        tokens = _pointer_tokens(ref)
        node = self._lookup(tokens)
        if node is _MISSING:
            raise _refuse(where, f"$ref {ref!r} points to nothing in the schema")
        frame.add(tokens)
        return self.target(tokens, node)

    def _lookup(self, tokens: Where) -> Any:
        node = self._root
        for token in tokens:
            if isinstance(node, Mapping) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return _MISSING
        return node

    def _static_types(self, schema: Any) -> tuple[str, ...] | None:
        """The types `schema` admits at most by its own 'type' (or its $ref chain's); None: not said.
        Called on compiled (so valid) schemas only."""
        seen: set[str] = set()
        while isinstance(schema, Mapping):
            if "type" in schema:
                return _types(schema, ())
            ref = schema.get("$ref")
            if not isinstance(ref, str) or ref in seen:
                return None
            seen.add(ref)
            schema = self._lookup(_pointer_tokens(ref))
        return None

    def _node(self, schema: Any, where: Where, frame: set[Where]) -> Check:
        if schema is True:
            return _accept
        if schema is False:
            return _reject
        if not isinstance(schema, Mapping):
            raise _refuse(where, "a schema must be an object or a boolean")
        for key in schema:
            if key not in _ENFORCED and key not in _ANNOTATIONS and not (isinstance(key, str) and key.startswith("x-")):
                raise _refuse(where, f"unsupported keyword {key!r}{_HINTS.get(key, '')}")
        if "$id" in schema and where:
            raise _refuse(where, "'$id' is only supported at the root")
        for container in ("$defs", "definitions"):
            for name, sub in self._schemas(schema, container, where).items():
                self.target((*where, container, name), sub)
        for keyword, needs in (("then", "if"), ("else", "if"), ("minContains", "contains"), ("maxContains", "contains")):
            if keyword in schema and needs not in schema:
                raise _refuse(where, f"{keyword!r} without {needs!r} has no effect")
        kinds: dict[str, list[Check]] = {
            "object": self._object(schema, where),
            "array": self._array(schema, where),
            "string": _string(schema, where),
            "number": _number(schema, where),
        }
        generic = self._generic(schema, where, frame)
        return _combine(_types(schema, where), {k: v for k, v in kinds.items() if v}, generic)

    def _sub(self, schema: Mapping[str, Any], keyword: str, where: Where, frame: set[Where]) -> Check:
        return self._node(schema[keyword], (*where, keyword), frame)

    def _schemas(self, schema: Mapping[str, Any], keyword: str, where: Where) -> Mapping[str, Any]:
        value = schema.get(keyword, {})
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise _refuse((*where, keyword), "must be an object")
        return value

    def _list(self, schema: Mapping[str, Any], keyword: str, where: Where, frame: set[Where]) -> list[Check]:
        value = schema[keyword]
        if not isinstance(value, list) or not value:
            raise _refuse((*where, keyword), "must be a non-empty array of schemas")
        return [self._node(sub, (*where, keyword, str(i)), frame) for i, sub in enumerate(value)]

    def _generic(self, schema: Mapping[str, Any], where: Where, frame: set[Where]) -> list[Check]:
        checks: list[Check] = []
        if "enum" in schema:
            if not isinstance(schema["enum"], list):
                raise _refuse((*where, "enum"), "must be an array")
            checks.append(_enum(schema["enum"]))
        if "const" in schema:
            checks.append(_const(schema["const"]))
        if "$ref" in schema:
            checks.append(self._ref(schema["$ref"], (*where, "$ref"), frame))
        if "allOf" in schema:
            checks.extend(self._list(schema, "allOf", where, frame))
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                branches = self._list(schema, keyword, where, frame)
                types = [self._static_types(sub) for sub in schema[keyword]]
                checks.append(_union(keyword, branches, types, self._discriminator(schema, where, frame)))
        if "not" in schema:
            checks.append(_not(self._sub(schema, "not", where, frame)))
        if "if" in schema and ("then" in schema or "else" in schema):
            branches = [self._sub(schema, k, where, frame) if k in schema else _accept for k in ("if", "then", "else")]
            checks.append(_if(*branches))
        if "dependentSchemas" in schema:
            dependent = {
                name: self._node(sub, (*where, "dependentSchemas", name), frame)
                for name, sub in self._schemas(schema, "dependentSchemas", where).items()
            }
            checks.append(_dependent_schemas(dependent))
        return checks

    def _discriminator(self, schema: Mapping[str, Any], where: Where, frame: set[Where]) -> _Pick | None:
        """An OpenAPI discriminator (pydantic writes one for a tagged union) picks the branch whose
        errors to report; it never decides acceptance. Mapping values other than '#...' refs (OpenAPI
        schema names) are not used."""
        spec = schema.get("discriminator")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("propertyName"), str):
            return None
        mapping = spec.get("mapping")
        if not isinstance(mapping, Mapping):
            return None
        where = (*where, "discriminator", "mapping")
        branches = {
            tag: self._ref(ref, (*where, tag), frame)
            for tag, ref in mapping.items()
            if isinstance(tag, str) and isinstance(ref, str) and ref.startswith("#")
        }
        return _Pick(spec["propertyName"], branches) if branches else None

    def _object(self, schema: Mapping[str, Any], where: Where) -> list[Check]:
        checks: list[Check] = []
        if "required" in schema:
            checks.append(_required(_strings(schema, "required", where)))
        if "dependentRequired" in schema:
            deps = self._schemas(schema, "dependentRequired", where)
            checks.append(_dependent_required({k: _strings(deps, k, (*where, "dependentRequired")) for k in deps}))
        for keyword, words in (("minProperties", "at least"), ("maxProperties", "at most")):
            if keyword in schema:
                checks.append(_size(keyword, _count(schema, keyword, where), f"needs {words} {{}} properties"))
        if "propertyNames" in schema:
            checks.append(_property_names(self._sub(schema, "propertyNames", where, set())))
        if any(k in schema for k in ("properties", "patternProperties", "additionalProperties")):
            props = {
                name: (self._node(sub, (*where, "properties", name), set()), _child_suffix(name))
                for name, sub in self._schemas(schema, "properties", where).items()
            }
            patterns = [
                (_regex(p, (*where, "patternProperties", p)), self._node(s, (*where, "patternProperties", p), set()))
                for p, s in self._schemas(schema, "patternProperties", where).items()
            ]
            extra = schema.get("additionalProperties", True)
            rest = None if extra is True else self._sub(schema, "additionalProperties", where, set())
            checks.append(_properties(props, patterns, rest, closed=extra is False))
        return checks

    def _array(self, schema: Mapping[str, Any], where: Where) -> list[Check]:
        checks: list[Check] = []
        for keyword, words in (("minItems", "at least"), ("maxItems", "at most")):
            if keyword in schema:
                verb = "needs" if keyword == "minItems" else "allows"
                checks.append(_size(keyword, _count(schema, keyword, where), f"{verb} {words} {{}} items"))
        if "uniqueItems" in schema:
            if not isinstance(schema["uniqueItems"], bool):
                raise _refuse((*where, "uniqueItems"), "must be a boolean")
            if schema["uniqueItems"]:
                checks.append(_unique)
        prefix = self._list(schema, "prefixItems", where, set()) if "prefixItems" in schema else []
        if "items" in schema and isinstance(schema["items"], list):
            raise _refuse((*where, "items"), "an array of schemas is draft 7; draft 2020-12 uses prefixItems")
        rest = self._sub(schema, "items", where, set()) if "items" in schema else None
        if prefix or rest is not None:
            checks.append(_items(prefix, rest, closed=schema.get("items") is False))
        if "contains" in schema:
            low = _count(schema, "minContains", where) if "minContains" in schema else 1
            high = _count(schema, "maxContains", where) if "maxContains" in schema else None
            checks.append(_contains(self._sub(schema, "contains", where, set()), low, high))
        return checks


# --- keyword values (checked at compile time) ---------------------------------------------------


def _types(schema: Mapping[str, Any], where: Where) -> tuple[str, ...] | None:
    if "type" not in schema:
        return None
    names = schema["type"]
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n in _TYPE_NAMES for n in names):
        raise _refuse((*where, "type"), f"must name JSON types among {sorted(_TYPE_NAMES)}")
    return tuple(dict.fromkeys(names))


def _count(schema: Mapping[str, Any], keyword: str, where: Where) -> int:
    value = schema[keyword]
    if _kind(value) != "number" or not _is_integral(value) or value < 0:
        raise _refuse((*where, keyword), "must be a non-negative integer")
    return int(value)


def _strings(schema: Mapping[str, Any], keyword: str, where: Where) -> list[str]:
    value = schema[keyword]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _refuse((*where, keyword), "must be an array of strings")
    return value


def _regex(pattern: Any, where: Where) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise _refuse(where, "must be a string")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise _refuse(where, f"not a valid regular expression ({exc})") from None


def _number_value(schema: Mapping[str, Any], keyword: str, where: Where) -> float:
    value = schema[keyword]
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # what _kind calls "number"
        return value
    raise _refuse((*where, keyword), "must be a number")


# --- checks (run on every tool call) ----------------------------------------------------------


def _kind(value: Any) -> str:
    """The JSON type of `value` (int and float are both "number"), or the Python type's name."""
    kind = _KINDS.get(type(value))
    if kind is not None:
        return kind
    for base, name in _KINDS.items():
        if isinstance(value, base):
            return name
    return type(value).__name__


def _is_integral(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _accept(value: Any, path: str, errors: _Errors) -> None:
    return None


def _reject(value: Any, path: str, errors: _Errors) -> None:
    errors.append(f"{path}: not allowed")


def _combine(types: tuple[str, ...] | None, kinds: dict[str, list[Check]], generic: list[Check]) -> Check:
    """One node's check: its type first (nothing else is checked on a value of the wrong type), then
    the keywords for the value's kind, then the ones for any value."""
    if types is None and not kinds and not generic:
        return _accept
    expected = " or ".join(types or ())

    def check(value: Any, path: str, errors: _Errors) -> None:
        kind = _KINDS.get(type(value)) or _kind(value)
        if types is not None and not _admits(types, kind, value):
            errors.append(f"{path}: expected {expected}, got {_kind_word(value, kind)}")
            return
        for sub in kinds.get(kind, ()):
            sub(value, path, errors)
        for sub in generic:
            sub(value, path, errors)

    return check


def _admits(types: tuple[str, ...], kind: str, value: Any) -> bool:
    """Whether a value of JSON `kind` is of one of `types` (rule 1: 1.0 is an integer, a bool is not)."""
    return kind in types or (kind == "number" and "integer" in types and _is_integral(value))


def _kind_word(value: Any, kind: str) -> str:
    return "integer" if kind == "number" and isinstance(value, int) else kind


def _short(value: Any, limit: int = 60) -> str:
    """A repr for a message: a few levels and items deep (so a deep input costs no deep recursion)."""
    text = repr(value) if isinstance(value, (str, int, float)) or value is None else _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _child_suffix(name: str) -> str:
    return f".{name}" if name.isidentifier() else f"[{name!r}]"


def _canon(value: Any) -> Any:
    """A hashable key under which two values are equal exactly when they are equal as JSON (rule 2)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (str, int, float)) or value is None:
        return value
    # Plain loops, not tuple(generator): as in the codec, a nesting level costs Python frames only,
    # not C stack (which under WebAssembly is small), so a deep value ends in RecursionError.
    parts = []
    if isinstance(value, list):
        for item in value:
            parts.append(_canon(item))
        return ("array", tuple(parts))
    if isinstance(value, dict):
        for key, item in value.items():
            parts.append((key, _canon(item)))
        return ("object", frozenset(parts))
    return ("other", id(value))


def _enum(options: list[Any]) -> Check:
    keys = frozenset(_canon(o) for o in options)

    def check(value: Any, path: str, errors: _Errors) -> None:
        if _canon(value) not in keys:
            errors.append(f"{path}: {_short(value)} is not one of {_short(options, 120)}")

    return check


def _const(expected: Any) -> Check:
    key = _canon(expected)

    def check(value: Any, path: str, errors: _Errors) -> None:
        if _canon(value) != key:
            errors.append(f"{path}: must be {_short(expected)}")

    return check


def _size(keyword: str, limit: int, message: str) -> Check:
    holds = operator.ge if keyword.startswith("min") else operator.le
    text = message.format(limit)

    def check(value: Any, path: str, errors: _Errors) -> None:
        if not holds(len(value), limit):
            errors.append(f"{path}: {text}")

    return check


def _required(names: list[str]) -> Check:
    def check(value: dict[str, Any], path: str, errors: _Errors) -> None:
        for name in names:
            if name not in value:
                errors.append(f"{path}: missing required property {name!r}")

    return check


def _dependent_required(deps: dict[str, list[str]]) -> Check:
    def check(value: dict[str, Any], path: str, errors: _Errors) -> None:
        for trigger, names in deps.items():
            if trigger in value:
                for name in names:
                    if name not in value:
                        errors.append(f"{path}: property {name!r} is required when {trigger!r} is present")

    return check


def _dependent_schemas(deps: dict[str, Check]) -> Check:
    def check(value: Any, path: str, errors: _Errors) -> None:
        if isinstance(value, dict):
            for trigger, sub in deps.items():
                if trigger in value:
                    sub(value, path, errors)

    return check


def _property_names(sub: Check) -> Check:
    def check(value: dict[str, Any], path: str, errors: _Errors) -> None:
        for name in value:
            sub(name, f"{path} key {_short(name)}", errors)

    return check


def _properties(
    props: dict[str, tuple[Check, str]], patterns: list[tuple[re.Pattern[str], Check]], rest: Check | None, closed: bool
) -> Check:
    def check(value: dict[str, Any], path: str, errors: _Errors) -> None:
        for name, item in value.items():
            known = props.get(name)
            if known is not None:
                known[0](item, path + known[1], errors)
            matched = known is not None
            for regex, sub in patterns:
                if isinstance(name, str) and regex.search(name):
                    sub(item, path + _child_suffix(name), errors)
                    matched = True
            if matched or rest is None:
                continue
            if closed:
                errors.append(f"{path}: unexpected property {_short(name)}")
            else:
                rest(item, path + _child_suffix(str(name)), errors)

    return check


def _items(prefix: list[Check], rest: Check | None, closed: bool) -> Check:
    def check(value: list[Any], path: str, errors: _Errors) -> None:
        for i, (sub, item) in enumerate(zip(prefix, value, strict=False)):  # `rest` checks the items past the prefix
            sub(item, f"{path}[{i}]", errors)
        if rest is None or len(value) <= len(prefix):
            return
        if closed:
            errors.append(f"{path}: allows at most {len(prefix)} items")
            return
        for i in range(len(prefix), len(value)):
            rest(value[i], f"{path}[{i}]", errors)

    return check


def _unique(value: list[Any], path: str, errors: _Errors) -> None:
    seen: dict[Any, int] = {}
    for i, item in enumerate(value):
        first = seen.setdefault(_canon(item), i)
        if first != i:
            errors.append(f"{path}: items [{first}] and [{i}] are equal (uniqueItems)")
            return


def _contains(sub: Check, low: int, high: int | None) -> Check:
    def check(value: list[Any], path: str, errors: _Errors) -> None:
        found = 0
        for i, item in enumerate(value):
            found += _passes(sub, item, f"{path}[{i}]", errors)
        if found < low:
            errors.append(f"{path}: needs at least {low} item(s) matching 'contains', has {found}")
        elif high is not None and found > high:
            errors.append(f"{path}: allows at most {high} item(s) matching 'contains', has {found}")

    return check


def _string(schema: Mapping[str, Any], where: Where) -> list[Check]:
    checks: list[Check] = []
    for keyword, words in (("minLength", "shorter than"), ("maxLength", "longer than")):
        if keyword in schema:
            limit = _count(schema, keyword, where)
            holds = operator.ge if keyword == "minLength" else operator.le
            checks.append(_length(holds, limit, f"{words} {limit} characters"))
    if "pattern" in schema:
        regex = _regex(schema["pattern"], (*where, "pattern"))

        def pattern(value: str, path: str, errors: _Errors) -> None:
            if regex.search(value) is None:
                errors.append(f"{path}: does not match pattern {regex.pattern!r}")

        checks.append(pattern)
    return checks


def _length(holds: Callable[[int, int], bool], limit: int, message: str) -> Check:
    def check(value: str, path: str, errors: _Errors) -> None:
        if not holds(len(value), limit):
            errors.append(f"{path}: {message}")

    return check


def _number(schema: Mapping[str, Any], where: Where) -> list[Check]:
    checks: list[Check] = []
    for keyword, holds, words in _BOUNDS:
        if keyword in schema:
            checks.append(_bound(holds, _number_value(schema, keyword, where), words))
    if "multipleOf" in schema:
        step = _number_value(schema, "multipleOf", where)
        if not step > 0:
            raise _refuse((*where, "multipleOf"), "must be greater than 0")
        checks.append(_multiple_of(step))
    return checks


def _bound(holds: Callable[[Any, Any], bool], limit: float, words: str) -> Check:
    def check(value: float, path: str, errors: _Errors) -> None:
        if not holds(value, limit):
            errors.append(f"{path}: must be {words} {limit!r}")

    return check


def _exact(number: float) -> Fraction | None:
    """The decimal `number` was written as (rule 3); None for infinities and NaN."""
    if isinstance(number, int):
        return Fraction(number)
    try:
        return Fraction(repr(number))
    except ValueError:
        return None


def _multiple_of(step: float) -> Check:
    exact_step = _exact(step)

    def check(value: float, path: str, errors: _Errors) -> None:
        if isinstance(value, int) and isinstance(step, int):
            ok = value % step == 0
        else:
            exact = _exact(value)
            ok = exact is not None and exact_step is not None and (exact / exact_step).denominator == 1
        if not ok:
            errors.append(f"{path}: must be a multiple of {step!r}")

    return check


# --- combinators: a branch is tried for pass/fail, stopping at its first error ---------------


class _Failed(Exception):
    """A branch tried by `_passes` has failed (its first error was recorded)."""


class _Errors(list[str]):
    """The problems found so far, and (`memo`, shared by one validation, made by the first union)
    which branch already passed or failed on which value: each is tried once, so unions over the
    same input stay linear."""

    memo: dict[tuple[int, int], bool] | None = None

    @classmethod
    def sharing(cls, errors: _Errors) -> _Errors:
        """An empty list of this class sharing the memo of `errors`."""
        fresh = cls()
        fresh.memo = errors.memo
        return fresh


class _FailFast(_Errors):
    """Errors that stop the check at the first one: `_passes` only needs yes or no."""

    def append(self, message: str, /) -> None:
        raise _Failed

    def extend(self, messages: Iterable[str], /) -> None:
        for message in messages:
            self.append(message)


def _passes(check: Check, value: Any, path: str, errors: _Errors) -> bool:
    key = (id(check), id(value))  # the input outlives the validation, so its ids are stable
    memo = errors.memo
    if memo is None:
        memo = errors.memo = {}
    known = memo.get(key)
    if known is None:
        try:
            check(value, path, _FailFast.sharing(errors))
            known = True
        except _Failed:
            known = False
        memo[key] = known
    return known


class _Pick:
    """The branch of a tagged union that an object's tag names (see `_Compiler._discriminator`)."""

    __slots__ = ("branches", "tag")

    def __init__(self, tag: str, branches: dict[str, Check]) -> None:
        self.tag, self.branches = tag, branches

    def __call__(self, value: Any) -> Check | None:
        tag = value.get(self.tag) if isinstance(value, dict) else None
        return self.branches.get(tag) if isinstance(tag, str) else None


def _union(
    keyword: str, branches: Sequence[Check], types: Sequence[tuple[str, ...] | None], pick: _Pick | None
) -> Check:
    exactly_one = keyword == "oneOf"

    def check(value: Any, path: str, errors: _Errors) -> None:
        matched = 0
        for branch in branches:
            if _passes(branch, value, path, errors):
                matched += 1
                if not exactly_one or matched > 1:
                    break
        if matched == 0:
            _no_match(keyword, branches, types, pick, value, path, errors)
        elif exactly_one and matched > 1:
            errors.append(f"{path}: matches more than one allowed shape (oneOf)")

    return check


def _no_match(
    keyword: str,
    branches: Sequence[Check],
    types: Sequence[tuple[str, ...] | None],
    pick: _Pick | None,
    value: Any,
    path: str,
    errors: _Errors,
) -> None:
    """Report a union nothing matched, as precisely as can be told: the errors of the branch the
    discriminator tag names; else of the one branch whose type fits (an Optional model, say); else
    the types expected when none fits; else one line. At most one branch runs again (for its
    messages), so reporting stays linear too."""
    if isinstance(errors, _FailFast):
        raise _Failed  # the caller only needs to know it failed
    kind = _kind(value)
    fitting = [b for b, t in zip(branches, types, strict=True) if t is None or _admits(t, kind, value)]
    if not fitting:
        expected = " or ".join(dict.fromkeys(name for t in types if t is not None for name in t))
        errors.append(f"{path}: expected {expected}, got {_kind_word(value, kind)}")
        return
    chosen = pick(value) if pick is not None else None
    if chosen is None and len(fitting) == 1:
        chosen = fitting[0]
    if chosen is not None:
        found = _Errors.sharing(errors)
        chosen(value, path, found)
        if found:  # (a discriminator may name a schema outside the union, which may pass)
            errors.extend(found)
            return
    errors.append(f"{path}: matches none of the allowed shapes ({keyword})")


def _not(sub: Check) -> Check:
    def check(value: Any, path: str, errors: _Errors) -> None:
        if _passes(sub, value, path, errors):
            errors.append(f"{path}: must not match the 'not' schema")

    return check


def _if(condition: Check, then: Check, otherwise: Check) -> Check:
    def check(value: Any, path: str, errors: _Errors) -> None:
        (then if _passes(condition, value, path, errors) else otherwise)(value, path, errors)

    return check
