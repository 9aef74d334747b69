"""A filesystem-style MCP server, written with the official `mcp` SDK: the files of one directory.

    python examples/mcp_files_server.py ROOT     # over stdio (what `StdioServer` starts)

`list_files` and `read_file` say ``readOnlyHint: true``, so durable-agent runs them again after a crash;
`write_file` does not, so a write interrupted by a crash is reported to the model instead of repeated.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

ROOT = Path(sys.argv[1]).resolve()
server = MCPServer("files")
READ_ONLY = ToolAnnotations(read_only_hint=True)


def inside(name: str) -> Path:
    path = (ROOT / name).resolve()
    if ROOT not in path.parents:
        raise ToolError(f"{name!r} is outside the served directory")
    return path


@server.tool(annotations=READ_ONLY)
def list_files() -> list[str]:
    """The names of the files in the served directory."""
    return sorted(p.name for p in ROOT.iterdir() if p.is_file())


@server.tool(annotations=READ_ONLY)
def read_file(name: str) -> str:
    """The text of one file."""
    path = inside(name)
    if not path.is_file():
        raise ToolError(f"no file {name!r}")
    return path.read_text(encoding="utf-8")


@server.tool()
def write_file(name: str, text: str) -> str:
    """Write (replace) one file."""
    inside(name).write_text(text, encoding="utf-8")
    return f"wrote {len(text)} characters to {name}"


if __name__ == "__main__":
    server.run()
