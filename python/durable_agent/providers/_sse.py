"""Server-sent events (text/event-stream), parsed incrementally. Pure standard library.

Follows the WHATWG rules the providers rely on: lines end with CRLF, LF or CR; a line
starting with ``:`` is a comment; ``field: value`` with one optional space after the colon;
``data`` lines accumulate, joined by LF; a blank line dispatches the event (an event with no
data is dropped); the event name defaults to ``message``. Bytes may split anywhere,
UTF-8 sequences included.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str
    data: str


class SSEDecoder:
    """Feed it byte chunks; it returns the events each chunk completed."""

    __slots__ = ("_data", "_decode", "_event", "_tail")

    def __init__(self) -> None:
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="strict").decode
        self._tail = ""  # an unfinished line (or a lone trailing CR)
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        text = self._tail + self._decode(chunk)
        if "\r" in text:
            held = text.endswith("\r")  # a CR at the end may be the first half of a CRLF
            text = text.replace("\r\n", "\n").replace("\r", "\n")
            if held:
                text = text[:-1]
                lines = text.split("\n")
                self._tail = lines.pop() + "\r"
            else:
                lines = text.split("\n")
                self._tail = lines.pop()
        else:
            lines = text.split("\n")
            self._tail = lines.pop()
        events: list[SSEEvent] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(SSEEvent(self._event or "message", "\n".join(self._data)))
                    self._data = []
                self._event = ""
                continue
            if line[0] == ":":
                continue
            name, colon, value = line.partition(":")
            if colon and value[:1] == " ":
                value = value[1:]
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
        return events

    @property
    def at_boundary(self) -> bool:
        """True when no line or event is half-received (the stream may end here cleanly)."""
        return not self._tail.rstrip("\r") and not self._data
