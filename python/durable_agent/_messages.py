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


class History(list[Message]):
    """A message list that knows, weakly, the list it was built from by appending (`extends`).

    The loop builds every step's history this way, so a store that saved that list last time
    can tell in O(1) that only the new messages need writing; any other list (a caller's
    rewrite) is compared message by message instead. The reference is weak so a run does not
    keep every step's list alive. Like every history, never mutate it.
    """

    __slots__ = ("__weakref__", "_base")
    _base: weakref.ref[Sequence[Message]]

    @property
    def extends(self) -> Sequence[Message] | None:
        base = getattr(self, "_base", None)
        return base() if base is not None else None


def extended(history: Sequence[Message], *new: Message) -> History:
    """A new `History`: `history` followed by `new`, remembering (weakly) `history` as what it extends."""
    out = History(history)
    out.extend(new)
    try:
        out._base = weakref.ref(history)
    except TypeError:  # a plain list cannot be weakly referenced: no proof, stores compare instead
        pass
    return out
