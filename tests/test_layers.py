"""The package's layering rule (docs/layers.md): no import runs back up a layer, no two rooms import each other.

Static: the imports are read from the source with `ast`, every one of them (inside functions and
`TYPE_CHECKING` blocks too, since they tie the rooms as much as the others).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "durable_agent"

LAYERS: dict[str, int] = {
    **dict.fromkeys(("_errors", "_checkpoint", "_messages", "_signing", "_util", "_kernels", "_pure", "_codec_pure",
                     "_token_pure", "_schema", "_version", "_transport", "encryption"), 1),
    "_storage": 2,
    "backends": 3,
    **dict.fromkeys(("_models", "_tools", "_tool_functions", "_tool_sources", "_tool_calls", "_model_call", "_loop",
                     "_generate", "_options", "_results", "_retry", "_stop", "stream_parts", "_durability", "_structured_output", "_transcript",
                     "tracing", "_parked", "_fork", "_subagent", "_interrupted", "_durable_session", "_agent"), 4),
    **dict.fromkeys(("providers", "mcp", "http", "cli", "restate", "testing"), 5),
    "__init__": 6,  # the flat public namespace
}

pytestmark = pytest.mark.host_only("reads the package's source tree")


def room_imports() -> dict[tuple[str, str], list[str]]:
    """(importing room, imported room) -> where, for every import between two rooms of the package."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        room, package = parts[0], list(parts[:-1])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[list[str]] = []
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - (node.level - 1)]
                targets = [base + node.module.split(".")] if node.module else [[*base, a.name] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("durable_agent."):
                targets = [(node.module or "").split(".")[1:]]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".")[1:] for a in node.names if a.name.startswith("durable_agent.")]
            for target in targets:
                if target and target[0] != room:
                    found[(room, target[0])].append(f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', 0)}")
    return found


def test_every_room_has_a_layer() -> None:
    rooms = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").exists())}
    assert sorted(rooms - LAYERS.keys()) == [], "a new room: give it a layer in docs/layers.md and LAYERS here"
    assert sorted(LAYERS.keys() - rooms) == [], "a room is gone: remove it from docs/layers.md and LAYERS here"


def test_no_import_runs_up_a_layer() -> None:
    upward = {f"{a} (layer {LAYERS[a]}) -> {b} (layer {LAYERS[b]})": where
              for (a, b), where in room_imports().items() if LAYERS[b] > LAYERS[a]}
    assert upward == {}


def test_no_two_rooms_import_each_other() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in room_imports():
        graph[a].add(b)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            room = todo.pop()
            if room == goal:
                return True
            if room not in seen:
                seen.add(room)
                todo.extend(graph[room])
        return False

    in_cycles = sorted(f"{a} -> {b}" for a in list(graph) for b in graph[a] if reaches(b, a))
    assert in_cycles == []
