"""Tool input validation: every JSON Schema keyword is enforced or refused when the Tool is built."""

from __future__ import annotations

import enum
from typing import Any, Literal, Optional

import pytest

from agent_kit import NUMBERS, recording, user
from durable_agent import ConfigurationError, ScriptedModel, Tool, call, generate_text, reply
from schema_kit import problems

TREE = {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}}}

# (schema, valid inputs, an invalid input, the message it gets)
ENFORCED: dict[str, tuple[Any, list[Any], Any, str]] = {
    "$ref to $defs": (
        {"$defs": {"N": {"type": "integer"}}, "properties": {"n": {"$ref": "#/$defs/N"}}},
        [{"n": 3}, {}],
        {"n": "3"},
        "input.n: expected integer, got string",
    ),
    "$ref to definitions (draft 7 name)": (
        {"definitions": {"N": {"minimum": 0}}, "items": {"$ref": "#/definitions/N"}},
        [[0, 5]],
        [1, -1],
        "input[1]: must be at least 0",
    ),
    "$ref recursive to the root": (TREE, [{"v": 1, "kids": [{"v": 2, "kids": []}]}], {"kids": [{"v": "x"}]},
                                   "input.kids[0].v: expected integer, got string"),
    "$ref with ~0 ~1 and percent escapes": (
        {"$defs": {"a/b": {"const": 1}, "c~d e": {"const": 2}},
         "prefixItems": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d%20e"}]},
        [[1, 2]],
        [1, 3],
        "input[1]: must be 2",
    ),
    "$ref beside other keywords (2020-12)": (
        {"$defs": {"S": {"type": "string"}}, "$ref": "#/$defs/S", "maxLength": 2},
        ["ab"],
        5,
        "input: expected string, got integer",
    ),
    "not": ({"not": {"type": "string"}}, [1, None], "x", "input: must not match the 'not' schema"),
    "if/then": (
        {"if": {"properties": {"kind": {"const": "card"}}}, "then": {"required": ["number"]}},
        [{"kind": "cash"}, {"kind": "card", "number": "4"}],
        {"kind": "card"},
        "input: missing required property 'number'",
    ),
    "if/else": ({"if": {"type": "integer"}, "else": {"type": "string"}}, [3, "x"], 2.5, "expected string, got number"),
    "uniqueItems": ({"uniqueItems": True}, [[1, 2], [1, True], [[1], [True]]], [1, 2, 1.0],
                    "input: items [0] and [2] are equal (uniqueItems)"),
    "uniqueItems on objects ignores key order": (
        {"uniqueItems": True}, [[{"a": 1}, {"a": 2}]], [{"a": 1, "b": 2}, {"b": 2, "a": 1}], "items [0] and [1] are equal"),
    "multipleOf integer": ({"multipleOf": 3}, [9, -3, 0, 6.0], 10, "input: must be a multiple of 3"),
    "multipleOf decimal": ({"multipleOf": 0.1}, [0.3, 0.7, 1.1, 3, 1e-1], 0.35, "input: must be a multiple of 0.1"),
    "prefixItems": ({"prefixItems": [{"type": "integer"}, {"type": "string"}]}, [[1, "a"], [1], [1, "a", None]],
                    ["a", 1], "input[0]: expected integer, got string"),
    "prefixItems with items false": ({"prefixItems": [{}], "items": False}, [[1], []], [1, 2], "allows at most 1 items"),
    "items after prefixItems": ({"prefixItems": [{}], "items": {"type": "null"}}, [[1, None]], [1, 2],
                                "input[1]: expected null, got integer"),
    "contains": ({"contains": {"const": 1}}, [[0, 1]], [0, 2], "needs at least 1 item(s) matching 'contains', has 0"),
    "maxContains": ({"contains": {"const": 1}, "maxContains": 1}, [[1, 0]], [1, 1], "allows at most 1 item(s)"),
    "minContains 0": ({"contains": {"const": 1}, "minContains": 0}, [[], [2]], "x", "__valid__"),
    "patternProperties": ({"patternProperties": {"^n_": {"type": "integer"}}, "additionalProperties": False},
                          [{"n_a": 1}], {"n_a": "1"}, "input.n_a: expected integer, got string"),
    "additionalProperties false beside patternProperties": (
        {"patternProperties": {"^n_": {}}, "additionalProperties": False}, [{"n_a": 1}], {"x": 1},
        "input: unexpected property 'x'"),
    "additionalProperties schema": ({"properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
                                    [{"a": "x", "b": 1}], {"b": "x"}, "input.b: expected integer, got string"),
    "propertyNames": ({"propertyNames": {"maxLength": 2}}, [{"ab": 1}], {"abc": 1}, "input key 'abc': longer than 2"),
    "minProperties": ({"minProperties": 1}, [{"a": 1}], {}, "input: needs at least 1 properties"),
    "maxProperties": ({"maxProperties": 1}, [{"a": 1}], {"a": 1, "b": 2}, "input: needs at most 1 properties"),
    "dependentRequired": ({"dependentRequired": {"card": ["cvc"]}}, [{}, {"card": 1, "cvc": 2}], {"card": 1},
                          "input: property 'cvc' is required when 'card' is present"),
    "dependentSchemas": ({"dependentSchemas": {"card": {"required": ["cvc"]}}}, [{"cvc": 1}], {"card": 1},
                         "input: missing required property 'cvc'"),
    "allOf": ({"allOf": [{"minimum": 1}, {"maximum": 3}]}, [2], 4, "input: must be at most 3"),
    "anyOf on each item": ({"items": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}, [[1, None, 2]], [1, "x"],
                           "input[1]: expected integer or null, got string"),
    "not on each property": ({"additionalProperties": {"not": {"const": 0}}}, [{"a": 1, "b": 2}], {"a": 1, "b": 0},
                             "input.b: must not match the 'not' schema"),
    "oneOf, more than one": ({"oneOf": [{"minimum": 1}, {"maximum": 3}]}, [0, 4], 2,
                             "matches more than one allowed shape (oneOf)"),
    "enum is JSON equality": ({"enum": [1, "a", [1]]}, [1, 1.0, "a", [1.0]], True, "input: True is not one of"),
    "enum of objects": ({"enum": [{"a": [1]}]}, [{"a": [1.0]}], {"a": [True]}, "is not one of"),
    "const false is not 0": ({"const": False}, [False], 0, "input: must be False"),
    "integer is not a bool": ({"type": "integer"}, [1, 1.0, -0.0, 10**30], True, "expected integer, got boolean"),
    "number is not a bool": ({"type": "number"}, [1, 0.5], False, "expected number, got boolean"),
    "integer is not 1.5": ({"type": "integer"}, [2.0], 1.5, "expected integer, got number"),
    "boolean schema false": ({"properties": {"a": False}}, [{"b": 1}], {"a": 1}, "input.a: not allowed"),
    "exclusiveMinimum": ({"exclusiveMinimum": 0}, [0.1], 0, "input: must be greater than 0"),
    "format is an annotation": ({"type": "string", "format": "email", "title": "T", "x-vendor": 1}, ["not an email"],
                                5, "expected string"),
}


@pytest.mark.parametrize("name", list(ENFORCED))
def test_each_keyword_is_enforced(name: str) -> None:
    schema, valid, invalid, message = ENFORCED[name]
    for value in valid:
        assert problems(schema, value) == [], value
    if message == "__valid__":
        assert problems(schema, invalid) == []
        return
    found = problems(schema, invalid)
    assert any(message in p for p in found), found


REFUSED: dict[str, tuple[Any, str]] = {
    "remote $ref": ({"$ref": "https://example.com/s.json"}, r"#/\$ref: remote \$ref"),
    "relative $ref": ({"properties": {"a": {"$ref": "other.json#/a"}}}, r"#/properties/a/\$ref: remote"),
    "anchor $ref": ({"$ref": "#node"}, "anchor"),
    "missing $ref target": ({"$ref": "#/$defs/Nope"}, "points to nothing"),
    "$ref cycle in place": ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}},
                            r"#/\$defs/a: \$ref cycle that never descends"),
    "$ref to itself": ({"$ref": "#"}, r"#: \$ref cycle"),
    "unevaluatedProperties": ({"properties": {"a": {"unevaluatedProperties": False}}},
                              "#/properties/a: unsupported keyword 'unevaluatedProperties'"),
    "$dynamicRef": ({"$dynamicRef": "#x"}, "unsupported keyword '\\$dynamicRef'"),
    "$anchor": ({"$defs": {"a": {"$anchor": "x"}}}, r"#/\$defs/a: unsupported keyword '\$anchor'"),
    "nested $id": ({"items": {"$id": "https://x/"}}, "only supported at the root"),
    "draft 7 items array": ({"items": [{}]}, "prefixItems"),
    "additionalItems": ({"additionalItems": False}, "unsupported keyword 'additionalItems'"),
    "dependencies": ({"dependencies": {"a": ["b"]}}, "dependentRequired"),
    "OpenAPI nullable": ({"type": "string", "nullable": True}, "'nullable'"),
    "a typo": ({"properties": {"a": {"maxLenght": 3}}}, "#/properties/a: unsupported keyword 'maxLenght'"),
    "unknown type": ({"type": "int"}, "#/type: must name JSON types"),
    "non-numeric bound": ({"minimum": "1"}, "#/minimum: must be a number"),
    "boolean exclusiveMinimum (draft 4)": ({"exclusiveMinimum": True}, "#/exclusiveMinimum: must be a number"),
    "zero multipleOf": ({"multipleOf": 0}, "must be greater than 0"),
    "negative maxLength": ({"maxLength": -1}, "must be a non-negative integer"),
    "bad regex": ({"pattern": "("}, "#/pattern: not a valid regular expression"),
    "bad patternProperties regex": ({"patternProperties": {"[": {}}}, "#/patternProperties/\\[: not a valid"),
    "then without if": ({"then": {"required": ["a"]}}, "'then' without 'if'"),
    "maxContains without contains": ({"maxContains": 1}, "'maxContains' without 'contains'"),
    "empty anyOf": ({"anyOf": []}, "#/anyOf: must be a non-empty array"),
    "a schema that is a list": ({"properties": {"a": []}}, "#/properties/a: a schema must be an object or a boolean"),
    "required not a list": ({"required": "a"}, "#/required: must be an array of strings"),
    "uniqueItems not a bool": ({"uniqueItems": 1}, "must be a boolean"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_cannot_be_enforced_is_refused_when_the_tool_is_built(name: str) -> None:
    schema, message = REFUSED[name]
    with pytest.raises(ConfigurationError, match=message):
        Tool(parameters=schema)


@pytest.mark.parametrize("schema", [
    {"type": "string"}, {"type": ["object", "null"]}, {}, {"properties": {"a": {}}}, {"anyOf": [{"type": "object"}]},
    {"$defs": {"N": {"type": "integer"}}, "$ref": "#/$defs/N"},
])
def test_parameters_that_do_not_describe_an_object_are_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=r'must describe an object .*"type": "object"'):
        Tool(parameters=schema)


