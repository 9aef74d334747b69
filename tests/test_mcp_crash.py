"""A worker whose agent's tools are an MCP server is SIGKILLed mid-call, before and after the server's side
effect, and another process resumes the run: each unsafe effect at most once (the server's own ledger says),
the read-only tool runs again, the run completes, and no server process outlives its client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from durable_agent import TOOL_INTERRUPTED_MESSAGE
from mcp_kit import effects, http_server, processes_naming, wait_until
from torture_worker import journal_spec

pytestmark = [
    pytest.mark.host_only("SIGKILLs worker processes that run MCP servers"),
    pytest.mark.kernel_independent,  # its subject: SIGKILLs mid MCP call (the rule: pyproject.toml)
]

WORKER = str(Path(__file__).resolve().parent / "mcp_crash_worker.py")
PAUSE = "1.5"


def worker(mode: str, runtime: str, ledger: Path, where: str, scenario: str = "bank") -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, WORKER, mode, runtime, str(ledger), where, scenario], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "MCP_TEST_PAUSE": PAUSE if mode == "start" else "0"})


def kill_when(process: subprocess.Popen[str], ledger: Path, event: str) -> None:
    assert wait_until(lambda: effects(ledger, event) or process.poll() is not None, 120)
    assert process.poll() is None, f"the worker ended before the server logged {event!r}"
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(30) == -signal.SIGKILL


def resumed(runtime: str, ledger: Path, where: str, scenario: str = "bank") -> dict[str, Any]:
    process = worker("resume", runtime, ledger, where, scenario)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    outcome: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return outcome


@contextmanager
def served(where: str, ledger: Path) -> Iterator[str]:
    if where == "stdio":
        yield "stdio"
    else:
        with http_server(ledger, MCP_TEST_PAUSE=PAUSE) as url:
            yield url


@pytest.mark.parametrize("kind, where", [("sqlite", "stdio"), ("sqlite", "http"), ("postgres", "stdio")])
@pytest.mark.parametrize("kill_at", ["charge-start", "charge"])  # before the effect / after it, before the answer
def test_sigkill_mid_mcp_call_then_resume_in_another_process(tmp_path: Path, kind: str, where: str,
                                                              kill_at: str) -> None:
    with journal_spec(kind, tmp_path, "mcp") as runtime:
        killed_then_resumed(runtime, tmp_path / "ledger.jsonl", where, kill_at)


def killed_then_resumed(runtime: str, ledger: Path, where: str, kill_at: str) -> None:
    with served(where, ledger) as url:
        kill_when(worker("start", runtime, ledger, url), ledger, kill_at)
        if where == "stdio":  # the killed worker's server sees its stdin close and exits: nothing leaks
            assert wait_until(lambda: processes_naming(str(ledger)) == [], 30), processes_naming(str(ledger))
        outcome = resumed(runtime, ledger, url)
    assert outcome["finish_reason"] == "stop" and outcome["text"] == "Done."
    charge, read = outcome["results"]["charge-1"], outcome["results"]["read-1"]
    assert charge == {"output": TOOL_INTERRUPTED_MESSAGE, "is_error": True}  # reported to the model, not re-run
    assert read == {"output": {"result": "a: 100"}, "is_error": False}
    assert len(effects(ledger, "read")) == 2  # the read-only tool ran again
    charges = len(effects(ledger, "charge"))
    assert charges <= 1  # the unsafe effect at most once (an HTTP server may finish a call its client died in)
    if kill_at == "charge":
        assert charges == 1
    assert processes_naming(str(ledger)) == [] or where == "http"


def test_a_listing_changed_mid_run_is_what_a_run_resumed_in_another_process_offers(tmp_path: Path) -> None:
    """The server adds `extra` and announces it; the next step offers it; the worker is SIGKILLed in the charge
    after that; the resuming process's server (a new one) lacks `extra`, yet the run offers the recorded
    listing, with `extra`, and its call is an error result, not a crash."""
    ledger = tmp_path / "ledger.jsonl"
    with journal_spec("sqlite", tmp_path, "mcp") as runtime:
        start = worker("start", runtime, ledger, "stdio", "grow")
        kill_when(start, ledger, "charge-start")
        assert wait_until(lambda: processes_naming(str(ledger)) == [], 30), processes_naming(str(ledger))
        outcome = resumed(runtime, ledger, "stdio", "grow")
    assert outcome["finish_reason"] == "stop" and outcome["text"] == "Done."
    assert outcome["offered_extra"] == [True, True]  # the resumed steps offer what the model saw before the kill
    results = outcome["results"]
    assert results["grow-1"]["output"] == {"result": "grown"}
    assert results["charge-1"] == {"output": TOOL_INTERRUPTED_MESSAGE, "is_error": True}
    assert results["extra-1"]["is_error"] and "no longer offers the tool 'extra'" in results["extra-1"]["output"]
    assert len(effects(ledger, "grow")) == 1 and effects(ledger, "charge") == [] and effects(ledger, "extra") == []
