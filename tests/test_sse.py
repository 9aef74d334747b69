"""Server-sent events as the adapters read them: WHATWG line and field rules, and bytes split anywhere.

Checked through `OpenAIChatModel` on a transport serving a stream in pieces: the text the model streams
tells which events were dispatched and with what data; an event that is not JSON fails the call with
its data quoted (``not JSON: '...'``), which shows how data lines were joined.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from durable_agent import ModelCallError, ModelRequest
from durable_agent.providers import HttpRequest, HttpResponse, OpenAIChatModel


def delta(text: str) -> str:
    return json.dumps({"id": "c1", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]},
                      ensure_ascii=False)


FINISH = json.dumps({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})
STREAM = (
    f"event: message_start\r\ndata: {delta('é€😀')}\r\n\r\n"  # CRLF line ends; multi-byte UTF-8
    ": a comment\n"  # ignored
    f"data:{delta(' first')}\nid: 7\nretry: 100\n\n"  # no space after the colon; id and retry ignored
    f"event: ping\rdata: {delta(' second')}\r\r"  # CR line ends
    "event: empty\n\n"  # no data: no event
    f"data: {FINISH}\n\n"
    "data: [DONE]\n\n"
).encode()
TEXT = "é€😀 first second"


@dataclass
class PiecesTransport:
    """Serves one 200 response whose body is `pieces`, in that order."""

    pieces: list[bytes]

    async def handle_async_request(self, request: HttpRequest) -> HttpResponse:
        async def stream() -> AsyncIterator[bytes]:
            for piece in self.pieces:
                yield piece

        async def aclose() -> None:
            return None

        return HttpResponse(200, {"content-type": "text/event-stream"}, stream(), aclose)


async def streamed(pieces: list[bytes]) -> tuple[str, Any]:
    """The text the model streamed from `pieces`, and its finish event."""
    model = OpenAIChatModel("gpt-4o-mini", api_key="sk-test", base_url="https://llm.test/v1",
                            transport=PiecesTransport(pieces))
    events = [e async for e in model.stream(ModelRequest(messages=({"role": "user", "content": "hi"},)))]
    return "".join(e["text"] for e in events if e["type"] == "text-delta"), events[-1]


async def failure(body: bytes) -> str:
    with pytest.raises(ModelCallError) as caught:
        await streamed([body])
    return str(caught.value)


async def test_whole_stream() -> None:
    text, finish = await streamed([STREAM])
    assert (text, finish["type"], finish["finish_reason"]) == (TEXT, "finish", "stop")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 13])
async def test_split_into_pieces_of_every_size(size: int) -> None:
    assert (await streamed([STREAM[i : i + size] for i in range(0, len(STREAM), size)]))[0] == TEXT


async def test_split_at_every_position() -> None:
    for cut in range(len(STREAM) + 1):
        assert (await streamed([STREAM[:cut], STREAM[cut:]]))[0] == TEXT, cut


async def test_data_lines_join_with_a_newline_and_a_bare_data_field_is_empty_data() -> None:
    assert "not JSON: 'a\\nb'" in await failure(b"data: a\ndata:b\n\n")
    assert "not JSON: ''" in await failure(b"event: x\ndata\n\n")


async def test_a_stream_ending_mid_line_or_mid_event_is_not_at_a_boundary() -> None:
    assert "ended in the middle of an event" in await failure(b'data: {"a"')
    assert "ended in the middle of an event" in await failure(f"data: {delta('x')}\n".encode())  # not dispatched
    assert "ended before [DONE]" in await failure(f"data: {delta('x')}\n\n".encode())  # at a boundary


async def test_invalid_utf8_fails_the_call() -> None:
    assert "not UTF-8" in await failure(b"data: \xff\n\n")
