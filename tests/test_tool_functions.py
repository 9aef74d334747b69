"""`@tool`: the schema from type hints and the docstring, the arguments converted, the call's context passed."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import sys
from typing import Annotated, Any, Literal, TypedDict

import pytest

from agent_kit import user
from durable_agent import (
    ConfigurationError,
    ScriptedModel,
    Tool,
    ToolCallContext,
    ToolSpec,
    call,
    generate_text,
    reply,
    tool,
)


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


@dataclasses.dataclass
class Line:
    sku: str
    qty: int = 1


class Address(TypedDict):
    street: str
    zip: str


def order(
    name: str, count: int, price: float, rush: bool, note: str | None, color: Color, lines: list[Line],
    mode: Literal["a", "b"] = "a", pair: tuple[int, str] = (0, ""), tags: set[str] | None = None,
    counts: dict[str, int] | None = None, address: Address | None = None,
    anything: Any = None, why: Annotated[str, "the reason"] = "",
) -> dict[str, Any]:
    """Place an order.

    Args:
        name: Who orders.
        count (int): How many,
            at least one.
    """
    return dict(locals())


ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Who orders."},
        "count": {"type": "integer", "description": "How many, at least one."},
        "price": {"type": "number"},
        "rush": {"type": "boolean"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "color": {"type": "string", "enum": ["red", "green"]},
        "lines": {"type": "array", "items": {
            "type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            "additionalProperties": False, "required": ["sku"]}},
        "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2,
                 "items": False},
        "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}, "uniqueItems": True}, {"type": "null"}],
                 "default": None},
        "counts": {"anyOf": [{"type": "object", "additionalProperties": {"type": "integer"}}, {"type": "null"}],
                   "default": None},
        "address": {"anyOf": [{"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
                               "additionalProperties": False, "required": ["street", "zip"]}, {"type": "null"}],
                    "default": None},
        "anything": {"default": None},
        "why": {"type": "string", "description": "the reason", "default": ""},
    },
    "additionalProperties": False,
    "required": ["name", "count", "price", "rush", "note", "color", "lines"],
}


def test_the_schema_comes_from_the_type_hints_and_the_docstring() -> None:
    made = tool(order)
    assert made.description == "Place an order."
    assert made.parameters == ORDER_SCHEMA
    assert made.spec("order") == ToolSpec(name="order", description="Place an order.", parameters=ORDER_SCHEMA)


async def test_the_function_gets_the_arguments_converted_to_its_types() -> None:
    sent = {"name": "ann", "count": 2.0, "price": 3, "rush": False, "note": None, "color": "green",
            "lines": [{"sku": "x"}, {"sku": "y", "qty": 4}], "pair": [1, "b"], "tags": ["t", "u"],
            "counts": {"k": 1}, "address": {"street": "s", "zip": "1"}}
    model = ScriptedModel([reply("", call("order", sent)), "done"])
    result = await generate_text(model=model, messages=[user("x")], tools={"order": tool(order)})
    got = result.steps[0].tool_results[0]
    assert not got["is_error"], got
    assert got["output"] == {**sent, "count": 2, "price": 3.0, "color": Color.GREEN, "lines": [Line("x"), Line("y", 4)],
                             "pair": (1, "b"), "tags": {"t", "u"}, "mode": "a", "anything": None, "why": ""}
    assert isinstance(got["output"]["price"], float) and isinstance(got["output"]["count"], int)


async def test_invalid_or_unknown_arguments_reach_the_model_and_not_the_function() -> None:
    ran: list[int] = []

    @tool
    def count(n: int) -> int:
        """Count."""
        ran.append(n)
        return n

    model = ScriptedModel([reply("", call("count", {"n": "2"}), call("count", {"n": 2, "m": 1}),
                                 call("count", {"n": 2})), "done"])
    result = await generate_text(model=model, messages=[user("x")], tools={"count": count})
    bad_type, unknown, good = result.steps[0].tool_results
    assert bad_type["is_error"] and bad_type["output"] == "Invalid input: input.n: expected integer, got string"
    assert unknown["is_error"] and "unexpected property 'm'" in unknown["output"]
    assert good == {**good, "output": 2, "is_error": False} and ran == [2]


def numpy_style(a: int, b: float = 1.5) -> float:
    """Add two numbers.

    Parameters
    ----------
    a : int
        The first,
        an integer.
    b : float
        The second.

    Returns
    -------
    float
        The sum.
    """
    return a + b


def sphinx_style(a: int, b: float) -> float:
    """Add two numbers.

    :param a: The first,
        an integer.
    :param float b: The second.
    :returns: The sum.
    """
    return a + b


def google_style(a: int, b: float) -> float:
    """Add two numbers.

    Adds them exactly.

    Args:
        a: The first,
            an integer.
        b (float): The second.

    Returns:
        The sum.
    """
    return a + b


def test_numpy_sphinx_and_google_docstrings_describe_the_arguments() -> None:
    for fn in (numpy_style, sphinx_style, google_style):
        made = tool(fn)
        properties = made.parameters["properties"]
        assert properties["a"]["description"] == "The first, an integer.", fn.__name__
        assert properties["b"]["description"] == "The second.", fn.__name__
    assert tool(numpy_style).description == tool(sphinx_style).description == "Add two numbers."
    assert tool(google_style).description == "Add two numbers.\n\nAdds them exactly."


async def test_a_context_parameter_gets_the_call_and_is_not_an_argument() -> None:
    seen: list[tuple[str, str, str | None, int]] = []

    @tool(needs_approval=False, replay="safe")
    async def look(context: ToolCallContext, n: int) -> str:
        """Look."""
        await asyncio.sleep(0)
        seen.append((context.tool_call_id, context.tool_name, context.run_id, n))
        context.stage_tool_state([{"op": "set", "key": "looked", "value": n}])
        return "ok"

    assert look.parameters["properties"].keys() == {"n"} and look.replay == "safe"
    model = ScriptedModel([reply("", call("look", {"n": 5}, tool_call_id="c1")), "done"])
    result = await generate_text(model=model, messages=[user("x")], tools={"look": look})
    assert result.steps[0].tool_results[0]["output"] == "ok"
    assert seen == [("c1", "look", None, 5)]


async def test_the_tool_options_pass_through() -> None:
    @tool(description="Pay it.", needs_approval=True, on_error="Payment failed.")
    def pay(amount: int) -> None:
        """Not this text."""
        raise RuntimeError("card 4242 declined")

    assert (pay.description, pay.needs_approval, pay.replay) == ("Pay it.", True, "unsafe")
    model = ScriptedModel([reply("", call("pay", {"amount": 1})), "done"])
    result = await generate_text(model=model, messages=[user("x")], tools={"pay": pay},
                                 approve_tool_call=lambda request: True)
    assert result.steps[0].tool_results[0]["output"] == "Payment failed."


def takes_args(*names: str) -> None:
    """Nope."""


def takes_positional_only(a: int, /) -> None:
    """Nope."""


def dangling(a: Undefined) -> None:  # type: ignore[name-defined]  # noqa: F821
    """Its hint names nothing."""


def when(at: datetime.datetime) -> str:
    """When."""
    return at.isoformat()


@dataclasses.dataclass
class Tree:
    value: int
    kids: list[Tree]


def grow(tree: Tree) -> int:
    """A recursive type: the stdlib path writes no $defs."""
    return tree.value


def test_what_cannot_be_a_tool_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="'names' must be one that can be passed by name"):
        tool(takes_args)
    with pytest.raises(ConfigurationError, match="'a' must be one that can be passed by name"):
        tool(takes_positional_only)
    with pytest.raises(ConfigurationError, match=r"type hints cannot be resolved.*Undefined"):
        tool(dangling)
    with pytest.raises(ConfigurationError, match="needs a function"):
        tool(42)  # type: ignore[call-overload]
    monkeypatch.setitem(sys.modules, "pydantic", None)  # as under Pyodide: pydantic is not installed
    with pytest.raises(ConfigurationError, match=r"parameter 'at' is typed .*datetime.*needs pydantic"):
        tool(when)
    with pytest.raises(ConfigurationError, match=r"parameter 'tree' is typed .*Tree.*needs pydantic"):
        tool(grow)
    assert isinstance(tool(order).parameters, dict)  # plain types need no pydantic


async def test_with_pydantic_a_hint_only_pydantic_describes_is_validated_and_converted_by_it() -> None:
    pytest.importorskip("pydantic")
    made = tool(when)
    assert isinstance(made, Tool) and not isinstance(made.parameters, dict)
    schema = made.json_schema()
    assert schema["properties"]["at"]["format"] == "date-time" and schema["required"] == ["at"]
    assert isinstance(tool(order).parameters, dict)  # plain types stay on the stdlib path
    model = ScriptedModel([reply("", call("when", {"at": "2026-01-02T03:04:05Z"}), call("when", {"at": "soon"})),
                           "done"])
    result = await generate_text(model=model, messages=[user("x")], tools={"when": made})
    good, bad = result.steps[0].tool_results
    assert good["output"] == "2026-01-02T03:04:05+00:00"
    assert bad["is_error"] and bad["output"].startswith("Invalid input:")
    recursive = tool(grow)
    assert recursive.parse_input({"tree": {"value": 1, "kids": [{"value": 2, "kids": []}]}})[1] is None
    assert recursive.json_schema()["$defs"]["Tree"]["type"] == "object"
