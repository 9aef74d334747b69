"""The tests import only what a user can import (docs/layers.md, "Public and private").

Static, like tests/test_layers.py: every Python file under tests/ is read with `ast`, every import in it
counted (inside functions too), and so is the code a test hands a fresh interpreter as a string
(`python -c`, a worker script written out). An import of a `_`-prefixed module of `durable_agent`
(`durable_agent._util`, `durable_agent.providers._sse`) or of a `_`-prefixed name from one of its modules
(`from durable_agent import _pure`) fails the test, naming the file and line. Dunder names
(`__version__`, `durable_agent.cli.__main__`) are public. The test helpers are the tests' own modules
(tests/helpers.py, the *_kit.py files) and the documented `durable_agent.testing`. The examples in the public
modules' docstrings are held to what a user can write: absolute imports of public parts.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

pytestmark = pytest.mark.host_only("reads the tests' source tree")


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, what) for each import of a private part of durable_agent in `tree`, and in the code its strings hold."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "durable_agent" and any(map(is_private, parts[1:])):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            parts = node.module.split(".")
            names = [alias.name for alias in node.names]
            if parts[0] == "durable_agent" and (any(map(is_private, parts[1:])) or any(map(is_private, names))):
                yield node.lineno, f"from {node.module} import {', '.join(names)}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
              and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            parts = node.args[0].value.split(".")
            if parts[0] == "durable_agent" and any(map(is_private, parts[1:])):
                yield node.lineno, f"import_module({node.args[0].value!r})"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "durable_agent" in node.value \
                and "import" in node.value:
            try:
                code = ast.parse(textwrap.dedent(node.value))
            except SyntaxError:
                continue  # prose, not code
            for line, what in private_imports(code):
                yield node.lineno + line - 1, f"{what} (in code a string holds)"


def found() -> list[str]:
    return [f"{path.relative_to(TESTS.parent)}:{line}: {what}"
            for path in sorted(TESTS.rglob("*.py"))
            if "node_modules" not in path.parts and path.name != Path(__file__).name  # this file's samples
            for line, what in private_imports(ast.parse(path.read_text(encoding="utf-8"), str(path)))]


PACKAGE = TESTS.parent / "python" / "durable_agent"


def public_modules() -> Iterator[Path]:
    """The modules of durable_agent a user imports: no `_`-prefixed part in their path (``__init__.py`` is its package)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if not any(map(is_private, parts)):
            yield path


def unwritable_example_imports(path: Path) -> Iterator[str]:
    """Each import line in `path`'s module docstring a user could not write: relative, or of a private part."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or ""
    for line in docstring.splitlines():
        if not line.strip().startswith(("from ", "import ")):
            continue
        try:
            code = ast.parse(line.strip())
        except SyntaxError:
            continue  # prose, not code
        relative = any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(code))
        if relative or any(private_imports(code)):
            yield f"{path.relative_to(TESTS.parent)}: {line.strip()}"


def test_the_public_modules_examples_import_what_a_user_can() -> None:
    """A public module's docstring shows imports a user can copy: absolute, of public parts only."""
    assert [hit for path in public_modules() for hit in unwritable_example_imports(path)] == []


def test_the_tests_import_no_private_part_of_durable_agent() -> None:
    assert found() == []


@pytest.mark.parametrize("source", [
    "from durable_agent._util import maybe_await",
    "from durable_agent import _pure",
    "import durable_agent._kernels as k",
    "from durable_agent.providers._sse import SSEDecoder",
    "from durable_agent.backends.memory import _header",
    "def f():\n    from durable_agent._codec_pure import decode",
    "import importlib\nimportlib.import_module('durable_agent._signing')",
    'SCRIPT = """\nimport durable_agent._signing\n"""',
])
def test_the_check_sees_each_way_of_reaching_a_private_part(source: str) -> None:
    assert len(list(private_imports(ast.parse(source)))) == 1


@pytest.mark.parametrize("source", [
    "from durable_agent import __version__, Agent",
    "import durable_agent.cli.__main__",
    "from durable_agent.backends.sqlite import SqliteRuntime",
    "from helpers import maybe_await",
    "import _thread",
    'DOC = "the private durable_agent._kernels module picks the kernels; import nothing from it"',
])
def test_public_imports_and_prose_pass(source: str) -> None:
    assert list(private_imports(ast.parse(source))) == []
