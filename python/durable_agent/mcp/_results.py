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
from typing import TYPE_CHECKING, Any

from ..tools import ToolResult

if TYPE_CHECKING:
    from mcp import types

    from ..messages import FilePart, ImagePart


def tool_result(result: types.CallToolResult) -> ToolResult:
    """What the model is given for `result` (see the module docs)."""
    from mcp import types

    texts: list[str] = []
    attachments: list[ImagePart | FilePart] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            texts.append(block.text)
        elif isinstance(block, types.ImageContent):
            attachments.append({"type": "image", "data": _bytes(block.data), "media_type": block.mime_type})
        elif isinstance(block, types.AudioContent):
            attachments.append({"type": "file", "data": _bytes(block.data), "media_type": block.mime_type})
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                texts.append(resource.text)
            else:
                attachments.append({"type": "file", "data": _bytes(resource.blob),
                                    "media_type": resource.mime_type or "application/octet-stream",
                                    "filename": str(resource.uri)})
        elif isinstance(block, types.ResourceLink):
            texts.append(f"[resource: {block.name} {block.uri}]")
    output: Any = "\n\n".join(texts)
    if result.structured_content is not None:
        output = result.structured_content
    return ToolResult(output, is_error=result.is_error, attachments=tuple(attachments))


def _bytes(data: str) -> bytes:
    """A content block's base64 payload; malformed base64 fails the call (an error result the model sees)."""
    return base64.b64decode(data, validate=True)
