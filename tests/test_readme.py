"""The README's tour is real code: run it (the Python block that builds the `ScriptedModel`; the
real-model snippet before it needs a live provider) and check what it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_tour_runs() -> None:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
              if "ScriptedModel([" in b]
    assert blocks, "the README has no tour"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme"})
    printed = out.getvalue()
    assert "needs approval: pay {'id': 'inv-7'}" in printed
    assert "Invoice inv-7 is paid. | paid: ['inv-7']" in printed


def test_the_readme_real_model_snippet_builds_its_models(monkeypatch: Any) -> None:
    """No network here: the snippet only builds models, which needs their keys in the environment."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_OPENAI_API_KEY"):
        monkeypatch.setenv(name, "test-key")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
              if "durable_agent.providers" in b]
    assert blocks, "the README has no real-model snippet"
    scope: dict[str, Any] = {"__name__": "readme"}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    assert scope["model"].model_id == "anthropic:claude-sonnet-5-5" and scope["model"].settings.max_tokens == 2048


def test_the_readme_tool_from_a_function_runs() -> None:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S) if "@tool" in b]
    assert blocks, "the README has no @tool snippet"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme"})
    assert out.getvalue().splitlines() == [
        "{'type': 'string', 'description': \"The invoice's id, as printed on it.\"}",
        "{'id': 'inv-7', 'amount': 42, 'currency': 'EUR', 'call': 'c1'}",
    ]
