"""The adapters over recorded provider streams, through an in-memory transport (pure: runs under
Pyodide too). The same recordings go over real sockets in test_providers_sockets.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from durable_agent import (
    ConfigurationError,
    InMemoryCheckpointStore,
    ModelCallError,
    ModelRequest,
    Tool,
    ToolSpec,
    Usage,
    deserialize_checkpoint,
    generate_text,
    serialize_checkpoint,
)
from durable_agent.providers import (
    AnthropicModel,
    HttpRequest,
    HttpResponse,
    ModelSettings,
    OpenAIChatModel,
    OpenAIResponsesModel,
    Timeouts,
)
from replay import ReplayTransport, load

LOOKUP = ToolSpec("lookup", "Find an invoice.", {"type": "object", "properties": {"id": {"type": "string"}}})
ASK = ModelRequest(messages=({"role": "user", "content": "Pay invoice inv-7."},), tools=(LOOKUP,))


async def collect(model: Any, request: ModelRequest = ASK) -> list[dict[str, Any]]:
    return [event async for event in model.stream(request)]


ADAPTERS: dict[str, Any] = {
    "openai_chat": lambda **o: OpenAIChatModel("gpt-4o-mini", api_key="sk-test", **o),
    "anthropic": lambda **o: AnthropicModel("claude-sonnet-4-5", api_key="sk-ant-test", **o),
    "openai_responses": lambda **o: OpenAIResponsesModel("o4-mini", api_key="sk-test", **o),
}


def adapter(api: str, *names: str, chunk: int = 37, **options: Any) -> tuple[Any, ReplayTransport]:
    """The `api` adapter (openai_chat, anthropic, openai_responses) replaying `names` from memory."""
    transport = ReplayTransport([f"{api}/{n}" for n in names], chunk=chunk)
    return ADAPTERS[api](base_url="https://llm.test/v1", transport=transport, **options), transport


def chat(*names: str, chunk: int = 37, **options: Any) -> tuple[OpenAIChatModel, ReplayTransport]:
    model, transport = adapter("openai_chat", *names, chunk=chunk, **options)
    return model, transport


@pytest.mark.parametrize("chunk", [1, 7, 37, 100_000])
async def test_chat_text_streams_in_deltas_with_the_usage_chunk(chunk: int) -> None:
    model, _ = chat("text", chunk=chunk)
    events = await collect(model)
    assert "".join(e["text"] for e in events if e["type"] == "text-delta") == (
        "Invoice inv-7 is 42 € — both invoices are ready.")
    assert events[-1] == {"type": "finish", "finish_reason": "stop", "raw_finish_reason": "stop",
                          "usage": Usage(96, 12, 108, cache_read_tokens=64)}


async def test_chat_parallel_tool_calls_are_assembled_from_fragments() -> None:
    model, _ = chat("tools")
    events = await collect(model)
    assert [e for e in events if e["type"] == "tool-call"] == [
        {"type": "tool-call", "tool_call_id": "call_Q1w2E3", "tool_name": "lookup", "input": {"id": "inv-7"}},
        {"type": "tool-call", "tool_call_id": "call_R4t5Y6", "tool_name": "lookup", "input": {"id": "inv-8"}},
    ]
    assert events[-1]["finish_reason"] == "tool-calls" and events[-1]["usage"] == Usage(81, 46, 127)


async def test_chat_reasoning_content_of_compatible_servers_becomes_a_reasoning_event() -> None:
    model, _ = chat("reasoning")
    events = await collect(model)
    said = "The user asks for 6×7; that is 42."  # noqa: RUF001 - the recording's own text
    assert {"type": "reasoning", "text": said, "provider": "openai-chat", "metadata": {}} in events
    assert events[-1]["usage"].reasoning_tokens == 24


async def test_chat_request_body_carries_history_tools_and_settings() -> None:
    model, transport = chat("text", settings=ModelSettings(temperature=0.2, max_tokens=300, tool_choice="lookup",
                                                           parallel_tool_calls=False, seed=7),
                            extra_body={"user": "u-1"}, headers={"x-trace": "t1"})
    history: Any = (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image", "data": b"\x89PNG", "media_type": "image/png"}]},
        {"role": "assistant", "content": [
            {"type": "reasoning", "text": "hm", "provider": "anthropic", "metadata": {"signature": "s"}},
            {"type": "text", "text": "Looking."},
            {"type": "tool-call", "tool_call_id": "c1", "tool_name": "lookup", "input": {"id": "inv-7"}}]},
        {"role": "tool", "content": [{"type": "tool-result", "tool_call_id": "c1", "tool_name": "lookup",
                                      "output": {"amount": 42}, "is_error": False,
                                      "attachments": [{"type": "image", "data": b"GIF8", "media_type": "image/gif"}]}]},
    )
    await collect(model, ModelRequest(messages=history, tools=(LOOKUP,)))
    request = transport.requests[0]
    assert request.url == "https://llm.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test" and request.headers["x-trace"] == "t1"
    body = transport.bodies()[0]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}}]},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"id": "inv-7"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"amount": 42}'},
        {"role": "user", "content": [{"type": "text", "text": "Attachments of tool call c1:"},
                                     {"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lGOA=="}}]},
    ]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["tools"][0]["function"]["name"] == "lookup"
    assert (body["temperature"], body["max_tokens"], body["seed"], body["parallel_tool_calls"]) == (0.2, 300, 7, False)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert body["user"] == "u-1"


def test_azure_url_shape_api_version_and_api_key_header() -> None:
    model = OpenAIChatModel.azure("gpt4o-prod", endpoint="https://acme.openai.azure.com/", api_key="az-key",
                                  api_version="2024-10-21")
    request = model.http_request(ASK)
    assert request.url == ("https://acme.openai.azure.com/openai/deployments/gpt4o-prod/chat/completions"
                           "?api-version=2024-10-21")
    assert request.headers["api-key"] == "az-key" and "authorization" not in request.headers


def test_azure_needs_a_key_or_an_authorization_header_when_it_is_built(monkeypatch: Any) -> None:
    monkeypatch.delenv("AZURE_OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="AZURE_OPENAI_API_KEY"):
        OpenAIChatModel.azure("gpt4o-prod", endpoint="https://acme.openai.azure.com")
    with pytest.raises(ConfigurationError, match="AZURE_OPENAI_API_KEY"):
        OpenAIChatModel.azure("gpt4o-prod", endpoint="https://acme.openai.azure.com", api_key="")
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "az-env")
    assert OpenAIChatModel.azure("d", endpoint="https://acme.openai.azure.com").http_request(ASK).headers[
        "api-key"] == "az-env"
    monkeypatch.delenv("AZURE_OPENAI_API_KEY")
    entra = OpenAIChatModel.azure("d", endpoint="https://acme.openai.azure.com",
                                  headers={"Authorization": "Bearer entra-token"})  # a Microsoft Entra ID token
    headers = entra.http_request(ASK).headers
    assert headers["Authorization"] == "Bearer entra-token" and "api-key" not in headers


def test_timeout_is_a_float_seconds_shorthand_for_the_whole_call() -> None:
    assert chat("text", timeout=30)[0].timeouts == Timeouts(connect=10, read=30, total=30)
    assert chat("text", timeout=2.5)[0].http_request(ASK).timeouts == Timeouts(connect=2.5, read=2.5, total=2.5)
    with pytest.raises(ConfigurationError, match="timeout= or timeouts="):
        chat("text", timeout=5, timeouts=Timeouts())
    with pytest.raises(ConfigurationError, match="positive seconds"):
        chat("text", timeout=0)


def test_the_api_key_is_read_from_the_environment_when_the_model_is_built(monkeypatch: Any) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    model = OpenAIChatModel("gpt-4o-mini")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-later")
    assert model.http_request(ASK).headers["authorization"] == "Bearer sk-from-env"
    assert model.url() == "https://api.openai.com/v1/chat/completions"
    assert "max_completion_tokens" in model.with_settings(max_tokens=5).body(ASK)
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        OpenAIChatModel("gpt-4o-mini")


# --- Anthropic ---------------------------------------------------------------------------------


async def test_anthropic_thinking_text_and_tool_use_fragments() -> None:
    model, _ = adapter("anthropic", "tools")
    events = await collect(model)
    assert events[0] == {"type": "reasoning", "provider": "anthropic",
                         "text": "The user wants two invoices paid; I should look both up first.",
                         "metadata": {"signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"}}
    assert "".join(e["text"] for e in events if e["type"] == "text-delta") == "Looking up both invoices."
    assert [(e["tool_call_id"], e["input"]) for e in events if e["type"] == "tool-call"] == [
        ("toolu_01T1x1fJ34qAmk2tNTrN7Up6", {"id": "inv-7"}), ("toolu_01A09q90qw90lq917835lq9", {"id": "inv-8"})]
    assert events[-1] == {"type": "finish", "finish_reason": "tool-calls", "raw_finish_reason": "tool_use",
                          "usage": Usage(472 + 1024 + 2048, 89, 472 + 1024 + 2048 + 89,
                                         cache_read_tokens=2048, cache_write_tokens=1024)}


async def test_anthropic_redacted_thinking_and_max_tokens() -> None:
    model, _ = adapter("anthropic", "redacted")
    events = await collect(model)
    assert events[0]["metadata"] == {"redacted_data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"}
    assert events[-1]["finish_reason"] == "length"


async def test_anthropic_request_sends_thinking_back_verbatim_and_tool_results_in_a_user_turn() -> None:
    model, transport = adapter("anthropic", "text", settings=ModelSettings(max_tokens=1024, tool_choice="required",
                                                                          parallel_tool_calls=False),
                               thinking={"type": "enabled", "budget_tokens": 2048})
    history: Any = (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Read this."},
                                     {"type": "file", "data": b"%PDF", "media_type": "application/pdf"}]},
        {"role": "assistant", "content": [
            {"type": "reasoning", "text": "think", "provider": "anthropic", "metadata": {"signature": "sig=="}},
            {"type": "reasoning", "text": "", "provider": "anthropic", "metadata": {"redacted_data": "opaque"}},
            {"type": "reasoning", "text": "other", "provider": "openai-responses", "metadata": {"item": {}}},
            {"type": "tool-call", "tool_call_id": "toolu_1", "tool_name": "lookup", "input": {"id": "inv-7"}}]},
        {"role": "tool", "content": [{"type": "tool-result", "tool_call_id": "toolu_1", "tool_name": "lookup",
                                      "output": "42 EUR", "is_error": False,
                                      "attachments": [{"type": "image", "data": b"GIF8", "media_type": "image/gif"}]}]},
        {"role": "user", "content": "And now?"},
    )
    await collect(model, ModelRequest(messages=history, tools=(LOOKUP,)))
    request = transport.requests[0]
    assert request.url == "https://llm.test/v1/v1/messages"
    assert request.headers["x-api-key"] == "sk-ant-test" and request.headers["anthropic-version"] == "2023-06-01"
    body = transport.bodies()[0]
    assert body["system"] == "Be brief." and body["max_tokens"] == 1024 and body["stream"] is True
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert body["tools"] == [{"name": "lookup", "description": "Find an invoice.",
                              "input_schema": dict(LOOKUP.parameters)}]
    assert body["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "Read this."},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERg=="}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "think", "signature": "sig=="},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"id": "inv-7"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False, "content": [
                {"type": "text", "text": "42 EUR"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0lGOA=="}}]},
            {"type": "text", "text": "And now?"}]},
    ]


async def test_anthropic_cache_control_breakpoints_on_tools_system_and_the_conversation() -> None:
    model, transport = adapter("anthropic", "text", cache_breakpoints=("tools", "system", "messages"), cache_ttl="1h")
    history: Any = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Pay inv-7."},
                    {"role": "assistant", "content": "Which account?"},
                    {"role": "user", "content": [{"type": "text", "text": "The main one."},
                                                 {"type": "image", "data": b"GIF8", "media_type": "image/gif"}]})
    await collect(model, ModelRequest(messages=history, tools=(LOOKUP,)))
    body = transport.bodies()[0]
    mark = {"type": "ephemeral", "ttl": "1h"}
    assert body["tools"][-1]["cache_control"] == mark
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": mark}]
    assert body["messages"][-1]["content"][-1]["cache_control"] == mark  # the prefix up to here is cached
    assert sum("cache_control" in b for m in body["messages"] for b in m["content"]) == 1
    plain, transport = adapter("anthropic", "text")
    await collect(plain, ModelRequest(messages=history, tools=(LOOKUP,)))
    assert "cache_control" not in json.dumps(transport.bodies()[0])
    with pytest.raises(ConfigurationError, match="cache_breakpoints"):
        adapter("anthropic", "text", cache_breakpoints=("everything",))
    with pytest.raises(ConfigurationError, match="cache_ttl"):
        adapter("anthropic", "text", cache_ttl="2h")


# --- OpenAI Responses --------------------------------------------------------------------------

REASONING_ITEM = {
    "id": "rs_68a1f0c3", "type": "reasoning",
    "encrypted_content": load("openai_responses/tools").body.decode().split('"encrypted_content":"')[1].split('"')[0],
    "summary": [{"type": "summary_text", "text": "**Looking up invoices**\n\nI need both invoices before paying."}],
}


async def test_responses_reasoning_item_function_calls_and_usage() -> None:
    model, _ = adapter("openai_responses", "tools")
    events = await collect(model)
    assert events[0] == {"type": "reasoning", "provider": "openai-responses",
                         "text": "**Looking up invoices**\n\nI need both invoices before paying.",
                         "metadata": {"item": REASONING_ITEM}}
    assert [(e["tool_call_id"], e["input"]) for e in events if e["type"] == "tool-call"] == [
        ("call_Jq8ZBv3l", {"id": "inv-7"}), ("call_Kx2Wn5Rt", {"id": "inv-8"})]
    assert events[-1] == {"type": "finish", "finish_reason": "tool-calls", "raw_finish_reason": "completed",
                          "usage": Usage(310, 190, 500, reasoning_tokens=128, cache_read_tokens=128)}


async def test_responses_text_and_an_incomplete_response() -> None:
    model, _ = adapter("openai_responses", "text")
    events = await collect(model)
    assert "".join(e["text"] for e in events if e["type"] == "text-delta") == (
        "Invoice inv-7 is 42 € — both invoices are ready.")
    assert events[-1]["finish_reason"] == "stop"
    model, _ = adapter("openai_responses", "incomplete")
    assert (await collect(model))[-1]["finish_reason"] == "length"


async def test_responses_request_is_stateless_and_sends_reasoning_items_back_unchanged() -> None:
    model, transport = adapter("openai_responses", "text", reasoning={"effort": "low", "summary": "auto"},
                               settings=ModelSettings(max_tokens=500, tool_choice="none", parallel_tool_calls=True))
    history: Any = (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Look."},
                                     {"type": "image", "data": b"\x89PNG", "media_type": "image/png"}]},
        {"role": "assistant", "content": [
            {"type": "reasoning", "text": "s", "provider": "openai-responses", "metadata": {"item": REASONING_ITEM}},
            {"type": "reasoning", "text": "t", "provider": "anthropic", "metadata": {"signature": "x"}},
            {"type": "text", "text": "Looking."},
            {"type": "tool-call", "tool_call_id": "call_1", "tool_name": "lookup", "input": {"id": "inv-7"}}]},
        {"role": "tool", "content": [{"type": "tool-result", "tool_call_id": "call_1", "tool_name": "lookup",
                                      "output": {"amount": 42}, "is_error": False}]},
    )
    await collect(model, ModelRequest(messages=history, tools=(LOOKUP,)))
    assert transport.requests[0].url == "https://llm.test/v1/responses"
    body = transport.bodies()[0]
    assert (body["store"], body["stream"], body["include"]) == (False, True, ["reasoning.encrypted_content"])
    assert body["input"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Look."},
                                     {"type": "input_image", "image_url": "data:image/png;base64,iVBORw=="}]},
        REASONING_ITEM,
        {"role": "assistant", "content": "Looking."},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"id": "inv-7"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"amount": 42}'},
    ]
    assert body["tools"] == [{"type": "function", "name": "lookup", "description": "Find an invoice.",
                              "parameters": dict(LOOKUP.parameters), "strict": False}]
    assert (body["tool_choice"], body["parallel_tool_calls"], body["max_output_tokens"]) == ("none", True, 500)
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}


# --- refusals and finish reasons -------------------------------------------------------------

REFUSED = "I'm sorry, I can't help with that."


@pytest.mark.parametrize(("api", "raw"), [("openai_chat", "stop"), ("openai_responses", "completed")])
async def test_an_openai_refusal_is_a_refusal_event_with_finish_reason_refusal(api: str, raw: str) -> None:
    model, _ = adapter(api, "refusal")
    events = await collect(model)
    assert [e for e in events if e["type"] in ("text-delta", "refusal")] == [{"type": "refusal", "text": REFUSED}]
    assert events[-1] == {"type": "finish", "finish_reason": "refusal", "raw_finish_reason": raw,
                          "usage": Usage(41, 9, 50)}


@pytest.mark.parametrize(("api", "name", "reason", "raw"), [
    ("openai_chat", "content_filter", "content-filter", "content_filter"),
    ("anthropic", "refusal", "refusal", "refusal"),
    ("anthropic", "redacted", "length", "max_tokens"),
    ("openai_responses", "incomplete", "length", "max_output_tokens"),
])
async def test_finish_reasons_stay_apart_and_the_providers_own_is_kept(api: str, name: str, reason: str,
                                                                       raw: str) -> None:
    model, _ = adapter(api, name)
    finish = (await collect(model))[-1]
    assert (finish["finish_reason"], finish["raw_finish_reason"]) == (reason, raw)


REFUSAL_HISTORY: Any = (
    {"role": "user", "content": "Help me with something bad."},
    {"role": "assistant", "content": [{"type": "refusal", "text": REFUSED}]},
    {"role": "user", "content": "Then pay inv-7."},
)


async def test_a_refusal_in_the_history_goes_back_the_way_each_provider_takes_it() -> None:
    sent = {}
    for api in ADAPTERS:
        model, transport = adapter(api, "text")
        await collect(model, ModelRequest(messages=REFUSAL_HISTORY))
        sent[api] = transport.bodies()[0]
    assert sent["openai_chat"]["messages"][1] == {"role": "assistant", "content": "", "refusal": REFUSED}
    assert sent["openai_responses"]["input"][1] == {"type": "message", "role": "assistant",
                                                    "content": [{"type": "refusal", "refusal": REFUSED}]}
    assert sent["anthropic"]["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": REFUSED}]}


async def test_a_refused_run_ends_with_finish_reason_refusal_and_keeps_the_refusal_in_its_checkpoint() -> None:
    """No output retries for a refusal, and the refusal part survives the checkpoint codec."""
    model, transport = chat("refusal")
    store = InMemoryCheckpointStore()
    lookup = Tool(description="Find an invoice.", execute=lambda args: 42, parameters=dict(LOOKUP.parameters))
    result = await generate_text(model=model, messages=[{"role": "user", "content": "Help me with something bad."}],
                                 tools={"lookup": lookup}, output={"type": "object"}, store=store, run_id="r-1")
    assert (result.finish_reason, result.raw_finish_reason, result.text, result.output) == ("refusal", "stop", "", None)
    assert len(transport.requests) == 1
    assert result.messages[-1] == {"role": "assistant", "content": [{"type": "refusal", "text": REFUSED}]}
    assert (result.steps[0].finish_reason, result.steps[0].raw_finish_reason) == ("refusal", "stop")
    checkpoint = store.load("r-1")
    assert checkpoint is not None and checkpoint.status == "completed"
    assert deserialize_checkpoint(serialize_checkpoint(checkpoint)).messages[-1] == result.messages[-1]


async def test_per_call_model_settings_override_the_models_own_for_generate_text_and_agent_run() -> None:
    from durable_agent import Agent, ModelSettings as CoreSettings

    assert CoreSettings is ModelSettings
    model, transport = chat("text", settings=ModelSettings(temperature=0.9, seed=3))
    ask: Any = [{"role": "user", "content": "hi"}]
    await generate_text(model=model, messages=ask, model_settings=ModelSettings(temperature=0.1, max_tokens=50))
    await Agent(model=model).run("hi", model_settings=ModelSettings(top_p=0.5))
    await Agent(model=model, model_settings=ModelSettings(temperature=0.3)).run("hi")
    await generate_text(model=model, messages=ask)
    sent = [{k: b.get(k) for k in ("temperature", "seed", "max_tokens", "top_p")} for b in transport.bodies()]
    assert sent == [{"temperature": 0.1, "seed": 3, "max_tokens": 50, "top_p": None},
                    {"temperature": 0.9, "seed": 3, "max_tokens": None, "top_p": 0.5},
                    {"temperature": 0.3, "seed": 3, "max_tokens": None, "top_p": None},
                    {"temperature": 0.9, "seed": 3, "max_tokens": None, "top_p": None}]
    with pytest.raises(ConfigurationError, match="model_settings"):
        await generate_text(model=model, messages=ask, model_settings={"temperature": 0})  # type: ignore[arg-type]


# --- failures, classified ---------------------------------------------------------------------

FAILURES: list[tuple[str, str, str, int | None, bool, int | None, bool, str | None]] = [
    # (api, recording, kind, status, retryable, retry_after_ms, context_exceeded, error_code)
    ("openai_chat", "rate_limited", "rate_limited", 429, True, 19_500, False, "rate_limit_exceeded"),
    ("openai_chat", "server_error", "server_error", 500, True, None, False, "server_error"),
    ("openai_chat", "unauthorized", "auth", 401, False, None, False, "invalid_api_key"),
    ("openai_chat", "context_length", "context_length", 400, False, None, True, "context_length_exceeded"),
    ("openai_chat", "context_length_vllm", "context_length", 400, False, None, True, "400"),
    ("openai_chat", "cut", "stream_cut", None, True, None, False, None),
    ("openai_chat", "ended_before_usage", "stream_cut", None, True, None, False, None),
    ("openai_chat", "malformed", "malformed_chunk", None, True, None, False, None),
    ("openai_chat", "stream_error", "server_error", None, True, None, False, "server_error"),
    ("anthropic", "overloaded", "overloaded", 529, True, None, False, "overloaded_error"),
    ("anthropic", "rate_limited", "rate_limited", 429, True, 17_000, False, "rate_limit_error"),
    ("anthropic", "server_error", "server_error", 500, True, None, False, "api_error"),
    ("anthropic", "unauthorized", "auth", 401, False, None, False, "authentication_error"),
    ("anthropic", "context_length", "context_length", 400, False, None, True, "invalid_request_error"),
    ("anthropic", "stream_overloaded", "overloaded", None, True, None, False, "overloaded_error"),
    ("anthropic", "cut", "stream_cut", None, True, None, False, None),
    ("anthropic", "malformed", "malformed_chunk", None, True, None, False, None),
    ("anthropic", "ended_early", "stream_cut", None, True, None, False, None),
    ("openai_responses", "rate_limited", "rate_limited", 429, True, 1_200, False, "rate_limit_exceeded"),
    ("openai_responses", "server_error", "server_error", 503, True, None, False, "server_error"),
    ("openai_responses", "unauthorized", "auth", 401, False, None, False, "invalid_api_key"),
    ("openai_responses", "context_length", "context_length", 400, False, None, True, "context_length_exceeded"),
    ("openai_responses", "stream_failed", "server_error", None, True, None, False, "server_error"),
    ("openai_responses", "stream_error", "rate_limited", None, True, None, False, "rate_limit_exceeded"),
    ("openai_responses", "cut", "stream_cut", None, True, None, False, None),
    ("openai_responses", "malformed", "malformed_chunk", None, True, None, False, None),
]
FAILURE_FIELDS = ("api", "name", "kind", "status", "retryable", "retry_after", "context", "code")
PROVIDERS = {"openai_chat": "openai-chat", "anthropic": "anthropic", "openai_responses": "openai-responses"}


def check_failure(error: ModelCallError, api: str, name: str, *expected: Any) -> None:
    assert (error.kind, error.status, error.retryable, error.retry_after_ms, error.context_exceeded,
            error.error_code) == expected, error
    assert error.provider == PROVIDERS[api] and error.code == "model_call_failed"
    if error.status is not None and name != "context_length_vllm":
        assert error.request_id == f"req_err_{name}"


@pytest.mark.parametrize(FAILURE_FIELDS, FAILURES)
async def test_failures_are_classified(api: str, name: str, kind: str, status: int | None, retryable: bool,
                                       retry_after: int | None, context: bool, code: str | None) -> None:
    model, _ = adapter(api, name)
    with pytest.raises(ModelCallError) as caught:
        await collect(model)
    check_failure(caught.value, api, name, kind, status, retryable, retry_after, context, code)


async def test_the_consumers_time_between_events_does_not_count_against_the_read_timeout() -> None:
    model, _ = chat("text", timeouts=Timeouts(connect=1, read=0.05, total=0.2))
    texts: list[str] = []
    async for event in model.stream(ASK):  # 16 events, 0.06 s each: longer than `read`, and than `total`
        await asyncio.sleep(0.06)
        texts.append(str(event.get("text", "")))
    assert "".join(texts).endswith("ready.")


class SilentAfter:
    """A transport whose response body sends `first`, then goes silent (30 s) without ending."""

    def __init__(self, first: bytes) -> None:
        self.first = first

    async def handle_async_request(self, request: HttpRequest) -> HttpResponse:
        async def stream() -> Any:
            yield self.first
            await asyncio.sleep(30)
            yield b""

        async def aclose() -> None:
            return None

        return HttpResponse(200, {}, stream(), aclose)


def silent_after(first: bytes, read: float) -> OpenAIChatModel:
    return OpenAIChatModel("m", base_url="https://llm.test/v1", api_key="k", transport=SilentAfter(first),
                           timeouts=Timeouts(connect=1, read=read, total=5))


async def test_a_body_that_does_not_end_after_the_terminal_event_does_not_fail_the_finished_call() -> None:
    """The rest of the body is read so the connection can be pooled, but never at the call's expense."""
    assert (await collect(silent_after(load("openai_chat/text").body, read=0.2)))[-1]["type"] == "finish"


async def test_a_stalled_transport_times_out_after_read_seconds() -> None:
    with pytest.raises(ModelCallError) as caught:
        await collect(silent_after(b"data: {}\n\n", read=0.05))
    assert (caught.value.kind, caught.value.retryable) == ("timeout", True)
    assert asyncio.current_task() is None or asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
