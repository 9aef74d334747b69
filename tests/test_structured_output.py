"""`output=`: the final answer checked against a JSON Schema or a pydantic model, repaired a bounded number of times."""

from __future__ import annotations

from typing import Any

import pytest

from durable_agent import (
    ConfigurationError,
    Message,
    ModelRequest,
    OutputValidationError,
    ScriptedModel,
    Tool,
    call,
    generate_text,
    reply,
)
from durable_agent.providers import OpenAIChatModel, OpenAIResponsesModel

INVOICE = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "amount": {"type": "number", "minimum": 0}},
    "required": ["id", "amount"],
    "additionalProperties": False,
}
HI: list[Message] = [{"role": "user", "content": "Which invoice?"}]


async def test_a_matching_answer_is_parsed_onto_the_result_and_the_model_is_told_the_schema() -> None:
    model = ScriptedModel([reply("", call("lookup", {})), '{"id": "inv-7", "amount": 42}'])
    result = await generate_text(model=model, messages=HI, output=INVOICE,
                                 tools={"lookup": Tool(execute=lambda a: "inv-7: 42 EUR")})
    assert result.output == {"id": "inv-7", "amount": 42} and result.finish_reason == "stop"
    assert all(r.output_schema == INVOICE for r in model.requests)


async def test_a_fenced_json_block_counts_and_a_pydantic_model_gives_its_instance() -> None:
    pytest.importorskip("pydantic")
    from pydantic import BaseModel

    class Invoice(BaseModel):
        id: str
        amount: float

    result = await generate_text(model=ScriptedModel(['```json\n{"id": "a", "amount": 1.5}\n```']), messages=HI,
                                 output=Invoice)
    assert isinstance(result.output, Invoice) and result.output.amount == 1.5


async def test_a_wrong_answer_goes_back_to_the_model_with_the_problem() -> None:
    model = ScriptedModel(["It is invoice inv-7.", '{"id": "inv-7"}', '{"id": "inv-7", "amount": 42}'])
    result = await generate_text(model=model, messages=HI, output=INVOICE)
    assert result.output == {"id": "inv-7", "amount": 42} and len(model.requests) == 3
    repairs = [m["content"] for m in result.messages if m["role"] == "user"][1:]
    assert "not JSON" in repairs[0] and "amount" in repairs[1]


async def test_the_repairs_are_bounded_then_the_run_fails_with_a_typed_error() -> None:
    model = ScriptedModel(["no", "still no", "never"])
    with pytest.raises(OutputValidationError) as info:
        await generate_text(model=model, messages=HI, output=INVOICE, output_retries=1)
    assert len(model.requests) == 2 and info.value.text == "still no"


@pytest.mark.parametrize("bad", [{"type": "object", "properties": {"a": {"maxLenght": 3}}}, "a string", 3])
async def test_an_output_that_cannot_be_checked_is_refused_before_the_call(bad: Any) -> None:
    model = ScriptedModel(["{}"])
    with pytest.raises(ConfigurationError):
        await generate_text(model=model, messages=HI, output=bad)
    assert not model.requests


def test_the_openai_adapters_ask_for_the_schema_natively() -> None:
    request = ModelRequest(messages=tuple(HI), output_schema=INVOICE, output_name="an invoice!")
    chat = OpenAIChatModel("gpt-test", api_key="k", base_url="http://127.0.0.1:9").body(request)
    assert chat["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "an_invoice_", "schema": INVOICE}}
    responses = OpenAIResponsesModel("gpt-test", api_key="k", base_url="http://127.0.0.1:9").body(request)
    assert responses["text"] == {"format": {"type": "json_schema", "name": "an_invoice_", "schema": INVOICE}}
    assert "response_format" not in OpenAIChatModel("m", api_key="k", base_url="http://x").body(
        ModelRequest(messages=tuple(HI)))
