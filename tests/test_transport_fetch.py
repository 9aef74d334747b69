"""Under Pyodide: the adapters through `FetchTransport`, fed by a stub JS ``fetch`` whose Response body
is a ReadableStream delivering the recorded bytes chunk by chunk (a cut recording errors the stream)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from durable_agent import ModelCallError, Usage
from replay import load
from test_providers_replay import ADAPTERS, FAILURE_FIELDS, FAILURES, check_failure, collect


def _fetch_unusable() -> str | None:
    if sys.platform != "emscripten":
        return "JS fetch exists only under Pyodide"
    from pyodide.ffi import can_run_sync

    # Without stack switching the tests run on a loop that cannot wait for a JS promise.
    return None if can_run_sync() else "awaiting JS promises needs stack switching (JSPI)"


pytestmark = pytest.mark.skipif(_fetch_unusable() is not None, reason=str(_fetch_unusable()))

STUB = """
(status, headersJson, pieces, cut, seen) => async (url, init) => {
  seen.push(JSON.stringify({url, method: init.method, headers: init.headers, body: init.body}));
  let i = 0;
  const body = new ReadableStream({
    pull(controller) {
      if (i < pieces.length) controller.enqueue(pieces[i++]);
      else if (cut) controller.error(new TypeError("network error"));
      else controller.close();
    },
  });
  return new Response(body, {status, headers: JSON.parse(headersJson)});
}
"""


def fetch_model(api: str, name: str) -> tuple[Any, Any]:
    from pyodide.code import run_js
    from pyodide.ffi import to_js

    from durable_agent.providers import FetchTransport

    recording = load(f"{api}/{name}")
    seen = run_js("[]")
    fetch = run_js(STUB)(recording.status, json.dumps(recording.headers), to_js(recording.pieces()),
                         recording.directives.get("x-replay-cut") == "true", seen)
    return ADAPTERS[api](base_url="https://llm.test/v1", transport=FetchTransport(fetch)), seen


async def test_chat_text_through_fetch_streams_and_sends_the_request() -> None:
    model, seen = fetch_model("openai_chat", "text")
    events = await collect(model)
    assert "".join(e["text"] for e in events if e["type"] == "text-delta").endswith("42 € — both invoices are ready.")
    assert events[-1]["usage"] == Usage(96, 12, 108, cache_read_tokens=64)
    sent = json.loads(seen[0])
    assert sent["url"] == "https://llm.test/v1/chat/completions" and sent["method"] == "POST"
    assert sent["headers"]["authorization"] == "Bearer sk-test" and json.loads(sent["body"])["stream"] is True


@pytest.mark.parametrize("api", ["openai_chat", "anthropic", "openai_responses"])
async def test_tool_calls_through_fetch(api: str) -> None:
    model, _ = fetch_model(api, "tools")
    events = await collect(model)
    assert [e["input"] for e in events if e["type"] == "tool-call"] == [{"id": "inv-7"}, {"id": "inv-8"}]


@pytest.mark.parametrize(FAILURE_FIELDS, FAILURES)
async def test_failures_through_fetch(api: str, name: str, kind: str, status: int | None, retryable: bool,
                                      retry_after: int | None, context: bool, code: str | None) -> None:
    model, _ = fetch_model(api, name)
    with pytest.raises(ModelCallError) as caught:
        await collect(model)
    check_failure(caught.value, api, name, kind, status, retryable, retry_after, context, code)
