"""Every ```python block of README.md runs as written: each is saved as a program of its own (under the name its
first line gives, ``# app.py — ...``, else ``snippet.py``) and run by a fresh interpreter in a temporary directory,
with this checkout's python/ on PYTHONPATH, `examples/` beside it and the environment the README documents (fake
provider keys and an approval secret: building a model sends nothing). What a block prints is checked where the
README shows it.

A block that cannot run alone carries ``<!-- readme-test: skip, <reason> -->`` on the line above its fence; those
are few, listed here, and run by a test of their own: the Restate service and client, against the real
restate-server `scripts/services run` starts (skipped without one, a failure under CI=true). The endpoint block
also runs as a program, then a real uvicorn process serves it and answers a request.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
pytestmark = pytest.mark.host_only("runs the README's snippets as programs in subprocesses")

# The environment the README documents for its snippets.
ENV = {
    "OPENAI_API_KEY": "sk-readme-test",  # the real-model block builds models (and sends nothing)
    "ANTHROPIC_API_KEY": "sk-ant-readme-test",
    "AZURE_OPENAI_API_KEY": "readme-test",
    "APPROVAL_SECRET": "readme-test-approval-secret-0123456789",  # app.py and service.py sign approvals
}
# Packages a block needs beyond its own imports: durable_agent's optional integrations import them lazily.
INTEGRATIONS = {"durable_agent.mcp": "mcp", "durable_agent.restate": "restate"}
# The blocks marked skip (by their first line), each run by the test named in its marker.
RUN_ELSEWHERE = {
    "# service.py — APPROVAL_SECRET=$(openssl rand -hex 32) python service.py",
    "# client.py — any process",
}
# What blocks print: (a string only that block holds, texts its output must hold).
PRINTED = [
    ("print(\"needs approval:\"", ["needs approval: pay {'id': 'inv-7'}", "Invoice inv-7 is paid. | paid: ['inv-7']"]),
    ("@tool(", ["{'type': 'string', 'description': \"The invoice's id, as printed on it.\"}",
                "{'id': 'inv-7', 'amount': 42, 'currency': 'EUR', 'call': 'c1'}"]),
    ("on_interrupted=\"heal\"", ["suspended -> Invoice inv-7 is paid."]),
    ("StdioServer(", ["summary.txt lists 2 items. | 2 items: milk, bread."]),
    ("fork_run(", ["You asked: How much is inv-7?", "0 ['user', 'assistant', 'tool']", "You asked: In GBP? [1]"]),
    ("InMemorySpanExporter", ["['chat scripted', 'durable_agent.step', 'invoke_agent greeter']"]),
]
MARKER = re.compile(r"<!-- readme-test: skip, (.+?) -->\n$")


@dataclass(frozen=True)
class Snippet:
    line: int  # of the opening fence in README.md
    code: str
    skip: str | None  # the reason in its readme-test marker

    @property
    def title(self) -> str:
        return self.code.splitlines()[0]

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.title})"

    @property
    def filename(self) -> str:
        named = re.match(r"# (\w+\.py) ", self.title)
        return named.group(1) if named else "snippet.py"

    def needs(self) -> list[str]:
        """The packages it imports, directly or through an integration, that are not the standard library."""
        found: set[str] = set()
        for node in ast.walk(ast.parse(self.code)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            for name in names:
                top = name.split(".")[0]
                if top == "durable_agent":
                    found.update(need for module, need in INTEGRATIONS.items() if name.startswith(module))
                elif top not in sys.stdlib_module_names:
                    found.add(name)
        return sorted(found)


def snippets() -> list[Snippet]:
    text = README.read_text(encoding="utf-8")
    found = []
    for match in re.finditer(r"```python\n(.*?)```", text, re.S):
        before = text[: match.start()]
        marker = MARKER.search(before[before.rfind("\n", 0, len(before) - 1) + 1:])
        found.append(Snippet(before.count("\n") + 1, match.group(1), marker.group(1) if marker else None))
    return found


def the_snippet(title_prefix: str) -> Snippet:
    found = [s for s in snippets() if s.title.startswith(title_prefix)]
    assert len(found) == 1, f"README.md should have one python block whose first line starts {title_prefix!r}: {found}"
    return found[0]


def require(snippet: Snippet) -> None:
    for module in snippet.needs():
        pytest.importorskip(module, reason=f"{snippet} needs {module} (scripts/requirements-dev.txt)")


def workdir(tmp_path: Path, *blocks: Snippet) -> Path:
    """`tmp_path` with the blocks saved in it and `examples/` beside them (the MCP block runs a server from there)."""
    if (ROOT / "examples").is_dir():
        (tmp_path / "examples").symlink_to(ROOT / "examples")
    for block in blocks:
        (tmp_path / block.filename).write_text(block.code, encoding="utf-8")
    return tmp_path


def environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "python"), **ENV, **extra}


def documented_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's environment as `environment()`, for the server processes a helper starts with it."""
    for name, value in environment().items():
        monkeypatch.setenv(name, value)


