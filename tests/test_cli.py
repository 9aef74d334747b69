"""The ``durable-agent`` CLI as a subprocess against real SQLite and Postgres stores (and the SQLite runtime).

Postgres cases run under `scripts/services run -- ...` (skipped without a server, failed under CI).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cli_agent
from cli_kit import ROOT, cli, cli_on_terminal
from durable_agent import generate_text, open_store
from helpers import maybe_await

pytestmark = [
    pytest.mark.host_only("runs the CLI in subprocesses"),
    pytest.mark.kernel_independent,  # its subject: the CLI: arguments, output, exit codes (the rule: pyproject.toml)
]


def one_line_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("durable-agent: error: "), done.stderr
    return done.stderr


def created(url: str) -> str:
    """`url`, its empty store created (the CLI creates none but with ``import``)."""
    store = open_store(url)
    asyncio.run(maybe_await(store.close()))
    return url


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield created(f"sqlite:///{tmp_path}/runs.db")
        return
    from durable_agent.testing.services import postgres_schema

    with postgres_schema("cli") as info:
        yield schema_url(info)


def schema_url(conninfo: str) -> str:
    """The URL of the Postgres schema `postgres_schema` gave as `conninfo`: the CLI takes a URL."""
    from durable_agent.testing.services import POSTGRES_URL_VAR, service_url

    schema = conninfo.rsplit("search_path=", 1)[1].strip("'\" ")
    base = service_url(POSTGRES_URL_VAR, "Postgres")
    return f"{base}{'&' if '?' in base else '?'}options=-c%20search_path%3D{schema}"


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.txt"
    path.touch()
    monkeypatch.setenv("CLI_LEDGER", str(path))
    return path


def suspended_run(url: str, run_id: str = "run-42") -> str:
    """Start a run that suspends on the pay approval; returns the approval id."""

    async def go() -> str:
        store = open_store(url)
        try:
            result = await generate_text(model=cli_agent.model(), tools=cli_agent.tools(), max_steps=5,
                                         messages=[{"role": "user", "content": "Pay inv-7."}],
                                         store=store, run_id=run_id)
        finally:
            await maybe_await(store.close())
        assert result.finish_reason == "suspended"
        return result.pending_approvals[0].approval_id

    return asyncio.run(go())


def stored(url: str, run_id: str) -> Any:
    async def go() -> Any:
        store = open_store(url)
        try:
            return await maybe_await(store.load(run_id))
        finally:
            await maybe_await(store.close())

    return asyncio.run(go())


def test_the_console_script_is_declared() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"durable-agent": "durable_agent.cli:main"}


def test_list_show_and_exit_codes(store_url: str) -> None:
    empty = cli("--store", store_url, "runs", "list", "--json")
    assert empty.returncode == 0 and json.loads(empty.stdout) == []
    approval = suspended_run(store_url)

    listed = cli("runs", "list", "--store", store_url)
    assert listed.returncode == 0
    header, row = listed.stdout.splitlines()
    assert header.split() == ["RUN", "STATUS", "STEP", "MESSAGES", "TOKENS", "SAVED"]
    assert row.split()[:4] == ["run-42", "suspended", "1", "4"]
    assert json.loads(cli("--store", store_url, "--json", "runs", "list", "--status", "completed").stdout) == []

    shown = cli("--store", store_url, "runs", "show", "run-42")
    assert shown.returncode == 0
    assert "Pay inv-7." in shown.stdout and "-> pay" in shown.stdout and approval in shown.stdout
    assert "Pending approvals" in shown.stdout
    data = json.loads(cli("--store", store_url, "--json", "runs", "show", "run-42").stdout)["checkpoint"]
    assert data["pending_approvals"][0]["approval_id"] == approval
    assert data["messages"][2]["content"][0]["output"]["scan"] == {"$bytes": "AP9QREY="}  # bytes, tagged
    at0 = json.loads(cli("--store", store_url, "--json", "runs", "show", "run-42", "--step", "0").stdout)
    assert at0["checkpoint"]["step_index"] == 0 and len(at0["checkpoint"]["messages"]) == 3

    assert "run 'nope'" in one_line_error(cli("--store", store_url, "runs", "show", "nope"), 3)
    one_line_error(cli("--store", store_url, "runs", "show", "run-42", "--step", "7"), 3)
    one_line_error(cli("--store", store_url, "runs", "approve", "run-42", "not-an-approval"), 3)


def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    url = created(f"sqlite:///{tmp_path}/runs.db")
    one_line_error(cli("runs", "list"), 2)  # no store
    one_line_error(cli("--store", url, "runs", "frobnicate"), 2)
    one_line_error(cli("--store", url, "runs", "list", "--limit", "many"), 2)
    one_line_error(cli("--store", "mysql://x", "runs", "list"), 2)
    one_line_error(cli("--store", url, "runs", "prune", "--before", "last tuesday"), 2)
    one_line_error(cli("--store", url, "runs", "resume", "r", "--agent", "no_such_module:f"), 2)
    one_line_error(cli("--store", url, "runs", "resume", "r", "--agent", "cli_agent:not_an_agent"), 2)
    assert cli("--help").returncode == 0 and cli("runs", "list", "--help").returncode == 0


def test_approve_resumes_with_the_agent_and_the_tool_runs_once(store_url: str, ledger: Path) -> None:
    approval = suspended_run(store_url)
    parked = stored(store_url, "run-42")
    waiting = cli("--store", store_url, "--json", "runs", "resume", "run-42", "--agent", "cli_agent:resume_options")
    assert waiting.returncode == 0, waiting.stderr
    out = json.loads(waiting.stdout)  # no verdict: a resume leaves the run parked instead of denying the payment
    assert out["finish_reason"] == "suspended" and [p["approval_id"] for p in out["pending_approvals"]] == [approval]
    assert stored(store_url, "run-42") == parked and ledger.read_text() == ""
    one_line_error(cli("--store", store_url, "runs", "approve", "run-42", approval), 2)  # no --agent
    done = cli("--store", store_url, "--json", "runs", "approve", "run-42", approval, "--agent", "cli_agent:resume_options")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["finish_reason"] == "stop" and out["text"] == "Invoice inv-7 is paid."
    assert ledger.read_text() == "paid inv-7\n"
    assert stored(store_url, "run-42").status == "completed"
    one_line_error(cli("--store", store_url, "runs", "approve", "run-42", approval, "--agent", "cli_agent:resume_options"), 3)
    assert ledger.read_text() == "paid inv-7\n"
    finished = stored(store_url, "run-42")
    again = cli("--store", store_url, "--json", "runs", "resume", "run-42", "--agent", "cli_agent:resume_options")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"run_id": "run-42", "resumed": False}  # as for an Agent's finished run
    assert stored(store_url, "run-42") == finished  # no model call, no new turn


def test_deny_gives_the_model_the_reason(store_url: str, ledger: Path) -> None:
    approval = suspended_run(store_url)
    done = cli("--store", store_url, "runs", "deny", "run-42", approval, "--reason", "over budget",
               "--agent", "cli_agent:resume_options")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("run run-42: stop")
    results = [p for m in stored(store_url, "run-42").messages if m["role"] == "tool" for p in m["content"]]
    assert results[-1]["is_error"] and results[-1]["output"] == "over budget"
    assert ledger.read_text() == ""


def test_fork_then_resume_the_fork(store_url: str, ledger: Path) -> None:
    suspended_run(store_url)
    forked = cli("--store", store_url, "--json", "runs", "fork", "run-42", "--at", "0", "--to", "run-43")
    assert forked.returncode == 0, forked.stderr
    assert json.loads(forked.stdout)["step_index"] == 0
    one_line_error(cli("--store", store_url, "runs", "fork", "run-42", "--to", "run-43"), 4)
    one_line_error(cli("--store", store_url, "runs", "fork", "run-42", "--at", "9", "--to", "run-44"), 3)
    resumed = cli("--store", store_url, "--json", "runs", "resume", "run-43", "--agent", "cli_agent:resume_options")
    out = json.loads(resumed.stdout)
    assert out["finish_reason"] == "suspended" and out["pending_approvals"][0]["tool_name"] == "pay"
    assert stored(store_url, "run-43").step_index == 1
    assert stored(store_url, "run-42").status == "suspended"


def test_export_import_keeps_bytes_and_refuses_overwrites(store_url: str, tmp_path: Path) -> None:
    suspended_run(store_url, "a")
    suspended_run(store_url, "b")
    exported = cli("--store", store_url, "runs", "export")
    assert exported.returncode == 0 and len(exported.stdout.splitlines()) == 2
    target = f"sqlite:///{tmp_path}/copy.db"
    imported = cli("--store", target, "runs", "import", stdin=exported.stdout)
    assert imported.returncode == 0, imported.stderr
    assert stored(target, "a") == stored(store_url, "a") and stored(target, "b") == stored(store_url, "b")
    one_line_error(cli("--store", target, "runs", "import", stdin=exported.stdout), 4)
    assert cli("--store", target, "runs", "import", "--overwrite", stdin=exported.stdout).returncode == 0
    (tmp_path / "bad.jsonl").write_text(exported.stdout + "{not json\n")
    one_line_error(cli("--store", target, "runs", "import", str(tmp_path / "bad.jsonl"), "--overwrite"), 1)
    file = tmp_path / "a.jsonl"
    assert cli("--store", store_url, "runs", "export", "a", "-o", str(file)).returncode == 0
    assert file.read_text().splitlines() == exported.stdout.splitlines()[:1]


@pytest.mark.parametrize("opened", ["--store", "--runtime"])
def test_export_and_import_refuse_the_database_the_cli_has_open(tmp_path: Path, opened: str) -> None:
    """Writing an export over the database would destroy it; reading it as an import's input, in the process that
    holds SQLite connections to it, would drop their locks (`durable_agent.backends._files`)."""
    url = f"sqlite:///{tmp_path}/runs.db"
    suspended_run(url, "a")
    before = stored(url, "a")
    for args in (("export", "-o", str(tmp_path / "runs.db")), ("import", str(tmp_path / "." / "runs.db"))):
        error = one_line_error(cli(opened, url, "runs", *args), 2)
        assert "runs.db" in error and "the database" in error
    assert stored(url, "a") == before


def test_prune_keeps_suspended_runs_unless_asked(store_url: str) -> None:
    suspended_run(store_url)
    kept = json.loads(cli("--store", store_url, "--json", "runs", "prune", "--before", "2999-01-01").stdout)
    assert kept["deleted"] == []
    assert cli("--store", store_url, "runs", "prune", "--before", "1d", "--include-suspended").stdout.startswith(
        "deleted 0 run(s)")
    gone = cli("--store", store_url, "--json", "runs", "prune", "--before", "2999-01-01T00:00:00Z", "--include-suspended")
    assert json.loads(gone.stdout)["deleted"] == ["run-42"]


def event_log_runs(url: str, register: tuple[str, ...] = ()) -> list[str]:
    """Register `register` (one event each) in the endpoint event log at `url`; the ids of those the log holds.

    The log is opened the way the endpoint opens it: a SQLite file (`url` is ``sqlite:////abs/path``) or Postgres.
    """
    from durable_agent.http import PostgresEventLog, SqliteEventLog

    async def go() -> list[str]:
        log: SqliteEventLog | PostgresEventLog = SqliteEventLog(url.removeprefix("sqlite:///")) if url.startswith("sqlite:") \
            else PostgresEventLog(url)
        try:
            for run_id in register:
                await log.create_run(run_id, "s", {})
                await log.append(run_id, [("finish/0", {"type": "finish", "finish_reason": "stop"})])
            return [r for r in ("run-42", "other") if await log.run_info(r) is not None]
        finally:
            await maybe_await(log.close())

    return asyncio.run(go())


def test_prune_drops_the_runs_events_from_the_endpoint_log(store_url: str, tmp_path: Path) -> None:
    suspended_run(store_url)
    assert event_log_runs(store_url, ("run-42", "other")) == ["run-42", "other"]  # the log on the store's database
    gone = json.loads(cli("--store", store_url, "--json", "runs", "prune", "--before", "2999-01-01",
                          "--include-suspended").stdout)
    assert (gone["deleted"], gone["events_deleted"]) == (["run-42"], ["run-42"])
    assert event_log_runs(store_url) == ["other"]  # a run the store did not prune keeps its events
    elsewhere = f"sqlite:///{tmp_path}/events.db"
    suspended_run(store_url)
    event_log_runs(elsewhere, ("run-42",))
    done = cli("--store", store_url, "runs", "prune", "--before", "2999-01-01", "--include-suspended",
               "--events", elsewhere)
    assert done.stdout.startswith("deleted 1 run(s)") and ", and the endpoint events of 1" in done.stdout
    assert event_log_runs(elsewhere) == []
    one_line_error(cli("--store", store_url, "runs", "prune", "--before", "1d", "--events", "redis://x"), 2)


def test_watch_follows_a_live_run_to_its_end(tmp_path: Path, ledger: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    approval = suspended_run(url)
    stopped = cli("--store", url, "runs", "watch", "run-42", "--interval", "0.05")
    assert stopped.returncode == 0 and "-- step 1: suspended" in stopped.stdout
    one_line_error(cli("--store", url, "runs", "watch", "run-42", "--follow", "--interval", "0.05", "--timeout", "0.2"), 6)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests")])}
    watcher = subprocess.Popen(
        [sys.executable, "-m", "durable_agent.cli", "--store", url, "--json", "runs", "watch", "run-42", "--follow",
         "--interval", "0.05", "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    assert watcher.stdout is not None
    first = json.loads(watcher.stdout.readline())
    assert first["type"] == "message" and first["index"] == 0  # the watcher is polling
    approved = cli("--store", url, "runs", "approve", "run-42", approval, "--agent", "cli_agent:resume_options")
    assert approved.returncode == 0, approved.stderr
    out = watcher.stdout.read()  # not communicate(): it would skip the lines readline() buffered
    assert watcher.wait(timeout=60) == 0, watcher.stderr.read() if watcher.stderr else ""
    events = [first, *map(json.loads, out.splitlines())]
    assert [e["index"] for e in events if e["type"] == "message"] == list(range(6))
    assert events[-1]["type"] == "status" and events[-1]["status"] == "completed"
    assert "no checkpoint" in one_line_error(cli("--store", url, "runs", "watch", "nope", "--timeout", "0.2"), 6)


def test_watch_started_before_the_first_checkpoint_waits_for_it(tmp_path: Path) -> None:
    url = created(f"sqlite:///{tmp_path}/runs.db")
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests")])}
    watcher = subprocess.Popen(
        [sys.executable, "-m", "durable_agent.cli", "--store", url, "--json", "runs", "watch", "run-42",
         "--interval", "0.05", "--timeout", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    assert watcher.stdout is not None
    assert json.loads(watcher.stdout.readline()) == {"type": "waiting", "run_id": "run-42"}  # polling: no run yet
    suspended_run(url)
    out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert events[-1]["type"] == "status" and events[-1]["status"] == "suspended"


def journal_run(tmp_path: Path) -> tuple[str, str, str, dict[str, str]]:
    """An Agent's run parked on the pay approval in a SQLite journal: run id, approval id, runtime URL, CLI env."""
    journal = tmp_path / "journal.db"
    env = {"CLI_JOURNAL": str(journal)}
    os.environ["CLI_JOURNAL"] = str(journal)
    try:
        result = asyncio.run(cli_agent.journal_agent().run("Pay inv-7."))
    finally:
        del os.environ["CLI_JOURNAL"]
    assert result.finish_reason == "suspended" and result.run_id is not None
    return result.run_id, result.pending_approvals[0].approval_id, f"sqlite:///{journal}", env


def test_an_agents_run_on_the_sqlite_runtime(tmp_path: Path, ledger: Path) -> None:
    run_id, approval, runtime, env = journal_run(tmp_path)

    shown = cli("--runtime", runtime, "runs", "show", run_id, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "Journal steps" in shown.stdout and f"{run_id}:1:model:0" in shown.stdout
    journal_steps = json.loads(cli("--runtime", runtime, "--json", "runs", "show", run_id, env=env).stdout)["journal"]
    assert {s["kind"] for s in journal_steps} == {"model", "tool"}

    parked = cli("--runtime", runtime, "--json", "runs", "resume", run_id, "--agent", "cli_agent:journal_agent", env=env)
    assert parked.returncode == 0, parked.stderr
    out = json.loads(parked.stdout)  # no verdict yet: the resume leaves the run parked, it denies nothing
    assert out["finish_reason"] == "suspended" and [p["approval_id"] for p in out["pending_approvals"]] == [approval]
    assert ledger.read_text() == "" and stored(runtime, run_id).status == "suspended"
    approved = cli("--runtime", runtime, "runs", "approve", run_id, approval, env=env)
    assert approved.returncode == 0, approved.stderr
    assert ledger.read_text() == ""  # resolved, not resumed yet
    resumed = cli("--runtime", runtime, "--json", "runs", "resume", run_id, "--agent", "cli_agent:journal_agent", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["finish_reason"] == "stop"
    assert ledger.read_text() == "paid inv-7\n"
    again = cli("--runtime", runtime, "--json", "runs", "resume", run_id, "--agent", "cli_agent:journal_agent", env=env)
    assert json.loads(again.stdout) == {"run_id": run_id, "resumed": False}


def test_an_agents_run_on_the_postgres_runtime(ledger: Path) -> None:
    from durable_agent import Agent, DurableOptions
    from durable_agent.backends.postgres import PostgresRuntime
    from durable_agent.testing.services import postgres_schema

    with postgres_schema("clirt") as info:
        url = schema_url(info)

        async def start() -> Any:
            runtime = PostgresRuntime(url)
            try:
                agent = Agent(model=cli_agent.model(), tools=cli_agent.tools(), durable=DurableOptions(runtime),
                              session_id="chat-pg", max_steps=5)
                return await agent.run("Pay inv-7.")
            finally:
                await runtime.close()

        result = asyncio.run(start())
        assert result.finish_reason == "suspended" and result.run_id is not None
        shown = json.loads(cli("--runtime", url, "--json", "runs", "show", result.run_id).stdout)
        assert shown["checkpoint"]["status"] == "suspended" and {s["kind"] for s in shown["journal"]} == {"model", "tool"}
        approval = result.pending_approvals[0].approval_id
        assert cli("--runtime", url, "runs", "approve", result.run_id, approval).returncode == 0
        one_line_error(cli("--runtime", url, "runs", "approve", result.run_id, "other"), 3)
        listed = json.loads(cli("--runtime", url, "--json", "runs", "list").stdout)
        assert [r["run_id"] for r in listed] == [result.run_id]


def test_version_prints_the_package_version() -> None:
    import durable_agent

    done = cli("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"durable-agent {durable_agent.__version__}\n", "")



def test_a_runtime_verdict_without_agent_says_denied(tmp_path: Path, ledger: Path) -> None:
    run_id, approval, runtime, env = journal_run(tmp_path)
    denied = cli("--runtime", runtime, "runs", "deny", run_id, approval, env=env)
    assert denied.returncode == 0, denied.stderr
    assert denied.stdout.startswith(f"denied {approval};"), denied.stdout



def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """``runs show ... | head``: the reader closes the pipe; the command stops without a traceback, as Unix tools do."""
    url = f"sqlite:///{tmp_path}/runs.db"

    async def big() -> None:
        store = open_store(url)
        try:  # ~1 MB of transcript: far more than a pipe holds
            await generate_text(model=cli_agent.model(), tools=cli_agent.tools(), max_steps=1, store=store,
                                run_id="big", messages=[{"role": "user", "content": "word " * 1000}] * 200)
        finally:
            await maybe_await(store.close())

    asyncio.run(big())
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests")])}
    shown = subprocess.Popen([sys.executable, "-m", "durable_agent.cli", "--store", url, "runs", "show", "big", "--full"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ)
    assert shown.stdout is not None and shown.stderr is not None
    assert shown.stdout.readline().split() == [b"FIELD", b"VALUE"]
    shown.stdout.close()
    assert shown.wait(timeout=60) == 141
    assert shown.stderr.read() == b""



def test_importing_a_file_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    binary = tmp_path / "scan.jsonl"
    binary.write_bytes(b'{"version": 1}\n\x00\xff\xd0PDF\n')
    error = one_line_error(cli("--store", url, "runs", "import", str(binary)), 1)
    assert "line 2" in error and "not UTF-8" in error and "UnicodeDecodeError" not in error
    piped = subprocess.run([sys.executable, "-m", "durable_agent.cli", "--store", url, "runs", "import"],
                           input=binary.read_bytes(), capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert piped.returncode == 1 and b"line 2" in piped.stderr and b"Traceback" not in piped.stderr


def test_a_mistyped_database_path_is_not_found_and_not_created(tmp_path: Path) -> None:
    """Only `import` creates its store; any other command on a missing file exits 3 and leaves no file behind."""
    missing = tmp_path / "typo.db"
    for args in (("--store", f"sqlite:///{missing}", "runs", "list"),
                 ("--store", f"sqlite+async:///{missing}", "runs", "show", "r"),
                 ("--store", f"jsonl:///{missing}", "runs", "list"),
                 ("--runtime", f"sqlite:///{missing}", "runs", "list")):
        error = one_line_error(cli(*args), 3)
        assert str(missing) in error, error
        assert not missing.exists()
    url = f"sqlite:///{tmp_path}/runs.db"
    suspended_run(url)
    one_line_error(cli("--store", url, "runs", "prune", "--before", "1d", "--events", f"sqlite:///{missing}"), 3)
    assert not missing.exists()
    relative = one_line_error(cli("--store", "sqlite:///typo.db", "runs", "list", cwd=tmp_path), 3)
    assert "relative" in relative and not missing.exists()
    exported = cli("--store", url, "runs", "export").stdout
    assert cli("--store", f"sqlite:///{missing}", "runs", "import", stdin=exported).returncode == 0  # import creates
    assert stored(f"sqlite:///{missing}", "run-42") == stored(url, "run-42")


@pytest.mark.parametrize("factory", ["misconfigured_options", "misconfigured_factory"])
def test_a_configuration_error_of_the_users_agent_is_an_error_not_usage(tmp_path: Path, factory: str) -> None:
    """Exit 2 says the command line is wrong; the agent's own code failing is exit 1, whatever it raised."""
    url = f"sqlite:///{tmp_path}/runs.db"
    suspended_run(url)
    forked = cli("--store", url, "runs", "fork", "run-42", "--at", "0", "--to", "run-43")
    assert forked.returncode == 0, forked.stderr
    error = one_line_error(cli("--store", url, "runs", "resume", "run-43", "--agent", f"cli_agent:{factory}"), 1)
    assert "PROVIDER_API_KEY" in error and f"cli_agent:{factory}" in error


def test_agent_modules_are_found_in_the_current_directory_as_by_the_console_script(tmp_path: Path) -> None:
    """The installed script puts its own directory on sys.path, not the current one (``python -m`` does): the
    CLI looks for the ``--agent`` module in the current directory, as uvicorn looks for its app."""
    url = f"sqlite:///{tmp_path}/runs.db"
    suspended_run(url)
    project = tmp_path / "project"
    project.mkdir()
    (project / "myagents.py").write_text("import cli_agent\n\n\ndef opts():\n    return cli_agent.resume_options()\n")
    script = tmp_path / "bin" / "durable-agent"  # what pip writes for the console script, outside the project
    script.parent.mkdir()
    script.write_text("import sys\nfrom durable_agent.cli import main\nsys.exit(main())\n")
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(ROOT / "tests")])}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), "--store", url, "--json", *args], capture_output=True,
                              text=True, env=environ, cwd=project, timeout=120)

    resumed = run("runs", "resume", "run-42", "--agent", "myagents:opts")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["finish_reason"] == "suspended"
    error = one_line_error(run("runs", "resume", "run-42", "--agent", "myagent:opts"), 2)
    assert str(project) in error and "No module named 'myagent'" in error


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released): connecting is refused at once."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(("option", "url"), [
    ("--store", "postgresql://postgres@127.0.0.1:{port}/postgres"),
    ("--store", "postgresql+async://postgres@127.0.0.1:{port}/postgres"),
    ("--runtime", "postgresql://postgres@127.0.0.1:{port}/postgres"),
    ("--store", "redis://127.0.0.1:{port}/0"),
    ("--store", "redis+async://127.0.0.1:{port}/0"),
])
def test_a_server_that_does_not_answer_is_one_line_and_exit_7(option: str, url: str) -> None:
    """Not 60 s of pool retries and their logs, not a raw driver ConnectionError: one line, exit 7 (try again)."""
    pytest.importorskip("psycopg" if url.startswith("postgres") else "redis")
    url = url.format(port=closed_port())
    error = one_line_error(cli(option, url, "runs", "list"), 7)
    assert ("Postgres" if url.startswith("postgres") else "Redis") in error, error


