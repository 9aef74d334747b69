"""The incremental SSE parser: WHATWG line and field rules, and bytes split anywhere."""

from __future__ import annotations

import pytest

from durable_agent.providers._sse import SSEDecoder, SSEEvent

STREAM = (
    "event: message_start\r\ndata: {\"a\": \"é€😀\"}\r\n\r\n"
    ": a comment\n"
    "data: first\ndata:second\nid: 7\nretry: 100\n\n"
    "event: ping\rdata: {}\r\r"
    "event: empty\n\n"
    "data\n\n"
    "data: [DONE]\n\n"
).encode()
EXPECTED = [
    SSEEvent("message_start", '{"a": "é€😀"}'),
    SSEEvent("message", "first\nsecond"),
    SSEEvent("ping", "{}"),
    SSEEvent("message", ""),
    SSEEvent("message", "[DONE]"),
]


def feed_in(pieces: list[bytes]) -> tuple[list[SSEEvent], bool]:
    decoder = SSEDecoder()
    events = [event for piece in pieces for event in decoder.feed(piece)]
    return events, decoder.at_boundary


def test_whole_stream() -> None:
    assert feed_in([STREAM]) == (EXPECTED, True)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 13])
def test_split_into_pieces_of_every_size(size: int) -> None:
    assert feed_in([STREAM[i : i + size] for i in range(0, len(STREAM), size)]) == (EXPECTED, True)


def test_split_at_every_position() -> None:
    for cut in range(len(STREAM) + 1):
        assert feed_in([STREAM[:cut], STREAM[cut:]]) == (EXPECTED, True), cut


def test_a_stream_ending_mid_line_or_mid_event_is_not_at_a_boundary() -> None:
    assert feed_in([b"data: {\"a\""])[1] is False
    assert feed_in([b"data: {}\n"])[1] is False  # the line is whole, the event is not dispatched
    assert feed_in([b"data: {}\n\n"]) == ([SSEEvent("message", "{}")], True)


def test_invalid_utf8_raises() -> None:
    with pytest.raises(UnicodeDecodeError):
        SSEDecoder().feed(b"data: \xff\n\n")
