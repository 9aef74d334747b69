"""Tool input validation agrees with the `jsonschema` package on generated schemas and inputs.

Schemas are drawn over every keyword the validator enforces (a small value domain, so inputs often
match); each is checked against several generated inputs: both must accept or both must reject.
multipleOf steps are integers and binary fractions (0.5, 0.25): on steps such as 0.1 the two differ on
purpose (jsonschema divides floats, so it rejects 0.3; see tests/test_tool_schema.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from jsonschema import Draft202012Validator

from schema_kit import problems_of_each

pytestmark = [
    pytest.mark.host_only(
        "jsonschema needs rpds-py, a Rust extension that publishes no wheel for either Pyodide runtime"
    ),
    pytest.mark.kernel_independent,  # the validator reaches no kernel
]

KEYS = ["a", "b", "a_x"]
DEFS = {"A": "A", "a/b": "a~1b", "c~d": "c~0d", "e f": "e%20f"}  # name -> how a $ref spells it

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, 1.0, 1.5, -2.5, 0.1, 0.3, 2.0]),
    st.sampled_from(["", "a", "b", "ab", "ba", "aab"]),
)
instances = st.one_of(
    st.lists(st.sampled_from([0, 1, 1.0, True, "a", None]), max_size=4),  # lists with equal items, often
    st.dictionaries(st.sampled_from(KEYS), scalars, min_size=1, max_size=3),
    st.recursive(
        scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)),
        max_leaves=8,
    ),
)
counts = st.integers(0, 3)
numbers = st.one_of(st.integers(-2, 2), st.sampled_from([0.5, 1.5]))
type_names = st.sampled_from(["object", "array", "string", "number", "integer", "boolean", "null"])
key_lists = st.lists(st.sampled_from(KEYS), max_size=2, unique=True)


def one(keyword: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return values.map(lambda v: {keyword: v})


assertions = st.one_of(
    one("type", st.one_of(type_names, st.lists(type_names, min_size=1, max_size=2, unique=True))),
    one("enum", st.lists(instances, min_size=1, max_size=3)),
    one("const", instances),
    *(one(k, numbers) for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")),
    one("multipleOf", st.sampled_from([1, 2, 3, 0.5, 0.25])),
    *(one(k, counts) for k in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")),
    one("pattern", st.sampled_from(["^a", "b$", "a+", "^$", "^a*b?$"])),
    one("uniqueItems", st.booleans()),
    one("required", key_lists),
    one("dependentRequired", st.dictionaries(st.sampled_from(KEYS), key_lists, max_size=2)),
)


def applicators(child: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Object, array and logic applicators, one group at a time (so a group's keywords meet often)."""
    children = st.lists(child, min_size=1, max_size=3)
    objects = st.fixed_dictionaries(
        {"properties": st.dictionaries(st.sampled_from(KEYS), child, min_size=1, max_size=2)},
        optional={
            "patternProperties": st.dictionaries(st.sampled_from(["^a", "_x$"]), child, min_size=1, max_size=2),
            "additionalProperties": child,
            "propertyNames": child,
            "dependentSchemas": st.dictionaries(st.sampled_from(KEYS), child, min_size=1, max_size=1),
        },
    )
    arrays = st.fixed_dictionaries(
        {},
        optional={
            "items": child,
            "prefixItems": st.lists(child, min_size=1, max_size=2),
            "contains": child,
            "minContains": counts,
            "maxContains": counts,
        },
    ).map(lambda d: d if "contains" in d else {k: v for k, v in d.items() if k not in ("minContains", "maxContains")})
    logic = st.one_of(
        *(one(k, children) for k in ("allOf", "anyOf", "oneOf")),
        one("not", child),
        st.fixed_dictionaries({"if": child}, optional={"then": child, "else": child}),
    )
    return st.sampled_from([objects, arrays, logic]).flatmap(lambda group: group)  # evenly, unlike one_of


def merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    for part in parts:
        schema.update(part)
    return schema


def schemas(extra_leaves: st.SearchStrategy[Any] | None) -> st.SearchStrategy[Any]:
    leaves = st.one_of(st.booleans(), st.lists(assertions, min_size=1, max_size=3).map(merged))
    if extra_leaves is not None:
        leaves = st.one_of(leaves, extra_leaves)
    return st.recursive(
        leaves,
        lambda child: st.lists(st.one_of(assertions, applicators(child)), min_size=1, max_size=3).map(merged),
        max_leaves=6,
    )