def test_an_object_root_directly_or_through_a_local_ref_is_accepted() -> None:
    Tool(parameters={"type": "object"})
    for section in ("$defs", "definitions"):
        Tool(parameters={section: {"N": {"type": "object"}}, "$ref": f"#/{section}/N"})


def test_a_pydantic_root_model_that_is_not_an_object_is_refused() -> None:
    pytest.importorskip("pydantic")
    from pydantic import RootModel

    with pytest.raises(ConfigurationError, match="must describe an object"):
        Tool(parameters=RootModel[int])


def test_multiple_of_reads_floats_as_the_decimals_they_were_written_as() -> None:
    assert 0.3 / 0.1 != 3  # what a binary check would trip on
    cases: list[tuple[float, list[float], list[float]]] = [
        (0.1, [0.3, 0.7, 2.2, -0.9], [0.35, 1e-9]), (0.01, [19.99, 0.07], [0.005]),
        (1e-7, [3e-7, 1], [1.5e-7]), (2.5, [7.5, 10], [1]), (3, [10**40 * 3], [10**40 + 1])]
    for step, ok, bad in cases:
        for value in ok:
            assert problems({"multipleOf": step}, value) == [], (value, step)
        for value in bad:
            assert problems({"multipleOf": step}, value) == [f"input: must be a multiple of {step!r}"], (value, step)
    assert problems({"multipleOf": 0.5}, float("inf")) == ["input: must be a multiple of 0.5"]