def test_a_server_lost_mid_command_is_exit_7() -> None:
    """The drivers' connection failures after the CLI reached the server (it went away mid-command)."""
    from durable_agent.cli import exit_code

    psycopg = pytest.importorskip("psycopg")
    redis = pytest.importorskip("redis")
    assert exit_code(redis.exceptions.ConnectionError("Connection closed by server.")) == 7
    assert exit_code(redis.exceptions.TimeoutError("Timeout reading from socket")) == 7
    assert exit_code(psycopg.OperationalError("server closed the connection unexpectedly")) == 7
    assert exit_code(redis.exceptions.ResponseError("WRONGTYPE")) == 1


def test_a_fork_of_an_agents_run_is_approved_by_resuming_it_never_through_its_originals_awakeable(
        tmp_path: Path, ledger: Path) -> None:
    """A fork made in the store (without --runtime) copies the checkpoint, not the journal, and its pending approvals
    get fresh ids: the original's id is not pending on it, and approving the fork must never resolve the original's
    awakeable (that approved the original run); the fork has no awakeable, so its verdict goes with a resume
    (--agent)."""
    from durable_agent.backends.sqlite import SqliteRuntime

    run_id, original, runtime, env = journal_run(tmp_path)
    forked = cli("--store", runtime, "--json", "runs", "fork", run_id, "--to", "fork-1", env=env)
    assert forked.returncode == 0, forked.stderr
    (approval,) = json.loads(forked.stdout)["pending_approvals"]
    assert approval != original
    error = one_line_error(cli("--runtime", runtime, "runs", "approve", "fork-1", original, env=env), 3)
    assert approval in error and "not pending" in error
    error = one_line_error(cli("--runtime", runtime, "runs", "approve", "fork-1", approval, env=env), 2)
    assert "--agent" in error and "fork" in error

    def original_resolved() -> bool:
        async def go() -> bool:
            journal = SqliteRuntime(env["CLI_JOURNAL"])
            try:
                return any(a.resolved for a in await journal.inspect.awakeables())
            finally:
                journal.close()

        return asyncio.run(go())

    assert not original_resolved()
    done = cli("--runtime", runtime, "--json", "runs", "approve", "fork-1", approval, "--agent",
               "cli_agent:journal_agent", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["finish_reason"] == "stop" and ledger.read_text() == "paid inv-7\n"
    assert not original_resolved() and stored(runtime, run_id).status == "suspended"


def test_a_fork_made_on_the_runtime_is_approved_and_denied_with_the_runtime_alone(tmp_path: Path, ledger: Path) -> None:
    """`runs fork --runtime` parks the fork on awakeables of its own, in its original's session: `runs approve`
    (or `deny`) with `--runtime` alone stores the verdict there, never on the original's, and any resume of that
    session (`runs resume --agent`, which is `Agent.resume`) settles it."""
    from durable_agent import step_key
    from durable_agent.backends.sqlite import SqliteRuntime

    def approval_key(run: str, step_index: int, approval_id: str) -> str:  # the stored key a run parks on
        return step_key(run, step_index, f"approval/{approval_id}")

    run_id, original, runtime, env = journal_run(tmp_path)
    agent = ("--agent", "cli_agent:journal_agent")

    def awakeables() -> dict[tuple[str, str], tuple[str, bool, Any]]:
        async def go() -> dict[tuple[str, str], tuple[str, bool, Any]]:
            journal = SqliteRuntime(env["CLI_JOURNAL"])
            try:
                return {(a.session_id, a.key): (a.id, a.resolved, a.value) for a in await journal.inspect.awakeables()}
            finally:
                journal.close()

        return asyncio.run(go())

    parked = stored(runtime, run_id)
    forks = {}
    for fork in ("fork-1", "fork-2"):
        made = cli("--runtime", runtime, "--json", "runs", "fork", run_id, "--to", fork, env=env)
        assert made.returncode == 0, made.stderr
        (forks[fork],) = json.loads(made.stdout)["pending_approvals"]
    step = parked.step_index
    assert awakeables() == {("chat-1", approval_key(run_id, step, original)): (original, False, None),
                            **{("chat-1", approval_key(f, step, a)): (a, False, None) for f, a in forks.items()}}

    approved = cli("--runtime", runtime, "runs", "approve", "fork-1", forks["fork-1"], env=env)
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.startswith(f"approved {forks['fork-1']};"), approved.stdout
    denied = cli("--runtime", runtime, "runs", "deny", "fork-2", forks["fork-2"], "--reason", "not this one", env=env)
    assert denied.returncode == 0, denied.stderr
    now = awakeables()
    assert now[("chat-1", approval_key(run_id, step, original))] == (original, False, None)  # the original's: untouched
    assert now[("chat-1", approval_key("fork-1", step, forks["fork-1"]))][1:] == (
        True, {"approved": True, "reason": None, "token": None})
    assert now[("chat-1", approval_key("fork-2", step, forks["fork-2"]))][1:] == (
        True, {"approved": False, "reason": "not this one", "token": None})
    assert ledger.read_text() == ""  # stored, not resumed yet

    done = cli("--runtime", runtime, "--json", "runs", "resume", "fork-1", *agent, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["finish_reason"] == "stop" and ledger.read_text() == "paid inv-7\n"
    done = cli("--runtime", runtime, "--json", "runs", "resume", "fork-2", *agent, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["finish_reason"] == "stop" and ledger.read_text() == "paid inv-7\n"  # denied
    denial = stored(runtime, "fork-2").messages[len(parked.messages)]["content"][0]  # the verdict settled
    assert denial["tool_call_id"] == parked.pending_approvals[0].tool_call_id and "not this one" in str(denial)
    assert stored(runtime, run_id) == parked  # the original still waits on its own approval
    assert awakeables()[("chat-1", approval_key(run_id, step, original))] == (original, False, None)


def test_colour_on_a_terminal_only_and_never_with_no_color(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    suspended_run(url)
    code, shown = cli_on_terminal("--store", url, "runs", "list")
    assert code == 0 and "\x1b[1mRUN" in shown and "\x1b[33msuspended\x1b[0m" in shown  # bold header, status
    code, error = cli_on_terminal("--store", url, "runs", "show", "nope")
    assert code == 3 and error.startswith("\x1b[31mdurable-agent: error:\x1b[0m ")
    for env in ({"NO_COLOR": "1"}, {"TERM": "dumb"}):
        code, plain = cli_on_terminal("--store", url, "runs", "list", env=env)
        assert code == 0 and "\x1b" not in plain and "suspended" in plain
    piped = cli("--store", url, "runs", "list")
    assert "\x1b" not in piped.stdout and "suspended" in piped.stdout


def test_a_long_resume_shows_progress_on_a_terminal_only(tmp_path: Path, ledger: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    suspended_run(url)
    for to in ("run-43", "run-44"):  # forks before the model's first call: a resume calls it
        assert cli("--store", url, "runs", "fork", "run-42", "--at", "0", "--to", to).returncode == 0
    code, out = cli_on_terminal("--store", url, "runs", "resume", "run-43", "--agent", "cli_agent:slow_resume_options",
                                env={"NO_COLOR": "1"})
    assert code == 0, out
    spinner = out.index("resuming run-43")
    assert out.index("\r\x1b[K", spinner) < out.index("run run-43: suspended")  # erased before the result
    piped = cli("--store", url, "runs", "resume", "run-44", "--agent", "cli_agent:slow_resume_options")
    assert piped.returncode == 0 and piped.stderr == "" and "\x1b" not in piped.stdout
    assert piped.stdout.startswith("run run-44: suspended")