def run(snippet: Snippet, cwd: Path, **extra_env: str) -> str:
    """Run the saved block as ``python <file>``; what it printed, or a failure naming it."""
    done = subprocess.run([sys.executable, snippet.filename], cwd=cwd, env=environment(**extra_env),
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"{snippet} exited {done.returncode}:\n{done.stderr[-3000:]}", pytrace=False)
    return done.stdout


def assert_prints(snippet: Snippet, printed: str) -> None:
    for needle, lines in PRINTED:
        if needle in snippet.code:
            missing = [line for line in lines if line not in printed]
            assert not missing, f"{snippet} did not print {missing}; it printed:\n{printed}"


def test_the_readme_has_its_snippets_and_every_check_finds_its_block() -> None:
    found = snippets()
    assert len(found) >= 10, [str(s) for s in found]
    for needle, _ in PRINTED:
        assert sum(needle in s.code for s in found) == 1, f"{needle!r} should be in exactly one README block"


def test_only_the_known_blocks_are_marked_not_runnable_alone() -> None:
    skipped = {s.title: s.skip for s in snippets() if s.skip}
    assert set(skipped) == RUN_ELSEWHERE, skipped
    assert all("test_the_restate_service_and_client" in reason for reason in skipped.values()), skipped


@pytest.mark.parametrize("snippet", [s for s in snippets() if not s.skip], ids=lambda s: f"line{s.line}")
def test_the_block_runs_as_written(snippet: Snippet, tmp_path: Path) -> None:
    require(snippet)
    assert_prints(snippet, run(snippet, workdir(tmp_path, snippet)))


def test_the_endpoint_block_serves_a_chat_under_uvicorn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's `uvicorn app:app` with the README's app.py: a request the auth hook refuses, then a run."""
    pytest.importorskip("uvicorn", reason="serving app.py needs uvicorn (scripts/requirements-dev.txt)")
    from http_kit import Server

    app = the_snippet("# app.py")
    cwd = workdir(tmp_path, app)
    documented_environment(monkeypatch)
    server = Server(cwd / "agent.db", cwd / "ledger.jsonl", app="app:app", app_dir=cwd, factory=False).start()
    try:
        start = {"session_id": "s1", "prompt": "Hi"}
        status, _, body = server.request("POST", "/runs", start)
        assert status == 403, f"{app}: an anonymous POST /runs answered {status} {body}, not 403 (the auth hook)"
        status, _, body = server.request("POST", "/runs", start, {"authorization": "Bearer let-me-in"})
        assert status == 201, f"{app}: POST /runs answered {status} {body}"
        frames = list(server.events(f"/runs/{body['run_id']}/events", {"authorization": "Bearer let-me-in"}).frames())
        assert [f.data["text"] for f in frames if f.data["type"] == "text-delta"] == ["Hello!"]
        assert frames[-1].data["type"] == "finish"
    finally:
        server.stop()


def test_the_restate_service_and_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """service.py serving next to the real restate-server, registered as the README's curl line does; client.py
    parks a run on its approval, approves it, and prints the outcome."""
    from durable_agent.testing.restate import ServiceProcess, restate_urls

    service, client = the_snippet("# service.py"), the_snippet("# client.py")
    require(service)
    ingress, admin = restate_urls()
    cwd = workdir(tmp_path, service, client)
    documented_environment(monkeypatch)
    process = ServiceProcess(admin, cwd, cwd / service.filename)
    process.port = int(re.findall(r"port=(\d+)", service.code)[-1])  # the README's port, not a free one
    process.start()  # and registers it
    try:
        printed = run(client, cwd, RESTATE_INGRESS_URL=ingress)
    finally:
        process.stop()
    assert printed.splitlines() == ["stop -> Invoice inv-7 is paid."], f"{client} printed:\n{printed}"