def test_messages_are_short_with_a_path_and_a_reason() -> None:
    found = problems({"properties": {"note": {"enum": ["a"]}, "bad key": {"type": "string"}}}, {"note": "x" * 5000, "bad key": 1})
    assert found[0].startswith("input.note: 'xxx") and len(found[0]) < 140
    assert found[1] == "input['bad key']: expected string, got integer"
    assert problems(NUMBERS, True) == ["input: expected object, got boolean"]


def test_several_problems_are_all_reported() -> None:
    schema = {
        "type": "object",
        "properties": {
            "mode": {"enum": ["a", "b"]},
            "n": {"type": "integer", "minimum": 1, "maximum": 3},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}, "maxItems": 2},
            "either": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
    }
    assert problems(schema, {"mode": "a", "n": 2, "tags": ["x"], "either": None}) == []
    assert problems(schema, {"mode": "c", "n": 9, "tags": ["X", "y", "z"], "either": 3}) == [
        "input.mode: 'c' is not one of ['a', 'b']",
        "input.n: must be at most 3",
        "input.tags: allows at most 2 items",
        "input.tags[0]: does not match pattern '^[a-z]+$'",
        "input.either: expected string or null, got integer",
    ]


def test_a_union_reports_the_branch_that_fits() -> None:
    optional = {"$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                "anyOf": [{"$ref": "#/$defs/P"}, {"type": "null"}]}
    assert problems(optional, {"x": "1"}) == ["input.x: expected integer, got string"]
    tagged = {
        "$defs": {"Cat": {"properties": {"k": {"const": "cat"}, "lives": {"maximum": 9}}},
                  "Dog": {"properties": {"k": {"const": "dog"}, "good": {"type": "boolean"}}}},
        "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
        "discriminator": {"propertyName": "k", "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}},
    }
    assert problems(tagged, {"k": "cat", "lives": 10}) == ["input.lives: must be at most 9"]
    assert problems(tagged, {"k": "cow"}) == ["input: matches none of the allowed shapes (oneOf)"]
    # A discriminator only words the report: a mapping naming a schema outside the union decides nothing.
    outside = {**tagged, "discriminator": {"propertyName": "k", "mapping": {"cat": "#/$defs/Cat/properties/lives"}}}
    assert problems(outside, {"k": "cat", "lives": 10}) == ["input: matches none of the allowed shapes (oneOf)"]


def test_deep_input_on_a_recursive_schema_is_an_error_not_a_crash() -> None:
    # 1,000 levels: more than the validator's recursion can take, and what Pyodide can still build.
    deep: dict[str, Any] = {"v": 1, "kids": []}
    for _ in range(1000):
        deep = {"kids": [deep]}
    assert problems(TREE, deep) == ["input: nested too deeply to validate"]
    nested: list[Any] = []
    for _ in range(1000):
        nested = [nested]
    for schema in ({"enum": [1]}, {"const": [1]}, {"uniqueItems": True}):  # under an object root: a Tool's input
        wrapped = {"type": "object", "properties": {"v": schema}}
        assert problems(wrapped, {"v": [nested, 1]}) == ["input: nested too deeply to validate"], schema
    assert problems({"const": 1}, [[[[[["x" * 500]]]]]]) == ["input: must be 1"]


class CountingDict(dict[str, Any]):
    """An input object that counts how often the validator walks its properties."""

    walks = 0

    def items(self) -> Any:
        CountingDict.walks += 1
        return super().items()


def test_unions_over_the_same_input_stay_linear() -> None:
    # Both branches descend into "x": tried naively, each level doubles the work (2**depth walks).
    either = {"type": "object", "properties": {"x": {"$ref": "#/$defs/N"}}}
    schema = {"$defs": {"N": {"anyOf": [either, {**either, "minProperties": 1}]}}, "$ref": "#/$defs/N"}
    value: Any = 1
    for _ in range(16):
        value = CountingDict(x=value)
    CountingDict.walks = 0
    assert problems(schema, value) == ["input: matches none of the allowed shapes (anyOf)"]
    assert CountingDict.walks <= 4 * 16


def test_the_schema_is_checked_once_when_the_tool_is_built() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    tool = Tool(parameters=schema)
    assert tool.parse_input({"n": "x"})[1] == "Invalid input: input.n: expected integer, got string"
    assert tool == Tool(parameters=schema)  # the compiled form is not part of a Tool's identity


async def test_invalid_input_reaches_the_model_as_an_error_result_and_not_execute() -> None:
    ran: list[Any] = []
    schema = {"type": "object", "properties": {"ids": {"type": "array", "uniqueItems": True}}}
    tools = {"fetch": Tool(parameters=schema, execute=recording(ran, "ok"))}
    model = ScriptedModel([reply("", call("fetch", {"ids": [1, 1]}), call("fetch", {"ids": [1, 2]})), "done"])
    result = await generate_text(model=model, messages=[user("x")], tools=tools)
    bad, good = result.steps[0].tool_results
    assert bad["is_error"] and bad["output"] == "Invalid input: input.ids: items [0] and [1] are equal (uniqueItems)"
    assert not good["is_error"] and ran == [{"ids": [1, 2]}]


# --- pydantic models: the schema pydantic writes is enforced as pydantic would ---------------


def pydantic_models() -> Any:
    pytest.importorskip("pydantic")
    from pydantic import BaseModel, Field

    class Color(enum.Enum):
        RED = "red"
        GREEN = "green"

    class Address(BaseModel):
        model_config = {"extra": "forbid"}
        street: str
        zip: str = Field(pattern=r"^\d{5}$")

    class Node(BaseModel):
        value: int
        children: list[Node] = []

    class Cat(BaseModel):
        kind: Literal["cat"]
        lives: int = Field(ge=0, le=9)

    class Dog(BaseModel):
        kind: Literal["dog"]
        good: bool

    class Order(BaseModel):
        name: str = Field(min_length=1, description="who orders")
        quantity: Optional[int] = Field(default=None, gt=0, multiple_of=2)  # noqa: UP045 (the Optional spelling)
        address: Address | None = None
        addresses: list[Address] = []
        color: Color = Color.RED
        mode: Literal["a", "b"] = "a"
        price: float = Field(default=0.1, multiple_of=0.1)
        pair: tuple[int, str] | None = None
        tree: Node | None = None
        pet: Cat | Dog | None = Field(default=None, discriminator="kind")
        counts: dict[str, int] = {}

    Node.model_rebuild()
    return Order


VALID_ORDERS = [
    {"name": "a"},
    {"name": "a", "quantity": 4, "color": "green", "mode": "b", "price": 0.3, "pair": [1, "x"], "counts": {"k": 1}},
    {"name": "a", "address": {"street": "s", "zip": "12345"}, "addresses": [{"street": "t", "zip": "00000"}]},
    {"name": "a", "tree": {"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]}},
    {"name": "a", "pet": {"kind": "cat", "lives": 9}, "quantity": None, "address": None},
    {"name": "a", "pet": {"kind": "dog", "good": True}},
]
INVALID_ORDERS = [
    ({}, "input: missing required property 'name'"),
    ({"name": ""}, "input.name: shorter than 1 characters"),
    ({"name": "a", "quantity": 3}, "input.quantity: must be a multiple of 2"),
    ({"name": "a", "quantity": 0}, "input.quantity: must be greater than 0"),
    ({"name": "a", "address": {"street": "s", "zip": "1"}}, "input.address.zip: does not match pattern"),
    ({"name": "a", "address": {"street": "s", "zip": "12345", "x": 1}}, "input.address: unexpected property 'x'"),
    ({"name": "a", "addresses": [{"street": "s"}]}, "input.addresses[0]: missing required property 'zip'"),
    ({"name": "a", "color": "blue"}, "input.color: 'blue' is not one of ['red', 'green']"),
    ({"name": "a", "mode": "c"}, "input.mode: 'c' is not one of ['a', 'b']"),
    ({"name": "a", "price": 0.35}, "input.price: must be a multiple of 0.1"),
    ({"name": "a", "pair": [1, "x", 2]}, "input.pair: allows at most 2 items"),
    ({"name": "a", "tree": {"value": 1, "children": [{"value": "x"}]}}, "input.tree.children[0].value: expected integer"),
    ({"name": "a", "pet": {"kind": "cat", "lives": 10}}, "input.pet.lives: must be at most 9"),
    ({"name": "a", "pet": {"kind": "cow"}}, "input.pet: matches none of the allowed shapes"),
    ({"name": "a", "counts": {"k": [1]}}, "input.counts.k: expected integer, got array"),
]


def test_a_pydantic_schema_as_raw_json_schema_is_fully_supported() -> None:
    model = pydantic_models()
    as_model, as_schema = Tool(parameters=model), Tool(parameters=model.model_json_schema())
    for value in VALID_ORDERS:
        assert as_model.parse_input(value)[1] is None, value
        assert as_schema.parse_input(value) == (value, None)
    for value, message in INVALID_ORDERS:
        assert as_model.parse_input(value)[1] is not None, value
        problem = as_schema.parse_input(value)[1]
        assert problem is not None and message in problem, (value, problem)
