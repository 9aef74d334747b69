"""The shapes of messages and their parts, documented once.

Messages are plain JSON-compatible dicts so a checkpoint is plain data. These TypedDicts
describe them for type checkers and readers; nothing checks them at run time.

What real providers add: an assistant message starts with its ``reasoning`` parts (kept
exactly as the provider's adapter produced them, and sent back by that adapter only); user
messages may carry ``image`` and ``file`` parts (raw bytes; the checkpoint codec stores
them losslessly); a tool result may carry images or files as ``attachments``; an assistant
message may end its text with a ``refusal`` part (the model declined).

History is immutable by contract: the loop never mutates a message or a message list it
has handed out; every step builds a new list. Callers must not mutate them either.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Literal, NotRequired, TypedDict


class TextPart(TypedDict):
    type: Literal["text"]
    text: str


class ToolCallPart(TypedDict):
    type: Literal["tool-call"]
    tool_call_id: str
    tool_name: str
    input: Any


class ToolResultPart(TypedDict):
    """A tool's result. `attachments` are images or files the tool returned beside its output
    (a screenshot, a PDF); adapters send them the way their provider takes them. `denied`: the
    call never ran because its approval was refused (or never given); the output, an error, says
    why (the verdict's reason). Adapters send the output only."""

    type: Literal["tool-result"]
    tool_call_id: str
    tool_name: str
    output: Any
    is_error: bool
    usage: NotRequired[dict[str, int]]  # a sub-agent's token usage, counted toward its parent run
    attachments: NotRequired[list[ImagePart | FilePart]]
    denied: NotRequired[bool]


class ReasoningPart(TypedDict):
    """A reasoning (thinking) block of an assistant message, first in its content.

    `text` is what the provider showed of the reasoning (a summary, or the thinking itself;
    may be empty). `provider` names the wire API that produced it (``anthropic``,
    ``openai-responses``, ``openai-chat``) and `metadata` is opaque: that adapter sends it back
    unchanged on later calls (Anthropic's thinking signature or redacted data, an OpenAI
    reasoning item with its encrypted content); other providers' adapters skip the part.
    """

    type: Literal["reasoning"]
    text: str
    provider: str
    metadata: dict[str, Any]


class RefusalPart(TypedDict):
    """The model declined to answer (OpenAI's ``refusal``): its explanation, after any text of the
    assistant message. The run's finish reason is then ``refusal``. Adapters send it back the way
    their provider takes a refusal (OpenAI) or as text (Anthropic)."""

    type: Literal["refusal"]
    text: str


class ToolApprovalRequestPart(TypedDict):
    """Marks, inside the assistant message, a tool call that waits for a client-mode verdict."""

    type: Literal["tool-approval-request"]
    approval_id: str
    tool_call_id: str


class ImagePart(TypedDict):
    type: Literal["image"]
    data: bytes
    media_type: NotRequired[str]


class FilePart(TypedDict):
    type: Literal["file"]
    data: bytes
    media_type: str
    filename: NotRequired[str]


ContentPart = (TextPart | ToolCallPart | ToolResultPart | ToolApprovalRequestPart | ImagePart | FilePart | ReasoningPart
               | RefusalPart)


class Message(TypedDict):
    """One message. `content` is a str (shorthand for one text part) or a list of parts."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[ContentPart]


def content_parts(message: Message) -> list[ContentPart]:
    """The message's content as a list of parts (a str content is one text part)."""
    content = message["content"]
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content)


def message_text(message: Message) -> str:
    """The concatenated text parts of a message."""
    return "".join(p["text"] for p in content_parts(message) if p["type"] == "text")


def final_text(messages: Sequence[Message]) -> str:
    """The text of the last assistant message ("" when there is none): what a run answered."""
    last = next((m for m in reversed(messages) if m["role"] == "assistant"), None)
    return message_text(last) if last is not None else ""


_BASES = 3
"""How many appends back a `History` names what it was built from: a tool step appends its assistant message,
then its tool message, and the store saved the list before both (an output repair adds a third)."""


class History(list[Message]):
    """A message list that knows, weakly, the lists it was built from by appending (`extended`).

    The loop builds every step's history this way, so a store that saved one of those lists last
    time can tell in O(1) that only the new messages need writing (`built_from`); any other list (a
    caller's rewrite) is compared message by message instead. The references are weak so a run does
    not keep every step's list alive. Like every history, never mutate it.
    """

    __slots__ = ("__weakref__", "_bases")
    _bases: tuple[weakref.ref[Sequence[Message]], ...]  # nearest first, at most `_BASES`


def extended(history: Sequence[Message], *new: Message) -> History:
    """A new `History`: `history` followed by `new`, remembering (weakly) `history` and what it was built from."""
    out = History(history)
    out.extend(new)
    try:
        nearest = weakref.ref(history)
    except TypeError:  # a plain list cannot be weakly referenced: no proof, stores compare instead
        return out
    out._bases = (nearest, *getattr(history, "_bases", ())[: _BASES - 1])
    return out


def built_from(new: Sequence[Message], old: Sequence[Message]) -> bool:
    """True when `new` was built from `old` itself by appending (`extended`, up to `_BASES` times over): O(1).

    False proves nothing: the store compares the messages instead."""
    return any(base() is old for base in getattr(new, "_bases", ()))