# $defs hold no $ref (so no cycle can stay in place); the root refers to them, and to itself only
# below a keyword that descends into the input.
refs = st.one_of(
    st.sampled_from(sorted(DEFS.values())).map(lambda spelled: {"$ref": f"#/$defs/{spelled}"}),
    st.just({"items": {"$ref": "#"}}),
    st.just({"properties": {"a": {"$ref": "#"}}}),
)
documents = st.builds(
    lambda defs, body: {**body, "$defs": defs} if isinstance(body, dict) else body,
    st.fixed_dictionaries({name: schemas(None) for name in DEFS}),
    schemas(refs),
)


def twins(value: Any) -> list[Any]:
    """`value` and values Python finds equal to it that JSON does not (True/1), or the reverse (1/1.0,
    another key order)."""
    if isinstance(value, bool):
        return [value, int(value)]
    if isinstance(value, (int, float)):
        return [value, float(value)] + ([bool(value)] if value in (0, 1) else [])
    if isinstance(value, list):
        return [value] + [[*value[:i], twin, *value[i + 1 :]] for i, item in enumerate(value) for twin in twins(item)[1:]]
    if isinstance(value, dict):
        reordered = dict(reversed(value.items()))
        return [value, reordered] + [{**value, k: twin} for k, v in value.items() for twin in twins(v)[1:]]
    return [value]


BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def constants(schema: Any) -> list[Any]:
    """The enum and const values anywhere in `schema`, and the numbers at and beside its bounds."""
    if isinstance(schema, list):
        return [c for item in schema for c in constants(item)]
    if not isinstance(schema, dict):
        return []
    found = list(schema.get("enum", [])) + ([schema["const"]] if "const" in schema else [])
    found += [schema[k] + d for k in BOUNDS if k in schema for d in (-0.5, 0, 0.5)]
    return found + [c for key, item in schema.items() if key not in ("enum", "const") for c in constants(item)]


def check_against(data: st.DataObject, schema: Any, drawn: st.SearchStrategy[Any]) -> None:
    """Every input of a pool made from `schema` (its constants and their twins, numbers at and beside
    its bounds, small objects and arrays, of one repeated item or of mixed ones), then a few generated
    ones."""
    pool = [twin for c in constants(schema) for twin in twins(c)]
    pool += [{k: v} for k in KEYS for v in (0, 1.5, "a", None, list[Any]())] + [dict.fromkeys(KEYS, 1)]
    pool += [[v] * n for v in (0, "a", None) for n in (1, 2, 3)] + [[0, "a", None, 1.5], ["a", 0], [[], {}, [0]]]
    pool += [{"a": 0, "b": "a", "a_x": None}, {"a": "a", "b": [0]}]
    values = pool + data.draw(st.lists(drawn, min_size=1, max_size=6))
    Draft202012Validator.check_schema(schema)  # the generator makes valid 2020-12 schemas
    theirs = Draft202012Validator(schema)
    ours = problems_of_each(schema if isinstance(schema, dict) else {"allOf": [schema]}, values)
    for value, problems in zip(values, ours, strict=True):
        assert (not problems) == theirs.is_valid(value), (value, problems)


simple = st.one_of(st.booleans(), st.lists(assertions, min_size=1, max_size=2).map(merged))


@settings(max_examples=500, deadline=None)
@given(schema=st.lists(assertions, min_size=1, max_size=2).map(merged), data=st.data())
def test_assertions_give_the_same_verdict_as_jsonschema(schema: dict[str, Any], data: st.DataObject) -> None:
    check_against(data, schema, scalars | instances)


@settings(max_examples=500, deadline=None)
@given(schema=st.lists(applicators(simple), min_size=1, max_size=2).map(merged), data=st.data())
def test_applicators_give_the_same_verdict_as_jsonschema(schema: dict[str, Any], data: st.DataObject) -> None:
    check_against(data, schema, instances)


@settings(max_examples=300, deadline=None)
@given(schema=documents, data=st.data())
def test_nested_documents_give_the_same_verdict_as_jsonschema(schema: Any, data: st.DataObject) -> None:
    check_against(data, schema, instances)
