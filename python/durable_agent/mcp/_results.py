"""An MCP `CallToolResult` as the `ToolResult` the model reads (a pure mapping, one rule per content type).

* ``text`` blocks, and the text of embedded text resources, joined by a blank line: the output;
* ``structuredContent``, when the server sent it, is the output instead (the spec has a server
  send the same JSON as text beside it, for older clients, so nothing is lost);
* ``image`` → an image attachment, ``audio`` → a file attachment, an embedded blob resource →
  a file attachment named by its URI (raw bytes: the checkpoint codec stores them losslessly);
* ``resource_link`` → a line ``[resource: <name> <uri>]`` of the text;
* ``isError: true`` → an error result, which the model sees and can react to.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._tools import ToolResult

if TYPE_CHECKING:
    from .._messages import FilePart, ImagePart

Wire = Mapping[str, Any]
"""An MCP message part as JSON (camelCase keys), whichever client carried it."""


def tool_result(result: Wire) -> ToolResult:
    """What the model is given for a ``tools/call`` result (see the module docs)."""
    texts: list[str] = []
    attachments: list[ImagePart | FilePart] = []
    for block in result.get("content") or ():
        kind = block.get("type")
        if kind == "text":
            texts.append(block["text"])
        elif kind == "image":
            attachments.append({"type": "image", "data": _bytes(block["data"]), "media_type": block["mimeType"]})
        elif kind == "audio":
            attachments.append({"type": "file", "data": _bytes(block["data"]), "media_type": block["mimeType"]})
        elif kind == "resource":
            resource = block["resource"]
            if "text" in resource:
                texts.append(resource["text"])
            else:
                attachments.append({"type": "file", "data": _bytes(resource["blob"]),
                                    "media_type": resource.get("mimeType") or "application/octet-stream",
                                    "filename": str(resource["uri"])})
        elif kind == "resource_link":
            texts.append(f"[resource: {block.get('name', '')} {block['uri']}]")
    output: Any = "\n\n".join(texts)
    if result.get("structuredContent") is not None:
        output = result["structuredContent"]
    return ToolResult(output, is_error=bool(result.get("isError")), attachments=tuple(attachments))


def error_result(text: str) -> dict[str, Any]:
    """A ``tools/call`` result with ``isError: true`` saying `text`: how a client reports a failed call."""
    return {"content": [{"type": "text", "text": text}], "isError": True}


def timed_out(name: str, seconds: float) -> dict[str, Any]:
    """The result of a call a client gave up on after `seconds` (and sent ``notifications/cancelled``)."""
    return error_result(f"The MCP tool {name!r} did not finish within {seconds:g} s and was cancelled; its effect "
                        "may or may not have happened.")


def _bytes(data: str) -> bytes:
    """A content block's base64 payload; malformed base64 fails the call (an error result the model sees)."""
    return base64.b64decode(data, validate=True)
