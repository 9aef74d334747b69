"""The demo's agent: a scripted "coding assistant" with a few tools, one of them gated by approval.

Shared by the crash demo (`examples/crash_demo.py`) and the crash tests, so both drive the
very same run. Every tool effect is appended to a ledger file, so a reader can see which
effects happened and how many times.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from durable_agent import ScriptedModel, Tool, call, reply

FILES = {
    "tests/test_login.py": "def test_login(): assert login('Ann@Example.com').ok",
    "app/login.py": "def login(email): return users.get(email)",
}
PROMPT = "The login test fails. Find the bug, fix it, and ship the fix."


def model(delay: float = 0.0) -> ScriptedModel:
    """The scripted model. With a delay, text streams slowly enough to be interrupted mid-step."""
    return ScriptedModel(
        [
            reply("I'll start by reading the failing test.", call("read_file", {"path": "tests/test_login.py"})),
            reply("The test expects a lowercase email. Let me look at the code.",
                  call("read_file", {"path": "app/login.py"})),
            reply("Found it: the email is compared without normalising its case. Writing the fix now.",
                  call("write_file", {"path": "app/login.py", "patch": "email = email.strip().lower()"})),
            reply("Running the test suite to confirm the fix.", call("run_tests", {"target": "tests/test_login.py"})),
            reply("All green. Deploying needs your approval.", call("deploy", {"service": "auth", "version": "1.4.2"})),
            "The fix is deployed: emails are now normalised before the lookup, and the login test passes.",
        ],
        model_id="scripted-coder",
        delay=delay,
    )


def tools(ledger: Path) -> dict[str, Tool]:
    """The tools; each effect is appended to `ledger` (one JSON line per effect)."""

    def effect(name: str, result: Any) -> Any:
        def execute(args: Any) -> Any:
            with ledger.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"tool": name, "input": args}) + "\n")
            return FILES.get(args.get("path", "")) if result is None else result

        return execute

    path_schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    return {
        "read_file": Tool(description="Read a file.", parameters=path_schema, execute=effect("read_file", None)),
        "write_file": Tool(description="Apply a patch to a file.",
                           parameters={"type": "object", "properties": {"path": {"type": "string"},
                                                                        "patch": {"type": "string"}},
                                       "required": ["path", "patch"]},
                           execute=effect("write_file", "patched 1 line")),
        "run_tests": Tool(description="Run tests.", parameters={"type": "object"},
                          execute=effect("run_tests", "1 passed in 0.02s")),
        "deploy": Tool(description="Deploy a service (needs a human's approval).", parameters={"type": "object"},
                       execute=effect("deploy", "auth 1.4.2 is live"), needs_approval=True),
    }


def ledger_entries(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text(encoding="utf-8").splitlines() if line]
