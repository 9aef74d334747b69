"""``durable-agent``: look at, approve, resume, fork, move and prune stored runs from a shell.

    durable-agent --store sqlite:///runs.db runs list --status suspended
    durable-agent --store sqlite:///runs.db runs show run-42
    durable-agent --store sqlite:///runs.db runs approve run-42 APPROVAL_ID --agent myapp.agents:billing
    durable-agent --runtime postgresql://... runs approve run-42 APPROVAL_ID   # an Agent's run
    durable-agent --store sqlite:///runs.db runs fork run-42 --at 3 --to run-42b
    durable-agent --runtime postgresql://... runs fork run-42 --to run-42b   # approved with --runtime alone
    durable-agent --store sqlite:///a.db runs export > runs.jsonl
    durable-agent --store postgresql://... runs import runs.jsonl
    DURABLE_AGENT_KEYS="k2:...,k1:..." durable-agent --store sqlite:///runs.db runs rekey

`--store URL` takes every `open_store` URL; `--runtime URL` (``sqlite:///journal.db`` or
``postgresql://...``) is an `Agent`'s journal: it adds the journal steps to ``show``, sends
verdicts to the run's awakeables, forks an Agent's run into its session with awakeables of its own (so the fork
is approved with `--runtime` alone, as any parked run), and without `--store` the store is opened on the runtime's database (the
runtime keeps its checkpoints in the checkpoint store's tables).
``runs prune`` also drops the deleted runs' events from the chat endpoint's event log
(`durable_agent.http`): ``--events URL`` (``sqlite:///...`` or ``postgresql://...``), by default the
store's own database when it is SQLite or Postgres.
When ``DURABLE_AGENT_KEYS`` is set (and ``DURABLE_AGENT_PRIMARY_KEY``: `Keyring.from_env`), every command opens
the store, the runtime and the event log with that keyring, so it reads and writes an encrypted database as its
servers do; without it, a command that reads an encrypted row exits 2, saying to set ``DURABLE_AGENT_KEYS``.
``runs rekey`` takes its keyring from there and rewrites the store's rows (with ``--runtime`` the runtime's
checkpoints and journal, then the event log's, found as by ``prune``) under the primary key,
batch by batch, beside live servers; it exits 1 when a row could not be opened (a key missing from the ring,
damage), naming the first ones, and 2 when the keys are not set or malformed.
The environment variables ``DURABLE_AGENT_STORE``, ``DURABLE_AGENT_RUNTIME`` and ``DURABLE_AGENT_EVENTS``
stand in for the options. Output is human-readable tables; `--json` prints JSON instead (one document, or one
line per event for ``watch``; bytes as ``{"$bytes": ...}``, the checkpoint codec's form). ``--version`` prints
the installed version.

Exit codes (stable, for scripts):

* 0 — done (``resume`` also returns 0 when the run suspended again: read ``finish_reason``)
* 1 — error: the store failed, a corrupt run, the agent's code raised (a ``ConfigurationError`` too)...
* 2 — usage: bad arguments or options, a bad URL, a missing ``--agent``, an encrypted database without
  ``DURABLE_AGENT_KEYS`` (or the keys malformed)
* 3 — not found: no such run, step, or pending approval; no database file at a ``sqlite:``/``jsonl:`` URL
  (only ``import`` creates one)
* 4 — conflict: the target run exists (``fork``, ``import``), another writer, a held lease
* 5 — unavailable: a driver is not installed (``pip install 'durable-agent[postgres]'``)
* 6 — timeout: ``watch --timeout`` elapsed before the run stopped
* 7 — unreachable: the Postgres or Redis server did not answer within 5 s (the CLI tries one connection before
  it opens a store), or it went away mid-command; try again later
* 130 — interrupted (Ctrl-C)
* 141 — the reader of stdout stopped reading (``runs show ... | head``); nothing is printed, as by Unix tools

Every error is one line on stderr, ``durable-agent: error: ...``; never a traceback. On a terminal (only) the
output has colour, unless ``NO_COLOR`` is set, and a long operation (``resume``, ``approve``/``deny --agent``,
``import``, ``prune``) shows a spinner on stderr (``rekey``: a progress line per batch): see `durable_agent.cli._render`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn

from .._checkpoint import RUN_STATUSES
from .._errors import (
    CheckpointConflictError,
    CheckpointNotFoundError,
    ConfigurationError,
    DecryptionError,
    DurableAgentError,
    FeatureUnavailableError,
    RunLeaseHeldError,
    StaleEpochError,
    StepNotFoundError,
)
from .._storage.sealing import NO_KEYRING
from .._version import __version__
from . import _commands as c
from ._backends import Backends, CliError, is_outage
from ._render import RED, paint

Command = Callable[[argparse.Namespace, Backends], Coroutine[Any, Any, int]]


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise CliError(c.USAGE, f"{message} (see {self.prog} --help)")


def _common(parser: argparse.ArgumentParser, default: Any) -> None:
    """--store, --runtime and --json, accepted before and after the command."""
    parser.add_argument("--store", metavar="URL", default=default, help="the checkpoint store (open_store URL)")
    parser.add_argument("--runtime", metavar="URL", default=default,
                        help="an Agent's journal runtime: sqlite:///path or postgresql://...")
    parser.add_argument("--json", action="store_true", default=default, help="print JSON instead of tables")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="durable-agent", description="Look at and operate durable-agent runs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _common(parser, None)
    groups = parser.add_subparsers(dest="group", required=True, parser_class=_Parser)
    runs = groups.add_parser("runs", help="stored runs").add_subparsers(dest="command", required=True,
                                                                         parser_class=_Parser)

    def command(name: str, handler: Command, help: str) -> argparse.ArgumentParser:
        sub = runs.add_parser(name, help=help, description=help)
        _common(sub, argparse.SUPPRESS)
        sub.set_defaults(handler=handler)
        return sub

    sub = command("list", c.runs_list, "list runs with their latest status, step and usage")
    sub.add_argument("--status", choices=RUN_STATUSES)
    sub.add_argument("--limit", type=int)
    sub.add_argument("--after", metavar="RUN", help="page: runs after this id")

    sub = command("show", c.runs_show, "a run's transcript, usage, pending approvals (and journal steps)")
    sub.add_argument("run")
    sub.add_argument("--step", type=int, help="the run as it was at this step boundary")
    sub.add_argument("--full", action="store_true", help="do not cut long texts")

    for name, verb in (("approve", "approve"), ("deny", "deny")):
        sub = command(name, c.runs_verdict, f"{verb} pending approvals of a run")
        sub.add_argument("run")
        sub.add_argument("approval_id", nargs="+")
        sub.add_argument("--reason")
        sub.add_argument("--token", help="the approval token (default: the one stored with the request)")
        sub.add_argument("--agent", metavar="MODULE:FACTORY", help="resume the run with this agent afterwards")

    sub = command("resume", c.runs_resume, "continue a run with your agent")
    sub.add_argument("run")
    sub.add_argument("--agent", metavar="MODULE:FACTORY", required=True,
                     help="a callable returning an Agent or a dict of resume_from_checkpoint options")

    sub = command("prune", c.runs_prune, "delete runs last saved before a time")
    sub.add_argument("--before", required=True, help="epoch ms, ISO 8601, or an age like 7d, 12h, 30m")
    sub.add_argument("--status", choices=RUN_STATUSES)
    sub.add_argument("--include-suspended", action="store_true", help="also delete runs awaiting approval")
    sub.add_argument("--events", metavar="URL", help="the chat endpoint's event log, whose events of the deleted "
                     "runs go too (default: the store's database when it is SQLite or Postgres)")

    sub = command("rekey", c.runs_rekey, "rewrite every encrypted row (and every plaintext one) under the primary key"
                  " of DURABLE_AGENT_KEYS: after a key rotation, or to encrypt an existing database in place")
    sub.add_argument("--batch-size", type=int, default=500, metavar="ROWS",
                     help="rows per transaction (default 500); each batch commits on its own, so a rekey stopped"
                          " mid-way is finished by running it again")
    sub.add_argument("--events", metavar="URL", help="the chat endpoint's event log, rekeyed too (default: the"
                     " store's database when it is SQLite or Postgres)")
    sub.add_argument("--strict", action="store_true",
                     help="refuse plaintext rows (left as they are, reported) instead of encrypting them: for a"
                          " database already migrated, where a plaintext row can only be planted")

    sub = command("fork", c.runs_fork, "start a new run from a step boundary of a run (with --runtime, an Agent's"
                  " run is forked into its session, parked on approvals of its own)")
    sub.add_argument("run")
    sub.add_argument("--at", type=int, metavar="STEP", help="the step boundary (default: the latest)")
    sub.add_argument("--to", required=True, metavar="NEW_RUN")

    sub = command("export", c.runs_export, "write runs as JSON lines (latest checkpoints, bytes kept)")
    sub.add_argument("run", nargs="*", help="runs to export (default: all)")
    sub.add_argument("--status", choices=RUN_STATUSES)
    sub.add_argument("-o", "--output", metavar="FILE", help="default: stdout")

    sub = command("import", c.runs_import, "read runs from JSON lines written by export")
    sub.add_argument("input", nargs="?", metavar="FILE", help="default: stdin")
    sub.add_argument("--overwrite", action="store_true", help="replace runs that exist")

    sub = command("watch", c.runs_watch, "follow a live run by polling its store")
    sub.add_argument("run")
    sub.add_argument("--interval", type=float, default=1.0, metavar="SECONDS")
    sub.add_argument("--timeout", type=float, metavar="SECONDS")
    sub.add_argument("--follow", action="store_true", help="keep watching through suspensions until it completes")
    return parser


def exit_code(error: BaseException) -> int:
    """The documented exit code of a failure."""
    if isinstance(error, CliError):
        return error.code
    if isinstance(error, (CheckpointNotFoundError, StepNotFoundError)):
        return c.NOT_FOUND
    if isinstance(error, (CheckpointConflictError, RunLeaseHeldError, StaleEpochError)):
        return c.CONFLICT
    if isinstance(error, FeatureUnavailableError):
        return c.UNAVAILABLE
    if isinstance(error, ConfigurationError):
        return c.USAGE
    if is_outage(error):
        return c.UNREACHABLE
    return c.ERROR


def _message(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, (CliError, DurableAgentError)):
        return text
    return f"{type(error).__name__}: {text}"


async def _run(args: argparse.Namespace) -> int:
    backends = await Backends.open(args.store, args.runtime, create=args.handler is c.runs_import)
    handler: Command = args.handler
    try:
        return await handler(args, backends)
    except DecryptionError as exc:
        if exc.problem != NO_KEYRING:
            raise
        raise CliError(c.USAGE, f"the database is encrypted ({exc.place[0]} of {exc.place[1]!r}): set"
                       " DURABLE_AGENT_KEYS to its keys ('id:<base64 key>,...', as its servers have them)") from None
    finally:
        await backends.close()


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: parse `argv`, run the command, return its exit code."""
    try:
        args = build_parser().parse_args(argv)
        args.store = args.store or os.environ.get("DURABLE_AGENT_STORE") or None
        args.runtime = args.runtime or os.environ.get("DURABLE_AGENT_RUNTIME") or None
        code = asyncio.run(_run(args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except BrokenPipeError:  # `| head` read what it wanted and closed the pipe: stop as Unix tools do, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush writes nowhere
        return c.CLOSED
    except KeyboardInterrupt:
        print("durable-agent: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exit:  # --help
        return exit.code if isinstance(exit.code, int) else c.OK
    except Exception as error:  # noqa: BLE001 - the CLI reports every failure in one line
        print(f"{paint('durable-agent: error:', RED, sys.stderr)} {_message(error)}", file=sys.stderr)
        return exit_code(error)


__all__ = ["build_parser", "exit_code", "main"]
