"""The AI SDK UI message stream (v5, and ai 7's approval and denial chunks) chunks this endpoint emits, as the protocol's strict schema has them.

Written from the AI SDK's stream protocol documentation (ai-sdk.dev, "Stream Protocols",
data stream protocol): each chunk type with its required and optional fields. The
protocol's client parses chunks with strict objects, so a field not listed here would make
``useChat`` reject the stream.
"""

from __future__ import annotations

from typing import Any

CHUNKS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # chunk type: (required fields besides "type", optional fields)
    "start": (frozenset(), frozenset({"messageId", "messageMetadata"})),
    "start-step": (frozenset(), frozenset()),
    "text-start": (frozenset({"id"}), frozenset({"providerMetadata"})),
    "text-delta": (frozenset({"id", "delta"}), frozenset({"providerMetadata"})),
    "text-end": (frozenset({"id"}), frozenset({"providerMetadata"})),
    "tool-input-available": (frozenset({"toolCallId", "toolName", "input"}),
                             frozenset({"providerExecuted", "providerMetadata", "dynamic"})),
    "tool-output-available": (frozenset({"toolCallId", "output"}),
                              frozenset({"providerExecuted", "dynamic", "preliminary"})),
    "tool-output-error": (frozenset({"toolCallId", "errorText"}), frozenset({"providerExecuted", "dynamic"})),
    "tool-approval-response": (frozenset({"approvalId", "approved"}),
                               frozenset({"reason", "providerExecuted", "providerMetadata"})),
    "tool-output-denied": (frozenset({"toolCallId"}), frozenset()),
    "tool-approval-request": (frozenset({"approvalId", "toolCallId"}),
                              frozenset({"approvalDescriptor", "inputSchemaInput", "reason", "isAutomatic", "signature"})),
    "finish-step": (frozenset(), frozenset()),
    "finish": (frozenset(), frozenset({"messageMetadata"})),
    "error": (frozenset({"errorText"}), frozenset()),
}
DATA_PART = (frozenset({"data"}), frozenset({"id", "transient"}))


def check_chunk(chunk: Any) -> None:
    """Fail unless `chunk` is one of the protocol's chunks with exactly its allowed fields."""
    assert isinstance(chunk, dict) and isinstance(chunk.get("type"), str), chunk
    kind = chunk["type"]
    required, optional = DATA_PART if kind.startswith("data-") else CHUNKS[kind]
    fields = set(chunk) - {"type"}
    assert required <= fields, f"{kind}: missing {required - fields}"
    assert fields <= required | optional, f"{kind}: fields the schema rejects: {fields - required - optional}"
    for name in fields & {"id", "delta", "toolCallId", "toolName", "errorText", "messageId", "approvalId", "signature"}:
        assert isinstance(chunk[name], str), f"{kind}.{name} must be a string"
