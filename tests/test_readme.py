"""The README's tour is real code: run its first Python block and check what it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_tour_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks, "the README has no Python example"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme"})  # noqa: S102
    printed = out.getvalue()
    assert "needs approval: pay {'id': 'inv-7'}" in printed
    assert "Invoice inv-7 is paid. | paid: ['inv-7']" in printed
